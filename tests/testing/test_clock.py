"""`breakwater.testing.FakeClock` is itself under test: every fake-clock test in the suite trusts it.

Each test states what real time would do (who wakes first, when a deadline fires, what a moved
deadline means) and checks that virtual time does the same, exactly.
"""

from __future__ import annotations

import math

import anyio
import pytest

from breakwater import SystemClock
from breakwater.testing import FakeClock

pytestmark = pytest.mark.anyio


async def test_sleepers_wake_in_the_order_of_their_wake_times() -> None:
    """Three tasks asleep for 3, 1 and 2 s wake at 1, 2, 3 s: the sleep lengths decide, not the start order."""
    clock = FakeClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    async with anyio.create_task_group() as tg:
        for name, seconds in (("three", 3.0), ("one", 1.0), ("two", 2.0)):
            tg.start_soon(nap, name, seconds)
        await clock.wait_for_sleepers(3)
        assert clock.sleepers == [101.0, 102.0, 103.0]
        while clock.sleepers:
            await clock.step()
        await anyio.wait_all_tasks_blocked()
    assert woke == [("one", 101.0), ("two", 102.0), ("three", 103.0)]


async def test_advance_wakes_only_what_became_due_and_moves_wall_time_too() -> None:
    clock = FakeClock(start=0.0, wall_start=1_800_000_000.0)
    done = anyio.Event()

    async def nap() -> None:
        await clock.sleep(5)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(nap)
        await clock.wait_for_sleepers(1)
        clock.advance(4.999)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set() and clock.sleepers == [5.0]
        clock.advance(0.001)
        await done.wait()
    assert clock.monotonic() == pytest.approx(5.0)
    assert clock.time() == pytest.approx(1_800_000_005.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    clock.advance_to(1.0)  # in the past: no-op
    assert clock.monotonic() == pytest.approx(5.0)


async def test_sleep_zero_is_a_checkpoint_not_a_sleeper() -> None:
    clock = FakeClock()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await clock.sleep(0)  # a checkpoint: the pending cancellation is delivered here
        pytest.fail("sleep(0) did not checkpoint")
    assert scope.cancelled_caught and clock.sleepers == []


async def test_run_jumps_time_whenever_every_task_is_blocked() -> None:
    """An hour of backoff runs at once, and concurrent sleeps still interleave as in real time."""
    clock = FakeClock(start=0.0)
    order: list[tuple[str, float]] = []

    async def worker(name: str, step: float, count: int) -> None:
        for _ in range(count):
            await clock.sleep(step)
            order.append((name, clock.monotonic()))

    async def body() -> float:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker, "slow", 1500.0, 2)
            tg.start_soon(worker, "fast", 1000.0, 3)
        return clock.monotonic()

    with anyio.fail_after(5):  # real seconds: an hour of virtual time must not take real time
        ended = await clock.run(body)
    assert ended == 3000.0
    assert order == [("fast", 1000.0), ("slow", 1500.0), ("fast", 2000.0), ("slow", 3000.0), ("fast", 3000.0)]


async def test_run_refuses_to_wait_forever_when_nothing_is_scheduled() -> None:
    """A deadlock under the fake clock is reported, not hung on."""
    clock = FakeClock()
    never = anyio.Event()
    with pytest.raises(BaseExceptionGroup) as caught:
        await clock.run(never.wait)
    assert caught.group_contains(RuntimeError, match="nothing is scheduled")

    async def lifted_deadline() -> None:
        with clock.deadline_scope(math.inf):  # never due: not a reason to jump time to infinity
            await never.wait()

    with pytest.raises(BaseExceptionGroup) as caught:
        await clock.run(lifted_deadline)
    assert caught.group_contains(RuntimeError, match="nothing is scheduled")
    assert clock.monotonic() == 1_000.0


async def test_deadline_scope_fires_at_its_deadline_exactly() -> None:
    clock = FakeClock(start=10.0)

    async def body() -> tuple[bool, float]:
        with clock.deadline_scope(clock.monotonic() + 5) as scope:
            await clock.sleep(60)
        return scope.cancelled_caught, clock.monotonic()

    assert await clock.run(body) == (True, 15.0)


async def test_deadline_scope_that_is_not_reached_does_not_fire() -> None:
    clock = FakeClock(start=10.0)

    async def body() -> tuple[bool, float]:
        with clock.deadline_scope(clock.monotonic() + 5) as scope:
            await clock.sleep(4)
        return scope.cancelled_caught, clock.monotonic()

    assert await clock.run(body) == (False, 14.0)


