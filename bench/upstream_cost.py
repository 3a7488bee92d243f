"""What the gateway's `tools/call` costs the upstream server: instructions per call, by part of the request.

A call through breakwater is slower than a direct one partly because of the gateway's own work and
partly because the upstream does more for the request the gateway sends than for a direct client's
(issue 16). This script takes the second part apart. It runs `breakwater serve --no-share` once in
front of the benchmark's upstream (`bench/proxy_overhead.py`'s), records the `tools/call` line the
gateway really sends, then replays that line, and variants of it with one part taken out, to a fresh
upstream under `valgrind --tool=callgrind --instr-atstart=no`. Only the measured calls are counted
(instrumentation is switched on after the handshake and a warm-up), so the figures do not move with
the machine's load.

    python bench/upstream_cost.py                 # 300 calls per variant (~4 min)
    python bench/upstream_cost.py --calls 100 --only as-sent,no-sampling-elicitation
    python bench/upstream_cost.py --only as-sent,direct-2025-11-25-client   # the gateway's session against a direct one

Needs valgrind (`callgrind_control`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from proxy_overhead import UPSTREAM, breakwater_env, tool_names

CAPS = "io.modelcontextprotocol/clientCapabilities"
WARMUP = 30


def _meta(message: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = message["params"].setdefault("_meta", {})
    return meta


def _drop_sampling_elicitation(message: dict[str, Any]) -> None:
    caps = _meta(message).get(CAPS, {})
    caps.pop("sampling", None)
    caps.pop("elicitation", None)


def _drop_extensions(message: dict[str, Any]) -> None:
    _meta(message).get(CAPS, {}).pop("extensions", None)


def _drop_log_level(message: dict[str, Any]) -> None:
    _meta(message).pop("io.modelcontextprotocol/logLevel", None)


def _drop_progress(message: dict[str, Any]) -> None:
    _meta(message).pop("progressToken", None)


def _drop_operation(message: dict[str, Any]) -> None:
    _meta(message).pop("io.breakwater/operationId", None)
    message["params"].get("arguments", {}).pop("operationId", None)


def _int_id(message: dict[str, Any]) -> None:
    message["id"] = 0  # renumbered per call below


def _as_a_direct_client(message: dict[str, Any]) -> None:
    """The same call as a direct 2025-11-25 client sends it (its session opened by `initialize`): name and arguments."""
    arguments = {k: v for k, v in message["params"].get("arguments", {}).items() if k != "operationId"}
    message["params"] = {"name": message["params"]["name"], "arguments": arguments}
    _int_id(message)


#: The variants whose upstream session is a 2025-11-25 one (`initialize`), not the gateway's handshake.
HANDSHAKE_ERA = {"direct-2025-11-25-client"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}

EDITS: dict[str, list[Callable[[dict[str, Any]], None]]] = {
    "as-sent": [],
    "no-sampling-elicitation": [_drop_sampling_elicitation],
    "no-extensions": [_drop_extensions],
    "no-log-level": [_drop_log_level],
    "no-progress-token": [_drop_progress],
    "no-operation-id": [_drop_operation],
    "integer-id": [_int_id],
    "all-of-these": [_drop_sampling_elicitation, _drop_extensions, _drop_log_level, _drop_progress, _drop_operation, _int_id],
    # Not a part taken out: the whole difference between the gateway's 2026-07-28 session and a direct client's.
    "direct-2025-11-25-client": [_as_a_direct_client],
}


async def captured_lines(tmp: Path) -> tuple[str, str]:
    """The handshake line and one `tools/call` line a real `breakwater serve` sends its upstream."""
    log = tmp / "upstream-in.log"
    tee = f"tee {shlex.quote(str(log))} | {shlex.join(UPSTREAM)}"
    config = tmp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"bench": {"command": "sh", "args": ["-c", tee]}}}))
    env = breakwater_env(tmp)
    serve = ["-m", "breakwater", "serve", "--no-share", "--config", str(config)]
    params = StdioServerParameters(command=sys.executable, args=serve, env=env)
    async with Client(params, mode="legacy") as client:
        echo, _ = await tool_names(client)
        result = await client.call_tool(echo, {"payload": "x"})
        assert not result.is_error, result
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    first = next(m for m in lines if "id" in m)  # server/discover (2026-07-28) or initialize
    call = next(m for m in lines if m.get("method") == "tools/call")
    return json.dumps(first), json.dumps(call)


def measure(
    handshake: str, call: str, edits: list[Callable[[dict[str, Any]], None]], calls: int, tmp: Path, *, legacy: bool = False
) -> int:
    """Instructions the upstream executes for `calls` calls of `call` with `edits` applied."""
    out = tmp / f"callgrind.{time.monotonic_ns()}"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *UPSTREAM]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    template = json.loads(call)
    for edit in edits:
        edit(template)

    def send(message: dict[str, Any], *, answered: bool = True) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        proc.stdin.flush()
        while answered:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the upstream ended")
            if b'"id"' in line:  # an answer (notifications, if any, are read past)
                return line
        return b""

    def one(n: int) -> None:
        message = copy.deepcopy(template)
        message["id"] = n if isinstance(template["id"], int) else f"bw-{n}"
        meta = message["params"].get("_meta", {})
        if "progressToken" in meta:
            meta["progressToken"] = message["id"]
        if "operationId" in message["params"].get("arguments", {}):
            op = os.urandom(16).hex()
            message["params"]["arguments"]["operationId"] = op
            meta["io.breakwater/operationId"] = op
        answer = send(message)
        assert b'"isError":false' in answer, answer[:300]

    try:
        if legacy:
            send(INITIALIZE)
            send({"jsonrpc": "2.0", "method": "notifications/initialized"}, answered=False)
        else:
            send(json.loads(handshake))
        for n in range(WARMUP):
            one(n + 1)
        _control(proc.pid, "-i", "on")
        for n in range(calls):
            one(WARMUP + n + 1)
        _control(proc.pid, "-i", "off")
        _control(proc.pid, "-d")  # a dump of the measured calls, beside the one written at exit
    finally:
        proc.stdin.close()
        proc.wait(timeout=120)
    total = 0
    for path in tmp.glob(f"{out.name}*"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return total


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="measured calls per variant (default 300)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(EDITS)}")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(EDITS)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        handshake, call = anyio.run(captured_lines, tmp)
        print(f"the gateway's tools/call line: {call}\n", file=sys.stderr)
        rows = {
            name: measure(handshake, call, EDITS[name], args.calls, tmp, legacy=name in HANDSHAKE_ERA) / args.calls
            for name in names
        }
    base = rows.get("as-sent")
    print("| request the upstream gets | instructions / call | vs as sent |")
    print("|---|---|---|")
    for name, per_call in rows.items():
        delta = "—" if base is None or name == "as-sent" else f"{(per_call - base) / 1e3:+.0f} k"
        print(f"| {name} | {per_call / 1e6:.3f} M | {delta} |")


if __name__ == "__main__":
    main()
