"""HTTP memory: what `breakwater serve --http` keeps after 2025-11-25 clients that sent large calls and went away.

Each round opens `--sessions` 2025-11-25 sessions (initialize, initialized), and each sends one `tools/call` whose
argument is `--mb` MB, to a tool that answers after `--latency` seconds by echoing it (so the answer is twice
that). The clients never read the answer (a 4 KiB receive buffer), close their sockets after `--hold` seconds and
never end their sessions: what a flaky network or a crashed agent leaves. `--settle` seconds after each round
the target's resident memory (VmRSS) is read.

Targets, in the same run:

* sdk: the upstream itself, a `breakwater testserver --http` (the official SDK's streamable HTTP server), the
  clients talking to it directly: the baseline of what the SDK keeps;
* breakwater: `breakwater serve --http` (defaults) in front of a stdio `breakwater testserver` with the same tool.

    python bench/http_memory.py                    # 4 rounds of 10 sessions × 3 MB
    python bench/http_memory.py --rounds 2 --sessions 4 --mb 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2

from breakwater.testing.server import launch_command

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _wait_port(port_file: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the target did not start (exit {proc.poll()})")
        time.sleep(0.05)
    return int(port_file.read_text())


@contextmanager
def target(name: str, tmp: Path, tool: str) -> Iterator[tuple[int, int]]:
    """(port, pid) of the process whose memory is read: the SDK server itself, or the gateway in front of one."""
    port_file = tmp / f"{name}.port"
    env = dict(os.environ, HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "cache"), BREAKWATER_CALL_TIMEOUT_S="30")
    if name == "sdk":
        argv = launch_command("--http", "--port", "0", "--port-file", str(port_file), "--tool", tool)
    else:
        config = tmp / "mcp.json"
        upstream = launch_command("--tool", tool)
        config.write_text(json.dumps({"mcpServers": {"t": {"command": upstream[0], "args": upstream[1:]}}}))
        argv = [sys.executable, "-m", "breakwater", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
        argv += ["--port-file", str(port_file)]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield _wait_port(port_file, proc), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _session(http: httpx2.Client, url: str) -> str:
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    opened = http.post(url, headers=ACCEPT, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
    session = opened.headers["mcp-session-id"]
    headers = {**ACCEPT, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return session


def abandon(port: int, tool_name: str, sessions: int, mb: float, hold_s: float) -> None:
    """`sessions` sessions each send one large call, never read its answer, and close their sockets after `hold_s`."""
    url = f"http://127.0.0.1:{port}/mcp"
    payload = "y" * int(mb * 1024 * 1024)
    sockets = []
    with httpx2.Client(timeout=30) as http:
        for _ in range(sessions):
            session = _session(http, url)
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool_name, "arguments": {"p": payload}}}
            body = json.dumps(call).encode()
            head = (
                f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n"
                f"MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(head + body)
            sockets.append(sock)
    time.sleep(hold_s)
    for sock in sockets:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=10, help="abandoned sessions per round")
    parser.add_argument("--mb", type=float, default=3.0, help="each call's argument, MB (its answer is twice that)")
    parser.add_argument("--latency", type=float, default=2.0, help="the tool's latency, s (over a second: an SSE answer)")
    parser.add_argument("--hold", type=float, default=6.0, help="how long the clients keep their sockets open, s")
    parser.add_argument("--settle", type=float, default=14.0, help="how long after closing the memory is read, s")
    parser.add_argument("--only", default="sdk,breakwater")
    args = parser.parse_args()
    tool = f"order:latency={args.latency},readonly"
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bw-memory-") as tmp_name:
        tmp = Path(tmp_name)
        for name in args.only.split(","):
            with target(name, tmp, tool) as (port, pid):
                tool_name = "order" if name == "sdk" else "t__order"
                time.sleep(1.0)  # the gateway's upstream connects
                rows[name] = [rss_mb(pid)]
                for _ in range(args.rounds):
                    abandon(port, tool_name, args.sessions, args.mb, args.hold)
                    time.sleep(args.settle)
                    rows[name].append(rss_mb(pid))
    print(f"{args.rounds} rounds of {args.sessions} abandoned sessions × {args.mb} MB calls ({args.latency} s tool), RSS MB:")
    print(f"{'target':<12} {'start':>7} " + " ".join(f"{'r' + str(i + 1):>7}" for i in range(args.rounds)) + "   kept")
    for name, values in rows.items():
        kept = values[-1] - values[0]
        print(f"{name:<12} {values[0]:7.0f} " + " ".join(f"{v:7.0f}" for v in values[1:]) + f"   {kept:+.0f}")
    if "sdk" in rows and "breakwater" in rows:
        sdk_kept = rows["sdk"][-1] - rows["sdk"][0]
        bw_kept = rows["breakwater"][-1] - rows["breakwater"][0]
        print(f"breakwater kept / sdk kept: {bw_kept / sdk_kept:.2f}×" if sdk_kept > 0 else "")


if __name__ == "__main__":
    main()
