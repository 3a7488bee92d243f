"""The circuit breaker, on a FakeClock with a seeded random source: every test runs in milliseconds."""

from __future__ import annotations

import json
import random
import threading

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from breakwater.config import BreakerPolicy
from breakwater.config._knobs import iter_knobs
from breakwater.errors import ConfigError
from breakwater.gate._breaker import (
    BreakerKey,
    BreakerRegistry,
    BreakerState,
    CircuitBreaker,
    Outcome,
    Permit,
    Rejection,
)
from breakwater.testing import FakeClock


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make(policy: BreakerPolicy | None = None, *, seed: int = 7) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker("srv/tool", policy, clock=clock, rng=random.Random(seed)), clock


def permit(breaker: CircuitBreaker, **kwargs: float) -> Permit:
    got = breaker.acquire(**kwargs)
    assert isinstance(got, Permit), f"expected a permit, got {got!r}"
    return got


def call(breaker: CircuitBreaker, clock: FakeClock, outcome: Outcome, duration_s: float = 0.1) -> None:
    p = permit(breaker)
    clock.advance(duration_s)
    p.record(outcome, duration_s)


def trip(breaker: CircuitBreaker, clock: FakeClock) -> None:
    while breaker.state is BreakerState.CLOSED:
        call(breaker, clock, Outcome.FAILURE)


# -- tripping ---------------------------------------------------------------------------------


def test_a_dead_tool_trips_the_breaker_within_five_failed_calls() -> None:
    breaker, clock = make()
    failed = 0
    while breaker.state is BreakerState.CLOSED:
        call(breaker, clock, Outcome.FAILURE)
        failed += 1
        assert failed <= 5
    assert failed == BreakerPolicy().consecutive_failures == 4
    rejected = breaker.acquire()
    assert isinstance(rejected, Rejection)
    assert rejected.state is BreakerState.OPEN
    assert rejected.reason == "4 consecutive failures"
    assert 4.0 <= rejected.retry_after_s <= 6.0  # 5 s ± 20 %


def test_a_success_resets_the_consecutive_count() -> None:
    breaker, clock = make(BreakerPolicy(failure_rate=1.0, minimum_calls=100))
    for _ in range(10):
        for _ in range(3):
            call(breaker, clock, Outcome.FAILURE)
        call(breaker, clock, Outcome.SUCCESS)
    assert breaker.state is BreakerState.CLOSED


def test_failure_rate_trips_when_failures_are_interleaved_with_successes() -> None:
    breaker, clock = make()
    for outcome in (Outcome.FAILURE, Outcome.SUCCESS, Outcome.FAILURE, Outcome.SUCCESS):
        call(breaker, clock, outcome)
    assert breaker.state is BreakerState.CLOSED  # 2 of 4: below the 5-call minimum
    call(breaker, clock, Outcome.FAILURE)  # 3 of 5 = 60 % ≥ 50 %
    snap = breaker.snapshot()
    assert snap.state is BreakerState.OPEN
    assert snap.reason == "3 of 5 calls failed in 120 s"


def test_rate_needs_the_minimum_number_of_calls() -> None:
    breaker, clock = make(BreakerPolicy(minimum_calls=10, consecutive_failures=100))
    for _ in range(9):
        call(breaker, clock, Outcome.FAILURE)
    assert breaker.state is BreakerState.CLOSED  # 9 of 9 failed, but 9 < 10
    call(breaker, clock, Outcome.FAILURE)
    assert breaker.snapshot().state is BreakerState.OPEN


def test_failures_slide_out_of_the_window() -> None:
    breaker, clock = make(BreakerPolicy(consecutive_failures=100))
    for _ in range(3):
        call(breaker, clock, Outcome.FAILURE)
    clock.advance(130)  # older than the 120 s window
    for _ in range(2):
        call(breaker, clock, Outcome.FAILURE)
    snap = breaker.snapshot()
    assert snap.calls_in_window == 2
    assert snap.state is BreakerState.CLOSED
    for _ in range(3):
        call(breaker, clock, Outcome.SUCCESS)
    assert breaker.state is BreakerState.CLOSED  # 2 of 5 = 40 %


