"""Time, injected.

Every sleep, timeout and deadline in breakwater goes through a `Clock`, so tests of backoff,
budgets and breakers run on a `FakeClock` in milliseconds and never flake. Monotonic time
(`monotonic()`) drives deadlines; wall time (`time()`) only labels things for people, such as
`next_retry_at`.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

import anyio
import anyio.lowlevel

__all__ = ["Clock", "DeadlineScope", "FakeClock", "SystemClock"]

WAKE_TOLERANCE_S = 1e-6
T = TypeVar("T")


@runtime_checkable
class DeadlineScope(Protocol):
    """A cancel scope that fires at a deadline on its clock's monotonic time line.

    The deadline may be moved while the scope is active (progress-aware timeouts push it out).
    """

    deadline: float

    @property
    def cancelled_caught(self) -> bool: ...

    def cancel(self) -> None: ...

    def __enter__(self) -> DeadlineScope: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...


class Clock(Protocol):
    """What breakwater needs from time."""

    def monotonic(self) -> float:
        """Seconds on a line that never goes backwards; the line every deadline lives on."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch, for timestamps shown to people and scripts."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds` (at least one checkpoint even for 0)."""
        ...

    def deadline_scope(self, deadline: float) -> DeadlineScope:
        """A cancel scope that cancels its body when `monotonic()` reaches `deadline`."""
        ...


class _SystemDeadlineScope:
    """An anyio cancel scope whose deadline is expressed in `time.monotonic()` seconds."""

    __slots__ = ("_scope",)

    def __init__(self, deadline: float) -> None:
        self._scope = anyio.CancelScope()
        self.deadline = deadline

    @property
    def deadline(self) -> float:
        d = self._scope.deadline
        return d if math.isinf(d) else d - anyio.current_time() + _time.monotonic()

    @deadline.setter
    def deadline(self, value: float) -> None:
        # asyncio's loop clock is time.monotonic(), but anyio only promises "some monotonic clock",
        # so translate through the difference instead of assuming they are the same line.
        self._scope.deadline = value if math.isinf(value) else anyio.current_time() + (value - _time.monotonic())

    @property
    def cancelled_caught(self) -> bool:
        return self._scope.cancelled_caught

    def cancel(self) -> None:
        self._scope.cancel()

    def __enter__(self) -> _SystemDeadlineScope:
        self._scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return bool(self._scope.__exit__(exc_type, exc, tb))


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))

    def deadline_scope(self, deadline: float) -> DeadlineScope:
        return _SystemDeadlineScope(deadline)


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
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
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
        with anyio.fail_after(real_timeout):
            while len(self._sleepers) < count:
                await anyio.sleep(0.001)

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn` to completion, jumping time to the next sleeper or deadline whenever every task is blocked.

        For code whose only waits are on this clock (no real I/O): a schedule of timeouts and
        backoffs that would take minutes runs at once, in the order real time would give it.
        """
        box: list[T] = []
        async with anyio.create_task_group() as tg:

            async def body() -> None:
                box.append(await fn())

            tg.start_soon(body)
            while not box:
                await anyio.wait_all_tasks_blocked()
                if box:
                    break
                due = [*(s.wake_at for s in self._sleepers), *(s.deadline for s in self._scopes)]
                if not due:
                    raise RuntimeError("every task is blocked and nothing is scheduled on the clock")
                self.advance_to(min(due))
        return box[0]

    async def step(self, *, real_timeout: float = 10.0) -> float:
        """Wait until something sleeps, then jump to the earliest wake-up; returns the new time."""
        await self.wait_for_sleepers(1, real_timeout=real_timeout)
        self.advance_to(self.sleepers[0])
        await anyio.sleep(0)
        return self._now
