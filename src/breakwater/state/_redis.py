"""The Redis state store: breakers, retry budgets and learned timeouts shared by replicas.

Key layout (`NS` = `[state] namespace`; the `{…}` hash tag keeps one breaker's keys in one slot):

    NS:breaker:{NAME}          hash  st (closed|open|half_open), ep (epoch), ou (open until, Redis ms),
                                     op (consecutive opens), cf (consecutive failures),
                                     le (probe lease until, Redis ms), rs (reason)     TTL key_ttl_s
    NS:breaker:{NAME}:w:IDX    hash  calls, failures, slow of window bucket IDX      TTL window + 1 bucket
    NS:budget:{SERVER}         hash  t (tokens), ts (last refill, Redis ms)           TTL key_ttl_s
    NS:learned:{SERVER}        hash  TOOL -> seconds                                  TTL key_ttl_s
    NS:events                  pub/sub channel: every breaker change and learned timeout, as JSON

Scripts (`state/lua/*.lua`; each one atomic; all times from Redis `TIME`, never a replica's clock,
so clock skew between replicas cannot move an open-until or a lease):

* `PROBE` — the only way out of open: past `ou` the breaker becomes half-open; a free (or expired)
  lease is granted to the caller with a new epoch. Exactly one replica holds it cluster-wide; a
  replica that dies mid-probe loses it when `le` passes (the lease outlives the call's hard cap).
* `SETTLE` — one outcome with the epoch of its permit. A different epoch is stale and changes
  nothing (fencing, Kleppmann). Closed: bump the bucket, check the trip rules, maybe open.
  Half-open: the probe's result closes or re-opens. Every change is published.
* `READ` — the state of many breakers at once, for the periodic refresh and the resync after an
  outage; raises a key's epoch above a replica's floor if Redis restarted behind it.
* `SEED` — after Redis lost a key (restart), a replica's local open state is written back once.
* `BUDGET` — applies a replica's token changes to the shared bucket, refilled by Redis time.

Epochs: every transition sets `ep = max(ep, floor, now_ms * 1000) + 1`, where `floor` is the
highest epoch the calling replica has seen. Epochs therefore never decrease, even across a Redis
restart that lost every key (the clock term carries them past anything issued before).

Decisions: a `Mirror` (`_redis_mirror.py`) per breaker holds the last state seen, updated by script replies and
pub/sub messages (only ever to an equal or higher epoch). Closed and open-not-yet-due decisions are
local; only a would-be probe asks Redis (one synchronous round trip, bounded by `timeout_s`,
because the gate's `acquire()` is synchronous), and the answer is cached, so at most one caller
per replica per half-open period pays it. Outcomes are written behind by one task.

Failure: any error or timeout marks the store degraded at once; breakers fall back to their own
record seeded from the mirror, budgets to their local bucket. The store retries every `retry_s`;
when Redis answers (and the subscription is back) it re-reads every breaker, writes back local
opens Redis lost, and reports ok again.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import random
import re
from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from breakwater._clock import Clock, SystemClock
from breakwater.config._policies import BreakerPolicy, RetryPolicy, StatePolicy
from breakwater.gate._breaker import BreakerState
from breakwater.state._base import StateStore, StoreStatus
from breakwater.state._pubsub import listen
from breakwater.state._redis_mirror import Mirror, PendingOutcome, SharedBucket

__all__ = ["RedisStore"]

logger = logging.getLogger("breakwater.state")

# The scripts in `state/lua/`: the breaker scripts share `prelude.lua`; the budget script stands alone.
_BREAKER_SCRIPTS = ("probe", "settle", "read", "seed")


def _load_scripts() -> dict[str, str]:
    """Each script's source, read once at import (the files ship inside the package)."""
    lua = resources.files("breakwater.state").joinpath("lua")
    prelude = lua.joinpath("prelude.lua").read_text(encoding="utf-8")
    scripts = {name: prelude + lua.joinpath(f"{name}.lua").read_text(encoding="utf-8") for name in _BREAKER_SCRIPTS}
    scripts["budget"] = lua.joinpath("budget.lua").read_text(encoding="utf-8")
    return scripts


