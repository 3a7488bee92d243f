"""A broken upstream costs only itself: invalid tool definitions, oversized results and junk on stdout.

The server is `broken_upstream.py`, a real stdio process that breaks the rules by hand: it lists two
valid tools beside two whose definitions break the MCP schema, writes lines that are not JSON-RPC
before every answer, and answers `big` with as many bytes as asked.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec
from breakwater.cli._status import status_view
from breakwater.config import CallPolicy, JournalPolicy
from breakwater.connect._lines import LineSplitter, Oversized, StdoutParser
from breakwater.status import ServerState, StatusReport
from breakwater.testing.server import serve_http
from helpers import alive

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("broken_upstream.py")
LIMIT = 100_000
JUNK_PER_ANSWER = 3


async def test_a_broken_upstream_costs_only_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its valid tools are served and the invalid ones named with the reason; an answer over max_result_bytes is
    RESULT_TOO_LARGE after one attempt (the tool is read-only: it would be retried if that could help), the next
    calls work; dozens of junk lines cost a few log lines and no traceback."""
    spec = ServerSpec(
        name="broken",
        transport="stdio",
        command=sys.executable,
        args=(str(SCRIPT), "--junk", str(JUNK_PER_ANSWER), "--bad-tools"),
        connect=ConnectPolicy(startup_jitter_s=0, health_interval_s=0),
        call=CallPolicy(max_result_bytes=LIMIT),
    )
    caplog.set_level(logging.INFO)
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        report = await bw.wait_ready(timeout=30)
        (status,) = report.servers
        assert status.tools == 2
        assert {t.name: t.reason.split(":")[0] for t in status.rejected_tools} == {
            "broken_schema": "inputSchema",
            "no_schema": "inputSchema",
            "echo": "listed twice",
            "": "an empty name, which no call can name",
            "any_type": "inputSchema.properties.x.type",
        }
        assert StatusReport.from_json(report.to_json()).servers[0].rejected_tools == status.rejected_tools
        console = Console(width=200, record=True)
        console.print(status_view(report))
        assert "tool 'broken_schema' left out: inputSchema" in console.export_text()

        too_big = await bw.call_tool("broken", "big", {"bytes": 2 * LIMIT})
        envelope = too_big.structured_content or {}
        assert too_big.is_error and envelope["code"] == "RESULT_TOO_LARGE" and envelope["retryable"] is False
        assert envelope["attempt"] == 1 and f"max_result_bytes = {LIMIT}" in envelope["reason"]
        fits = await bw.call_tool("broken", "big", {"bytes": LIMIT // 2})
        assert not fits.is_error and len(fits.content[0].text) == LIMIT // 2  # type: ignore[union-attr]
        for _ in range(10):
            assert not (await bw.call_tool("broken", "echo", {"n": 1})).is_error

    junk = [r for r in caplog.records if r.name == "breakwater.stdio" and "not JSON" in r.getMessage()]
    # 3 junk lines before each of 15 answers or more: one line for the first, one at the 10th; then silence.
    assert [r.getMessage().split(" wrote ")[0].split(" has ")[0] for r in junk] == ["broken", "broken"]
    assert "has written 10 lines" in junk[1].getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("mcp.client.stdio")]


def _rude(tmp_path: Path, timeout_s: float) -> Config:
    spec = ServerSpec(
        name="rude",
        transport="stdio",
        command=sys.executable,
        args=(str(SCRIPT), "--rude"),
        connect=ConnectPolicy(startup_jitter_s=0, health_interval_s=0),
        call=CallPolicy(timeout_s=timeout_s),
    )
    return Config(servers=(spec,), journal=JournalPolicy(url="off"))


async def test_notifications_that_do_not_validate_cost_a_few_log_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """600 progress notifications without a progressToken wrote 600 tracebacks (the SDK's client logs each one)."""
    caplog.set_level(logging.INFO)
    async with Breakwater(_rude(tmp_path, 30), admission_dir=tmp_path / "admission") as bw:
        await bw.wait_ready(timeout=30)
        for _ in range(2):
            assert not (await bw.call_tool("rude", "noisy", {"notes": 300})).is_error
    progress = [r.getMessage() for r in caplog.records if "notifications/progress" in r.getMessage()]
    # The 1st, the 10th and the 100th of 600: each names the server and what was wrong.
    assert len(progress) == 3 and all("from rude" in m and "params.progressToken: Field required" in m for m in progress)
    levels = [r.getMessage() for r in caplog.records if "notifications/message" in r.getMessage()]
    assert len(levels) == 1 and "params.level" in levels[0]
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ("null", "a result that is null"),
        ("string", "an error that is a string"),
        ("none", "neither a result nor an error"),
        # A response, whose result is no CallToolResult: the reason said only "does not match the MCP protocol shape".
        ("notlist", "shape: content: Input should be a valid list"),
    ],
)
async def test_an_answer_that_is_no_json_rpc_response_fails_its_call_at_once(tmp_path: Path, shape: str, says: str) -> None:
    """It was dropped as junk: the call waited its whole timeout, and the model heard the outcome was unknown."""
    async with Breakwater(_rude(tmp_path, 20), admission_dir=tmp_path / "admission") as bw:
        await bw.wait_ready(timeout=30)
        result = await bw.call_tool("rude", "malformed", {"shape": shape})
        envelope = result.structured_content or {}
        assert result.is_error and envelope["code"] == "UPSTREAM_ERROR" and says in envelope["reason"], envelope
        assert envelope["elapsed_s"] < 10
        assert not (await bw.call_tool("rude", "noisy", {"notes": 0})).is_error  # the connection serves on


