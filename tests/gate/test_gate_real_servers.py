"""The call gate against real `breakwater testserver` processes.

Behaviour that involves a server (cancellation reaching it, the ledger of side effects, in-flight
counts, progress notifications) is proven here with real processes over stdio and the system clock;
the gate's timing logic on its own is in test_gate_logic.py on the fake clock. Durations are short
and bounds generous.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater.config import BreakerPolicy, CallPolicy, RetryPolicy, ToolSettings
from breakwater.errors import ENVELOPE_KEYS, CallTimeoutError, InvalidArgumentsError, OutcomeUnknownError, UnknownToolError
from breakwater.gate._envelope import error_from_result
from breakwater.testing.server import OPERATION_ID_META_KEY, count_ledger, launch_command, read_ledger, read_state
from helpers import code_of as code
from helpers import eventually

pytestmark = pytest.mark.anyio

FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15)
# Retries in tests wait milliseconds, not the default half second.
FAST_RETRY = RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05)


def server(name: str, *flags: str, **policies: Any) -> ServerSpec:
    cmd = launch_command("--name", name, *flags)
    policies.setdefault("connect", FAST_CONNECT)
    policies.setdefault("retry", FAST_RETRY)
    return ServerSpec(name=name, transport="stdio", command=cmd[0], args=tuple(cmd[1:]), **policies)


@asynccontextmanager
async def gate(tmp_path: Path, *specs: ServerSpec, ready: bool = True) -> AsyncIterator[Breakwater]:
    async with Breakwater(Config(servers=specs), admission_dir=tmp_path / "admission") as bw:
        if ready:
            report = await bw.wait_ready(timeout=30)
            assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def envelope(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def control(path: Path, tools: dict[str, dict[str, Any]]) -> None:
    # The server re-reads the file when its mtime or size changes; a fresh name per write is
    # overkill, but make sure two writes in the same mtime tick still differ in size.
    path.write_text(json.dumps({"tools": tools}) + " " * (time.monotonic_ns() % 7))


async def test_success_passes_the_result_through(tmp_path: Path) -> None:
    """A healthy call returns the tool's own result, untouched."""
    async with gate(tmp_path, server("s")) as bw:
        result = await bw.call_tool("s", "add", {"a": 2, "b": 3})
        assert not result.is_error
        assert result.structured_content is not None and result.structured_content["sum"] == 5


async def test_arguments_that_do_not_fit_the_schema_are_refused_by_the_library_before_sending(tmp_path: Path) -> None:
    """`Breakwater.call_tool` checks arguments as the gateway does: INVALID_ARGUMENTS naming the field (attempt 0,
    not retryable), raised as `InvalidArgumentsError` with raise_on_error, and nothing reaches the server."""
    state = tmp_path / "state.json"
    async with gate(tmp_path, server("s", "--state-file", str(state))) as bw:
        wrong = envelope(await bw.call_tool("s", "add", {"a": "two", "b": 3}))
        assert (wrong["code"], wrong["field"], wrong["attempt"], wrong["retryable"]) == ("INVALID_ARGUMENTS", "a", 0, False)
        second = envelope(await bw.call_tool("s", "add", {"a": 2, "b": {"n": 3}}))
        assert (second["code"], second["field"]) == ("INVALID_ARGUMENTS", "b") and '{"n": 3}' in second["problem"]
        with pytest.raises(InvalidArgumentsError) as raised:
            await bw.call_tool("s", "add", {"a": [], "b": 1}, raise_on_error=True)
        assert raised.value.server == "s" and raised.value.tool == "add" and "argument 'a'" in str(raised.value)
        for number in (math.nan, math.inf, -math.inf):  # JSON cannot carry them (sent on, they would arrive as null)
            odd = envelope(await bw.call_tool("s", "add", {"a": number, "b": 3}))
            assert (odd["code"], odd["field"]) == ("INVALID_ARGUMENTS", "a") and "NaN or infinite" in odd["problem"]
        await eventually(lambda: state.exists())
        assert read_state(state)["started"].get("add", 0) == 0  # not one of them was sent
        right = await bw.call_tool("s", "add", {"a": 2, "b": 3})
        assert not right.is_error and (right.structured_content or {})["sum"] == 5
        assert read_state(state)["started"]["add"] == 1


