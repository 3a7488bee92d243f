"""The default (lazy SSE) mode's tools/call path (`breakwater.gateway._lazy_sse`), over real HTTP.

A real SDK server in a child process on a real port, with the lazy path whose calls run in their
POST's own task (`fast`) and with the same lazy path whose calls go through the session's streams and
dispatcher as the SDK's do (`sdk`): raw POSTs, compared byte for byte, and what only a running call
shows: a call that outlives the commit window becomes an SSE stream with keep-alive pings, a call
that sends something first streams it before its answer, a client's cancel, the session's end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from helpers import FORKED_SCRIPT

pytestmark = pytest.mark.anyio

SERVER = textwrap.dedent(
    """
    import json, sys, anyio, socket, uvicorn, mcp.types as types
    from mcp import MCPError
    from mcp.server.lowlevel import Server
    from breakwater._clock import SystemClock
    from breakwater.gateway._fast_call import install
    from breakwater.gateway._lazy_sse import answer_lazily
    from breakwater.gateway._resume import ResumableStreams
    from breakwater.state._streams import MemoryStreamLog

    async def list_tools(ctx, params):
        names = ["where", "echo", "slow", "progress", "hang", "loud_hang", "fail", "crash"]
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in names])

    def text(value):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])

    async def call_tool(ctx, params):
        args = params.arguments or {}
        if params.name == "where":
            dctx = ctx.session._request_outbound
            return text("fast" if type(dctx).__name__ == "_WatchedContext" else "sdk")
        if params.name == "echo":
            return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(args))],
                                        structured_content={"got": args})
        if params.name == "slow":  # silent for longer than the commit window
            await anyio.sleep(float(args["s"]))
            return text("slept")
        if params.name == "progress":
            await ctx.session.report_progress(1, 2, "half")
            await ctx.session.report_progress(2, 2, "done")
            return text("progressed")
        if params.name in ("hang", "loud_hang"):
            if params.name == "loud_hang":
                await ctx.session.report_progress(1, None, "started")
            try:
                await anyio.sleep_forever()
            finally:
                print(params.name + " was cancelled", file=sys.stderr, flush=True)
        if params.name == "crash":
            raise RuntimeError("boom")
        raise MCPError(code=-32050, message="nope", data={"why": "asked to"})

    server = Server("lazy", on_list_tools=list_tools, on_call_tool=call_tool)
    mode, port_file, keepalive, resume = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "resume"
    app = server.streamable_http_app()
    clock = SystemClock()
    streams = ResumableStreams(MemoryStreamLog(events=100, ttl_s=60, clock=clock), clock=clock, ttl_s=60) if resume else None
    answer_lazily(server.session_manager, clock, keepalive_s=keepalive, streams=streams)
    if mode == "fast":
        install(server)
    loop = "auto"
    if len(sys.argv) > 5 and sys.argv[5] != "-":  # the gateway's outermost middleware, and a log of each write
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        from breakwater.gateway._http import RequestGuard
        app = RequestGuard(app)
        loop = sys.argv[5]

        class Logged:  # the connection's transport, whichever loop made it, with each write logged
            def __init__(self, transport):
                self._transport = transport
            def write(self, data):
                print("WRITE", bytes(data[:12]), len(data), file=sys.stderr, flush=True)
                return self._transport.write(data)
            def __getattr__(self, name):
                return getattr(self._transport, name)

        made = HttpToolsProtocol.connection_made
        HttpToolsProtocol.connection_made = lambda self, transport: made(self, Logged(transport))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    open(port_file, "w").write(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning", loop=loop, http="httptools")).run(sockets=[sock])
    """
)

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip


class Server:
    def __init__(self, url: str, proc: subprocess.Popen[str]) -> None:
        self.url = url
        self.proc = proc

    def stderr(self) -> str:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    async def start(mode: str, *, keepalive: float = 15.0, resume: bool = False, guard: str = "-") -> Server:
        path = tmp_path / "lazy_server.py"
        path.write_text(FORKED_SCRIPT + SERVER)
        port_file = tmp_path / f"port-{len(procs)}"
        args = [sys.executable, str(path), mode, str(port_file), str(keepalive), "resume" if resume else "-"]
        args.append(guard)  # the loop to log each write on behind the guard, or "-"
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        with anyio.fail_after(30):
            while not (port_file.exists() and port_file.read_text()):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                await anyio.sleep(0.05)
        return Server(f"http://127.0.0.1:{port_file.read_text()}/mcp", proc)

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


async def open_session(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    opened = await http.post(url, json=INIT, headers=HEADERS)
    assert opened.status_code == 200
    session = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    initialized = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
    assert initialized.status_code == 202
    return session


def call(request_id: Any, name: Any, arguments: Any = None, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "arguments": arguments if arguments is not None else {}, **params}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": body}


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]


# Bodies answered as one JSON body (nothing before the answer), on both paths; the raw bytes must match.
BODIES: list[Any] = [
    call(2, "echo", {"a": [1, 2.5, None, "é"], "b": {"c": True}}),
    call("s-3", "fail"),
    call(4, "crash"),
    call(5, "nothing"),
    call(6, 3),  # a name that is no string: the SDK's validation
    call(7, "echo", []),  # arguments that are no object
    call(8, "echo", _meta={"progressToken": "p"}),  # a token, but nothing sent for it
    {"jsonrpc": "2.0", "id": 9, "method": "tools/call"},  # no params
    {"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "echo"}, "extra": 1},  # not the envelope
    call(11, "echo", _meta={"io.modelcontextprotocol/protocolVersion": "2026-07-28"}),  # a modern envelope
    call(True, "echo"),  # an id that is no id
    call(12.5, "echo"),
    {"jsonrpc": "2.0", "id": 13, "method": "tools/list"},
]


async def raw_answers(url: str) -> list[tuple[int, str, bytes]]:
    answers = []
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, url)
        for body in BODIES:
            reply = await http.post(url, content=json.dumps(body).encode(), headers=session)
            answers.append((reply.status_code, reply.headers.get("content-type", ""), reply.content))
    return answers


@pytest.mark.parametrize("resume", [False, True])
async def test_every_raw_answer_is_byte_for_byte_the_sdk_paths(start: Any, resume: bool) -> None:
    fast, sdk = await start("fast", resume=resume), await start("sdk", resume=resume)
    async with httpx2.AsyncClient(timeout=30) as http:
        for server, expected in ((fast, "fast"), (sdk, "sdk")):
            session = await open_session(http, server.url)
            where = await http.post(server.url, json=call(2, "where"), headers=session)
            assert where.headers["content-type"] == "application/json"
            assert where.json()["result"]["content"][0]["text"] == expected
    ours, theirs = await raw_answers(fast.url), await raw_answers(sdk.url)
    assert ours == theirs
    assert ours[0][:2] == (200, "application/json")
    assert json.loads(ours[0][2])["result"]["structuredContent"] == {"got": {"a": [1, 2.5, None, "é"], "b": {"c": True}}}
    assert json.loads(ours[1][2])["error"] == {"code": -32050, "message": "nope", "data": {"why": "asked to"}}
    assert json.loads(ours[2][2])["error"] == {"code": 0, "message": "boom"}


async def test_an_id_still_in_flight_is_refused_and_the_first_call_is_answered(start: Any) -> None:
    server = await start("fast")
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, server.url)
        slow: list[httpx2.Response] = []
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def first() -> None:
                    slow.append(await http.post(server.url, json=call(20, "slow", {"s": 0.5}), headers=session))

                tg.start_soon(first)
                await anyio.sleep(0.2)
                twice = await http.post(server.url, json=call(20, "where"), headers=session)
        # A duplicate id: not run (the SDK ran it beside the first, `_fast_call._unique_ids`), refused at once.
        assert twice.json()["error"]["code"] == -32600 and "in flight" in twice.json()["error"]["message"]
        assert slow[0].json()["result"]["content"][0]["text"] == "slept"


async def test_progress_before_the_answer_streams_it_first_as_the_sdk_path_does(start: Any) -> None:
    fast, sdk = await start("fast", resume=True), await start("sdk", resume=True)
    streamed = []
    async with httpx2.AsyncClient(timeout=30) as http:
        for server in (fast, sdk):
            session = await open_session(http, server.url)
            reply = await http.post(server.url, json=call(2, "progress", _meta={"progressToken": "p"}), headers=session)
            assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
            lines = reply.text.splitlines()
            # A resumable stream starts with its priming event, and every event has an id.
            assert lines[0] == "id: 1/2"
            streamed.append([line for line in lines if not line.startswith(": ping")])
    assert streamed[0] == streamed[1]
    messages = events("\n".join(streamed[0]))
    assert [m.get("method") for m in messages] == ["notifications/progress", "notifications/progress", None]
    assert messages[-1]["id"] == 2 and messages[-1]["result"]["content"][0]["text"] == "progressed"


async def test_a_call_that_outlives_the_window_becomes_a_stream_with_pings(start: Any) -> None:
    """The window is min(1 s, keep-alive): a silent 1.2 s call with 0.3 s pings commits at 0.3 s and is pinged."""
    server = await start("fast", keepalive=0.3)
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, server.url)
        quick = await http.post(server.url, json=call(2, "slow", {"s": 0}), headers=session)
        assert quick.headers["content-type"] == "application/json"
        with anyio.fail_after(10):
            slow = await http.post(server.url, json=call(3, "slow", {"s": 1.2}), headers=session)
        assert slow.status_code == 200 and slow.headers["content-type"] == "text/event-stream"
        assert slow.text.count(": ping") >= 2
        assert events(slow.text) == [
            {"jsonrpc": "2.0", "id": 3, "result": {"content": [{"type": "text", "text": "slept"}], "isError": False}}
        ]
        # The session goes on, on the same path.
        where = await http.post(server.url, json=call(4, "where"), headers=session)
        assert where.json()["result"]["content"][0]["text"] == "fast"


@pytest.mark.parametrize("tool", ["hang", "loud_hang"])
async def test_a_client_cancel_ends_the_call_with_request_cancelled(start: Any, tool: str) -> None:
    """Silent: one JSON body (within the window); after progress: the stream's last event. The handler is cancelled."""
    server = await start("fast", keepalive=15.0)
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, server.url)
        replies: list[httpx2.Response] = []
        async with anyio.create_task_group() as tg:

            async def hang() -> None:
                replies.append(await http.post(server.url, json=call(2, tool, _meta={"progressToken": "p"}), headers=session))

            tg.start_soon(hang)
            await anyio.sleep(0.3)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2, "reason": "t"}}
            assert (await http.post(server.url, json=cancel, headers=session)).status_code == 202
        cancelled = {"jsonrpc": "2.0", "id": 2, "error": {"code": -32800, "message": "Request cancelled"}}
        if tool == "hang":
            assert replies[0].headers["content-type"] == "application/json"
            assert replies[0].json() == cancelled
        else:
            assert replies[0].headers["content-type"] == "text/event-stream"
            assert events(replies[0].text)[-1] == cancelled
        where = await http.post(server.url, json=call(3, "where"), headers=session)
        assert where.json()["result"]["content"][0]["text"] == "fast"
    assert f"{tool} was cancelled" in server.stderr()


