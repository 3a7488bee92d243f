"""The call gate feeds the journal: what `breakwater stats` shows for calls made through a real gateway.

End to end: `breakwater serve` (stdio) in front of a `breakwater testserver` whose latencies are
drawn from a known distribution, with the journal in a temporary SQLite file; after the gateway
exits, `breakwater stats --json --journal FILE` must show the right calls, percentiles, timeouts
and refusals, and every row the downstream client's name. On the fake clock: the exact rows the
gate hands its observer (numbering, durations, breaker states, refusals, reconciliation).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.server import Server
from mcp.types import CallToolResult, Implementation, ListToolsResult, TextContent, Tool, ToolAnnotations

from breakwater.cli._stats import in_flight_lines
from breakwater.config import BreakerPolicy, CallPolicy, ConnectPolicy, JournalPolicy, RetryPolicy, ServerSpec, ToolSettings
from breakwater.gate._gate import GET_OPERATION_TOOL, CallGate
from breakwater.journal import (
    DOWNSTREAM_CLIENT,
    AttemptRecord,
    Journal,
    SQLiteJournalStore,
    percentile,
    timeout_in_force,
)
from breakwater.status import ServerState, StatusReport, ToolTimeout
from breakwater.testing import FakeClock, Progress, ScriptedCall, ScriptedServer
from breakwater.testing.server import launch_command
from helpers import AttemptRows, connected_upstream

pytestmark = pytest.mark.anyio

BREAKWATER = [sys.executable, "-m", "breakwater"]
CLIENT_NAME = "journal-e2e-agent"
WORK_CALLS = 30
LOW_S, HIGH_S = 0.05, 0.15  # the work tool's latency: uniform(LOW_S, HIGH_S)
HANG_TIMEOUT_S = 0.3


# ---------------------------------------------------------------------------- through a real gateway


def gateway_env(tmp_path: Path, journal: Path) -> dict[str, str]:
    # conftest turns journals off for every test; this one names its own.
    return dict(
        os.environ,
        BREAKWATER_JOURNAL=str(journal),
        BREAKWATER_JOURNAL_FLUSH_INTERVAL_S="0.05",
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )


def write_config(tmp_path: Path) -> Path:
    cmd = launch_command(
        "--seed", "7", "--tool", f"work:latency=uniform({LOW_S},{HIGH_S}),readonly", "--tool", "hang:hang=1,readonly"
    )
    config = tmp_path / "breakwater.toml"
    config.write_text(
        f"""
