"""Instructions per proxied call: the gateway process under valgrind's callgrind, for one target at a time.

On a shared, loaded machine wall-clock latency and even CPU seconds move with the neighbours' load;
the number of instructions a gateway executes per call does not. Each target fronts the benchmark's
upstream (`bench/proxy_overhead.py`'s `echo`) and is driven by the same SDK 2.3 client; the gateway
runs under `valgrind --tool=callgrind --instr-atstart=no`, and instrumentation is switched on only
after the warm-up, for the measured calls (the upstream and the client are not counted). Ratios are to
the bare SDK hop over stdio and to mcp-proxy (PyPI) over HTTP, as in issue 16's targets.

    python bench/proxy_instructions.py                        # every target, 200 calls each (~5 min)
    python bench/proxy_instructions.py --only breakwater-stdio-noshare,sdk-proxy --calls 100
    PYTHONPATH=/path/to/other/src python bench/proxy_instructions.py   # another tree's gateway
    python bench/proxy_instructions.py --first                # a user's first start of each gateway

Each breakwater gateway runs after one earlier start over the same caches, as every start after a
user's first does (the upstream's protocol revision is then remembered: `breakwater.connect._protocol_memory`).

Needs valgrind (`callgrind_control`) and, for mcp-proxy, `scripts/install_node_tools.sh --peers`.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from proxy_overhead import (
    _CLAIMED,
    TOOLS,
    UPSTREAM,
    breakwater_env,
    child_pid,
    earlier_call,
    earlier_session,
    free_port,
    http_client,
    http_gateway,
    mcp_json,
    spawn,
)

TARGETS = (
    "sdk-proxy",
    "breakwater-stdio-noshare",
    "mcp-proxy-pypi",
    "breakwater-http",
    "breakwater-http-json",
    "breakwater-http-2026",
    "http-relay",
)
WARMUP = 20


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


@contextlib.asynccontextmanager
async def connect(name: str, tmp: Path, out: Path) -> AsyncIterator[tuple[Client, int, str]]:
    """A client for `name`, the pid of its gateway (under callgrind) and the echo tool's name there."""
    vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    env = breakwater_env(tmp)
    if name == "sdk-proxy":
        script = str(Path(__file__).parent / "peers" / "sdk_proxy.py")
        params = StdioServerParameters(command=vg[0], args=[*vg[1:], sys.executable, script, "--", *UPSTREAM])
        async with Client(params, mode="legacy") as client:
            pid = child_pid("sdk_proxy.py", _CLAIMED)
            assert pid is not None
            yield client, pid, "echo"
    elif name == "breakwater-stdio-noshare":
        args = [*vg[1:], sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(mcp_json(tmp))]
        async with Client(StdioServerParameters(command=vg[0], args=args, env=env), mode="legacy") as client:
            pid = child_pid("breakwater serve", _CLAIMED)
            assert pid is not None
            yield client, pid, "bench__echo"
    elif name == "mcp-proxy-pypi":
        venv = TOOLS / "venv-mcp-proxy"
        port = free_port()
        cmd = [*vg, str(venv / "bin" / "python"), str(venv / "bin" / "mcp-proxy"), "--host", "127.0.0.1", "--port", str(port)]
        with spawn([*cmd, "--", *UPSTREAM]) as (proc, log):
            async with http_client(f"http://127.0.0.1:{port}/mcp", proc, log, timeout=300) as client:
                yield client, proc.pid, "echo"
    elif name == "http-relay":
        port_file = tmp / "relay.port"
        script = str(Path(__file__).parent / "peers" / "http_relay.py")
        with spawn([*vg, sys.executable, script, str(port_file), "--", *UPSTREAM]) as (proc, log):
            while not (port_file.exists() and port_file.read_text()):
                await anyio.sleep(0.1)
            async with http_client(f"http://127.0.0.1:{port_file.read_text()}/mcp", proc, log, timeout=300) as client:
                yield client, proc.pid, "echo"
    else:
        cmd = [*vg, sys.executable, "-m", "breakwater", "serve", "--config", str(mcp_json(tmp)), "--http", "127.0.0.1:0"]
        if name.endswith("json"):
            cmd.append("--json-response")
        mode = "2026-07-28" if name.endswith("2026") else "legacy"
        async with http_gateway(cmd, tmp, mode, timeout=300) as (client, pid):
            yield client, pid, "bench__echo"


async def earlier_start(name: str, tmp: Path) -> None:
    """One start of `name`'s gateway over `tmp`'s caches before the measured one, as every start after a user's first."""
    serve = [sys.executable, "-m", "breakwater", "serve", "--config", str(mcp_json(tmp))]
    if name == "breakwater-stdio-noshare":
        await earlier_session(StdioServerParameters(command=serve[0], args=[*serve[1:], "--no-share"], env=breakwater_env(tmp)))
    elif name.startswith("breakwater-http"):
        async with http_gateway([*serve, "--http", "127.0.0.1:0"], tmp, "legacy") as (client, _):
            await earlier_call(client)


async def measure(name: str, calls: int, first: bool) -> float:
    """Millions of instructions the gateway of `name` executes per call."""
    with tempfile.TemporaryDirectory(prefix="bw-instr-") as d:
        tmp = Path(d)
        out = tmp / "callgrind.out"
        if not first:
            await earlier_start(name, tmp)
        async with connect(name, tmp, out) as (client, pid, tool):
            for _ in range(WARMUP):
                await client.call_tool(tool, {"text": "x"})
            _control(pid, "-i", "on")
            for _ in range(calls):
                await client.call_tool(tool, {"text": "hello"})
            _control(pid, "-i", "off")
            _control(pid, "-d")
        time.sleep(0.5)
        total = 0
        for path in tmp.glob("callgrind.out*"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
        return total / calls / 1e6


async def amain(args: argparse.Namespace) -> int:
    targets = args.only.split(",") if args.only else list(TARGETS)
    counts: dict[str, float] = {}
    for name in targets:
        counts[name] = await measure(name, args.calls, args.first)
        print(f"  {name}: {counts[name]:.2f} M instructions per call", flush=True)
    print()
    print("| target | M instructions / call | × bare SDK hop (stdio) | × mcp-proxy (PyPI) |")
    print("|---|---|---|---|")
    for name, value in counts.items():
        sdk = f"{value / counts['sdk-proxy']:.2f}×" if "sdk-proxy" in counts else "—"
        peer = f"{value / counts['mcp-proxy-pypi']:.2f}×" if "mcp-proxy-pypi" in counts else "—"
        print(f"| {name} | {value:.2f} | {sdk} | {peer} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200, help="measured calls per target (default 200)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument(
        "--first", action="store_true", help="a user's first start (by default each gateway runs after one earlier start)"
    )
    result: int = anyio.run(amain, parser.parse_args(argv))
    return result


if __name__ == "__main__":
    sys.exit(main())