@pytest.mark.parametrize("mode", ["fast", "sdk"])
@pytest.mark.parametrize("tool", ["hang", "loud_hang"])
async def test_a_session_deleted_during_a_call_ends_it_as_the_sdk_path_does(start: Any, mode: str, tool: str) -> None:
    server = await start(mode, keepalive=15.0)
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, server.url)
        replies: list[httpx2.Response] = []
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def hang() -> None:
                    body = call(2, tool, _meta={"progressToken": "p"})
                    replies.append(await http.post(server.url, json=body, headers=session))

                tg.start_soon(hang)
                await anyio.sleep(0.3)
                assert (await http.delete(server.url, headers=session)).status_code == 200
        if tool == "hang":
            assert replies[0].status_code == 500
            assert replies[0].json() == {
                "jsonrpc": "2.0",
                # The SDK's own JSON path says the id null: a client with several calls in flight cannot tell whose.
                "id": 2,
                "error": {"code": -32603, "message": "Session terminated before the request completed"},
            }
        else:  # the stream ends without an answer (the client's call fails as the session is gone)
            assert replies[0].headers["content-type"] == "text/event-stream"
            assert [m.get("method") for m in events(replies[0].text)] == ["notifications/progress"]
        gone = await http.post(server.url, json=call(3, "where"), headers=session)
        assert gone.status_code == 404
    assert f"{tool} was cancelled" in server.stderr()


