"""Connect storm: S agent sessions x M servers connecting at the same instant.

Every session is its own process (14 agent sessions with their own configs are 14 processes), all
released at one instant. The M servers are `breakwater testserver` processes on 127.0.0.1 that
share one congestion model: each handshake needs W seconds of service and C "cores" are shared by
every handshake in flight on the machine (processor sharing), so latency grows with the number of
handshakes in flight, as it does when 238 connects land on one host.

Two clients, in the same run:

* naive: every connect at t=0, 30 s attempt timeout, fixed retries at 0.5 / 1.5 / 4 s, no jitter
  (what several agents' built-in clients do);
* breakwater: `Breakwater(config)` with its defaults (jitter, admission caps shared across the
  session processes through lock files, per-attempt timeout, full-jitter backoff inside a budget);
* attached: each session is a real stdio `breakwater serve` driven by the SDK's client, with
  sharing on (the default): the sessions attach to one shared local gateway, started by whichever
  came first; a session is ready when its `tools/list` has every server's tools. The drivers are
  like agents that are already running when they launch their MCP server: each has imported the
  SDK before the clock starts, and launches `breakwater serve` at t=0. Each repeat also measures,
  against fresh servers, the floor for the attached sessions: ONE process that has imported
  everything before t=0 connecting to the M servers once (breakwater's defaults), i.e. the
  handshakes alone, without any process start-up.

Printed for each: share connected, time until all ready (p50/p99 over repeats), attempts per
connect, upstream handshakes (counted by the servers), peak handshakes in flight, and the capacity
bound S*M*W/C. W is the mean work: the servers draw each handshake's work (seeded, lognormal), so
for the attached sessions each repeat also prints the ideal makespan of the works this run's
servers actually drew (every connect at t=0 under processor sharing, no start-up at all) and the
ratios to it, beside the bound M*W/C; the target stays stated against the bound.

    python bench/connect_storm.py                      # 14 x 17, W=1 s, C=4 (2x the 30 s timeout)
    python bench/connect_storm.py --sessions 4 --servers 5 --work 0.2 --repeats 1   # a quick look
    python bench/connect_storm.py --only attached --repeats 3                        # shared gateway
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp import Client

from breakwater import Breakwater

NAIVE_TIMEOUT_S = 30.0
NAIVE_RETRY_DELAYS_S = (0.5, 1.5, 4.0)
SESSION_DEADLINE_S = 300.0


# ---- the session processes ----------------------------------------------------------------


async def naive_session(urls: dict[str, str], t0: float) -> dict[str, Any]:
    results: dict[str, Any] = {}

    async def connect(name: str, url: str) -> None:
        attempts = 0
        for delay in (*NAIVE_RETRY_DELAYS_S, None):
            attempts += 1
            try:
                with anyio.fail_after(NAIVE_TIMEOUT_S):
                    async with Client(url) as client:
                        await client.list_tools()
                        results[name] = {"ok": True, "t": time.time() - t0, "attempts": attempts}
                        return
            except Exception:
                pass
            if delay is None:
                break
            await anyio.sleep(delay)
        results[name] = {"ok": False, "t": None, "attempts": attempts}

    async with anyio.create_task_group() as tg:
        for name, url in urls.items():
            tg.start_soon(connect, name, url)
    return results


async def breakwater_session(config_path: str, t0: float) -> dict[str, Any]:
    ready_at: dict[str, float] = {}
    async with Breakwater.from_config(config_path) as bw:
        with anyio.move_on_after(SESSION_DEADLINE_S):
            while True:
                report = bw.status()
                for s in report.servers:
                    if s.state.value == "ready" and s.name not in ready_at:
                        ready_at[s.name] = time.time() - t0
                if report.all_ready:
                    break
                await bw.wait_changed()
        report = bw.status()
    return {s.name: {"ok": s.name in ready_at, "t": ready_at.get(s.name), "attempts": s.attempts} for s in report.servers}


async def attached_session(config_path: str, t0: float) -> dict[str, Any]:
    """A real `breakwater serve` session (sharing on); each server is ready when its tools are listed.

    The session lists again when the gateway says the list changed (as an agent does), and at the
    latest after a second: polling 14 sessions' lists ten times a second would take the CPU the
    gateway needs to connect.
    """
    from mcp import StdioServerParameters

    names = list(json.loads(Path(config_path).read_text())["mcpServers"])
    ready_at: dict[str, float] = {}
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    # The SDK starts a server with a few safe variables only: pass the run's own (share, catalog and
    # admission directories), as an agent passes the "env" of its MCP config entry.
    env = {k: v for k, v in os.environ.items() if k.startswith("BREAKWATER_")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "breakwater", "serve", "--config", config_path], env=env)
    async with Client(params, mode="legacy", message_handler=on_message) as client:
        with anyio.move_on_after(SESSION_DEADLINE_S):
            while len(ready_at) < len(names):
                changed = anyio.Event()
                listed = {t.name.split("__", 1)[0] for t in (await client.list_tools()).tools}
                for name in names:
                    if name in listed and name not in ready_at:
                        ready_at[name] = time.time() - t0
                if len(ready_at) < len(names):
                    with anyio.move_on_after(1.0):
                        await changed.wait()
    # Attempts are the shared gateway's, not this session's: the servers' handshake count says it.
    return {name: {"ok": name in ready_at, "t": ready_at.get(name), "attempts": 0} for name in names}


_SESSIONS = {"naive": naive_session, "breakwater": breakwater_session, "attached": attached_session}


def session_main(kind: str, config_path: str) -> None:
    urls = {name: entry["url"] for name, entry in json.loads(Path(config_path).read_text())["mcpServers"].items()}
    print("armed", flush=True)
    sys.stdin.readline()  # the orchestrator releases every session at once
    t0 = float(sys.stdin.readline())
    out = anyio.run(naive_session, urls, t0) if kind == "naive" else anyio.run(_SESSIONS[kind], config_path, t0)
    print(json.dumps(out), flush=True)


# ---- the orchestrator ---------------------------------------------------------------------


def start_servers(n: int, congestion_dir: Path, work: float, cores: float, sigma: float, tmp: Path) -> list[Any]:
    servers = []
    quiet = subprocess.DEVNULL
    for i in range(n):
        port_file = tmp / f"port-{i}"
        cmd = [
            sys.executable, "-m", "breakwater", "testserver", "--http", "--port", "0", "--port-file", str(port_file),
            "--name", f"s{i}", "--seed", str(i), "--congestion-dir", str(congestion_dir),
            "--congestion-work", str(work), "--congestion-cores", str(cores), "--congestion-sigma", str(sigma),
            "--state-file", str(tmp / f"state-{i}.json"),
        ]  # fmt: skip
        servers.append((subprocess.Popen(cmd, stdin=quiet, stdout=quiet, stderr=quiet), port_file))
    ports = []
    deadline = time.monotonic() + 60
    for proc, port_file in servers:
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"a testserver failed to start: {proc.args}")
            time.sleep(0.05)
        ports.append(int(port_file.read_text()))
    return [(proc, port) for (proc, _), port in zip(servers, ports, strict=True)]


def run_once(kind: str, args: argparse.Namespace, tmp: Path, *, sessions: int | None = None) -> dict[str, Any]:
    """One storm against freshly started servers (no leftover work from an earlier run)."""
    congestion = tmp / "congestion"
    shutil.rmtree(congestion, ignore_errors=True)
    congestion.mkdir()
    servers = start_servers(args.servers, congestion, args.work, args.cores, args.sigma, tmp)
    try:
        entries = {f"s{i}": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"} for i, (_, port) in enumerate(servers)}
        config = tmp / "mcp.json"
        config.write_text(json.dumps({"mcpServers": entries}))
        admission = tmp / "admission"
        shutil.rmtree(admission, ignore_errors=True)
        share = Path(tempfile.mkdtemp(prefix="bw-share-"))
        env = dict(os.environ, BREAKWATER_ADMISSION_DIR=str(admission), BREAKWATER_SHARE_DIR=str(share), BREAKWATER_SHARE="on")
        env["BREAKWATER_CATALOG_DIR"] = str(tmp / "catalog")  # every run starts cold: no last-known tools
        env["BREAKWATER_PROTOCOL_MEMORY_DIR"] = str(tmp / "protocols")  # ... and no remembered protocol revisions
        shutil.rmtree(tmp / "catalog", ignore_errors=True)
        shutil.rmtree(tmp / "protocols", ignore_errors=True)
        result = storm(kind, args.sessions if sessions is None else sessions, config, congestion, env)
        states = [json.loads(f.read_text()) for f in sorted(tmp.glob("state-*.json"))]
        result["upstream_connects"] = sum(s["handshakes"] for s in states)
        # Each server's first handshake's drawn service: what one connect per server had to be given.
        result["works"] = [s["congestion_works"][0] for s in states if s.get("congestion_works")]
        if kind == "attached":
            stop_gateways(env)
        shutil.rmtree(share, ignore_errors=True)
        return result
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            proc.wait()
        for port_file in [*tmp.glob("port-*"), *tmp.glob("state-*")]:
            port_file.unlink()


def stop_gateways(env: dict[str, str]) -> None:
    """Stop the shared gateway the attached sessions started (it would idle out, but not before the next run)."""
    subprocess.run([sys.executable, "-m", "breakwater", "gateway", "stop"], env=env, capture_output=True, check=False)


def storm(kind: str, sessions: int, config: Path, congestion_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--session", kind, "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(sessions)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "armed"
    t0 = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"go\n{t0}\n")
        p.stdin.flush()
    peak = 0
    while any(p.poll() is None for p in procs):
        peak = max(peak, sum(1 for m in congestion_dir.iterdir() if m.name.endswith(".handshake")))
        time.sleep(0.02)
    results = []
    for p in procs:
        assert p.stdout is not None
        results.append(json.loads(p.stdout.read().strip().splitlines()[-1]))
    connects = [r for session in results for r in session.values()]
    ok = [r for r in connects if r["ok"]]
    all_ready = max(r["t"] for r in ok) if len(ok) == len(connects) else math.inf
    return {
        "connected": len(ok) / len(connects),
        "all_ready_s": all_ready,
        "attempts_per_connect": sum(r["attempts"] for r in connects) / len(connects),
        "peak_in_flight": peak,
    }


def ideal_makespan(works: list[float], cores: float) -> float:
    """When the last of `works` ends if all start at t=0 under the servers' processor sharing, with no start-up.

    Every handshake in flight progresses at min(1, cores/n), so they end in order of work: the
    best a client can do that does not know each server's work in advance (all of them at once).
    """
    elapsed, done, left = 0.0, 0.0, sorted(works)
    for i, work in enumerate(left):
        rate = min(1.0, cores / (len(left) - i))
        elapsed += (work - done) / rate
        done = work
    return elapsed


def clairvoyant_bound(works: list[float], cores: float) -> float:
    """No schedule of `works` on `cores` (each at most rate 1) ends sooner: the largest alone, or all of it on every core."""
    return max(max(works), sum(works) / cores) if works else 0.0


def pct(values: list[float], q: float) -> float:
    if any(math.isinf(v) for v in values):
        finite = sorted(values)
        return finite[min(len(finite) - 1, math.ceil(q * len(finite)) - 1)]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--session", choices=tuple(_SESSIONS), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=14)
    parser.add_argument("--servers", type=int, default=17)
    parser.add_argument("--work", type=float, default=1.0, help="service seconds per handshake (default 1.0)")
    parser.add_argument("--cores", type=float, default=4.0, help="handshakes served at full speed at once (default 4)")
    parser.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma of the work (default 0.5)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=tuple(_SESSIONS), action="append", help="run only this client (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    if args.session:
        session_main(args.session, args.config)
        return

    tmp = Path(tempfile.mkdtemp(prefix="bw-storm-"))
    try:
        bound = args.sessions * args.servers * args.work / args.cores
        print(
            f"connect storm: {args.sessions} sessions x {args.servers} servers = {args.sessions * args.servers} connects, "
            f"W={args.work} s, C={args.cores}, sigma={args.sigma}; capacity bound {bound:.1f} s; {args.repeats} repeats"
        )
        figures: dict[str, Any] = {}
        for kind in _SESSIONS:
            if args.only and kind not in args.only:
                continue
            runs = []
            floors = []
            for _ in range(args.repeats):
                if kind == "attached":  # the floor right before, under the same load
                    floors.append(run_once("breakwater", args, tmp, sessions=1)["all_ready_s"])
                runs.append(run_once(kind, args, tmp))
            times = [r["all_ready_s"] for r in runs]
            figures[kind] = {
                "connected_min": min(r["connected"] for r in runs),
                "all_ready_p50_s": pct(times, 0.5),
                "all_ready_p99_s": pct(times, 0.99),
                "attempts_per_connect": statistics.mean(r["attempts_per_connect"] for r in runs),
                "peak_in_flight": max(r["peak_in_flight"] for r in runs),
                "upstream_connects": statistics.mean(r["upstream_connects"] for r in runs),
                "runs": runs,
            }
            if floors:
                figures[kind]["floor_s"] = floors
        header = ("client", "connected", "all ready p50", "p99", "x bound", "attempts/connect", "upstream", "peak in flight")
        print("{:<11} {:>9} {:>13} {:>8} {:>8} {:>16} {:>9} {:>14}".format(*header))
        for kind, f in figures.items():
            p50, p99 = f["all_ready_p50_s"], f["all_ready_p99_s"]
            shown = [("never" if math.isinf(v) else f"{v:.1f} s") for v in (p50, p99)]
            ratio = "-" if math.isinf(p99) else f"{p99 / bound:.2f}"
            print(
                f"{kind:<11} {f['connected_min'] * 100:>8.1f}% {shown[0]:>13} {shown[1]:>8} {ratio:>8} "
                f"{f['attempts_per_connect']:>16.2f} {f['upstream_connects']:>9.0f} {f['peak_in_flight']:>14}"
            )
        if "attached" in figures:
            one = args.servers * args.work / args.cores  # what the attached sessions need: each server connected once
            attached = figures["attached"]
            p99 = attached["all_ready_p99_s"]
            print(f"attached: bound for one connect per server {one:.1f} s; p99 all ready = {p99 / one:.2f} x that")
            for i, (floor, run) in enumerate(zip(attached["floor_s"], attached["runs"], strict=True)):
                t = run["all_ready_s"]
                ideal, clairvoyant = ideal_makespan(run["works"], args.cores), clairvoyant_bound(run["works"], args.cores)
                run["ideal_s"], run["clairvoyant_s"] = ideal, clairvoyant
                print(
                    f"  repeat {i + 1}: all ready {t:.2f} s ({t / one:.2f} x bound); floor (one warm process, "
                    f"{args.servers} connects) {floor:.2f} s ({floor / one:.2f} x bound); "
                    f"start-up above the floor {t - floor:.2f} s"
                )
                print(
                    f"    this run's draws: {len(run['works'])} works summing to {sum(run['works']):.2f} s, largest "
                    f"{max(run['works'], default=0):.2f} s; ideal makespan (all at t=0, no start-up) {ideal:.2f} s "
                    f"({ideal / one:.2f} x bound); all ready = {t / ideal:.2f} x ideal, floor = {floor / ideal:.2f} x ideal; "
                    f"clairvoyant bound {clairvoyant:.2f} s"
                )
        if args.json:
            print(json.dumps({"bound_s": bound, **figures}, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
