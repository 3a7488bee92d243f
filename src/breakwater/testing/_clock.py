"""`FakeClock`: virtual time for tests, of breakwater and of code that uses it.

Hand one to `Breakwater(clock=...)` (or any breakwater object that takes a `clock`) and every
backoff, budget, deadline and breaker window waits on virtual time: a retry schedule of minutes runs
in milliseconds, in exactly the order real time would give it, and never flakes. `run()` jumps time
whenever every task is blocked; `advance()` and `step()` move it by hand.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

import anyio
import anyio.lowlevel

from breakwater._clock import DeadlineScope

__all__ = ["FakeClock"]

WAKE_TOLERANCE_S = 1e-6
T = TypeVar("T")


@dataclass(eq=False)
class _Sleeper:
    wake_at: float
    event: anyio.Event = field(default_factory=anyio.Event)


class _FakeDeadlineScope:
    __slots__ = ("_clock", "_deadline", "_scope")

    def __init__(self, clock: FakeClock, deadline: float) -> None:
        self._clock = clock
        self._scope = anyio.CancelScope()
        self._deadline = deadline

    @property
    def deadline(self) -> float:
        return self._deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._deadline = value
        if value <= self._clock.monotonic():
            self._scope.cancel()

    @property
    def cancelled_caught(self) -> bool:
        return self._scope.cancelled_caught

    def cancel(self) -> None:
        self._scope.cancel()

    def fire_if_due(self, now: float) -> None:
        if self._deadline <= now:
            self._scope.cancel()

    def __enter__(self) -> _FakeDeadlineScope:
        self._scope.__enter__()
        self._clock._scopes.add(self)
        self.fire_if_due(self._clock.monotonic())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._clock._scopes.discard(self)
        return bool(self._scope.__exit__(exc_type, exc, tb))


class FakeClock:
    """A clock that moves only when told to.

    Sleeps and deadline scopes wait on virtual time; `advance()` moves it and wakes whatever became
    due. `wait_for_sleepers()` lets a test wait (in real time, briefly) until the code under test
    has parked itself, so a test can step through a backoff schedule deterministically.
    """

    def __init__(self, *, start: float = 1_000.0, wall_start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._sleepers: list[_Sleeper] = []
        self._scopes: set[_FakeDeadlineScope] = set()

    def monotonic(self) -> float:
        """The fake monotonic time: moves only when the test advances it."""
        return self._now

    def time(self) -> float:
        """The fake wall time: the monotonic time plus the wall offset it started with."""
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        """Sleep until the test advances the clock `seconds` further (a checkpoint for 0 or less)."""
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        sleeper = _Sleeper(self._now + seconds)
        self._sleepers.append(sleeper)
        try:
            await sleeper.event.wait()
        finally:
            if sleeper in self._sleepers:
                self._sleepers.remove(sleeper)

    def deadline_scope(self, deadline: float) -> DeadlineScope:
        """A cancel scope that fires when the test advances the clock to `deadline`."""
        return _FakeDeadlineScope(self, deadline)

    @property
    def sleepers(self) -> list[float]:
        """Wake-up times of everything currently asleep, earliest first."""
        return sorted(s.wake_at for s in self._sleepers)

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper and deadline that became due."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        # Tolerance for deltas that went through wall time (epoch-sized floats keep ~0.2 us).
        due = self._now + WAKE_TOLERANCE_S
        for sleeper in list(self._sleepers):
            if sleeper.wake_at <= due:
                self._sleepers.remove(sleeper)
                sleeper.event.set()
        for scope in list(self._scopes):
            scope.fire_if_due(due)

    def advance_to(self, when: float) -> None:
        """Move time forward to `when` (no-op if it has passed)."""
        self.advance(max(0.0, when - self._now))

    async def wait_for_sleepers(self, count: int = 1, *, real_timeout: float = 10.0) -> None:
        """Wait in real time until at least `count` tasks sleep on this clock."""
        # Real time on purpose: the code under test is running, virtual time is not moving.
        with anyio.fail_after(real_timeout):  # noqa: TID251 - a real-time bound on waiting for other tasks
            while len(self._sleepers) < count:
                await anyio.sleep(0.001)  # noqa: TID251 - polls the real progress of other tasks

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn` to completion, jumping time to the next sleeper or deadline whenever every task is blocked.

        For code whose only waits are on this clock (no real I/O): a schedule of timeouts and
        backoffs that would take minutes runs at once, in the order real time would give it.
        Inside `fn`, wait for events rather than for `anyio.wait_all_tasks_blocked()`: this loop is
        a task too, and each would wait for the other. Raises RuntimeError when every task is
        blocked and nothing on the clock could wake one (a deadlock in real time too).
        """
        box: list[T] = []
        async with anyio.create_task_group() as tg:

            async def body() -> None:
                box.append(await fn())

            tg.start_soon(body)
            while not box:
                await _all_tasks_blocked()
                if box:
                    break
                # A lifted deadline (infinity) is never due: jumping to it would end time itself.
                due = [t for t in (*(s.wake_at for s in self._sleepers), *(s.deadline for s in self._scopes)) if t < math.inf]
                if not due:
                    raise RuntimeError("every task is blocked and nothing is scheduled on the clock")
                self.advance_to(min(due))
        return box[0]

    async def step(self, *, real_timeout: float = 10.0) -> float:
        """Wait until something sleeps, then jump to the earliest wake-up; returns the new time."""
        await self.wait_for_sleepers(1, real_timeout=real_timeout)
        self.advance_to(self.sleepers[0])
        await anyio.lowlevel.checkpoint()
        return self._now


def _waiting(task: asyncio.Task[object]) -> bool:
    waiter = getattr(task, "_fut_waiter", None)  # what anyio's own wait_all_tasks_blocked reads too
    return waiter is not None and not waiter.done()


async def _all_tasks_blocked() -> None:
    """Return once every other task waits on something that has not happened yet.

    anyio's `wait_all_tasks_blocked` on asyncio sleeps a real 0.1 s whenever some task can run,
    and it can also return while a finished task's done-callback still sits in the event loop's
    queue (the parent waiting on it looks blocked for one more turn): `run()` would then jump time
    too early, or see a deadlock that is not one. This version yields a turn at a time instead, and
    checks twice, one loop turn apart. Code waiting on real I/O makes it poll every millisecond.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another backend (trio): its own check has neither problem
        await anyio.wait_all_tasks_blocked()
        return
    me = asyncio.current_task()
    turns = 0
    stable = 0
    while stable < 2:
        await anyio.lowlevel.checkpoint()
        if all(task is me or _waiting(task) for task in asyncio.all_tasks()):
            stable += 1
            continue
        stable = 0
        turns += 1
        if turns > 1000:  # something waits on real I/O: stop spinning the CPU
            await anyio.sleep(0.001)  # noqa: TID251 - polls the real progress of other tasks
