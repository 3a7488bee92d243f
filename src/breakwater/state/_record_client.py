"""The Redis client of the gateway's fleet records: sessions, forwarded operations, resumable streams.

One place for how they talk to Redis, which differs from the breakers' store (`_redis.py`): their
commands may wait a little longer, since a lost lookup costs a client a re-initialize or a
duplicate rather than one call's admission, and a command that fails is tried once more.
"""

from __future__ import annotations

from typing import Any

from breakwater.config._policies import StatePolicy

__all__ = ["MIN_TIMEOUT_S", "record_client"]

#: The floor of a record command's timeout, whatever `[state] timeout_s` (tuned for the breakers) says.
MIN_TIMEOUT_S = 0.5


def record_client(policy: StatePolicy, *, blocking_s: float = 0.0) -> Any:
    """An asyncio Redis client for `policy`'s URL; `blocking_s` more read timeout for commands that block (XREAD)."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    timeout = max(policy.timeout_s, MIN_TIMEOUT_S)
    return aredis.Redis.from_url(
        policy.url,
        socket_timeout=timeout + blocking_s,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
        decode_responses=True,
    )
