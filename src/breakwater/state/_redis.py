"""The Redis state store: breakers, retry budgets and learned timeouts shared by replicas.

Key layout (`NS` = `[state] namespace`; the `{…}` hash tag keeps one breaker's keys in one slot):

    NS:breaker:{NAME}          hash  st (closed|open|half_open), ep (epoch), ou (open until, Redis ms),
                                     op (consecutive opens), cf (consecutive failures),
                                     le (probe lease until, Redis ms), rs (reason)     TTL key_ttl_s
    NS:breaker:{NAME}:w:IDX    hash  calls, failures, slow of window bucket IDX      TTL window + 1 bucket
    NS:budget:{SERVER}         hash  t (tokens), ts (last refill, Redis ms)           TTL key_ttl_s
    NS:learned:{SERVER}        hash  TOOL -> seconds                                  TTL key_ttl_s
    NS:events                  pub/sub channel: every breaker change and learned timeout, as JSON

Scripts (each one atomic; all times from Redis `TIME`, never a replica's clock, so clock skew
between replicas cannot move an open-until or a lease):

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

Decisions: a `_Mirror` per breaker holds the last state seen, updated by script replies and
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
import time
from dataclasses import dataclass
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
from breakwater.gate._breaker import BreakerState, CircuitBreaker, Outcome, Rejection, SharedView
from breakwater.gate._retry_budget import RetryBudget
from breakwater.state._base import StateStore, StoreStatus

__all__ = ["RedisStore"]

logger = logging.getLogger("breakwater.state")

_BUCKETS = 12  # as the in-process window (breakwater.gate._breaker)

_PRELUDE = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(x) return string.format('%.0f', x) end
local function load(key, floor)
  local v = redis.call('HMGET', key, 'st', 'ep', 'ou', 'op', 'cf', 'le', 'rs')
  local s = {st = v[1] or 'closed', ep = tonumber(v[2] or '0'), ou = tonumber(v[3] or '0'), op = tonumber(v[4] or '0'),
             cf = tonumber(v[5] or '0'), le = tonumber(v[6] or '0'), rs = v[7] or '', fresh = not v[2],
             calls = '', failures = '', slow = ''}
  if s.fresh then s.ep = math.max(floor, 0) end
  return s
end
local function save(key, s, ttl)
  redis.call('HSET', key, 'st', s.st, 'ep', fmt(s.ep), 'ou', fmt(s.ou), 'op', s.op, 'cf', s.cf, 'le', fmt(s.le), 'rs', s.rs)
  redis.call('PEXPIRE', key, ttl)
end
local function reply(tag, s, now)
  return {tag, s.st, fmt(s.ep), fmt(s.ou), s.op, s.cf, fmt(s.le), s.rs, fmt(now), s.calls, s.failures, s.slow}
end
local function publish(channel, name, r)
  redis.call('PUBLISH', channel, cjson.encode({k = name, r = r}))
end
local function bump(s, floor, now)
  s.ep = math.max(s.ep, floor, now * 1000) + 1
end
"""

# KEYS[1] state; ARGV: name, floor, lease_ms, ttl_ms, channel
_PROBE = (
    _PRELUDE
    + r"""
local floor = tonumber(ARGV[2])
local now = now_ms()
local s = load(KEYS[1], floor)
if s.st == 'closed' then return reply('closed', s, now) end
local changed = false
if s.st == 'open' then
  if now < s.ou then return reply('open', s, now) end
  s.st = 'half_open'; s.le = 0; bump(s, floor, now); changed = true
end
if s.le > now then
  if changed then save(KEYS[1], s, tonumber(ARGV[4])) end
  return reply('busy', s, now)
end
bump(s, floor, now)
s.le = now + tonumber(ARGV[3])
save(KEYS[1], s, tonumber(ARGV[4]))
local r = reply('granted', s, now)
publish(ARGV[5], ARGV[1], r)
return r
"""
)

