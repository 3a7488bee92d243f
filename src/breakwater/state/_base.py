"""Where breakers, retry budgets and learned timeouts keep their state: this process, or Redis.

`StateStore` is the interface; `MemoryStore` (the default) keeps everything in the process as
before and adds nothing to a call. `RedisStore` (`breakwater.state._redis`, `[state] url =
"redis://…"`) shares the state between replicas:

* decisions are made from a local mirror of each breaker, kept fresh by pub/sub (every change is
  published by the Lua script that made it) and a periodic re-read, so a closed or open breaker
  costs no round trip;
* every transition runs as one Lua script (see `_redis.py` for the key layout), stamped
  with an epoch that never decreases, so a late writer's report is dropped;
* the half-open probe is a lease granted by a script to exactly one replica cluster-wide, and
  expires by Redis time if that replica dies;
* when Redis is unreachable or slow every breaker falls back to its local state machine, seeded
  from the mirror, the store reports `degraded`, and it resynchronises when Redis answers again.
  A call never fails because the store failed.

`open_store(policy, clock=…, rng=…)` picks the implementation from `StatePolicy.url`.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass
from typing import Any

from breakwater.config._policies import BreakerPolicy, RetryPolicy
from breakwater.gate._breaker import SharedBreaker
from breakwater.gate._retry_budget import SharedBudget

__all__ = ["MemoryStore", "StateStore", "StoreStatus"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatus:
    """What `status` shows about the state store."""

    #: "memory" or "redis".
    backend: str
    #: "ok", "degraded" (local state in use) or "connecting" (not reached yet; local state in use).
    state: str
    namespace: str | None = None
    #: The store's address without credentials.
    url: str | None = None
    #: Why it is degraded (the last error), if it is.
    error: str | None = None
    #: Wall-clock time the current state began.
    since: float | None = None
    #: How many times the store went degraded since start.
    degradations: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {"backend": self.backend, "state": self.state}
        for key in ("namespace", "url", "error", "since"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["degradations"] = self.degradations
        return out


class StateStore(abc.ABC):
    """Where breaker, retry-budget and learned-timeout state lives.

    The breakers and budgets ask for a shared handle when they are created; None means "keep your
    state yourself" (the in-process store). Background work, if any, runs in `run()`.
    """

    backend: str = "memory"

    @abc.abstractmethod
    def status(self) -> StoreStatus:
        """Backend and health: `state` is "ok", or "degraded" while local state stands in."""

    @property
    def healthy(self) -> bool:
        """Whether shared state is in use right now."""
        return self.status().state == "ok"

    async def connect(self) -> None:  # noqa: B027 - optional hook, a no-op for in-process state
        """First contact (bounded by the store's timeout); a failure leaves the store degraded, never raises."""

    async def run(self) -> None:  # noqa: B027 - optional hook, a no-op for in-process state
        """Background work (pub/sub, write-behind, resync) until cancelled; returns at once if there is none."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op for in-process state
        """Release connections."""

    def shared_breaker(self, name: str, policy: BreakerPolicy, rng: random.Random) -> SharedBreaker | None:
        """The shared state of breaker `name`, or None to keep it in the breaker itself."""
        return None

    def shared_budget(self, server: str, policy: RetryPolicy) -> SharedBudget | None:
        """The shared retry budget of `server`, or None to keep it in the budget itself."""
        return None

    @abc.abstractmethod
    def learned_timeout(self, server: str, tool: str) -> float | None:
        """The learned per-attempt timeout of `tool` (None: nothing learned). Never waits on the network."""

    @abc.abstractmethod
    def set_learned_timeout(self, server: str, tool: str, seconds: float | None) -> None:
        """Store (None: forget) a learned timeout; shared stores write it behind and tell the other replicas."""


class MemoryStore(StateStore):
    """State in this process only: today's behaviour, no overhead (the breakers keep their own state)."""

    backend = "memory"

    def __init__(self) -> None:
        self._learned: dict[tuple[str, str], float] = {}

    def status(self) -> StoreStatus:
        """Always `ok`: nothing outside this process to lose."""
        return StoreStatus(backend="memory", state="ok")

    @property
    def healthy(self) -> bool:
        """Always True."""
        return True

    def learned_timeout(self, server: str, tool: str) -> float | None:
        """The timeout learned for `tool` of `server` in this process, if any."""
        return self._learned.get((server, tool))

    def set_learned_timeout(self, server: str, tool: str, seconds: float | None) -> None:
        """Keep (or, with None, forget) the timeout learned for `tool` of `server`."""
        if seconds is None:
            self._learned.pop((server, tool), None)
        else:
            self._learned[(server, tool)] = seconds
