"""Time, injected.

Every sleep, timeout and deadline in breakwater goes through a `Clock`, so tests of backoff,
budgets and breakers run on a fake clock (`breakwater.testing.FakeClock`) in milliseconds and never
flake; ruff's banned-api rule (TID251) keeps direct `time.monotonic`, `time.sleep`, `anyio.sleep`,
`anyio.move_on_after` and `anyio.fail_after` out of the rest of `src/`. Monotonic time
(`monotonic()`) drives deadlines; wall time (`time()`) only labels things for people, such as
`next_retry_at`.
"""

from __future__ import annotations

import math
import time as _time
from types import TracebackType
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["Clock", "DeadlineScope", "SystemClock"]


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
