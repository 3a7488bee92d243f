"""Gate overhead: what one call costs in breakwater beyond the SDK call itself.

Three measurements, each against its baseline in the same run, interleaved in batches so drift
hits both sides alike:

* in-process SDK: `mcp.Client(MCPServer)` (the SDK's in-memory transport) called directly vs
  through `Breakwater.call_tool`; overhead = p50(gate) - p50(direct);
* the gate alone: the same with a client stub that returns a ready result, so the SDK's ~0.5 ms
  does not drown the difference;
* open-breaker rejection: `call_tool` on a tool whose breaker is open (the envelope included).

    python bench/gate_overhead.py                 # 20 x 500 calls per side
    python bench/gate_overhead.py --rounds 50     # more
    python bench/gate_overhead.py --profile       # also: cProfile's top entries for the gate alone and a rejection

`--profile` runs 20 000 stub calls and 20 000 open-breaker rejections under cProfile (the garbage
collector off, so its pauses are not charged to whatever allocates when they strike), with the
process CPU time per call beside it, and prints the top entries by own time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from breakwater import Breakwater, Config, ServerSpec, ServerState
from breakwater.config import BreakerPolicy, JournalPolicy
from breakwater.gate._breaker import Outcome, Permit


class Stub:
    """A client that answers at once: isolates the gate's own cost."""

    def __init__(self) -> None:
        self.result = CallToolResult(content=[TextContent(type="text", text="ok")], structured_content={"ok": True})

    async def call_tool(
        self, name: str, arguments: Any = None, *, progress_callback: Any = None, meta: Any = None
    ) -> CallToolResult:
        return self.result


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def compare(
    direct: Callable[[], Awaitable[Any]], gated: Callable[[], Awaitable[Any]], rounds: int, batch: int
) -> tuple[float, float]:
    a: list[float] = []
    b: list[float] = []
    await timed(direct, 50)
    await timed(gated, 50)
    for _ in range(rounds):
        a += await timed(direct, batch)
        b += await timed(gated, batch)
    return statistics.median(a), statistics.median(b)


async def main_async(args: argparse.Namespace) -> None:
    server = MCPServer("bench")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def echo(x: int = 0) -> dict[str, int]:
        return {"x": x}

    tmp = Path(tempfile.mkdtemp(prefix="bw-overhead-"))
    # Open for 10 minutes once tripped: the default few seconds would let a slow (profiled) rejection
    # loop reach half-open, and the stub's answer would close the breaker mid-measurement.
    spec = ServerSpec(name="s", transport="stdio", command="unused", breaker=BreakerPolicy(open_base_s=600.0, open_max_s=600.0))
    # The journal is on (a SQLite file of its own, its writer thread running), as a user runs the gate.
    journal = JournalPolicy(url="off" if args.journal == "off" else str(tmp / "journal.sqlite3"))
    # Not entered: no supervisor runs; the bench installs the connection itself.
    bw = Breakwater(Config(servers=(spec,), journal=journal), admission_dir=tmp, protocol_memory_dir="off")
    bw._life = "open"  # calls are refused outside `async with`; the bench stands in for its supervisor
    if bw.journal is not None:
        bw.journal.start()
    upstream = bw.upstream("s")
    async with Client(server) as client:
        upstream.tools = (await client.list_tools()).tools
        upstream.state = ServerState.READY
        upstream.client = client

        sdk_direct, sdk_gated = await compare(
            lambda: client.call_tool("echo", {"x": 1}), lambda: bw.call_tool("s", "echo", {"x": 1}), args.rounds, args.batch
        )
        stub = Stub()
        upstream.client = stub  # type: ignore[assignment]
        stub_direct, stub_gated = await compare(
            lambda: stub.call_tool("echo", {"x": 1}), lambda: bw.call_tool("s", "echo", {"x": 1}), args.rounds, args.batch
        )
        profiles: list[str] = []

        def gated_echo() -> Awaitable[CallToolResult]:
            return bw.call_tool("s", "echo", {"x": 1})

        if args.profile:
            profiles.append(await profile("gate alone (stub client)", gated_echo, args.profile_calls))
        breaker = bw.gate.breakers.tool("s", "echo")
        while breaker.snapshot().state.value != "open":
            permit = breaker.acquire()
            assert isinstance(permit, Permit)
            permit.record(Outcome.FAILURE, 0.0)
        probe = await bw.call_tool("s", "echo", {"x": 1})
        assert probe.structured_content and probe.structured_content["code"] == "CIRCUIT_OPEN"
        rejections = await timed(lambda: bw.call_tool("s", "echo", {"x": 1}), args.rounds * args.batch)
        raising = []
        for _ in range(args.rounds * args.batch):
            t0 = time.perf_counter()
            with contextlib.suppress(Exception):
                await bw.call_tool("s", "echo", {"x": 1}, raise_on_error=True)
            raising.append(time.perf_counter() - t0)

        if args.profile:
            profiles.append(await profile("open-breaker rejection", gated_echo, args.profile_calls))
            assert breaker.snapshot().state.value == "open", "the breaker closed during the profile"

    if bw.journal is not None:
        bw.journal.close(10.0)
    if args.profile:
        for text in profiles:
            print(text)
    us = 1e6
    print(f"calls per side: {args.rounds * args.batch}; journal {'off' if bw.journal is None else 'on (SQLite)'}")
    print(f"in-process SDK call  direct p50 {sdk_direct * us:8.1f} us   through gate p50 {sdk_gated * us:8.1f} us")
    print(f"  overhead p50 {(sdk_gated - sdk_direct) * us:6.1f} us  (ratio {sdk_gated / sdk_direct:.3f}; target <= 50 us)")
    print(f"stub client          direct p50 {stub_direct * us:8.1f} us   through gate p50 {stub_gated * us:8.1f} us")
    print(f"  gate alone p50 {(stub_gated - stub_direct) * us:6.1f} us  (target <= 20 us)")
    r50, r99 = statistics.median(rejections), sorted(rejections)[int(len(rejections) * 0.99)]
    print(f"open-breaker rejection (envelope result) p50 {r50 * us:6.1f} us  p99 {r99 * us:6.1f} us  (target p50 <= 10 us)")
    print(f"open-breaker rejection (raise_on_error)  p50 {statistics.median(raising) * us:6.1f} us")
    print(f"rejection vs direct SDK call: {sdk_direct / r50:.0f}x faster")


async def profile(label: str, fn: Callable[[], Awaitable[Any]], n: int) -> str:
    """CPU time per call, then cProfile's top entries by own time, for `n` calls of `fn`."""
    await timed(fn, 500)
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        await timed(fn, n)
        cpu = (time.process_time() - t0) / n
        prof = cProfile.Profile()
        prof.enable()
        await timed(fn, n)
        prof.disable()
    finally:
        gc.enable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(18)
    return f"== {label}: {n} calls, CPU {cpu * 1e6:.1f} us per call (process time, GC off, unprofiled)\n{out.getvalue()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--journal", choices=("on", "off"), default="on", help="the call journal (default on, SQLite in a temp dir)")
    p.add_argument("--profile", action="store_true", help="also profile the gate alone and a rejection (cProfile, top entries)")
    p.add_argument("--profile-calls", type=int, default=20000, help="calls per profiled loop (default 20000)")
    anyio.run(main_async, p.parse_args())


if __name__ == "__main__":
    main()