# KEYS[1] state; ARGV: name, epoch, outcome (s|f|i), slow (0|1), floor, ttl_ms, channel, window_ms,
# minimum_calls, failure_rate, consecutive_failures, slow_call_rate, open_base_ms, open_max_ms, jitter factor
_SETTLE = (
    _PRELUDE
    + r"""
local floor = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local now = now_ms()
local s = load(KEYS[1], floor)
if tonumber(ARGV[2]) ~= s.ep then return reply('stale', s, now) end
local outcome = ARGV[3]
local slow = ARGV[4] == '1' and outcome ~= 'i'
local window = tonumber(ARGV[8])
local width = window / 12
local idx = math.floor(now / width)
local function open(reason)
  s.op = s.op + 1
  local base, cap = tonumber(ARGV[13]), tonumber(ARGV[14])
  local d = cap
  if s.op <= 64 then d = math.min(cap, base * 2 ^ (s.op - 1)) end
  d = math.min(cap, d * tonumber(ARGV[15]))
  bump(s, floor, now); s.st = 'open'; s.ou = now + d; s.le = 0; s.rs = reason
end
local function clear_window()
  for i = idx - 11, idx do redis.call('DEL', KEYS[1] .. ':w:' .. fmt(i)) end
end
if s.st == 'half_open' then
  if outcome == 'i' then
    s.le = 0
  elseif outcome == 's' and not slow then
    bump(s, floor, now); s.st = 'closed'; s.op = 0; s.cf = 0; s.ou = 0; s.le = 0; s.rs = ''; clear_window()
  elseif outcome == 's' then
    open('probe was slow')
  else
    open('probe failed')
  end
  save(KEYS[1], s, ttl)
  local r = reply('applied', s, now)
  publish(ARGV[7], ARGV[1], r)
  return r
end
if s.st ~= 'closed' or outcome == 'i' then return reply('ignored', s, now) end
local failed = outcome == 'f'
local bkey = KEYS[1] .. ':w:' .. fmt(idx)
redis.call('HINCRBY', bkey, 'calls', 1)
if failed then redis.call('HINCRBY', bkey, 'failures', 1) end
if slow then redis.call('HINCRBY', bkey, 'slow', 1) end
redis.call('PEXPIRE', bkey, math.ceil(window + width))
if failed then s.cf = s.cf + 1 else s.cf = 0 end
local calls, failures, slows = 0, 0, 0
for i = idx - 11, idx do
  local b = redis.call('HMGET', KEYS[1] .. ':w:' .. fmt(i), 'calls', 'failures', 'slow')
  calls = calls + tonumber(b[1] or '0'); failures = failures + tonumber(b[2] or '0'); slows = slows + tonumber(b[3] or '0')
end
s.calls, s.failures, s.slow = calls, failures, slows
local reason = nil
local secs = string.format('%g', window / 1000)
if s.cf >= tonumber(ARGV[11]) then
  reason = s.cf .. ' consecutive failures'
elseif calls >= tonumber(ARGV[9]) then
  if failures / calls >= tonumber(ARGV[10]) then
    reason = failures .. ' of ' .. calls .. ' calls failed in ' .. secs .. ' s'
  elseif slows / calls >= tonumber(ARGV[12]) then
    reason = slows .. ' of ' .. calls .. ' calls were slow in ' .. secs .. ' s'
  end
end
if reason then open(reason) end
save(KEYS[1], s, ttl)
local r = reply('applied', s, now)
if reason then publish(ARGV[7], ARGV[1], r) end
return r
"""
)

# KEYS: states; ARGV: channel, ttl_ms, then per key: name, floor
_READ = (
    _PRELUDE
    + r"""
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local name, floor = ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])
  local s = load(key, floor)
  if s.fresh then
    out[i] = reply('missing', s, now)
  else
    if floor > s.ep then
      -- Redis restarted and another replica re-created the key below what this one has seen.
      bump(s, floor, now); save(key, s, tonumber(ARGV[2]))
      out[i] = reply('state', s, now)
      publish(ARGV[1], name, out[i])
    else
      out[i] = reply('state', s, now)
    end
  end
end
return out
"""
)

# KEYS[1] state; ARGV: name, floor, remaining_ms, opens, reason, ttl_ms, channel
_SEED = (
    _PRELUDE
    + r"""
local floor = tonumber(ARGV[2])
local now = now_ms()
local s = load(KEYS[1], floor)
if not s.fresh then return reply('state', s, now) end
bump(s, floor, now)
s.st = 'open'; s.ou = now + tonumber(ARGV[3]); s.op = tonumber(ARGV[4]); s.rs = ARGV[5]; s.le = 0
save(KEYS[1], s, tonumber(ARGV[6]))
local r = reply('state', s, now)
publish(ARGV[7], ARGV[1], r)
return r
"""
)

