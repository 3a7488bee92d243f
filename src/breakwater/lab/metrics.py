"""What a run returns: metrics, time series for charts, a latency histogram and the event log."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from breakwater.lab.config import LabConfig

__all__ = [
    "BUCKET_MS",
    "LATENCY_EDGES_MS",
    "LOG_LIMIT",
    "REPLICA_STATES",
    "LabResult",
    "LatencyHistogram",
    "LogRecord",
    "Metrics",
    "Series",
    "nearest_rank",
]

BUCKET_MS: Final = 1_000
"""Width of one time-series bucket."""
LOG_LIMIT: Final = 20_000
"""`LabResult.to_dict()` keeps this many log records by default, so the page stays light."""
REPLICA_STATES: Final = ("up", "draining", "down")
"""Meaning of the integer codes in `Series.state`."""
LATENCY_EDGES_MS: Final = (0, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000, 300_000, 600_000)
"""Lower edges of the latency histogram's buckets; the last bucket is open-ended."""

LogRecord = tuple[int, int, str, int | None, int | None, int | None, str | int | None]
"""`(t_ms, phase, kind, call_id, attempt_no, replica, detail)`; `phase` is the engine phase being run."""


def nearest_rank(sorted_values: list[int], p: int) -> int | None:
    """Nearest-rank percentile: index `ceil(p/100 × n) − 1` of the ascending values; None when empty."""
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[max(0, -(-p * n // 100) - 1)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Metrics:
    """Every metric of a run. Latencies are in milliseconds; `None` means "no ok calls" or "no deploy"."""

    calls: int
    ok: int
    failed: int
    unfinished: int
    p50_ms: int | None
    p95_ms: int | None
    p99_ms: int | None
    duplicate_side_effects: int
    ghost_writes: int
    dedup_hits: int
    http_404: int
    reinitializations: int
    sessions_created: int
    stream_cuts: int
    resume_attempts: int
    resumes_ok: int
    resumes_failed: int
    cancellations: int
    deploy_kills: int
    reissues: int
    lost_results: int
    wasted_slot_seconds: float
    utilisation: tuple[float, ...]
    utilisation_mean: float
    utilisation_max: float
    peak_queue: tuple[int, ...]
    deploy_end_ms: int | None
    run_end_ms: int

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values, in field order."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Series:
    """One value per 1 s bucket over [0, run end].

    Gauges (`in_flight`, `busy`, `queue`, `state`) are sampled at the start of each bucket; counters
    count the events that happened inside it. `busy`, `queue` and `state` hold one list per replica.
    """

    in_flight: list[int]
    """Logical calls that have arrived and are not yet ok or failed."""
    busy: list[list[int]]
    queue: list[list[int]]
    state: list[list[int]]
    """Codes into `REPLICA_STATES`."""
    cuts: list[int]
    http_404: list[int]
    kills: list[int]
    reissues: list[int]
    failures: list[int]
    duplicates: list[int]
    completions: list[int]

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values, plus the bucket width and the state legend."""
        out: dict[str, object] = {"bucket_ms": BUCKET_MS, "state_codes": list(REPLICA_STATES)}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyHistogram:
    """Counts of ok-call latencies; bucket i covers `[edges_ms[i], edges_ms[i+1])`, the last is open."""

    edges_ms: tuple[int, ...]
    counts: tuple[int, ...]

    @classmethod
    def of(cls, latencies_ms: list[int]) -> LatencyHistogram:
        """Histogram of the given latencies over `LATENCY_EDGES_MS`."""
        counts = [0] * len(LATENCY_EDGES_MS)
        edges = LATENCY_EDGES_MS
        last = len(edges) - 1
        for value in latencies_ms:
            i = last
            while edges[i] > value:
                i -= 1
            counts[i] += 1
        return cls(edges_ms=edges, counts=tuple(counts))

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values."""
        return {"edges_ms": list(self.edges_ms), "counts": list(self.counts)}


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class LabResult:
    """The outcome of one simulated run: a pure function of its config (and traffic)."""

    config: LabConfig
    metrics: Metrics
    series: Series
    latency: LatencyHistogram
    log: list[LogRecord]
    """The full, ordered event log (empty when the run was asked not to keep it)."""
    log_total: int | None = None
    """How many records the run produced; None means `len(log)`."""

    @property
    def log_records(self) -> int:
        """How many records the run produced, kept or not."""
        return len(self.log) if self.log_total is None else self.log_total

    def to_dict(self, *, log_limit: int | None = LOG_LIMIT) -> dict[str, object]:
        """JSON-serialisable form: config, metrics, series, latency histogram and the log.

        The log is cut to its first `log_limit` records (None keeps all); `log_total` says how
        many there were.
        """
        log = self.log if log_limit is None else self.log[:log_limit]
        return {
            "config": self.config.to_dict(),
            "metrics": self.metrics.to_dict(),
            "series": self.series.to_dict(),
            "latency_histogram": self.latency.to_dict(),
            "log_fields": ["t_ms", "phase", "kind", "call", "attempt", "replica", "detail"],
            "log": [list(r) for r in log],
            "log_total": self.log_records,
        }
