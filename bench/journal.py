"""The call journal: what recording costs a call, what the writers sustain, how fast `stats`
answers, and how often a learned timeout cuts a call that would have answered.

* `record()` cost: a pre-built `AttemptRecord` queued while the SQLite writer runs; building the
  record plus queueing it (what the gate pays per attempt); and the drop path (writer stalled,
  queue full);
* writer throughput: rows per second through `Journal` into SQLite and PostgreSQL (batches of 512);
* `stats` over N rows spread over 20 tools (SQLite and PostgreSQL), both ways in the same run: the
  raw scan (exact percentiles: `stats --exact`, and every `stats` before the rollups) and the
  per-minute rollups (the default), with the worst relative percentile error between them;
* learned timeouts: a closed loop per latency distribution (the testserver's own `Latency`, seeded):
  each call waits at most the timeout in force (learned, else 5 s); a longer call is recorded as a
  timeout at that time; the journal refreshes every 100 calls. Reported: the learned timeout, the
  false-timeout rate over the calls it decided, and the analytical tail probability at that timeout.

    python bench/journal.py                     # 200k rows for stats, 20k calls per distribution
    python bench/journal.py --rows 1000000      # the issue's 1M-row stats target
    python bench/journal.py --no-postgres

* gateway call latency, journal on vs off: two `breakwater serve` (stdio) gateways in front of one
  trivial testserver tool (`echo`, latency 0), one with `BREAKWATER_JOURNAL=off`, called in
  interleaved batches; p50/p95 of each and the p50 difference.

PostgreSQL: 127.0.0.1:5432, database `test` (or `$BREAKWATER_TEST_POSTGRES`), in a scratch schema
dropped afterwards. `--only stats --only gateway` runs parts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from breakwater.config import JournalPolicy
from breakwater.journal import (
    AttemptRecord,
    Journal,
    JournalStore,
    PostgresJournalStore,
    SQLiteJournalStore,
    new_call_id,
)
from breakwater.testing import FakeClock
from breakwater.testing.server import Latency, launch_command

PG = os.environ.get("BREAKWATER_TEST_POSTGRES") or "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3"
DISTRIBUTIONS = ("lognormal(0.2,0.5)", "lognormal(0.05,1.0)", "uniform(0.1,0.3)", "lognormal(2,0.3)")


def make(clock_time: float, i: int, duration: float, tool: str = "t", outcome: str = "completed") -> AttemptRecord:
    return AttemptRecord(
        server="s",
        tool=tool,
        call_id=new_call_id(),
        attempt=1,
        started_at=clock_time,
        duration_s=duration,
        outcome=outcome,
        server_breaker="closed",
        tool_breaker="closed",
    )


def record_cost(tmp: Path, n: int) -> dict[str, float]:
    """Mean and p99 ns of record() in three situations."""
    out: dict[str, float] = {}
    journal = Journal(SQLiteJournalStore(tmp / "cost.sqlite3"), policy=JournalPolicy(queue_size=n + 1))
    journal.start()
    now = time.time()
    records = [make(now, i, 0.01) for i in range(n)]
    costs = []
    for r in records:
        t0 = time.perf_counter_ns()
        journal.record(r)
        costs.append(time.perf_counter_ns() - t0)
    out["record_mean_ns"], out["record_p99_ns"] = statistics.fmean(costs), _q(costs, 0.99)
    costs = []
    for _i in range(n // 10):
        t0 = time.perf_counter_ns()
        journal.record(
            AttemptRecord(
                server="s",
                tool="t",
                call_id=new_call_id(),
                attempt=1,
                started_at=time.time(),
                duration_s=0.01,
                outcome="completed",
                retries=0,
                server_breaker="closed",
                tool_breaker="closed",
            )
        )
        costs.append(time.perf_counter_ns() - t0)
    out["build_and_record_mean_ns"], out["build_and_record_p99_ns"] = statistics.fmean(costs), _q(costs, 0.99)
    journal.close(30)

    class Stalled(SQLiteJournalStore):
        gate = threading.Event()

        def insert(self, records: Any) -> None:
            self.gate.wait(30)

    stalled = Stalled(tmp / "stalled.sqlite3")
    journal = Journal(stalled, policy=JournalPolicy(queue_size=1000, flush_interval_s=0.01))
    journal.start()
    journal.record(records[0])
    time.sleep(0.1)
    for r in records[1:1001]:
        journal.record(r)
    costs = []
    for r in records:
        t0 = time.perf_counter_ns()
        journal.record(r)
        costs.append(time.perf_counter_ns() - t0)
    out["dropped_mean_ns"], out["dropped_p99_ns"] = statistics.fmean(costs), _q(costs, 0.99)
    out["dropped"] = journal.dropped
    Stalled.gate.set()
    journal.close(10)
    return out


def _q(values: list[int] | list[float], q: float) -> float:
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def throughput(store: JournalStore, n: int) -> float:
    """Rows per second written through the journal (queue → batches → store)."""
    journal = Journal(store, policy=JournalPolicy(queue_size=n + 1, learn_timeouts=False))
    journal.flush()  # open and migrate outside the timing
    now = time.time()
    records = [make(now, i, 0.01 + (i % 1000) / 1000, tool=f"t{i % 20}") for i in range(n)]
    for r in records:
        journal.record(r)
    t0 = time.perf_counter()
    journal.flush()
    elapsed = time.perf_counter() - t0
    assert journal.written == n, journal.counters()
    journal.close()
    return n / elapsed


def stats_time(store: JournalStore, rows: int, repeats: int = 3) -> dict[str, Any]:
    """Fill `rows` attempts (20 tools, within the last hour), then time `stats` over the last hour both
    ways, alternately: from the raw rows (the exact scan, what `stats` did before rollups) and from
    the per-minute rollups. Also how far the rollup percentiles are from the exact ones."""
    # Learning on (the default): the timed refresh below reads the same hour through the rollups.
    journal = Journal(store, policy=JournalPolicy(queue_size=rows + 1))
    rng = random.Random(5)
    now = time.time()
    # In time order, as a gateway writes them: rowids follow started_at.
    for i, at in enumerate(sorted(now - rng.uniform(0, 3000) for _ in range(rows))):
        outcome = "timeout" if i % 97 == 0 else "completed"
        journal.record(make(at, i, rng.lognormvariate(math.log(0.05), 0.8), f"t{i % 20}", outcome))
    t0 = time.perf_counter()
    journal.flush()
    fill = time.perf_counter() - t0
    raw_times, rollup_times = [], []
    exact: list[Any] = []
    rolled: list[Any] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        exact = journal.stats(3600, exact=True)
        raw_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rolled = journal.stats(3600)
        rollup_times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    journal.refresh_learned()
    learn = time.perf_counter() - t0
    journal.close()
    assert [(s.tool, s.calls, s.timeouts) for s in rolled] == [(s.tool, s.calls, s.timeouts) for s in exact]
    worst = max(
        abs(getattr(r, p) / getattr(e, p) - 1) for r, e in zip(rolled, exact, strict=True) for p in ("p50_s", "p95_s", "p99_s")
    )
    return {
        "calls": sum(s.calls for s in rolled),
        "fill_s": fill,
        "raw_s": statistics.median(raw_times),
        "rollup_s": statistics.median(rollup_times),
        "learn_s": learn,
        "worst_pct_error": worst,
    }


def tail(latency: Latency, x: float) -> float:
    """P(X > x) for the testserver's distribution."""
    if latency.kind == "lognormal":
        return 0.5 * math.erfc((math.log(x) - math.log(latency.a)) / (latency.b * math.sqrt(2)))
    if latency.kind == "uniform":
        return min(1.0, max(0.0, (latency.b - x) / (latency.b - latency.a)))
    return 1.0 if latency.a > x else 0.0


