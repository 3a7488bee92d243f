"""Time, injected.

Every sleep, timeout and deadline in breakwater goes through a `Clock`, so tests of backoff,
budgets and breakers run on a fake clock (`breakwater.testing.FakeClock`) in milliseconds and never
flake; ruff's banned-api rule (TID251) keeps direct `time.monotonic`, `time.sleep`, `anyio.sleep`,
`anyio.move_on_after` and `anyio.fail_after` out of the rest of `src/`. Monotonic time
(`monotonic()`) drives deadlines; wall time (`time()`) only labels things for people, such as
`next_retry_at`.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time as _time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, runtime_checkable

import anyio

# The running loop or None, without the exception `asyncio.get_running_loop()` raises outside one.
_get_running_loop = asyncio._get_running_loop

__all__ = ["Clock", "DeadlineScope", "SystemClock", "new_cancel_scope", "new_event"]


@runtime_checkable
class DeadlineScope(Protocol):
    """A cancel scope that fires at a deadline on its clock's monotonic time line.

    The deadline may be moved while the scope is active (progress-aware timeouts push it out).
    """

    deadline: float

    @property
    def cancelled_caught(self) -> bool:
        """Whether the deadline (or `cancel`) cut the body."""
        ...

    def cancel(self) -> None:
        """Cut the body now, as the deadline would."""
        ...

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


class _LoopDeadlines:
    """The deadlines of one event loop's active `_SystemDeadlineScope`s, served by one asyncio timer.

    An anyio cancel scope with a deadline schedules an asyncio timer when entered and cancels it on
    exit; a gate attempt that answers in microseconds paid for both (a `TimerHandle`, a heap push
    and a cancelled handle left in the loop's heap: about a fifth of the gate's own cost per call,
    see docs/benchmarks.md "Gate overhead"). Here entering a scope is a dict insert and leaving it
    a dict pop. The one timer is set for the earliest deadline it knows of and moved only when a
    sooner one arrives: when it fires it cancels the scopes whose deadline has passed and is set
    again for the earliest of the rest (a scope that ended early leaves it set; that firing finds
    nothing due). The cancellation itself is anyio's (`CancelScope.cancel`), as with its own timer.
    """

    __slots__ = ("_at", "_context", "_handle", "_loop", "_scopes")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the module keeps the last loop's `_LoopDeadlines`, which must not keep a closed loop alive.
        self._loop = weakref.ref(loop)
        self._scopes: dict[_SystemDeadlineScope, None] = {}
        #: The monotonic time the timer fires at (inf: not set).
        self._at = math.inf
        self._handle: asyncio.TimerHandle | None = None
        # The timer's own: one set from a call's task held that task's context (every contextvar it set: the HTTP
        # request, its body) until the timer fired, the longest call timeout away. One per loop, so one thread.
        self._context = contextvars.Context()

    def watch(self, scope: _SystemDeadlineScope) -> None:
        """`scope` is active with a finite deadline (new, or moved): cancel it at that time."""
        deadline = scope._deadline
        if deadline <= _time.monotonic():
            self._scopes.pop(scope, None)
            scope._scope.cancel("deadline exceeded")
            return
        self._scopes[scope] = None
        if deadline < self._at:
            self._set(deadline)

    def forget(self, scope: _SystemDeadlineScope) -> None:
        """`scope` ended (or lost its deadline): nothing to cancel."""
        self._scopes.pop(scope, None)

    def _set(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = at
        loop = self._loop()
        if loop is None:  # the loop is gone, and its scopes with it
            return
        # asyncio's loop clock is time.monotonic(), but a loop only promises "some monotonic clock",
        # so translate through the difference instead of assuming they are the same line.
        self._handle = loop.call_at(loop.time() + (at - _time.monotonic()), self._fire, context=self._context)

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        now = _time.monotonic()
        soonest = math.inf
        for scope in list(self._scopes):
            deadline = scope._deadline
            if deadline <= now:
                del self._scopes[scope]
                scope._scope.cancel("deadline exceeded")
            elif deadline < soonest:
                soonest = deadline
        if soonest < math.inf:
            self._set(soonest)


# One `_LoopDeadlines` per event loop, looked up through a one-entry cache (the usual process has one loop).
_loop_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopDeadlines] = weakref.WeakKeyDictionary()
# One tuple, assigned at once: loops in other threads may replace it at any time.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], _LoopDeadlines] | None = None
# The asyncio backend's cancel scope class: `anyio.CancelScope()` looks the backend up on every call.
_asyncio_scope_class: type[anyio.CancelScope] | None = None
# Its `__init__`: a scope is made as `object.__new__(cls)` and this, which is what `cls()` does (anyio's
# `__new__` only drops the keywords), without `type.__call__` going through the Python `__new__` and
# `__init__` slots: ~5,800 instructions against ~4,500, once per gate attempt. tests/gate holds the two equal.
_asyncio_scope_init: Callable[[anyio.CancelScope], None] | None = None
_new_object = object.__new__


def _running_deadlines() -> _LoopDeadlines | None:
    """The running asyncio loop's deadlines, or None outside one (another backend: anyio's own timers)."""
    global _last
    loop = _get_running_loop()
    if loop is None:
        return None
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    deadlines = _loop_deadlines.get(loop)
    if deadlines is None:
        deadlines = _loop_deadlines[loop] = _LoopDeadlines(loop)
    _last = (weakref.ref(loop), deadlines)
    return deadlines


def new_cancel_scope() -> anyio.CancelScope:
    """`anyio.CancelScope()`, on asyncio without its backend look-up (a gate attempt and a lane's call make one each)."""
    global _asyncio_scope_class, _asyncio_scope_init
    if _get_running_loop() is None:
        return anyio.CancelScope()  # another backend, or no loop yet: anyio decides
    if _asyncio_scope_class is None:
        scope_class = type(anyio.CancelScope())
        _asyncio_scope_init = scope_class.__init__
        _asyncio_scope_class = scope_class
    return _asyncio_scope_class()


# The asyncio backend's event class: `anyio.Event()` asks sniffio for the backend, then the backend's factory.
_asyncio_event_class: type[anyio.Event] | None = None


def new_event() -> anyio.Event:
    """`anyio.Event()`, on asyncio without its backend look-up (the stdio lane makes one per call, issue 16)."""
    global _asyncio_event_class
    if _get_running_loop() is None:
        return anyio.Event()
    if _asyncio_event_class is None:
        _asyncio_event_class = type(anyio.Event())
    return _asyncio_event_class()


class _SystemDeadlineScope:
    """An anyio cancel scope that fires at a deadline on the `time.monotonic()` line.

    On asyncio the deadline is kept here and served by the loop's `_LoopDeadlines` (one timer for
    all scopes); on another backend it is handed to the anyio scope itself.
    """

    __slots__ = ("_cancelled", "_deadline", "_elsewhere", "_loop", "_scope")

    def __init__(self, deadline: float) -> None:
        if math.isnan(deadline):
            raise ValueError("deadline must not be NaN")
        # `new_cancel_scope`'s usual answer without its frame: one scope is made per gate attempt.
        scope_class, scope_init = _asyncio_scope_class, _asyncio_scope_init
        if scope_class is not None and scope_init is not None and _get_running_loop() is not None:
            scope = _new_object(scope_class)
            scope_init(scope)
            self._scope = scope
        else:
            self._scope = new_cancel_scope()
        #: `cancel()` was called (before the scope was entered, only it can cancel the anyio scope).
        self._cancelled = False
        #: The loop's deadlines while the scope is active on asyncio, else None.
        self._loop: _LoopDeadlines | None = None
        #: Active on another backend: the anyio scope holds the deadline.
        self._elsewhere = False
        # Not through the `deadline` setter: an inactive scope has nothing to tell (one per attempt).
        self._deadline = deadline

    @property
    def deadline(self) -> float:
        if not self._elsewhere:
            return self._deadline
        d = self._scope.deadline
        return d if math.isinf(d) else d - anyio.current_time() + _time.monotonic()

    @deadline.setter
    def deadline(self, value: float) -> None:
        if math.isnan(value):
            raise ValueError("deadline must not be NaN")
        self._deadline = value
        loop = self._loop
        if loop is not None:
            if self._scope.cancel_called:
                return
            if math.isinf(value):
                loop.forget(self)
            else:
                loop.watch(self)
        elif self._elsewhere:
            # Another backend: its own scope keeps the deadline, on its own clock line.
            self._scope.deadline = value if math.isinf(value) else anyio.current_time() + (value - _time.monotonic())

    @property
    def cancelled_caught(self) -> bool:
        return self._scope.cancelled_caught

    def cancel(self) -> None:
        self._cancelled = True
        if self._loop is not None:
            self._loop.forget(self)
        self._scope.cancel()

    def __enter__(self) -> _SystemDeadlineScope:
        scope = self._scope
        # `_running_deadlines()`'s usual answer (the cached loop) without its frame: one scope is entered per attempt.
        last, running = _last, _get_running_loop()
        loop = last[1] if last is not None and running is not None and last[0]() is running else _running_deadlines()
        if loop is None:
            value = self._deadline
            scope.deadline = value if math.isinf(value) else anyio.current_time() + (value - _time.monotonic())
            scope.__enter__()
            self._elsewhere = True
            return self
        scope.__enter__()
        self._loop = loop
        # Not `scope.cancel_called` (a property): until now only `cancel()` could have cancelled it.
        if not math.isinf(self._deadline) and not self._cancelled:
            loop.watch(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        loop = self._loop
        if loop is not None:
            loop._scopes.pop(self, None)  # `loop.forget(self)`, without its frame (once per attempt)
            self._loop = None
        self._elsewhere = False
        return bool(self._scope.__exit__(exc_type, exc, tb))


class SystemClock:
    """The real clock."""

    # The C functions themselves, not methods wrapping them: the call path reads the clock several
    # times per call, and a Python frame per read is most of a read's cost.
    monotonic = staticmethod(_time.monotonic)
    time = staticmethod(_time.time)

    async def sleep(self, seconds: float) -> None:
        """`anyio.sleep`, never negative."""
        await anyio.sleep(max(0.0, seconds))

    # The class itself (a class is no descriptor: `clock.deadline_scope(d)` calls it), not a method
    # returning one: a frame less per gate attempt.
    deadline_scope = _SystemDeadlineScope
