"""Benchmark the fleet lab's engine: runs/s, ms per run and events/s for the issue's three targets.

Usage: .venv/bin/python bench/lab.py [--repeat N] [--day-repeat N] [--skip-24h]

Each case is timed `--repeat` times after one warm-up run; the best, the median and the worst of the
wall-clock times are reported, and the median CPU time of the process (on a shared machine the wall
clock also counts time spent waiting for a core; CPU time does not). Traffic generation is timed
separately (it is memoised per seed in the library, so the page pays it once per seed). Events are
counted from the engine's event-queue pops. The machine (cores, CPU model) and its load average
before and after are printed too, since the figures mean little without them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from unittest import mock

from breakwater.lab import LabConfig, generate_traffic, get_mission, run
from breakwater.lab import engine as lab_engine
from breakwater.lab.config import CLIENTS, HARD_STOP_MS, WINDOW_MS
from breakwater.lab.traffic import CallSpec


def _count_events(config: LabConfig, traffic: Sequence[CallSpec], hard_stop_ms: int) -> int:
    # Count heap pops in one extra run; kept out of the timed runs.
    counter = {"pops": 0}
    real_pop = lab_engine._heappop  # type: ignore[attr-defined]

    def counting_pop(heap: list[tuple[int, int, int, int, object, int]]) -> tuple[int, int, int, int, object, int]:
        counter["pops"] += 1
        return real_pop(heap)

    with mock.patch.object(lab_engine, "_heappop", counting_pop):
        run(config, traffic, hard_stop_ms=hard_stop_ms)
    return counter["pops"]


def _time(config: LabConfig, traffic: Sequence[CallSpec], repeat: int, hard_stop_ms: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds of `repeat` runs, after a warm-up."""
    run(config, traffic, hard_stop_ms=hard_stop_ms)  # warm-up
    wall, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        run(config, traffic, hard_stop_ms=hard_stop_ms)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return wall, cpu


def _machine() -> str:
    model = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus ({model})"


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def _day_traffic(seed: int) -> list[CallSpec]:
    # 24 hours at 3 calls/s: 144 ten-minute windows of the seed's base stream laid end to end.
    calls: list[CallSpec] = []
    for window in range(144):
        for spec in generate_traffic(seed + window):
            calls.append(
                CallSpec(
                    id=len(calls),
                    client=spec.client % CLIENTS,
                    arrival_ms=spec.arrival_ms + window * WINDOW_MS,
                    base_duration_ms=spec.base_duration_ms,
                    mutating=spec.mutating,
                    mut_frac=spec.mut_frac,
                    slow_u=spec.slow_u,
                    slow_duration_ms=spec.slow_duration_ms,
                    progress_gaps_ms=spec.progress_gaps_ms,
                )
            )
    return calls


def _report(
    name: str,
    config: LabConfig,
    traffic: Sequence[CallSpec],
    repeat: int,
    target_ms: float,
    hard_stop_ms: int = HARD_STOP_MS,
) -> None:
    wall, cpu = _time(config, traffic, repeat, hard_stop_ms)
    events = _count_events(config, traffic, hard_stop_ms)
    median, median_cpu = statistics.median(wall), statistics.median(cpu)
    print(
        f"{name:<27} calls {len(traffic):>6}  events {events:>6}  wall best/median/worst "
        f"{min(wall) * 1000:6.1f} /{median * 1000:7.1f} /{max(wall) * 1000:7.1f} ms  cpu median {median_cpu * 1000:7.1f} ms  "
        f"{1 / median:6.1f} runs/s  {events / median / 1e6:4.2f} M events/s (cpu {events / median_cpu / 1e6:4.2f})  "
        f"target ≤ {target_ms:g} ms: {'ok' if median * 1000 <= target_ms else 'MISSED'}"
    )


def main(argv: list[str]) -> int:
    """Run the benchmark; prints one line per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--skip-24h", action="store_true")
    parser.add_argument("--day-repeat", type=int, default=3, help="timed runs of the 24 h case")
    args = parser.parse_args(argv)
    print(_machine())
    print(f"before: {_load()}")

    generate_traffic.cache_clear()
    started = time.perf_counter()
    generate_traffic(1, True)
    print(f"traffic generation (base + hot, uncached): {(time.perf_counter() - started) * 1000:.1f} ms")

    default = LabConfig()
    _report("default, 10 min", default, generate_traffic(default.seed), args.repeat, 20)
    m6 = get_mission(6).setup
    _report("M6 set-up (heaviest)", m6, generate_traffic(m6.seed, True), args.repeat, 100)
    for mission_id in (1, 2, 3, 4, 5):
        setup = get_mission(mission_id).setup
        _report(f"M{mission_id} set-up", setup, generate_traffic(setup.seed, setup.hot_client), args.repeat, 100)
    if not args.skip_24h:
        day = _day_traffic(1)
        # The default hard stop (1 h) would end a day early; allow the day plus an hour to drain.
        _report("default, 24 h at 3 calls/s", LabConfig(), day, args.day_repeat, 10_000, hard_stop_ms=25 * 3_600_000)
    print(f"after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