async def test_half_open_admits_exactly_one_probe_under_50_callers(tmp_path: Path) -> None:
    """Once the open period ends, 50 concurrent callers: one probe reaches the server, 49 are refused."""
    ctl, state = tmp_path / "control.json", tmp_path / "state.json"
    control(ctl, {"t": {"error": 1}})
    spec = server(
        "s",
        "--tool",
        "t:readonly",
        "--control-file",
        str(ctl),
        "--state-file",
        str(state),
        breaker=BreakerPolicy(open_base_s=0.3, open_jitter=0.0, consecutive_failures=4),
    )
    async with gate(tmp_path, spec) as bw:
        for _ in range(4):
            assert code(await bw.call_tool("s", "t")) == "TOOL_ERROR"
        assert code(await bw.call_tool("s", "t")) == "CIRCUIT_OPEN"
        control(ctl, {"t": {"latency": 0.5}})
        await anyio.sleep(0.35)
        started_before = read_state(state)["started"]["t"]
        results: list[CallToolResult] = []

        async def one() -> None:
            results.append(await bw.call_tool("s", "t"))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(one)
        codes = [code(r) for r in results]
        assert codes.count(None) == 1, codes
        assert codes.count("CIRCUIT_OPEN") == 49
        assert read_state(state)["started"]["t"] - started_before == 1
        # The probe succeeded, so the breaker closed again.
        assert code(await bw.call_tool("s", "t")) is None


async def test_local_rejections_record_no_failure(tmp_path: Path) -> None:
    """OVERLOADED, BUDGET_EXHAUSTED and an unknown tool leave every breaker's window untouched."""
    spec = server("s", call=CallPolicy(max_in_flight=2))
    async with gate(tmp_path, spec) as bw:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(lambda: bw.call_tool("s", "hang", timeout=30))
            await eventually(lambda: bw.gate.in_flight()["s"] == 2)
            before = {b.name: b.calls_in_window for b in bw.gate.breaker_snapshots()}
            overflow = await bw.call_tool("s", "echo", {"x": 1})
            assert code(overflow) == "OVERLOADED"
            assert envelope(overflow)["attempt"] == 0
            async with bw.budget(seconds=0.0):
                assert code(await bw.call_tool("s", "echo")) == "BUDGET_EXHAUSTED"
            assert code(await bw.call_tool("s", "no_such_tool")) == "UNKNOWN_TOOL"
            after = {b.name: b.calls_in_window for b in bw.gate.breaker_snapshots()}
            tg.cancel_scope.cancel()
        assert all(after.get(name, 0) == before.get(name, 0) for name in after), (before, after)
        assert all(b.failures_in_window == 0 for b in bw.gate.breaker_snapshots())


async def test_never_tool_timeout_is_outcome_unknown_and_sent_once(tmp_path: Path) -> None:
    """A destructive tool that times out is called exactly once and reported as OUTCOME_UNKNOWN."""
    ledger = tmp_path / "ledger.jsonl"
    spec = server("s", "--tool", "order:mutating,destructive,latency=5", "--ledger", str(ledger))
    async with gate(tmp_path, spec) as bw:
        result = await bw.call_tool("s", "order", {"item": "x"}, timeout=0.3)
        env = envelope(result)
        assert env["code"] == "OUTCOME_UNKNOWN"
        assert env["attempt"] == 1 and env["retryable"] is False
        text = result.content[-1].text  # type: ignore[union-attr]
        assert "did not answer in time (no answer within 0.3 s)" in text and "may or may not" in text, text
        await anyio.sleep(0.2)
        assert count_ledger(ledger, tool="order") == 1
        with pytest.raises(OutcomeUnknownError):
            await bw.call_tool("s", "order", {"item": "y"}, timeout=0.3, raise_on_error=True)


async def test_safe_flaky_tool_succeeds_through_retries(tmp_path: Path) -> None:
    """A read-only tool failing 50 % of the time (retryable) succeeds through the gate's retries."""
    state = tmp_path / "state.json"
    # At 50 % failed attempts the default breaker (trip at >= 50 %) rightly opens; this test is about retries.
    lenient = BreakerPolicy(failure_rate=1.0, consecutive_failures=50)
    # And the retry budget is sized for ~10 % failures; give it room so every call gets its 3 attempts.
    roomy = replace(FAST_RETRY, budget_max_tokens=100)
    spec = server(
        "s",
        "--seed",
        "7",
        "--tool",
        "flaky:retryable_error=0.5,readonly",
        "--state-file",
        str(state),
        breaker=lenient,
        retry=roomy,
    )
    async with gate(tmp_path, spec) as bw:
        results = [await bw.call_tool("s", "flaky") for _ in range(20)]
        ok = sum(not r.is_error for r in results)
        attempts = read_state(state)["started"]["flaky"]
        # 3 attempts at 50 %: 87.5 % per call; the seed makes it exact, the bound keeps it honest.
        # Without retries about 10 of 20 would succeed; with 3 attempts at 50 % about 17.5.
        assert ok >= 15, [code(r) for r in results]
        assert all(envelope(r)["attempt"] == 3 for r in results if r.is_error)
        assert attempts > 20


