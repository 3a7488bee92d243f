"""Known heads: a call POST whose head the whole stack accepted before goes straight to its session's call path.

Two layers, both over real sockets. The protocol alone (`routing_protocol`) under a real uvicorn, with
an app and a route of the test's own, shows what is routed and what is not. The real gateway
(`breakwater serve --http`, both 2025-11-25 modes, a bearer token, a real upstream) shows that a
routed call is answered byte for byte as the whole stack answers it, and that every refusal of the
stack still happens once a head is known: a head that differs in one header, an ended session, a
draining gateway, a body that is not a plain call.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from anyio.abc import SocketStream

from breakwater.gateway import _known_heads
from breakwater.gateway._known_heads import OFFER, ROUTED_BODY_MAX, routing_protocol
from breakwater.gateway._listen import tcp_listener
from breakwater.gateway._one_write import WholeSend
from breakwater.testing.server import read_state, serve_http
from helpers import eventually, lifespan_answered

pytestmark = pytest.mark.anyio

BREAKWATER = [sys.executable, "-m", "breakwater"]
TOKEN = "known-heads-token-0123456789"

Response = tuple[int, list[tuple[str, str]], bytes]


# ---- a raw HTTP/1.1 client: the test decides every byte of the head ----


def request(method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"", *, length: int | None = None) -> bytes:
    """The bytes of a request; `length` announces a body sent later (or none, with chunked)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    if length is not None or body or method == "POST":
        lines.append(f"content-length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Raw:
    """One keep-alive connection that reads whole responses (Content-Length or chunked)."""

    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def _fill(self) -> None:
        data = await self.stream.receive()
        self.buffer += data

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            await self._fill()
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    async def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            await self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    async def read(self) -> Response:
        head = (await self._until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = [(k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in head[1:])]
        fields = dict(headers)
        if "content-length" in fields:
            return status, headers, await self._exactly(int(fields["content-length"]))
        if fields.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(await self._until(b"\r\n"), 16):
                body += await self._exactly(size)
                await self._exactly(2)
            await self._exactly(2)
            return status, headers, body
        return status, headers, b""

    async def send(self, data: bytes) -> None:
        await self.stream.send(data)

    async def exchange(self, data: bytes) -> Response:
        await self.send(data)
        return await self.read()


async def _closed(raw: Raw) -> bool:
    """Whether the server closes `raw` (with nothing more sent on it)."""
    try:
        await raw.stream.receive()
    except anyio.EndOfStream:
        return True
    return False


@asynccontextmanager
async def connection(port: int) -> AsyncIterator[Raw]:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        yield Raw(stream)


# ---- the protocol alone ----


class Recorder:
    """An ASGI app that accepts the offer of a POST whose body starts with `call`, and the route it leaves."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        if await lifespan_answered(scope, receive, send):
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append(("app", body))
        if body.startswith(b"call") and OFFER in scope:
            scope[OFFER].accept(self)
        await _answer(send, b"app:" + body)

    def take(self, body: bytes) -> Callable[[Any, Any, Any], Awaitable[None]] | None:
        if not body.startswith(b"call"):
            return None

        async def routed(scope: Any, receive: Any, send: Any) -> None:
            self.seen.append(("route", body))
            await _answer(send, b"route:" + body)

        return routed


async def _answer(send: Any, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def routing_server(recorder: Recorder, log_level: str = "warning") -> AsyncIterator[int]:
    sock = tcp_listener("127.0.0.1", 0)
    config = uvicorn.Config(recorder.app, log_level=log_level, http=routing_protocol(), interface="asgi3")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await eventually(lambda: server.started, 10)
        try:
            yield sock.getsockname()[1]
        finally:
            server.should_exit = True


HEAD = [("host", "127.0.0.1"), ("content-type", "application/json"), ("mcp-session-id", "abc")]


class Replier(Recorder):
    """A recorder whose route answers below the ASGI layer (`WholeSend.reply`), as the gateway's lanes do."""

    def take(self, body: bytes) -> Callable[[Any, Any, Any], Awaitable[None]] | None:
        if not body.startswith(b"call"):
            return None

        async def routed(scope: Any, receive: Any, send: Any) -> None:
            assert isinstance(send, WholeSend)
            self.seen.append(("route", body))
            answer = b"app:" + body  # what the app would answer, so the two can be compared byte for byte
            headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]
            await send.reply(200, headers, answer)

        return routed


async def test_an_answer_written_below_asgi_is_uvicorns_own_with_its_log_line_pipelining_and_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replier = Replier()
    access = logging.getLogger("uvicorn.access")  # uvicorn's logging config: its own handler, not propagated
    async with routing_server(replier, log_level="info") as port, connection(port) as raw:
        access.addHandler(caplog.handler)
        try:
            by_app = await raw.exchange(request("POST", "/mcp", HEAD, b"call 1"))  # accepted: the next ones are routed
            by_route = await raw.exchange(request("POST", "/mcp", HEAD, b"call 1"))
            await raw.send(b"".join(request("POST", "/mcp", HEAD, f"call {i}".encode()) for i in (2, 3)))
            pipelined = [await raw.read() for _ in range(2)]
            closing = await raw.exchange(request("POST", "/mcp", [*HEAD, ("connection", "close")], b"call 4"))
            with anyio.fail_after(10):
                assert await _closed(raw)
            async with connection(port) as again:  # the closing head is known now: routed, and closed as uvicorn closes
                closed = await again.exchange(request("POST", "/mcp", [*HEAD, ("connection", "close")], b"call 4"))
                with anyio.fail_after(10):
                    assert await _closed(again)
        finally:
            access.removeHandler(caplog.handler)
    undated = [(status, [h for h in headers if h[0] != "date"], body) for status, headers, body in (by_app, by_route)]
    assert undated[0] == undated[1] and by_route[2] == b"app:call 1"
    assert [body for _, _, body in pipelined] == [b"app:call 2", b"app:call 3"]
    assert [(k, v) for k, v in closing[1] if k != "date"] == [(k, v) for k, v in closed[1] if k != "date"]
    assert dict(closed[1])["connection"] == "close" and closed[2] == closing[2] == b"app:call 4"
    assert [who for who, body in replier.seen if body == b"call 4"] == ["app", "route"]
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert len(lines) == 6 and len({line.split(" - ", 1)[1] for line in lines}) == 1, lines  # one line each, the same


async def test_a_post_whose_head_was_accepted_goes_to_its_route_on_any_connection_a_different_one_to_the_app() -> None:
    recorder = Recorder()
    async with routing_server(recorder) as port, connection(port) as raw:
        assert (await raw.exchange(request("POST", "/mcp", HEAD, b"call 1")))[2] == b"app:call 1"
        assert (await raw.exchange(request("POST", "/mcp", HEAD, b"call 2")))[2] == b"route:call 2"
        # The route does not take it: the whole way, on the same head.
        assert (await raw.exchange(request("POST", "/mcp", HEAD, b"list")))[2] == b"app:list"
        # One byte of one header differs, a header more, another path, a query, another method: the whole way.
        other = [("host", "127.0.0.1"), ("content-type", "application/json"), ("mcp-session-id", "abd")]
        assert (await raw.exchange(request("POST", "/mcp", other, b"call 3")))[2] == b"app:call 3"
        assert (await raw.exchange(request("POST", "/mcp", [*HEAD, ("origin", "x")], b"call 4")))[2] == b"app:call 4"
        assert (await raw.exchange(request("POST", "/other", HEAD, b"call 5")))[2] == b"app:call 5"
        assert (await raw.exchange(request("POST", "/mcp?x=1", HEAD, b"call 6")))[2] == b"app:call 6"
        assert (await raw.exchange(request("PUT", "/mcp", HEAD, b"call 7")))[2] == b"app:call 7"
        # Another connection, the accepted head: routed from its first request (a burst's new connections).
        async with connection(port) as second:
            assert (await second.exchange(request("POST", "/mcp", HEAD, b"call 8")))[2] == b"route:call 8"
    assert [who for who, body in recorder.seen if body in (b"call 2", b"call 8")] == ["route", "route"]


async def test_pipelined_posts_are_answered_in_order_and_a_body_cut_short_runs_nothing() -> None:
    recorder = Recorder()
    async with routing_server(recorder) as port:
        async with connection(port) as raw:
            await raw.exchange(request("POST", "/mcp", HEAD, b"call 0"))
            await raw.send(b"".join(request("POST", "/mcp", HEAD, f"call {i}".encode()) for i in (1, 2, 3)))
            assert [(await raw.read())[2] for _ in range(3)] == [b"route:call 1", b"route:call 2", b"route:call 3"]
            # The head of a known POST, half its body, then the client goes away: held, never run.
            await raw.send(request("POST", "/mcp", HEAD, b"call 4 whole")[:-6])
        async with connection(port) as raw:
            assert (await raw.exchange(request("POST", "/mcp", HEAD, b"call 5")))[2] == b"route:call 5"
    assert all(not body.startswith(b"call 4") for _, body in recorder.seen)


async def test_what_must_be_read_as_it_comes_is_never_held() -> None:
    """A body past the read high-water mark, `Expect: 100-continue` (the client waits for the app), chunked."""
    recorder = Recorder()
    async with routing_server(recorder) as port, connection(port) as raw:
        await raw.exchange(request("POST", "/mcp", HEAD, b"call 0"))
        big = b"call " + b"x" * ROUTED_BODY_MAX
        assert (await raw.exchange(request("POST", "/mcp", HEAD, big)))[2] == b"app:" + big
        await raw.send(request("POST", "/mcp", [*HEAD, ("expect", "100-continue")], length=6))
        assert (await raw.read())[0] == 100
        assert (await raw.exchange(b"call 1"))[2] == b"app:call 1"
        chunked = request("POST", "/mcp", [*HEAD, ("transfer-encoding", "chunked")])
        chunked = chunked.replace(b"content-length: 0\r\n", b"") + b"6\r\ncall 2\r\n0\r\n\r\n"
        assert (await raw.exchange(chunked))[2] == b"app:call 2"


async def test_a_server_remembers_a_bounded_number_of_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_known_heads, "KNOWN_HEADS_MAX", 3)
    recorder = Recorder()
    heads = [[*HEAD, ("x-n", str(n))] for n in range(4)]
    async with routing_server(recorder) as port, connection(port) as raw:
        for head in heads[:3]:
            await raw.exchange(request("POST", "/mcp", head, b"call"))
        assert (await raw.exchange(request("POST", "/mcp", heads[0], b"call a")))[2] == b"route:call a"
        await raw.exchange(request("POST", "/mcp", heads[3], b"call"))  # the fourth: the table starts again
        assert (await raw.exchange(request("POST", "/mcp", heads[0], b"call b")))[2] == b"app:call b"
        assert (await raw.exchange(request("POST", "/mcp", heads[3], b"call c")))[2] == b"route:call c"


