"""The call gate's timing and retry logic on the fake clock, against a scripted in-process SDK server.

What a real server process must prove (cancellation reaching it, ledgers, in-flight counts) is in
test_gate_real_servers.py; here the clock only moves when every task is blocked, so timeouts,
backoff, budgets and progress deadlines are checked to the microsecond in milliseconds of real
time. The upstream, its SDK client and session are real and connected through the transport seam
(`in_memory`); only the clock and the random draws are injected fakes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from breakwater.config import (
    BreakerPolicy,
    CallPolicy,
    ConnectPolicy,
    JournalPolicy,
    RetryPolicy,
    ServerSpec,
    ToolSettings,
    load_config,
)
from breakwater.connect._upstream import Upstream
from breakwater.errors import CallTimeoutError, CircuitOpenError, ConfigError, ServerCircuitOpenError
from breakwater.gate._envelope import error_result, render_error_table
from breakwater.gate._gate import OPERATION_ID_META_KEY, CallGate
from breakwater.gate._turn_budget import turn_budget
from breakwater.journal import AttemptRecord
from breakwater.status import StatusReport, ToolTimeout
from breakwater.testing import FakeClock, Progress, ScriptedCall, ScriptedServer
from helpers import AttemptRows, connected_upstream

pytestmark = pytest.mark.anyio

Behaviour = Callable[[int, dict[str, Any], Any, Any], Awaitable[CallToolResult]]
#: No startup jitter, no health pings: the connection is up at once and only the test's calls use it.
CONNECT = ConnectPolicy(startup_jitter_s=0, health_interval_s=0)


def ok(text: str = "ok") -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content={"ok": True})


def tool(name: str, *, readonly: bool = False, idempotent: bool = False, op_arg: bool = False) -> Tool:
    props = {"operationId": {"type": "string"}} if op_arg else {}
    annotations = ToolAnnotations(read_only_hint=readonly or None, idempotent_hint=idempotent or None)
    return Tool(name=name, input_schema={"type": "object", "properties": props}, annotations=annotations)


@asynccontextmanager
async def make_gate(
    clock: FakeClock,
    behaviour: Behaviour,
    listed: list[Tool],
    *,
    learned: float | None = None,
    learning: JournalPolicy | None = None,
    **spec_kw: Any,
) -> AsyncIterator[tuple[CallGate, ScriptedServer, Upstream]]:
    """A gate over one real upstream connected to an in-process SDK server listing `listed`, each call of which
    runs `behaviour(call_no, arguments, meta, progress)`; the server's `calls` are what reached it."""
    spec_kw.setdefault("breaker", BreakerPolicy(consecutive_failures=1000, failure_rate=1.0))
    spec_kw.setdefault("connect", CONNECT)
    spec = ServerSpec(name="s", transport="stdio", command="unused", **spec_kw)
    rng = random.Random(1)

    async def answer(call: ScriptedCall, n: int, progress: Progress) -> CallToolResult:
        return await behaviour(n, call.arguments, call.meta, progress)

    server = ScriptedServer(listed, answer)
    async with connected_upstream(spec, server, clock=clock, rng=rng) as upstream:
        gate = CallGate({"s": upstream}, clock=clock, rng=rng, learned_timeout=lambda _s, _t: learned, learning=learning)
        yield gate, server, upstream