def test_slow_calls_trip_on_their_own_rate() -> None:
    breaker, _ = make()
    for _ in range(4):
        p = permit(breaker, slow_threshold_s=1.0)
        p.record(Outcome.SUCCESS, 3.0)
    assert breaker.state is BreakerState.CLOSED
    p = permit(breaker, slow_threshold_s=1.0)
    p.record(Outcome.SUCCESS, 3.0)
    snap = breaker.snapshot()
    assert snap.state is BreakerState.OPEN
    assert snap.reason == "5 of 5 calls were slow in 120 s"


def test_without_a_threshold_no_call_is_slow() -> None:
    breaker, _ = make()
    for _ in range(20):
        permit(breaker).record(Outcome.SUCCESS, 1_000.0)
    snap = breaker.snapshot()
    assert snap.state is BreakerState.CLOSED
    assert snap.slow_in_window == 0


# -- open duration ----------------------------------------------------------------------------


def reopen_durations(breaker: CircuitBreaker, clock: FakeClock, count: int) -> list[float]:
    """Trip, then fail `count - 1` probes in a row; the open duration of each period."""
    trip(breaker, clock)
    durations = []
    for _ in range(count):
        snap = breaker.snapshot()
        assert snap.open_until is not None
        durations.append(snap.open_until - clock.monotonic())
        clock.advance_to(snap.open_until)
        permit(breaker).record(Outcome.FAILURE, 0.1)
    return durations


def test_open_duration_doubles_per_reopen_with_jitter_and_a_cap() -> None:
    breaker, clock = make()
    durations = reopen_durations(breaker, clock, 12)
    for n, d in enumerate(durations):
        nominal = min(300.0, 5.0 * 2**n)
        assert 0.8 * nominal <= d <= min(300.0, 1.2 * nominal), (n, d)
    assert max(durations) <= 300.0
    assert min(durations[6:]) >= 240.0  # at the cap the spread is [240, 300]
    assert len({round(d, 6) for d in durations}) == len(durations)  # jitter: no two alike


def test_jitter_spreads_across_the_whole_twenty_percent_band() -> None:
    ratios = []
    for seed in range(200):
        breaker, clock = make(seed=seed)
        trip(breaker, clock)
        snap = breaker.snapshot()
        assert snap.open_until is not None
        ratios.append((snap.open_until - clock.monotonic()) / 5.0)
    assert all(0.8 <= r <= 1.2 for r in ratios)
    assert min(ratios) < 0.85 and max(ratios) > 1.15


def test_the_same_seed_replays_the_same_schedule() -> None:
    a = reopen_durations(*make(seed=42), 6)
    b = reopen_durations(*make(seed=42), 6)
    assert a == b


def test_a_successful_probe_closes_and_the_next_trip_starts_from_the_base_again() -> None:
    breaker, clock = make()
    reopen_durations(breaker, clock, 4)  # now open for the 5th time (~80 s)
    snap = breaker.snapshot()
    assert snap.consecutive_opens == 5 and snap.open_until is not None
    clock.advance_to(snap.open_until)
    permit(breaker).record(Outcome.SUCCESS, 0.1)
    snap = breaker.snapshot()
    assert snap.state is BreakerState.CLOSED
    assert snap.consecutive_opens == 0 and snap.calls_in_window == 0
    trip(breaker, clock)
    snap = breaker.snapshot()
    assert snap.open_until is not None
    assert snap.open_until - clock.monotonic() <= 6.0


