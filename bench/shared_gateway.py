"""Sessions attached to the shared local gateway: how fast a new session is served, what a call costs.

One HTTP testserver upstream. Two stdio `breakwater serve` setups, in the same run:

* attached: sharing on (the default); a first session starts the shared gateway and stays, then
  each measured session is a new `serve` process that attaches to the warm gateway;
* direct: `serve --no-share`, every session its own gateway (last-known tools on disk are warm).

Printed: for a new session, the time from launching the process to the `initialize` answer, to a
`tools/list` with every real tool, and to the first real call answered (median over --launches);
then the round trip of `ping` and of a tool call (`echo`) over one session (median and p99 over
--calls), and the difference attached minus direct: what the relay through the gateway adds.

Then failover: --failover-sessions sessions attached, each with a mutating call in flight
(`order`, 2 s, one ledger line per execution); the gateway is killed (SIGKILL); printed: how
each call in flight was answered, the time until every session's next call is answered by the new
gateway, and how many times the mutating calls ran (never more than once each: none is repeated).

    python bench/shared_gateway.py                       # 5 launches, 2000 calls each, failover of 14 sessions
    python bench/shared_gateway.py --launches 3 --calls 500 --failover-sessions 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}


class Session:
    """One `breakwater serve` process spoken to in raw JSON-RPC lines (no client library in the measurement)."""

    def __init__(self, config: Path, env: dict[str, str], *flags: str) -> None:
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "breakwater", "serve", "--config", str(config), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.ids = 100

    def send(self, message: dict[str, Any]) -> None:
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()

    def answer(self, request_id: int) -> dict[str, Any]:
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None
        while True:
            line = stdout.readline()
            if not line:
                raise SystemExit("the session ended early")
            message: dict[str, Any] = json.loads(line)
            if message.get("id") == request_id:
                return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.ids += 1
        self.send({"jsonrpc": "2.0", "id": self.ids, "method": method, **({"params": params} if params else {})})
        return self.answer(self.ids)

    def start(self, tools: int) -> dict[str, float]:
        """Initialize, list until `tools` real tools are there, call one: seconds since launch for each."""
        self.send(INIT)
        self.answer(1)
        initialized = time.perf_counter() - self.t0
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        while True:
            listed = self.request("tools/list")["result"]["tools"]
            if sum(1 for t in listed if t["name"].startswith("web__")) >= tools:
                break
            time.sleep(0.01)
        listed_at = time.perf_counter() - self.t0
        self.request("tools/call", {"name": "web__echo", "arguments": {"text": "x"}})
        return {"initialize": initialized, "tools_list": listed_at, "first_call": time.perf_counter() - self.t0}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def round_trips(session: Session, method: str, params: dict[str, Any] | None, n: int) -> list[float]:
    for _ in range(50):  # warm up
        session.request(method, params)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        session.request(method, params)
        times.append(time.perf_counter() - t)
    return times


def failover(config: Path, env: dict[str, str], sessions: int, ledger: Path) -> None:
    """Kill the shared gateway under `sessions` sessions with a mutating call in flight in each."""
    from breakwater.testing.server import read_ledger

    attached = [Session(config, env) for _ in range(sessions)]
    for s in attached:
        s.start(8)
    info = gateway_info(env)
    for i, s in enumerate(attached):
        s.ids += 1
        s.send({"jsonrpc": "2.0", "id": s.ids, "method": "tools/call", "params": {"name": "web__order", "arguments": {"n": i}}})
    time.sleep(0.5)  # every order is running upstream
    os.kill(int(info["pid"]), 9)
    killed = time.perf_counter()
    codes: dict[str, int] = {}
    for s in attached:
        answer = s.answer(s.ids)["result"]
        code = (answer.get("structuredContent") or {}).get("code", "ok") if answer.get("isError") else "ok"
        codes[code] = codes.get(code, 0) + 1
    answered = time.perf_counter() - killed
    served = []
    for s in attached:
        s.request("tools/call", {"name": "web__echo", "arguments": {"text": "again"}})
        served.append(time.perf_counter() - killed)
    time.sleep(2.5)  # the orders that were running finish upstream
    runs = len([r for r in read_ledger(ledger) if r["tool"] == "order"])
    print(
        f"failover, {sessions} sessions: calls in flight answered {codes} within {answered:.2f} s of the kill; "
        f"every session served again within {max(served):.2f} s; {runs} executions of {sessions} mutating calls"
    )
    for s in attached:
        s.close()


def gateway_info(env: dict[str, str]) -> dict[str, Any]:
    listed = subprocess.run(
        [sys.executable, "-m", "breakwater", "gateway", "list", "--json"], env=env, capture_output=True, text=True, check=True
    )
    gateways: list[dict[str, Any]] = json.loads(listed.stdout)
    return gateways[0]


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--failover-sessions", type=int, default=14)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bw-shb-"))
    port_file = tmp / "port"
    upstream = subprocess.Popen(
        [
            *(sys.executable, "-m", "breakwater", "testserver", "--http", "--port", "0", "--port-file", str(port_file)),
            *("--default-tools", "--tool", "order:latency=2,mutating", "--ledger", str(tmp / "ledger.jsonl")),
        ],
        stderr=subprocess.DEVNULL,
    )
    env = dict(
        os.environ,
        BREAKWATER_SHARE="on",
        BREAKWATER_SHARE_DIR=str(tmp / "share"),
        BREAKWATER_CATALOG_DIR=str(tmp / "catalog"),
        BREAKWATER_ADMISSION_DIR=str(tmp / "admission"),  # its lock files stay in the run, not the user's cache
        BREAKWATER_PROTOCOL_MEMORY_DIR=str(tmp / "protocols"),
        BREAKWATER_JOURNAL="off",
    )
    try:
        while not (port_file.exists() and port_file.read_text().strip()):
            time.sleep(0.05)
        config = tmp / "mcp.json"
        url = f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
        config.write_text(json.dumps({"mcpServers": {"web": {"type": "http", "url": url}}}))
        first = Session(config, env)  # starts the shared gateway, and keeps it busy (not idle) throughout
        cold = first.start(8)
        print(f"first session (starts the gateway): tools/list {cold['tools_list']:.2f} s, first call {cold['first_call']:.2f} s")
        figures: dict[str, dict[str, list[float]]] = {}
        for kind, flags in (("attached", ()), ("direct", ("--no-share",))):
            starts = []
            for _ in range(args.launches):
                s = Session(config, env, *flags)
                starts.append(s.start(8))
                s.close()
            s = Session(config, env, *flags)
            s.start(8)
            figures[kind] = {
                **{k: [x[k] for x in starts] for k in ("initialize", "tools_list", "first_call")},
                "ping": round_trips(s, "ping", None, args.calls),
                "call": round_trips(s, "tools/call", {"name": "web__echo", "arguments": {"text": "x"}}, args.calls),
            }
            s.close()
        first.close()
        print(
            f"{'':<10} {'initialize':>11} {'tools/list':>11} {'first call':>11} "
            f"{'ping p50':>9} {'p99':>8} {'call p50':>9} {'p99':>8}"
        )
        for kind, f in figures.items():
            med = {k: statistics.median(v) for k, v in f.items()}
            print(
                f"{kind:<10} {med['initialize']:>10.2f}s {med['tools_list']:>10.2f}s {med['first_call']:>10.2f}s "
                f"{med['ping'] * 1e3:>7.3f}ms {p(f['ping'], 0.99) * 1e3:>6.3f}ms "
                f"{med['call'] * 1e3:>7.3f}ms {p(f['call'], 0.99) * 1e3:>6.3f}ms"
            )
        a, d = figures["attached"], figures["direct"]
        for what in ("ping", "call"):
            added = (statistics.median(a[what]) - statistics.median(d[what])) * 1e3
            print(f"relay through the shared gateway adds {added:+.3f} ms per {what} (median)")
        if args.failover_sessions:
            failover(config, env, args.failover_sessions, tmp / "ledger.jsonl")
        subprocess.run([sys.executable, "-m", "breakwater", "gateway", "stop"], env=env, capture_output=True, check=False)
    finally:
        upstream.kill()
        upstream.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
