"""An HTTP upstream's error statuses mid-session are judged by what they say, not as "the server failed, maybe half-way".

Real parts: testservers on real HTTP ports, answering one chosen tool's call with a status (`--status-tool`),
and one restarted on its port, which answers the old session's requests 404 "Session not found" (the SDK's server).
A destructive tool's ledger counts its side effects. Wall clock, with generous bounds: the statuses are real ones.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec
from breakwater.config import CallPolicy
from breakwater.errors import ErrorCode
from breakwater.testing._fleet import free_port
from breakwater.testing.server import count_ledger, serve_http

pytestmark = pytest.mark.anyio

FAST = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.2, backoff_cap_s=1, budget_s=30, attempt_timeout_s=10)
ORDER = "order:mutating,destructive"


@asynccontextmanager
async def _gate(tmp_path: Path, url: str, protocol: str = "2026-07-28") -> AsyncIterator[Breakwater]:
    connect = replace(FAST, protocol=protocol)
    spec = ServerSpec(name="up", transport="http", url=url, connect=connect, call=CallPolicy(timeout_s=10))
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "adm", journal=None) as bw:
        await bw.wait_ready(timeout=30)
        yield bw


def _envelope(result: object) -> dict[str, object]:
    content = getattr(result, "structured_content", None)
    assert isinstance(content, dict), result
    return content


@pytest.mark.parametrize("status", [503, 401])
async def test_a_status_that_refuses_the_request_before_it_runs_is_sent_again_even_for_a_destructive_tool(
    tmp_path: Path, status: int
) -> None:
    # 503: shed. 401: the credentials refused (the connection is made again, which signs in again). Neither ran the
    # call; the SDK reported both as "Server returned an error response", which the gate read as a fault that may
    # have half-run: a destructive tool's call was never sent again, and the model was told not to repeat it.
    ledger = tmp_path / "ledger.jsonl"
    flags = ("--tool", ORDER, "--ledger", str(ledger), "--status-tool", "order", "--status-first", "1")
    async with serve_http(*flags, "--status", str(status), "--retry-after", "0") as srv, _gate(tmp_path, srv.url) as bw:
        with anyio.fail_after(30):
            result = await bw.call_tool("up", "order", {}, raise_on_error=False)
        assert not result.is_error, result
        assert count_ledger(ledger, tool="order") == 1


@pytest.mark.parametrize(("status", "code"), [(500, ErrorCode.OUTCOME_UNKNOWN), (400, ErrorCode.UPSTREAM_ERROR)])
async def test_a_status_that_may_have_run_or_would_repeat_is_not_sent_again(tmp_path: Path, status: int, code: ErrorCode) -> None:
    ledger = tmp_path / "ledger.jsonl"
    flags = ("--tool", ORDER, "--ledger", str(ledger), "--status-tool", "order", "--status-first", "1")
    async with serve_http(*flags, "--status", str(status)) as srv, _gate(tmp_path, srv.url) as bw:
        with anyio.fail_after(30):
            result = await bw.call_tool("up", "order", {}, raise_on_error=False)
        envelope = _envelope(result)
        assert envelope["code"] == code.value, envelope
        assert envelope["attempt"] == 1 and f"HTTP {status}" in json.dumps(envelope), envelope
        assert count_ledger(ledger, tool="order") == 0
        # The connection was not torn down for one refused request.
        assert bw.upstream("up").snapshot().attempts == 1


async def test_a_restarted_server_that_forgot_the_session_gets_a_new_one_and_the_call(tmp_path: Path) -> None:
    # A 2025-11-25 server that restarts answers the old session's requests 404 "Session not found" (JSON-RPC, from the
    # SDK's server). MCP: the client starts a new session. Every call failed UPSTREAM_ERROR "do not repeat" until the
    # health check reconnected, about 30 s later, while status said ready.
    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    flags = ("--port", str(port), "--tool", ORDER, "--ledger", str(ledger))
    async with serve_http(*flags) as first, _gate(tmp_path, first.url, protocol="2025-11-25") as bw:
        assert bw.upstream("up").snapshot().protocol == "2025-11-25"
        first.process.kill()
        first.process.wait()
        async with serve_http(*flags):
            with anyio.fail_after(30):
                result = await bw.call_tool("up", "order", {}, raise_on_error=False)
            assert not result.is_error, result
            assert count_ledger(ledger, tool="order") == 1
            assert bw.upstream("up").snapshot().attempts == 2  # one new session


@pytest.mark.parametrize(("tool", "code"), [("lookup:readonly", "UPSTREAM_ERROR"), (ORDER, "OUTCOME_UNKNOWN")])
async def test_a_reply_that_is_no_json_rpc_message_is_said_in_one_sentence_without_the_servers_bytes(
    tmp_path: Path, tool: str, code: str
) -> None:
    """A 200 whose JSON body is no JSON-RPC message: the SDK's client answers the call -32700 itself, and the model read
    "the server answered with error -32700: Failed to parse JSON response: 4 validation errors for union[...]", the
    body quoted, a link to errors.pydantic.dev. The server did answer: a repeatable call is tried again (here every
    reply is the same), one that is not is OUTCOME_UNKNOWN."""
    name = tool.partition(":")[0]
    flags = ("--tool", tool, "--status-tool", name, "--status-first", "100", "--status", "200")
    async with serve_http(*flags) as srv, _gate(tmp_path, srv.url, protocol="2025-11-25") as bw:
        with anyio.fail_after(30):
            result = await bw.call_tool("up", name, {}, raise_on_error=False)
    envelope = _envelope(result)
    assert envelope["code"] == code, envelope
    said = "a reply breakwater cannot read: it is JSON, but no JSON-RPC message"
    text = result.content[0].text if result.content and result.content[0].type == "text" else ""
    assert said in text or code == "OUTCOME_UNKNOWN", text
    assert str(envelope["reason"]).startswith("unreadable reply: it is JSON, but no JSON-RPC message"), envelope
    for leaked in ("pydantic", "injected HTTP 200", "-32700"):
        assert leaked not in json.dumps(envelope) and leaked not in text, (leaked, text)


def test_a_reply_that_is_not_json_names_what_the_parser_said() -> None:
    from breakwater.connect._http_cut import unreadable_reply

    pydantic_said = (
        "1 validation error for union[JSONRPCRequest,JSONRPCNotification,JSONRPCResponse,JSONRPCError]\n"
        "  Invalid JSON: expected ident at line 1 column 2 [type=json_invalid, input_value=b'this is not json{{{', "
        "input_type=bytes]\n    For further information visit https://errors.pydantic.dev/2.14/v/json_invalid"
    )
    assert unreadable_reply(pydantic_said) == "unreadable reply: it is not JSON (expected ident at line 1 column 2)"


async def test_a_call_cut_when_its_server_died_is_never_said_not_sent(tmp_path: Path) -> None:
    """A read-only call ran a second on a server that was then killed; its retry was refused at connect, and the model
    was told SERVER_CONNECTING, "attempt 0", "The call was not sent". What may have run is the answer."""
    async with serve_http("--tool", "slow:latency=3,readonly") as srv, _gate(tmp_path, srv.url, protocol="2025-11-25") as bw:

        async def kill() -> None:
            await anyio.sleep(1.0)
            srv.process.kill()

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill)
            with anyio.fail_after(30):
                result = await bw.call_tool("up", "slow", {}, raise_on_error=False)
    envelope = _envelope(result)
    text = result.content[0].text if result.content and result.content[0].type == "text" else ""
    assert envelope["code"] != "SERVER_CONNECTING" and "was not sent" not in text, (envelope, text)
    assert int(str(envelope["attempt"])) >= 1 and envelope["retry_stopped"] == "the server was not ready for another attempt"