async def test_a_burst_of_calls_is_answered_each_as_one_json_body(start: Any) -> None:
    server = await start("fast")
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, server.url)
        replies: dict[int, httpx2.Response] = {}

        async def one(i: int) -> None:
            replies[i] = await http.post(server.url, json=call(i, "echo", {"i": i}), headers=session)

        async with anyio.create_task_group() as tg:
            for i in range(2, 52):
                tg.start_soon(one, i)
    assert all(r.headers["content-type"] == "application/json" for r in replies.values())
    assert {i: r.json()["result"]["structuredContent"] for i, r in replies.items()} == {i: {"got": {"i": i}} for i in replies}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_json_answer_is_one_write_and_a_stream_is_not_held(start: Any, loop: str) -> None:
    """uvicorn writes a response's head and body separately; behind `RequestGuard` a whole response is one write."""
    server = await start("fast", guard=loop)
    async with httpx2.AsyncClient(timeout=30) as http:
        session = await open_session(http, server.url)
        quick = await http.post(server.url, json=call(2, "echo", {"a": 1}), headers=session)
        streamed = await http.post(server.url, json=call(3, "progress", _meta={"progressToken": "p"}), headers=session)
        refused = await http.post(server.url, content=b"{not json", headers=session)
    assert quick.json()["result"]["structuredContent"] == {"got": {"a": 1}}
    assert [m.get("method") for m in events(streamed.text)] == ["notifications/progress", "notifications/progress", None]
    assert refused.status_code == 400
    writes = [line.split(" ", 1)[1] for line in server.stderr().splitlines() if line.startswith("WRITE ")]
    heads = [w for w in writes if w.startswith("b'HTTP/1.1 ")]
    # initialize (SSE), initialized (202, no body), the call, the stream, the refusal: one head each.
    assert len(heads) == 5, writes
    # Without the guard uvicorn writes each JSON body on its own (a write starting with `{`); with it, never.
    assert not [w for w in writes if w.startswith("b'{")], writes
    assert [w for w in writes if w.startswith("b'HTTP/1.1 200") and int(w.rsplit(" ", 1)[1]) > 250], writes
