"""A fleet behind HAProxy (issue 15): what a rolling restart costs, row by row.

    python bench/fleet.py                    # every row (about 4 minutes on 2 cores)
    python bench/fleet.py --only rr-redis    # one row

Each row starts three `breakwater serve --http` replicas behind HAProxy (`breakwater.testing._fleet`,
the config the README shows), one `breakwater testserver` upstream whose mutating tool writes a
ledger line per execution, and synthetic clients through the balancer: 3 on 2026-07-28 (no
session), 3 on 2025-11-25 sessions (re-initialize on a 404), Poisson arrivals, 30 % mutating calls
with operation ids, 10 % silent calls of 2.5-3.5 s. After 2 s of load, each replica in turn gets
SIGTERM (or SIGKILL), is started again and waits until HAProxy has it back; the load runs on
for 2 s more. A client whose answer was lost (a cut stream, a 502/503/504) first resumes it when it can
(2025-11-25 clients reconnect with Last-Event-ID, as the SDK's client does; 2026-07-28 has no
resumption), else retries through the balancer under the same operation id (a second time only if
that retry is cut too). Printed: calls, failed calls, 404s, re-initializations, cut streams (a
connection cut before the call's answer: mid-stream, or a 502/504 before it) and resumed ones,
duplicate executions (from the ledger), latency p50/p95/p99 of the calls that succeeded, each
replica's exit code and stop time, and how the cut calls' retries were answered.

Time is scaled down about 30x: the balancer's idle timeout is 2 s (60 s in production), the
keep-alive 0.5 s (15 s), a silent call 3 s (90 s), the long drain window 6 s (180 s).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from breakwater.testing._fleet import UPSTREAM_TOOLS, Fleet, FleetOptions, LoadStats, loaded

REDIS = os.environ.get("BREAKWATER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
LONG_DRAIN, SHORT_DRAIN = 6.0, 1.0

#: Rows whose clients are all on 2025-11-25 (the revision with resumable streams).
LEGACY_ONLY = frozenset({"rr-redis-nokeepalive-resume"})

#: In the kill -9 row the mutating calls last 1-2 s, so that some are in flight on each replica killed
#: (at 0.15 s they almost never are): those are the calls whose retries must not run them twice.
KILL_TOOLS = tuple("order:latency=uniform(1,2),mutating" if t.startswith("order:") else t for t in UPSTREAM_TOOLS)

ROWS: dict[str, tuple[str, FleetOptions, bool]] = {
    "rr": ("round-robin, no Redis (the broken baseline)", FleetOptions(drain_s=LONG_DRAIN), False),
    "affinity": ("affinity on Mcp-Session-Id, no Redis", FleetOptions(affinity=True, drain_s=LONG_DRAIN), False),
    "rr-redis": ("round-robin, Redis", FleetOptions(redis_url=REDIS, drain_s=LONG_DRAIN), False),
    "rr-redis-nokeepalive": (
        "round-robin, Redis, keep-alive off",
        FleetOptions(redis_url=REDIS, drain_s=LONG_DRAIN, keepalive_s=0),
        False,
    ),
    "rr-redis-nokeepalive-resume": (
        "round-robin, Redis, keep-alive off, 2025-11-25 clients only (cut streams resumed with Last-Event-ID)",
        FleetOptions(redis_url=REDIS, drain_s=LONG_DRAIN, keepalive_s=0),
        False,
    ),
    "rr-redis-shortdrain": (
        "round-robin, Redis, drain shorter than the longest call",
        FleetOptions(redis_url=REDIS, drain_s=SHORT_DRAIN),
        False,
    ),
    "rr-redis-kill9": (
        "round-robin, Redis, kill -9 instead of SIGTERM",
        FleetOptions(redis_url=REDIS, upstream_tools=KILL_TOOLS),
        True,
    ),
}


@dataclass
class RowResult:
    """What one row measured (bench/lab_truth.py compares it with the lab)."""

    stats: LoadStats
    duplicates: int
    exits: list[tuple[int, float]]
    took_s: float

    @property
    def cuts(self) -> int:
        """Calls whose connection was cut before their answer (resumed or not)."""
        return self.stats.cut


async def measure_row(name: str) -> RowResult:
    """Run one row: the fleet, the load, the rolling restart; what the clients and the ledger saw."""
    _, options, kill = ROWS[name]
    with tempfile.TemporaryDirectory(prefix="bw-fleet-") as tmp:
        async with Fleet(Path(tmp), options) as fleet:
            started = time.monotonic()
            modern = 0 if name in LEGACY_ONLY else 3
            async with loaded(fleet.url, modern_clients=modern, legacy_clients=6 - modern, rate=2.0, slow_share=0.1) as stats:
                await anyio.sleep(2.0)
                await fleet.rolling_restart(kill=kill)
                await anyio.sleep(2.0)
            took = time.monotonic() - started
            return RowResult(stats, fleet.duplicates(), [e for r in fleet.replicas for e in r.exits], took)


async def run_row(name: str) -> None:
    title = ROWS[name][0]
    row = await measure_row(name)
    stats, duplicates, took = row.stats, row.duplicates, row.took_s
    exits = ", ".join(f"{code}/{seconds:.1f}s" for code, seconds in row.exits)
    p = [stats.quantile(q) * 1000 for q in (0.5, 0.95, 0.99)]
    print(
        f"| {title} | {stats.calls} | {stats.failed} | {stats.not_found} | {stats.reinits} | {stats.cut} | {stats.resumed} "
        f"| {duplicates} "
        f"| {p[0]:.0f} / {p[1]:.0f} / {p[2]:.0f} | {exits} | {took:.0f} s |",
        flush=True,
    )
    if stats.retried:
        # Each cut call was retried once through the balancer under its operation id (breakwater.gateway._operations).
        print(
            f"|   {stats.retried} cut and retried ({stats.cut_mutating} mutating): {stats.reconciled} reconciled, "
            f"{stats.unknown} OUTCOME_UNKNOWN, {stats.rerun} run by the retry (read-only, or never started), "
            f"{stats.unanswered} unanswered; {stats.cut_again} retried twice (the first retry was cut too) |",
            flush=True,
        )
    if stats.resumed_unknown:
        print(f"|   {stats.resumed_unknown} resumed on another replica and answered OUTCOME_UNKNOWN there |", flush=True)
    for reason, count in collections.Counter(f[:110] for f in stats.failures).most_common(4):
        print(f"|   {count} x {reason} |", file=sys.stderr, flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(ROWS), help="run only this row (repeatable)")
    args = parser.parse_args()
    print(
        "| row | calls | failed | 404s | re-inits | cut streams | resumed | duplicates | p50 / p95 / p99 ms "
        "| exit code/stop time | run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.only or list(ROWS):
        await run_row(name)


if __name__ == "__main__":
    anyio.run(main)