async def test_a_server_that_dies_mid_call_is_said_to_have_closed_its_stdout(tmp_path: Path) -> None:
    """The call was told the SDK's bare "Connection closed": neither who closed it nor that the process was going."""
    async with Breakwater(_rude(tmp_path, 20), admission_dir=tmp_path / "admission") as bw:
        await bw.wait_ready(timeout=30)
        result = await bw.call_tool("rude", "die", {})
        # Ready again, status still says why it went: the exit was forgotten at the reconnect ("error": null).
        with anyio.fail_after(30):
            while not ((snap := bw.upstream("rude").snapshot()).state is ServerState.READY and snap.last_drop is not None):
                await anyio.sleep(0.05)
    envelope = result.structured_content or {}
    assert result.is_error and "the server closed its stdout during the call" in envelope["reason"], envelope
    assert snap.last_drop is not None and snap.last_drop.exit_code == 3 and "about to die" in snap.last_drop.stderr_tail
    again = StatusReport.from_json(StatusReport(servers=(snap,)).to_json()).servers[0]
    assert again.last_drop == snap.last_drop
    assert again.last_drop_at is not None and snap.last_drop_at is not None
    assert abs(again.last_drop_at - snap.last_drop_at) < 0.001  # as written in JSON: milliseconds


async def test_nan_and_infinity_from_an_upstream_become_null_and_a_tool_defined_with_them_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON has no NaN or Infinity, but the SDK's parser takes them: a tool whose schema holds Infinity is left out
    with where; an answer holding them is passed on with null in their place (finite values kept, one warning
    naming the server), the same to a library caller as on the gateway's wire; a progress holding them is not
    passed on as a number; the server keeps serving."""
    spec = ServerSpec(
        name="sensor",
        transport="stdio",
        command=sys.executable,
        args=(str(SCRIPT), "--non-finite"),
        connect=ConnectPolicy(startup_jitter_s=0, health_interval_s=0),
    )
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        (status,) = (await bw.wait_ready(timeout=30)).servers
        assert status.state.value == "ready" and status.tools == 3
        assert [(t.name, t.reason.split(":")[0]) for t in status.rejected_tools] == [
            ("bounded", "inputSchema.properties.x.maximum")
        ]
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        for _ in range(3):
            result = await bw.call_tool("sensor", "measure", {}, progress_callback=on_progress)
            assert not result.is_error
            assert result.structured_content == {"celsius": None, "range": [None, 40.5, None], "sensor": {"id": 7, "drift": None}}
            assert result.meta == {"q": None}
            assert '"celsius":null' in result.model_dump_json(by_alias=True)
        assert not (await bw.call_tool("sensor", "echo", {"n": 1})).is_error
    # A progress that is NaN or infinite is no progress: not passed on; an infinite total is an unknown one.
    assert seen == [(1.0, None, None), (1.0, 2.0, None)] * 3
    warnings = [r.getMessage() for r in caplog.records if "NaN or Infinity" in r.getMessage()]
    assert len(warnings) == 1 and "sensor answered measure" in warnings[0] and "structuredContent.celsius" in warnings[0]


def test_lines_are_split_in_linear_time_and_an_oversized_one_keeps_only_its_ends() -> None:
    """Chunks of any size give the same lines; a line over the limit is an `Oversized` whose id finds its request,
    wherever in the envelope the server put it (first, as the Python SDK does, or last, as the TypeScript one)."""
    splitter = LineSplitter(limit=2048)
    data = b'{"a":1}\n' + b"x" * 100 + b"\n"
    assert [line for i in range(0, len(data), 3) for line in splitter.feed(data[i : i + 3])] == [b'{"a":1}', b"x" * 100]
    for big in (
        b'{"jsonrpc":"2.0","id":7,"result":{"t":"' + b"y" * 50_000 + b'"}}',
        b'{"result":{"t":"' + b"y" * 50_000 + b'"},"jsonrpc":"2.0","id":7}',
    ):
        (line,) = [x for i in range(0, len(big) + 1, 4096) for x in splitter.feed((big + b"\n")[i : i + 4096])]
        assert isinstance(line, Oversized) and line.size == len(big) and len(line.head) + len(line.tail) <= 2048
        parser = StdoutParser("s", 2048)
        parser.pending.update({6: "tools/call", 7: "tools/call"})
        message = parser.parse(line)
        assert message is not None
        error = message.message
        assert getattr(error, "id", None) == 7 and parser.pending == {6: "tools/call"}


def test_the_sdk_clients_junk_tracebacks_are_limited_too(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's HTTP client logs a traceback per SSE event that is not JSON-RPC: with breakwater's limit, 25 of
    them are two one-line warnings (the 1st and the 10th), each saying what was wrong."""
    from breakwater.connect._lines import quiet_sdk_junk_logs

    sdk = logging.getLogger("mcp.client.streamable_http")
    for old in list(sdk.filters):  # a fresh count: earlier tests' upstreams may have counted some
        sdk.removeFilter(old)
    quiet_sdk_junk_logs()
    quiet_sdk_junk_logs()  # idempotent: still one limit
    assert len(sdk.filters) == 1
    caplog.set_level(logging.DEBUG, logger="mcp.client.streamable_http")
    for i in range(25):
        try:
            raise ValueError(f"Invalid JSON: expected value at line 1 column {i}")
        except ValueError:
            sdk.exception("Error parsing SSE message")
    sdk.error("something else")  # other records pass untouched
    records = [r for r in caplog.records if r.name == "mcp.client.streamable_http"]
    assert [r.getMessage().split(" from an upstream")[0] for r in records] == ["Error parsing SSE message"] * 2 + [
        "something else"
    ]
    assert "Invalid JSON" in records[0].getMessage() and "10 so far" in records[1].getMessage()
    assert all(r.exc_info is None and r.levelname != "ERROR" for r in records[:2])


