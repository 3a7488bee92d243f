"""A replica's mirror of shared state in Redis: one `_Mirror` per breaker, one `_Budget` per server.

Each implements the gate's shared-state interface (`SharedBreaker`, `SharedBudget`) on top of a
`RedisHost` (the `RedisStore` that owns them): decisions are made from the last state seen, only a
would-be probe asks Redis, and outcomes are queued for the store's writer. May import the core
leaves, `config` and `gate` only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Protocol

from breakwater._clock import Clock
from breakwater.config._policies import BreakerPolicy, RetryPolicy
from breakwater.gate._breaker import BreakerState, CircuitBreaker, Outcome, Rejection, SharedView
from breakwater.gate._retry_budget import RetryBudget

__all__ = ["Mirror", "PendingOutcome", "RedisHost", "SharedBucket"]

_OUTCOME_CODE = {Outcome.SUCCESS: "s", Outcome.FAILURE: "f", Outcome.IGNORED: "i"}


class RedisHost(Protocol):
    """What a mirror needs of the store that owns it (`RedisStore`)."""

    clock: Clock
    namespace: str
    channel: str
    ttl_ms: int

    @property
    def healthy(self) -> bool:
        """Whether shared state is in use right now."""

    def call_sync(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script synchronously; None (and degraded) on any failure."""

    def note_event(self, name: str, kind: str, epoch: int) -> None:
        """Tell the optional observer about a decision."""

    def enqueue(self, op: PendingOutcome) -> None:
        """Queue an outcome for the writer."""

    def kick(self) -> None:
        """Wake the writer."""


class Mirror:
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

    def __init__(self, store: RedisHost, name: str, policy: BreakerPolicy, rng: random.Random) -> None:
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
        store.enqueue(PendingOutcome(self, epoch, outcome, slow))
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

    def settle_args(self, op: PendingOutcome) -> list[Any]:
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
class PendingOutcome:
    """One outcome waiting for the writer to run `SETTLE` with it."""

    mirror: Mirror
    epoch: int
    outcome: Outcome
    slow: bool


class SharedBucket:
    """One server's shared retry bucket; implements `SharedBudget`."""

    __slots__ = ("budget", "key", "pending", "policy", "store")

    def __init__(self, store: RedisHost, server: str, policy: RetryPolicy) -> None:
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
