"""A server's own JSON-RPC error answer to `tools/call` is the server's answer, whatever its code.

The codes breakwater and the SDK use for failures they make themselves — -32000 (connection closed),
-32001 (request timed out), -32090 (result too large) — and -32800 (request cancelled) are ordinary
numbers on the wire: a server may answer with any of them (-32000 is the most common generic server
error). Such an answer must reach the model as the server's error, with its message, and never
read as a timeout, a lost connection, a cancellation or an oversize result; a destructive tool is
never repeated after it. Real subprocess servers (an `MCPServer` written to `tmp_path`), no mocks.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater._wire import RESULT_TOO_LARGE
from breakwater.config import RetryPolicy
from breakwater.connect._raw_call import ServerReplyError
from breakwater.errors import ErrorCode
from breakwater.gate._classify import RetryClass, classify, server_answer
from breakwater.testing.server import read_ledger, read_state, serve_http
from helpers import FORKED_SCRIPT, AttemptRows

pytestmark = pytest.mark.anyio

_SERVER = """
import os, sys
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations

srv = MCPServer("answers")
CODE = int(os.environ["RPC_CODE"])
LEDGER = os.environ["LEDGER"]


def _answer(tool):
    with open(LEDGER, "a") as ledger:
        ledger.write(tool + "\\n")
    raise MCPError(CODE, f"the server itself says no to {tool}", data={"why": "server-side"})


@srv.tool(name="destroy", annotations=ToolAnnotations(destructiveHint=True))
def destroy() -> str:
    return _answer("destroy")


@srv.tool(name="peek", annotations=ToolAnnotations(readOnlyHint=True))
def peek() -> str:
    return _answer("peek")


srv.run()
"""

CODES = [-32000, -32001, -32090, -32800, -32603, -1]
_LOCAL_MEANINGS = {"TIMEOUT", "OUTCOME_UNKNOWN", "RESULT_TOO_LARGE", "CANCELLED"}


@asynccontextmanager
async def _gate(tmp_path: Path, code: int, rows: AttemptRows) -> AsyncIterator[Breakwater]:
    script = tmp_path / "answers.py"
    script.write_text(FORKED_SCRIPT + _SERVER)
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command=sys.executable,
        args=(str(script),),
        env={"RPC_CODE": str(code), "LEDGER": str(tmp_path / "ledger")},
        connect=ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15),
        retry=RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05, max_attempts=3),
    )
    config = Config(servers=(spec,))
    async with Breakwater(config, admission_dir=tmp_path / "admission", journal=None, observers=(rows,)) as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def _envelope(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _calls(tmp_path: Path, tool: str) -> int:
    ledger = tmp_path / "ledger"
    return ledger.read_text().split().count(tool) if ledger.exists() else 0


@pytest.mark.parametrize("code", CODES)
async def test_a_servers_error_answer_is_its_answer_whatever_the_code(tmp_path: Path, code: int) -> None:
    """The envelope says UPSTREAM_ERROR with the server's message, the journal no timeout, the destructive
    tool ran once and the connection stays up; a read-only tool retries only as a server error allows."""
    rows = AttemptRows()
    async with _gate(tmp_path, code, rows) as bw:
        destroyed = _envelope(await bw.call_tool("s", "destroy"))
        text = json.dumps(destroyed)
        assert destroyed["code"] == "UPSTREAM_ERROR", text
        assert destroyed["code"] not in _LOCAL_MEANINGS
        assert "the server itself says no to destroy" in text  # the server's words reach the model
        assert "timed out" not in text and "connection closed" not in text.lower(), text
        assert destroyed["retryable"] is False and destroyed["attempt"] == 1, text
        assert _calls(tmp_path, "destroy") == 1  # never repeated
        assert [(r.outcome, r.error_code) for r in rows.rows] == [("upstream_error", "UPSTREAM_ERROR")]
        # The server answered: its connection is not taken for lost.
        assert [s.state for s in bw.status().servers] == [ServerState.READY]

        rows.rows.clear()
        peeked = _envelope(await bw.call_tool("s", "peek"))
        text = json.dumps(peeked)
        assert peeked["code"] == "UPSTREAM_ERROR" and "says no to peek" in text, text
        # A crashed handler (-32603) may be repeated for a read-only tool; any other error answer would be repeated.
        expected = 3 if code == -32603 else 1
        assert _calls(tmp_path, "peek") == expected, text
        assert all(r.outcome == "upstream_error" for r in rows.rows) and len(rows.rows) == expected
        assert [s.state for s in bw.status().servers] == [ServerState.READY]


TRACED = """
import anyio, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec

trace.set_tracer_provider(TracerProvider())  # the SDK's spans are recorded: calls take the SDK's path
script, tmp, codes = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3:]]
fast = ConnectPolicy(startup_jitter_s=0, budget_s=20, attempt_timeout_s=15)
specs = tuple(
    ServerSpec(name=f"s{i}", transport="stdio", command=sys.executable, args=(script,), connect=fast,
               env={"RPC_CODE": str(code), "LEDGER": f"{tmp}/ledger{i}"})
    for i, code in enumerate(codes)
)

async def main():
    async with Breakwater(Config(servers=specs), admission_dir=f"{tmp}/admission", journal=None) as bw:
        await bw.wait_ready(timeout=30)
        out = []
        for i in range(len(codes)):
            result = await bw.call_tool(f"s{i}", "destroy")
            out.append({"envelope": result.structured_content, "raw": bw.upstream(f"s{i}").process.raw_calls._count,
                        "state": bw.upstream(f"s{i}").state.value})
        print(json.dumps(out))

anyio.run(main)
"""


def test_through_the_sdks_path_a_servers_error_answer_is_its_answer_too(tmp_path: Path) -> None:
    """With the SDK's spans recorded, calls take the SDK's path, which hands every error over as a plain
    `MCPError`: the server's answers over stdio are still told from the SDK's own failures."""
    script = tmp_path / "answers.py"
    script.write_text(FORKED_SCRIPT + _SERVER)
    # A subprocess: a tracer provider can be set once per process, and it would turn tracing on for every later test.
    args = [sys.executable, "-c", TRACED, str(script), str(tmp_path), *map(str, CODES)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for i, (code, one) in enumerate(zip(CODES, seen, strict=True)):
        text = json.dumps(one)
        assert one["raw"] == 0, text  # the SDK's path, not the raw one
        assert one["envelope"]["code"] == "UPSTREAM_ERROR" and one["envelope"]["retryable"] is False, (code, text)
        assert "the server itself says no to destroy" in text and "timed out" not in text, (code, text)
        assert (tmp_path / f"ledger{i}").read_text().split() == ["destroy"], code
        assert one["state"] == "ready", (code, text)


def test_the_sdks_own_failures_keep_their_meaning() -> None:
    """What the SDK or breakwater make locally under those codes stays a timeout, a lost connection, an oversize
    result; the same codes read off the wire (`ServerReplyError`) are the server's answer."""
    try:
        try:
            raise TimeoutError
        except TimeoutError:  # as the SDK's dispatcher raises its read timeout
            raise MCPError(code=REQUEST_TIMEOUT, message="Request 'tools/call' timed out") from None
    except MCPError as exc:
        timed_out = exc
    assert server_answer(timed_out, session_open=True) is timed_out
    assert classify(timed_out, retry_class=RetryClass.SAFE).code is ErrorCode.TIMEOUT
    closed = MCPError(code=CONNECTION_CLOSED, message="Connection closed")
    assert server_answer(closed, session_open=False) is closed  # the connection is gone: the SDK's
    assert classify(closed, retry_class=RetryClass.NEVER).code is ErrorCode.OUTCOME_UNKNOWN
    too_large = MCPError(code=RESULT_TOO_LARGE, message="over", data={"bytes": 9, "max_result_bytes": 8})
    assert server_answer(too_large, session_open=True) is too_large
    assert classify(too_large, retry_class=RetryClass.NEVER).code is ErrorCode.RESULT_TOO_LARGE
    # A live HTTP session: a -32000 the SDK's transport made for a request it gave up on is its own, any other the
    # server's (over stdio the SDK's path has no such messages of its own).
    for message in _sdk_abandon_messages():
        abandoned = MCPError(code=CONNECTION_CLOSED, message=message)
        assert server_answer(abandoned, session_open=True, over_http=True) is abandoned, message
        assert isinstance(server_answer(abandoned, session_open=True), ServerReplyError), message
    server_said = MCPError(code=CONNECTION_CLOSED, message="the server says no")
    assert isinstance(server_answer(server_said, session_open=True, over_http=True), ServerReplyError)
    for code in (CONNECTION_CLOSED, REQUEST_TIMEOUT, RESULT_TOO_LARGE, -32800):
        plain = MCPError(code=code, message="the server says no")
        marked = server_answer(plain, session_open=True)
        assert isinstance(marked, ServerReplyError) or code == -32800, code
        for attempt in (marked, ServerReplyError(code=code, message="the server says no")):
            verdict = classify(attempt, retry_class=RetryClass.NEVER)
            assert (verdict.code, verdict.retryable, verdict.outcome_unknown) == (ErrorCode.UPSTREAM_ERROR, False, False)
            assert verdict.reason == f"protocol error {code}: the server says no"


