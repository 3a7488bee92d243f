"""The stdio fast lane for `tools/call` (`breakwater.gateway._fast_call`), against the SDK path it stands in for.

A real SDK server in a child process, on breakwater's stdio transport with the lane (`lane`) and
without (`sdk`), driven by a real SDK client over its pipes and by raw lines: the same answers,
errors, progress, log messages, sampling round trips and cancellations either way, and the lane
actually taking the calls it claims. The HTTP fast paths likewise: 2025-11-25 in JSON and default
mode (`_fast_http`), and 2026-07-28 in the default mode (`_modern_http`), each against the SDK's own
entry, with raw POSTs compared byte for byte.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import anyio
import mcp.types as types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.runner import ServerRunner
from mcp_types import methods as sdk_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from breakwater.gateway._fast_call import _plain_surface, serialize_call
from helpers import FORKED_SCRIPT

pytestmark = [pytest.mark.long_module(80), pytest.mark.anyio]

SERVER = textwrap.dedent(
    """
    import sys, anyio, mcp.types as types
    from mcp import MCPError
    from mcp.server.lowlevel import Server
    from breakwater.gateway._stdio_server import stdio_server

    TOOLS = ["where", "progress", "log", "ask", "hang", "fail", "crash"]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in TOOLS])

    def text(value):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])

    async def call_tool(ctx, params):
        if params.name == "where":
            # The SDK dispatcher knows every request it dispatched; the lane's calls never reach it.
            dispatcher = ctx.session._request_outbound._dispatcher
            return text("sdk" if ctx.request_id in dispatcher._in_flight else "lane")
        if params.name == "progress":
            await ctx.session.report_progress(1, 2, "half")
            await ctx.session.report_progress(2, 2, "done")
            return text("progressed")
        if params.name == "log":
            await ctx.session.send_log_message("warning", "careful", related_request_id=ctx.request_id)
            return text("logged")
        if params.name == "ask":
            answer = await ctx.session.create_message(
                [types.SamplingMessage(role="user", content=types.TextContent(type="text", text="2+2?"))],
                max_tokens=5,
                related_request_id=ctx.request_id,
            )
            return text("answer: " + answer.content.text)
        if params.name == "hang":
            try:
                await anyio.sleep_forever()
            finally:
                print("hang was cancelled", file=sys.stderr, flush=True)
        if params.name == "fail":
            raise MCPError(code=-32050, message="nope", data={"why": "asked to"})
        if params.name == "crash":
            raise RuntimeError("boom")
        return types.CallToolResult(content=[], is_error=True)

    server = Server("lane", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        lane = server if sys.argv[1] == "lane" else None
        async with stdio_server(server=lane) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
    """
)

INIT = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def call(request_id: Any, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


# Well-formed calls the lane takes, and lines it must leave to the SDK, whose answers must not change.
LINES = [
    call(2, {"name": "where", "arguments": {}}),
    call("s-3", {"name": "fail"}),
    call(4, {"name": "crash", "arguments": {}}),
    call(5, {"name": 3, "arguments": {}}),  # not a string: the SDK's -32602
    call(6, {"name": "where", "arguments": []}),
    call(7, "where"),
    {"jsonrpc": "2.0", "id": 8, "method": "tools/call"},
    call(9, {"name": "where", "arguments": {}, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
    {"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "where"}, "extra": 1},
    call(11, {"name": "nothing", "arguments": {}}),
]


def script(tmp_path: Path) -> Path:
    path = tmp_path / "server.py"
    path.write_text(FORKED_SCRIPT + SERVER)
    return path


def run_lines(tmp_path: Path, mode: str) -> dict[Any, Any]:
    wire = "".join(json.dumps(r) + "\n" for r in INIT + LINES)
    done = subprocess.run(
        [sys.executable, str(script(tmp_path)), mode], input=wire, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    messages = [json.loads(line) for line in done.stdout.splitlines()]
    return {m["id"]: m for m in messages if "id" in m}


def test_every_answer_and_error_is_the_sdks(tmp_path: Path) -> None:
    lane, sdk = run_lines(tmp_path, "lane"), run_lines(tmp_path, "sdk")
    assert lane[2]["result"]["content"][0]["text"] == "lane"
    assert sdk[2]["result"]["content"][0]["text"] == "sdk"
    assert lane[6]["error"]["code"] == -32602  # arguments that are no object: the SDK's validation ran in the lane too
    assert lane["s-3"]["error"] == {"code": -32050, "message": "nope", "data": {"why": "asked to"}}
    assert lane[4]["error"] == {"code": 0, "message": "boom"}
    del lane[2], sdk[2]
    assert lane == sdk


@pytest.fixture(params=["lane", "sdk"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(script(tmp_path)), request.param])


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_progress_logs_and_sampling_reach_the_client(server: StdioServerParameters) -> None:
    seen: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def sample(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="4"), model="m")

    async with Client(server, mode="legacy", logging_callback=on_log, sampling_callback=sample) as client:
        assert text(await client.call_tool("progress", {}, progress_callback=on_progress)) == "progressed"
        assert text(await client.call_tool("log", {})) == "logged"
        assert text(await client.call_tool("ask", {})) == "answer: 4"
        with pytest.raises(MCPError) as raised:
            await client.call_tool("fail", {})
        assert (raised.value.code, raised.value.message) == (-32050, "nope")
        expected = "lane" if server.args[-1] == "lane" else "sdk"
        assert text(await client.call_tool("where", {})) == expected
    assert [p[0] for p in seen] == [1, 2] and seen[0][2] == "half"
    assert logs == ["careful"]


async def test_a_cancelled_call_stops_and_the_session_goes_on(server: StdioServerParameters) -> None:
    async with Client(server, mode="legacy") as client:
        with anyio.move_on_after(0.5):
            await client.call_tool("hang", {})
        # The cancel reached the tool; the session still answers.
        assert text(await client.call_tool("progress", {})) == "progressed"
    # (the tool's "cancelled" line goes to the child's stderr, which the SDK client passes through)


def test_the_end_of_input_answers_a_running_call(tmp_path: Path) -> None:
    wire = "".join(json.dumps(r) + "\n" for r in [*INIT, call(2, {"name": "hang", "arguments": {}})])
    for mode in ("lane", "sdk"):
        done = subprocess.run(
            [sys.executable, str(script(tmp_path)), mode], input=wire, capture_output=True, text=True, timeout=60, check=False
        )
        answers = {m["id"]: m for m in map(json.loads, done.stdout.splitlines()) if "id" in m}
        assert answers[2]["error"]["code"] == types.CONNECTION_CLOSED, (mode, done.stdout)
        assert "hang was cancelled" in done.stderr


def test_a_cancel_line_stops_a_lane_call_unanswered(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(script(tmp_path)), "lane"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    for message in [*INIT, call(2, {"name": "hang", "arguments": {}})]:
        proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 1
    # "2" is not 2 (JSON-RPC ids of different types are different ids): that cancel names no call in flight.
    for request_id in ("2", 2):
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id, "reason": "t"}}
        proc.stdin.write(json.dumps(cancel) + "\n")
        proc.stdin.write(json.dumps(call(f"after {request_id!r}", {"name": "where", "arguments": {}})) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == f"after {request_id!r}"  # the cancel before it was read
        if request_id == "2":
            assert not select.select([proc.stderr], [], [], 0.5)[0], "a cancel naming '2' cancelled the call 2"
    assert proc.stderr.readline().strip() == "hang was cancelled"
    proc.stdin.write(json.dumps(call(3, {"name": "where", "arguments": {}})) + "\n")
    proc.stdin.close()
    rest = [json.loads(line) for line in proc.stdout.read().splitlines()]
    assert proc.wait(timeout=60) == 0
    assert [m["id"] for m in rest if "id" in m] == [3]  # the cancelled call is never answered


HTTP_SERVER = textwrap.dedent(
    """
    import sys, anyio, socket, uvicorn, mcp.types as types
    from mcp import MCPError
    from mcp.server.lowlevel import Server
    from breakwater._clock import SystemClock
    from breakwater.gateway._fast_call import install
    from breakwater.gateway._fast_http import answer_fast
    from breakwater.gateway._lazy_sse import answer_lazily

    async def list_tools(ctx, params):
        names = ["where", "hang", "fail", "progress"]
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in names])

    def text(value):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])

    async def call_tool(ctx, params):
        if params.name == "where":
            # The fast paths build their own dispatch context: the transport's hook for an unanswered request is not
            # there in JSON mode, and the lazy path's context watches what the call sends.
            dctx = ctx.session._request_outbound
            fast = dctx.message_metadata.on_request_unanswered is None or type(dctx).__name__ == "_WatchedContext"
            return text("fast" if fast else "sdk")
        if params.name == "progress":
            await ctx.session.report_progress(1, 2, "half")
            return text("progressed")
        if params.name == "hang":
            await ctx.session.report_progress(1, None, "dropped in JSON mode")
            try:
                await anyio.sleep_forever()
            finally:
                print("hang was cancelled", file=sys.stderr, flush=True)
        raise MCPError(code=-32050, message="nope")

    server = Server("fast", on_list_tools=list_tools, on_call_tool=call_tool)
    mode = sys.argv[1]
    app = server.streamable_http_app(json_response=mode.startswith("json"))
    if mode == "json-fast":
        answer_fast(server.session_manager, server)
    elif mode.startswith("sse"):
        answer_lazily(server.session_manager, SystemClock(), keepalive_s=15.0)
        if mode == "sse-fast":
            install(server)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # before the port is announced: a client may connect at once
    open(sys.argv[2], "w").write(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    """
)


@pytest.fixture(params=["json-fast", "json-sdk", "sse-fast", "sse-sdk"])
async def http_url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    path = tmp_path / "http_server.py"
    path.write_text(FORKED_SCRIPT + HTTP_SERVER)
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, str(path), request.param, str(port_file)], stderr=subprocess.PIPE, text=True)
    try:
        with anyio.fail_after(30):
            while not (port_file.exists() and port_file.read_text()):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                await anyio.sleep(0.05)
        yield request.param, f"http://127.0.0.1:{port_file.read_text()}/mcp", proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_a_post_takes_the_fast_path_with_the_sdks_answers(http_url: Any) -> None:
    """JSON mode (`answer_fast`) and the default mode's lazy path (`start_call`), each against the SDK's own path."""
    mode, url, proc = http_url
    updates: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(progress)

    async with Client(url, mode="legacy") as client:
        assert text(await client.call_tool("where", {})) == mode.split("-")[1]
        with pytest.raises(MCPError) as raised:
            await client.call_tool("fail", {})
        assert (raised.value.code, raised.value.message) == (-32050, "nope")
        assert text(await client.call_tool("progress", {}, progress_callback=on_progress)) == "progressed"
        with anyio.move_on_after(1):
            await client.call_tool("hang", {}, progress_callback=on_progress)
        # The client's cancel reached the call; the session still answers.
        assert text(await client.call_tool("where", {})) == mode.split("-")[1]
        # The cancelled call's POST still gets its REQUEST_CANCELLED, on its own connection. A cancel and the next
        # call are separate POSTs, so the server may take them in either order, and an SDK client that closes
        # while that answer is on its way raises (BrokenResourceError) as it hands it to its closed reader: so
        # leave only once the server has ended the call, and one round trip later.
        assert proc.stderr is not None
        with anyio.fail_after(30):  # the fixture's terminate ends an abandoned read
            seen = await anyio.to_thread.run_sync(_stderr_until, proc.stderr, "hang was cancelled", abandon_on_cancel=True)
        assert text(await client.call_tool("where", {})) == mode.split("-")[1]
    # JSON mode has no wire for progress, on either path; an SSE answer carries it, on either path.
    assert updates == ([] if mode.startswith("json") else [1, 1])
    proc.terminate()
    assert "hang was cancelled" in seen + proc.stderr.read()


def _stderr_until(stream: Any, marker: str) -> str:
    """What `stream` printed up to and including the line holding `marker`, or up to its end (a blocking read)."""
    seen = ""
    while marker not in seen and (line := stream.readline()):
        seen += line
    return seen


# ---- 2026-07-28 over HTTP: the lean entry (`breakwater.gateway._modern_http`) against the SDK's ----

MODERN_SERVER = textwrap.dedent(
    """
    import sys, anyio, socket, uvicorn, mcp.types as types
    import mcp.server._streamable_http_modern as modern
    from mcp import MCPError
    from mcp.server.lowlevel import Server
    from breakwater._clock import SystemClock
    from breakwater.gateway._modern_http import serve_modern_calls

    REGION = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}

    async def list_tools(ctx, params):
        tools = [types.Tool(name=n, input_schema={"type": "object"}) for n in ["where", "hang", "fail", "progress", "slow"]]
        return types.ListToolsResult(tools=[*tools, types.Tool(name="region", input_schema=REGION)])

    def text(value):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])

    async def call_tool(ctx, params):
        if params.name == "where":
            return text("lean" if type(ctx.session._request_outbound).__name__ == "_LeanContext" else "sdk")
        if params.name == "progress":
            await ctx.session.report_progress(1, 2, "half")
            await ctx.session.report_progress(2, 2, "done")
            return text("progressed")
        if params.name == "slow":  # silent for longer than the keep-alive interval
            await anyio.sleep(float(params.arguments["s"]))
            return text("slept")
        if params.name == "hang":
            try:
                await anyio.sleep_forever()
            finally:
                print("hang was cancelled", file=sys.stderr, flush=True)
        if params.name == "region":
            return text("region " + params.arguments.get("region", "-"))
        raise MCPError(code=-32050, message="nope", data={"why": "asked to"})

    server = Server("modern", on_list_tools=list_tools, on_call_tool=call_tool)
    app = server.streamable_http_app(json_response=sys.argv[4] == "json")
    if sys.argv[1] == "lean":
        serve_modern_calls(server.session_manager, SystemClock())
    modern._SSE_PING_INTERVAL = float(sys.argv[3])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    open(sys.argv[2], "w").write(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    """
)

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
SSE_ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def modern_post(
    tool: Any, arguments: Any = None, *, request_id: Any = 1, meta: Any = META, **extra_headers: str
) -> tuple[list[tuple[str, str]], bytes]:
    """A raw 2026-07-28 tools/call POST: its headers and body."""
    params: dict[str, Any] = {"name": tool, "arguments": arguments if arguments is not None else {}}
    if meta is not None:
        params["_meta"] = meta
    headers = {**SSE_ACCEPT, "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": str(tool)}
    headers.update({k.replace("_", "-"): v for k, v in extra_headers.items()})
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return list(headers.items()), json.dumps(body).encode()


def _raw_posts() -> list[tuple[list[tuple[str, str]], bytes]]:
    good_headers, good_body = modern_post("where")
    posts = [
        modern_post("where"),
        modern_post("fail", request_id="s-2"),
        modern_post("nothing"),
        modern_post("progress", meta={**META, "progressToken": "p1"}),
        modern_post("region", {"region": "eu"}, region="eu"),  # an Mcp-Param header (the SDK finds no "mcp-param-" prefix)
        modern_post("region", {"region": "eu"}, **{"mcp-param-region": "eu"}),
        modern_post("region", {"region": "eu"}, **{"mcp-param-region": "us"}),  # disagrees with the body
        modern_post("region", {"region": "eu"}),  # the header is missing
        modern_post("where", mcp_name="else"),  # Mcp-Name disagrees with the body
        modern_post("where", meta=None),  # no envelope
        modern_post("where", meta={**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}),  # disagrees
        modern_post(
            "where", meta={**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}, mcp_protocol_version="2099-01-01"
        ),  # a version nobody serves
        modern_post("where", accept="application/json"),  # SSE mode wants both
        modern_post("where", host="evil.example:80"),  # the SDK's DNS-rebinding check
        modern_post("where", arguments=[]),  # arguments that are no object
        modern_post(3),  # a name that is no string
        (good_headers, b"{not json"),
        (good_headers, b"[" + good_body + b"]"),  # a batch
        (good_headers, json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": {}}).encode()),  # no id
        (good_headers, json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": META}}).encode()),
        ([*good_headers, ("mcp-method", "tools/call")], good_body),  # the routing header twice
    ]
    return posts


async def _start_modern(tmp_path: Path, mode: str, ping_s: float, answers: str = "sse") -> tuple[str, subprocess.Popen[str]]:
    path = tmp_path / f"modern_{mode}.py"
    path.write_text(FORKED_SCRIPT + MODERN_SERVER)
    port_file = tmp_path / f"port_{mode}"
    argv = [sys.executable, str(path), mode, str(port_file), str(ping_s), answers]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    with anyio.fail_after(30):
        while not (port_file.exists() and port_file.read_text()):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            await anyio.sleep(0.05)
    return f"http://127.0.0.1:{port_file.read_text()}/mcp", proc


async def _answers(url: str) -> list[tuple[int, str, bytes]]:
    import httpx2

    answers = []
    async with httpx2.AsyncClient(timeout=30) as http:
        for headers, body in _raw_posts():
            reply = await http.post(url, headers=headers, content=body)
            answers.append((reply.status_code, reply.headers.get("content-type", ""), reply.content))
    return answers


@pytest.mark.parametrize("answers_as", ["sse", "json"])
async def test_the_lean_modern_entry_answers_every_post_as_the_sdks_does(tmp_path: Path, answers_as: str) -> None:
    """Status, content type and body, byte for byte, for good calls, streamed progress and every refusal; with
    `--json-response` too, where the progress is dropped and the answer is one JSON body."""
    answers: dict[str, list[tuple[int, str, bytes]]] = {}
    for mode in ("lean", "sdk"):
        url, proc = await _start_modern(tmp_path, mode, 15.0, answers_as)
        try:
            answers[mode] = await _answers(url)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    lean, sdk = answers["lean"], answers["sdk"]
    assert b'"text":"lean"' in lean[0][2] and b'"text":"sdk"' in sdk[0][2]  # each entry served its own
    assert lean[0][:2] == sdk[0][:2] == (200, "application/json")
    # Where a request reaches the tool ("where") the entry names itself; everything else is byte for byte.
    assert [(status, kind, body.replace(b'"text":"lean"', b'"text":"sdk"')) for status, kind, body in lean[1:]] == sdk[1:]
    statuses = [status for status, _, _ in lean]
    assert statuses.count(400) >= 8 and 202 in statuses  # the refusals were exercised
    progress = lean[3]
    if answers_as == "sse":
        assert 406 in statuses  # SSE mode wants both in Accept
        assert progress[1] == "text/event-stream" and progress[2].count(b"notifications/progress") == 2
    else:
        assert progress[1] == "application/json" and b"notifications/progress" not in progress[2]


async def test_the_lean_modern_entry_cancels_on_disconnect_and_keeps_a_silent_stream_alive(tmp_path: Path) -> None:
    """A client that goes away cancels the call; a call silent past the interval commits to SSE and gets pings."""
    import httpx2

    streams: dict[str, bytes] = {}
    for mode in ("lean", "sdk"):
        url, proc = await _start_modern(tmp_path, mode, 0.2)
        try:
            async with Client(url, mode=MODERN) as client:
                assert text(await client.call_tool("where", {})) == mode
                with anyio.move_on_after(1):
                    await client.call_tool("hang", {})
                assert text(await client.call_tool("where", {})) == mode  # the entry goes on
            async with httpx2.AsyncClient(timeout=30) as http:
                headers, body = modern_post("slow", {"s": 0.7})
                reply = await http.post(url, headers=headers, content=body)
                assert reply.headers["content-type"] == "text/event-stream"
                streams[mode] = reply.content
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            assert proc.stderr is not None
            assert "hang was cancelled" in proc.stderr.read(), mode
    for mode, stream in streams.items():
        head, _, last = stream.rpartition(b"event: message")
        assert head.count(b": ping") >= 2 and head.replace(b": ping\r\n\r\n", b"") == b"", (mode, stream)
        assert b'"text":"slept"' in last
    assert streams["lean"].rpartition(b"event: message")[2] == streams["sdk"].rpartition(b"event: message")[2]


async def test_with_json_answers_a_client_that_goes_away_cancels_its_call_too(tmp_path: Path) -> None:
    """`--json-response`: the SDK's entry runs the handler without watching the client, so a 2026-07-28 client that
    went away (its cancel) left the call running upstream to its end or its timeout, which the tool's breaker then
    counted. The lean entry cancels it, and a silent call is still one JSON body, without pings."""
    import httpx2

    url, proc = await _start_modern(tmp_path, "lean", 0.2, "json")
    try:
        async with Client(url, mode=MODERN) as client:
            with anyio.move_on_after(1):
                await client.call_tool("hang", {})
            assert proc.stderr is not None
            with anyio.fail_after(10):  # before the server is told to stop, which would cancel it anyway
                seen = await anyio.to_thread.run_sync(_stderr_until, proc.stderr, "hang was cancelled", abandon_on_cancel=True)
            assert "hang was cancelled" in seen
            assert text(await client.call_tool("where", {})) == "lean"  # the entry goes on
        async with httpx2.AsyncClient(timeout=30) as http:
            headers, body = modern_post("slow", {"s": 0.5})
            reply = await http.post(url, headers=headers, content=body)
            assert reply.headers["content-type"] == "application/json" and b": ping" not in reply.content
            assert b'"text":"slept"' in reply.content
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_the_gateway_gives_the_modern_entry_the_listed_input_schemas(tmp_path: Path) -> None:
    """`Gateway.header_schema` (the SDK's `get_tool_input_schema`, instead of a `tools/list` per call) is the listed
    schema of a tool that declares `x-mcp-header` arguments, and None for one that declares none (nothing to check)
    or is not listed."""
    import random

    from mcp.server.mcpserver import MCPServer

    from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec
    from breakwater.catalog._catalog import Catalog
    from breakwater.config import GatewayPolicy
    from breakwater.gateway._http import http_app
    from breakwater.gateway._server import Gateway
    from breakwater.testing import FakeClock, in_memory

    upstream = MCPServer("shop")

    @upstream.tool()
    async def add(a: int, b: int) -> int:
        return a + b

    @upstream.tool()
    async def stock(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        return region

    clock, policy = FakeClock(), GatewayPolicy()
    connect = ConnectPolicy(startup_jitter_s=0, attempt_timeout_s=5, backoff_base_s=1, backoff_cap_s=4, budget_s=20)
    spec = ServerSpec(name="shop", transport="stdio", command="not-used-in-memory", connect=connect)

    async def run() -> None:
        config = Config(servers=(spec,))
        bw_kwargs: dict[str, Any] = {"journal": None, "telemetry": None, "transports": in_memory(upstream)}
        async with Breakwater(config, clock=clock, rng=random.Random(3), admission_dir=tmp_path / "a", **bw_kwargs) as bw:
            gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "c"))
            await bw.wait_ready(timeout=30)
            async with Client(gateway.server, mode="legacy") as client:
                listed = {t.name: t.input_schema for t in (await client.list_tools()).tools}
            assert {"shop__add", "shop__stock"} < set(listed)  # and the built-ins
            assert "x-mcp-header" in json.dumps(listed["shop__stock"])
            for name, schema in listed.items():
                assert gateway.header_schema(name) == (schema if name == "shop__stock" else None), name
            assert gateway.header_schema("shop__nothing") is None
            assert gateway.server.get_tool_input_schema == gateway.header_schema
            # `serve --http` in the default mode serves 2026-07-28 calls with the lean entry (the tests above).
            http_app(gateway, host="127.0.0.1", token=None)
            manager = gateway.server.session_manager
            assert getattr(manager.asgi_app.app, "__module__", None) == "breakwater.gateway._modern_http"

    await clock.run(run)


# ---- the kernel's own shaping of the common answer (`serialize_call`) -----------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)
_BLOCKS = st.lists(
    st.builds(types.TextContent, type=st.just("text"), text=st.text(max_size=8))
    | st.builds(
        types.TextContent,
        type=st.just("text"),
        text=st.text(max_size=3),
        annotations=st.just(types.Annotations(priority=0.5)),
    )
    | st.builds(types.ImageContent, type=st.just("image"), data=st.just("aGk="), mime_type=st.just("image/png")),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    content=_BLOCKS,
    structured=st.none() | st.dictionaries(st.text(max_size=4), _JSON, max_size=5),
    meta=st.none() | st.dictionaries(st.text(max_size=4), _JSON, max_size=3),
    is_error=st.booleans(),
    version=st.sampled_from(["2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]),
)
def test_the_kernel_shapes_an_answer_exactly_as_the_sdk_does(
    content: list[Any], structured: dict[str, Any] | None, meta: dict[str, Any] | None, is_error: bool, version: str
) -> None:
    runner = ServerRunner(Server("t"), connection=None, lifespan_state=None)  # type: ignore[arg-type]  # shaping reads the server only
    result = types.CallToolResult(content=content, structured_content=structured, is_error=is_error, _meta=meta)
    # Byte for byte, key order included: what the wire carries.
    assert json.dumps(serialize_call(runner, version, result)) == json.dumps(runner._serialize("tools/call", version, result))


def test_the_kernel_shapes_the_common_answer_itself() -> None:
    runner = ServerRunner(Server("t"), connection=None, lifespan_state=None)  # type: ignore[arg-type]
    structured = {"ok": True, "n": [1, 2.5, None]}
    result = types.CallToolResult(content=[types.TextContent(type="text", text="x")], structured_content=structured)
    # The upstream's structured content goes out as it came (not dumped and re-validated), on the legacy wire only.
    assert serialize_call(runner, "2025-11-25", result)["structuredContent"] is structured
    assert serialize_call(runner, "2026-07-28", result)["structuredContent"] is not structured


# ---- the kernel's checks of a call's params (`_plain_surface`) ----------------------------------

_HANDSHAKE_ERA = sorted(
    v for (method, v) in sdk_methods.CLIENT_REQUESTS if method == "tools/call" and v not in MODERN_PROTOCOL_VERSIONS
)


@settings(max_examples=300, deadline=None)
@given(
    name=st.text(max_size=6) | st.just("") | st.just("\ud800"),
    arguments=st.none() | st.dictionaries(st.text(max_size=4), _JSON, max_size=4),
    version=st.sampled_from(_HANDSHAKE_ERA),
)
def test_the_surface_check_the_kernel_skips_is_one_that_passes(name: str, arguments: dict[str, Any] | None, version: str) -> None:
    params: dict[str, Any] = {"name": name} if arguments is None else {"name": name, "arguments": arguments}
    assert _plain_surface(version, params)
    sdk_methods.validate_client_request("tools/call", version, params)  # raises if the skip were wrong


def test_the_kernel_checks_every_other_surface_itself() -> None:
    assert _HANDSHAKE_ERA and "2025-11-25" in _HANDSHAKE_ERA
    for params in (None, {"name": 5}, {"name": "x", "arguments": []}, {"name": "x", "_meta": {}}, {"name": "x", "task": {}}):
        assert not _plain_surface("2025-11-25", params)
    assert not _plain_surface("2026-07-28", {"name": "x"})


async def test_a_session_deleted_during_a_call_cancels_it_on_every_path(http_url: Any) -> None:
    """The fast paths run a call in its POST's task; the session's end still cancels it, as the SDK's dispatcher does."""
    import httpx2

    mode, url, proc = http_url
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(url, json=init, headers=headers)
        session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        where = await http.post(
            url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "where"}}, headers=session
        )
        assert ("fast" if mode.endswith("fast") else "sdk") in where.text
        replies: list[httpx2.Response] = []
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def hang() -> None:
                    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "hang", "arguments": {}}}
                    replies.append(await http.post(url, json=body, headers=session))

                tg.start_soon(hang)
                await anyio.sleep(0.5)
                assert (await http.delete(url, headers=session)).status_code == 200
    # No progress token, so nothing was streamed in either mode: the transport's answer to a terminated session.
    assert replies[0].status_code == 500
    assert replies[0].json()["error"] == {"code": -32603, "message": "Session terminated before the request completed"}
    assert replies[0].json()["id"] == (None if mode == "json-sdk" else 3)  # the SDK's own JSON path says null
    proc.terminate()
    assert proc.stderr is not None
    assert "hang was cancelled" in proc.stderr.read()