async def test_upstream_in_flight_returns_to_zero_after_timeouts_and_cancellations(tmp_path: Path) -> None:
    """Timed-out calls and cancelled callers both cancel the work on the server."""
    state = tmp_path / "state.json"
    hangers = ("--tool", "hang:hang=1,readonly", "--tool", "hang2:hang=1,readonly")
    spec = server("s", *hangers, "--state-file", str(state), retry=replace(FAST_RETRY, max_attempts=1))
    async with gate(tmp_path, spec) as bw:
        results: list[CallToolResult] = []

        async def timed_out() -> None:
            results.append(await bw.call_tool("s", "hang", timeout=0.3))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(timed_out)
        assert [code(r) for r in results] == ["TIMEOUT"] * 5
        await eventually(lambda: read_state(state)["in_flight"]["hang"] == 0 and read_state(state)["cancelled"]["hang"] == 5)

        cancelled = 0

        async def caller() -> None:
            nonlocal cancelled
            with anyio.move_on_after(0.3) as scope:
                # hang's breaker opened after the timeouts above; hang2 is fresh.
                await bw.call_tool("s", "hang2", timeout=30)
            # The caller's own cancellation came back to it: no result was made up.
            cancelled += scope.cancelled_caught

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(caller)
        assert cancelled == 5
        await eventually(lambda: read_state(state)["in_flight"]["hang2"] == 0 and read_state(state)["cancelled"]["hang2"] == 5)
        assert bw.gate.in_flight()["s"] == 0
        # A caller's cancellation is nobody's failure.
        hang2 = next(b for b in bw.gate.breaker_snapshots() if b.name == "s/hang2")
        assert hang2.calls_in_window == 0 and hang2.state.value == "closed"


async def test_progress_keeps_a_call_alive_but_the_hard_cap_cuts_it(tmp_path: Path) -> None:
    """Progress resets the idle timer; the hard maximum is never extended; silence is cut at the timeout."""
    spec = server(
        "s",
        "--tool",
        "talker:latency=1.2,progress=0.1,readonly",
        "--tool",
        "mute:latency=1.2,readonly",
        call=CallPolicy(timeout_s=0.4, max_s=3.0),
        retry=replace(FAST_RETRY, max_attempts=1),
    )
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with gate(tmp_path, spec) as bw:
        t0 = time.monotonic()
        result = await bw.call_tool("s", "talker", progress_callback=on_progress)
        assert not result.is_error and time.monotonic() - t0 >= 1.1
        assert len(seen) >= 5

        t0 = time.monotonic()
        assert code(await bw.call_tool("s", "mute")) == "TIMEOUT"
        assert 0.35 <= time.monotonic() - t0 < 0.9

    capped = replace(spec, call=CallPolicy(timeout_s=0.4, max_s=0.7))
    async with gate(tmp_path, capped) as bw:
        t0 = time.monotonic()
        result = await bw.call_tool("s", "talker")
        elapsed = time.monotonic() - t0
        assert code(result) == "TIMEOUT"
        assert 0.65 <= elapsed < 1.1, elapsed


async def test_operation_id_is_the_same_on_every_attempt(tmp_path: Path) -> None:
    """An idempotent tool's retries carry one operation id, in _meta and in the operationId argument."""
    ledger, state = tmp_path / "ledger.jsonl", tmp_path / "state.json"
    spec = server("s", "--tool", "pay:mutating,idempotent,retryable_error=1", "--ledger", str(ledger), "--state-file", str(state))
    async with gate(tmp_path, spec) as bw:
        result = await bw.call_tool("s", "pay", {"amount": 3})
        env = envelope(result)
        assert env["code"] == "TOOL_ERROR" and env["attempt"] == 3
        op_id = env["operation_id"]
        assert isinstance(op_id, str) and op_id
        records = read_ledger(ledger)
        assert len(records) == 3
        assert {r["operation_id"] for r in records} == {op_id}
        assert len({r["args_sha256"] for r in records}) == 1  # the same arguments every time
        # A second logical call gets a new id.
        await bw.call_tool("s", "pay", {"amount": 3})
        assert len({r["operation_id"] for r in read_ledger(ledger)}) == 2
        assert OPERATION_ID_META_KEY == "io.breakwater/operationId"


