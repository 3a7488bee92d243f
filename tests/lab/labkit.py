"""Shared helpers for the lab tests: config strategies, fresh (un-memoised) runs, log readers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from breakwater.lab import LabConfig, LabResult, generate_traffic, run
from breakwater.lab.config import MODES, ROUTINGS
from breakwater.lab.metrics import LogRecord

# Modest, derandomised example counts: the whole lab suite must stay well under a minute on 2
# cores, and CI must not flake on a newly found example.
settings.register_profile(
    "lab",
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
LAB = settings.get_profile("lab")
LAB_PAIRS = settings(LAB, max_examples=5)
"""For tests that simulate twice per example."""


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
