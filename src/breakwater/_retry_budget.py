"""Retry policy and the per-server retry budget.

Per call: at most `max_attempts` attempts (3: SRE, AWS SDK, resilience4j), full-jitter backoff
between them, a server's `retry_after` hint honoured as a floor.

Per server: a token bucket that retries must draw from, so an outage does not multiply load.
Measured in resilience-numbers.md §2.6: no budget turns a full outage into 4× load; a plain
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
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from breakwater._backoff import Backoff
from breakwater._clock import Clock
from breakwater._knobs import knob
from breakwater.errors import ConfigError

__all__ = ["RetryBudget", "RetryBudgetSnapshot", "RetryPolicy"]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently a failed call is retried."""

    max_attempts: int = knob(
        3,
        "Attempts per call, the first one included (1 = never retry).",
        env="BREAKWATER_RETRY_MAX_ATTEMPTS",
        minimum=1,
    )
    backoff_base_s: float = knob(
        0.5,
        "Ceiling of the random wait before the first retry; doubles per retry (full jitter).",
        env="BREAKWATER_RETRY_BACKOFF_BASE_S",
        minimum=0.001,
    )
    backoff_cap_s: float = knob(
        10.0,
        "The longest wait between two attempts, before any retry-after hint.",
        env="BREAKWATER_RETRY_BACKOFF_CAP_S",
        minimum=0.001,
    )
    max_retry_after_s: float = knob(
        30.0,
        "A server's retry-after hint longer than this is not waited for; the call fails instead.",
        env="BREAKWATER_RETRY_MAX_RETRY_AFTER_S",
        minimum=0.0,
    )
    budget_ratio: float = knob(
        0.1,
        "Retry tokens a server earns per first-attempt success (0.1: retries may add about 10 %).",
        env="BREAKWATER_RETRY_BUDGET_RATIO",
        minimum=0.0,
    )
    budget_floor_per_min: float = knob(
        3.0,
        "Retry tokens a server earns per minute regardless of traffic, so rarely called tools can retry.",
        env="BREAKWATER_RETRY_BUDGET_FLOOR_PER_MIN",
        minimum=0.0,
    )
    budget_max_tokens: float = knob(
        10.0,
        "Most retry tokens a server can bank (the bucket starts full).",
        env="BREAKWATER_RETRY_BUDGET_MAX_TOKENS",
        minimum=0.0,
    )

    def __post_init__(self) -> None:
        if self.backoff_cap_s < self.backoff_base_s:
            raise ConfigError(
                f"backoff_cap_s ({self.backoff_cap_s}) is below backoff_base_s ({self.backoff_base_s})",
                key="backoff_cap_s",
                fix="raise backoff_cap_s or lower backoff_base_s",
            )

    @property
    def backoff(self) -> Backoff:
        """The full-jitter schedule these knobs describe."""
        return Backoff(base_s=self.backoff_base_s, cap_s=self.backoff_cap_s)

    def delay(self, retry: int, rng: random.Random, retry_after_s: float | None = None) -> float | None:
        """The wait before retry number `retry` (0 = first retry), or None if the hint is too long to wait.

        A server's retry-after is a floor: waiting less would only earn another refusal.
        """
        drawn = self.backoff.delay(retry, rng)
        if retry_after_s is None:
            return drawn
        if retry_after_s > self.max_retry_after_s:
            return None
        return max(drawn, retry_after_s)


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
                return True
            self._refused += 1
            return False

    def record_success(self, *, was_retry: bool) -> None:
        """An attempt succeeded: a first attempt earns `budget_ratio`, a retry gets its token back."""
        with self._lock:
            self._refill()
            self._add(1.0 if was_retry else self.policy.budget_ratio)

    def snapshot(self) -> RetryBudgetSnapshot:
        """Tokens and counters."""
        with self._lock:
            self._refill()
            return RetryBudgetSnapshot(tokens=self._tokens, retries_granted=self._granted, retries_refused=self._refused)