async def test_turn_budget_stops_attempts(tmp_path: Path) -> None:
    """A budget cuts the call in flight, stops the retries, and refuses the next call outright."""
    state = tmp_path / "state.json"
    spec = server("s", "--state-file", str(state), call=CallPolicy(timeout_s=5.0))
    async with gate(tmp_path, spec) as bw:
        t0 = time.monotonic()
        async with bw.budget(seconds=0.5):
            first = await bw.call_tool("s", "hang")
            env = envelope(first)
            assert env["code"] == "TIMEOUT" and env["attempt"] == 1
            assert env["cut_by"] == "turn budget"
            second = await bw.call_tool("s", "echo")
            assert code(second) == "BUDGET_EXHAUSTED"
            assert envelope(second)["attempt"] == 0
        assert time.monotonic() - t0 < 1.5
        assert read_state(state)["started"]["hang"] == 1
        assert read_state(state)["started"]["echo"] == 0


async def test_server_unavailable_names_the_reason(tmp_path: Path) -> None:
    """A server that failed to start: SERVER_UNAVAILABLE with the reason and when it is retried."""
    spec = server(
        "dead",
        "--exit-at-start",
        "3",
        "--exit-message",
        "database password rejected",
        connect=replace(FAST_CONNECT, budget_s=0),
    )
    async with gate(tmp_path, spec, ready=False) as bw:
        await bw.wait_ready(timeout=30)
        result = await bw.call_tool("dead", "anything")
        env = envelope(result)
        assert env["code"] == "SERVER_UNAVAILABLE"
        assert env["reason"] == "exited"
        assert "database password rejected" in env["reason_message"]
        assert env["next_retry_at"] and env["retry_after_s"] > 0


async def test_server_connecting_before_ready(tmp_path: Path) -> None:
    """A server still starting: SERVER_CONNECTING with the connect attempt and an estimate, never UNKNOWN_TOOL."""
    spec = server("late", "--startup-delay", "2")
    async with gate(tmp_path, spec, ready=False) as bw:
        # The call waits for a connecting server within its own window (here too short to see it ready).
        result = await bw.call_tool("late", "no_such_tool", timeout=0.2)
        env = envelope(result)
        assert env["code"] == "SERVER_CONNECTING"
        assert env["retry_after_s"] > 0 and "connect_attempt" in env


async def test_a_server_slow_to_start_is_said_to_be(tmp_path: Path) -> None:
    """Past the expected connect time, SERVER_CONNECTING said "Wait about 2 s" however long the attempt had run; it says
    how long it has been starting and bounds the wait by the attempt's own timeout (15 s here). Not "longer than
    usual": a server's first start has no usual (the estimate is a default), and said so it sounded like a fault."""
    spec = server("late", "--startup-delay", "60")
    async with gate(tmp_path, spec, ready=False) as bw:
        with anyio.fail_after(30):
            while bw.upstream("late").snapshot().attempt_started_at is None:
                await anyio.sleep(0.05)
        assert "attempt_started_at" in bw.status().to_json()["servers"][0]
        await anyio.sleep(2.5)  # past the default estimate of a server never connected before
        env = envelope(await bw.call_tool("late", "anything", timeout=0.2))
    assert env["code"] == "SERVER_CONNECTING" and env["connecting_for_s"] >= 2.5, env
    assert 5 < env["retry_after_s"] <= 15 - 2.5, env
    assert "has been starting up for" in env["message"] and "usual" not in env["message"], env


async def test_unknown_tool_on_a_ready_server(tmp_path: Path) -> None:
    """A ready server without that tool: UNKNOWN_TOOL, not retryable, with the tools it does have."""
    async with gate(tmp_path, server("s")) as bw:
        env = envelope(await bw.call_tool("s", "no_such_tool"))
        assert env["code"] == "UNKNOWN_TOOL" and env["retryable"] is False
        assert "echo" in env["tools"]
        with pytest.raises(UnknownToolError):
            await bw.call_tool("s", "no_such_tool", raise_on_error=True)
        assert code(await bw.call_tool("nowhere", "echo")) == "UNKNOWN_TOOL"