# ---- the real gateway ----


def _hello() -> bytes:
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    return json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}).encode()


def _call(request_id: int, tool: str = "up__add", arguments: dict[str, Any] | None = None) -> bytes:
    params = {"name": tool, "arguments": arguments if arguments is not None else {"a": 2, "b": 3}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


def _json(response: Response) -> Any:
    _, headers, body = response
    if dict(headers).get("content-type", "").startswith("text/event-stream"):
        body = [line[5:] for line in body.split(b"\n") if line.startswith(b"data:") and line[5:].strip()][-1]
    return json.loads(body)


@asynccontextmanager
async def gateway(tmp_path: Path, upstream_url: str, *extra: str) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    config = tmp_path / "breakwater.toml"
    config.write_text(f'[servers.up]\nurl = "{upstream_url}"\n')
    port_file = tmp_path / "port"
    env = dict(
        os.environ,
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"),
        BREAKWATER_DRAIN_S="20",
    )
    argv = [*BREAKWATER, "serve", "--config", str(config), "--http", "127.0.0.1:0", "--port-file", str(port_file)]
    proc = subprocess.Popen([*argv, "--token", TOKEN, *extra], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        with anyio.fail_after(60):
            while not port_file.exists() or not port_file.read_text():
                assert proc.poll() is None
                await anyio.sleep(0.05)
        yield proc, int(port_file.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def _session(raw: Raw, port: int, accept: str) -> list[tuple[str, str]]:
    """Initialize a session on `raw`; the head its calls are POSTed with."""
    head = [
        ("host", f"127.0.0.1:{port}"),
        ("authorization", f"Bearer {TOKEN}"),
        ("accept", accept),
        ("content-type", "application/json"),
    ]
    status, headers, _ = await raw.exchange(request("POST", "/mcp", head, _hello()))
    assert status == 200
    session = [*head, ("mcp-session-id", dict(headers)["mcp-session-id"]), ("mcp-protocol-version", "2025-11-25")]
    initialized = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    assert (await raw.exchange(request("POST", "/mcp", session, initialized)))[0] == 202
    for _ in range(200):  # the upstream connects in the background
        if (_json(await raw.exchange(request("POST", "/mcp", session, _call(1)))).get("result") or {}).get("isError") is False:
            return session
        await anyio.sleep(0.05)
    raise AssertionError("the upstream's add tool never answered")


def _comparable(response: Response) -> Response:
    """`response` without what differs from call to call: the Date header, the upstream's call counter."""
    status, headers, body = response
    counted = re.sub(rb'(\\?"call\\?": ?)\d+', rb"\g<1>0", body)
    return status, [(k, v) for k, v in headers if k != "date"], counted


@pytest.mark.parametrize("mode", ["json-response", "default"])
async def test_a_routed_call_is_answered_byte_for_byte_as_the_whole_stack_answers_it(tmp_path: Path, mode: str) -> None:
    extra = ("--json-response",) if mode == "json-response" else ()
    async with (
        serve_http("--tool", "add:readonly") as upstream,
        gateway(tmp_path, upstream.url, *extra) as (_, port),
        connection(port) as raw,
    ):
        session = await _session(raw, port, "application/json, text/event-stream")  # its calls' head is known
        # A head never seen (one header more) crosses the whole stack; the known one, on any connection, is routed.
        first = _comparable(await raw.exchange(request("POST", "/mcp", [*session, ("x-trace", "1")], _call(7))))
        again = _comparable(await raw.exchange(request("POST", "/mcp", session, _call(7))))
        async with connection(port) as other:
            elsewhere = _comparable(await other.exchange(request("POST", "/mcp", session, _call(7))))
        assert first == again == elsewhere
        status, headers, _ = first
        assert status == 200 and dict(headers)["content-type"] == "application/json"
        assert _json(first)["result"]["structuredContent"]["sum"] == 5
        # A client that closes after each call: its head is learnt as any other, and the routed answer says
        # `connection: close` and closes, as uvicorn's own answer does.
        closing = [*session, ("connection", "close")]
        answers = []
        for _ in range(3):
            async with connection(port) as once:
                answers.append(_comparable(await once.exchange(request("POST", "/mcp", closing, _call(7)))))
                with anyio.fail_after(10):
                    assert await _closed(once)
        assert answers[0] == answers[1] == answers[2]
        assert dict(answers[0][1])["connection"] == "close" and answers[0][2] == first[2]


@pytest.mark.parametrize("mode", ["json-response", "default"])
async def test_every_refusal_of_the_stack_still_happens_once_a_head_is_known(tmp_path: Path, mode: str) -> None:
    extra = ("--json-response",) if mode == "json-response" else ()
    accept = "application/json, text/event-stream"
    async with (
        serve_http("--tool", "add:readonly") as upstream,
        gateway(tmp_path, upstream.url, *extra) as (_, port),
        connection(port) as raw,
    ):
        session = await _session(raw, port, accept)
        assert _json(await raw.exchange(request("POST", "/mcp", session, _call(2))))["result"]["isError"] is False

        def varied(name: str, value: str | None) -> list[tuple[str, str]]:
            kept = [(k, v) for k, v in session if k != name]
            return kept if value is None else [*kept, (name, value)]

        refused = {
            "a wrong token": (varied("authorization", f"Bearer {TOKEN[:-1]}X"), 401),
            "no token": (varied("authorization", None), 401),
            "an Origin on another port": (varied("origin", "http://127.0.0.1:1"), 403),
            "a foreign Origin": (varied("origin", "http://evil.example"), 403),
            "a foreign Host": (varied("host", "evil.example"), 421),
            "an unknown session": (varied("mcp-session-id", "0" * 32), 404),
            "an unknown protocol version": (varied("mcp-protocol-version", "1999-01-01"), 400),
            "no JSON in Accept": (varied("accept", "text/event-stream"), 406),
            "another content type": (varied("content-type", "text/plain"), 415),  # as `application/jsonx` is
        }
        for why, (head, status) in refused.items():
            for conn in (raw, None):
                if conn is None:
                    async with connection(port) as fresh:
                        got = await fresh.exchange(request("POST", "/mcp", head, _call(3)))
                else:
                    got = await conn.exchange(request("POST", "/mcp", head, _call(3)))
                assert got[0] == status, (why, got)
        # A loopback Host without a port (a local reverse proxy's `Host $host`) is the loopback: it was refused 421.
        for host in ("localhost", "127.0.0.1"):
            assert (await raw.exchange(request("POST", "/mcp", varied("host", host), _call(6))))[0] == 200, host
        # Host names are case-insensitive: a client that spells the name in capitals was refused 421.
        for host in ("LOCALHOST", f"LocalHost:{port}"):
            assert (await raw.exchange(request("POST", "/mcp", varied("host", host), _call(6))))[0] == 200, host
        capitals = [*varied("host", f"LOCALHOST:{port}"), ("origin", f"HTTP://LocalHost:{port}")]
        assert (await raw.exchange(request("POST", "/mcp", capitals, _call(6))))[0] == 200
        foreign = [*varied("host", f"LOCALHOST:{port}"), ("origin", "HTTP://EVIL.example")]
        assert (await raw.exchange(request("POST", "/mcp", foreign, _call(6))))[0] == 403
        # An unknown revision in a session's header is said as one: it read "params._meta must be an object carrying
        # the required 'io.modelcontextprotocol/protocolVersion' ... envelope keys" (taken for a 2026-07-28 request).
        status, _, body = await raw.exchange(request("POST", "/mcp", varied("mcp-protocol-version", "1999-01-01"), _call(6)))
        error = json.loads(body)["error"]
        assert status == 400 and error["code"] == -32022 and "Unsupported protocol version '1999-01-01'" in error["message"]
        assert error["data"]["requested"] == "1999-01-01" and "2025-11-25" in error["data"]["supported"]
        # A request without a session is refused without naming one: it named a new id no session had (404 when used).
        status, head, _ = await raw.exchange(request("POST", "/mcp", varied("mcp-session-id", None), _call(6)))
        assert status == 400 and "mcp-session-id" not in dict(head), head
        # Media types are compared without case too (RFC 9110 §8.3.1): `Application/JSON` was refused 415.
        media = [(k, v.upper() if k in ("content-type", "accept") else v) for k, v in session]
        assert (await raw.exchange(request("POST", "/mcp", media, _call(6))))[0] == 200
        # The known head with a body that is no plain call: answered as the whole stack answers it.
        nan = b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"up__add","arguments":{"a":NaN}}}'
        status, _, body = await raw.exchange(request("POST", "/mcp", session, nan))
        assert status == 400 and json.loads(body)["error"]["code"] == -32700
        tools_list = b'{"jsonrpc":"2.0","id":5,"method":"tools/list"}'
        listed = _json(await raw.exchange(request("POST", "/mcp", session, tools_list)))
        assert "up__add" in {t["name"] for t in listed["result"]["tools"]}
        # The session ends (DELETE): its known head is refused as the transport refuses an ended session.
        assert (await raw.exchange(request("DELETE", "/mcp", session)))[0] == 200
        assert (await raw.exchange(request("POST", "/mcp", session, _call(6))))[0] == 404


async def test_a_draining_gateway_refuses_a_known_head(tmp_path: Path) -> None:
    state = tmp_path / "state"
    flags = ("--tool", "add:readonly", "--tool", "slow:latency=30,readonly", "--state-file", str(state))
    async with (
        serve_http(*flags) as upstream,
        gateway(tmp_path, upstream.url, "--json-response") as (proc, port),
        connection(port) as raw,
        connection(port) as busy,
    ):
        session = await _session(raw, port, "application/json")
        assert _json(await raw.exchange(request("POST", "/mcp", session, _call(2))))["result"]["isError"] is False
        # A call in flight holds the drain open; the known head then arrives on a connection of its own.
        await busy.send(request("POST", "/mcp", session, _call(3, "up__slow", {})))
        await eventually(lambda: state.exists() and sum(read_state(state)["in_flight"].values()) == 1, 20)
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            while True:  # until the signal is handled, the call is answered
                async with connection(port) as late:
                    status, headers, body = await late.exchange(request("POST", "/mcp", session, _call(4)))
                if status != 200:
                    break
                await anyio.sleep(0.02)
        assert status == 503 and dict(headers)["connection"] == "close" and json.loads(body)["id"] == 4


_MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _modern_call(request_id: int, arguments: dict[str, Any] | None = None) -> bytes:
    params = {"name": "up__add", "arguments": arguments if arguments is not None else {"a": 2, "b": 3}, "_meta": _MODERN_META}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


async def test_a_2026_call_with_a_known_head_is_answered_as_the_whole_stack_answers_it_and_refused_as_it_refuses(
    tmp_path: Path,
) -> None:
    """A stateless 2026-07-28 client sends one head for every call of a tool: after the first, the stack is skipped
    (`_modern_http._ModernRoute`); the answers are the stack's, and so are its refusals."""
    async with (
        serve_http("--tool", "add:readonly") as upstream,
        gateway(tmp_path, upstream.url) as (_, port),
        connection(port) as raw,
    ):
        head = [
            ("host", f"127.0.0.1:{port}"),
            ("authorization", f"Bearer {TOKEN}"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "up__add"),
        ]
        with anyio.fail_after(30):  # the upstream connects in the background
            while (_json(await raw.exchange(request("POST", "/mcp", head, _modern_call(1)))).get("result") or {}).get(
                "isError"
            ) is not False:
                await anyio.sleep(0.05)
        first = _comparable(await raw.exchange(request("POST", "/mcp", [*head, ("x-trace", "1")], _modern_call(7))))
        again = _comparable(await raw.exchange(request("POST", "/mcp", head, _modern_call(7))))
        async with connection(port) as other:
            elsewhere = _comparable(await other.exchange(request("POST", "/mcp", head, _modern_call(7))))
        assert first == again == elsewhere
        assert first[0] == 200 and _json(first)["result"]["structuredContent"]["sum"] == 5
        # What the stack refuses by the body, and what the entry refuses by the head against the body, still is.
        nan = _modern_call(8).replace(b'"a": 2', b'"a": NaN')
        status, _, body = await raw.exchange(request("POST", "/mcp", head, nan))
        assert status == 400 and json.loads(body)["error"]["code"] == -32700
        other_tool = _modern_call(9).replace(b'"up__add"', b'"up__other"')
        status, _, body = await raw.exchange(request("POST", "/mcp", head, other_tool))
        assert status == 400 and json.loads(body)["error"]["code"] == -32020, body  # Mcp-Name disagrees: HEADER_MISMATCH
        wrong = [(k, v) for k, v in head if k != "authorization"]
        assert (await raw.exchange(request("POST", "/mcp", wrong, _modern_call(10))))[0] == 401
        # The known head still reaches the tool afterwards.
        assert _json(await raw.exchange(request("POST", "/mcp", head, _modern_call(11))))["result"]["isError"] is False
