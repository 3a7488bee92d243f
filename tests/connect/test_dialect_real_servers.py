"""The dialect's transports against real SDK servers on real 127.0.0.1 ports: legacy SSE, and headersHelper.

Each server is the SDK's own `MCPServer` behind uvicorn, in this process; breakwater connects to it
over a real socket with the config a user would write (`"type": "sse"`, `"headersHelper"`).
Wall-clock tests, with generous bounds.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from breakwater import Breakwater, Reason, ServerSpec, ServerState
from breakwater.config import load_config
from breakwater.connect._headers_helper import HELPER_TIMEOUT_S, HeadersHelperError, run_headers_helper
from breakwater.testing import FakeClock
from helpers import eventually

pytestmark = pytest.mark.anyio

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def _tools() -> MCPServer:
    mcp = MCPServer("dialect-test")

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @mcp.tool()
    def whoami(ctx: Context) -> str:
        """The Authorization header this request arrived with."""
        headers = ctx.headers or {}
        return str(headers.get("authorization", ""))

    return mcp


@asynccontextmanager
async def _serve(app: ASGIApp) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.01)
        yield port
        server.should_exit = True


def _processes_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if entry.name.isdigit() and marker in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def _config(tmp_path: Path, entry: dict[str, Any]) -> Path:
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"up": entry}}))
    return path


async def _ready(bw: Breakwater) -> None:
    report = await bw.wait_ready(timeout=20)
    snap = bw.upstream("up").snapshot()
    assert snap.state is ServerState.READY, (report, snap.error)


async def test_legacy_sse_server_connects_lists_and_calls(tmp_path: Path) -> None:
    mcp = _tools()
    async with _serve(mcp.sse_app(host="127.0.0.1")) as port:
        config = load_config(_config(tmp_path, {"type": "sse", "url": f"http://127.0.0.1:{port}/sse"}))
        async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
            await _ready(bw)
            assert {t.name for t in bw.upstream("up").tools} == {"add", "whoami"}
            result = await bw.call_tool("up", "add", {"a": 2, "b": 40}, raise_on_error=True)
            assert result.structured_content == {"result": 42}


async def test_a_url_of_no_stated_type_that_is_a_legacy_sse_endpoint_connects_over_sse(tmp_path: Path) -> None:
    """Cursor's files often give a remote server only its `url`, and Cursor finds out which transport it speaks. As
    the spec's backwards compatibility says: the handshake's POST answered 405, the same URL is opened as SSE at once.
    With `"type": "http"` stated, it stays streamable HTTP, and the failure says what to write."""
    mcp = _tools()
    async with _serve(mcp.sse_app(host="127.0.0.1")) as port:
        url = f"http://127.0.0.1:{port}/sse"
        config = load_config(_config(tmp_path, {"url": url}))
        async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
            await _ready(bw)
            snap = bw.upstream("up").snapshot()
            assert (snap.transport, snap.attempts) == ("sse", 2)
            result = await bw.call_tool("up", "add", {"a": 2, "b": 40}, raise_on_error=True)
            assert result.structured_content == {"result": 42}
        stated = load_config(_config(tmp_path, {"type": "http", "url": url}))
        async with Breakwater(stated, admission_dir=tmp_path / "admission") as bw:
            await bw.wait_ready(timeout=5)
            snap = bw.upstream("up").snapshot()
    assert snap.transport == "http" and snap.state is not ServerState.READY and snap.error is not None
    assert (snap.error.code, snap.error.http_status) == (Reason.HTTP_STATUS, 405)
    assert snap.error.message.endswith('a legacy SSE endpoint answers so: set "type": "sse"')


class _TokenGate:
    """ASGI middleware: 401 unless `Authorization: Bearer <valid>`; `valid` can be rotated mid-test."""

    def __init__(self, app: ASGIApp, valid: str) -> None:
        self.app, self.valid, self.refused = app, valid, 0

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {self.valid}".encode():
                self.refused += 1
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)


async def test_headers_helper_headers_arrive_and_a_401_fetches_fresh_ones(tmp_path: Path) -> None:
    # The helper prints the token in a file, so the test can rotate it as a real SSO helper would.
    token_file = tmp_path / "token"
    token_file.write_text("first-token-1234")
    helper = tmp_path / "headers.py"
    helper.write_text(
        "import json, os, pathlib\n"
        f"token = pathlib.Path({str(token_file)!r}).read_text()\n"
        'print(json.dumps({"Authorization": "Bearer " + token, "X-Server": os.environ["CLAUDE_CODE_MCP_SERVER_NAME"]}))\n'
    )
    runs = tmp_path / "runs"
    command = f"echo run >> {runs} && {sys.executable} {helper}"
    mcp = _tools()
    gate = _TokenGate(mcp.streamable_http_app(host="127.0.0.1"), valid="first-token-1234")
    async with _serve(gate) as port:
        entry = {"type": "http", "url": f"http://127.0.0.1:{port}/mcp", "headersHelper": command}
        config = load_config(_config(tmp_path, entry))
        async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
            await _ready(bw)
            seen = await bw.call_tool("up", "whoami", {}, raise_on_error=True)
            assert seen.structured_content == {"result": "Bearer first-token-1234"}
            assert runs.read_text().count("run") == 1  # once at connect, not per request

            # The server now wants a new token: the next request gets a 401, the helper runs again.
            token_file.write_text("second-token-5678")
            gate.valid = "second-token-5678"
            seen = await bw.call_tool("up", "whoami", {}, raise_on_error=True)
            assert seen.structured_content == {"result": "Bearer second-token-5678"}
            assert runs.read_text().count("run") == 2
            assert gate.refused == 1
            # Its output is a secret: status never shows it.
            assert "second-token-5678" not in json.dumps(bw.status().to_json())


async def test_a_failing_headers_helper_is_auth_required_without_its_output(tmp_path: Path) -> None:
    helper = tmp_path / "broken.sh"
    helper.write_text('echo \'{"Authorization": "Bearer leaked-secret-value"}\'; echo leaked-secret-value >&2; exit 3\n')
    mcp = _tools()
    async with _serve(mcp.streamable_http_app(host="127.0.0.1")) as port:
        entry = {"url": f"http://127.0.0.1:{port}/mcp", "headersHelper": f"sh {helper}"}
        config = load_config(_config(tmp_path, entry))
        async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
            await bw.wait_ready(timeout=20)
            snap = bw.upstream("up").snapshot()
            assert snap.state is ServerState.FAILED
            assert snap.error is not None and snap.error.code is Reason.AUTH_REQUIRED
            assert "exited with code 3" in snap.error.message
            assert "leaked-secret-value" not in snap.error.message


async def test_a_headers_helper_that_hangs_is_stopped_at_its_limit_and_bad_output_is_named(tmp_path: Path) -> None:
    clock = FakeClock()
    # An odd duration names the helper's child among the machine's processes.
    spec = ServerSpec(name="up", transport="http", url="http://127.0.0.1:9/mcp", headers_helper="sleep 31.734; echo '{}'")
    failures: list[HeadersHelperError] = []

    async def run() -> None:
        try:
            await run_headers_helper(spec, clock=clock)
        except HeadersHelperError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.sleep(0.3)  # the helper is running (a real process)
        clock.advance(HELPER_TIMEOUT_S)
    assert len(failures) == 1 and "did not finish within 10 s" in str(failures[0])
    # The shell and its child are gone: the whole process group was killed. (The child is reaped by init,
    # not by us, a moment after the kill lands: a busy machine may still list it for a few milliseconds.)
    await eventually(lambda: not _processes_with("sleep 31.734"), timeout=10)
    bad = ServerSpec(name="up", transport="http", url="http://127.0.0.1:9/mcp", headers_helper="echo not-json")
    with pytest.raises(HeadersHelperError, match="did not print a JSON object"):
        await run_headers_helper(bad, clock=clock)
    numbers = ServerSpec(name="up", transport="http", url="http://127.0.0.1:9/mcp", headers_helper="echo '{\"X\": 1}'")
    with pytest.raises(HeadersHelperError, match="string values"):
        await run_headers_helper(numbers, clock=clock)
