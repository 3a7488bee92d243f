"""Retry policy and the per-server retry budget.

Per call: at most `max_attempts` attempts (3: SRE, AWS SDK, resilience4j), full-jitter backoff
between them, a server's `retry_after` hint honoured as a floor.

Per server: a token bucket that retries must draw from, so an outage does not multiply load.
A simulation of 100 calls/s with up to 4 attempts measured it: no budget turns a full outage into 4× load; a plain
"retries ≤ 10 % of calls" ratio caps it near 1.11× but, with only 3 attempts, already refuses
useful retries at 10 % random failure. So the bucket is fed by *successes*, and a retry that
succeeds gives its token back (the AWS SDK retry-quota idea):

* a first attempt that succeeds deposits `budget_ratio` tokens (0.1: retries may add ~10 %);
* a retry takes one token before it starts, and gets it back if it succeeds;
* `budget_floor_per_min` tokens trickle in regardless, so a tool called a few times a minute can
  still retry (Finagle keeps a floor for the same reason);
* the bucket holds at most `budget_max_tokens` and starts full.

At 100 % failure nothing is deposited or refunded: retries are limited to the initial bucket plus
the floor, ≈ 1.0× load over a long outage. At 10 % failure almost every retry succeeds and is
refunded, so no retry is refused.

With a shared state store (`breakwater.state._base`) the bucket is one per server for the whole
deployment: each replica still decides from its local copy (no round trip per retry) and writes
its token changes behind; the store applies them atomically, refills by its own clock and sends
the shared count back, so replicas converge within one sync interval.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from breakwater._clock import Clock
from breakwater.config._policies import RetryPolicy

__all__ = ["RetryBudget", "RetryBudgetSnapshot", "SharedBudget"]


class SharedBudget(Protocol):
    """A retry bucket kept in a shared store (see `breakwater.state._base`)."""

    def active(self) -> bool:
        """Whether the store is usable now (else the local bucket stands alone)."""
        ...

    def note(self, delta: float) -> None:
        """Tokens this replica took (negative) or earned (positive), to apply to the shared bucket."""
        ...

    def bind(self, budget: RetryBudget) -> None:
        """The local bucket to update with the shared count after each sync."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBudgetSnapshot:
    """A retry budget's counters for `status`."""

    tokens: float
    retries_granted: int
    retries_refused: int


class RetryBudget:
    """One server's retry token bucket (see the module docstring for the rules)."""

    def __init__(self, policy: RetryPolicy | None = None, *, clock: Clock) -> None:
        self.policy = policy or RetryPolicy()
        self._clock = clock
        self._tokens = self.policy.budget_max_tokens
        self._stamp = clock.monotonic()
        self._granted = 0
        self._refused = 0
        self._lock = threading.Lock()
        self._shared: SharedBudget | None = None

    def attach(self, shared: SharedBudget | None) -> None:
        """Share this bucket through a state store from now on (None: in this process)."""
        self._shared = shared
        if shared is not None:
            shared.bind(self)

    def adopt(self, tokens: float) -> None:
        """The shared count after a sync (plus whatever this replica changed since it was sent)."""
        with self._lock:
            self._tokens = max(0.0, min(self.policy.budget_max_tokens, tokens))
            # The store refilled up to its own now; refill locally only from here on.
            self._stamp = self._clock.monotonic()

    def _note(self, delta: float) -> None:
        shared = self._shared
        if shared is not None and delta and shared.active():
            shared.note(delta)

    def _refill(self) -> None:
        now = self._clock.monotonic()
        elapsed = now - self._stamp
        self._stamp = now
        if elapsed > 0:
            self._add(elapsed * self.policy.budget_floor_per_min / 60.0)

    def _add(self, tokens: float) -> None:
        self._tokens = min(self.policy.budget_max_tokens, self._tokens + tokens)

    @property
    def tokens(self) -> float:
        """Retry tokens available now."""
        with self._lock:
            self._refill()
            return self._tokens

    def try_acquire(self) -> bool:
        """Take one token for a retry; False means the retry must not be made."""
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                self._granted += 1
                self._note(-1.0)
                return True
            self._refused += 1
            return False

    def refund(self) -> None:
        """Give back the token of a retry refused before it was sent (a breaker its last attempt opened, a full
        bulkhead): a burst spent the bucket on retries that never went, and the next were refused for a "spent" budget."""
        with self._lock:
            self._refill()
            self._add(1.0)
            self._granted -= 1
            self._note(1.0)

    def record_success(self, was_retry: bool) -> None:
        """An attempt succeeded: a first attempt earns `budget_ratio`, a retry gets its token back."""
        # Full already (the usual case): nothing to add, decided without the lock (~1,000 instructions
        # a call): a spend racing this read is as if it came after it, and a full bucket stays full. The
        # refill time stamp may lag: every decrease refills first, and refilling a full bucket is clipped to it.
        if self._shared is None and self._tokens >= self.policy.budget_max_tokens:
            return
        with self._lock:
            if self._shared is None and self._tokens >= self.policy.budget_max_tokens:
                return
            self._refill()
            earned = 1.0 if was_retry else self.policy.budget_ratio
            self._add(earned)
            # The nominal amount, not what fitted locally: the shared bucket may have room this one lacks.
            self._note(earned)

    def snapshot(self) -> RetryBudgetSnapshot:
        """Tokens and counters."""
        with self._lock:
            self._refill()
            return RetryBudgetSnapshot(tokens=self._tokens, retries_granted=self._granted, retries_refused=self._refused)