[servers.ts]
command = {json.dumps(cmd[0])}
args = {json.dumps(cmd[1:])}
[servers.ts.breaker]
consecutive_failures = 2
open_base_s = 60
[servers.ts.retry]
max_attempts = 2
retry_timeouts = true
backoff_base_s = 0.05
backoff_cap_s = 0.1
[servers.ts.tools.hang]
timeout_s = {HANG_TIMEOUT_S}
"""
    )
    return config


async def wait_ready(client: Client, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while (await client.call_tool("breakwater_status", {})).structured_content["summary"].get("ready", 0) < 1:
            await anyio.sleep(0.1)


def stats(journal: Path) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [*BREAKWATER, "stats", "--json", "--journal", str(journal), "--since", "1h"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return {t["tool"]: t for t in json.loads(out.stdout)["tools"]}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_calls_through_the_gateway_land_in_stats(tmp_path: Path, mode: str) -> None:
    """30 calls of a tool with a known latency, one call of a hanging tool (two timed-out attempts that open its
    breaker), one call refused by that breaker: `stats` counts each exactly, and every row names the client."""
    journal = tmp_path / "journal.sqlite3"
    params = StdioServerParameters(
        command=BREAKWATER[0],
        args=[*BREAKWATER[1:], "serve", "--config", str(write_config(tmp_path))],
        env=gateway_env(tmp_path, journal),
    )
    server_latencies = []
    async with Client(params, mode=mode, client_info=Implementation(name=CLIENT_NAME, version="1.0")) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        await wait_ready(client)
        for _ in range(WORK_CALLS):
            result = await client.call_tool("ts__work", {})
            assert not result.is_error, result
            server_latencies.append(result.structured_content["latency_s"])
        timed_out = (await client.call_tool("ts__hang", {})).structured_content or {}
        assert (timed_out["code"], timed_out["attempt"]) == ("TIMEOUT", 2)
        refused = (await client.call_tool("ts__hang", {})).structured_content or {}
        assert refused["code"] == "CIRCUIT_OPEN"

    # The gateway has exited and flushed its journal on the way out; allow a moment for a slow disk.
    with anyio.fail_after(15):
        while True:
            tools = stats(journal)
            if tools.get("work", {}).get("calls") == WORK_CALLS and tools.get("hang", {}).get("calls") == 2:
                break
            await anyio.sleep(0.2)

    work, hang = tools["work"], tools["hang"]
    assert work["server"] == "ts"
    assert (work["succeeded"], work["attempts"], work["refused"], work["timeouts"], work["retries"]) == (
        WORK_CALLS,
        WORK_CALLS,
        0,
        0,
        0,
    )
    # The journal times the gateway's round trip: at least the server's own latency, and close to it.
    server_p50 = percentile(sorted(server_latencies), 0.5)
    assert server_p50 is not None and LOW_S <= server_p50 <= HIGH_S
    assert server_p50 <= work["p50_s"] <= server_p50 + 0.1
    # The tail is one slow round trip on a loaded host (0.66 s seen in CI): ordered, and within a generous bound.
    assert LOW_S <= work["p50_s"] <= work["p95_s"] <= work["p99_s"] <= HIGH_S + 1.0
    # The hanging tool: one call whose two attempts timed out, one call refused by the breaker they opened.
    assert (hang["calls"], hang["succeeded"], hang["attempts"], hang["retries"]) == (2, 0, 2, 1)
    assert (hang["timeouts"], hang["timeout_rate"], hang["refused"], hang["breaker_opens"]) == (2, 1.0, 1, 1)
    assert hang["p50_s"] is None  # timeouts are not latencies

    store = SQLiteJournalStore(journal)
    try:
        rows = store.recent(100)
    finally:
        store.close()
    assert len(rows) == WORK_CALLS + 3
    assert {r.client for r in rows} == {CLIENT_NAME}
    first, second, refusal = sorted((r for r in rows if r.tool == "hang"), key=lambda r: r.started_at)
    assert (first.attempt, first.outcome, first.error_code, first.breaker_opened) == (1, "timeout", "TIMEOUT", False)
    assert (second.attempt, second.outcome, second.retries, second.breaker_opened, second.tool_breaker) == (
        2,
        "timeout",
        1,
        True,
        "open",
    )
    assert first.call_id == second.call_id != refusal.call_id
    assert HANG_TIMEOUT_S <= first.duration_s < HANG_TIMEOUT_S + 0.5
    assert (refusal.attempt, refusal.outcome, refusal.error_code, refusal.duration_s) == (1, "circuit_open", "CIRCUIT_OPEN", 0)
    assert len({r.call_id for r in rows if r.tool == "work"}) == WORK_CALLS


IN_FLIGHT_CALLS = 3


def test_kill_9_mid_call_leaves_the_calls_in_flight_as_outcome_unknown(tmp_path: Path) -> None:
    """`kill -9` of a gateway with three calls of a mutating tool in flight: `stats` then lists those three as
    outcome unknown (server, tool, operation id, when); a mutating call that finished before is not among them."""
    import signal

    journal, state = tmp_path / "journal.sqlite3", tmp_path / "upstream.json"
    cmd = launch_command(
        "--tool", "place:mutating,destructive", "--tool", "ship:mutating,destructive,hang=1", "--state-file", str(state)
    )
    config = tmp_path / "breakwater.toml"
    config.write_text(f"[servers.ts]\ncommand = {json.dumps(cmd[0])}\nargs = {json.dumps(cmd[1:])}\n[call]\ntimeout_s = 60\n")
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=gateway_env(tmp_path, journal),
    )
    assert proc.stdin is not None and proc.stdout is not None
    upstream_pid = None

    def send(message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def answer(request_id: int) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:  # notifications (a changed tool list) may come first
            message: dict[str, Any] = json.loads(proc.stdout.readline())
            if message.get("id") == request_id:
                return message

    try:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": CLIENT_NAME, "version": "1"}}
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
        answer(0)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ts__place", "arguments": {}}})
        placed = answer(1)
        assert not placed["result"].get("isError"), placed
        for i in range(IN_FLIGHT_CALLS):
            send({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": {"name": "ts__ship", "arguments": {}}})
        # The upstream has all three (so they were sent), and their marks have reached the journal.
        deadline = time.monotonic() + 30
        marks: list[Any] = []
        while time.monotonic() < deadline:
            with_marks = journal.exists()
            if state.exists():
                upstream = json.loads(state.read_text())
                upstream_pid = upstream["pid"]
                if upstream["in_flight"].get("ship", 0) == IN_FLIGHT_CALLS and with_marks:
                    store = SQLiteJournalStore(journal)
                    try:
                        marks = store.in_flight(10)
                    finally:
                        store.close()
                    if len(marks) == IN_FLIGHT_CALLS:
                        break
            time.sleep(0.05)
        assert len(marks) == IN_FLIGHT_CALLS, marks
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        if upstream_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(upstream_pid, signal.SIGKILL)

    out = subprocess.run(
        [*BREAKWATER, "stats", "--json", "--journal", str(journal)], capture_output=True, text=True, check=True, timeout=30
    )
    in_flight = json.loads(out.stdout)["in_flight"]
    assert len(in_flight) == IN_FLIGHT_CALLS
    assert {(m["server"], m["tool"], m["state"], m["attempt"], m["client"]) for m in in_flight} == {
        ("ts", "ship", "outcome_unknown", 1, CLIENT_NAME)
    }
    assert len({m["operation_id"] for m in in_flight}) == IN_FLIGHT_CALLS and all(m["operation_id"] for m in in_flight)
    assert all(killed_at - 30 < m["started_at"] <= killed_at for m in in_flight)
    # The mutating call that finished is an attempt row as always, and not among the unknown; the table
    # `stats` prints says what to do about the others.
    store = SQLiteJournalStore(journal)
    try:
        assert [(r.tool, r.outcome) for r in store.recent(10)] == [("place", "completed")]
        text = "\n".join(in_flight_lines(store.in_flight(10)))
    finally:
        store.close()
    assert f"Outcome unknown: {IN_FLIGHT_CALLS} calls" in text and "check whether each took effect" in text
    assert all(m["operation_id"] in text for m in in_flight)


# ---------------------------------------------------------------------------- the rows, on the fake clock


def ok(text: str = "ok") -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content={"ok": True})


#: No startup jitter, no health pings: the connection is up at once and only the test's calls use it.
CONNECT = ConnectPolicy(startup_jitter_s=0, health_interval_s=0)


def scripted(listed: list[Tool], script: Callable[[str, int], Awaitable[CallToolResult]]) -> ScriptedServer:
    """An in-process SDK server listing `listed`, answering call number n (of all) of tool `name` with `script(name, n)`."""

    async def answer(call: ScriptedCall, n: int, _progress: Progress) -> CallToolResult:
        return await script(call.name, n)

    return ScriptedServer(listed, answer)


@asynccontextmanager
async def make_gate(
    clock: FakeClock, script: Callable[[str, int], Awaitable[CallToolResult]], listed: list[Tool]
) -> AsyncIterator[tuple[CallGate, AttemptRows]]:
    """A gate over one real upstream connected to an in-process SDK server, its attempts handed to an `AttemptRows`."""
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command="unused",
        call=CallPolicy(timeout_s=1.0, max_s=30.0),
        breaker=BreakerPolicy(consecutive_failures=2, failure_rate=1.0, open_base_s=60),
        retry=RetryPolicy(max_attempts=2, backoff_base_s=0.1, backoff_cap_s=0.1, retry_timeouts=True),
        connect=CONNECT,
    )
    rng = random.Random(3)
    async with connected_upstream(spec, scripted(listed, script), clock=clock, rng=rng) as upstream:
        recorder = AttemptRows(record_sizes=True)
        yield CallGate({"s": upstream}, clock=clock, rng=rng, observer=recorder), recorder


async def drive(clock: FakeClock, fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run `fn` on the fake clock, jumping time whenever every task is blocked."""
    return await clock.run(fn)


