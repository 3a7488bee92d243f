"""Retry storm: does retrying multiply load in an outage, and does it still rescue random failures?

Real `breakwater testserver` processes over stdio; every failure is an `isError` result marked
`retryable: true` (the most retry-inviting failure there is). Upstream attempts are read from
each server's `--state-file`, so they are counted where the load lands.

Scenarios, each with its baselines in the same run:

* 100 % failure: attempts per logical call for a naive client (3 attempts, no budget), breakwater
  with breakers disabled (the retry budget alone), and breakwater with its defaults;
* 10 % random failure: logical success rate with no retries, the naive client, and breakwater.

Calls are made by `--workers` concurrent callers so backoff waits overlap.

    python bench/retry_storm.py                    # 1000 logical calls per client and scenario
    python bench/retry_storm.py --calls 5000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import anyio
from mcp import Client

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec
from breakwater.config import BreakerPolicy
from breakwater.testing.server import launch_command, read_state, stdio_params

NAIVE_ATTEMPTS = 3
NO_BREAKER = BreakerPolicy(minimum_calls=10**9, consecutive_failures=10**9)


def flags(tmp: Path, name: str, p_fail: float, seed: int) -> list[str]:
    return [
        "--name",
        name,
        "--seed",
        str(seed),
        "--state-file",
        str(tmp / f"{name}.json"),
        "--tool",
        f"t:retryable_error={p_fail},readonly",
    ]


def attempts(tmp: Path, name: str) -> int:
    return int(read_state(tmp / f"{name}.json")["started"]["t"])


async def run_calls(call: Callable[[], Awaitable[bool]], n: int, workers: int) -> int:
    ok = 0
    remaining = n

    async def worker() -> None:
        nonlocal ok, remaining
        while remaining > 0:
            remaining -= 1
            # Not `ok += await call()`: that reads `ok` before awaiting and loses other workers' updates.
            succeeded = await call()
            ok += succeeded

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)
    return ok


async def naive_client(tmp: Path, name: str, p_fail: float, seed: int, n: int, workers: int, retries: bool) -> tuple[int, int]:
    async with Client(stdio_params(*flags(tmp, name, p_fail, seed))) as client:

        async def call() -> bool:
            for attempt in range(NAIVE_ATTEMPTS if retries else 1):
                result = await client.call_tool("t", {}, read_timeout_seconds=60)
                if not result.is_error:
                    return True
                if attempt + 1 < NAIVE_ATTEMPTS and retries:
                    await anyio.sleep(0.01 * 2**attempt)
            return False

        ok = await run_calls(call, n, workers)
    return ok, attempts(tmp, name)


async def breakwater_client(
    tmp: Path, name: str, p_fail: float, seed: int, n: int, workers: int, breaker: BreakerPolicy | None
) -> tuple[int, int]:
    cmd = launch_command(*flags(tmp, name, p_fail, seed))
    spec = ServerSpec(
        name=name, transport="stdio", command=cmd[0], args=tuple(cmd[1:]), connect=ConnectPolicy(startup_jitter_s=0)
    )
    if breaker is not None:
        spec = replace(spec, breaker=breaker)
    async with AsyncExitStack() as stack:
        bw = Breakwater(Config(servers=(spec,)), admission_dir=tmp / "admission", protocol_memory_dir="off")
        await stack.enter_async_context(bw)
        await bw.wait_ready(timeout=60)

        async def call() -> bool:
            return not (await bw.call_tool(name, "t", {})).is_error

        ok = await run_calls(call, n, workers)
    return ok, attempts(tmp, name)


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bw-retry-storm-") as tmp:
        return await _storms(Path(tmp), args)


async def _storms(tmp: Path, args: argparse.Namespace) -> dict[str, object]:
    n, w, seed = args.calls, args.workers, args.seed
    out: dict[str, object] = {"calls": n, "workers": w}
    t0 = time.monotonic()
    outage = {
        "naive_3_attempts": await naive_client(tmp, "o-naive", 1.0, seed, n, w, True),
        "breakwater_budget_only": await breakwater_client(tmp, "o-bwb", 1.0, seed, n, w, NO_BREAKER),
        "breakwater_defaults": await breakwater_client(tmp, "o-bw", 1.0, seed, n, w, None),
    }
    flaky = {
        "no_retries": await naive_client(tmp, "f-none", 0.1, seed, n, w, False),
        "naive_3_attempts": await naive_client(tmp, "f-naive", 0.1, seed, n, w, True),
        "breakwater_defaults": await breakwater_client(tmp, "f-bw", 0.1, seed, n, w, None),
    }
    print(f"{n} logical calls per client, {w} concurrent callers ({time.monotonic() - t0:.0f} s)")
    print("100 % failure: upstream attempts per logical call (target <= 1.1)")
    for name, (_ok, att) in outage.items():
        print(f"  {name:<24} {att / n:6.3f}")
    naive_amp = outage["naive_3_attempts"][1] / n
    bw_amp = outage["breakwater_budget_only"][1] / n
    print(f"  amplification avoided vs naive (budget only): {naive_amp / bw_amp:.2f}x")
    print("10 % random failure: logical success rate (target >= 99.9 %)")
    for name, (ok, att) in flaky.items():
        print(f"  {name:<24} {ok / n:8.3%}   attempts/call {att / n:.3f}")
    out["outage_attempts_per_call"] = {k: v[1] / n for k, v in outage.items()}
    out["flaky_success_rate"] = {k: v[0] / n for k, v in flaky.items()}
    out["flaky_attempts_per_call"] = {k: v[1] / n for k, v in flaky.items()}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--workers", type=int, default=20)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    anyio.run(main_async, p.parse_args())


if __name__ == "__main__":
    main()
