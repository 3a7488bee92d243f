"""Lab truth (issue 17): the lab's prediction beside a real fleet, for the scenarios both express.

    python bench/lab_truth.py                          # run the fleet rows (about 4 minutes) and the lab
    python bench/lab_truth.py --save fleet.json        # ... and keep the fleet's figures
    python bench/lab_truth.py --fleet-json fleet.json  # the lab against figures measured before

The fleet side is `bench/fleet.py`'s rows, run by its own `measure_row`. The lab side is the lab
engine (`breakwater.lab.engine.run`) fed traffic shaped like the fleet's clients, averaged over
`--lab-seeds` seeds (the lab's expectation; the fleet is one sample).

The mapping (`lab_configs`, `lab_traffic`), fleet option -> lab knob, time scaled 30x (bench/fleet.py's
own scale):

* idle timeout 2 s -> `idle_timeout_s=60`; keep-alive 0.5 s -> `keepalive_s=15`, off -> None. Exact.
* drain 6 s / 1 s -> `drain_s=180` / `30`; SIGKILL (the kill -9 row) -> `drain_s=0`. Approximate: the
  lab kills a draining replica at the end of its window, a real one exits as soon as it is idle, so
  the lab's deploy takes longer (each replica's window plus a fixed 15 s reboot).
* replicas 3 -> `replicas=3`. Exact.
* Redis -> `2025-11-25/shared`, no Redis -> `2025-11-25/memory` for the three 2025-11-25 clients;
  the three 2026-07-28 clients -> a second run in mode `2026-07-28`; the two runs are added up.
  Approximate: in the fleet both kinds share the replicas' capacity (far from full here).
* affinity on Mcp-Session-Id -> `routing="affinity"` for the 2025-11-25 clients; the 2026-07-28 clients
  send no session id, so HAProxy round-robins them -> `round_robin` in their run. Approximate: the
  lab pins a client from its first request (initialize included); HAProxy hashes the session id, which
  an initialize does not carry yet (see the table).
* HAProxy's round-robin -> the lab's uniform random pick per hop. Approximate.
* calls: 6 clients, Poisson, the fleet's measured calls per second (bench/fleet.py's clients are closed
  loops: a client waits for its call, so its rate is measured, not set); 30 % mutating, 10 % silent
  "report" calls of 2.5-3.5 s (-> 75-105 s, no progress), the rest lognormal(median 0.15 s, sigma 0.7)
  (-> 4.5 s). Built as `CallSpec`s, since the lab's own traffic (24 clients, 3 calls/s, 40 % mutating)
  is fixed. Approximate: open loop for a closed one.
* the deploy starts 2 s (-> 60 s) into the load: the lab's deploy starts at 120 s, so the lab's
  arrivals start at 60 s and last the fleet's measured run time (x30). Exact up to the run time.
* what is counted: the fleet's 2025-11-25 clients resume a cut stream with Last-Event-ID (as the SDK's
  client does) but never re-issue (a failed resume or a second 404 is a failed call); the lab's do
  both (a GET resume after a cut for 2025-11-25, up to three re-issues for 2026-07-28). So both sides
  count calls, not events: 404s are calls that saw at least one 404; cuts are calls that had an
  attempt cut by the idle timeout or killed by a deploy (in the fleet: a stream that ended before its
  answer, a 502 or a 504, `LoadStats.cut`); resumes are resume GETs that brought the answer.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet as fleet_bench  # bench/fleet.py, beside this file (the path line above)
from breakwater.lab.config import DEPLOY_START_MS, LabConfig
from breakwater.lab.engine import run as lab_run
from breakwater.lab.traffic import CallSpec

#: The rows of bench/fleet.py both sides express.
SCENARIOS: tuple[str, ...] = tuple(fleet_bench.ROWS)
SCALE = 30
"""Lab seconds per fleet second (bench/fleet.py's docstring: 60 s idle timeout = 2 s)."""
FLEET_LOAD_BEFORE_DEPLOY_S = 2.0
LEGACY, MODERN = (0, 1, 2), (3, 4, 5)
"""Client ids of the lab's runs: bench/fleet.py runs three 2025-11-25 and three 2026-07-28 clients."""
MUTATING_SHARE, SLOW_SHARE = 0.3, 0.1
WORK_MEDIAN_S, WORK_SIGMA = 0.15, 0.7
SLOW_RANGE_S = (2.5, 3.5)
METRICS = ("failed", "404s", "cuts", "resumes", "duplicates")


def lab_configs(name: str, seed: int = 1) -> tuple[LabConfig, LabConfig]:
    """The lab configs of one fleet row: (the 2025-11-25 clients' run, the 2026-07-28 clients' run)."""
    _, options, kill = fleet_bench.ROWS[name]
    keepalive = round(options.keepalive_s * SCALE) if options.keepalive_s > 0 else None
    common = LabConfig(
        replicas=options.replicas,
        idle_timeout_s=round(options.idle_timeout_s * SCALE),
        keepalive_s=keepalive,
        drain_s=0 if kill else round(options.drain_s * SCALE),
        slow_tools=True,
        rolling_deploy=True,
        seed=seed,
    )
    legacy_mode = "2025-11-25/shared" if options.redis_url else "2025-11-25/memory"
    legacy = common.replace(mode=legacy_mode, routing="affinity" if options.affinity else "round_robin")
    return legacy, common.replace(mode="2026-07-28", routing="round_robin")


def lab_traffic(clients: tuple[int, ...], rate_per_client_s: float, window_s: float, seed: int) -> list[CallSpec]:
    """Calls shaped like bench/fleet.py's, in lab time: Poisson per client from 60 s for `window_s` s."""
    rng = random.Random(seed)
    start = DEPLOY_START_MS - round(FLEET_LOAD_BEFORE_DEPLOY_S * SCALE * 1000)
    calls: list[CallSpec] = []
    for client in clients:
        t = 0.0
        while True:
            t += rng.expovariate(rate_per_client_s)
            if t >= window_s:
                break
            draw = rng.random()
            mutating = draw < MUTATING_SHARE
            slow = not mutating and draw < MUTATING_SHARE + SLOW_SHARE
            work_s = WORK_MEDIAN_S * SCALE * math.exp(WORK_SIGMA * rng.gauss())
            slow_ms = round(rng.uniform(*SLOW_RANGE_S) * SCALE * 1000)
            calls.append(
                CallSpec(
                    id=len(calls),
                    client=client,
                    arrival_ms=start + round(t * 1000),
                    base_duration_ms=max(1, round(work_s * 1000)),
                    mutating=mutating,
                    mut_frac=rng.uniform(0.2, 0.8),
                    slow_u=0.0 if slow else 1.0,
                    slow_duration_ms=slow_ms,
                    # Silent to the end: one gap longer than any call.
                    progress_gaps_ms=(10 * slow_ms,) * 6,
                )
            )
    calls.sort(key=lambda c: (c.arrival_ms, c.id))
    return [CallSpec(**{**_fields(c), "id": i}) for i, c in enumerate(calls)]


def _fields(call: CallSpec) -> dict[str, Any]:
    return {name: getattr(call, name) for name in CallSpec.__dataclass_fields__}


def lab_row(name: str, fleet_calls: int, fleet_took_s: float, seeds: int) -> dict[str, float]:
    """The lab's mean figures for one fleet row, over `seeds` seeds, at the fleet's measured call rate."""
    rate = fleet_calls / fleet_took_s / (len(LEGACY) + len(MODERN)) / SCALE
    window_s = fleet_took_s * SCALE
    totals = dict.fromkeys(("calls", *METRICS), 0.0)
    for seed in range(1, seeds + 1):
        for clients, config in zip((LEGACY, MODERN), lab_configs(name, seed), strict=True):
            result = lab_run(config, lab_traffic(clients, rate, window_s, seed * 7 + clients[0]))
            m = result.metrics
            # Counted as bench/fleet.py counts: calls that saw a 404 (at least once), calls that were cut.
            seen: dict[str, set[int]] = {"404": set(), "cut": set(), "kill": set()}
            for _, _, kind, call_id, *_ in result.log:
                if kind in seen and call_id is not None:
                    seen[kind].add(call_id)
            for key, value in (
                ("calls", m.calls),
                ("failed", m.failed + m.unfinished),
                ("404s", len(seen["404"])),
                ("cuts", len(seen["cut"] | seen["kill"])),
                ("resumes", m.resume_attempts),
                ("duplicates", m.duplicate_side_effects),
            ):
                totals[key] += value / seeds
    return totals


def off(lab: float, fleet: float) -> bool:
    """The lab is off when it misses by more than 20 % of the fleet's figure or 3 events, whichever is larger."""
    return abs(lab - fleet) > max(0.2 * fleet, 3)


def table(measured: dict[str, dict[str, Any]], seeds: int) -> list[str]:
    """The comparison, one markdown row per scenario: each metric as fleet / lab, `**` where the lab is off."""
    head = "| scenario | calls fleet / lab | " + " | ".join(f"{m} fleet / lab" for m in METRICS) + " |"
    lines = [head, "|" + "---|" * (2 + len(METRICS))]
    for name, fleet in measured.items():
        lab = lab_row(name, fleet["calls"], fleet["took_s"], seeds)
        cells = [f"{fleet['calls']} / {lab['calls']:.0f}"]
        for metric in METRICS:
            flag = " **off**" if off(lab[metric], fleet[metric]) else ""
            cells.append(f"{fleet[metric]} / {lab[metric]:.1f}{flag}")
        lines.append(f"| {name}: {fleet_bench.ROWS[name][0]} | " + " | ".join(cells) + " |")
    return lines


async def measure_fleet(names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each row's failed calls, 404s, cuts, resumes and duplicates, as `bench/fleet.py` measures them."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        row = await fleet_bench.measure_row(name)
        s = row.stats
        out[name] = {
            "calls": s.calls,
            "failed": s.failed,
            "404s": s.not_found,
            "cuts": row.cuts,
            "resumes": s.resumed,
            "duplicates": row.duplicates,
            "failures": s.failures,
            "exits": row.exits,
            "took_s": row.took_s,
        }
        print(f"fleet {name}: {out[name]}", file=sys.stderr, flush=True)
        for failure in s.failures:
            print(f"    {failure[:140]}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleet-json", type=Path, help="read the fleet's figures from this file instead of running it")
    parser.add_argument("--save", type=Path, help="write the fleet's figures to this file")
    parser.add_argument("--only", action="append", choices=SCENARIOS, help="only this scenario (repeatable)")
    parser.add_argument("--lab-seeds", type=int, default=20, help="lab seeds to average over (default 20)")
    args = parser.parse_args()
    names = tuple(args.only or SCENARIOS)
    if args.fleet_json:
        measured = {k: v for k, v in json.loads(args.fleet_json.read_text()).items() if k in names}
    else:
        measured = anyio.run(measure_fleet, names)
    if args.save:
        args.save.write_text(json.dumps(measured, indent=1))
    print("\n".join(table(measured, args.lab_seeds)))


if __name__ == "__main__":
    main()