@pytest.mark.parametrize(
    ("protocol", "flags"),
    [("2026-07-28", ()), ("2025-11-25", ("--json-response",)), ("2025-11-25", ())],
    ids=["2026-json", "2025-json", "2025-sse"],
)
async def test_an_http_answer_over_the_limit_is_result_too_large_once_in_any_body(
    tmp_path: Path, protocol: str, flags: tuple[str, ...]
) -> None:
    """A one-body JSON answer is bounded as an SSE event is: RESULT_TOO_LARGE after one attempt, and the connection
    goes on serving (the testserver echoes its arguments, so a big argument makes a big answer)."""
    async with serve_http(*flags) as server:
        spec = ServerSpec(
            name="big",
            transport="http",
            url=server.url,
            connect=ConnectPolicy(startup_jitter_s=0, health_interval_s=0, protocol=protocol),
            call=CallPolicy(max_result_bytes=LIMIT),
        )
        config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
        async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
            await bw.wait_ready(timeout=30)
            too_big = await bw.call_tool("big", "echo", {"pad": "x" * (2 * LIMIT)})
            envelope = too_big.structured_content or {}
            assert too_big.is_error and envelope["code"] == "RESULT_TOO_LARGE" and envelope["retryable"] is False
            assert envelope["attempt"] == 1 and str(LIMIT) in envelope["reason"]
            fits = await bw.call_tool("big", "echo", {"pad": "x" * (LIMIT // 4)})
            assert not fits.is_error
            assert (fits.structured_content or {})["arguments"]["pad"] == "x" * (LIMIT // 4)


async def test_a_line_written_to_a_server_that_died_is_one_broken_stream_and_nothing_in_the_log() -> None:
    """A server that dies while the gateway writes to it: the writer says its stream broke, and asyncio's
    record of the broken pipe is read, so no "exception was never retrieved" reaches the loop's error handler
    (the tests' runner fails on one, as it did in CI when a `subscriptions/listen` line met a dead server).
    A later 3.11 (3.11.7 here) no longer logs it; Debian's 3.11.2, which CI runs, does."""
    import asyncio
    import gc
    import time

    import anyio

    from breakwater._wire import STDIN_CLOSED
    from breakwater.connect._stdio import StdinWriter

    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    ended: list[str] = []
    try:
        process = await anyio.open_process([sys.executable, "-c", "pass"])
        writer = StdinWriter(process, StdoutParser("dead", LIMIT), ended.append)
        # Dead before the loop has looked at its pipe: the next write meets the broken pipe itself.
        while alive(process.pid):
            time.sleep(0.01)  # blocking on purpose: the loop must not see the hang-up first
        line = b'{"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen"}\n'
        await writer.write_line(line)  # asyncio takes it, meets the broken pipe, and keeps the error for later
        await asyncio.sleep(0.05)
        with pytest.raises(anyio.BrokenResourceError):
            await writer.write_line(line)
        assert ended == [STDIN_CLOSED]  # the session's reads end with the pipe, and its calls are told why
        await process.aclose()
        del writer, process
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert reported == []


_HTML_SERVER = """
import http.server, sys
class Page(http.server.BaseHTTPRequestHandler):
    def _page(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b"<html><body>a login page</body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _page
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_an_http_server_that_answers_a_page_is_named_once_not_at_every_attempt(tmp_path: Path) -> None:
    """A URL that answers an HTML page (a login page, a proxy's): the SDK wrote "Unexpected content type: text/html"
    at every connect attempt, naming no server; now once, with the server's name (then at the 10th, 100th...)."""
    page = subprocess.Popen([sys.executable, "-c", _HTML_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert page.stdout is not None
        port = int(page.stdout.readline())
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"portal": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"}}}))
        env = {**os.environ, "BREAKWATER_CONNECT_BACKOFF_BASE_S": "0.1", "BREAKWATER_CONNECT_BACKOFF_CAP_S": "0.2"}
        argv = [sys.executable, "-m", "breakwater", "status", "--wait", "3", "--json", "--config", str(config)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    finally:
        page.terminate()
        page.wait(timeout=10)
    said = [line for line in done.stderr.splitlines() if "Unexpected content type" in line]
    attempts = json.loads(done.stdout)["servers"][0]["attempts"]
    assert attempts >= 3, done.stdout  # it tried again and again
    counts = [line.partition("from portal (")[2].partition(" so far")[0] for line in said]
    assert counts and counts == ["1", "10"][: len(counts)] and len(counts) < attempts, done.stderr  # the 1st, the 10th
