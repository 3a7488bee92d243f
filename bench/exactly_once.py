"""Exactly once under chaos: mutating calls through the gateway while the network and the server misbehave.

The setup, all real processes on 127.0.0.1:

    this script (N concurrent MCP callers) --stdio--> `breakwater serve` (the gateway)
        --streamable HTTP--> chaos proxy (in this script) --> examples/orders_server.py --http

Every call is `place_order` (a charge and an order: two side effects). Faults:

* cut before the side effect: the proxy drops a connection carrying a `place_order` request
  before forwarding it (the server never sees it);
* cut after the side effect: the proxy drops the connection carrying a receipt back (the order
  exists, the answer is lost);
* delay past the timeout: the proxy holds a receipt longer than the gateway's per-attempt timeout;
* kill and restart: the order server is SIGKILLed at random moments (usually mid-call, since
  calls are always in flight) and restarted on the same port; its record of the killed call stays
  `executing` until its lease lapses, then reads `unknown`.

Side effects are counted in the server's own order book (`orders.jsonl`, one line per execution of
`place_order`, labelled with the operation id it ran under). A **duplicate** is a second (third, …)
execution of one operation id. A call the gateway gave up on (OUTCOME_UNKNOWN, TIMEOUT after its
window) whose order nevertheless exists is not a duplicate: it happened once; the caller was told
the truth, that it could not confirm it. Runs:

* `on`: `@idempotent` with the SQLite store, and (if reachable) the PostgreSQL store;
* `off`: the same server with `--no-idempotency` (operation ids ignored, every call runs), under the
  same gateway and the same faults, to show what the retries would cost without the server's half.

    python bench/exactly_once.py                       # 10,000 calls per run
    python bench/exactly_once.py --calls 300 --json    # what tests/test_exactly_once.py runs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from breakwater.gate._envelope import envelope_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "orders_server.py"
PG_CANDIDATES = [
    os.environ.get("BREAKWATER_TEST_POSTGRES", ""),
    "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3",
    "host=127.0.0.1 port=5432 dbname=test user=root connect_timeout=3",
]
ITEMS = ("espresso", "croissant", "beans-1kg")
# Refusals that prove nothing was sent (with attempt 0): a caller may simply call again.
NOT_SENT = frozenset({"SERVER_CONNECTING", "SERVER_UNAVAILABLE", "OVERLOADED", "CIRCUIT_OPEN", "SERVER_CIRCUIT_OPEN"})
RESUBMIT_FOR_S = 30.0


@dataclass
class Faults:
    """Probabilities per eligible chunk of traffic, and the chaos clock."""

    cut_before: float = 0.04
    cut_after: float = 0.04
    delay: float = 0.04
    delay_s: float = 1.5
    kill_every_s: float = 4.0
    restart_after_s: float = 0.3


@dataclass
class Tally:
    """What the proxy and the supervisor did."""

    cut_before: int = 0
    cut_after: int = 0
    delayed: int = 0
    kills: int = 0


# ---------------------------------------------------------------------------------- chaos proxy


class ChaosProxy:
    """A TCP proxy that cuts and delays `place_order` traffic at random."""

    def __init__(self, target_port: int, faults: Faults, rng: random.Random, tally: Tally) -> None:
        self.target_port = target_port
        self.faults = faults
        self.rng = rng
        self.tally = tally
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _abort(client_w)
            return
        done = asyncio.Event()

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while not done.is_set():
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    if upstream and b"place_order" in chunk and self.rng.random() < self.faults.cut_before:
                        self.tally.cut_before += 1
                        break
                    if not upstream and b"order_id" in chunk:
                        draw = self.rng.random()
                        if draw < self.faults.cut_after:
                            self.tally.cut_after += 1
                            break
                        if draw < self.faults.cut_after + self.faults.delay:
                            self.tally.delayed += 1
                            await asyncio.sleep(self.faults.delay_s)
                    writer.write(chunk)
                    await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                # Either side ending ends both: a cut is a reset, not a polite half-close.
                done.set()
                _abort(client_w)
                _abort(server_w)

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pump(client_r, server_w, True), pump(server_r, client_w, False))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


# ---------------------------------------------------------------------------------- the order server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OrderServer:
    """examples/orders_server.py over HTTP on a fixed port, killed and restarted on demand."""

    def __init__(self, data: Path, store_args: list[str], *, idempotency: bool, lease_s: float) -> None:
        self.port = free_port()
        self.data = data
        self.args = [
            sys.executable,
            str(EXAMPLE),
            "--http",
            "--port",
            str(self.port),
            "--data",
            str(data),
            "--lease-s",
            str(lease_s),
            "--payment-delay-s",
            "0.05",
            # place_order is short: let a cancelled call finish and record its receipt, so a lost answer
            # reconciles to the real result (a killed one still reads `unknown`).
            "--finish-on-cancel",
            *store_args,
        ]
        if not idempotency:
            self.args.append("--no-idempotency")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = (data / "server.log").open("ab")

    async def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=self.log)
        with anyio.fail_after(30):
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the order server exited ({self.proc.returncode}); see {self.data / 'server.log'}")
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        return
                except OSError:
                    await anyio.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


async def chaos_killer(server: OrderServer, faults: Faults, rng: random.Random, tally: Tally) -> None:
    if faults.kill_every_s <= 0:
        return
    while True:
        await anyio.sleep(rng.uniform(0.5, 1.5) * faults.kill_every_s)
        server.kill()
        tally.kills += 1
        await anyio.sleep(faults.restart_after_s)
        await server.start()


# ---------------------------------------------------------------------------------- the gateway


def gateway_config(path: Path, proxy_port: int, timeout_s: float) -> None:
    """A gateway tuned for the run: the order server behind the proxy, breakers out of the way.

    Breakers and the retry budget protect a server from load; here every failure is injected on
    purpose, and the question is what retries do to side effects, so they must not stop retries.
    """
    path.write_text(
        f"""