async def test_gate_hands_the_observer_every_send_refusal_and_reconciliation() -> None:
    clock = FakeClock()
    readonly = Tool(name="t", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))
    idempotent = Tool(name="op", input_schema={"type": "object"}, annotations=ToolAnnotations(idempotent_hint=True))
    get_op = Tool(name=GET_OPERATION_TOOL, input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))

    async def script(name: str, n: int) -> CallToolResult:
        if name == GET_OPERATION_TOOL:
            stored = ok("stored").model_dump(mode="json", by_alias=True, exclude_none=True)
            return CallToolResult(content=[], structured_content={"state": "completed", "result": stored})
        if n in (1, 3, 4, 5):  # t: timeout then 0.25 s; t: two timeouts; op: lost answer
            await anyio.sleep_forever()
        await clock.sleep(0.25)
        return ok()

    token = DOWNSTREAM_CLIENT.set("agent-x")
    try:
        async with make_gate(clock, script, [readonly, idempotent, get_op]) as (gate, recorder):
            assert not (await drive(clock, lambda: gate.call("s", "t", {"q": 1}))).is_error
            assert (await drive(clock, lambda: gate.call("s", "t", {"q": 2}))).structured_content["code"] == "TIMEOUT"
            assert (await drive(clock, lambda: gate.call("s", "t", {"q": 3}))).structured_content["code"] == "CIRCUIT_OPEN"
            assert not (await drive(clock, lambda: gate.call("s", "op", {}))).is_error
    finally:
        DOWNSTREAM_CLIENT.reset(token)
    rows = recorder.rows
    assert [(r.tool, r.attempt, r.retries, r.outcome, r.error_code) for r in rows] == [
        ("t", 1, 0, "timeout", "TIMEOUT"),
        ("t", 2, 1, "completed", None),
        ("t", 1, 0, "timeout", "TIMEOUT"),
        ("t", 2, 1, "timeout", "TIMEOUT"),
        ("t", 1, 0, "circuit_open", "CIRCUIT_OPEN"),
        ("op", 1, 0, "timeout", "TIMEOUT"),
        ("op", 1, 0, "reconciled", None),
    ]
    a1, a2, b1, b2, c1, d1, d2 = rows
    assert [r.duration_s for r in (a1, a2, b1, c1)] == [1.0, 0.25, 1.0, 0]
    assert a1.call_id == a2.call_id == a1.trace_id and len({a1.call_id, b1.call_id, c1.call_id, d1.call_id}) == 4
    assert b1.call_id == b2.call_id and d1.call_id == d2.call_id
    # Wall-clock starts: the retry started after the first attempt's second and its backoff.
    assert a2.started_at >= a1.started_at + 1.0 and a2.started_at + 0.25 <= clock.time()
    # The second timeout in a row opened the tool's breaker (the refusal saw it open); op's timeout was the
    # server's second failure (b2, a tool's repeat failure, taught it nothing), which opened the server's.
    assert [r.breaker_opened for r in rows] == [False, False, False, True, False, True, False]
    assert (b2.tool_breaker, b2.server_breaker, c1.tool_breaker) == ("open", "closed", "open")
    assert (d1.server_breaker, d1.tool_breaker) == ("open", "closed")
    assert all(r.client == "agent-x" for r in rows)
    # An idempotent call names its operation; sizes and the hash only because the observer asked.
    assert d1.operation_id is not None and d1.operation_id == d2.operation_id and a1.operation_id is None
    assert a1.arguments_hash == a2.arguments_hash != b1.arguments_hash and a1.arguments_size == len('{"q":1}')
    assert a1.result_size is None and a2.result_size is not None and a2.result_size > 0


