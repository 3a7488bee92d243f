"""What the model reads of a server's "try again" on a call breakwater does not repeat, and of a tool's plain-text "try
again later": the text and the envelope's `retryable` agree with the server and with breakwater's own retry rule, and a
`never` tool is sent once. Real subprocess servers (an `MCPServer` written to `tmp_path`, with a ledger), no mocks."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError
from mcp.types import CallToolResult, TextContent

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater.config import RetryPolicy
from breakwater.errors import NOT_RETRYABLE_ADVICE, ErrorCode, ToolError, UpstreamError
from breakwater.gate._classify import RetryClass, classify
from breakwater.gate._envelope import error_from_result, error_result
from breakwater.gate._error_text import says_transient

pytestmark = pytest.mark.anyio

_SERVER = """
import os
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

srv = MCPServer("shop")
NEVER, SAFE = ToolAnnotations(destructiveHint=True), ToolAnnotations(readOnlyHint=True)


def _ran(tool):
    with open(os.environ["LEDGER"], "a") as ledger:
        ledger.write(tool + "\\n")


def _said(tool, text):
    _ran(tool)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


@srv.tool(name="order", annotations=NEVER)
def order() -> str:
    _ran("order")
    raise MCPError(-32000, "the payment service is busy", data={"retryable": True, "retry_after": 2})


@srv.tool(name="crashed_order", annotations=NEVER)
def crashed_order() -> str:
    _ran("crashed_order")
    raise MCPError(-32603, "handler crashed", data={"retryable": True, "retry_after": 2})


@srv.tool(name="look", annotations=SAFE)
def look() -> str:
    _ran("look")
    raise MCPError(-32000, "the index is busy", data={"retryable": True})


@srv.tool(name="send", annotations=NEVER)
def send() -> CallToolResult:
    return _said("send", "Mail service temporarily unavailable, try again later")


@srv.tool(name="peek", annotations=SAFE)
def peek() -> CallToolResult:
    return _said("peek", "Rate limited: please retry")


