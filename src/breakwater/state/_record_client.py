"""The Redis client of the gateway's fleet records: sessions, forwarded operations, resumable streams.

One place for how they talk to Redis, which differs from the breakers' store (`_redis.py`): their
commands may wait a little longer, since a lost lookup costs a client a re-initialize or a
duplicate rather than one call's admission, and a command that cannot connect is tried once more.

A Redis that hangs (a stopped process, a route that drops packets) answers nothing, and every
command waited its whole timeout: measured with `kill -STOP` on the Redis of a `serve --http`,
+0.5 s on every request of a 2025-11-25 session, +1 s on each `initialize` and +4.5 s on each
call carrying an operation id, for as long as Redis hung. So the session and stream clients of one
Redis share a `Reach`: after `AWAY_AFTER` commands in a row time out, their commands fail at once
(`RecordStoreAway`) for `AWAY_S`; then one command tries Redis again while the others still fail at
once, and its answer ends the wait. Those stores take any failure as "Redis cannot say" (a session
only this replica serves, an event a resume may miss), so a refused command costs what a failed one
did, without the wait. The operation records do not fail fast: a claim is Redis's answer or the
call waits for it, since a guessed claim can run a call twice.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from breakwater._clock import Clock, SystemClock
from breakwater.config._policies import StatePolicy

__all__ = ["AWAY_AFTER", "AWAY_S", "MIN_TIMEOUT_S", "Reach", "RecordStoreAway", "record_client"]

log = logging.getLogger("breakwater.state")

#: The floor of a record command's timeout, whatever `[state] timeout_s` (tuned for the breakers) says.
MIN_TIMEOUT_S = 0.5
#: How long record commands fail at once after `AWAY_AFTER` timed out in a row, before one tries again.
AWAY_S = 5.0
#: Timeouts in a row that make Redis away (a refused connection is fast already: it does not count).
AWAY_AFTER = 2

#: The loggers of the stores whose warnings name the failed command: quiet while Redis is away (see `Reach`).
_STORE_LOGGERS = ("breakwater.sessions", "breakwater.operations", "breakwater.gateway")


class RecordStoreAway(ConnectionError):
    """A record command refused without asking Redis: it did not answer lately (`Reach`)."""


class Reach:
    """Whether Redis answers the record clients' commands; while it does not, they fail at once (module docstring).

    Entering and leaving that state are logged once each, the second with the number of commands
    refused meanwhile; the stores' own warnings for those commands are not (one a request, or more).
    """

    def __init__(self, *, clock: Clock | None = None, away_s: float = AWAY_S) -> None:
        self.clock: Clock = clock or SystemClock()
        self.away_s = away_s
        #: Commands refused at once since Redis last answered.
        self.refused = 0
        self._away_until: float | None = None
        self._why = ""
        self._timeouts = 0  # in a row

    @property
    def away(self) -> bool:
        """Whether the last command that reached for Redis got no answer."""
        return self._away_until is not None

    def check(self) -> None:
        """Before a command: raise `RecordStoreAway` while Redis is away, except for one command each `away_s` (the probe)."""
        if self._away_until is None:
            return
        now = self.clock.monotonic()
        if now < self._away_until:
            self.refused += 1
            raise RecordStoreAway(f"Redis did not answer lately ({self._why}); tried again in {self._away_until - now:.1f} s")
        self._away_until = now + self.away_s  # this command is the probe: the others fail at once until it ends

    def answered(self) -> None:
        """A command got Redis's answer (an error reply included)."""
        if self._away_until is not None:
            log.warning("Redis answers again; %d record commands were refused at once while it did not", self.refused)
        self._away_until = None
        self.refused = 0
        self._timeouts = 0

    def failed(self, exc: BaseException, *, timed_out: bool = True) -> None:
        """A command timed out, or could not connect (`timed_out` false: fast already, it changes nothing here)."""
        if not timed_out:
            return
        self._timeouts += 1
        if self._timeouts < AWAY_AFTER and self._away_until is None:
            return  # one slow answer on a loaded machine is no hung Redis: 5 s of records were lost for it
        if self._away_until is None:
            log.warning(
                "Redis did not answer (%s): record commands fail at once for %g s, then one tries again", exc, self.away_s
            )
        self._why = str(exc) or type(exc).__name__
        self._away_until = self.clock.monotonic() + self.away_s


class _QuietWhileAway(logging.Filter):
    """Drops a store's warning about a command `Reach` refused: entering and leaving the state say it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, RecordStoreAway) for arg in args)


_QUIET = _QuietWhileAway()
_REACHES: dict[tuple[str, Clock | None], Reach] = {}


@functools.cache
def _reaching_client_class() -> Any:
    """The asyncio `Redis` client class whose commands go through its `reach` (made on first use: redis is an extra)."""
    import redis.asyncio as aredis
    from redis.asyncio.client import Pipeline
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    async def reached(reach: Reach, command: Any) -> Any:
        try:
            result = await command
        except RedisTimeoutError as exc:
            reach.failed(exc)
            raise
        except RedisConnectionError as exc:
            reach.failed(exc, timed_out=False)
            raise
        except RedisError:  # an error reply is an answer
            reach.answered()
            raise
        reach.answered()
        return result

    class ReachingPipeline(Pipeline):
        reach: Reach

        async def execute(self, raise_on_error: bool = True) -> list[Any]:
            try:
                self.reach.check()
            except RecordStoreAway:
                await self.reset()  # type: ignore[no-untyped-call]
                raise
            return await reached(self.reach, super().execute(raise_on_error))  # type: ignore[no-any-return]

    class ReachingRedis(aredis.Redis):
        reach: Reach

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            self.reach.check()
            return await reached(self.reach, super().execute_command(*args, **options))  # type: ignore[no-untyped-call]

        def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
            pipe = ReachingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
            pipe.reach = self.reach
            return pipe

    return ReachingRedis


def _shared_reach(url: str, clock: Clock | None) -> Reach:
    """One `Reach` per Redis (and per clock): a replica's session and stream clients learn from one another's commands."""
    key = (url, None if clock is None or type(clock) is SystemClock else clock)
    reach = _REACHES.get(key)
    if reach is None:
        reach = _REACHES[key] = Reach(clock=clock)
    return reach


def record_client(
    policy: StatePolicy,
    *,
    blocking_s: float = 0.0,
    clock: Clock | None = None,
    reach: Reach | None = None,
    fail_fast: bool = True,
) -> Any:
    """An asyncio Redis client for `policy`'s URL; `blocking_s` more read timeout for commands that block (XREAD).

    With `fail_fast`, its commands fail at once while Redis is away (`reach`, by default the one of every client of
    this URL and clock). Without it (the operation records: a claim Redis was not asked is a claim guessed, and a
    guess runs a call twice) each command waits its timeout, as before.
    """
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    for name in _STORE_LOGGERS:
        if _QUIET not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_QUIET)
    timeout = max(policy.timeout_s, MIN_TIMEOUT_S)
    client = (_reaching_client_class() if fail_fast else aredis.Redis).from_url(
        policy.url,
        socket_timeout=timeout + blocking_s,
        socket_connect_timeout=timeout,
        # A connection Redis closed (a restart) is tried once more; a command that timed out is not (it would wait again).
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        decode_responses=True,
    )
    if fail_fast:
        client.reach = reach or _shared_reach(policy.url, clock)
    return client
