"""Invariants 4–14, 16, 18–22: properties that hold for random configurations."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from labkit import LAB, LAB_PAIRS, comparable, configs, entries, quick, quick_traffic

from breakwater.lab import LabConfig
from breakwater.lab.config import MAX_REISSUES, SLOTS
from breakwater.lab.metrics import Metrics

pytestmark = pytest.mark.long_module(112)

MODES_2025 = st.sampled_from(["2025-11-25/memory", "2025-11-25/shared"])


def _without(metrics: Metrics, *names: str) -> dict[str, object]:
    out = metrics.to_dict()
    for name in names:
        del out[name]
    return out


@LAB
@given(configs(idempotency=True))
def test_idempotency_on_means_no_duplicate_side_effects(config: LabConfig) -> None:
    """Invariant 4: in every mode and under every injection."""
    assert quick(config).metrics.duplicate_side_effects == 0


@LAB_PAIRS
@given(configs(idempotency=False))
def test_idempotency_changes_only_duplicates_and_dedup_hits(config: LabConfig) -> None:
    """Invariant 5: side effects never alter control flow, so everything else is identical."""
    off = quick(config)
    on = quick(config.replace(idempotency=True))
    assert _without(off.metrics, "duplicate_side_effects", "dedup_hits") == _without(
        on.metrics, "duplicate_side_effects", "dedup_hits"
    )
    assert off.metrics.duplicate_side_effects == on.metrics.dedup_hits
    assert off.log == on.log
    off_series, on_series = off.series.to_dict(), on.series.to_dict()
    del off_series["duplicates"], on_series["duplicates"]
    assert off_series == on_series
    assert off.latency == on.latency


@LAB
@given(configs(mode="2026-07-28"))
def test_stateless_mode_has_no_404s_reinitializations_or_resumes(config: LabConfig) -> None:
    """Invariant 6."""
    m = quick(config).metrics
    assert m.http_404 == m.reinitializations == m.resume_attempts == 0


@LAB
@given(configs(mode="2025-11-25/shared"))
def test_shared_store_has_no_404s(config: LabConfig) -> None:
    """Invariant 7."""
    assert quick(config).metrics.http_404 == 0


@LAB
@given(configs(mode="2025-11-25/memory", routing="affinity", rolling_deploy=False))
def test_memory_with_affinity_and_no_deploy_has_no_404s(config: LabConfig) -> None:
    """Invariant 8."""
    assert quick(config).metrics.http_404 == 0


@LAB
@given(
    configs(
        mode="2025-11-25/memory",
        routing="round_robin",
        replicas=st.integers(2, 8),
        slow_tools=False,
        rolling_deploy=False,
        hot_client=False,
    )
)
def test_memory_with_round_robin_fails_calls_with_404s(config: LabConfig) -> None:
    """Invariant 9: the M1 lesson, on default traffic with at least two replicas."""
    m = quick(config).metrics
    assert m.http_404 > 0
    assert m.failed > 0


@LAB
@given(configs(mode=MODES_2025))
def test_2025_modes_never_cancel(config: LabConfig) -> None:
    """Invariant 10: an idle cut never stops an execution in 2025-11-25."""
    assert quick(config).metrics.cancellations == 0


@LAB
@given(configs(mode=MODES_2025))
def test_reinitializations_follow_404s(config: LabConfig) -> None:
    """Invariant 11: reinitializations ≤ http_404, and any 404 causes at least one re-initialization."""
    m = quick(config).metrics
    assert m.reinitializations <= m.http_404
    assert m.http_404 == 0 or m.reinitializations > 0


@LAB
@given(configs(idle_timeout_s=st.integers(3, 60).map(lambda x: x * 5)), st.data())
def test_effective_keepalive_means_no_cuts(config: LabConfig, data: st.DataObject) -> None:
    """Invariant 12: 0 < K < T → no stream is ever cut, whatever the load or injections."""
    keepalive = data.draw(st.integers(5, min(120, config.idle_timeout_s - 1)))
    assert quick(config.replace(keepalive_s=keepalive)).metrics.stream_cuts == 0


@LAB_PAIRS
@given(configs(keepalive_s=None), st.data())
def test_keepalive_at_or_above_the_idle_timeout_is_the_same_as_off(config: LabConfig, data: st.DataObject) -> None:
    """Invariant 13: K ≥ T gives byte-identical results to K = off."""
    config = config.replace(idle_timeout_s=data.draw(st.integers(2, 24).map(lambda x: x * 5)))
    keepalive = data.draw(st.integers(config.idle_timeout_s, 120))
    assert comparable(quick(config)) == comparable(quick(config.replace(keepalive_s=keepalive)))


@LAB_PAIRS
@given(configs(keepalive_s=15, idle_timeout_s=st.integers(4, 60).map(lambda x: x * 5)), st.integers(4, 60))
def test_with_effective_keepalive_the_idle_timeout_does_not_matter(config: LabConfig, other: int) -> None:
    """Invariant 14."""
    assert comparable(quick(config)) == comparable(quick(config.replace(idle_timeout_s=other * 5)))


@LAB
@given(configs())
def test_deploy_kills_and_deploy_end(config: LabConfig) -> None:
    """Invariant 16: no deploy → no kills and no end; with one, end = 120 + N × (W + 15) s exactly."""
    m = quick(config).metrics
    if config.rolling_deploy:
        assert m.deploy_end_ms == (120 + config.replicas * (config.drain_s + 15)) * 1000
        assert m.run_end_ms >= m.deploy_end_ms
    else:
        assert m.deploy_kills == 0
        assert m.deploy_end_ms is None


@LAB
@given(configs())
def test_conservation_of_calls_and_attempts(config: LabConfig) -> None:
    """Invariant 18: statuses add up; re-issues = Σ(attempts − 1); a failed call used all 4 attempts."""
    result = quick(config)
    m = result.metrics
    assert m.ok + m.failed + m.unfinished == m.calls == len(quick_traffic(config))
    attempts: dict[int | None, int] = defaultdict(int)
    for record in entries(result, "post"):
        assert isinstance(record[6], int)
        attempts[record[3]] = max(attempts[record[3]], record[6])
    for record in entries(result, "hold"):
        attempts[record[3]] = max(attempts[record[3]], 1)
    assert all(1 <= used <= 1 + MAX_REISSUES for used in attempts.values())
    assert m.reissues == sum(used - 1 for used in attempts.values())
    failed = [r[3] for r in entries(result, "fail")]
    assert len(failed) == m.failed
    assert all(attempts[call] == 1 + MAX_REISSUES for call in failed)


@LAB
@given(configs())
def test_capacity_fifo_and_utilisation(config: LabConfig) -> None:
    """Invariant 19: ≤ 10 busy slots, FIFO queues, 0 ≤ utilisation ≤ 1, a down replica runs nothing."""
    result = quick(config)
    busy = [0] * config.replicas
    queued: list[list[tuple[int | None, int | None]]] = [[] for _ in range(config.replicas)]
    running: list[set[tuple[int | None, int | None]]] = [set() for _ in range(config.replicas)]
    down = [False] * config.replicas
    just_down: list[int] = []  # replicas whose "down" record came; its "kill" records follow it
    for _t, _phase, kind, call, attempt, replica, _detail in result.log:
        if kind != "kill" and just_down:
            # Every running and queued attempt of a replica that went down was killed.
            assert all(busy[r] == 0 and not queued[r] for r in just_down)
            just_down.clear()
        key = (call, attempt)
        if kind == "accept":
            assert replica is not None
            assert not down[replica]
            queued[replica].append(key)
        elif kind == "start":
            assert replica is not None
            assert not down[replica]  # a down replica runs nothing
            assert queued[replica][0] == key  # FIFO: the head of the queue starts first
            queued[replica].pop(0)
            running[replica].add(key)
            busy[replica] += 1
            assert busy[replica] <= SLOTS
        elif kind in ("finish", "cancel", "kill"):
            assert replica is not None
            if key in running[replica]:
                running[replica].discard(key)
                busy[replica] -= 1
            else:
                queued[replica].remove(key)
        elif kind == "down":
            assert replica is not None
            down[replica] = True
            just_down.append(replica)
        elif kind == "up":
            assert replica is not None
            down[replica] = False
    assert all(busy[r] == 0 and not queued[r] for r in just_down)
    for series in result.series.busy:
        assert all(0 <= b <= SLOTS for b in series)
    for code_series, busy_series in zip(result.series.state, result.series.busy, strict=True):
        assert all(b == 0 for code, b in zip(code_series, busy_series, strict=True) if code == 2)
    assert all(0.0 <= u <= 1.0 for u in result.metrics.utilisation)
    # Peak queue counts attempts that waited: at least what the per-second samples saw queued.
    for samples, peak in zip(result.series.queue, result.metrics.peak_queue, strict=True):
        assert max(samples, default=0) <= peak


@LAB
@given(configs())
def test_latency_sanity(config: LabConfig) -> None:
    """Invariant 20: every ok call took at least its duration, and p50 ≤ p95 ≤ p99."""
    result = quick(config)
    specs = {c.id: c for c in quick_traffic(config)}
    delivered = list(entries(result, "deliver"))
    assert len(delivered) == result.metrics.ok
    for record in delivered:
        latency = record[6]
        assert isinstance(latency, int)
        assert latency >= specs[record[3] or 0].duration_ms(config.slow_tools)
    m = result.metrics
    if m.ok:
        assert m.p50_ms is not None and m.p95_ms is not None and m.p99_ms is not None
        assert m.p50_ms <= m.p95_ms <= m.p99_ms
    else:
        assert m.p50_ms is m.p95_ms is m.p99_ms is None


@LAB_PAIRS
@given(configs(replicas=1, rolling_deploy=False, routing="affinity"))
def test_one_replica_routing_modes_are_identical(config: LabConfig) -> None:
    """Invariant 21: with N = 1 and no deploy, affinity and round-robin give identical results.

    The log differs only by the affinity pin records, which round-robin has no use for.
    """
    affinity = quick(config)
    round_robin = quick(config.replace(routing="round_robin"))
    assert affinity.metrics == round_robin.metrics
    assert affinity.series == round_robin.series
    assert [r for r in affinity.log if r[2] != "pin"] == round_robin.log


@LAB
@given(
    configs(
        replicas=st.integers(2, 8),
        idle_timeout_s=st.integers(7, 60).map(lambda x: x * 5),
        slow_tools=False,
        rolling_deploy=False,
        hot_client=False,
    ).filter(lambda c: not (c.mode == "2025-11-25/memory" and c.routing == "round_robin"))
)
def test_baseline_health(config: LabConfig) -> None:
    """Invariant 22: no injections, N ≥ 2, T ≥ 31 s, not memory + round-robin → a healthy fleet."""
    m = quick(config).metrics
    assert m.failed == m.stream_cuts == m.duplicate_side_effects == 0
