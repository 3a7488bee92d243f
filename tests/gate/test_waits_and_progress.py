"""What a call waits for counts against its time, and a tool known to report progress is not cut before its first report.

A retry after a lost connection waited up to a whole timeout for the reconnect, then gave the attempt another whole
timeout; a timeout shortened by such a wait said "no answer within 2.91 s" of a 6 s timeout, and not why; a tool that
reports progress every 1.5 s was cut by its learned 1 s timeout before its first report, call after call. The upstream,
its SDK session, the lost connection and the reconnect are real (the transport seam is in-memory); only the clock and
the random draws are fakes.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from breakwater.config import BreakerPolicy, CallPolicy, ConnectPolicy, RetryPolicy, ServerSpec
from breakwater.connect._admission import Admission
from breakwater.connect._upstream import Upstream
from breakwater.errors import ErrorCode
from breakwater.gate._gate import CallGate
from breakwater.gate._health import PROGRESS_FORGOTTEN_AFTER
from breakwater.status import ServerState
from breakwater.testing import FakeClock, Progress, ScriptedCall, ScriptedServer, in_memory
from helpers import timed_gate_call

pytestmark = pytest.mark.anyio

Handler = Callable[[ScriptedCall, int, Progress], Awaitable[CallToolResult]]


class _PinnedJitter(random.Random):
    """Draws a uniform's upper end: the startup jitter is then exactly `startup_jitter_s`."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _ok() -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text="done")])