[servers.orders]
url = "http://127.0.0.1:{proxy_port}/mcp"

[servers.orders.connect]
startup_jitter_s = 0
backoff_base_s = 0.05
backoff_cap_s = 0.5
budget_s = 3600
attempt_timeout_s = 10
health_interval_s = 1

[servers.orders.call]
timeout_s = {timeout_s}
max_s = 20
max_in_flight = 256

[servers.orders.retry]
max_attempts = 6
backoff_base_s = 0.05
backoff_cap_s = 0.5
budget_ratio = 1.0
budget_max_tokens = 100000

[servers.orders.breaker]
consecutive_failures = 1000000000
minimum_calls = 1000000000
"""
    )


@dataclass
class Run:
    """One run's calls and what they answered."""

    mode: str
    calls: int
    results: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    resubmitted: int = 0
    tally: Tally = field(default_factory=Tally)


async def run_mode(
    mode: str, store_args: list[str], *, calls: int, workers: int, faults: Faults, seed: int, timeout_s: float, tmp: Path
) -> dict[str, Any]:
    idempotency = mode != "off"
    data = tmp / mode
    data.mkdir(parents=True)
    rng = random.Random(seed)
    run = Run(mode=mode, calls=calls)
    server = OrderServer(data, store_args, idempotency=idempotency, lease_s=2.0)
    await server.start()
    proxy = ChaosProxy(server.port, faults, rng, run.tally)
    await proxy.start()
    config = data / "breakwater.toml"
    gateway_config(config, proxy.port, timeout_s)
    env = {
        **os.environ,
        "BREAKWATER_CATALOG_DIR": str(data / "catalog"),
        "BREAKWATER_ADMISSION_DIR": str(data / "admission"),
        # What breakwater learns of its servers' protocol revisions stays in this run, not the user's cache.
        "BREAKWATER_PROTOCOL_MEMORY_DIR": str(data / "protocols"),
        # So do its calls: the journal is on, as a user runs it, but not the user's own (nor its learned timeouts).
        "BREAKWATER_JOURNAL": str(data / "journal.sqlite3"),
        # The attached session's shared gateway starts here, not in the user's runtime dir, and exits soon after
        # the run (it would outlive it by share_idle_s, 5 min, its directory already gone).
        "BREAKWATER_SHARE_DIR": str(data / "share"),
        "BREAKWATER_SHARE_IDLE_S": "2",
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env, cwd=str(data)
    )
    try:
        async with Client(params) as client:
            name = await _wait_for_tool(client)
            started = time.monotonic()
            queue = list(range(calls))
            async with anyio.create_task_group() as tg:
                tg.start_soon(chaos_killer, server, faults, rng, run.tally)

                async def worker() -> None:
                    while queue:
                        i = queue.pop()
                        args = {"customer": f"c{i}", "item": ITEMS[i % len(ITEMS)], "quantity": 1 + i % 3}
                        give_up = time.monotonic() + RESUBMIT_FOR_S
                        while True:
                            result = await client.call_tool(name, args)
                            body = envelope_of(result) or result.structured_content or {}
                            if not (result.is_error and body.get("attempt") == 0 and body.get("code") in NOT_SENT):
                                break
                            if time.monotonic() > give_up:
                                break
                            # Refused before anything was sent (the server is reconnecting): what an
                            # agent does, call again, as a new logical call.
                            run.resubmitted += 1
                            await anyio.sleep(min(float(body.get("retry_after_s") or 0.2), 1.0))
                        if result.is_error:
                            run.results.append(
                                {
                                    "ok": False,
                                    "code": body.get("code"),
                                    "operation_id": body.get("operation_id"),
                                    "why": f"attempt {body.get('attempt')}, {body.get('retry_stopped') or body.get('reason')}",
                                }
                            )
                        else:
                            run.results.append({"ok": True, "order_id": body.get("order_id")})

                async with anyio.create_task_group() as workers_tg:
                    for _ in range(workers):
                        workers_tg.start_soon(worker)
                tg.cancel_scope.cancel()
            run.elapsed_s = time.monotonic() - started
    finally:
        await proxy.close()
        server.stop()
    return analyse(run, data / "orders.jsonl")


