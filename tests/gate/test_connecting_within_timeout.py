"""A call to a server still connecting waits for it within the call's own timeout: the wait and the attempt together.

A user saw the first call after `breakwater serve` restarted wait 5.36 s on a 4.07 s learned timeout: 1.3 s for the
connection, then the whole timeout for the attempt. Here the server's connection starts after exactly 1.3 s (the
startup jitter, its random draw pinned), on the fake clock; the upstream, its SDK session and the calls are real.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from breakwater.config import BreakerPolicy, CallPolicy, ConnectPolicy, ServerSpec
from breakwater.errors import ErrorCode
from breakwater.gate._gate import CallGate
from breakwater.status import ServerState
from breakwater.testing import FakeClock, Progress, ScriptedCall, ScriptedServer
from helpers import connected_upstream, timed_gate_call

pytestmark = pytest.mark.anyio

CONNECT_S = 1.3
LEARNED_S = 4.07


class _PinnedJitter(random.Random):
    """Draws a uniform's upper end: the startup jitter is then exactly `startup_jitter_s`."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _tool() -> Tool:
    return Tool(name="t", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))


@asynccontextmanager
async def _starting_gate(
    clock: FakeClock, answer_after_s: float, *, learned: float | None = LEARNED_S, **spec_kw: Any
) -> AsyncIterator[tuple[CallGate, ScriptedServer]]:
    """A gate whose one server is `pending` for CONNECT_S before it connects; its tool answers after `answer_after_s`."""

    async def answer(_call: ScriptedCall, _n: int, _progress: Progress) -> CallToolResult:
        await clock.sleep(answer_after_s)
        return CallToolResult(content=[TextContent(type="text", text="done")])

    spec_kw.setdefault("breaker", BreakerPolicy(consecutive_failures=1000, failure_rate=1.0))
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command="unused",
        connect=ConnectPolicy(startup_jitter_s=CONNECT_S, health_interval_s=0),
        **spec_kw,
    )
    server = ScriptedServer([_tool()], answer)
    rng = _PinnedJitter(1)
    async with connected_upstream(spec, server, clock=clock, rng=rng, ready=False) as upstream:
        assert upstream.state is not ServerState.READY
        yield CallGate({"s": upstream}, clock=clock, rng=rng, learned_timeout=lambda _s, _t: learned), server


async def test_a_call_that_waited_for_the_connection_ends_within_its_learned_timeout() -> None:
    """The user's case: 1.3 s of connecting, then a tool that does not answer; the call ends at 4.07 s, not 5.37 s."""
    clock = FakeClock()
    async with _starting_gate(clock, answer_after_s=1e6) as (gate, server):
        result, took = await timed_gate_call(clock, gate)
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["code"] == ErrorCode.TIMEOUT.value
    assert len(server.calls) == 1  # the attempt was sent once the server was ready
    assert took == pytest.approx(LEARNED_S, abs=0.01)


async def test_the_callers_own_timeout_covers_the_wait_too() -> None:
    """A caller's 3 s timeout: 1.3 s of it connecting leaves the attempt 1.7 s, and a 2 s tool is cut at 3 s in all."""
    clock = FakeClock()
    async with _starting_gate(clock, answer_after_s=2.0) as (gate, _):
        result, took = await timed_gate_call(clock, gate, timeout=3.0)
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["code"] == ErrorCode.TIMEOUT.value
    assert took == pytest.approx(3.0, abs=0.01)


async def test_a_tool_that_answers_within_what_is_left_is_answered() -> None:
    """What the wait leaves is the attempt's: a 1 s tool after a 1.3 s connect, within 4.07 s, answers."""
    clock = FakeClock()
    async with _starting_gate(clock, answer_after_s=1.0) as (gate, _):
        result, took = await timed_gate_call(clock, gate)
    assert not result.is_error, result
    assert took == pytest.approx(CONNECT_S + 1.0, abs=0.01)


async def test_the_attempt_still_gets_its_minimum_when_the_wait_took_nearly_all() -> None:
    """A 1.4 s timeout, 1.3 s of it connecting: the attempt gets `min_attempt_s` (0.25 s), not the 0.1 s left."""
    clock = FakeClock()
    call = CallPolicy(min_attempt_s=0.25)
    async with _starting_gate(clock, answer_after_s=1e6, call=call) as (gate, server):
        result, took = await timed_gate_call(clock, gate, timeout=1.4)
    assert result.is_error and len(server.calls) == 1
    assert took == pytest.approx(CONNECT_S + 0.25, abs=0.01)


async def test_the_wait_itself_is_bounded_by_the_learned_timeout() -> None:
    """A learned 1 s timeout (shorter than the 5 s configured default): a server 1.3 s from connecting is not waited
    for past the call's own timeout; the answer is SERVER_CONNECTING at 1 s, and nothing was sent."""
    clock = FakeClock()
    async with _starting_gate(clock, answer_after_s=0.0, learned=1.0) as (gate, server):
        result, took = await timed_gate_call(clock, gate)
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["code"] == ErrorCode.SERVER_CONNECTING.value
    assert took == pytest.approx(1.0, abs=0.01) and server.calls == []
