"""The whole-turn budget: one deadline for a sequence of tool calls.

`async with turn_budget(60, clock=clock):` puts an absolute deadline (on the clock's monotonic line)
into a `contextvars.ContextVar`. asyncio tasks and anyio task groups copy the context when they
are spawned, so every call made inside the block, in any task it starts, sees the same deadline.
Nesting keeps the earlier deadline (Finagle's rule: when two deadlines meet, the earliest wins), so
an inner scope can shorten a budget but never extend it.

The gate asks two questions, as gRPC and Finagle deadlines do: what is this call's deadline —
`effective_deadline()`, the earlier of its own and the budget's — and may an attempt start at all —
`can_start()`, "is at least X s left?" — so no attempt begins that the budget cannot cover.

The scope does not cancel its body by default: the work between calls (an LLM thinking) is the
agent's to bound; breakwater bounds the calls. `enforce=True` also cancels the body at the deadline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType

from breakwater._clock import Clock, DeadlineScope

__all__ = ["TurnBudget", "TurnBudgetScope", "can_start", "current_budget", "effective_deadline", "turn_budget"]


@dataclass(frozen=True, slots=True)
class TurnBudget:
    """A deadline on `clock`'s monotonic line shared by every call in a scope."""

    deadline: float
    clock: Clock

    def remaining(self) -> float:
        """Seconds left (0 once spent)."""
        return max(0.0, self.deadline - self.clock.monotonic())

    @property
    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self.clock.monotonic() >= self.deadline

    def can_start(self, needed_s: float) -> bool:
        """Whether an attempt needing `needed_s` seconds still fits (never when nothing is left)."""
        left = self.deadline - self.clock.monotonic()
        return left > 0 and left >= needed_s


_CURRENT: ContextVar[TurnBudget | None] = ContextVar("breakwater_turn_budget", default=None)


#: `current_budget()`: the budget in force in this task, if any. The context variable's own `get`, not a
#: function calling it: every call asks, and the frame is most of the cost (~700 instructions against ~400).
current_budget: Callable[[], TurnBudget | None] = _CURRENT.get


def effective_deadline(call_deadline: float | None, budget: TurnBudget | None = None) -> float | None:
    """The earlier of a call's own deadline and the budget's (the current one unless given); None if neither."""
    budget = budget if budget is not None else _CURRENT.get()
    candidates = [d for d in (call_deadline, budget.deadline if budget else None) if d is not None]
    return min(candidates) if candidates else None


def can_start(needed_s: float, budget: TurnBudget | None = None) -> bool:
    """Whether an attempt needing `needed_s` seconds fits the budget (the current one unless given); True without one."""
    budget = budget if budget is not None else _CURRENT.get()
    return True if budget is None else budget.can_start(needed_s)


class TurnBudgetScope:
    """The context manager behind `turn_budget()`; use `async with` (or plain `with`)."""

    def __init__(self, seconds: float | None = None, *, clock: Clock, deadline: float | None = None, enforce: bool = False):
        if (seconds is None) == (deadline is None):
            raise ValueError("give exactly one of seconds= or deadline=")
        if seconds is not None and (math.isnan(seconds) or seconds < 0):
            raise ValueError(f"a budget must be a number of seconds, 0 or more: got {seconds!r}")
        self._seconds = seconds
        self._deadline = deadline
        self._clock = clock
        self._enforce = enforce
        self._token: Token[TurnBudget | None] | None = None
        self._scope: DeadlineScope | None = None
        self.budget: TurnBudget | None = None

    def __enter__(self) -> TurnBudget:
        own = self._deadline if self._seconds is None else self._clock.monotonic() + self._seconds
        assert own is not None
        outer = _CURRENT.get()
        deadline = min(own, outer.deadline) if outer is not None else own
        self.budget = TurnBudget(deadline, self._clock)
        self._token = _CURRENT.set(self.budget)
        if self._enforce:
            self._scope = self._clock.deadline_scope(deadline)
            self._scope.__enter__()
        return self.budget

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            return bool(self._scope.__exit__(exc_type, exc, tb)) if self._scope is not None else False
        finally:
            if self._token is not None:
                _CURRENT.reset(self._token)
                self._token = None

    async def __aenter__(self) -> TurnBudget:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)

    @property
    def cancelled_caught(self) -> bool:
        """With `enforce=True`: whether the deadline cut the body short."""
        return self._scope is not None and self._scope.cancelled_caught


def turn_budget(
    seconds: float | None = None, *, clock: Clock, deadline: float | None = None, enforce: bool = False
) -> TurnBudgetScope:
    """A whole-turn budget of `seconds` from now (or until the monotonic `deadline`), nested budgets keep the earlier."""
    return TurnBudgetScope(seconds, clock=clock, deadline=deadline, enforce=enforce)
