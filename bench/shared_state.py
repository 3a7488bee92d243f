"""Shared breaker state (issue 6): decision latency, propagation delay, and a Jepsen-style checker.

    python bench/shared_state.py                 # latency + propagation (Redis on 127.0.0.1:6379)
    python bench/shared_state.py check --seeds 3 --duration 6   # the CI-sized checker
    python bench/shared_state.py check --big     # 20 seeds x 20 s

Latency: one decision = `acquire()` + `record()` on a closed breaker, and `acquire()` on an open
one (a rejection), in-process vs the Redis store (cached: the mirror answers; uncached: one Lua
round trip per decision, what a store without a local cache would pay). Propagation: replica A
trips a breaker, replica B polls `acquire()` until it is refused.

Checker: a randomized run against its own redis-server: worker processes (replicas, each with a
clock skewed by up to ±60 s) make calls through one breaker while the controller flips upstream
health, pauses workers (SIGSTOP/SIGCONT), and kills and restarts Redis. Every decision goes to a
history; the checker then verifies
  * probe exclusivity: no two shared probes in flight at once, unless the first one's lease had
    expired before the second was granted (its replica was paused: the epoch fences it off);
  * unique, monotonic epochs: no epoch granted twice; a grant that finished before another began has
    the lower epoch; each replica's shared epochs never go down (across Redis restarts too).
Probes granted while a replica was degraded (local fallback, by design one per replica) are
counted, not checked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from breakwater._clock import SystemClock
from breakwater.config import StatePolicy
from breakwater.gate._breaker import BreakerPolicy, BreakerRegistry, Outcome, Permit, Rejection
from breakwater.state import MemoryStore
from breakwater.state._redis import RedisStore

LEASE_S = 0.5
CHECK_POLICY = BreakerPolicy(consecutive_failures=2, open_base_s=0.3, open_max_s=1.0, open_jitter=0.2, probe_lease_s=LEASE_S)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def row(name: str, samples: list[float]) -> str:
    us = [s * 1e6 for s in samples]
    return f"| {name} | {pct(us, 0.5):.1f} | {pct(us, 0.99):.1f} | {statistics.mean(us):.1f} |"


# ---- latency and propagation ------------------------------------------------------------------


async def latency(url: str, n: int) -> None:
    clock = SystemClock()
    policy = BreakerPolicy(consecutive_failures=3, open_base_s=300, open_max_s=300)
    ns = f"bwbench-{uuid.uuid4().hex[:8]}"
    state = StatePolicy(url=url, namespace=ns, timeout_s=0.5)
    a, b = RedisStore(state, clock=clock), RedisStore(state, clock=clock)
    lines = ["| decision | p50 µs | p99 µs | mean µs |", "|---|---|---|---|"]
    async with anyio.create_task_group() as tg:
        for s in (a, b):
            tg.start_soon(s.run)
            await s.connect()
        for label, store in (("in-process", MemoryStore()), ("Redis, cached (mirror)", a)):
            reg = BreakerRegistry(clock=clock, policy=policy, store=store)
            br = reg.tool("bench", "closed")
            br.acquire()
            await anyio.sleep(0.05)
            samples = []
            for i in range(n):
                t0 = time.perf_counter()
                p = br.acquire()
                assert isinstance(p, Permit)
                p.record(Outcome.SUCCESS, 0.001)
                samples.append(time.perf_counter() - t0)
                if i % 50 == 0:
                    await anyio.sleep(0)  # let the writer drain, as a real event loop would
            lines.append(row(f"closed: acquire + record, {label}", samples))
            opened = reg.tool("bench", "open")
            for _ in range(3):
                p = opened.acquire()
                assert isinstance(p, Permit)
                p.record(Outcome.FAILURE, 0.001)
            with anyio.fail_after(30):  # the writer first drains the closed-state reports above
                while not isinstance(opened.acquire(), Rejection):
                    await anyio.sleep(0.01)
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                assert isinstance(opened.acquire(), Rejection)
                samples.append(time.perf_counter() - t0)
            lines.append(row(f"open: rejection, {label}", samples))
        # Uncached: what each decision would cost as one Lua round trip (the READ script, one key).
        mirror = a.shared_breaker("bench/open", policy, random.Random())
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            await a._call("read", [mirror.key], [a.channel, a.ttl_ms, mirror.name, 0])
            samples.append(time.perf_counter() - t0)
        lines.append(row("any decision, Redis uncached (one EVALSHA round trip)", samples))
        samples = []
        for _ in range(min(n, 500)):
            t0 = time.perf_counter()
            a.call_sync("read", [mirror.key], [a.channel, a.ttl_ms, mirror.name, 0])
            samples.append(time.perf_counter() - t0)
        lines.append(row("half-open probe grant (synchronous round trip, once per period per replica)", samples))
        # Propagation: A trips, B polls until refused.
        ra = BreakerRegistry(clock=clock, policy=policy, store=a)
        rb = BreakerRegistry(clock=clock, policy=policy, store=b)
        delays = []
        for i in range(50):
            name = f"prop{i}"
            rb.tool("bench", name).acquire()
            await anyio.sleep(0.01)
            for _ in range(3):
                p = ra.tool("bench", name).acquire()
                assert isinstance(p, Permit)
                p.record(Outcome.FAILURE, 0.001)
            t0 = time.perf_counter()
            while not isinstance(rb.tool("bench", name).acquire(), Rejection):
                await anyio.sleep(0.0002)
            delays.append(time.perf_counter() - t0)
        ms = [d * 1000 for d in delays]
        lines.append("")
        lines.append(
            f"propagation A trip -> B's first rejection (50 runs): p50 {pct(ms, 0.5):.2f} ms, "
            f"p99 {pct(ms, 0.99):.2f} ms, max {max(ms):.2f} ms"
        )
        tg.cancel_scope.cancel()
    for s in (a, b):
        await s.aclose()
    print("\n".join(lines))


# ---- checker: worker ----------------------------------------------------------------------------


class SkewedClock(SystemClock):
    """The system clock, shifted: a replica whose clock is off by `skew` seconds."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def monotonic(self) -> float:
        return super().monotonic() + self.skew

    def time(self) -> float:
        return super().time() + self.skew