def learned_loop(tmp: Path, spec: str, calls: int, policy: JournalPolicy) -> dict[str, Any]:
    latency, rng, clock = Latency.parse(spec), random.Random(2026), FakeClock()
    journal = Journal(SQLiteJournalStore(tmp / f"learn-{uuid.uuid4().hex[:6]}.sqlite3"), clock=clock, policy=policy)
    false = judged = 0
    for i in range(calls):
        learned = journal.learned_timeout("s", "t")
        timeout = learned if learned is not None else 5.0
        d = latency.draw(rng)
        journal.record(make(clock.time(), i, min(d, timeout), outcome="timeout" if d > timeout else "completed"))
        if learned is not None:
            judged += 1
            false += d > timeout
        clock.advance(1.0)
        if i % 100 == 99:
            journal.flush()
    journal.flush()
    # None when the run was shorter than the policy's minimum samples (a quick look with a small --calls).
    final = journal.learned_timeout("s", "t")
    journal.close()
    return {
        "spec": spec,
        "learned": final,
        "false": false,
        "judged": judged,
        "tail": None if final is None else tail(latency, final),
    }


async def _gateway_calls(tmp: Path, rounds: int, batch: int) -> dict[str, Any]:
    """`breakwater serve` (stdio) twice in front of one trivial tool, journal on and off, called in
    interleaved batches (side order shuffled each round) so drift on a shared machine hits both alike."""
    upstream = launch_command("--tool", "echo:latency=0")
    config = tmp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"bench": {"command": upstream[0], "args": upstream[1:]}}}))
    db = tmp / "gateway-journal.sqlite3"
    base = dict(
        os.environ,
        BREAKWATER_CATALOG_DIR=str(tmp / "catalog"),
        BREAKWATER_ADMISSION_DIR=str(tmp / "admission"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        # What breakwater learns of the upstream's protocol revision stays in this run, not the user's cache.
        BREAKWATER_PROTOCOL_MEMORY_DIR=str(tmp / "protocols"),
    )
    sides = {"journal off": dict(base, BREAKWATER_JOURNAL="off"), "journal on": dict(base, BREAKWATER_JOURNAL=str(db))}
    times: dict[str, list[float]] = {name: [] for name in sides}
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for name, env in sides.items():
            params = StdioServerParameters(
                # --no-share: each side is one gateway that holds its journal and flushes it when its session ends
                # (an attached session would relay to a shared gateway that outlives the run, its rows unflushed).
                command=sys.executable,
                args=["-m", "breakwater", "serve", "--no-share", "--config", str(config)],
                env=env,
            )
            clients[name] = await stack.enter_async_context(Client(params, mode="legacy", read_timeout_seconds=30))
        for client in clients.values():
            with anyio.fail_after(60):
                while "bench__echo" not in [t.name for t in (await client.list_tools()).tools]:
                    await anyio.sleep(0.1)
            for _ in range(200):  # warm-up: imports, caches, the upstream's first calls
                await client.call_tool("bench__echo", {"payload": "x"})
        order = list(sides)
        rng = random.Random(3)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                client = clients[name]
                for _ in range(batch):
                    t0 = time.perf_counter()
                    result = await client.call_tool("bench__echo", {"payload": "x"})
                    times[name].append(time.perf_counter() - t0)
                    assert not result.is_error, result
    # The journal did record them (the gateway flushed it on exit): what was measured is real work.
    reader = Journal(SQLiteJournalStore(db))
    written = sum(s.calls for s in reader.stats(3600))
    reader.store.close()
    return {"times": times, "written": written}


def gateway_latency(tmp: Path, rounds: int, batch: int) -> None:
    result = anyio.run(_gateway_calls, tmp, rounds, batch)
    times = result["times"]
    p50 = {name: statistics.median(v) for name, v in times.items()}
    p95 = {name: _q(v, 0.95) for name, v in times.items()}
    off, on = p50["journal off"], p50["journal on"]
    print(f"gateway call latency through `breakwater serve` (stdio), {rounds} rounds x {batch} calls per side, interleaved:")
    for name in times:
        print(f"  {name:<12} p50 {p50[name] * 1e6:7.0f} us   p95 {p95[name] * 1e6:7.0f} us   ({len(times[name])} calls)")
    print(f"  p50 difference, on vs off: {(on - off) * 1e6:+.0f} us = {on / off - 1:+.2%} (target <= +2 %)")
    print(f"  journal rows written by the 'on' gateway: {result['written']} calls")


def stats_part(tmp: Path, args: argparse.Namespace) -> None:
    import psycopg

    schemas: list[str] = []

    def pg_store() -> JournalStore:
        schemas.append(f"bw_bench_{uuid.uuid4().hex[:8]}")
        return PostgresJournalStore(PG, schema=schemas[-1])

    kinds: list[tuple[str, Any]] = [("SQLite", lambda: SQLiteJournalStore(tmp / f"{uuid.uuid4().hex[:6]}.sqlite3"))]
    if not args.no_postgres:
        kinds.append(("PostgreSQL", pg_store))
    try:
        for name, factory in kinds:
            rate = throughput(factory(), args.writes)
            st = stats_time(factory(), args.rows)
            print(
                f"{name}: writer {rate:,.0f} rows/s (rollups included); stats over {st['calls']:,} rows "
                f"(20 tools, 1 h, median of 3): raw scan {st['raw_s']:.3f} s, rollups {st['rollup_s']:.3f} s "
                f"({st['raw_s'] / st['rollup_s']:.1f}x faster); worst rollup percentile error "
                f"{st['worst_pct_error']:.2%}; learned-timeout refresh {st['learn_s']:.3f} s"
            )
    finally:
        if schemas:
            with psycopg.connect(PG, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows for the stats timing (default 200k)")
    parser.add_argument("--writes", type=int, default=100_000, help="rows for the writer throughput (default 100k)")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per distribution in the learning loop")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--rounds", type=int, default=20, help="gateway on/off: interleaved rounds (default 20)")
    parser.add_argument("--batch", type=int, default=100, help="gateway on/off: calls per side per round (default 100)")
    parser.add_argument(
        "--only", choices=("record", "stats", "learn", "gateway"), action="append", help="run only these parts (repeatable)"
    )
    args = parser.parse_args(argv)
    parts = set(args.only or ("record", "stats", "learn", "gateway"))
    with tempfile.TemporaryDirectory(prefix="bw-journal-bench-") as d:
        tmp = Path(d)
        if "record" in parts:
            cost = record_cost(tmp, 100_000)
            print("record() cost, ns (mean / p99):")
            for label, key in (
                ("pre-built record, writer running", "record"),
                ("build + record (the gate's cost)", "build_and_record"),
                ("queue full, writer stalled (drop)", "dropped"),
            ):
                print(f"  {label:<36} {cost[key + '_mean_ns']:.0f} / {cost[key + '_p99_ns']:.0f}")
        if "stats" in parts:
            stats_part(tmp, args)
        if "learn" in parts:
            policy = JournalPolicy(learn_floor_s=0.01, learn_refresh_s=100)
            defaults = JournalPolicy()
            print(
                f"learned timeouts: p{defaults.learn_quantile * 100:g} x {defaults.learn_headroom:g}, window "
                f"{defaults.learn_window_s:g} s, {args.calls} calls at 1/s (floor lowered to 10 ms to expose the estimate)"
            )
            print("  distribution          learned   false timeouts        analytical P(X > learned)")
            for spec in DISTRIBUTIONS:
                r = learned_loop(tmp, spec, args.calls, policy)
                if r["learned"] is None or not r["judged"]:
                    # The journal refreshes every 100 calls: a shorter run decides no call with a learned timeout.
                    print(f"  {spec:<21} no call decided by a learned timeout in {args.calls} calls")
                    continue
                rate = r["false"] / r["judged"]
                print(f"  {spec:<21} {r['learned']:7.3f} s  {r['false']:>3}/{r['judged']} = {rate:.4%}   {r['tail']:.2e}")
        if "gateway" in parts:
            gateway_latency(tmp, args.rounds, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