async def test_a_tool_that_is_not_read_only_cut_by_its_timeout_is_a_timeout_in_the_journal(tmp_path: Path) -> None:
    """The agent is told OUTCOME_UNKNOWN (the write may have happened), but the deadline expired all the same: the row
    said `outcome_unknown`, so `stats` read 0 timeouts (timeout rate 0) for a tool that timed out on every call, and
    its learned timeout never counted the cut."""
    clock = FakeClock()
    write = Tool(name="w", input_schema={"type": "object"})  # no annotations: may write, never repeated

    async def script(name: str, n: int) -> CallToolResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with make_gate(clock, script, [write]) as (gate, recorder):
        answer = await drive(clock, lambda: gate.call("s", "w", {}))
    assert answer.structured_content["code"] == "OUTCOME_UNKNOWN"
    assert [(r.outcome, r.error_code) for r in recorder.rows] == [("timeout", "OUTCOME_UNKNOWN")]
    journal = Journal(SQLiteJournalStore(tmp_path / "j.sqlite3"), clock=clock)
    for row in recorder.rows:
        journal.record(row)
    journal.flush()
    for exact in (False, True):
        [tool] = journal.stats(3600, exact=exact)
        assert (tool.calls, tool.timeouts, tool.outcome_unknown, tool.timeout_rate) == (1, 1, 1, 1.0), exact
    journal.close()


