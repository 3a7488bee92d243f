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
