"""bench/lab_truth.py's mapping from a fleet row to the lab's knobs (the fleet itself runs in tests/gateway/test_fleet.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "lab_truth.py"


@pytest.fixture(scope="module")
def truth() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lab_truth", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_fleet_option_maps_to_the_lab_knob_at_the_fleets_time_scale(truth: ModuleType) -> None:
    legacy, modern = truth.lab_configs("rr-redis")
    assert (legacy.idle_timeout_s, legacy.keepalive_s, legacy.drain_s, legacy.replicas) == (60, 15, 180, 3)
    assert legacy.keepalive_effective and legacy.rolling_deploy and legacy.slow_tools
    assert (legacy.mode, legacy.routing) == ("2025-11-25/shared", "round_robin")
    assert (modern.mode, modern.routing) == ("2026-07-28", "round_robin")

    legacy, _ = truth.lab_configs("rr-redis-nokeepalive")
    assert legacy.keepalive_s is None and not legacy.keepalive_effective
    assert truth.lab_configs("rr-redis-shortdrain")[0].drain_s == 30
    assert truth.lab_configs("rr-redis-kill9")[0].drain_s == 0
    # HAProxy hashes a header the 2026-07-28 clients never send: they are round-robined.
    legacy, modern = truth.lab_configs("affinity")
    assert (legacy.mode, legacy.routing, modern.routing) == ("2025-11-25/memory", "affinity", "round_robin")


def test_the_lab_traffic_has_the_fleets_shape(truth: ModuleType) -> None:
    calls = truth.lab_traffic((0, 1, 2), 1.0 / 30, 3000.0, seed=3)
    assert 240 < len(calls) < 360  # 3 clients x 100 expected calls
    assert [c.id for c in calls] == list(range(len(calls)))
    assert min(c.arrival_ms for c in calls) >= 60_000  # 2 s of fleet load before the deploy at 120 s
    mutating = sum(c.mutating for c in calls) / len(calls)
    slow = [c for c in calls if c.is_slow(True)]
    assert 0.22 < mutating < 0.38 and 0.05 < len(slow) / len(calls) < 0.15
    assert all(75_000 <= c.duration_ms(True) <= 105_000 and not c.progress_offsets_ms(True) for c in slow)


def test_off_means_more_than_20_percent_or_3_calls(truth: ModuleType) -> None:
    assert not truth.off(3.0, 0) and truth.off(3.1, 0)
    assert not truth.off(13.0, 10) and truth.off(25.0, 20) and not truth.off(24.0, 20)