async def test_calls_refused_before_reaching_a_tool_are_journaled_too() -> None:
    """SERVER_CONNECTING and UNKNOWN_TOOL answers are rows as well: they are what an outage looks like to the agent."""
    clock = FakeClock()
    rng = random.Random(3)

    async def never_lists(_ctx: Any, _params: Any) -> ListToolsResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    # "s" is up with no tools; "c" never finishes its handshake (its tools/list is never answered): connecting.
    up = ServerSpec(name="s", transport="stdio", command="unused", connect=CONNECT)
    stuck = replace(up, name="c", connect=replace(CONNECT, attempt_timeout_s=3600))
    async with (
        connected_upstream(up, scripted([], lambda _n, _i: anyio.sleep_forever()), clock=clock, rng=rng) as ready,  # type: ignore[arg-type,return-value]
        connected_upstream(stuck, Server("stuck", on_list_tools=never_lists), clock=clock, rng=rng, ready=False) as connecting,
    ):
        recorder = AttemptRows(record_sizes=True)
        gate = CallGate({"s": ready, "c": connecting}, clock=clock, rng=rng, observer=recorder)
        assert (await gate.call("s", "missing", {})).structured_content["code"] == "UNKNOWN_TOOL"
        token = DOWNSTREAM_CLIENT.set("agent-y")
        try:
            # A connecting server is waited for within the call's window (on the fake clock), then refused.
            later = await drive(clock, lambda: gate.call("c", "later", {}))
            assert later.structured_content["code"] == "SERVER_CONNECTING"
            assert connecting.state is ServerState.CONNECTING
        finally:
            DOWNSTREAM_CLIENT.reset(token)
    assert [(r.server, r.tool, r.attempt, r.outcome, r.error_code, r.client) for r in recorder.rows] == [
        ("s", "missing", 1, "unknown_tool", "UNKNOWN_TOOL", None),
        ("c", "later", 1, "server_connecting", "SERVER_CONNECTING", "agent-y"),
    ]
    assert all(r.duration_s == 0 and r.server_breaker == "closed" for r in recorder.rows)


