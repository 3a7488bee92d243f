"""The state store: in-process default, and Redis shared by several replicas (real Redis).

Replicas here are separate `RedisStore` instances (own connections, own mirrors) in one process;
tests/test_redis_replicas.py runs real gateway processes. Redis tests skip when 127.0.0.1:6379 is
unreachable, except under `CI=true`, where that is a failure. The outage test starts its own
redis-server on another port and kills it; the machine's server is never touched.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import anyio
import pytest

from breakwater._clock import SystemClock
from breakwater.config import BreakerPolicy, RetryPolicy, StatePolicy
from breakwater.errors import ConfigError
from breakwater.gate._breaker import BreakerRegistry, BreakerState, Outcome, Permit, Rejection
from breakwater.gate._retry_budget import RetryBudget
from breakwater.state import MemoryStore, open_store
from breakwater.testing import FakeClock
from breakwater.testing._fleet import free_port
from helpers import REDIS_URL, OwnRedis

pytestmark = pytest.mark.anyio

POLICY = BreakerPolicy(consecutive_failures=2, open_base_s=0.4, open_jitter=0.0, probe_lease_s=5.0)


@asynccontextmanager
async def replicas(n: int, url: str = REDIS_URL, **policy: float) -> AsyncIterator[list[BreakerRegistry]]:
    """`n` replicas (a RedisStore and a BreakerRegistry each) over one fresh namespace."""
    state = StatePolicy(url=url, namespace=f"bwtest-{uuid.uuid4().hex[:10]}", timeout_s=0.5, **policy)
    clock = SystemClock()
    stores = [open_store(state, clock=clock, rng=random.Random(i)) for i in range(n)]
    async with anyio.create_task_group() as tg:
        for store in stores:
            tg.start_soon(store.run)
        for store in stores:
            await store.connect()
        try:
            yield [BreakerRegistry(clock=clock, policy=POLICY, store=store, rng=random.Random(7)) for store in stores]
        finally:
            tg.cancel_scope.cancel()
    for store in stores:
        await store.aclose()


def store_of(reg: BreakerRegistry) -> object:
    return reg._store


async def wait_until(predicate: object, timeout: float = 5.0) -> float:
    """Poll `predicate()` until true; returns the seconds it took."""
    start = time.monotonic()
    with anyio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await anyio.sleep(0.001)
    return time.monotonic() - start


def trip(reg: BreakerRegistry) -> None:
    breaker = reg.tool("srv", "tool")
    for _ in range(POLICY.consecutive_failures):
        permit = breaker.acquire()
        assert isinstance(permit, Permit)
        permit.record(Outcome.FAILURE, 0.01)


# ---- in-process (default) ------------------------------------------------------------------------


def test_default_store_is_in_process_and_changes_nothing() -> None:
    store = open_store(StatePolicy(), clock=FakeClock())
    assert isinstance(store, MemoryStore)
    assert store.status().as_dict() == {"backend": "memory", "state": "ok", "degradations": 0}
    clock = FakeClock()
    reg = BreakerRegistry(clock=clock, policy=POLICY, store=store)
    trip(reg)
    assert reg.tool("srv", "tool").state is BreakerState.OPEN
    store.set_learned_timeout("srv", "tool", 2.5)
    assert store.learned_timeout("srv", "tool") == 2.5


def test_state_policy_validates() -> None:
    with pytest.raises(ConfigError):
        StatePolicy(url="mysql://x")
    with pytest.raises(ConfigError):
        StatePolicy(namespace="a{b}")


# ---- Redis ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("redis_available")
async def test_open_reaches_other_replicas_within_100ms() -> None:
    async with replicas(3) as (a, b, c):
        b.tool("srv", "tool").acquire()  # B and C know the breaker (as a gateway does once it has been called)
        c.tool("srv", "tool").acquire()
        trip(a)
        took = await wait_until(
            lambda: (
                isinstance(b.tool("srv", "tool").acquire(), Rejection) and isinstance(c.tool("srv", "tool").acquire(), Rejection)
            )
        )
        assert took < 0.1, f"the open took {took * 1000:.1f} ms to reach B and C"
        snap = c.tool("srv", "tool").snapshot()
        assert snap.state is BreakerState.OPEN
        assert snap.reason == "2 consecutive failures"


@pytest.mark.usefixtures("redis_available")
async def test_first_use_on_a_replica_sees_an_open_breaker() -> None:
    async with replicas(2) as (a, b):
        trip(a)
        await wait_until(lambda: a.tool("srv", "tool").snapshot().state is BreakerState.OPEN)
        # B never touched this breaker: its first acquire reads Redis once and is refused.
        assert isinstance(b.tool("srv", "tool").acquire(), Rejection)


@pytest.mark.usefixtures("redis_available")
async def test_rejection_reads_the_shared_state_a_replica_has_seen() -> None:
    """`rejection()`, which the gate asks before checking a call's arguments, gives a shared breaker's refusal
    from the state this replica has seen (no round trip); a breaker it has never seen is left to `acquire`."""
    async with replicas(2) as (a, b):
        trip(a)
        await wait_until(lambda: a.tool("srv", "tool").snapshot().state is BreakerState.OPEN)
        assert b.tool("srv", "tool").rejection() is None  # never used here: only Redis knows
        refused = b.tool("srv", "tool").acquire()  # the first use reads Redis once
        assert isinstance(refused, Rejection)
        ahead = b.tool("srv", "tool").rejection()
        assert ahead is not None and (ahead.state, ahead.reason) == (refused.state, refused.reason)
        assert 0 < ahead.retry_after_s <= refused.retry_after_s


@pytest.mark.usefixtures("redis_available")
async def test_exactly_one_probe_cluster_wide_among_50_callers() -> None:
    async with replicas(3) as regs:
        trip(regs[0])
        await wait_until(lambda: all(r.tool("srv", "tool").snapshot().state is not BreakerState.CLOSED for r in regs))
        await anyio.sleep(POLICY.open_base_s + 0.05)
        results = [regs[i % 3].tool("srv", "tool").acquire() for i in range(50)]
        probes = [p for p in results if isinstance(p, Permit)]
        assert len(probes) == 1 and probes[0].is_probe
        assert all(r.state is BreakerState.HALF_OPEN for r in results if isinstance(r, Rejection))
        probes[0].record(Outcome.SUCCESS, 0.01)
        await wait_until(lambda: all(r.tool("srv", "tool").snapshot().state is BreakerState.CLOSED for r in regs))


@pytest.mark.usefixtures("redis_available")
async def test_a_late_probe_report_is_fenced_off() -> None:
    """A probe whose lease expired (its replica paused) cannot close the breaker afterwards."""
    async with replicas(2) as (a, b):
        trip(a)
        await anyio.sleep(POLICY.open_base_s + 0.05)
        late = a.tool("srv", "tool").acquire(lease_s=0.1)
        assert isinstance(late, Permit) and late.is_probe
        await anyio.sleep(0.15)  # the lease runs out: B may probe now, under a newer epoch
        fresh = b.tool("srv", "tool").acquire()
        assert isinstance(fresh, Permit) and fresh.is_probe and fresh.epoch > late.epoch
        fresh.record(Outcome.FAILURE, 0.01)  # the real verdict: still down, open again
        await wait_until(lambda: a.tool("srv", "tool").snapshot().state is BreakerState.OPEN)
        late.record(Outcome.SUCCESS, 0.01)  # the paused replica wakes up with good news: dropped
        await anyio.sleep(0.1)
        for reg in (a, b):
            assert reg.tool("srv", "tool").snapshot().state is BreakerState.OPEN


@pytest.mark.usefixtures("redis_available")
async def test_retry_budget_is_shared() -> None:
    state = StatePolicy(url=REDIS_URL, namespace=f"bwtest-{uuid.uuid4().hex[:10]}", timeout_s=0.5)
    clock = SystemClock()
    policy = RetryPolicy(budget_max_tokens=4.0, budget_floor_per_min=0.0, budget_ratio=0.0)
    stores = [open_store(state, clock=clock) for _ in range(2)]
    budgets = [RetryBudget(policy, clock=clock) for _ in stores]
    async with anyio.create_task_group() as tg:
        for store, budget in zip(stores, budgets, strict=True):
            tg.start_soon(store.run)
            await store.connect()
            budget.attach(store.shared_budget("srv", policy))
        assert budgets[0].try_acquire() and budgets[0].try_acquire() and budgets[0].try_acquire()
        # B spent nothing, but the deployment has one token left: B learns it within a sync.
        await wait_until(lambda: budgets[1].tokens < 1.5, timeout=3.0)
        assert budgets[1].try_acquire()
        await wait_until(lambda: budgets[0].tokens < 0.5, timeout=3.0)
        assert not budgets[0].try_acquire()
        tg.cancel_scope.cancel()
    for store in stores:
        await store.aclose()


@pytest.mark.usefixtures("redis_available")
async def test_learned_timeouts_are_shared() -> None:
    async with replicas(2) as (a, b):
        sa, sb = store_of(a), store_of(b)
        assert sb.learned_timeout("srv", "tool") is None  # type: ignore[attr-defined]
        sa.set_learned_timeout("srv", "tool", 3.25)  # type: ignore[attr-defined]
        await wait_until(lambda: sb.learned_timeout("srv", "tool") == 3.25)  # type: ignore[attr-defined]


async def test_redis_killed_mid_run_degrades_then_reconverges(own_redis: OwnRedis) -> None:
    """Every decision keeps answering while Redis is gone (local state, `degraded`), none waits long; after it
    returns (empty: it keeps nothing) the replicas resynchronise and share state again."""
    async with replicas(2, url=own_redis.url, retry_s=0.1) as (a, b):
        sa, sb = store_of(a), store_of(b)
        for reg in (a, b):
            reg.tool("srv", "tool").acquire()
        own_redis.kill()
        slowest = 0.0
        decisions = 0
        with anyio.fail_after(10):
            while sa.status().state != "degraded" or sb.status().state != "degraded":  # type: ignore[attr-defined]
                for reg in (a, b):
                    t0 = time.monotonic()
                    permit = reg.tool("srv", "tool").acquire()
                    slowest = max(slowest, time.monotonic() - t0)
                    assert isinstance(permit, Permit)  # never refused because the store failed
                    permit.record(Outcome.SUCCESS, 0.01)
                    decisions += 1
                await anyio.sleep(0.005)
        assert slowest < 0.6, f"a decision waited {slowest:.3f} s on a dead store"
        # Local state works while degraded: A's failures open A's breaker.
        trip(a)
        assert a.tool("srv", "tool").state is BreakerState.OPEN
        own_redis.start()
        await wait_until(lambda: sa.status().state == "ok" and sb.status().state == "ok", timeout=10)  # type: ignore[attr-defined]
        # A's local open was written back to the empty Redis; B adopts it.
        await wait_until(lambda: b.tool("srv", "tool").snapshot().state is BreakerState.OPEN, timeout=3)
        assert sa.status().degradations == 1  # type: ignore[attr-defined]


async def test_unreachable_store_at_start_is_degraded_not_fatal() -> None:
    port = free_port()  # nothing listens there
    async with replicas(1, url=f"redis://127.0.0.1:{port}/0") as (a,):
        status = store_of(a).status()  # type: ignore[attr-defined]
        assert status.state == "degraded" and status.error
        trip(a)
        assert a.tool("srv", "tool").state is BreakerState.OPEN


def test_policy_replace_keeps_validation() -> None:
    assert replace(StatePolicy(), url="redis://h:1/0").url == "redis://h:1/0"