async def test_envelope_fields(tmp_path: Path) -> None:
    """Every failure carries the documented structuredContent keys, in order, and round-trips to its class."""
    async with gate(tmp_path, server("s", retry=replace(FAST_RETRY, max_attempts=2, retry_timeouts=True))) as bw:
        result = await bw.call_tool("s", "hang", timeout=0.2)
        env = envelope(result)
        assert list(env)[: len(ENVELOPE_KEYS)] == list(ENVELOPE_KEYS)
        assert env["ok"] is False and env["code"] == "TIMEOUT" and env["retryable"] is True
        assert (env["attempt"], env["max_attempts"], env["server"], env["tool"]) == (2, 2, "s", "hang")
        assert env["operation_id"] is None  # hang is read-only: no operation id
        assert env["timeout_s"] == 0.2
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.startswith("Tool 'hang' on server 's'") and "after 2 attempts" in text
        err = error_from_result(result)
        assert isinstance(err, CallTimeoutError) and err.attempt == 2


async def test_per_tool_config_overrides_timeout_and_retry_class(tmp_path: Path) -> None:
    """`[servers.NAME.tools.TOOL]` wins over annotations and over the server's timeout."""
    ledger = tmp_path / "ledger.jsonl"
    tools = {
        # The annotation says read-only; config says never, so a timeout is OUTCOME_UNKNOWN and not retried.
        "slowread": ToolSettings(
            call=CallPolicy(timeout_s=0.3, retry="never"),
            retry=FAST_RETRY,
            explicit=frozenset({"timeout_s", "retry"}),
        )
    }
    spec = server("s", "--tool", "slowread:latency=3,readonly,mutating", "--ledger", str(ledger), tools=tools)
    async with gate(tmp_path, spec) as bw:
        assert bw.gate.resolved_timeout("s", "slowread") == 0.3
        t0 = time.monotonic()
        env = envelope(await bw.call_tool("s", "slowread"))
        assert env["code"] == "OUTCOME_UNKNOWN" and env["attempt"] == 1
        assert time.monotonic() - t0 < 1.0
        assert count_ledger(ledger) == 1


async def test_one_crash_under_many_calls_is_one_failure_and_the_read_only_calls_wait_for_the_restart(tmp_path: Path) -> None:
    # Five read-only calls in flight when the server crashes (another tool's call kills it), and the restart takes
    # 1.5 s. Each cut call used to count as a failure of its own: four opened the server's breaker, and every session
    # of a shared gateway was refused for seconds; the retries were refused at once, the server still connecting.
    spec = server("s", "--startup-delay", "1.5", "--tool", "mid:latency=1,readonly", "--tool", "boom:crash=1,destructive")
    async with gate(tmp_path, spec) as bw:
        results: list[CallToolResult] = []

        async def mid() -> None:
            results.append(await bw.call_tool("s", "mid", {}, raise_on_error=False))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(mid)
                await anyio.sleep(0.3)
                crashed = await bw.call_tool("s", "boom", {}, raise_on_error=False)
        assert crashed.is_error
        assert [r.is_error for r in results] == [False] * 5, json.dumps([r.structured_content for r in results if r.is_error])
        assert bw.upstream("s").snapshot().attempts == 2  # one restart
        breakers = {b.name: b for b in bw.gate.breaker_snapshots()}
        assert breakers["s"].failures_in_window == 1, breakers["s"]
        assert breakers["s/mid"].failures_in_window <= 1, breakers["s/mid"]


async def test_an_error_raised_in_the_body_of_breakwater_comes_out_as_it_was_raised(tmp_path: Path) -> None:
    """`except CallError` around `async with Breakwater(...)` caught nothing: the body's error came out in an
    ExceptionGroup, from the task group the context had entered (the user's own ValueError too)."""
    with pytest.raises(UnknownToolError):
        async with gate(tmp_path, server("s")) as bw:
            await bw.call_tool("s", "nope", {}, raise_on_error=True)
    with pytest.raises(ValueError, match="the caller's own"):
        async with gate(tmp_path, server("s")) as bw:
            raise ValueError("the caller's own")


