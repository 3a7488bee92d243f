"""Retry policy and the per-server retry budget, simulated on a FakeClock."""

from __future__ import annotations

import random

import pytest

from breakwater.config import RetryPolicy
from breakwater.config._knobs import iter_knobs
from breakwater.errors import ConfigError
from breakwater.gate._retry_budget import RetryBudget
from breakwater.testing import FakeClock


def simulate(
    *, calls: int, failure_p: float, interval_s: float, seed: int = 1, policy: RetryPolicy | None = None
) -> tuple[float, float, RetryBudget]:
    """Logical calls against one server; returns (attempts per call, success rate, budget)."""
    policy = policy or RetryPolicy()
    clock = FakeClock()
    budget = RetryBudget(policy, clock=clock)
    rng = random.Random(seed)
    attempts = successes = 0
    for _ in range(calls):
        for attempt in range(policy.max_attempts):
            if attempt > 0 and not budget.try_acquire():
                break
            attempts += 1
            if rng.random() >= failure_p:
                budget.record_success(was_retry=attempt > 0)
                successes += 1
                break
        clock.advance(interval_s)
    return attempts / calls, successes / calls, budget


@pytest.mark.parametrize("interval_s", [0.01, 0.1, 1.0])
def test_a_full_outage_adds_at_most_ten_percent_load(interval_s: float) -> None:
    # 1000 logical calls at 100, 10 and 1 per second; without a budget this is 3.0 attempts per call.
    amplification, success, _ = simulate(calls=1_000, failure_p=1.0, interval_s=interval_s)
    assert success == 0.0
    assert amplification <= 1.1


def test_a_long_outage_converges_to_one_attempt_per_call() -> None:
    amplification, _, budget = simulate(calls=10_000, failure_p=1.0, interval_s=0.1)
    # Only the initial 10 tokens and the 3-per-minute floor: 10 + 3 × 16.7 min ≈ 60 retries.
    assert amplification < 1.01
    assert budget.snapshot().retries_granted == pytest.approx(10 + 3 * 10_000 * 0.1 / 60, abs=2)


def test_ten_percent_random_failure_loses_no_retry_to_the_budget() -> None:
    amplification, success, budget = simulate(calls=20_000, failure_p=0.1, interval_s=0.01, seed=3)
    snap = budget.snapshot()
    assert snap.retries_refused == 0  # so success is exactly what 3 attempts can give: 1 − 0.1³
    assert success >= 0.998
    assert amplification == pytest.approx(1.11, abs=0.01)


def test_half_failing_upstream_is_held_near_the_ratio() -> None:
    amplification, _, _ = simulate(calls=10_000, failure_p=0.5, interval_s=0.01, seed=5)
    # Unlimited, 3 attempts at 50 % failure would be 1.75×; the budget lets failing retries cost at
    # most ~10 % of successes (refunded successful retries come back).
    assert amplification < 1.75
    assert amplification == pytest.approx(1.1, abs=0.1)


def test_a_rarely_called_tool_can_still_retry_thanks_to_the_floor() -> None:
    clock = FakeClock()
    budget = RetryBudget(RetryPolicy(budget_max_tokens=1.0), clock=clock)
    assert budget.try_acquire()
    assert not budget.try_acquire()  # drained
    clock.advance(20)  # 3 per minute: one token every 20 s
    assert budget.try_acquire()
    assert not budget.try_acquire()


def test_idle_time_does_not_bank_more_than_the_cap() -> None:
    clock = FakeClock()
    budget = RetryBudget(RetryPolicy(), clock=clock)
    clock.advance(24 * 3600)
    assert budget.tokens == 10.0
    granted = sum(budget.try_acquire() for _ in range(100))
    assert granted == 10


def test_a_successful_retry_gets_its_token_back_and_first_successes_earn_the_ratio() -> None:
    clock = FakeClock()
    budget = RetryBudget(RetryPolicy(budget_max_tokens=5.0, budget_floor_per_min=0.0), clock=clock)
    assert budget.try_acquire()
    assert budget.tokens == 4.0
    budget.record_success(was_retry=True)
    assert budget.tokens == 5.0
    for _ in range(5):
        assert budget.try_acquire()
    for _ in range(10):
        budget.record_success(was_retry=False)
    assert budget.tokens == pytest.approx(1.0)


def test_backoff_is_full_jitter_and_honours_retry_after() -> None:
    policy = RetryPolicy()
    rng = random.Random(9)
    first = [policy.delay(0, rng) for _ in range(2_000)]
    second = [policy.delay(1, rng) for _ in range(2_000)]
    assert all(d is not None and 0.0 <= d <= 0.5 for d in first)
    assert all(d is not None and 0.0 <= d <= 1.0 for d in second)
    assert max(d for d in first if d is not None) > 0.45  # uses the whole range, not a fixed step
    assert all((d := policy.delay(0, rng, retry_after_s=2.0)) is not None and d >= 2.0 for _ in range(100))
    assert policy.delay(0, rng, retry_after_s=31.0) is None  # longer than max_retry_after_s: do not wait


def test_policy_knobs() -> None:
    names = {k.name: k.default for k in iter_knobs("retry", RetryPolicy)}
    assert names["max_attempts"] == 3
    assert names["budget_ratio"] == 0.1
    with pytest.raises(ConfigError):
        RetryPolicy(backoff_base_s=5, backoff_cap_s=1)
