"""One upstream's large results: what they cost calls to another server (issue 14).

Two stdio servers behind one `Breakwater`: `big` (tests/connect/broken_upstream.py, a tool that
answers with N bytes) and `fast` (the testserver's `echo`, latency 0). `fast` is called in a closed
loop (one call at a time) for `--seconds`, three ways in the same run:

* alone (the baseline);
* while `big` answers, back to back, with results over `[call] max_result_bytes` (default 50 MB:
  each is dropped unread and answered RESULT_TOO_LARGE);
* while `big` answers with results under the limit (default 8 MB: each is parsed and returned).

Printed: p50/p99 of `fast`'s calls in each phase and their ratio to the baseline, and how many big
calls ran and with what outcome.

    python bench/large_result.py                       # 50 MB over the limit, 8 MB under it
    python bench/large_result.py --over 20000000 --under 4000000 --seconds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec
from breakwater.config import JournalPolicy
from breakwater.gate._envelope import envelope_of
from breakwater.testing.server import launch_command

BROKEN = Path(__file__).resolve().parent.parent / "tests" / "connect" / "broken_upstream.py"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _phase(bw: Breakwater, seconds: float, big_bytes: int | None) -> tuple[list[float], dict[str, int]]:
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    stop = time.monotonic() + seconds

    async def fast() -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            result = await bw.call_tool("fast", "echo", {})
            assert not result.is_error, result
            latencies.append(time.perf_counter() - started)

    async def big(size: int) -> None:
        while time.monotonic() < stop:
            result = await bw.call_tool("big", "big", {"bytes": size})
            code = (envelope_of(result) or {}).get("code", "ERROR") if result.is_error else "ok"
            outcomes[code] = outcomes.get(code, 0) + 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(fast)
        if big_bytes is not None:
            tg.start_soon(big, big_bytes)
    return latencies, outcomes


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        echo = launch_command("--tool", "echo:latency=0,readonly")
        fast_policy = ConnectPolicy(startup_jitter_s=0, health_interval_s=0)
        specs = (
            ServerSpec(name="fast", transport="stdio", command=echo[0], args=tuple(echo[1:]), connect=fast_policy),
            ServerSpec(name="big", transport="stdio", command=sys.executable, args=(str(BROKEN),), connect=fast_policy),
        )
        from dataclasses import replace

        from breakwater.config import CallPolicy

        specs = (specs[0], replace(specs[1], call=CallPolicy(timeout_s=60, max_s=60)))
        config = Config(servers=specs, journal=JournalPolicy(url="off"))
        async with Breakwater(config, admission_dir=Path(tmp) / "admission", protocol_memory_dir="off") as bw:
            await bw.wait_ready(timeout=60)
            base, _ = await _phase(bw, args.seconds, None)
            over, over_outcomes = await _phase(bw, args.seconds, args.over)
            under, under_outcomes = await _phase(bw, args.seconds, args.under)
    b50, b99 = statistics.median(base), _pct(base, 0.99)
    print(f"fast echo alone:                      p50 {b50 * 1000:7.2f} ms  p99 {b99 * 1000:7.2f} ms  ({len(base)} calls)")
    for label, values, outcomes in (
        (f"while big answers {args.over:,} B", over, over_outcomes),
        (f"while big answers {args.under:,} B", under, under_outcomes),
    ):
        p50, p99 = statistics.median(values), _pct(values, 0.99)
        print(
            f"fast echo {label:27s} p50 {p50 * 1000:7.2f} ms  p99 {p99 * 1000:7.2f} ms  ({len(values)} calls)  "
            f"x{p50 / b50:.1f} p50, x{p99 / b99:.1f} p99; big calls: {outcomes}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase (default 8)")
    parser.add_argument("--over", type=int, default=50_000_000, help="bytes of a result over the limit (default 50 MB)")
    parser.add_argument("--under", type=int, default=8_000_000, help="bytes of a result under the limit (default 8 MB)")
    anyio.run(main, parser.parse_args())