srv.run()
"""

_TRUTHFUL = "The server says a later attempt may work, but breakwater did not retry it because the tool may have side effects"


@asynccontextmanager
async def _shop(tmp_path: Path) -> AsyncIterator[Breakwater]:
    script = tmp_path / "shop.py"
    script.write_text(_SERVER)
    spec = ServerSpec(
        name="shop",
        transport="stdio",
        command=sys.executable,
        args=(str(script),),
        env={"LEDGER": str(tmp_path / "ledger")},
        connect=ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15),
        retry=RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05, max_attempts=3),
    )
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission", journal=None) as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def _sent(tmp_path: Path, tool: str) -> int:
    ledger = tmp_path / "ledger"
    return ledger.read_text().split().count(tool) if ledger.exists() else 0


def _read(result: CallToolResult) -> tuple[dict[str, Any], str]:
    """The envelope and the text the model reads (breakwater's note), checked to survive the envelope's round trip."""
    env = result.structured_content
    assert result.is_error and isinstance(env, dict), result
    note = result.content[-1]
    assert isinstance(note, TextContent)
    back = error_from_result(result)
    assert back is not None and error_result(back).content[-1] == note
    return env, note.text


async def test_a_never_tools_server_error_marked_retryable_is_sent_once_and_says_check_first(tmp_path: Path) -> None:
    async with _shop(tmp_path) as bw:
        for tool in ("order", "crashed_order"):
            env, text = _read(await bw.call_tool("shop", tool))
            assert (env["code"], env["retryable"], env["attempt"], env["retry_after_s"]) == ("UPSTREAM_ERROR", False, 1, 2.0)
            assert _sent(tmp_path, tool) == 1  # not repeated: the request may have run
            assert "Do not repeat this call" not in text and "Wait" not in text, text
            assert _TRUTHFUL in text and "check first whether it took effect" in text, text
            assert f'after about 2 s, with the same operation id (operationId "{env["operation_id"]}")' in text, text
            assert "the server marks it retryable" in env["message"] and "connection" not in env["message"]

        env, text = _read(await bw.call_tool("shop", "look"))  # a read-only tool is retried, as the server allows
        assert (env["code"], env["retryable"], env["attempt"]) == ("UPSTREAM_ERROR", True, 3)
        assert _sent(tmp_path, "look") == 3 and "Wait a moment and retry once" in text, text


async def test_a_plain_text_try_again_later_gets_the_transient_advice(tmp_path: Path) -> None:
    async with _shop(tmp_path) as bw:
        env, text = _read(await bw.call_tool("shop", "send"))
        assert (env["code"], env["retryable"], env["attempt"]) == ("TOOL_ERROR", False, 1)
        assert _sent(tmp_path, "send") == 1
        assert "fix the input" not in text and "The tool says a later attempt may work" in text, text
        assert f'with the same operation id (operationId "{env["operation_id"]}")' in text, text

        env, text = _read(await bw.call_tool("shop", "peek"))
        assert (env["code"], env["retryable"], env["attempt"]) == ("TOOL_ERROR", True, 3)
        assert _sent(tmp_path, "peek") == 3
        assert "fix the input" not in text and "The tool says this error is transient: wait a moment and try again" in text


@pytest.mark.parametrize("retry_class", list(RetryClass))
def test_a_json_rpc_error_marked_retryable_is_retryable_only_where_the_retry_class_allows(retry_class: RetryClass) -> None:
    verdict = classify(MCPError(1234, "rate limited", {"retryable": True}), retry_class=retry_class)
    assert verdict.code is ErrorCode.UPSTREAM_ERROR
    assert verdict.retryable is (retry_class is not RetryClass.NEVER)
    # A plain-text "try again later" reads the same as a `retryable: true` in structured content.
    said = CallToolResult(content=[TextContent(type="text", text="Temporarily unavailable")], is_error=True)
    marked = CallToolResult(content=[], structured_content={"retryable": True}, is_error=True)
    for result in (said, marked):
        assert classify(result, retry_class=retry_class).retryable is (retry_class is not RetryClass.NEVER)


def test_a_never_tools_server_error_the_server_does_not_call_retryable_still_says_do_not_repeat() -> None:
    verdict = classify(MCPError(-32603, "handler crashed"), retry_class=RetryClass.NEVER)
    err = UpstreamError(retryable=verdict.retryable, detail={"reason": verdict.reason}, operation_id="op-1")
    assert err.advice_text() == NOT_RETRYABLE_ADVICE


@pytest.mark.parametrize(
    "text",
    [
        "shop: temporarily unavailable, try again",
        "RATE LIMITED",
        "rate-limit exceeded",
        "Please retry",
        "Please retry.",
        "Please retry after 30 seconds",
        "Backend busy; please retry. Use a smaller page size next time",
        "Try again later.",
        "try again in 30 seconds",
        "Service Unavailable",
        "too many requests",
        "the server is busy",
    ],
)
def test_transient_wording_is_recognised(text: str) -> None:
    assert says_transient(text)


@pytest.mark.parametrize(
    "text",
    [
        "Enter a valid date, then try again",
        "moderate limits apply",
        "retrying is not allowed",
        "unretryable",
        "latency",
        # A "please retry" that says how to change the request is a correction, not a passing failure.
        "Invalid date format, please retry with YYYY-MM-DD",
        "Please retry the request using a smaller page size",
        "please retry after fixing the query",
        "Query too broad: please retry by specifying a project",
    ],
)
def test_a_bare_try_again_or_a_word_inside_another_is_no_transient_wording(text: str) -> None:
    assert not says_transient(text)
    result = CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
    verdict = classify(result, retry_class=RetryClass.NEVER)
    err = ToolError(text, retryable=verdict.retryable, detail={"reason": verdict.reason})
    assert "fix the input" in err.advice_text()
