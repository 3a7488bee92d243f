"""Instructions per call through the gate alone: valgrind's callgrind on the call path, for a load-proof figure.

Wall-clock latency on a shared machine moves with the neighbours' load; the instructions the call
path executes do not. Each case runs in a child process under `valgrind --tool=callgrind
--instr-atstart=no`; instrumentation is switched on after a warm-up, for the measured calls only,
with the garbage collector off. The upstream is a stub client that answers at once, as in
`bench/gate_overhead.py`'s "gate alone"; the journal (an SQLite file of its own) only queues its rows
(its writer thread is not started, so only the call path is counted).

    python bench/gate_instructions.py                       # gate alone (journal on, off), rejection
    python bench/gate_instructions.py --calls 4000
    PYTHONPATH=/path/to/other/src python bench/gate_instructions.py   # another tree

Needs valgrind (`callgrind_control`, `callgrind_annotate`).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from mcp.types import Tool, ToolAnnotations

from breakwater import Breakwater, Config, ServerSpec, ServerState
from breakwater.config import BreakerPolicy, JournalPolicy
from breakwater.gate._breaker import Outcome, Permit
from gate_overhead import Stub

CASES = {
    "gate alone, journal on": ("answer", "on"),
    "gate alone, journal off": ("answer", "off"),
    "open-breaker rejection (envelope), journal on": ("reject", "on"),
}
WARMUP = 500


def _instrument(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], check=True, capture_output=True)


async def child(kind: str, journal: str, calls: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bw-instr-"))
    spec = ServerSpec(name="s", transport="stdio", command="unused", breaker=BreakerPolicy(open_base_s=600.0, open_max_s=600.0))
    policy = JournalPolicy(url="off" if journal == "off" else str(tmp / "journal.sqlite3"))
    bw = Breakwater(Config(servers=(spec,), journal=policy), admission_dir=tmp, protocol_memory_dir="off")
    bw._life = "open"  # calls are refused outside `async with`; the bench stands in for its supervisor
    upstream = bw.upstream("s")
    schema = {"type": "object", "properties": {"x": {"type": "integer", "default": 0}}}
    upstream.tools = [Tool(name="echo", input_schema=schema, annotations=ToolAnnotations(read_only_hint=True))]
    upstream.state = ServerState.READY
    upstream.client = Stub()  # type: ignore[assignment]
    if kind == "reject":
        breaker = bw.gate.breakers.tool("s", "echo")
        while breaker.snapshot().state.value != "open":
            permit = breaker.acquire()
            assert isinstance(permit, Permit)
            permit.record(Outcome.FAILURE, 0.0)
    for _ in range(WARMUP):
        result = await bw.call_tool("s", "echo", {"x": 1})
    assert result.is_error == (kind == "reject"), result
    gc.collect()
    gc.disable()
    _instrument(True)
    for _ in range(calls):
        await bw.call_tool("s", "echo", {"x": 1})
    _instrument(False)


def measure(kind: str, journal: str, calls: int) -> int:
    """Instructions per call of one case, from a child process under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        cmd += [sys.executable, __file__, "--child", kind, journal, "--calls", str(calls)]
        subprocess.run(cmd, check=True, capture_output=True)
        report = subprocess.run(["callgrind_annotate", str(out)], check=True, capture_output=True, text=True).stdout
    total = next(line for line in report.splitlines() if "PROGRAM TOTALS" in line).split()[0]
    return int(total.replace(",", "")) // calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="measured calls per case (default 2000)")
    p.add_argument("--child", nargs=2, metavar=("KIND", "JOURNAL"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        anyio.run(child, args.child[0], args.child[1], args.calls)
        return
    for label, (kind, journal) in CASES.items():
        print(f"{label:48} {measure(kind, journal, args.calls):9,d} instructions per call")


if __name__ == "__main__":
    main()