# -- half-open --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_half_open_admits_exactly_one_probe_among_50_concurrent_callers() -> None:
    breaker, clock = make()
    trip(breaker, clock)
    clock.advance(10)  # past the open period: the next caller probes
    reached_backend = 0
    rejected: list[Rejection] = []

    async def caller() -> None:
        nonlocal reached_backend
        await anyio.sleep(0)  # everyone is scheduled before anyone finishes
        got = breaker.acquire()
        if isinstance(got, Rejection):
            rejected.append(got)
            return
        reached_backend += 1
        await clock.sleep(0.2)  # the probe's call takes 200 ms of virtual time
        got.record(Outcome.SUCCESS, 0.2)

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(caller)
        await clock.wait_for_sleepers(1)
        assert breaker.snapshot().probe_in_flight
        clock.advance(0.2)
    assert reached_backend == 1
    assert len(rejected) == 49
    assert all(r.state is BreakerState.HALF_OPEN for r in rejected)
    assert all(0 < r.retry_after_s <= 5.0 for r in rejected)
    assert breaker.state is BreakerState.CLOSED
    # Closed again: everyone gets through.
    assert all(isinstance(breaker.acquire(), Permit) for _ in range(50))


def test_half_open_admits_one_probe_among_50_threads() -> None:
    breaker, clock = make()
    trip(breaker, clock)
    clock.advance(10)
    barrier = threading.Barrier(50)
    results: list[Permit | Rejection] = []
    lock = threading.Lock()

    def caller() -> None:
        barrier.wait()
        got = breaker.acquire()
        with lock:
            results.append(got)

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Permit) for r in results) == 1


def test_closed_permits_taken_without_the_lock_never_act_after_the_breaker_opened() -> None:
    """A closed breaker admits without its lock; permits taken by threads racing the trip either count in the
    closed period or are dropped: once open, no success reported by them closes it or fills its window."""
    breaker, clock = make(BreakerPolicy(consecutive_failures=3, minimum_calls=1000))
    barrier = threading.Barrier(9)
    late: list[Permit] = []
    lock = threading.Lock()

    def caller() -> None:
        barrier.wait()
        for _ in range(300):
            got = breaker.acquire()
            if isinstance(got, Permit):
                with lock:
                    late.append(got)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    barrier.wait()
    trip(breaker, clock)
    for t in threads:
        t.join()
    calls = breaker.snapshot().calls_in_window
    for p in late:
        p.record(Outcome.SUCCESS, 0.01)
    after = breaker.snapshot()
    assert after.state is BreakerState.OPEN and after.calls_in_window == calls


def test_a_probe_that_never_reports_loses_its_lease() -> None:
    breaker, clock = make(BreakerPolicy(probe_lease_s=30.0))
    trip(breaker, clock)
    clock.advance(10)
    lost = permit(breaker)
    assert lost.is_probe
    clock.advance(29)
    assert isinstance(breaker.acquire(), Rejection)
    clock.advance(1)  # the lease ran out: the breaker is not wedged
    second = permit(breaker)
    assert second.is_probe
    lost.record(Outcome.SUCCESS, 31.0)  # late and fenced off: it decides nothing
    assert breaker.state is BreakerState.HALF_OPEN
    second.record(Outcome.FAILURE, 0.1)
    assert breaker.snapshot().state is BreakerState.OPEN


def test_a_per_call_lease_overrides_the_policy() -> None:
    breaker, clock = make()
    trip(breaker, clock)
    clock.advance(10)
    permit(breaker, lease_s=2.0)
    clock.advance(2.0)
    assert permit(breaker).is_probe


def test_a_released_probe_frees_the_slot_at_once() -> None:
    breaker, clock = make()
    trip(breaker, clock)
    clock.advance(10)
    permit(breaker).release()
    assert breaker.state is BreakerState.HALF_OPEN
    assert permit(breaker).is_probe


def test_a_slow_probe_reopens() -> None:
    breaker, clock = make()
    trip(breaker, clock)
    clock.advance(10)
    permit(breaker, slow_threshold_s=1.0).record(Outcome.SUCCESS, 5.0)
    snap = breaker.snapshot()
    assert snap.state is BreakerState.OPEN
    assert snap.consecutive_opens == 2
    assert snap.reason == "probe was slow"


# -- what is not recorded ---------------------------------------------------------------------


def test_local_rejections_record_nothing() -> None:
    breaker, clock = make()
    trip(breaker, clock)
    before = breaker.snapshot()
    for _ in range(1_000):
        assert isinstance(breaker.acquire(), Rejection)
        clock.advance(0.001)
    after = breaker.snapshot()
    assert after.open_until == before.open_until  # refusals do not extend the open period
    assert after.consecutive_opens == before.consecutive_opens == 1
    assert after.calls_in_window == before.calls_in_window


