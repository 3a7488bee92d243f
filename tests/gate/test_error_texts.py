"""What the model reads of a failed call that may have run, or that the server says may work later, and which refusals
name an operation: the texts must say what the envelope says (the breaker's reopening, the operation id to reuse, the
server's "try again"), never the opposite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.types import TextContent

from breakwater import Breakwater, Config, ServerSpec, ServerState
from breakwater.config import BreakerPolicy, CallPolicy, RetryPolicy
from breakwater.errors import CODE_TO_ERROR, CallRefused, ErrorCode, OutcomeUnknownError, ToolError, refusal_error
from breakwater.gate._envelope import error_from_result, error_result
from breakwater.testing.server import count_ledger, launch_command

pytestmark = pytest.mark.anyio

REFUSALS = [code for code, cls in CODE_TO_ERROR.items() if issubclass(cls, CallRefused)]


def text_of(err: Any) -> str:
    result = error_result(err)
    last = result.content[-1]
    assert isinstance(last, TextContent)
    return last.text


def test_an_outcome_unknown_names_the_breakers_reopening_and_the_operation_to_reuse() -> None:
    err = OutcomeUnknownError(
        server="shop", tool="pay", attempt=1, operation_id="op-7", retry_after_s=29.6, detail={"breaker": "open"}
    )
    text = text_of(err)
    assert "circuit breaker opened, and breakwater tries the tool again in about 30 s" in text
    assert "check whether it took effect" in text
    assert text.endswith('if it did not and you repeat it, pass the same operation id (operationId "op-7").')
    # Without an open breaker or an id, neither is claimed.
    plain = text_of(OutcomeUnknownError(server="shop", tool="pay", attempt=1))
    assert "breaker" not in plain and "operation" not in plain


def test_an_operation_id_in_a_text_shows_its_control_characters_instead_of_obeying_them() -> None:
    text = text_of(OutcomeUnknownError(server="shop", tool="pay", attempt=1, operation_id="a\x1b[2Jb"))
    assert "\x1b" not in text and 'operationId "a\\u001b[2Jb"' in text


def test_a_never_tools_retryable_error_says_the_server_may_succeed_later_and_why_breakwater_did_not_retry() -> None:
    err = ToolError(
        "temporarily unavailable, try again",
        server="shop",
        tool="order",
        attempt=1,
        retryable=False,
        retry_after_s=2.0,
        operation_id="op-9",
        upstream_structured_content={"ok": False, "retryable": True, "code": "UNAVAILABLE"},
    )
    text = text_of(err)
    assert "rather than repeating" not in text
    assert "may work" in text and "did not retry it because the tool may have side effects" in text
    assert 'only if a repeat is safe, after about 2 s, with the same operation id (operationId "op-9")' in text
    assert error_result(err).structured_content["retryable"] is False
    # The model's text survives the envelope's round trip (a gateway's client reads it again).
    back = error_from_result(error_result(err))
    assert back is not None and text_of(back) == text
    # A tool error the server does not call transient keeps the "fix the input" advice.
    assert "rather than repeating" in text_of(ToolError("bad input", upstream_structured_content={"retryable": False}))


@pytest.mark.parametrize("code", REFUSALS)
def test_a_refusal_before_any_attempt_names_no_operation(code: ErrorCode) -> None:
    cls = CODE_TO_ERROR[code]
    for err in (
        cls(server="s", tool="t", operation_id="op-1"),
        refusal_error(cls, "s", "t", 1.0, 0, 3, "op-1", {}),
    ):
        assert err.operation_id is None
        data = error_result(err).structured_content
        assert data is not None and data["operation_id"] is None and "op-1" not in text_of(err)
    # A refusal of a later attempt: the earlier ones were sent under the id, which the envelope keeps.
    later = cls(server="s", tool="t", operation_id="op-1", attempt=1)
    assert error_result(later).structured_content["operation_id"] == "op-1"


async def test_a_real_never_tool_the_server_calls_transient_and_an_open_breaker_read_as_they_are(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    cmd = launch_command(
        "--name", "shop", "--tool", "order:retryable_error=1,destructive,mutating", "--tool", "pay:hang=1,mutating",
        "--ledger", str(ledger),
    )  # fmt: skip
    spec = ServerSpec(
        name="shop",
        transport="stdio",
        command=cmd[0],
        args=tuple(cmd[1:]),
        call=CallPolicy(timeout_s=0.3),
        retry=RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05),
        breaker=BreakerPolicy(consecutive_failures=1, open_base_s=60.0, open_jitter=0.0),
    )
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission") as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        said = await bw.call_tool("shop", "order", {})
        env = said.structured_content
        assert env is not None and (env["code"], env["retryable"], env["attempt"]) == ("TOOL_ERROR", False, 1)
        text = text_of(error_from_result(said))
        assert "may work" in text and f'(operationId "{env["operation_id"]}")' in text
        assert count_ledger(ledger, tool="order") == 1  # not retried

        cut = await bw.call_tool("shop", "pay", {})
        env = cut.structured_content
        assert env is not None and env["code"] == "OUTCOME_UNKNOWN" and env["breaker"] == "open"
        text = text_of(error_from_result(cut))
        assert "Its circuit breaker opened, and breakwater tries the tool again in about 60 s." in text
        assert f'pass the same operation id (operationId "{env["operation_id"]}")' in text

        refused = await bw.call_tool("shop", "pay", {}, operation_id="op-mine")
        env = refused.structured_content
        # One failure in a row trips the server's breaker as well as the tool's: either refuses, nothing sent.
        assert env is not None and env["code"] in ("CIRCUIT_OPEN", "SERVER_CIRCUIT_OPEN")
        assert (env["attempt"], env["operation_id"]) == (0, None)
    assert count_ledger(ledger, tool="pay") == 1