async def worker(args: argparse.Namespace) -> None:
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - line-buffered history for the whole run
    health = Path(args.health)
    rng = random.Random(args.seed)
    clock = SkewedClock(args.skew)
    store = RedisStore(StatePolicy(url=args.url, namespace=args.ns, timeout_s=0.05, retry_s=0.1), clock=clock, rng=rng)

    def log(**event: Any) -> None:
        # Real (unskewed) monotonic time: one line for every process on this machine, for ordering only.
        out.write(json.dumps({"t": time.monotonic(), "w": args.index, **event}) + "\n")

    store.on_event = lambda name, kind, epoch: log(ev=kind, epoch=epoch)
    reg = BreakerRegistry(clock=clock, policy=CHECK_POLICY, store=store, rng=rng)
    fail_p = 0.0
    checked = 0.0

    async def caller() -> None:
        nonlocal fail_p, checked
        breaker = reg.tool("up", "work")
        while True:
            if time.monotonic() - checked > 0.05:
                checked = time.monotonic()
                with contextlib.suppress(OSError, ValueError):
                    fail_p = float(health.read_text() or 0)
            t_req = time.monotonic()
            permit = breaker.acquire(lease_s=LEASE_S)
            if isinstance(permit, Rejection):
                await anyio.sleep(rng.uniform(0.005, 0.03))
                continue
            t_got = time.monotonic()
            log(ev="permit", epoch=permit.epoch, probe=permit.is_probe, shared=permit.shared, t_req=t_req)
            await anyio.sleep(rng.uniform(0.01, 0.12))  # the upstream call
            outcome = Outcome.FAILURE if rng.random() < fail_p else Outcome.SUCCESS
            if permit.is_probe:
                log(ev="probe_end", epoch=permit.epoch, shared=permit.shared, start=t_got)
            permit.record(outcome, 0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.run)
        await store.connect()
        for _ in range(6):
            tg.start_soon(caller)


# ---- checker: controller ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run_seed(seed: int, duration: float, workers: int) -> dict[str, Any]:
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="bw-check-"))
    redis_server = Redis(free_port())
    redis_server.start()
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    health = tmp / "health"
    health.write_text("0")
    ns = f"bwcheck-{seed}"
    procs = []
    for i in range(workers):
        skew = rng.uniform(-60, 60)
        cmd = [sys.executable, __file__, "worker", "--url", url, "--ns", ns, "--index", str(i), "--skew", str(skew)]
        cmd += ["--health", str(health), "--out", str(tmp / f"w{i}.jsonl"), "--seed", str(seed * 100 + i)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    actions = {"health": 0, "pause": 0, "redis_restart": 0}
    time.sleep(1.5)  # imports and first connect
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.2, 0.8))
            what = rng.choices(["health", "pause", "redis_restart"], weights=[5, 3, 1])[0]
            actions[what] += 1
            if what == "health":
                health.write_text(str(rng.choice([0.0, 1.0, 1.0, 0.5])))
            elif what == "pause":
                victim = rng.choice(procs)
                victim.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.2, 1.5))  # often longer than the probe lease
                victim.send_signal(signal.SIGCONT)
            else:
                redis_server.kill()
                time.sleep(rng.uniform(0.1, 0.8))
                redis_server.start()
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        redis_server.kill()
    history = []
    for i in range(workers):
        path = tmp / f"w{i}.jsonl"
        if path.exists():
            history += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    result = check(history)
    result.update(seed=seed, actions=actions)
    return result


