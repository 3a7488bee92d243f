"""A breaker's vocabulary: whose it is, its states, what a call tells it, and how it refuses.

Apart from `breakwater.gate._breaker` (which re-exports every name) to keep that module to the
breaker's behaviour.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["BreakerKey", "BreakerState", "Outcome", "Rejection"]


class BreakerKey(NamedTuple):
    """Whose breaker: a server's (`tool` None) or one tool's on a server.

    The one place the identity is spelled: `name` is its text form (`server` or `server/tool`, the
    key a shared store keeps it under and what `status` shows); read `server` and `tool` instead
    of parsing the name back (tool names may hold slashes).
    """

    server: str
    tool: str | None = None

    @property
    def name(self) -> str:
        """`server`, or `server/tool`."""
        return self.server if self.tool is None else f"{self.server}/{self.tool}"


class Outcome(enum.StrEnum):
    """What one admitted call tells a breaker."""

    SUCCESS = "success"
    FAILURE = "failure"
    #: Neither: the call says nothing about health (cancelled by the caller, refused locally).
    IGNORED = "ignored"


class BreakerState(enum.StrEnum):
    """The three breaker states."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# The members as plain module names, for the call path: on Python 3.11 `EnumType` has a `__getattr__`, which
# makes every class attribute read such as `BreakerState.CLOSED` a slow call (~800 instructions, where a
# global read costs a few; 3.12 dropped it). An answered call read 23 of them (bench/gate_instructions.py).
CLOSED, OPEN = BreakerState.CLOSED, BreakerState.OPEN
FAILURE, IGNORED = Outcome.FAILURE, Outcome.IGNORED


class Rejection(NamedTuple):
    """The breaker refused a call (nothing was sent, nothing is recorded); a named tuple: cheaper than a frozen dataclass."""

    #: Seconds until a call may be admitted again (best estimate).
    retry_after_s: float
    state: BreakerState
    #: Why the breaker is open, e.g. "4 consecutive failures".
    reason: str