async def test_re_sends_of_a_running_operation_are_numbered_as_sends() -> None:
    """OPERATION_IN_PROGRESS re-sends spend no attempt of the gate's, but each is a row of its own: one call, three sends."""
    clock = FakeClock()
    idempotent = Tool(name="op", input_schema={"type": "object"}, annotations=ToolAnnotations(idempotent_hint=True))

    async def script(_name: str, n: int) -> CallToolResult:
        if n <= 2:
            body = {"ok": False, "code": "OPERATION_IN_PROGRESS", "retryable": True, "retry_after_s": 2.0, "message": "busy"}
            return CallToolResult(content=[TextContent(type="text", text="busy")], structured_content=body, is_error=True)
        return ok()

    async with make_gate(clock, script, [idempotent]) as (gate, recorder):
        assert not (await drive(clock, lambda: gate.call("s", "op", {}))).is_error
    rows = recorder.rows
    assert [(r.attempt, r.retries, r.outcome) for r in rows] == [(1, 0, "tool_error"), (2, 1, "tool_error"), (3, 2, "completed")]
    assert len({r.call_id for r in rows}) == 1 and len({r.operation_id for r in rows}) == 1
    assert not any(r.breaker_opened for r in rows)


# ---------------------------------------------------------------------------- the timeout in force


@asynccontextmanager
async def gate_with_journal(
    clock: FakeClock, journal: Journal, latency: list[float]
) -> AsyncIterator[tuple[CallGate, ServerSpec]]:
    """A gate whose `t` answers after `latency[0]` seconds (changed by the test), `fixed` has its own
    configured timeout, and every call is journaled and timed by the journal's learned values."""
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command="unused",
        call=CallPolicy(timeout_s=5.0, max_s=30.0),
        breaker=BreakerPolicy(consecutive_failures=1000, failure_rate=1.0),
        retry=RetryPolicy(max_attempts=1),
        tools={"fixed": ToolSettings(call=CallPolicy(timeout_s=3.0), retry=RetryPolicy(), explicit=frozenset({"timeout_s"}))},
        connect=CONNECT,
    )
    rng = random.Random(8)
    jitter = random.Random(9)

    async def script(name: str, _n: int) -> CallToolResult:
        await clock.sleep(latency[0] * jitter.lognormvariate(0, 0.3))
        return ok()

    readonly = ToolAnnotations(read_only_hint=True)
    listed = [Tool(name=n, input_schema={"type": "object"}, annotations=readonly) for n in ("t", "fixed", "idle")]
    async with connected_upstream(spec, scripted(listed, script), clock=clock, rng=rng) as upstream:
        yield CallGate({"s": upstream}, clock=clock, rng=rng, learned_timeout=journal.learned_timeout, observer=journal), spec


async def test_the_gate_follows_the_learned_timeout_as_a_tool_slows_down(tmp_path: Path) -> None:
    """Through the real gate on the fake clock: a tool's timeout is learned from its journaled calls,
    shown with its source, and follows the tool when it turns 5x slower (timeouts at the old value
    count at the time they were cut, which raises the quantile until it fits again)."""
    clock = FakeClock()
    policy = JournalPolicy(learn_min_samples=50, learn_floor_s=0.05, learn_refresh_s=2)
    journal = Journal(SQLiteJournalStore(tmp_path / "j.sqlite3"), clock=clock, policy=policy)
    latency = [0.1]
    async with gate_with_journal(clock, journal, latency) as (gate, spec):

        async def calls(n: int) -> list[str]:
            codes = []
            for i in range(n):
                result = await drive(clock, lambda: gate.call("s", "t", {}))
                codes.append((result.structured_content or {}).get("code", "OK"))
                if i % 25 == 24:
                    journal.flush()  # the writer's maintenance: a refresh every learn_refresh_s of fake time
            return codes

        assert gate.timeout_in_force("s", "t") == (5.0, "default")
        assert set(await calls(120)) == {"OK"}
        learned = journal.learned_timeout("s", "t")
        assert learned is not None and 0.1 < learned < 1.0  # p99.9 of ~0.1 s answers, times 2
        assert gate.timeout_in_force("s", "t") == (learned, "learned") and gate.resolved_timeout("s", "t") == learned
        assert gate.timeout_in_force("s", "fixed") == (3.0, "configured")  # configured wins over anything learned
        assert gate.timeout_in_force("s", "idle") == (5.0, "default")  # never called: nothing learned
        # The offline resolution (`breakwater stats`, no gate) agrees with the gate's own, tool by tool.
        for tool in ("t", "fixed", "idle"):
            assert timeout_in_force(spec, tool, journal.learned_timeout("s", tool)) == gate.timeout_in_force("s", tool)

        latency[0] = 0.5  # five times slower: the old timeout now cuts most calls
        codes = await calls(400)
        assert "TIMEOUT" in codes[:50]
        after = journal.learned_timeout("s", "t")
        assert after is not None and after > 3 * learned
        assert codes[-100:].count("TIMEOUT") <= 1, "the learned timeout did not catch up with the slower tool"
        journal.flush()
        (row,) = journal.stats(3600, tool="t")
        assert (row.timeout_s, row.timeout_source) == (after, "learned")
        journal.close()


