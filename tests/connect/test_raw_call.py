"""`tools/call` on a stdio upstream without the SDK session's plumbing (`connect/_raw_call.py`).

Real `breakwater testserver` processes, on both protocol revisions: the raw path is the one taken,
and what a caller sees through it is what the SDK's `Client.call_tool` gives for the same call:
results, the upstream's JSON-RPC errors, progress in order before the answer, cancellation that
reaches the server, a server that dies mid-call, an answer over `max_result_bytes`, and arguments
the stdlib encoder cannot write (which go through the SDK instead).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import MCPError
from mcp_types import methods as sdk_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater._wire import CONNECTION_CLOSED, STDIN_CLOSED
from breakwater.config import CallPolicy, RetryPolicy
from breakwater.connect._raw_call import call_tool as raw_call_tool
from breakwater.connect._raw_call import plain_result
from breakwater.connect._stdio import StdioProcess
from breakwater.gate._call import ended_by_exit
from breakwater.gate._classify import RetryClass, classify
from breakwater.testing.server import launch_command, read_state
from helpers import code_of, eventually

pytestmark = pytest.mark.anyio

FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15)
PROTOCOLS = ["2025-11-25", "2026-07-28"]


def spec(protocol: str, *flags: str, **policies: Any) -> ServerSpec:
    cmd = launch_command("--name", "s", *flags)
    return ServerSpec(
        name="s",
        transport="stdio",
        command=cmd[0],
        args=tuple(cmd[1:]),
        connect=replace(FAST_CONNECT, protocol=protocol),
        retry=RetryPolicy(max_attempts=1),
        **policies,
    )


@asynccontextmanager
async def connected(tmp_path: Path, server: ServerSpec) -> AsyncIterator[Breakwater]:
    async with Breakwater(Config(servers=(server,)), admission_dir=tmp_path / "admission") as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def raw_count(bw: Breakwater) -> int:
    process = bw.upstream("s").process
    assert process is not None and process.raw_calls is not None
    return process.raw_calls._count


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_call_takes_the_raw_path_and_answers_as_the_sdk_does(tmp_path: Path, protocol: str) -> None:
    async with connected(tmp_path, spec(protocol)) as bw:
        assert bw.upstream("s").protocol == protocol
        result = await bw.call_tool("s", "add", {"a": 2, "b": 3, "payload": "é ✓ 😀"})
        assert raw_count(bw) == 1
        client = bw.upstream("s").client
        assert client is not None
        direct = await client.call_tool("add", {"a": 2, "b": 3, "payload": "é ✓ 😀"})
        assert raw_count(bw) == 1  # the SDK's own call did not go through the raw path
        assert not result.is_error
        assert result.structured_content is not None and direct.structured_content is not None
        # The same answer but for the server's call counter.
        ours = {k: v for k, v in result.structured_content.items() if k != "call"}
        theirs = {k: v for k, v in direct.structured_content.items() if k != "call"}
        assert ours == theirs
        assert ours["sum"] == 5 and ours["arguments"]["payload"] == "é ✓ 😀"
        assert result.content[0].type == "text"


async def outcome(call: Any) -> tuple[Any, ...]:
    try:
        result = await call
    except MCPError as exc:
        return ("error", exc.code, exc.message)
    return ("result", result.is_error, [c.model_dump() for c in result.content])


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_an_unknown_tool_is_answered_as_the_sdk_answers_it(tmp_path: Path, protocol: str) -> None:
    async with connected(tmp_path, spec(protocol)) as bw:
        client = bw.upstream("s").client
        process = bw.upstream("s").process
        assert client is not None and process is not None and process.raw_calls is not None
        sdk = await outcome(client.call_tool("no_such_tool", {}))
        raw = await outcome(raw_call_tool(client, process.raw_calls, "no_such_tool", {}, progress_callback=None, meta=None))
        assert raw == sdk
        assert process.raw_calls._count == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_progress_arrives_in_order_before_the_answer(tmp_path: Path, protocol: str) -> None:
    seen: list[float] = []
    finished: list[bool] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert not finished
        seen.append(progress)

    async with connected(tmp_path, spec(protocol, "--tool", "slow:latency=1.2,progress=0.2")) as bw:
        result = await bw.call_tool("s", "slow", {}, progress_callback=on_progress)
        finished.append(True)
        assert not result.is_error, result
        assert raw_count(bw) == 1
        assert len(seen) >= 3 and seen == sorted(seen)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_cancelled_call_is_cancelled_on_the_server(tmp_path: Path, protocol: str) -> None:
    state = tmp_path / "state.json"
    async with connected(tmp_path, spec(protocol, "--tool", "hang:hang=1", "--state-file", str(state))) as bw:
        with anyio.move_on_after(0.5):
            await bw.call_tool("s", "hang", {})
        assert raw_count(bw) == 1
        await eventually(lambda: read_state(state)["cancelled"]["hang"] == 1, timeout=10)
        assert read_state(state)["in_flight"]["hang"] == 0
        # The connection is still good.
        assert not (await bw.call_tool("s", "testserver_state", {})).is_error


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_server_that_dies_mid_call_is_a_closed_connection(tmp_path: Path, protocol: str) -> None:
    async with connected(tmp_path, spec(protocol, "--tool", "boom:latency=0.4,crash=1")) as bw:
        result = await bw.call_tool("s", "boom", {})
        assert raw_count(bw) == 1
        # The gate's answer to a cut connection for a tool without a retry class: the outcome is unknown.
        assert code_of(result) == "OUTCOME_UNKNOWN", result


async def test_an_answer_over_max_result_bytes_is_result_too_large(tmp_path: Path) -> None:
    server = spec("2025-11-25", "--tool", "echo", call=CallPolicy(max_result_bytes=2048))
    async with connected(tmp_path, server) as bw:
        result = await bw.call_tool("s", "echo", {"payload": "x" * 5000})
        assert raw_count(bw) == 1
        assert code_of(result) == "RESULT_TOO_LARGE", result
        # The next call on the same connection is answered normally.
        assert not (await bw.call_tool("s", "echo", {"payload": "small"})).is_error


async def test_arguments_of_no_json_shape_go_through_the_sdk_and_a_date_goes_as_the_sdk_writes_it(tmp_path: Path) -> None:
    async with connected(tmp_path, spec("2025-11-25")) as bw:
        client = bw.upstream("s").client
        process = bw.upstream("s").process
        assert client is not None and process is not None and process.raw_calls is not None
        shapeless = await raw_call_tool(
            client, process.raw_calls, "echo", {"payload": object()}, progress_callback=None, meta=None
        )
        assert shapeless is None  # nothing sent: the caller uses the SDK's path, which refuses it
        # A library caller's date is written as pydantic writes it, which is what the SDK's path sent before.
        when = datetime.date(2026, 12, 1)
        via_raw = await raw_call_tool(client, process.raw_calls, "echo", {"payload": when}, progress_callback=None, meta=None)
        assert via_raw is not None and (via_raw.structured_content or {})["arguments"] == {"payload": "2026-12-01"}
        via_sdk = await client.call_tool("echo", {"payload": when})
        assert (via_sdk.structured_content or {})["arguments"] == {"payload": "2026-12-01"}


TRACED = """
import anyio, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from breakwater import Breakwater, Config, ServerSpec
from breakwater.testing.server import launch_command

spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)

async def main():
    cmd = launch_command("--name", "s")
    spec = ServerSpec(name="s", transport="stdio", command=cmd[0], args=tuple(cmd[1:]))
    async with Breakwater(Config(servers=(spec,)), admission_dir=sys.argv[1]) as bw:
        await bw.wait_ready(timeout=30)
        result = await bw.call_tool("s", "echo", {"payload": "x"})
        print(json.dumps({"error": result.is_error, "raw": bw.upstream("s").process.raw_calls._count,
                          "spans": [s.name for s in spans.get_finished_spans()]}))

anyio.run(main)
"""


def test_with_a_tracer_provider_set_calls_go_through_the_sdk_and_its_span_is_recorded(tmp_path: Path) -> None:
    # A subprocess: a tracer provider can be set once per process, and it would turn tracing on for every later test.
    out = subprocess.run([sys.executable, "-c", TRACED, str(tmp_path / "admission")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["error"] is False
    assert seen["raw"] == 0
    assert "MCP send tools/call echo" in seen["spans"], seen


JUNK = [
    b'{"jsonrpc":"2.0","id":["bw-1"],"result":{}}',  # an unhashable id
    b'{"jsonrpc":"2.0","id":{"bw-1":1},"result":{}}',
    b'{"jsonrpc":"2.0","id":"bw-99","result":{}}',  # no such call
    b'{"jsonrpc":"2.0","id":"bw-1","result":"not an object"}',
    b'{"jsonrpc":"2.0","id":"bw-1","error":{"code":"x"}}',  # an error without a number
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":["bw-1"],"progress":1}}',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"bw-1","progress":"1"}}',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"bw-1","progress":true}}',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"bw-1","progress":1,"message":3}}',
    b'{"jsonrpc":"2.0","method":"sampling/createMessage","id":"bw-1","params":{}}',  # the server's own request id
    b'"bw-1"',
    b'not json "bw-1',
    b'{"id":"bw-1",' + b"[" * 100_000,
]


async def test_lines_that_are_not_a_raw_calls_answer_are_left_to_the_sdk_and_break_nothing() -> None:
    from breakwater.connect._lines import StdoutParser
    from breakwater.connect._raw_call import RawCalls

    written: list[bytes] = []

    async def write(line: bytes) -> None:
        written.append(line)

    raw = RawCalls(write, StdoutParser("s", 1 << 20))
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with anyio.create_task_group() as tg:
        answers: list[Any] = []

        async def call() -> None:
            answers.append(await raw.request({"name": "t"}, on_progress))

        tg.start_soon(call)
        await eventually(lambda: bool(written), timeout=5)
        assert b'"id":"bw-1"' in written[0] and b'"progressToken":"bw-1"' in written[0]
        for line in JUNK:
            assert not raw.take(line), line
        assert raw.take(b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"bw-1","progress":0.5}}')
        # Invalid UTF-8 is read as the SDK's parser reads it (U+FFFD), not lost.
        assert raw.take(b'{"jsonrpc":"2.0","id":"bw-1","result":{"content":[],"x":"\xff"}}')
    assert answers == [{"content": [], "x": "\ufffd"}] and seen == [0.5]


# ---- the revision's check of an answer, skipped where it is sure to pass (`plain_result`) ----------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=20,
)
_OBJECT = st.dictionaries(st.text(max_size=4), _JSON, max_size=3)
_REVISIONS = sorted(v for (m, v) in sdk_methods.SERVER_RESULTS if m == "tools/call")
_OPTIONAL = {"isError": st.booleans(), "structuredContent": _OBJECT, "_meta": _OBJECT}


@settings(max_examples=400, deadline=None)
@given(
    texts=st.lists(st.text(max_size=6) | st.just("\ud800"), max_size=3),
    fields=st.fixed_dictionaries({}, optional={**_OPTIONAL, "resultType": st.text(max_size=8) | st.just("complete")}),
    version=st.sampled_from(_REVISIONS),
)
def test_the_result_check_the_raw_path_skips_is_one_that_passes(texts: list[str], fields: dict[str, Any], version: str) -> None:
    raw = {"content": [{"type": "text", "text": text} for text in texts], **fields}
    if version in MODERN_PROTOCOL_VERSIONS and "resultType" not in raw:
        assert not plain_result(version, raw)  # 2026-07-28 requires it: the check runs, and refuses it
        return
    assert plain_result(version, raw)
    sdk_methods.validate_server_result("tools/call", version, raw)  # raises if the skip were wrong


def test_the_raw_path_checks_every_other_result_itself() -> None:
    assert "2025-11-25" in _REVISIONS and "2026-07-28" in _REVISIONS
    text = {"type": "text", "text": "x"}
    for raw in (
        {},  # no content: the check refuses it
        {"content": text},
        {"content": [text], "isError": "no"},
        {"content": [text], "isError": None},
        {"content": [text], "resultType": None},
        {"content": [text], "resultType": 1},
        {"content": [text], "structuredContent": [1]},
        {"content": [text], "_meta": "m"},
        {"content": [{"type": "text", "text": 1}]},
        {"content": [{"type": "text", "text": "x", "annotations": {"priority": 7}}]},
        {"content": [{"type": "image", "data": "", "mimeType": "image/png"}]},
        {"content": [text], "task": {}},
    ):
        assert not plain_result("2025-11-25", raw), raw
        modern = raw if "resultType" in raw else {**raw, "resultType": "complete"}
        assert not plain_result("2026-07-28", modern), modern
    assert not plain_result("2026-07-28", {"content": [text]})  # no resultType
    assert plain_result("2026-07-28", {"content": [text], "resultType": "complete"})
    assert not plain_result("1999-01-01", {"content": [text]})


async def test_a_call_whose_write_finds_the_servers_stdin_closed_is_told_the_server_went_away() -> None:
    """A server that reads a call and exits may close its stdin before the gateway's write of that call returns: that
    call was told a bare "Connection closed", the gate took it for a lost connection rather than an exit, and the query
    of death (tests/gate: a call that ends its server twice) was sent a third time on a loaded host."""
    ready = '{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"stdin closed"}}'
    script = f"import os, sys, time\nos.close(0)\nprint({ready!r}, flush=True)\ntime.sleep(60)\n"
    upstream = StdioProcess(sys.executable, ("-c", script))
    with anyio.fail_after(30):
        async with upstream.open() as (read_stream, _write_stream):
            await read_stream.receive()  # the server's stdin is closed now, the process still runs
            raw = upstream.raw_calls
            assert raw is not None
            with pytest.raises(MCPError) as caught:
                await raw.request({"name": "echo", "arguments": {}}, None)
            with pytest.raises(MCPError) as later:  # a call after it is told the same
                await raw.request({"name": "echo", "arguments": {}}, None)
    for error in (caught.value, later.value):
        assert error.error.code == CONNECTION_CLOSED and error.error.message == STDIN_CLOSED
    verdict = classify(caught.value, retry_class=RetryClass.IDEMPOTENT)
    assert ended_by_exit(verdict)