async def test_a_cancelled_call_of_a_tool_that_changes_things_is_journaled_as_of_unknown_outcome(tmp_path: Path) -> None:
    """A call cut once sent (the caller cancelled it, or a draining gateway cut it and told its caller OUTCOME_UNKNOWN)
    was journaled CANCELLED: `stats` counted none unknown. A read-only tool's stays CANCELLED."""
    from breakwater.journal import Journal, SQLiteJournalStore

    journal = Journal(SQLiteJournalStore(tmp_path / "journal.sqlite3"))
    spec = server("s", "--tool", "book:hang=1,destructive", "--tool", "look:hang=1,readonly")
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission", journal=journal) as bw:
        await bw.wait_ready(timeout=30)
        for tool in ("book", "look"):
            with anyio.move_on_after(0.5):  # the caller's own deadline, as an agent's
                await bw.call_tool("s", tool, {})
    journal.flush()
    codes = {r.tool: r.error_code for r in journal.store.recent(10)}
    assert codes == {"book": "OUTCOME_UNKNOWN", "look": "CANCELLED"}, codes


async def test_a_call_whose_server_died_and_cannot_restart_ends_within_its_timeout_not_its_cap(tmp_path: Path) -> None:
    """An idempotent tool's call lost with its server, which then could not start again: the reconciliation waited for
    the server's ready event up to the tool's cap (120 s), though the server was retrying (H3's server-everything)."""
    marker = tmp_path / "started-once"
    cmd = launch_command("--name", "s", "--tool", "write:latency=2,crash=1,idempotent")
    # The first start runs the server; every restart exits at once, as a server whose dependency went away.
    script = f'[ -e "{marker}" ] && exit 1; touch "{marker}"; exec "$@"'
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command="sh",
        args=("-c", script, "sh", *cmd),
        connect=FAST_CONNECT,
        retry=FAST_RETRY,
        call=CallPolicy(timeout_s=3, max_s=120),
    )
    async with gate(tmp_path, spec) as bw:
        started = time.monotonic()
        with anyio.fail_after(60):
            result = await bw.call_tool("s", "write", {}, raise_on_error=False)
        elapsed = time.monotonic() - started
    said = envelope(result)
    assert said["retry_stopped"] == "the server did not come back within the call's window", said
    assert elapsed < 20, elapsed  # the crash at 1 s, then at most the call's timeout for the server to come back


async def test_a_breakwater_is_entered_once_and_refuses_calls_outside_its_async_with(tmp_path: Path) -> None:
    """A second enter started every server again and its exit crashed the first's; calls before entering waited 5 s
    and said "still starting up", after exit said "connecting"."""
    bw = Breakwater(Config(servers=(server("s"),)), admission_dir=tmp_path / "admission")
    with pytest.raises(RuntimeError, match="before `async with Breakwater"):
        await bw.call_tool("s", "echo", {})
    async with bw:
        await bw.wait_ready(timeout=30)
        with pytest.raises(RuntimeError, match="entered already"):
            async with bw:
                pass
        assert not (await bw.call_tool("s", "echo", {})).is_error
    with pytest.raises(RuntimeError, match="after its `async with` ended"):
        await bw.call_tool("s", "echo", {})
    with pytest.raises(RuntimeError, match="closed already"):
        async with bw:
            pass


async def test_a_read_only_call_waiting_for_its_server_ends_when_breakwater_closes(tmp_path: Path) -> None:
    """Its server lost, the call waited for the reconnect for its whole timeout (20 s) after its Breakwater had closed."""
    marker = tmp_path / "started-once"
    cmd = launch_command("--name", "s", "--tool", "mid:latency=2,readonly", "--tool", "boom:crash=1,destructive")
    script = f'[ -e "{marker}" ] && sleep 30; touch "{marker}"; exec "$@"'  # a restart takes 30 s
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command="sh",
        args=("-c", script, "sh", *cmd),
        connect=replace(FAST_CONNECT, attempt_timeout_s=60),
        retry=FAST_RETRY,
        call=CallPolicy(timeout_s=20),
    )
    outcome: list[CallToolResult] = []
    async with anyio.create_task_group() as tg:
        async with gate(tmp_path, spec) as bw:

            async def mid() -> None:
                outcome.append(await bw.call_tool("s", "mid", {}, raise_on_error=False))

            tg.start_soon(mid)
            await anyio.sleep(0.3)
            await bw.call_tool("s", "boom", {}, raise_on_error=False)  # the server dies under `mid`
            await anyio.sleep(0.5)
            started = time.monotonic()
        with anyio.fail_after(10):
            while not outcome:
                await anyio.sleep(0.05)
        elapsed = time.monotonic() - started
    assert elapsed < 5 and outcome[0].is_error, (elapsed, outcome[0].structured_content)