def check(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Verify probe exclusivity and epoch monotonicity over a history; returns counts and violations."""
    violations: list[str] = []
    permits = [e for e in history if e["ev"] == "permit"]
    shared_probes = {(e["w"], e["epoch"]): e for e in permits if e["probe"] and e["shared"]}
    ends = {(e["w"], e["epoch"]): e["t"] for e in history if e["ev"] == "probe_end" and e["shared"]}
    probes = []
    for key, p in shared_probes.items():
        probes.append({"w": key[0], "epoch": p["epoch"], "req": p["t_req"], "got": p["t"], "end": ends.get(key, float("inf"))})
    # Unique epochs for shared probe grants.
    epochs = [p["epoch"] for p in probes]
    if len(epochs) != len(set(epochs)):
        violations.append(f"a probe epoch was granted twice: {sorted(e for e in epochs if epochs.count(e) > 1)[:5]}")
    probes.sort(key=lambda p: p["got"])
    tol = 0.02
    for i, p1 in enumerate(probes):
        for p2 in probes[i + 1 :]:
            if p2["got"] > p1["end"]:
                continue
            # Overlap in real time: allowed only once p1's lease had surely expired when p2 was granted.
            if p2["got"] < p1["req"] + LEASE_S - tol:
                violations.append(f"probes overlap within a lease: {p1} and {p2}")
    # Grants ordered in real time carry increasing epochs.
    for i, p1 in enumerate(probes):
        for p2 in probes[i + 1 :]:
            if p1["got"] < p2["req"] and not p1["epoch"] < p2["epoch"]:
                violations.append(f"epoch went backwards: {p1} then {p2}")
    # Each replica's shared epochs never decrease.
    for w in {e["w"] for e in history}:
        last = -1
        for e in sorted((e for e in permits if e["w"] == w and e["shared"]), key=lambda e: e["t"]):
            if e["epoch"] < last:
                violations.append(f"replica {w} used epoch {e['epoch']} after {last}")
            last = max(last, e["epoch"])
    return {
        "decisions": len(permits),
        "shared_probes": len(probes),
        "local_probes": sum(1 for e in permits if e["probe"] and not e["shared"]),
        "degradations": sum(1 for e in history if e["ev"] == "degraded"),
        "stale_reports_fenced": sum(1 for e in history if e["ev"] == "settle_stale"),
        "violations": violations,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    lat = sub.add_parser("latency")
    lat.add_argument("--url", default=os.environ.get("BREAKWATER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    lat.add_argument("-n", type=int, default=5000)
    chk = sub.add_parser("check")
    chk.add_argument("--seeds", type=int, default=3)
    chk.add_argument("--first-seed", type=int, default=1)
    chk.add_argument("--duration", type=float, default=6.0)
    chk.add_argument("--workers", type=int, default=3)
    chk.add_argument("--big", action="store_true", help="20 seeds x 20 s")
    chk.add_argument("--json", action="store_true")
    wk = sub.add_parser("worker")
    for flag in ("--url", "--ns", "--health", "--out"):
        wk.add_argument(flag, required=True)
    wk.add_argument("--index", type=int, default=0)
    wk.add_argument("--skew", type=float, default=0.0)
    wk.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.mode == "worker":
        anyio.run(worker, args)
        return 0
    if args.mode == "check":
        seeds, duration = (20, 20.0) if args.big else (args.seeds, args.duration)
        results = [run_seed(s, duration, args.workers) for s in range(args.first_seed, args.first_seed + seeds)]
        total = sum(len(r["violations"]) for r in results)
        if args.json:
            print(json.dumps(results))
        else:
            for r in results:
                print(
                    f"seed {r['seed']}: {r['decisions']} decisions, {r['shared_probes']} shared probes, "
                    f"{r['local_probes']} local (degraded) probes, {r['degradations']} degradations, "
                    f"{r['stale_reports_fenced']} stale reports fenced, actions {r['actions']}, "
                    f"{len(r['violations'])} violations"
                )
                for v in r["violations"][:5]:
                    print("   ", v)
            print(f"total violations: {total}")
        return 1 if total else 0
    args.url = getattr(args, "url", "redis://127.0.0.1:6379/0")
    args.n = getattr(args, "n", 5000)
    anyio.run(latency, args.url, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
