"""Shared state: breakers and retry budgets kept in one place for several replicas.

`MemoryStore` keeps them in this process; `RedisStore` (the `redis` extra) shares them. May import the
core leaves, `config` and the gate's breaker and budget types.
"""

from __future__ import annotations

import random

from breakwater._clock import Clock
from breakwater.config._policies import StatePolicy
from breakwater.errors import ConfigError
from breakwater.state._base import MemoryStore, StateStore, StoreStatus

__all__ = ["MemoryStore", "StateStore", "StoreStatus", "open_store"]


def open_store(policy: StatePolicy, *, clock: Clock, rng: random.Random | None = None) -> StateStore:
    """The store `policy.url` names (empty or memory:// = in-process)."""
    if not policy.url or policy.url.startswith("memory://"):
        return MemoryStore()
    try:
        from breakwater.state._redis import RedisStore
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigError(
            f"the Redis state store needs the redis package ({exc})",
            key="state.url",
            fix="pip install 'mcp-breakwater[redis]'",
        ) from None
    return RedisStore(policy, clock=clock, rng=rng)