async def test_call_tool_refuses_a_timeout_or_arguments_it_cannot_use_before_anything_is_sent(tmp_path: Path) -> None:
    """`timeout=-1` sent nothing and counted a timeout against the tool (four opened its breaker for every caller);
    `arguments="x"` raised dict()'s own ValueError."""
    async with gate(tmp_path, server("s")) as bw:
        for bad in (-1, 0, math.nan, math.inf, "5", True):
            with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
                await bw.call_tool("s", "echo", {}, timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="arguments must be a mapping of the tool's arguments, got str"):
            await bw.call_tool("s", "echo", "notadict")  # type: ignore[arg-type]
        assert not (await bw.call_tool("s", "echo", {}, timeout=5)).is_error
        assert all(b.failures_in_window == 0 for b in bw.gate.breaker_snapshots())


async def test_a_progress_callbacks_own_exception_is_the_callers_not_the_servers(tmp_path: Path) -> None:
    """It was read as the server's failure (UPSTREAM_ERROR, "the connection failed"), and opened the tool's breaker."""
    spec = server("s", "--tool", "prog:latency=1,progress=0.1,readonly")
    async with gate(tmp_path, spec) as bw:

        async def buggy(progress: float, total: float | None, message: str | None) -> None:
            raise ValueError("bug in my callback")

        for _ in range(4):
            with pytest.raises(ValueError, match="bug in my callback"):
                await bw.call_tool("s", "prog", {}, progress_callback=buggy)
        seen: list[float] = []

        def plain(progress: float, total: float | None, message: str | None) -> None:  # not async: taken too
            seen.append(progress)

        assert not (await bw.call_tool("s", "prog", {}, progress_callback=plain)).is_error
        assert seen and seen == sorted(seen)
        assert all(b.failures_in_window == 0 for b in bw.gate.breaker_snapshots())


async def test_progress_never_goes_back_when_a_call_is_sent_again(tmp_path: Path) -> None:
    """The server killed mid-call, a read-only call is sent again and its progress starts over: the caller saw
    1, 2, 1, 2, 3, ... for one token, and the spec says progress MUST increase."""
    spec = server("s", "--tool", "echo", "--tool", "prog:latency=2,progress=0.2,readonly")
    async with gate(tmp_path, spec) as bw:
        pid = (await bw.call_tool("s", "echo", {})).structured_content["pid"]
        seen: list[float] = []

        async def note(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)
            if len(seen) == 3:
                os.kill(pid, signal.SIGKILL)

        with anyio.fail_after(60):
            result = await bw.call_tool("s", "prog", {}, progress_callback=note)
    assert not result.is_error, result.structured_content
    assert bw.upstream("s").snapshot().attempts == 2  # it was restarted, and the call sent again
    assert seen == sorted(seen) and len(seen) > 3, seen  # (an equal value passes: it may carry a new total)


async def test_a_call_that_ends_its_server_twice_is_not_repeated_a_third_time(tmp_path: Path) -> None:
    """A query of death: an idempotent tool whose call makes the server exit was retried up to its three attempts, each
    killing the server again, until the exits read as a crash loop and every tool of the server was down for a minute."""
    ledger = tmp_path / "ledger.jsonl"
    spec = server("s", "--tool", "echo:readonly", "--tool", "bad:crash=1,idempotent,mutating", "--ledger", str(ledger))
    async with gate(tmp_path, spec) as bw:
        with anyio.fail_after(60):
            said = envelope(await bw.call_tool("s", "bad", {}))
            assert count_ledger(ledger, tool="bad") == 2  # the first attempt and one retry: not the third
            assert said["attempt"] == 2 and said["retryable"] is False, said
            assert said["retry_stopped"].startswith("the server's process ended during this call twice"), said
            report = await bw.wait_ready(timeout=30)
            assert [s.state for s in report.servers] == [ServerState.READY], report.to_json()
            echoed = await bw.call_tool("s", "echo", {})  # the server is back, not held down as a crash loop
    assert not echoed.is_error, echoed