# KEYS[1] budget; ARGV: delta, floor_per_min, max_tokens, ttl_ms
_BUDGET = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(v[1] or ARGV[3])
local ts = tonumber(v[2] or tostring(now))
if now > ts then tokens = math.min(cap, tokens + (now - ts) * tonumber(ARGV[2]) / 60000) end
tokens = math.max(0, math.min(cap, tokens + tonumber(ARGV[1])))
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return string.format('%.6f', tokens)
"""

_SCRIPTS = {"probe": _PROBE, "settle": _SETTLE, "read": _READ, "seed": _SEED, "budget": _BUDGET}
_OUTCOME_CODE = {Outcome.SUCCESS: "s", Outcome.FAILURE: "f", Outcome.IGNORED: "i"}


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class _Mirror:
    """One breaker's shared state as this replica last saw it; implements `SharedBreaker`."""

    __slots__ = (
        "breaker",
        "calls",
        "consecutive_failures",
        "epoch",
        "failures",
        "key",
        "known",
        "lease_until",
        "name",
        "open_until",
        "opens",
        "policy",
        "reason",
        "rng",
        "slow",
        "state",
        "store",
    )

    def __init__(self, store: RedisStore, name: str, policy: BreakerPolicy, rng: random.Random) -> None:
        self.store = store
        self.name = name
        self.key = f"{store.namespace}:breaker:{{{name}}}"
        self.policy = policy
        self.rng = rng
        self.breaker: CircuitBreaker | None = None
        self.known = False
        self.state = BreakerState.CLOSED
        self.epoch = 0
        self.open_until = -math.inf
        self.lease_until = -math.inf
        self.opens = 0
        self.consecutive_failures = 0
        self.reason = ""
        self.calls = self.failures = self.slow = 0

    # ---- SharedBreaker ----------------------------------------------------------------------

    def bind(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker

    def admit(self, now: float, lease_s: float) -> tuple[int, bool] | Rejection | None:
        store = self.store
        if not store.healthy:
            return None
        if not self.known:
            # First use of this breaker on this replica: one round trip, so a breaker another
            # replica opened is honoured from the very first call.
            got = store.call_sync("read", [self.key], [store.channel, store.ttl_ms, self.name, self.epoch])
            if got is None:
                return None
            self.apply(got[0])
        if self.state is BreakerState.CLOSED:
            return self.epoch, False
        if self.state is BreakerState.OPEN and now < self.open_until:
            return Rejection(self.open_until - now, BreakerState.OPEN, self.reason)
        if self.state is BreakerState.HALF_OPEN and self.lease_until > now:
            return Rejection(self._half_open_wait(now), BreakerState.HALF_OPEN, self.reason)
        # Due for a probe: only Redis can say whether this replica gets the lease.
        reply = store.call_sync(
            "probe", [self.key], [self.name, self.epoch, math.ceil(lease_s * 1000), store.ttl_ms, store.channel]
        )
        if reply is None:
            return None
        store.note_event(self.name, "probe_" + str(reply[0]), int(reply[2]))
        self.apply(reply)
        tag = reply[0]
        now = store.clock.monotonic()
        if tag == "granted":
            return int(reply[2]), True
        if tag == "closed":
            return int(reply[2]), False
        if tag == "open":
            return Rejection(max(0.0, self.open_until - now), BreakerState.OPEN, self.reason)
        return Rejection(self._half_open_wait(now), BreakerState.HALF_OPEN, self.reason)

    def settle(self, epoch: int, is_probe: bool, outcome: Outcome, slow: bool) -> bool:
        store = self.store
        if not store.healthy:
            return False
        if epoch < self.epoch or (outcome is Outcome.IGNORED and not is_probe):
            return True  # stale for certain (Redis is at least as far), or nothing to record: no round trip
        store.enqueue(_Op(self, epoch, outcome, slow))
        return True

    def available(self) -> bool:
        return self.store.healthy

    def view(self, now: float) -> SharedView | None:
        if not self.known:
            return None
        return SharedView(
            state=self.state,
            epoch=self.epoch,
            open_until=self.open_until,
            consecutive_opens=self.opens,
            consecutive_failures=self.consecutive_failures,
            probe_lease_until=self.lease_until,
            reason=self.reason,
            calls=self.calls,
            failures=self.failures,
            slow=self.slow,
        )

    # ---- updates ----------------------------------------------------------------------------

    def _half_open_wait(self, now: float) -> float:
        return max(0.0, min(self.lease_until - now, self.policy.open_base_s))

    def apply(self, r: list[Any], received: float | None = None) -> bool:
        """Adopt a script reply (or a published one) unless it is older than what is known."""
        epoch = int(r[2])
        if self.known and epoch < self.epoch:
            return False
        at = self.store.clock.monotonic() if received is None else received
        server_now = float(r[8])
        self.known = True
        if epoch > self.epoch:
            self.store.note_event(self.name, "adopt", epoch)
        self.epoch = epoch
        self.state = BreakerState(str(r[1]))
        open_until, lease = float(r[3]), float(r[6])
        # Redis time -> this replica's monotonic line, through durations: replica clocks never meet.
        self.open_until = at + (open_until - server_now) / 1000 if self.state is BreakerState.OPEN else -math.inf
        self.lease_until = at + (lease - server_now) / 1000 if lease > 0 else -math.inf
        self.opens = int(r[4])
        self.consecutive_failures = int(r[5])
        self.reason = str(r[7])
        if r[9] != "" and r[9] is not None:
            self.calls, self.failures, self.slow = int(r[9]), int(r[10]), int(r[11])
        elif self.state is not BreakerState.CLOSED:
            self.calls = self.failures = self.slow = 0
        return True

    def settle_args(self, op: _Op) -> list[Any]:
        p = self.policy
        store = self.store
        return [
            self.name,
            op.epoch,
            _OUTCOME_CODE[op.outcome],
            "1" if op.slow else "0",
            self.epoch,
            store.ttl_ms,
            store.channel,
            p.window_s * 1000,
            p.minimum_calls,
            p.failure_rate,
            p.consecutive_failures,
            p.slow_call_rate,
            p.open_base_s * 1000,
            p.open_max_s * 1000,
            self.rng.uniform(1.0 - p.open_jitter, 1.0 + p.open_jitter),
        ]


@dataclass(slots=True)
class _Op:
    mirror: _Mirror
    epoch: int
    outcome: Outcome
    slow: bool


class _Budget:
    """One server's shared retry bucket; implements `SharedBudget`."""

    __slots__ = ("budget", "key", "pending", "policy", "store")

    def __init__(self, store: RedisStore, server: str, policy: RetryPolicy) -> None:
        self.store = store
        self.key = f"{store.namespace}:budget:{{{server}}}"
        self.policy = policy
        self.pending = 0.0
        self.budget: RetryBudget | None = None

    def active(self) -> bool:
        return self.store.healthy

    def note(self, delta: float) -> None:
        self.pending += delta
        self.store.kick()

    def bind(self, budget: RetryBudget) -> None:
        self.budget = budget


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
        self._mirrors: dict[str, _Mirror] = {}
        self._budgets: dict[str, _Budget] = {}
        self._learned: dict[tuple[str, str], float] = {}
        self._learned_servers: set[str] = set()
        self._learned_dirty: dict[tuple[str, str], float | None] = {}
        self._queue: collections.deque[_Op] = collections.deque()
        # Events need a running event loop: made on first use, not here (a store may be built outside one).
        self._wake_event: anyio.Event | None = None
        self._attempted_event: anyio.Event | None = None
        self._healthy = False
        self._state = "connecting"
        self._since = time.time()
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

    def shared_breaker(self, name: str, policy: BreakerPolicy, rng: random.Random) -> _Mirror:
        mirror = self._mirrors.get(name)
        if mirror is None:
            mirror = self._mirrors[name] = _Mirror(self, name, policy, rng)
        return mirror

    def shared_budget(self, server: str, policy: RetryPolicy) -> _Budget:
        budget = self._budgets.get(server)
        if budget is None:
            budget = self._budgets[server] = _Budget(self, server, policy)
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
        # Real time: a network connect, awaited at start-up, must end even when no one moves a fake clock.
        with anyio.move_on_after(timeout):  # noqa: TID251 - real-time bound on a network connect
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

    def enqueue(self, op: _Op) -> None:
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
            self._since = time.time()
            self._degradations += 1
            self.note_event("", "degraded", 0)
        self._attempted.set()

    # ---- background tasks -------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            pubsub = self._sub.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self._subscribed = True
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is not None:
                        self._on_message(message.get("data"))
            except Exception as exc:
                self._subscribed = False
                self._degrade(f"subscription lost: {type(exc).__name__}: {exc}")
            finally:
                self._subscribed = False
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0), contextlib.suppress(Exception):  # noqa: TID251 - cleanup
                    await pubsub.aclose()
            await self.clock.sleep(min(self.policy.retry_s, 0.1))

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

    def _lost(self, op: _Op) -> None:
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
        self._since = time.time()
        self._attempted.set()
        logger.info("state store %s", "connected" if was == "connecting" else "back: resynchronised, shared state in use")
        self.note_event("", "healthy", 0)
        return True
