"""Shared helpers for the lab tests: config strategies, fresh (un-memoised) runs, log readers.

Property tests run at least 150 random configurations each under `CI=true` (the `lab-ci` profile:
derandomised, so CI never flakes on a newly found example) and 500 locally (`lab-local`, random, so
local runs keep exploring); `BREAKWATER_LAB_EXAMPLES=N` overrides both. To fit that in a few seconds
per property, `quick()` runs a shorter window of the seed's traffic (60–240 s of arrivals, drawn from
the seed) with the full drain-out after it: the invariants are properties of the engine's rules, not
of the ten-minute window, and a short window still reaches every mechanism (the deploy starts at
120 s, so it falls inside some windows and after others).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from breakwater.lab import CallSpec, LabConfig, LabResult, generate_traffic, run
from breakwater.lab.config import MODES, ROUTINGS
from breakwater.lab.engine import DRAIN_OUT_MS
from breakwater.lab.metrics import LogRecord

_EXAMPLES = os.environ.get("BREAKWATER_LAB_EXAMPLES")
settings.register_profile(
    "lab-ci",
    max_examples=int(_EXAMPLES or 150),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "lab-local",
    max_examples=int(_EXAMPLES or 500),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LAB = settings.get_profile("lab-ci" if os.environ.get("CI") else "lab-local")
LAB_PAIRS = LAB
"""For tests that simulate twice per example: the same count, each configuration is still one example."""
QUICK_WINDOWS_S = (60, 90, 120, 150, 180, 240)
"""The arrival windows `quick()` picks from, by seed."""


def quick_window_ms(config: LabConfig) -> int:
    """The arrival window `quick()` uses for this config: a function of the seed alone."""
    return QUICK_WINDOWS_S[config.seed % len(QUICK_WINDOWS_S)] * 1000


def quick_traffic(config: LabConfig) -> tuple[CallSpec, ...]:
    """The calls `quick()` offers."""
    return generate_traffic(config.seed, config.hot_client, quick_window_ms(config))


def quick(config: LabConfig) -> LabResult:
    """Like `fresh()`, over a short window of the seed's traffic (see the module docstring)."""
    window = quick_window_ms(config)
    return run(config, quick_traffic(config), hard_stop_ms=window + DRAIN_OUT_MS, window_ms=window)


def fresh(config: LabConfig) -> LabResult:
    """Simulate without the memo, so a test sees a run of its own."""
    return run(config, generate_traffic(config.seed, config.hot_client))


def configs(**fixed: Any) -> st.SearchStrategy[LabConfig]:
    """Random configurations over the whole control space; keyword arguments pin fields (values or strategies)."""
    fields: dict[str, st.SearchStrategy[Any]] = {
        "mode": st.sampled_from(MODES),
        "routing": st.sampled_from(ROUTINGS),
        "replicas": st.integers(1, 8),
        "idle_timeout_s": st.integers(2, 60).map(lambda x: x * 5),
        "keepalive_s": st.none() | st.integers(5, 120),
        "drain_s": st.integers(0, 300),
        "idempotency": st.booleans(),
        "slow_tools": st.booleans(),
        "rolling_deploy": st.booleans(),
        "hot_client": st.booleans(),
        "seed": st.integers(0, 10_000),
    }
    for name, value in fixed.items():
        fields[name] = value if isinstance(value, st.SearchStrategy) else st.just(value)
    return st.builds(LabConfig, **fields)


def comparable(result: LabResult) -> dict[str, object]:
    """Everything a run produced except the echo of its config."""
    out = result.to_dict(log_limit=None)
    del out["config"]
    return out


def entries(result: LabResult, *kinds: str) -> Iterator[LogRecord]:
    """Log records of the given kinds, in order."""
    for record in result.log:
        if record[2] in kinds:
            yield record