def test_released_permits_record_nothing() -> None:
    # The gate releases a permit when a later check (the other breaker, the budget, the bulkhead,
    # a deadline already past) refuses the call before anything was sent.
    breaker, _ = make()
    for _ in range(100):
        permit(breaker).release()
    snap = breaker.snapshot()
    assert snap.calls_in_window == 0
    assert snap.consecutive_failures == 0
    assert snap.state is BreakerState.CLOSED


def test_ignored_outcomes_record_nothing() -> None:
    breaker, _ = make()
    for _ in range(100):
        permit(breaker).record(Outcome.IGNORED, 60.0)
    assert breaker.snapshot().calls_in_window == 0


def test_a_permit_reports_once() -> None:
    breaker, _ = make()
    p = permit(breaker)
    p.record(Outcome.FAILURE, 0.1)
    for _ in range(10):
        p.record(Outcome.FAILURE, 0.1)
    assert breaker.snapshot().calls_in_window == 1


def test_calls_in_flight_when_the_breaker_opened_neither_extend_nor_close_it() -> None:
    breaker, clock = make()
    in_flight = [permit(breaker) for _ in range(10)]
    trip(breaker, clock)
    snap = breaker.snapshot()
    for p in in_flight[:5]:
        p.record(Outcome.FAILURE, 1.0)
    for p in in_flight[5:]:
        p.record(Outcome.SUCCESS, 1.0)
    after = breaker.snapshot()
    assert after.state is BreakerState.OPEN
    assert after.open_until == snap.open_until
    assert after.consecutive_opens == 1


# -- snapshot, registry, policy ---------------------------------------------------------------


def test_snapshot_for_status() -> None:
    breaker, clock = make()
    call(breaker, clock, Outcome.SUCCESS)
    trip(breaker, clock)
    snap = breaker.snapshot()
    assert snap.state is BreakerState.OPEN
    assert snap.open_until is not None and snap.open_until_wall is not None
    assert snap.open_until_wall == pytest.approx(clock.time() + snap.retry_after_s)
    assert snap.failure_rate == pytest.approx(4 / 5)
    data = json.loads(json.dumps(snap.as_dict()))
    assert data["state"] == "open" and data["consecutive_opens"] == 1
    clock.advance(snap.retry_after_s)
    assert breaker.snapshot().state is BreakerState.HALF_OPEN  # a caller now would probe
    assert breaker.snapshot().retry_after_s == 0.0


def test_registry_has_one_breaker_per_server_and_per_tool() -> None:
    clock = FakeClock()
    strict = BreakerPolicy(consecutive_failures=1)
    registry = BreakerRegistry(
        clock=clock,
        rng=random.Random(1),
        policy_for=lambda server, tool: strict if tool == "fragile" else BreakerPolicy(),
    )
    assert registry.server("a") is registry.server("a")
    assert registry.tool("a", "x") is registry.tool("a", "x")
    assert registry.tool("a", "x") is not registry.server("a")
    assert registry.tool("a", "x") is not registry.tool("b", "x")
    assert registry.tool("a", "fragile").policy is strict
    assert registry.server("a").policy == BreakerPolicy()
    permit(registry.tool("a", "fragile")).record(Outcome.FAILURE, 0.1)
    states = {s.name: s.state for s in registry.snapshots()}
    assert states == {"a": "closed", "a/fragile": "open", "a/x": "closed", "b/x": "closed"}


def test_policy_is_declared_with_knobs_and_validated() -> None:
    names = [k.name for k in iter_knobs("breaker", BreakerPolicy)]
    assert "consecutive_failures" in names and "open_max_s" in names
    assert all(k.env and k.env.startswith("BREAKWATER_BREAKER_") for k in iter_knobs("breaker", BreakerPolicy))
    with pytest.raises(ConfigError):
        BreakerPolicy(failure_rate=1.5)
    with pytest.raises(ConfigError):
        BreakerPolicy(open_base_s=10, open_max_s=5)
    with pytest.raises(ConfigError):
        BreakerPolicy(open_jitter=1.0)