async def _wait_for_tool(client: Client) -> str:
    with anyio.fail_after(60):
        while True:
            listed = await client.list_tools()
            for tool in listed.tools:
                if tool.name.endswith("place_order"):
                    return tool.name
            await anyio.sleep(0.2)


def analyse(run: Run, book: Path) -> dict[str, Any]:
    """Side effects per operation id against what the callers were told."""
    orders = [json.loads(line) for line in book.read_text().splitlines() if line.strip()] if book.exists() else []
    per_op = Counter(o["operation_id"] for o in orders)
    order_ids = {o["order_id"] for o in orders}
    ok = [r for r in run.results if r["ok"]]
    failed = [r for r in run.results if not r["ok"]]
    codes = Counter(r["code"] for r in failed)
    return {
        "mode": run.mode,
        "calls": run.calls,
        "answered": len(run.results),
        "ok": len(ok),
        "errors": dict(sorted(codes.items())),
        "error_reasons": dict(Counter(f"{r['code']}: {r['why']}" for r in failed).most_common(8)),
        "resubmitted_not_sent": run.resubmitted,
        "executions": len(orders),
        "operation_ids_with_effect": len(per_op),
        "duplicates": sum(n - 1 for n in per_op.values() if n > 1),
        "operation_ids_duplicated": sum(1 for n in per_op.values() if n > 1),
        "unlabelled_executions": per_op.get(None, 0),
        # A success must name an order that really exists (a replayed receipt is the first one).
        "ok_without_order": sum(1 for r in ok if r["order_id"] not in order_ids),
        "ok_distinct_orders": len({r["order_id"] for r in ok}),
        # Given up on, yet it happened (once): honest, not a duplicate.
        "errors_with_effect": sum(1 for r in failed if r["operation_id"] in per_op),
        "faults": vars(run.tally),
        "elapsed_s": round(run.elapsed_s, 1),
        "calls_per_s": round(run.calls / run.elapsed_s, 1) if run.elapsed_s else None,
    }


# ---------------------------------------------------------------------------------- PostgreSQL