@pytest.mark.parametrize("protocol", ["2025-11-25", "2026-07-28"])
async def test_over_http_a_servers_minus_32000_is_its_answer_and_its_connection_stays(tmp_path: Path, protocol: str) -> None:
    """Over streamable HTTP the SDK's transport gives its own failures -32000 too (a request's stream that ended
    unanswered, a closed session): the server's -32000 on a live session is still the server's answer, and the
    upstream is not taken for lost (it was reconnected after every such answer, the calls beside it cut)."""
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    tools = ["--tool", "destroy:mutating,destructive,rpc_error=1", "--tool", "peek:readonly,rpc_error=1"]
    tools += ["--tool", "add:readonly"]
    async with serve_http(*tools, "--ledger", str(ledger), "--state-file", str(state)) as upstream:
        spec = ServerSpec(
            name="s",
            transport="http",
            url=upstream.url,
            connect=ConnectPolicy(startup_jitter_s=0, budget_s=20, attempt_timeout_s=15, protocol=protocol),
            retry=RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05, max_attempts=3),
        )
        rows = AttemptRows()
        async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "adm", journal=None, observers=(rows,)) as bw:
            await bw.wait_ready(timeout=30)
            attempts = bw.upstream("s").snapshot().attempts
            destroyed = _envelope(await bw.call_tool("s", "destroy"))
            text = json.dumps(destroyed)
            assert destroyed["code"] == "UPSTREAM_ERROR" and "injected server error in destroy" in text, text
            assert "connection closed" not in text.lower() and destroyed["attempt"] == 1, text
            # What the model reads is what the server said, not "the connection failed or it sent an invalid reply".
            said = "The tool's server answered the call with error -32000: injected server error in destroy."
            assert destroyed["message"] == said, destroyed
            assert len(read_ledger(ledger)) == 1  # ran once, never repeated
            peeked = _envelope(await bw.call_tool("s", "peek"))
            assert "injected server error in peek" in json.dumps(peeked)
            assert read_state(state)["started"].get("peek") == 1  # the same answer would come again: not repeated
            assert [(r.outcome, r.error_code) for r in rows.rows] == [("upstream_error", "UPSTREAM_ERROR")] * 2
            # The server answered: one handshake, the session kept, and the next call goes through at once.
            snap = bw.upstream("s").snapshot()
            assert snap.state is ServerState.READY and snap.attempts == attempts, snap
            added = await bw.call_tool("s", "add", {"a": 2, "b": 3})
            assert added.structured_content is not None and added.structured_content["sum"] == 5
            assert read_state(state)["handshakes"] == 1


def _sdk_abandon_messages() -> list[str]:
    """How the installed SDK's streamable HTTP client words each -32000 it makes for a request it gives up on.

    Read from its source (each `_resolve_abandoned_request` call without a code of its own), so a new wording
    in a later SDK fails this test instead of reading as a server's answer.
    """
    source = textwrap.dedent(inspect.getsource(StreamableHTTPTransport))
    messages = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "_resolve_abandoned_request" or any(k.arg == "code" for k in node.keywords):
            continue
        text = node.args[2]
        first = text.values[0] if isinstance(text, ast.JoinedStr) else text
        assert isinstance(first, ast.Constant) and isinstance(first.value, str), ast.dump(text)
        messages.append(first.value + ("{...}" if isinstance(text, ast.JoinedStr) else ""))
    assert len(messages) >= 3, messages  # a failed stream, one ended unanswered, reconnection given up
    return messages
