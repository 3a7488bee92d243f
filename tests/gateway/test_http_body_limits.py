"""A request that never arrives whole, or announces too much: bounded, answered, and quiet.

The protocol alone (`routing_protocol`, a short read timeout) under a real uvicorn on a real socket:
a request whose body (or head) stops coming is answered 408 and its connection closed. The real
gateway (`breakwater serve --http`): a Content-Length over the 4 MiB cap is a 413 at once, without
reading, and a client gone mid-body leaves no ASGI error in the log.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from breakwater.gateway._known_heads import routing_protocol
from breakwater.gateway._listen import tcp_listener
from helpers import eventually, lifespan_answered

pytestmark = pytest.mark.anyio


async def test_a_request_that_stops_arriving_is_answered_408_and_closed() -> None:
    import uvicorn

    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if await lifespan_answered(scope, receive, send):
            return
        body = b""
        while (message := await receive())["type"] == "http.request":
            body += message.get("body", b"")
            if not message.get("more_body"):
                seen.append(body)
                headers = [(b"content-length", str(len(body) + 4).encode())]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": b"app:" + body})
                return

    def request(body: bytes, length: int | None = None) -> bytes:
        head = f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body) if length is None else length}\r\n\r\n"
        return head.encode() + body

    sock = tcp_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=routing_protocol(0.5), interface="asgi3"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await eventually(lambda: server.started, 10)
        try:
            for partial in (request(b'{"json', length=1000), b"POST /mcp HTTP/1.1\r\nhost: 127"):
                async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                    started = time.monotonic()
                    await stream.send(partial)
                    answer = b""
                    with anyio.fail_after(20):
                        while True:
                            try:
                                answer += await stream.receive()
                            except anyio.EndOfStream:
                                break
                    assert 0.4 < time.monotonic() - started < 15
                    assert answer.startswith(b"HTTP/1.1 408 "), answer
                    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == -32600
            # A connection that sends nothing is closed after the same time, without an answer (it asked nothing).
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                started = time.monotonic()
                with anyio.fail_after(20), pytest.raises(anyio.EndOfStream):
                    await stream.receive()
                assert 0.4 < time.monotonic() - started < 15
            # A request that arrives whole, even in pieces, is served as ever.
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                whole = request(b"call 1")
                await stream.send(whole[:20])
                await anyio.sleep(0.1)
                await stream.send(whole[20:])
                with anyio.fail_after(10):
                    assert b"app:call 1" in await stream.receive()
        finally:
            server.should_exit = True
    assert seen == [b"call 1"]


def _raw_post(port: int, body: bytes, *, length: int, session: str | None = None) -> bytes:
    head = [
        "POST /mcp HTTP/1.1",
        f"host: 127.0.0.1:{port}",
        "content-type: application/json",
        "accept: application/json, text/event-stream",
        f"content-length: {length}",
    ]
    if session is not None:
        head += [f"mcp-session-id: {session}", "mcp-protocol-version: 2025-11-25"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_the_gateway_refuses_a_declared_oversize_body_at_once_and_forgets_a_client_gone_mid_body(tmp_path: Path) -> None:
    config = tmp_path / "ts.json"
    config.write_text(json.dumps({"mcpServers": {"ts": {"command": sys.executable, "args": ["-m", "breakwater", "testserver"]}}}))
    port_file = tmp_path / "port"
    env = dict(
        os.environ,
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )
    argv = [
        sys.executable,
        "-m",
        "breakwater",
        "serve",
        "--config",
        str(config),
        "--http",
        "127.0.0.1:0",
        "--port-file",
        str(port_file),
    ]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        port = int(port_file.read_text())
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(_raw_post(port, body, length=len(body)))
            answer = conn.recv(65536)
        session = next(
            line.split(b":", 1)[1].strip().decode()
            for line in answer.split(b"\r\n")
            if line.lower().startswith(b"mcp-session-id")
        )
        # Part of a body, then the client goes away.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(_raw_post(port, b'{"jsonrpc":"2.0","id":2,"method":"ping"}', length=1000, session=session))
            time.sleep(0.5)
        # A terabyte announced, nothing sent: refused at once, unread.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            started = time.monotonic()
            conn.sendall(_raw_post(port, b"", length=10**12, session=session))
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}}"):
                answer += conn.recv(65536)
            assert time.monotonic() - started < 5
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        assert "limit" in json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["message"]
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    assert b"Exception in ASGI application" not in stderr and b"ClientDisconnect" not in stderr, stderr.decode()


async def _head_answer(port: int, first: bytes, more: bytes = b"", times: int = 0) -> tuple[bytes, int]:
    """Send `first`, then `more` up to `times` times (until an answer comes); what came back and what was sent."""
    sent = 0
    answer = b""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        try:
            await stream.send(first)
            sent += len(first)
            for _ in range(times):
                with anyio.move_on_after(0.005):
                    answer += await stream.receive()
                if answer:
                    break
                await stream.send(more)
                sent += len(more)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            pass
        with anyio.fail_after(20):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                    break
    return answer, sent


async def test_a_head_over_the_cap_is_answered_431_and_closed_whether_it_streams_or_arrives_at_once() -> None:
    import uvicorn

    from breakwater.gateway._known_heads import HEAD_MAX

    ran: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if await lifespan_answered(scope, receive, send):
            return
        ran.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = tcp_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=routing_protocol(), interface="asgi3"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await eventually(lambda: server.started, 10)
        try:
            # One header value that never ends: refused within a read or so of the cap, not buffered for ever.
            answer, sent = await _head_answer(port, b"GET /flood HTTP/1.1\r\nhost: x\r\nx-big: ", b"a" * 65536, times=400)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == -32600
            assert sent < 8 * HEAD_MAX
            # A whole head over the cap in one write, many small headers: refused, the app never runs.
            many = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(HEAD_MAX // 100))
            answer, _ = await _head_answer(port, b"POST /many HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n" + many + b"\r\n")
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
            # A long head under the cap (a big token, cookies) is served as ever, in one write or in pieces.
            fine = b"GET /fine HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + b"t" * (HEAD_MAX // 2) + b"\r\n\r\n"
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                for start in range(0, len(fine), 4096):
                    await stream.send(fine[start : start + 4096])
                with anyio.fail_after(10):
                    assert (await stream.receive()).startswith(b"HTTP/1.1 200 ")
        finally:
            server.should_exit = True
    assert ran == ["/fine"]


_HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


async def test_sessions_a_failed_initialize_keeps_none_an_idle_one_makes_room_and_a_full_cap_says_when() -> None:
    """The session cap (2 here, the SDK's 10,000 in `serve --http`) counts only sessions whose initialize succeeded;
    at the cap the least recently used idle session is ended for a new one; when every one is busy, a 503 with
    Retry-After."""
    import httpx2
    import uvicorn
    from mcp.server.lowlevel import Server

    from breakwater.gateway._sessions import FULL_RETRY_AFTER_S, bound_sessions

    server: Server[Any] = Server("capped")
    app = server.streamable_http_app()
    manager = server.session_manager
    manager.max_sessions = 2
    bound_sessions(manager)
    sock = tcp_listener("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=routing_protocol(), lifespan="on"))

    async def initialize(http: httpx2.AsyncClient, hello: Any = _HELLO) -> httpx2.Response:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        return await http.post(url, json=body, headers=_HEADERS)

    async def ping(http: httpx2.AsyncClient, session: str) -> int:
        headers = {**_HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        return (await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers)).status_code

    async with anyio.create_task_group() as tg, httpx2.AsyncClient(timeout=30) as http:
        tg.start_soon(uv.serve, [sock])
        await eventually(lambda: uv.started, 10)
        try:
            for bad in ({"protocolVersion": 5}, {}, {"protocolVersion": "2025-11-25", "capabilities": 7}):
                failed = await initialize(http, bad)
                assert "error" in _sse_or_json(failed) and "mcp-session-id" not in failed.headers, failed.text
            await eventually(lambda: not manager._server_instances, 5)  # each dropped once its answer is out
            busy, idle = [(await initialize(http)).headers["mcp-session-id"] for _ in range(2)]
            assert await ping(http, idle) == 200
            # `busy` holds its GET stream open: it is never the one ended; `idle` is, for the newcomer.
            get = {"accept": "text/event-stream", "mcp-session-id": busy, "mcp-protocol-version": "2025-11-25"}
            async with http.stream("GET", url, headers=get) as stream:
                assert stream.status_code == 200
                newcomer = await initialize(http)
                assert newcomer.status_code == 200 and "mcp-session-id" in newcomer.headers
                assert await ping(http, idle) == 404 and await ping(http, busy) == 200
                # The newcomer busy too: nothing to end, a 503 that says when to try again.
                get2 = {**get, "mcp-session-id": newcomer.headers["mcp-session-id"]}
                async with http.stream("GET", url, headers=get2) as second:
                    assert second.status_code == 200
                    full = await initialize(http)
                    assert full.status_code == 503 and full.headers["retry-after"] == str(FULL_RETRY_AFTER_S)
        finally:
            uv.should_exit = True


def _sse_or_json(response: Any) -> Any:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return json.loads(next(line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()))
    return response.json()