async def drive(clock: FakeClock, fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run `fn` on the fake clock, jumping time whenever every task is blocked."""
    return await clock.run(fn)


def sleeper(seconds: float, clock: FakeClock, result: CallToolResult | None = None) -> Behaviour:
    async def behave(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        await clock.sleep(seconds)
        return result or ok()

    return behave


async def test_timeout_resolution_order() -> None:
    """Per-tool config, then per-server config, then the learned value, then the default."""
    clock = FakeClock()
    tools = [tool("a"), tool("b")]
    async with make_gate(clock, sleeper(0, clock), tools, learned=None) as (gate, _, _):
        assert gate.resolved_timeout("s", "a") == CallPolicy().timeout_s == 5.0
    async with make_gate(clock, sleeper(0, clock), tools, learned=1.5) as (gate, _, _):
        assert gate.resolved_timeout("s", "a") == 1.5
    async with make_gate(
        clock, sleeper(0, clock), tools, learned=1.5, call=CallPolicy(timeout_s=3), call_explicit=frozenset({"timeout_s"})
    ) as (gate, _, _):
        assert gate.resolved_timeout("s", "a") == 3
        per_tool = {"b": ToolSettings(call=CallPolicy(timeout_s=9), retry=RetryPolicy(), explicit=frozenset({"timeout_s"}))}
    async with make_gate(
        clock,
        sleeper(0, clock),
        tools,
        learned=1.5,
        call=CallPolicy(timeout_s=3),
        call_explicit=frozenset({"timeout_s"}),
        tools=per_tool,
    ) as (gate, _, _):
        assert (gate.resolved_timeout("s", "a"), gate.resolved_timeout("s", "b")) == (3, 9)


async def test_timeout_is_exact_and_retries_back_off_with_full_jitter() -> None:
    """A silent call is cut at its timeout; with retry_timeouts on, each retry waits a draw from [0, base * 2^n]."""
    clock = FakeClock()
    starts: list[float] = []

    async def hang(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        starts.append(clock.monotonic())
        await clock.sleep(1e9)
        raise AssertionError("unreachable")

    retry = RetryPolicy(backoff_base_s=1.0, backoff_cap_s=8.0, retry_timeouts=True)
    async with make_gate(clock, hang, [tool("t", readonly=True)], retry=retry) as (gate, server, _):
        t0 = clock.monotonic()
        result = await drive(clock, lambda: gate.call("s", "t", timeout=2.0))
        assert result.structured_content["code"] == "TIMEOUT"
        assert len(server.calls) == 3
        gaps = [b - a - 2.0 for a, b in itertools.pairwise(starts)]
        assert 0 <= gaps[0] <= 1.0 and 0 <= gaps[1] <= 2.0
        assert clock.monotonic() - t0 == pytest.approx(6.0 + sum(gaps))


async def test_progress_pushes_the_idle_deadline_up_to_the_hard_cap() -> None:
    """Progress every 1 s keeps a 2 s-timeout call alive; the 10 s hard cap still cuts it, to the tick."""
    clock = FakeClock()

    async def chatty(_n: int, _a: dict[str, Any], _m: Any, progress: Any) -> CallToolResult:
        for i in range(100):
            await clock.sleep(1.0)
            await progress(float(i), None, None)
        return ok()

    async with make_gate(
        clock, chatty, [tool("t", readonly=True)], call=CallPolicy(timeout_s=2.0, max_s=10.0), retry=RetryPolicy(max_attempts=1)
    ) as (gate, _, _):
        t0 = clock.monotonic()
        result = await drive(clock, lambda: gate.call("s", "t"))
        assert result.structured_content["code"] == "TIMEOUT"
        assert clock.monotonic() - t0 == pytest.approx(10.0)
    # It said "no answer within 2 s" of a tool at work for 10 s, reporting progress all along.
    assert result.structured_content["cut_by"] == "max_s"
    assert "still working at the cap of 10 s" in result.content[0].text


async def test_a_progressing_tool_cut_by_the_callers_budget_is_a_turn_budget_cut() -> None:
    """The caller's 3 s budget, not the 60 s max_s, cut a tool that reported progress past its 1 s timeout: the model was
    told "still working at the cap of 3 s ([call] max_s)", retryable, and to have the user raise timeout_s."""
    clock = FakeClock()

    async def chatty(_n: int, _a: dict[str, Any], _m: Any, progress: Any) -> CallToolResult:
        for i in range(100):
            await clock.sleep(0.3)
            await progress(float(i), None, None)
        return ok()

    policy = CallPolicy(timeout_s=1.0, max_s=60.0)
    async with make_gate(clock, chatty, [tool("t", readonly=True)], call=policy) as (gate, server, _):

        async def budgeted() -> CallToolResult:
            with turn_budget(3.0, clock=clock):
                result = await gate.call("s", "t")
            return result

        t0 = clock.monotonic()
        result = await drive(clock, budgeted)
        assert clock.monotonic() - t0 == pytest.approx(3.0)
    answer = result.structured_content
    assert (answer["code"], answer["cut_by"], answer["retryable"]) == ("TIMEOUT", "turn budget", False), answer
    assert len(server.calls) == 1 and "max_s" not in result.content[0].text and "timeout_s" not in result.content[0].text


async def test_a_tool_that_stops_reporting_progress_is_cut_as_idle() -> None:
    clock = FakeClock()

    async def falls_silent(_n: int, _a: dict[str, Any], _m: Any, progress: Any) -> CallToolResult:
        for i in range(3):
            await clock.sleep(1.0)
            await progress(float(i), None, None)
        await clock.sleep(1e9)
        return ok()

    policy = CallPolicy(timeout_s=2.0, idle_timeout_s=1.5, max_s=100.0)
    async with make_gate(clock, falls_silent, [tool("t", readonly=True)], call=policy, retry=RetryPolicy(max_attempts=1)) as (
        gate,
        _,
        _,
    ):
        result = await drive(clock, lambda: gate.call("s", "t"))
    assert result.structured_content["cut_by"] == "idle"
    assert "no progress for 1.5 s" in result.content[0].text


async def test_retry_after_hint_is_a_floor_and_too_long_a_hint_stops_retries() -> None:
    """A server's retry_after_s is waited for; one longer than max_retry_after_s ends the call instead."""
    clock = FakeClock()
    hint = {"value": 3.0}

    async def shed(n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        if n == 1:
            body = {"ok": False, "retryable": True, "retry_after_s": hint["value"]}
            return CallToolResult(content=[TextContent(type="text", text="busy")], structured_content=body, is_error=True)
        return ok()

    async with make_gate(clock, shed, [tool("t", readonly=True)], retry=RetryPolicy(backoff_base_s=0.1, backoff_cap_s=0.2)) as (
        gate,
        server,
        _,
    ):
        t0 = clock.monotonic()
        result = await drive(clock, lambda: gate.call("s", "t"))
        assert not result.is_error and len(server.calls) == 2
        assert clock.monotonic() - t0 >= 3.0

        hint["value"] = 600.0
    async with make_gate(clock, shed, [tool("t", readonly=True)]) as (gate, server, _):
        result = await drive(clock, lambda: gate.call("s", "t"))
        assert result.structured_content["code"] == "TOOL_ERROR" and len(server.calls) == 1
        assert "longer wait" in result.structured_content["retry_stopped"]


async def test_budget_stops_retries_it_cannot_cover() -> None:
    """With 3 s of budget and 2 s timeouts, the second attempt never starts if the backoff leaves too little."""
    clock = FakeClock()
    async with make_gate(
        clock,
        sleeper(1e9, clock),
        [tool("t", readonly=True)],
        call=CallPolicy(timeout_s=2.0, min_attempt_s=1.5),
        retry=RetryPolicy(backoff_base_s=0.001, backoff_cap_s=0.001, retry_timeouts=True),
    ) as (gate, server, _):

        async def in_budget() -> CallToolResult:
            # The scope's __exit__ returns bool (it may swallow a cancel), so mypy wants the return after it.
            with turn_budget(3.0, clock=clock):
                result = await gate.call("s", "t")
            return result

        result = await drive(clock, in_budget)
        assert result.structured_content["code"] == "TIMEOUT"
        assert len(server.calls) == 1
        assert "turn budget" in result.structured_content["retry_stopped"]


async def test_full_outage_costs_at_most_about_one_attempt_per_call() -> None:
    """At 100 % transport failure the retry budget keeps attempts per logical call near 1."""
    clock = FakeClock()

    async def down(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        raise MCPError(-32603, "Server returned an error response")

    async with make_gate(clock, down, [tool("t", readonly=True)]) as (gate, server, _):
        for _ in range(500):
            await drive(clock, lambda: gate.call("s", "t"))
            clock.advance(1.0)  # one logical call a second, so the floor trickles in as in real life
        assert len(server.calls) / 500 <= 1.1


async def test_caller_cancellation_is_reraised_not_retried_not_recorded() -> None:
    """A cancelled caller stays cancelled; the gate makes no second attempt and records nothing."""
    clock = FakeClock()
    async with make_gate(clock, sleeper(1e9, clock), [tool("t", readonly=True)]) as (gate, server, _):
        with anyio.CancelScope() as scope:

            async def cancel_soon() -> None:
                await anyio.wait_all_tasks_blocked()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_soon)
                await gate.call("s", "t", timeout=60)
                raise AssertionError("call_tool returned to a cancelled caller")
        assert scope.cancelled_caught
        assert len(server.calls) == 1
        assert all(b.calls_in_window == 0 for b in gate.breaker_snapshots())
        assert gate.in_flight()["s"] == 0


async def test_operation_id_in_meta_and_argument_only_for_idempotent_tools() -> None:
    """Idempotent: one id per logical call in _meta (and the operationId argument when declared); others: none."""
    clock = FakeClock()

    async def flaky(n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        if n % 2:  # the server sheds the first attempt of each call: a retryable refusal
            body = {"ok": False, "retryable": True, "message": "busy"}
            return CallToolResult(content=[TextContent(type="text", text="busy")], structured_content=body, is_error=True)
        return ok()

    tools = [tool("idem", idempotent=True, op_arg=True), tool("read", readonly=True)]
    async with make_gate(clock, flaky, tools) as (gate, server, _):
        result = await drive(clock, lambda: gate.call("s", "idem", {"x": 1}))
        assert not result.is_error
        first, second = server.calls
        op = first.meta[OPERATION_ID_META_KEY]
        assert second.meta[OPERATION_ID_META_KEY] == op
        assert first.arguments == second.arguments == {"x": 1, "operationId": op}
        await drive(clock, lambda: gate.call("s", "read", {"x": 1}))
        assert server.calls[2].meta == {} and "operationId" not in server.calls[2].arguments


def test_toml_call_breaker_retry_and_tool_sections(tmp_path: Path) -> None:
    """`[call]`, `[breaker]`, `[retry]`, per server and per tool, layered with the environment."""
    cfg = tmp_path / "breakwater.toml"
    cfg.write_text(
        """
[call]
timeout_s = 4
[breaker]
consecutive_failures = 6
[retry]
max_attempts = 2
[servers.a]
command = "a"
[servers.a.call]
max_in_flight = 3
[servers.a.tools.create_order]
retry = "never"
timeout_s = 30
[servers.a.tools.search]
max_attempts = 5
[servers.b]
command = "b"
"""
    )
    config = load_config(cfg, environ={"BREAKWATER_CALL_MAX_S": "90"})
    a, b = config.servers
    assert (a.call.timeout_s, a.call.max_in_flight, a.call.max_s) == (4, 3, 90)
    assert a.call_explicit == frozenset({"max_in_flight"})
    assert a.breaker.consecutive_failures == 6 and b.retry.max_attempts == 2
    order, search = a.tools["create_order"], a.tools["search"]
    assert (order.call.retry, order.call.timeout_s, order.call.max_in_flight) == ("never", 30, 3)
    assert order.explicit == frozenset({"retry", "timeout_s"})
    assert (search.retry.max_attempts, search.call.timeout_s) == (5, 4)
    assert b.call_explicit == frozenset() and b.tools == {}


@pytest.mark.parametrize(
    ("body", "key", "fix"),
    [
        ("[servers.a.tools.t]\ntimeout = 3", "servers.a.tools.t.timeout", "timeout_s"),
        ("[servers.a.tools.t]\nmax_in_flight = 3", "servers.a.tools.t.max_in_flight", ""),
        ('[servers.a.tools.t]\nretry = "sometimes"', "servers.a.tools.t.retry", "safe"),
        ("[call]\ntimeout_s = -1", "call.timeout_s", "0.001"),
    ],
)
def test_tool_section_errors_name_the_key(tmp_path: Path, body: str, key: str, fix: str) -> None:
    """A wrong key or value in the new sections names the file, the key and a fix."""
    cfg = tmp_path / "breakwater.toml"
    cfg.write_text('[servers.a]\ncommand = "a"\n' + body + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg, environ={})
    assert info.value.key == key and fix in (info.value.fix or "")


def test_readme_error_table_matches_code() -> None:
    """The README's error table is `render_error_table()`."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    match = re.search(r"<!-- errors:start -->\n(.*?)<!-- errors:end -->", readme, re.S)
    assert match, "README.md lacks the <!-- errors:start --> ... <!-- errors:end --> block"
    assert match.group(1) == render_error_table()


# ---------------------------------------------------------------------------- the slow afternoon


def switchable(clock: FakeClock, latency: Callable[[], float]) -> tuple[Behaviour, dict[str, float | None]]:
    """A tool whose latency is `latency()` until `state["slow"]` is set, then that many seconds."""
    state: dict[str, float | None] = {"slow": None}

    async def behave(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        slow = state["slow"]
        await clock.sleep(latency() if slow is None else slow)
        return ok()

    return behave, state


async def test_timeout_is_not_retried_by_default_but_a_tool_may_opt_back_in() -> None:
    """A passed deadline is evidence of slowness: one attempt, and the envelope says why no second one."""
    clock = FakeClock()
    async with make_gate(clock, sleeper(1e9, clock), [tool("t", readonly=True), tool("u", readonly=True)]) as (gate, server, _):
        t0 = clock.monotonic()
        body = (await drive(clock, lambda: gate.call("s", "t", timeout=2.0))).structured_content
        assert body["code"] == "TIMEOUT" and body["attempt"] == 1 and len(server.calls) == 1
        assert clock.monotonic() - t0 == pytest.approx(2.0)
        assert "not retried" in body["retry_stopped"]
        # Per tool: `[servers.s.tools.u] retry_timeouts = true` brings the retries back for that tool only.
        per_tool = {"u": ToolSettings(call=CallPolicy(), retry=RetryPolicy(retry_timeouts=True), explicit=frozenset())}
    async with make_gate(clock, sleeper(1e9, clock), [tool("t", readonly=True), tool("u", readonly=True)], tools=per_tool) as (
        gate,
        server,
        _,
    ):
        await drive(clock, lambda: gate.call("s", "u", timeout=2.0))
        assert len(server.calls) == 3
        await drive(clock, lambda: gate.call("s", "t", timeout=2.0))
        assert len(server.calls) == 4


async def test_retries_stay_for_what_a_second_attempt_can_fix() -> None:
    """A request the server says it never ran (its session was gone, as after a restart) is still retried, timeouts
    or not, even for a tool that must never run twice. (A refused connection is the same verdict: test_classify.py.)"""
    clock = FakeClock()

    async def forgot_the_session(n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        if n == 1:
            raise MCPError(-32600, "Session terminated")
        return ok()

    async with make_gate(clock, forgot_the_session, [tool("t")]) as (gate, server, _):
        result = await drive(clock, lambda: gate.call("s", "t"))
        assert not result.is_error and len(server.calls) == 2


async def test_a_tool_that_turns_slow_is_refused_within_four_timeouts_in_light_traffic() -> None:
    """One agent meeting the tool once a turn: its learned timeout is in force within seconds of having the
    samples, no call costs more than that timeout, and the breaker refuses after two timeouts."""
    clock = FakeClock()
    rng = random.Random(3)
    behave, state = switchable(clock, lambda: rng.lognormvariate(math.log(0.02), 0.3))
    async with make_gate(clock, behave, [tool("t", readonly=True)], breaker=BreakerPolicy(), learning=JournalPolicy()) as (
        gate,
        _,
        _,
    ):

        async def afternoon() -> tuple[float, list[float], float]:
            first_learned: float | None = None
            for n in range(60):  # healthy turns, 100 ms apart
                await gate.call("s", "t")
                if first_learned is None and gate.timeout_in_force("s", "t") == (1.0, "learned"):
                    first_learned = n + 1
                await clock.sleep(0.1)
            assert first_learned == JournalPolicy().learn_min_samples  # at the 50th call, not a minute later
            assert gate.learned_at("s", "t") is not None
            timeout_s = gate.resolved_timeout("s", "t")
            assert timeout_s == 1.0  # the 1 s floor: a 20 ms tool no longer keeps the 5 s default
            state["slow"] = 20.0
            start, costs = clock.monotonic(), []
            while True:
                t = clock.monotonic()
                result = await gate.call("s", "t")
                costs.append(clock.monotonic() - t)
                assert result.structured_content is not None
                if result.structured_content["code"] == "CIRCUIT_OPEN":
                    return clock.monotonic() - start, costs, timeout_s
                await clock.sleep(0.1)

        refused_after, costs, timeout_s = await drive(clock, afternoon)
        assert max(costs) <= 1.2 * timeout_s
        assert refused_after <= 4 * timeout_s
        assert len(costs) == 3  # two timeouts, then the refusal


async def test_half_open_probe_of_a_still_slow_tool_costs_a_fraction_of_the_timeout() -> None:
    """The probe's deadline comes from the tool's healthy p99 (3 x p99, at least 0.1 s); failing, it re-opens at once."""
    clock = FakeClock()
    behave, state = switchable(clock, lambda: 0.05)
    async with make_gate(clock, behave, [tool("t", readonly=True)], breaker=BreakerPolicy(open_jitter=0.0)) as (gate, _, _):

        async def afternoon() -> tuple[dict[str, Any], float, dict[str, Any]]:
            for _ in range(30):
                await gate.call("s", "t")
            state["slow"] = 30.0
            for _ in range(2):
                await gate.call("s", "t")  # two 5 s timeouts: open
            refused = (await gate.call("s", "t")).structured_content
            assert refused is not None and refused["code"] == "CIRCUIT_OPEN"
            await clock.sleep(refused["retry_after_s"])
            t = clock.monotonic()
            probe = (await gate.call("s", "t")).structured_content
            spent = clock.monotonic() - t
            after = (await gate.call("s", "t")).structured_content
            assert probe is not None and after is not None
            return probe, spent, after

        probe, spent, after = await drive(clock, afternoon)
        assert probe["code"] == "TIMEOUT" and probe["cut_by"] == "probe deadline"
        assert spent == pytest.approx(0.15)  # 3 x the 50 ms p99, not the 5 s timeout
        assert after["code"] == "CIRCUIT_OPEN" and after["reason"] == "probe failed"
        assert after["retry_after_s"] > 9.0  # the second open lasts twice the first


async def test_probe_of_a_healed_tool_closes_the_breaker() -> None:
    clock = FakeClock()
    behave, state = switchable(clock, lambda: 0.02)
    async with make_gate(clock, behave, [tool("t", readonly=True)], breaker=BreakerPolicy(open_jitter=0.0)) as (gate, _, _):

        async def afternoon() -> CallToolResult:
            for _ in range(30):
                await gate.call("s", "t")
            state["slow"] = 30.0
            for _ in range(2):
                await gate.call("s", "t")
            state["slow"] = None
            await clock.sleep(6.0)
            return await gate.call("s", "t")

        assert not (await drive(clock, afternoon)).is_error
        assert gate.breakers.tool("s", "t").state.value == "closed"


async def test_healthy_heavy_tail_tool_never_opens_in_an_hour() -> None:
    """Log-normal latency with a heavy tail (median 100 ms, sigma 2: about 1 call in 40 passes the 5 s timeout,
    and two in a row happen within the hour): its p99 is not far below its timeout, so only the failure rules
    could open it, and over one simulated hour they never do."""
    clock = FakeClock()
    rng = random.Random(11)
    behave, _ = switchable(clock, lambda: rng.lognormvariate(math.log(0.1), 2.0))
    async with make_gate(clock, behave, [tool("t", readonly=True)], breaker=BreakerPolicy()) as (gate, _, _):

        async def hour() -> tuple[int, int, int]:
            timeouts = streak = longest = 0
            while clock.monotonic() < 3600.0:
                body = (await gate.call("s", "t")).structured_content
                assert body is not None
                assert body.get("code") not in ("CIRCUIT_OPEN", "SERVER_CIRCUIT_OPEN")
                if body.get("code") == "TIMEOUT":
                    timeouts, streak = timeouts + 1, streak + 1
                    longest = max(longest, streak)
                else:
                    streak = 0
                await clock.sleep(0.25)
            return timeouts, longest, gate.breakers.tool("s", "t").snapshot().consecutive_opens

        timeouts, longest, opens = await drive(clock, hour)
        assert timeouts > 50 and longest >= 2  # the tail is real: a naive "2 timeouts in a row" rule would have tripped
        assert opens == 0
        assert gate.breakers.tool("s", "t").state.value == "closed"


def test_status_json_says_when_a_timeout_was_learned() -> None:
    learned = ToolTimeout(server="erp", tool="tax", timeout_s=1.0, source="learned", learned_at=1_700_000_000.0)
    assert learned.to_json()["learned_at"] == "2023-11-14T22:13:20.000Z"
    report = StatusReport(timeouts=(learned, ToolTimeout(server="erp", tool="pay", timeout_s=5.0, source="default")))
    back = StatusReport.from_json(json.loads(json.dumps(report.to_json())))
    assert [t.learned_at for t in back.timeouts] == [1_700_000_000.0, None]
    assert "learned_at" not in report.to_json()["timeouts"][1]


async def test_journal_rows_say_which_attempt_opened_the_breaker_and_what_a_refusal_met() -> None:
    """The attempt whose failure trips the tool breaker is the one row marked `breaker_opened`; the call
    refused next is a `circuit_open` row naming both breakers' states, and nothing more reached the tool."""
    clock = FakeClock()

    async def failing(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="boom")], is_error=True)

    rows = AttemptRows()
    breaker = BreakerPolicy(consecutive_failures=2, failure_rate=1.0)
    async with make_gate(clock, failing, [tool("t", readonly=True)], breaker=breaker) as (_, server, upstream):
        gate = CallGate({"s": upstream}, clock=clock, rng=random.Random(1), observer=rows)

        async def three_calls() -> list[Any]:
            return [(await gate.call("s", "t")).structured_content for _ in range(3)]

        answers = await drive(clock, three_calls)
    assert [a["code"] for a in answers] == ["TOOL_ERROR", "TOOL_ERROR", "CIRCUIT_OPEN"]
    assert len(server.calls) == 2
    seen = [(r.outcome, r.error_code, r.server_breaker, r.tool_breaker, r.breaker_opened, r.attempt) for r in rows.rows]
    assert seen == [
        ("tool_error", "TOOL_ERROR", "closed", "closed", False, 1),
        ("tool_error", "TOOL_ERROR", "closed", "open", True, 1),
        ("circuit_open", "CIRCUIT_OPEN", "closed", "open", False, 1),
    ]
    assert all(type(r.server_breaker) is str and type(r.error_code) is str for r in rows.rows)
    # Every field set (the gate builds the rows field by field): a slot left out would raise here.
    assert [len(dataclasses.asdict(r)) for r in rows.rows] == [len(dataclasses.fields(AttemptRecord))] * 3


async def test_an_open_breaker_refuses_a_call_before_its_arguments_are_checked() -> None:
    """A call an open breaker refuses gets that refusal even when its arguments do not fit: the same envelope
    and journal row as a call whose arguments fit (the model's next step is the same: another tool, or later).
    Once the breaker would let a probe through, the arguments are checked first again: the wrong call is
    INVALID_ARGUMENTS and takes no probe slot, so the next right call is the probe that closes the breaker."""
    clock = FakeClock()
    typed = Tool(
        name="t",
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        annotations=ToolAnnotations(read_only_hint=True),
    )
    healthy = {"now": False}

    async def behave(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        return ok() if healthy["now"] else CallToolResult(content=[TextContent(type="text", text="boom")], is_error=True)

    rows = AttemptRows()
    breaker = BreakerPolicy(consecutive_failures=1, failure_rate=1.0, open_base_s=10.0, open_jitter=0.0)
    async with make_gate(clock, behave, [typed], breaker=breaker) as (_, server, upstream):
        gate = CallGate({"s": upstream}, clock=clock, rng=random.Random(1), observer=rows)

        async def story() -> list[dict[str, Any]]:
            seen = [await gate.call("s", "t", {"n": 1})]  # fails: the tool's breaker opens
            seen += [await gate.call("s", "t", {"n": "one"}), await gate.call("s", "t", {"n": 1})]
            with pytest.raises(CircuitOpenError):
                await gate.call_or_raise("s", "t", {})
            await clock.sleep(10.0)  # due for a probe
            seen.append(await gate.call("s", "t", {"n": "one"}))
            assert not gate.breakers.tool("s", "t").snapshot().probe_in_flight
            healthy["now"] = True
            seen.append(await gate.call("s", "t", {"n": 1}))  # the probe
            gate.breakers.server("s").trip("tripped by the test")
            seen.append(await gate.call("s", "t", {"n": "one"}))
            return [r.structured_content or {} for r in seen]

        first, wrong, right, wrong_late, probe, wrong_server = await drive(clock, story)
    assert (first["code"], wrong["code"], wrong_late["code"], wrong_server["code"]) == (
        "TOOL_ERROR",
        "CIRCUIT_OPEN",
        "INVALID_ARGUMENTS",
        "SERVER_CIRCUIT_OPEN",
    )
    assert wrong == right and "field" not in wrong  # byte for byte the refusal of a right call
    assert probe == {"ok": True} and gate.breakers.tool("s", "t").state.value == "closed"
    assert len(server.calls) == 2  # the first call and the probe
    refused = [(r.outcome, r.error_code, r.server_breaker, r.tool_breaker, r.attempt) for r in rows.rows[1:4]]
    assert refused == [("circuit_open", "CIRCUIT_OPEN", "closed", "open", 1)] * 3


class Spans:
    """A tracer that keeps what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def call_started(self, server: str, tool: str, operation_id: str | None) -> int:
        self.events.append(("started", server, tool, operation_id))
        return len(self.events)

    def call_finished(self, handle: Any, error: BaseException | None) -> None:
        self.events.append(("finished", handle, type(error), None if error is None else str(error)))


@pytest.mark.parametrize("which", ["tool", "server"])
@pytest.mark.parametrize("idempotent", [False, True])
async def test_an_open_breakers_refusal_returned_at_once_is_the_one_raised_through_the_loop(which: str, idempotent: bool) -> None:
    """A call the breakers refuse is answered without raising through the attempt loop (the cheap path); under
    a turn budget (checked first) the refusal is raised through the loop. Both give the same envelope, the
    same journal row and the same trace events, whichever breaker refused and whether the call carries an
    operation id."""
    clock = FakeClock()

    async def failing(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="boom")], is_error=True)

    rows, spans = AttemptRows(), Spans()
    breaker = BreakerPolicy(consecutive_failures=1, failure_rate=1.0, open_base_s=60.0, open_jitter=0.0)
    listed = [tool("t", readonly=not idempotent, idempotent=idempotent)]
    async with make_gate(clock, failing, listed, breaker=breaker) as (_, _server, upstream):
        gate = CallGate({"s": upstream}, clock=clock, rng=random.Random(1), observer=rows, tracer=spans)

        async def story() -> tuple[CallToolResult, CallToolResult]:
            if which == "tool":
                await gate.call("s", "t", {})  # fails: the tool's breaker opens
            else:
                gate.breakers.server("s").trip("tripped by the test")
            del rows.rows[:], spans.events[:]
            returned = await gate.call("s", "t", {}, operation_id="op-1")
            try:
                # A turn budget is checked before the breakers: the refusal then comes through the loop.
                with turn_budget(1000.0, clock=clock):
                    await gate.call_or_raise("s", "t", {}, operation_id="op-1")
            except CircuitOpenError as err:
                raised = error_result(err)
            except ServerCircuitOpenError as err:
                raised = error_result(err)
            return returned, raised

        returned, raised = await drive(clock, story)
    code = "CIRCUIT_OPEN" if which == "tool" else "SERVER_CIRCUIT_OPEN"
    assert returned.structured_content is not None and returned.structured_content["code"] == code
    # Nothing was sent under the caller's id: a refusal names no operation (tests/gate/test_error_texts.py).
    assert returned.structured_content["operation_id"] is None
    assert returned.model_dump_json(by_alias=True) == raised.model_dump_json(by_alias=True)
    assert returned == raised
    first, second = (dataclasses.asdict(r) for r in rows.rows)
    assert first.pop("call_id") != second.pop("call_id")
    assert first.pop("trace_id") != second.pop("trace_id")
    assert first == second and first["outcome"] == "circuit_open"
    # The same events, each finish naming its own start.
    assert [spans.events[0], spans.events[2]] == [("started", "s", "t", "op-1" if idempotent else None)] * 2
    assert (spans.events[1][1], spans.events[3][1]) == (1, 3)
    assert spans.events[1][2:] == spans.events[3][2:] and spans.events[1][2] is not type(None)


async def shed(_n: int, _a: dict[str, Any], _m: Any, _p: Any) -> CallToolResult:
    """A tool that turns every call away with an error it marks retryable."""
    busy = TextContent(type="text", text="busy, try again")
    return CallToolResult(content=[busy], structured_content={"retryable": True}, is_error=True)


async def test_a_retry_the_breaker_refuses_gives_its_retry_budget_token_back() -> None:
    """A burst of failures: each call's retry took a token, then the breaker its first attempts opened refused it, so
    no retry was sent; the bucket stayed spent all the same (refilled at 3 a minute), and the calls after it were told
    "the server's retry budget is spent", true of no retry that ever went out."""
    clock = FakeClock()

    breaker = BreakerPolicy(consecutive_failures=4, failure_rate=1.0, open_base_s=60.0, open_jitter=0.0)
    async with make_gate(clock, shed, [tool("t", readonly=True)], breaker=breaker) as (gate, server, _):

        async def burst() -> list[dict[str, Any]]:
            answers: list[dict[str, Any]] = []

            async def one() -> None:
                answers.append((await gate.call("s", "t")).structured_content or {})

            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(one)
            return answers

        answers = await drive(clock, burst)
        budget = gate.retry_budget_snapshots()["s"]
    retries_sent = len(server.calls) - 12
    assert budget.retries_granted == retries_sent, (budget, retries_sent)
    assert budget.tokens == RetryPolicy().budget_max_tokens, budget  # every token of a retry never sent came back
    assert len(answers) == 12


async def test_a_retry_the_breaker_refuses_reports_the_attempt_that_ran() -> None:
    """The attempt that failed opened the breaker, and the retry it refused answered CIRCUIT_OPEN, "nothing was sent":
    a model told nothing ran may repeat a call that did. The attempt's own answer is reported, and why no retry came."""
    clock = FakeClock()

    breaker = BreakerPolicy(consecutive_failures=1, failure_rate=1.0, open_base_s=60.0, open_jitter=0.0)
    async with make_gate(clock, shed, [tool("t", idempotent=True)], breaker=breaker) as (gate, server, _):
        answer = (await drive(clock, lambda: gate.call("s", "t"))).structured_content
    assert len(server.calls) == 1  # the breaker refused the retry
    assert answer["code"] == "TOOL_ERROR" and answer["attempt"] == 1, answer
    assert answer["retry_stopped"] == "no further attempt: CIRCUIT_OPEN"


async def test_a_callers_turn_budget_cut_opens_no_breaker_and_says_not_to_retry_this_turn() -> None:
    """A client's tight budgets cut healthy calls: the server's breaker opened for every session of a shared gateway,
    and the model was told the tool "is answering slowly right now" and that a retry might help."""
    clock = FakeClock()
    breaker = BreakerPolicy(consecutive_failures=2, failure_rate=1.0, open_base_s=60.0, open_jitter=0.0)
    tools = [tool("slowish", readonly=True), tool("other", readonly=True)]
    async with make_gate(clock, sleeper(0.5, clock), tools, breaker=breaker, call=CallPolicy(timeout_s=10.0)) as (gate, _, _):

        async def tight() -> CallToolResult:
            with turn_budget(0.3, clock=clock):
                result = await gate.call("s", "slowish")
            return result

        cuts = [(await drive(clock, tight)).structured_content for _ in range(4)]
        healthy = await drive(clock, lambda: gate.call("s", "other"))
    assert all(c["code"] == "TIMEOUT" and c["cut_by"] == "turn budget" and c["retryable"] is False for c in cuts), cuts
    assert not healthy.is_error, healthy.structured_content  # no breaker heard of the budget's cuts
    text = error_result(CallTimeoutError(detail={"cut_by": "turn budget"})).content[0].text  # type: ignore[union-attr]
    assert "Do not retry in this turn" in text and "answering slowly" not in text


async def test_a_tool_slow_at_its_learned_timeout_is_refused_after_two_cuts_even_after_a_restart() -> None:
    """A fresh gate (a restarted `serve`) knows the tool's learned timeout from the journal but no p99 of its own: the
    tool stuck at 20 s was waited for to its timeout call after call (5.4, 8.2, 8.2 s), the breaker still closed 40 s
    on. Two cuts in a row at a learned timeout are slowness (it is the tail times the headroom): the third is refused."""
    clock = FakeClock()
    behave, state = switchable(clock, lambda: 0.2)
    state["slow"] = 20.0
    breaker = BreakerPolicy(open_jitter=0.0)
    async with make_gate(clock, behave, [tool("t", readonly=True)], learned=1.0, breaker=breaker) as (gate, server, _):

        async def afternoon() -> list[tuple[str | None, float]]:
            seen = []
            for _ in range(3):
                t = clock.monotonic()
                body = (await gate.call("s", "t")).structured_content or {}
                seen.append((body.get("code"), round(clock.monotonic() - t, 3)))
            return seen

        seen = await drive(clock, afternoon)
    assert gate.timeout_in_force("s", "t") == (1.0, "learned")
    assert seen == [("TIMEOUT", 1.0), ("TIMEOUT", 1.0), ("CIRCUIT_OPEN", 0.0)]
    assert len(server.calls) == 2
    snap = gate.breakers.tool("s", "t").snapshot()
    assert snap.state.value == "open" and snap.reason == "2 timeouts in a row; its timeout is learned from its history"


async def test_a_timeout_the_caller_passed_or_the_default_keeps_the_p99_guard() -> None:
    """Without a learned timeout (nor a known p99 far below it) two timeouts in a row trip nothing: only a learned
    timeout is evidence by itself (`test_healthy_heavy_tail_tool_never_opens_in_an_hour` holds the tail's side)."""
    clock = FakeClock()
    behave, state = switchable(clock, lambda: 0.2)
    state["slow"] = 20.0
    async with make_gate(clock, behave, [tool("t", readonly=True)], breaker=BreakerPolicy()) as (gate, server, _):

        async def three() -> list[str | None]:
            return [((await gate.call("s", "t", timeout=1.0)).structured_content or {}).get("code") for _ in range(3)]

        codes = await drive(clock, three)
    assert codes == ["TIMEOUT"] * 3 and len(server.calls) == 3


async def test_a_turn_budgets_cut_is_journaled_as_the_callers_cancel_not_a_timeout_of_the_tool() -> None:
    """`stats` read a healthy 8 s tool's turn-budget cuts as its timeouts (25 %), and learning took them as samples."""
    clock = FakeClock()
    rows = AttemptRows()
    async with make_gate(clock, sleeper(0.5, clock), [tool("t", readonly=True)], call=CallPolicy(timeout_s=10.0)) as (
        _,
        _,
        upstream,
    ):
        gate = CallGate({"s": upstream}, clock=clock, rng=random.Random(1), observer=rows)

        async def tight() -> CallToolResult:
            with turn_budget(0.3, clock=clock):
                result = await gate.call("s", "t")
            return result

        cut = (await drive(clock, tight)).structured_content or {}
    assert cut["code"] == "TIMEOUT" and cut["cut_by"] == "turn budget"
    assert [(r.outcome, r.error_code) for r in rows.rows] == [("cancelled", "TIMEOUT")]


async def test_an_operation_id_the_model_repeats_as_an_argument_goes_in_meta_for_a_tool_that_declares_none() -> None:
    """An OUTCOME_UNKNOWN's text tells the model to repeat the call with the same operationId: for a tool whose schema
    has no such argument (a strict one: no other properties) the id was checked as an argument and refused
    INVALID_ARGUMENTS. It is the operation's: sent in `_meta`, not to the tool."""
    clock = FakeClock()
    strict = {"type": "object", "properties": {"amount": {"type": "number"}}, "additionalProperties": False}
    charge = Tool(name="charge", input_schema=strict, annotations=ToolAnnotations(destructive_hint=True))
    async with make_gate(clock, sleeper(0.01, clock), [charge]) as (gate, server, _):
        result = await drive(clock, lambda: gate.call("s", "charge", {"amount": 5, "operationId": "op-7"}))
    assert not result.is_error, result.structured_content
    (sent,) = server.calls
    assert sent.arguments == {"amount": 5} and sent.meta[OPERATION_ID_META_KEY] == "op-7"