_SCRIPTS = _load_scripts()


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def redis_url_problem(url: str) -> str | None:
    """What the Redis client would refuse in `url` as the store starts (an option it does not know, a value it cannot
    read), asked of the client itself, without connecting: such a URL ended `serve` in a traceback
    (`?socket_timeout=abc`) or kept the store degraded for good (`?foo=bar`: "subscription lost: TypeError")."""
    try:
        redis.ConnectionPool.from_url(url).make_connection()
    except TypeError as exc:
        option = re.search(r"argument '([^']+)'", str(exc))
        return f"the Redis URL's option {option.group(1)!r} is not one the client reads" if option else f"the Redis URL: {exc}"
    except (ValueError, redis.RedisError) as exc:
        return f"the Redis URL: {exc}"
    return None


class RedisStore(StateStore):
    """Shared state in Redis (see the module docstring). Run `run()` in a task group for its lifetime."""

    backend = "redis"

    def __init__(self, policy: StatePolicy, *, clock: Clock | None = None, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self.namespace = policy.namespace
        self.channel = f"{policy.namespace}:events"
        self.ttl_ms = math.ceil(policy.key_ttl_s * 1000)
        timeout = policy.timeout_s
        # No client-side retries: a failed command means "degraded" at once, not three slow tries.
        self._a = aredis.Redis.from_url(
            policy.url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=AsyncRetry(NoBackoff(), 0),
            decode_responses=True,
        )
        # The subscription waits for messages indefinitely; loss is seen as a closed connection.
        self._sub = aredis.Redis.from_url(
            policy.url, socket_connect_timeout=timeout, retry=AsyncRetry(NoBackoff(), 0), decode_responses=True
        )
        # Synchronous client for the one decision that must ask Redis inside a synchronous
        # acquire(): the half-open probe grant (bounded by the same timeout).
        self._s = redis.Redis.from_url(
            policy.url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0), decode_responses=True
        )
        self._ascripts = {name: self._a.register_script(src) for name, src in _SCRIPTS.items()}
        self._sscripts = {name: self._s.register_script(src) for name, src in _SCRIPTS.items()}
        self._mirrors: dict[str, Mirror] = {}
        self._budgets: dict[str, SharedBucket] = {}
        self._learned: dict[tuple[str, str], float] = {}
        self._learned_servers: set[str] = set()
        self._learned_dirty: dict[tuple[str, str], float | None] = {}
        self._queue: collections.deque[PendingOutcome] = collections.deque()
        # Events need a running event loop: made on first use, not here (a store may be built outside one).
        self._wake_event: anyio.Event | None = None
        self._attempted_event: anyio.Event | None = None
        self._healthy = False
        self._state = "connecting"
        self._since = self.clock.time()
        self._error: str | None = None
        self._degradations = 0
        self._subscribed = False
        #: Optional observer of decisions (the consistency checker records a history through it).
        self.on_event: Any = None

    # ---- StateStore -------------------------------------------------------------------------

    def status(self) -> StoreStatus:
        return StoreStatus(
            backend="redis",
            state=self._state,
            namespace=self.namespace,
            url=_redacted(self.policy.url),
            error=self._error,
            since=self._since,
            degradations=self._degradations,
        )

    @property
    def healthy(self) -> bool:
        return self._healthy

    def shared_breaker(self, name: str, policy: BreakerPolicy, rng: random.Random) -> Mirror:
        mirror = self._mirrors.get(name)
        if mirror is None:
            mirror = self._mirrors[name] = Mirror(self, name, policy, rng)
        return mirror

    def shared_budget(self, server: str, policy: RetryPolicy) -> SharedBucket:
        budget = self._budgets.get(server)
        if budget is None:
            budget = self._budgets[server] = SharedBucket(self, server, policy)
        return budget

    def learned_timeout(self, server: str, tool: str) -> float | None:
        self._learned_servers.add(server)
        return self._learned.get((server, tool))

    def set_learned_timeout(self, server: str, tool: str, seconds: float | None) -> None:
        self._learned_servers.add(server)
        if seconds is None:
            self._learned.pop((server, tool), None)
        else:
            self._learned[(server, tool)] = seconds
        self._learned_dirty[(server, tool)] = seconds
        self.kick()

    async def connect(self, timeout: float = 2.0) -> None:
        """Wait (at most `timeout`) until the first attempt to reach Redis finished, either way."""
        with self.clock.deadline_scope(self.clock.monotonic() + timeout):
            await self._attempted.wait()

    async def aclose(self) -> None:
        # Closing a dead connection must not fail shutdown.
        for client in (self._a, self._sub):
            with contextlib.suppress(Exception):
                await client.aclose()
        with contextlib.suppress(Exception):
            self._s.close()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._listen, name="breakwater state: subscription")
            tg.start_soon(self._write, name="breakwater state: writer")
            tg.start_soon(self._maintain, name="breakwater state: refresh")

    @property
    def _wake(self) -> anyio.Event:
        if self._wake_event is None:
            self._wake_event = anyio.Event()
        return self._wake_event

    @property
    def _attempted(self) -> anyio.Event:
        if self._attempted_event is None:
            self._attempted_event = anyio.Event()
        return self._attempted_event

    # ---- plumbing used by mirrors -----------------------------------------------------------

    def note_event(self, name: str, kind: str, epoch: int) -> None:
        if self.on_event is not None:
            self.on_event(name, kind, epoch)

    def kick(self) -> None:
        if self._wake_event is not None:
            self._wake_event.set()

    def enqueue(self, op: PendingOutcome) -> None:
        self._queue.append(op)
        self.kick()

    def call_sync(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script synchronously; None (and degraded) on any failure."""
        try:
            return self._sscripts[script](keys=keys, args=args)
        except Exception as exc:
            self._degrade(exc)
            return None

    async def _call(self, script: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._ascripts[script](keys=keys, args=args)
        except Exception as exc:
            self._degrade(exc)
            return None

    def _degrade(self, exc: BaseException | str) -> None:
        self._error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        if self._healthy or self._state == "connecting":
            logger.warning("state store degraded, using local state: %s", self._error)
            self._healthy = False
            self._state = "degraded"
            self._since = self.clock.time()
            self._degradations += 1
            self.note_event("", "degraded", 0)
        self._attempted.set()

    # ---- background tasks -------------------------------------------------------------------

    async def _listen(self) -> None:
        async def deliver(data: Any) -> None:
            self._on_message(data)

        def noted(holds: bool) -> None:
            self._subscribed = holds

        def lost(exc: Exception) -> None:
            self._degrade(f"subscription lost: {type(exc).__name__}: {exc}")

        pause_s = min(self.policy.retry_s, 0.1)
        await listen(self._sub, self.channel, deliver, clock=self.clock, pause_s=pause_s, lost=lost, subscribed=noted)

    def _on_message(self, data: Any) -> None:
        if not isinstance(data, str):
            return
        received = self.clock.monotonic()
        try:
            message = json.loads(data)
        except ValueError:
            return
        if "learned" in message:
            server, tool, seconds = message["learned"]
            if seconds is None:
                self._learned.pop((server, tool), None)
            else:
                self._learned[(server, tool)] = float(seconds)
            return
        mirror = self._mirrors.get(message.get("k", ""))
        if mirror is not None and mirror.known:
            mirror.apply(message["r"], received)

    async def _write(self) -> None:
        while True:
            await self._wake.wait()
            self._wake_event = anyio.Event()
            while self._queue:
                op = self._queue.popleft()
                if not self._healthy:
                    self._lost(op)
                    continue
                reply = await self._call("settle", [op.mirror.key], op.mirror.settle_args(op))
                if reply is None:
                    self._lost(op)
                else:
                    self.note_event(op.mirror.name, f"settle_{reply[0]}", op.epoch)
                    op.mirror.apply(reply)
            if self._healthy:
                await self._flush_budgets(only_pending=True)
                await self._flush_learned()

    def _lost(self, op: PendingOutcome) -> None:
        # The store went away with this report in hand: the local record (now in charge) takes it.
        if op.mirror.breaker is not None:
            op.mirror.breaker.settle_lost(op.epoch, op.outcome, op.slow)

    async def _flush_budgets(self, *, only_pending: bool) -> None:
        for b in list(self._budgets.values()):
            if only_pending and not b.pending:
                continue
            delta, b.pending = b.pending, 0.0
            p = b.policy
            reply = await self._call("budget", [b.key], [delta, p.budget_floor_per_min, p.budget_max_tokens, self.ttl_ms])
            if reply is None:
                return
            if b.budget is not None:
                b.budget.adopt(float(reply) + b.pending)

    async def _flush_learned(self) -> None:
        while self._learned_dirty:
            (server, tool), seconds = self._learned_dirty.popitem()
            key = f"{self.namespace}:learned:{{{server}}}"
            try:
                async with self._a.pipeline(transaction=True) as pipe:
                    if seconds is None:
                        pipe.hdel(key, tool)
                    else:
                        pipe.hset(key, tool, repr(seconds))
                    pipe.pexpire(key, self.ttl_ms)
                    pipe.publish(self.channel, json.dumps({"learned": [server, tool, seconds]}))
                    await pipe.execute()
            except Exception as exc:
                self._degrade(exc)
                return

    async def _maintain(self) -> None:
        last_refresh = -math.inf
        last_try = -math.inf
        while True:
            await self.clock.sleep(0.02 if self._state == "connecting" else 0.05)
            now = self.clock.monotonic()
            if not self._healthy:
                if self._subscribed and now - last_try >= (0.0 if self._state == "connecting" else self.policy.retry_s):
                    last_try = now
                    if await self._resync():
                        last_refresh = self.clock.monotonic()
                elif not self._subscribed and self._state == "connecting" and now - last_try > self.policy.timeout_s * 4:
                    last_try = now
                    self._attempted.set()  # the subscription has not come up: report degraded soon
                continue
            if now - last_refresh >= self.policy.refresh_s:
                last_refresh = now
                await self._refresh()

    async def _read_all(self) -> bool:
        mirrors = list(self._mirrors.values())
        if not mirrors:
            return True
        args: list[Any] = [self.channel, self.ttl_ms]
        for m in mirrors:
            args += [m.name, m.epoch]
        replies = await self._call("read", [m.key for m in mirrors], args)
        if replies is None:
            return False
        for m, r in zip(mirrors, replies, strict=True):
            if r[0] == "missing" and self._state != "ok":
                # Redis lost the key (restart): a local open made during the outage is written back once.
                snap = m.breaker.snapshot() if m.breaker is not None else None
                if snap is not None and snap.state is BreakerState.OPEN and snap.retry_after_s > 0:
                    seeded = await self._call(
                        "seed",
                        [m.key],
                        [
                            m.name,
                            m.epoch,
                            math.ceil(snap.retry_after_s * 1000),
                            snap.consecutive_opens,
                            snap.reason,
                            self.ttl_ms,
                            self.channel,
                        ],
                    )
                    if seeded is None:
                        return False
                    r = seeded
            m.apply(r)
        return True

    async def _refresh(self) -> None:
        if not await self._read_all():
            return
        await self._flush_budgets(only_pending=False)
        for server in list(self._learned_servers):
            try:
                values = await self._a.hgetall(f"{self.namespace}:learned:{{{server}}}")
            except Exception as exc:
                self._degrade(exc)
                return
            for tool, seconds in values.items():
                self._learned[(server, tool)] = float(seconds)

    async def _resync(self) -> bool:
        """Redis answers again: re-read everything, then serve from shared state again."""
        try:
            await self._a.ping()
        except Exception as exc:
            self._degrade(exc)
            return False
        if not await self._read_all():
            return False
        for b in self._budgets.values():
            b.pending = 0.0  # changes made while degraded stayed local; the shared count is adopted below
        self._healthy = True
        await self._flush_budgets(only_pending=False)
        if not self._healthy:
            return False
        was = self._state
        self._state = "ok"
        self._error = None
        self._since = self.clock.time()
        self._attempted.set()
        logger.info("state store %s", "connected" if was == "connecting" else "back: resynchronised, shared state in use")
        self.note_event("", "healthy", 0)
        return True
