"""The fleet lab: a deterministic simulator of an MCP server fleet, with missions.

Ten minutes of synthetic tool calls go through a load balancer to replicas with ten slots each,
under the session and stream rules of MCP 2025-11-25 (sessions in replica memory or in a shared
store) or 2026-07-28 (stateless). Slow tools, a rolling deploy and a hot client can be injected.
The run is a pure function of the config: same config and seed, same result, in any process.
The model is specified in docs/lab.md.

Public API (what `breakwater lab run` and the web page use):

- `LabConfig(*, mode, routing, replicas, idle_timeout_s, keepalive_s, drain_s, idempotency,
  slow_tools, rolling_deploy, hot_client, seed)`: frozen, keyword-only, validated on construction
  (`LabConfigError`, a `ConfigError` and `ValueError`, whose `.key` names the bad control).
  `LabConfig.from_dict(data, *, base=None)` accepts JSON or web-form values ("60", "off", "on");
  `config.to_dict()` round-trips; `config.replace(**changes)`.
- `simulate(config, *, keep_log=True) -> LabResult`: run the seed's traffic. Memoised per config
  within a size budget (the result is immutable in practice; do not mutate its lists);
  `keep_log=False` keeps no event log (metrics, series and `log_total` only).
- `LabResult.metrics` (`Metrics`: every metric as a typed field), `.series` (`Series`: one
  value per 1 s bucket), `.latency` (`LatencyHistogram`), `.log` (the full event log).
  `LabResult.to_dict(*, log_limit=LOG_LIMIT)` is JSON-serialisable::

      {"config": {...},
       "metrics": {"calls", "ok", "failed", "unfinished", "p50_ms", "p95_ms", "p99_ms",
                   "duplicate_side_effects", "ghost_writes", "dedup_hits", "http_404",
                   "reinitializations", "sessions_created", "stream_cuts", "resume_attempts",
                   "resumes_ok", "resumes_failed", "cancellations", "deploy_kills", "reissues",
                   "lost_results", "wasted_slot_seconds", "utilisation": [per replica],
                   "utilisation_mean", "utilisation_max", "peak_queue": [per replica],
                   "deploy_end_ms", "run_end_ms"},
       "series": {"bucket_ms": 1000, "state_codes": ["up", "draining", "down"],
                  "in_flight": [...], "busy": [[...] per replica], "queue": [[...] per replica],
                  "state": [[...] per replica], "cuts": [...], "http_404": [...], "kills": [...],
                  "reissues": [...], "failures": [...], "duplicates": [...], "completions": [...]},
       "latency_histogram": {"edges_ms": [...], "counts": [...]},
       "log_fields": ["t_ms", "phase", "kind", "call", "attempt", "replica", "detail"],
       "log": [[...], ...], "log_total": n}

- `MISSIONS` (six `Mission`s; `mission.to_dict()` has texts, set-up, pinned seed and the
  references/traps), `get_mission(id)`, `score_mission(id, config, result) -> 0 | 1 | 3`,
  `is_exploration(id, config)` (seed differs from the pinned seed: show, but award nothing),
  `Progress` (unlock and best-stars rules) and `new_seed(config, rng=None)`.
- `mission_report(id, config) -> dict`: one call for the page: `{"mission", "stars",
  "exploration", "verdict", "result"}`; `verdict` is `Mission.explain()`: each goal and 3-star
  condition with the value seen, whether it holds and by how much it misses.
- `generate_traffic(seed, hot=False) -> tuple[CallSpec, ...]` and `run(config, calls)` (crafted
  scenarios) for tests.
"""

from __future__ import annotations

from breakwater.lab.config import LabConfig, LabConfigError
from breakwater.lab.engine import run, simulate
from breakwater.lab.metrics import LOG_LIMIT, LabResult, LatencyHistogram, Metrics, Series
from breakwater.lab.missions import (
    MISSIONS,
    Mission,
    Progress,
    Variant,
    get_mission,
    is_exploration,
    new_seed,
    score_mission,
)
from breakwater.lab.traffic import CallSpec, generate_traffic

__all__ = [
    "LOG_LIMIT",
    "MISSIONS",
    "CallSpec",
    "LabConfig",
    "LabConfigError",
    "LabResult",
    "LatencyHistogram",
    "Metrics",
    "Mission",
    "Progress",
    "Series",
    "Variant",
    "generate_traffic",
    "get_mission",
    "is_exploration",
    "mission_report",
    "new_seed",
    "run",
    "score_mission",
    "simulate",
]


def mission_report(mission_id: int, config: LabConfig, *, log_limit: int | None = LOG_LIMIT) -> dict[str, object]:
    """Simulate `config` as an attempt at mission `mission_id`; JSON-ready, stars 0 when exploring."""
    mission = get_mission(mission_id)
    # A report without its log (the page's) runs without keeping one: the heaviest logs are 100+ MB.
    result = simulate(config, keep_log=log_limit != 0)
    exploring = is_exploration(mission_id, config)
    return {
        "mission": mission.to_dict(),
        "stars": 0 if exploring else score_mission(mission_id, config, result),
        "exploration": exploring,
        "verdict": mission.explain(config, result.metrics),
        "result": result.to_dict(log_limit=log_limit),
    }