# -- property: whatever happens, never two live probes and never open past the cap ----------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.floats(0.0, 5.0)),
        st.tuples(st.sampled_from(["success", "failure", "ignored"]), st.integers(0, 20)),
        st.tuples(st.just("advance"), st.floats(0.0, 400.0)),
    ),
    max_size=120,
)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(ops=_ops, seed=st.integers(0, 2**16))
def test_never_two_live_probes_and_never_open_past_the_cap(ops: list[tuple[str, float]], seed: int) -> None:
    breaker, clock = make(BreakerPolicy(consecutive_failures=2, minimum_calls=2), seed=seed)
    lease = breaker.policy.probe_lease_s
    outstanding: list[tuple[Permit, float]] = []
    for op, arg in ops:
        if op == "acquire":
            got = breaker.acquire(slow_threshold_s=1.0)
            if isinstance(got, Permit):
                outstanding.append((got, clock.monotonic()))
            else:
                assert got.retry_after_s >= 0
        elif op == "advance":
            clock.advance(arg)
        elif outstanding:
            p, _ = outstanding.pop(int(arg) % len(outstanding))
            p.record(Outcome(op), duration_s=0.5)
        now = clock.monotonic()
        live_probes = [p for p, granted in outstanding if p.is_probe and now < granted + lease]
        assert len(live_probes) <= 1
        snap = breaker.snapshot()
        if snap.open_until is not None:
            assert snap.open_until - now <= breaker.policy.open_max_s


@settings(max_examples=100, deadline=None, derandomize=True)
@given(ops=_ops, seed=st.integers(0, 2**16))
def test_rejection_says_ahead_what_acquire_answers_and_takes_nothing(ops: list[tuple[str, float]], seed: int) -> None:
    """`rejection()` (what the gate asks before checking a call's arguments) is `acquire`'s refusal, exactly,
    or None where `acquire` admits; asking it changes nothing a snapshot shows."""
    breaker, clock = make(BreakerPolicy(consecutive_failures=2, minimum_calls=2), seed=seed)
    outstanding: list[Permit] = []
    for op, arg in ops:
        if op == "acquire":
            before = breaker.snapshot()
            ahead = breaker.rejection()
            assert breaker.snapshot() == before
            got = breaker.acquire(slow_threshold_s=1.0)
            if isinstance(got, Permit):
                assert ahead is None
                outstanding.append(got)
            else:
                assert ahead == got
        elif op == "advance":
            clock.advance(arg)
        elif outstanding:
            outstanding.pop(int(arg) % len(outstanding)).record(Outcome(op), duration_s=0.5)


def test_breaker_key_names_server_and_tool_without_parsing() -> None:
    """A tool name holding a slash stays whole: the key says whose breaker it is, the name is only its text."""
    registry = BreakerRegistry(clock=FakeClock())
    tool = registry.tool("files", "dir/read")
    server = registry.server("files")
    assert tool.key == BreakerKey("files", "dir/read") and tool.name == "files/dir/read"
    assert server.key == BreakerKey("files") and server.key.tool is None and server.name == "files"
    assert {s.key for s in registry.snapshots()} == {BreakerKey("files"), BreakerKey("files", "dir/read")}


def test_trip_opens_a_closed_breaker_at_once_and_nothing_else() -> None:
    """The gate's evidence of slowness opens a closed breaker for the usual open period; an open one is left alone."""
    clock = FakeClock()
    breaker = CircuitBreaker("s/t", BreakerPolicy(open_jitter=0.0), clock=clock)
    assert breaker.trip("2 timeouts in a row") is True
    refused = breaker.acquire()
    assert isinstance(refused, Rejection) and refused.reason == "2 timeouts in a row"
    assert refused.retry_after_s == pytest.approx(5.0)
    assert breaker.trip("again") is False and breaker.snapshot().consecutive_opens == 1