def test_status_json_shows_each_tools_timeout_and_its_source(tmp_path: Path) -> None:
    """`breakwater status --json` against a real testserver: a configured timeout, one learned from the
    journal a previous gateway left (read before the first call), and the default."""
    journal = tmp_path / "journal.sqlite3"
    seed = Journal(SQLiteJournalStore(journal))
    now = time.time()
    for i in range(60):
        seed.record(
            AttemptRecord(
                server="ts", tool="work", call_id=f"c{i}", attempt=1, started_at=now - 60, duration_s=0.8, outcome="completed"
            )
        )
    seed.close()
    cmd = launch_command("--tool", "work:latency=0,readonly", "--tool", "hang:hang=1,readonly", "--tool", "echo:latency=0")
    config = tmp_path / "breakwater.toml"
    config.write_text(
        f"[servers.ts]\ncommand = {json.dumps(cmd[0])}\nargs = {json.dumps(cmd[1:])}\n[servers.ts.tools.hang]\ntimeout_s = 0.3\n"
    )
    out = subprocess.run(
        [*BREAKWATER, "status", "--json", "--config", str(config), "--wait", "30"],
        capture_output=True,
        text=True,
        timeout=60,
        env=gateway_env(tmp_path, journal),
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    timeouts = {t["tool"]: (t["timeout_s"], t["source"]) for t in report["timeouts"]}
    default = (CallPolicy().timeout_s, "default")
    assert timeouts == {"work": (pytest.approx(1.6, rel=0.01), "learned"), "hang": (0.3, "configured"), "echo": default} | {
        "testserver_state": default
    }
    # Learned before this process ran: when is not known here, so not said (it printed the status run's own start).
    assert [t["tool"] for t in report["timeouts"] if "learned_at" in t] == []
    assert tuple(replace(t, learned_at=None) for t in StatusReport.from_json(report).timeouts) == tuple(
        ToolTimeout(server="ts", tool=tool, timeout_s=value, source=source) for tool, (value, source) in timeouts.items()
    )


def test_a_shared_gateways_session_applies_what_it_learned(tmp_path: Path) -> None:
    """A session attached to the shared gateway (the default for stdio) runs its own stdio servers in a `Breakwater`
    of its own, whose attempts go to the gateway's journal: the timeouts learned from them never took effect, and a
    tool that had answered in milliseconds all along was still cut at the 5 s default when it hung."""
    from helpers import share_dir

    journal = tmp_path / "journal.sqlite3"
    cmd = launch_command("--tool", "quick:latency=0.01,readonly")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"ts": {"command": cmd[0], "args": cmd[1:]}}}))
    with share_dir("bw-ls-") as share:
        env = {
            **gateway_env(tmp_path, journal),
            "BREAKWATER_SHARE": "on",
            "BREAKWATER_SHARE_DIR": str(share),
            "BREAKWATER_JOURNAL_LEARN_MIN_SAMPLES": "5",
        }

        async def run() -> tuple[float, str]:
            params = StdioServerParameters(
                command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env
            )
            async with Client(params, mode="legacy") as client:
                for _ in range(8):
                    assert not (await client.call_tool("ts__quick", {})).is_error
                status = (await client.call_tool("breakwater_status", {})).structured_content or {}
            [row] = [(t["timeout_s"], t["source"]) for t in status["timeouts"] if t["tool"] == "quick"]
            return row

        timeout_s, source = anyio.run(run)
    assert source == "learned" and timeout_s < 5.0, (timeout_s, source)
