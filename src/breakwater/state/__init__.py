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

__all__ = ["MemoryStore", "StateStore", "StoreStatus", "check_store_url", "open_store"]


def open_store(policy: StatePolicy, *, clock: Clock, rng: random.Random | None = None, path: str | None = None) -> StateStore:
    """The store `policy.url` names (empty or memory:// = in-process); a ConfigError (naming the config file `path`)
    for a URL its client refuses."""
    if not policy.url or policy.url.startswith("memory://"):
        return MemoryStore()
    check_store_url(policy, path=path)
    from breakwater.state._redis import RedisStore

    return RedisStore(policy, clock=clock, rng=rng)


def check_store_url(policy: StatePolicy, *, path: str | None = None) -> None:
    """Raise the ConfigError of a `[state] url` the Redis client would refuse, or of a missing redis package.

    Here, as the store opens, and in `config check`, not as the config is read: the client costs ~0.1 s to import,
    which every command and every attaching session would pay."""
    if not policy.url or policy.url.startswith("memory://"):
        return
    try:
        from breakwater.state._redis import redis_url_problem
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigError(
            f"the Redis state store needs the redis package ({exc})",
            path=path,
            key="state.url",
            fix="pip install 'mcp-breakwater[redis]'",
        ) from None
    if (problem := redis_url_problem(policy.url)) is not None:
        raise ConfigError(
            problem,
            path=path,
            key="state.url (BREAKWATER_STATE_URL)",
            fix='use "redis://HOST:PORT/DB", with only the options redis-py reads',
        )