def postgres() -> tuple[str | None, str]:
    """A reachable conninfo, or None and why not."""
    errors = []
    try:
        import psycopg
    except ImportError as exc:
        return None, f"psycopg is not installed ({exc})"
    for conninfo in filter(None, PG_CANDIDATES):
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return conninfo, ""
        except Exception as exc:
            errors.append(f"{conninfo!r}: {exc}")
    return None, "PostgreSQL on 127.0.0.1:5432 (database 'test') is unreachable: " + "; ".join(errors)


def drop_schema(conninfo: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ---------------------------------------------------------------------------------- main


def line(r: dict[str, Any]) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "none"
    f = r["faults"]
    return (
        f"{r['mode']:>8}: {r['calls']} calls in {r['elapsed_s']} s | ok {r['ok']}, errors: {errors} | "
        f"executions {r['executions']} over {r['operation_ids_with_effect']} operation ids, "
        f"DUPLICATES {r['duplicates']} | ok without an order {r['ok_without_order']}, "
        f"given up but happened once {r['errors_with_effect']} | faults: cut before {f['cut_before']}, "
        f"cut after {f['cut_after']}, delayed {f['delayed']}, kills {f['kills']}"
    )


async def amain(ns: argparse.Namespace) -> int:
    faults = Faults(
        cut_before=ns.cut_before,
        cut_after=ns.cut_after,
        delay=ns.delay,
        delay_s=ns.delay_s,
        kill_every_s=ns.kill_every,
    )
    stores = ns.store.split(",")
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bw-exactly-once-") as tmp_name:
        tmp = Path(tmp_name)
        kw: dict[str, Any] = {"workers": ns.workers, "faults": faults, "timeout_s": ns.timeout, "tmp": tmp}
        for i, store in enumerate(stores):
            if store == "sqlite":
                results.append(
                    await run_mode("sqlite", ["--db", str(tmp / "ops.sqlite3")], calls=ns.calls, seed=ns.seed + i, **kw)
                )
            elif store == "postgres":
                conninfo, why = postgres()
                if conninfo is None:
                    skipped["postgres"] = why
                    continue
                schema = f"bw_bench_{uuid.uuid4().hex[:10]}"
                try:
                    args = ["--postgres", conninfo, "--pg-schema", schema]
                    results.append(await run_mode("postgres", args, calls=ns.calls, seed=ns.seed + i, **kw))
                finally:
                    drop_schema(conninfo, schema)
            else:
                raise SystemExit(f"unknown store {store!r} (sqlite, postgres)")
        if ns.off_calls:
            args = ["--db", str(tmp / "ops-off.sqlite3")]
            results.append(await run_mode("off", args, calls=ns.off_calls, seed=ns.seed + 99, **kw))
    for r in results:
        print(line(r))
    for store, why in skipped.items():
        print(f"{store:>8}: SKIPPED — {why}")
    if ns.json:
        print(json.dumps({"runs": results, "skipped": skipped}))
    return 1 if any(r["duplicates"] for r in results if r["mode"] != "off") else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=10_000, help="calls per store with idempotency on")
    p.add_argument("--off-calls", type=int, default=None, help="calls with idempotency off (default: --calls; 0 skips)")
    p.add_argument("--store", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    p.add_argument("--workers", type=int, default=16, help="concurrent callers")
    p.add_argument("--timeout", type=float, default=1.0, help="the gateway's per-attempt timeout (s)")
    p.add_argument("--cut-before", type=float, default=Faults.cut_before)
    p.add_argument("--cut-after", type=float, default=Faults.cut_after)
    p.add_argument("--delay", type=float, default=Faults.delay)
    p.add_argument("--delay-s", type=float, default=Faults.delay_s, help="how long a delayed receipt is held")
    p.add_argument("--kill-every", type=float, default=Faults.kill_every_s, help="mean seconds between kills (0: none)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ns = p.parse_args()
    if ns.off_calls is None:
        ns.off_calls = ns.calls
    sys.exit(anyio.run(amain, ns))


if __name__ == "__main__":
    main()