async def test_deadline_in_the_past_cancels_at_the_first_checkpoint() -> None:
    clock = FakeClock(start=10.0)
    with clock.deadline_scope(9.0) as scope:
        await anyio.lowlevel.checkpoint()
        pytest.fail("a past deadline did not cancel")
    assert scope.cancelled_caught and clock.monotonic() == 10.0


async def test_a_deadline_pushed_out_while_active_fires_at_the_new_time() -> None:
    """Progress-aware timeouts move the deadline out; the scope follows the latest value."""
    clock = FakeClock(start=0.0)

    async def body() -> tuple[bool, float]:
        with clock.deadline_scope(5.0) as scope:
            await clock.sleep(3)
            scope.deadline = 8.0  # progress at t=3 buys time until t=8
            await clock.sleep(60)
        return scope.cancelled_caught, clock.monotonic()

    assert await clock.run(body) == (True, 8.0)


async def test_a_deadline_pulled_into_the_past_fires_at_once_and_infinity_never_fires() -> None:
    clock = FakeClock(start=0.0)

    async def pulled() -> tuple[bool, float]:
        with clock.deadline_scope(100.0) as scope:
            await clock.sleep(2)
            scope.deadline = 1.0
            await clock.sleep(60)
        return scope.cancelled_caught, clock.monotonic()

    async def lifted() -> tuple[bool, float]:
        with clock.deadline_scope(clock.monotonic() + 1) as scope:
            scope.deadline = math.inf  # a connection that got to ready lifts its attempt deadline
            await clock.sleep(1000)
        return scope.cancelled_caught, clock.monotonic()

    assert await clock.run(pulled) == (True, 2.0)
    assert await clock.run(lifted) == (False, 1002.0)


async def test_wait_for_sleepers_gives_up_in_real_time() -> None:
    """A test waiting for code that never parks fails quickly instead of hanging."""
    with pytest.raises(TimeoutError):
        await FakeClock().wait_for_sleepers(1, real_timeout=0.05)


async def test_system_clock_deadline_scope_speaks_monotonic_seconds() -> None:
    """The real clock's scopes take and report deadlines on `monotonic()`, whatever the event loop's own clock is."""
    clock = SystemClock()
    target = clock.monotonic() + 30
    with clock.deadline_scope(target) as scope:
        assert scope.deadline == pytest.approx(target, abs=0.01)
        scope.deadline = clock.monotonic() + 0.01
        await clock.sleep(5)
    assert scope.cancelled_caught


async def test_system_clock_scopes_fire_each_at_its_own_deadline() -> None:
    """Concurrent scopes share one loop timer: each is cut at its own deadline (a moved one at the moved time), others never."""
    clock = SystemClock()
    cut: dict[str, bool] = {}

    async def body(name: str, deadline_in: float, move_to: float | None = None, work_s: float = 3.0) -> None:
        with clock.deadline_scope(clock.monotonic() + deadline_in) as scope:
            if move_to is not None:
                scope.deadline = clock.monotonic() + move_to
            await clock.sleep(work_s)
        cut[name] = scope.cancelled_caught

    started = clock.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(body, "late", 60.0, None, 0.4)  # the first deadline the timer is set for
        tg.start_soon(body, "sooner", 0.1)  # sooner than the one set: the timer moves
        tg.start_soon(body, "moved_earlier", 60.0, 0.05)
        tg.start_soon(body, "moved_later", 0.05, 60.0, 0.3)
        tg.start_soon(body, "done_in_time", 30.0, None, 0.01)
        tg.start_soon(body, "past_at_entry", -1.0)
    assert cut == {
        "past_at_entry": True,
        "moved_earlier": True,
        "sooner": True,
        "done_in_time": False,
        "moved_later": False,
        "late": False,
    }
    assert clock.monotonic() - started < 2.5


async def test_system_clock_scope_that_ended_early_does_not_hide_a_later_deadline() -> None:
    """The timer stays set for a scope that ended early; when it fires it is set again for the next one due."""
    clock = SystemClock()
    with clock.deadline_scope(clock.monotonic() + 0.05):
        pass
    started = clock.monotonic()
    with clock.deadline_scope(clock.monotonic() + 0.2) as scope:
        await clock.sleep(5)
    assert scope.cancelled_caught
    assert 0.15 <= clock.monotonic() - started < 2.5


async def test_system_clock_scopes_do_not_each_schedule_a_loop_timer() -> None:
    """A thousand scopes entered and left keep at most one timer in the loop's schedule (not a thousand cancelled ones)."""
    import asyncio

    clock = SystemClock()
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]  # asyncio's timer heap
    for _ in range(1000):
        with clock.deadline_scope(clock.monotonic() + 30):
            pass
    assert len(loop._scheduled) <= before + 1  # type: ignore[attr-defined]