@asynccontextmanager
async def _gate(
    clock: FakeClock,
    handler: Handler,
    *,
    learned: float | None = None,
    first_connect_s: float = 0.0,
    reconnect_s: float = 0.0,
    **spec_kw: Any,
) -> AsyncIterator[tuple[CallGate, ScriptedServer, Upstream]]:
    """A gate over one real upstream whose first connection starts after `first_connect_s` and each later one takes
    `reconnect_s` (a server restarting); its read-only tool `t` is answered by `handler`."""
    spec_kw.setdefault("breaker", BreakerPolicy(consecutive_failures=1000, failure_rate=1.0))
    connect = ConnectPolicy(startup_jitter_s=first_connect_s, health_interval_s=0)
    spec = ServerSpec(name="s", transport="stdio", command="unused", connect=connect, **spec_kw)
    tool = Tool(name="t", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))
    server = ScriptedServer([tool], handler)
    memory = in_memory(server.server)
    connects = 0

    async def transports(spec: ServerSpec, stack: AsyncExitStack, *, report_lost: Callable[[], None]) -> Any:
        nonlocal connects
        connects += 1
        if connects > 1:
            await clock.sleep(reconnect_s)  # the server's restart
        return await memory(spec, stack, report_lost=report_lost)

    rng = _PinnedJitter(1)
    upstream = Upstream(
        spec, clock=clock, rng=rng, admission=Admission(clock=clock, rng=rng, directory=None), transports=transports
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        if not first_connect_s:

            async def until_ready() -> None:
                while upstream.state is not ServerState.READY:
                    await upstream.wait_changed()

            with anyio.fail_after(20):  # real seconds: the connect runs on virtual time
                await clock.run(until_ready)
        yield CallGate({"s": upstream}, clock=clock, rng=rng, learned_timeout=lambda _s, _t: learned), server, upstream
        tg.cancel_scope.cancel()


async def test_a_retry_that_waited_for_the_reconnect_ends_within_the_calls_timeout() -> None:
    """The connection is lost 0.5 s into the first attempt and the server takes 3 s to come back; the retry's wait and
    its attempt share the 6 s timeout: the hanging retry is cut 6 s after it began waiting, not 9 s."""
    clock = FakeClock()
    box: dict[str, Any] = {}

    async def handler(_call: ScriptedCall, n: int, _progress: Progress) -> CallToolResult:
        if n == 1:
            await clock.sleep(0.5)
            box["lost_at"] = clock.monotonic()
            box["upstream"].report_lost()  # the connection dies under the call (a crash, a session forgotten)
        box["sent_at"] = clock.monotonic()
        await clock.sleep(1e6)
        return _ok()

    retry = RetryPolicy(max_attempts=2, backoff_base_s=0.001, backoff_cap_s=0.001)
    async with _gate(clock, handler, reconnect_s=3.0, retry=retry) as (gate, server, upstream):
        box["upstream"] = upstream
        result, took = await timed_gate_call(clock, gate, timeout=6.0)
    body = result.structured_content
    assert result.is_error and body is not None, result
    assert body["code"] == ErrorCode.TIMEOUT.value and body["attempt"] == 2 and len(server.calls) == 2, body
    waited = box["sent_at"] - box["lost_at"]
    assert waited == pytest.approx(3.0, abs=0.01)  # the reconnect, waited for before the retry was sent
    assert took - 0.5 == pytest.approx(6.0, abs=0.01), (took, waited)
    # The wait is named, so the 3 s the attempt had is not a mystery.
    assert body["waited_for_server_s"] == pytest.approx(3.0, abs=0.01)


async def test_a_timeout_shortened_by_the_wait_for_the_server_says_so() -> None:
    """A caller's 6 s timeout, 3.1 s of it spent waiting for the server to connect: the cut names the wait."""
    clock = FakeClock()

    async def hangs(_call: ScriptedCall, _n: int, _progress: Progress) -> CallToolResult:
        await clock.sleep(1e6)
        return _ok()

    async with _gate(clock, hangs, first_connect_s=3.1) as (gate, _, _):
        result, took = await timed_gate_call(clock, gate, timeout=6.0)
    body = result.structured_content
    assert result.is_error and body is not None and body["code"] == ErrorCode.TIMEOUT.value, result
    assert took == pytest.approx(6.0, abs=0.01)
    assert body["timeout_s"] == pytest.approx(2.9, abs=0.01)
    assert body["waited_for_server_s"] == pytest.approx(3.1, abs=0.01)
    text = result.content[0].text  # type: ignore[union-attr]
    assert "no answer within 2.9 s" in text and "of its 6 s timeout after waiting 3.1 s for the server to connect" in text


async def test_a_timeout_with_no_wait_before_it_says_nothing_of_one() -> None:
    """A ready server's call: no `waited_for_server_s`, and the text is the plain one."""
    clock = FakeClock()

    async def hangs(_call: ScriptedCall, _n: int, _progress: Progress) -> CallToolResult:
        await clock.sleep(1e6)
        return _ok()

    async with _gate(clock, hangs) as (gate, _, _):
        result, _took = await timed_gate_call(clock, gate, timeout=2.0)
    body = result.structured_content
    assert body is not None and body["code"] == ErrorCode.TIMEOUT.value and "waited_for_server_s" not in body
    assert "for the server to connect" not in result.content[0].text  # type: ignore[union-attr]


def _reports_every(clock: FakeClock, gap_s: float, reports: int) -> Handler:
    async def handler(_call: ScriptedCall, _n: int, progress: Progress) -> CallToolResult:
        for i in range(reports):
            await clock.sleep(gap_s)
            await progress(float(i + 1), float(reports), None)
        return _ok()

    return handler


async def test_a_tool_known_to_report_progress_is_not_cut_before_its_first_report() -> None:
    """A tool reporting every 1.5 s, learned timeout 1 s, `idle_timeout_s` 2 s: once it has reported progress (a call
    with the caller's own 10 s timeout), its next call waits the idle gap for a first report and is answered at 4.5 s."""
    clock = FakeClock()
    call = CallPolicy(idle_timeout_s=2.0, max_s=60.0)
    async with _gate(clock, _reports_every(clock, 1.5, 3), learned=1.0, call=call) as (gate, server, _):
        cut, _took = await timed_gate_call(clock, gate)  # nothing known of it yet: its learned timeout cuts it
        assert cut.is_error and cut.structured_content is not None
        assert cut.structured_content["code"] == ErrorCode.TIMEOUT.value
        first, _took = await timed_gate_call(clock, gate, timeout=10.0)
        assert not first.is_error, first
        result, took = await timed_gate_call(clock, gate)
    assert not result.is_error, result
    assert took == pytest.approx(4.5, abs=0.01) and len(server.calls) == 3


async def test_without_an_idle_timeout_the_first_wait_is_the_configured_timeout() -> None:
    """No `idle_timeout_s`: a tool known to report progress gets `[call] timeout_s` (3 s) for its first report and
    between reports, not the learned 1 s; one silent for longer is still cut."""
    clock = FakeClock()
    call = CallPolicy(timeout_s=3.0, max_s=60.0)
    async with _gate(clock, _reports_every(clock, 2.5, 2), learned=1.0, call=call) as (gate, _, _):
        first, _took = await timed_gate_call(clock, gate, timeout=10.0)
        assert not first.is_error, first
        result, took = await timed_gate_call(clock, gate)
        assert not result.is_error, result
        assert took == pytest.approx(5.0, abs=0.01)
    async with _gate(clock, _reports_every(clock, 3.5, 2), learned=1.0, call=call) as (gate, _, _):
        await timed_gate_call(clock, gate, timeout=10.0)
        slow, took = await timed_gate_call(clock, gate)
    assert slow.is_error and took == pytest.approx(3.0, abs=0.01)


async def test_a_callers_own_timeout_is_kept_for_a_tool_that_reports_progress() -> None:
    """The caller's 1 s is the caller's: a tool known to report progress is still cut at it before its first report."""
    clock = FakeClock()
    call = CallPolicy(idle_timeout_s=2.0, max_s=60.0)
    async with _gate(clock, _reports_every(clock, 1.5, 3), learned=1.0, call=call) as (gate, _, _):
        await timed_gate_call(clock, gate, timeout=10.0)
        result, took = await timed_gate_call(clock, gate, timeout=1.0)
    assert result.is_error and took == pytest.approx(1.0, abs=0.01)


async def test_a_tool_that_stopped_reporting_progress_is_cut_at_its_learned_timeout_again() -> None:
    """A tool that reported progress once (a long export in the morning), then answered quickly without a report
    `PROGRESS_FORGOTTEN_AFTER` times in a row, is cut at its learned 1 s again when it hangs (the afternoon), not after
    the idle gap (2 s here, a minute by default) on every call; one quiet answer fewer and it still gets the idle gap."""
    hangs_from: list[int] = []

    def handler(clock: FakeClock) -> Handler:
        reports = _reports_every(clock, 1.5, 2)

        async def handle(call: ScriptedCall, n: int, progress: Progress) -> CallToolResult:
            if n == 1:  # its calls are counted from 1
                return await reports(call, n, progress)
            if hangs_from and n >= hangs_from[0]:
                await clock.sleep(30.0)
            return _ok()

        return handle

    policy = CallPolicy(idle_timeout_s=2.0, max_s=60.0)
    for quiet, cut_at in ((PROGRESS_FORGOTTEN_AFTER, 1.0), (PROGRESS_FORGOTTEN_AFTER - 1, 2.0)):
        clock = FakeClock()
        hangs_from[:] = [quiet + 2]
        async with _gate(clock, handler(clock), learned=1.0, call=policy) as (gate, server, _):
            first, _took = await timed_gate_call(clock, gate, timeout=10.0)  # it reports progress: known to report
            assert not first.is_error, first
            for _ in range(quiet):
                answered, _took = await timed_gate_call(clock, gate)
                assert not answered.is_error, answered
            hung, took = await timed_gate_call(clock, gate)
        assert hung.is_error and hung.structured_content is not None
        assert hung.structured_content["code"] == ErrorCode.TIMEOUT.value
        assert took == pytest.approx(cut_at, abs=0.01), (quiet, took)
        assert len(server.calls) == quiet + 2
