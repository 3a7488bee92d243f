"""`breakwater testserver`: a real MCP server whose misbehaviour is chosen by flags.

Users run it to reproduce a failure; every breakwater test, benchmark and demo uses it as the
server on the other side. It is the SDK's `MCPServer`, so it speaks both protocol revisions
(2025-11-25 through `initialize`, 2026-07-28 through `server/discover`) over stdio (default) or
streamable HTTP on 127.0.0.1 (`--http`, `--port`).

Tool specs (`--tool SPEC`, repeatable)
-------------------------------------
    SPEC  = NAME [":" ITEM ("," ITEM)*]
    ITEM  = KEY ["=" VALUE]          a bare KEY means KEY=true

    latency=D          how long a call works; D is seconds (0.2), lognormal(MEDIAN,SIGMA)
                       or uniform(LOW,HIGH); random draws use the --seed generator
    progress=S         send notifications/progress every S seconds while working (only when
                       the caller sent a progress token)
    logs=N             send N log messages (notifications/message, level info) at once, before working
    fail=P             raise an exception (the client sees isError, "Error executing tool ...")
    error=P            return isError: true with a text
    business=P         return isError: true with structuredContent
                       {"ok": false, "retryable": false, "code": "NOT_FOUND", "message": ...}
    retryable_error=P  the same with "retryable": true and code "UNAVAILABLE"
    rpc_error=P        answer with a JSON-RPC error -32000 (JSON-RPC's generic "server error", the
                       code the SDK's clients also give a connection that closed)
    hang=P             never return until the call is cancelled
    crash=P            the whole process exits with os._exit(3) halfway through the latency
    mutating           each call appends one line to the --ledger (a side effect)
    commit=start|end   when the ledger line is written: before the latency (default: an effect
                       whose response may be lost) or just before a successful result
    readonly, idempotent, destructive, openworld
                       MCP ToolAnnotations hints (readOnlyHint, ...); =false sets them false

One uniform draw per call picks the outcome, so the probabilities are exact and must sum to at
most 1 (crash, hang, fail, error, business, retryable_error, rpc_error, then success). Example:
    --tool 'search:latency=lognormal(0.2,0.5),retryable_error=0.1,readonly'

Every tool accepts any JSON object (the schema lists optional `payload`, `operationId`, `a`, `b`)
and on success returns structuredContent echoing what ran: tool, arguments, operation_id, drawn
latency, pid, call number (and `sum` when numbers `a` and `b` were given). The operation id is
read from `_meta["io.breakwater/operationId"]`, else from the `operationId` argument.

Without --tool the default set is: echo, add (readonly), slow (2 s, progress every 0.5 s),
hang, flaky (fail=0.5), create_order (mutating, destructive). The built-in tool
`testserver_state` is always present and returns the state object described below.

State, ledger and control files
-------------------------------
--state-file: JSON {"in_flight", "started", "completed", "cancelled", "errors": {tool: n},
  "handshakes": n, "congestion_works": [s], "pid", "name"}, rewritten atomically on every change, so a
  test can prove cancelled work stopped even when the connection is gone ("congestion_works": the
  service each finished handshake drew from the congestion model, in order; a benchmark's ideal).
--ledger: JSON lines {"time", "tool", "operation_id", "args_sha256", "pid", "server"}, appended
  under an exclusive file lock so several processes can share one ledger (see `read_ledger`).
--control-file: JSON re-read (when its mtime changes) at every call, overriding tool keys at run
  time: {"tools": {"search": {"latency": 40}, "*": {"error": 0.2}}} ("*" = every tool). The
  annotation keys cannot change at run time.

Congestion model (connect storms)
---------------------------------
With --congestion-dir, every handshake (initialize or server/discover) needs --congestion-work
seconds of service (lognormal around it with --congestion-sigma) from a processor shared by ALL
processes using that directory: while n handshakes are in flight (one marker file each, named
after the pid so markers of dead processes are ignored) each progresses at min(1, cores/n).
--startup-delay S holds every request (so the handshake) until S seconds after the process
started, while the process is already up and, on HTTP, already accepting connections.
--start-when PATH holds them, likewise, until PATH exists: a start-up that a script, not the
machine's speed, decides (the demo's slow-starting server is still starting whenever it is asked).

HTTP faults (per process)
-------------------------
--refuse-first N resets the first N TCP connections at accept (SO_LINGER 0) before reading a
byte. HTTP requests are then counted in order: the first --reset-first N are read in full and
the connection is reset with no response; the next --status-first M get --status (with
--retry-after as Retry-After), a body that is no JSON-RPC error. With --status-tool NAME only
the calls of tool NAME count, and get the status: a fault mid-session, after the handshake.

Python API
----------
launch_command(*flags) -> argv; stdio_params(*flags) -> StdioServerParameters;
`async with serve_http(*flags) as srv:` (srv.url, srv.port, srv.process);
read_state(path), read_ledger(path), count_ledger(path, tool=, operation_id=).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread
from mcp import StdioServerParameters
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from breakwater._wire import OPERATION_ID_META_KEY
from breakwater.testing import _idle_logs, _launcher
from breakwater.testing._asks import add_asking_tools
from breakwater.testing._congestion import Congestion
from breakwater.testing._http_faults import HttpFaults, serve_streamable_http
from breakwater.testing._ledger import ControlFile, append_ledger, count_ledger, read_ledger, read_state, write_atomic
from breakwater.testing._spec import DEFAULT_TOOLS, OUTCOMES, STATE_TOOL, Latency, ToolSpec, describe, parse_tool_spec

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

__all__ = [
    "DEFAULT_TOOLS",
    "OPERATION_ID_META_KEY",
    "Latency",
    "RunningServer",
    "ToolSpec",
    "count_ledger",
    "launch_command",
    "main",
    "parse_tool_spec",
    "read_ledger",
    "read_state",
    "serve_http",
    "stdio_params",
]

# The runtime, the command line and the launch helpers live here; tool specs (`_spec`), the shared
# files (`_ledger`), the congestion model (`_congestion`) and HTTP faults (`_http_faults`) beside it.
#: JSON-RPC 2.0's generic "server error" (-32000..-32099 are for implementations to define).
SERVER_ERROR = -32000
_HANDSHAKE_METHODS = frozenset({"initialize", "server/discover"})


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Options:
    name: str
    seed: int | None
    specs: tuple[ToolSpec, ...]
    startup_delay: float
    start_when: Path | None
    congestion: Congestion | None
    ledger: Path | None
    state_file: Path | None
    control_file: Path | None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class _Runtime:
    """Per-process behaviour: the seeded rng, counters, files and the tool bodies."""

    def __init__(self, opts: _Options, started_at: float) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.ready_at = started_at + opts.startup_delay
        self.specs = {s.name: s for s in opts.specs}
        names = list(self.specs)
        self.counters: dict[str, dict[str, int]] = {
            k: dict.fromkeys(names, 0) for k in ("in_flight", "started", "completed", "cancelled", "errors")
        }
        self.handshakes = 0
        self.congestion_works: list[float] = []
        self.control = ControlFile(opts.control_file) if opts.control_file else None
        self._write_state()

    def state(self) -> dict[str, Any]:
        return {
            **{k: dict(v) for k, v in self.counters.items()},
            "handshakes": self.handshakes,
            "congestion_works": list(self.congestion_works),
            "pid": os.getpid(),
            "name": self.opts.name,
        }

    def _write_state(self) -> None:
        if self.opts.state_file is not None:
            write_atomic(self.opts.state_file, json.dumps(self.state(), sort_keys=True))

    def _bump(self, counter: str, tool: str, delta: int = 1) -> None:
        c = self.counters[counter]
        c[tool] = c.get(tool, 0) + delta

    def effective(self, name: str) -> ToolSpec:
        spec = self.specs[name]
        if self.control is None:
            return spec
        overrides = self.control.overrides()
        items = {**overrides.get("*", {}), **overrides.get(name, {})}
        if not items:
            return spec
        try:
            return spec.with_items(items, runtime=True)
        except ValueError as exc:
            print(f"testserver: ignoring control overrides for {name}: {exc}", file=sys.stderr)
            return spec

    async def gate(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware: hold requests until ready; charge each handshake its congestion service."""
        if ctx.request_id is not None:
            wait = self.ready_at - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)
            while self.opts.start_when is not None and not self.opts.start_when.exists():
                await anyio.sleep(0.05)
            if ctx.method in _HANDSHAKE_METHODS:
                self.handshakes += 1
                self._write_state()
                if self.opts.congestion is not None:
                    self.congestion_works.append(await self.opts.congestion.serve(self.rng))
                    self._write_state()
        return await call_next(ctx)

    def _draw_outcome(self, spec: ToolSpec) -> str:
        u = self.rng.random()
        edge = 0.0
        for outcome in OUTCOMES:
            edge += getattr(spec, outcome)
            if u < edge:
                return outcome
        return "success"

    async def _work(self, ctx: Context[Any, Any], spec: ToolSpec, seconds: float, total: float | None) -> None:
        """Sleep `seconds` (inf = until cancelled), reporting progress every `spec.progress` seconds."""
        if spec.progress is None:
            if math.isinf(seconds):
                await anyio.sleep_forever()
            await anyio.sleep(seconds)
            return
        start = time.monotonic()
        end = start + seconds
        while True:
            now = time.monotonic()
            if now >= end:
                return
            await anyio.sleep(min(spec.progress, end - now))
            elapsed = time.monotonic() - start
            if time.monotonic() < end:
                await ctx.report_progress(round(elapsed, 3), total, f"{spec.name}: {elapsed:.1f}s")

    async def call(self, name: str, ctx: Context[Any, Any]) -> CallToolResult:
        spec = self.effective(name)
        params = ctx.request_context.params or {}
        raw_args = params.get("arguments")
        args: dict[str, Any] = dict(raw_args) if isinstance(raw_args, Mapping) else {}
        meta = ctx.request_context.meta or {}
        op_id = meta.get(OPERATION_ID_META_KEY) or args.get("operationId")
        latency = spec.latency.draw(self.rng)
        outcome = self._draw_outcome(spec)
        self._bump("started", name)
        self._bump("in_flight", name)
        call_no = self.counters["started"][name]
        self._write_state()
        cancelled = False
        try:
            if spec.mutating and spec.commit == "start":
                self._record(spec, args, op_id)
            for n in range(spec.logs):
                await ctx.info(f"{name}: log message {n + 1} of {spec.logs}")
            if outcome == "crash":
                await self._work(ctx, spec, latency / 2, latency)
                # Die like a segfault would: no cleanup, no response, pipes just close.
                os._exit(3)
            await self._work(ctx, spec, math.inf if outcome == "hang" else latency, None if outcome == "hang" else latency)
            if outcome == "fail":
                self._bump("errors", name)
                raise ToolError(f"injected failure in {name}")
            if outcome == "error":
                self._bump("errors", name)
                return CallToolResult(content=[TextContent(type="text", text=f"injected error in {name}")], is_error=True)
            if outcome == "rpc_error":
                self._bump("errors", name)
                raise MCPError(code=SERVER_ERROR, message=f"injected server error in {name}")
            if outcome in ("business", "retryable_error"):
                self._bump("errors", name)
                retryable = outcome == "retryable_error"
                body = {
                    "ok": False,
                    "retryable": retryable,
                    "code": "UNAVAILABLE" if retryable else "NOT_FOUND",
                    "message": f"{name}: "
                    + ("temporarily unavailable, try again" if retryable else "the requested item does not exist"),
                }
                return _structured(body, is_error=True)
            if spec.mutating and spec.commit == "end":
                self._record(spec, args, op_id)
            result: dict[str, Any] = {
                "ok": True,
                "tool": name,
                "server": self.opts.name,
                "pid": os.getpid(),
                "call": call_no,
                "latency_s": round(latency, 6),
                "arguments": args,
                "operation_id": op_id,
            }
            a, b = args.get("a"), args.get("b")
            if isinstance(a, int | float) and isinstance(b, int | float):
                result["sum"] = a + b
            return _structured(result)
        except anyio.get_cancelled_exc_class():
            cancelled = True
            self._bump("cancelled", name)
            raise
        finally:
            self._bump("in_flight", name, -1)
            if not cancelled:
                self._bump("completed", name)
            self._write_state()

    def _record(self, spec: ToolSpec, args: Mapping[str, Any], op_id: Any) -> None:
        if self.opts.ledger is None:
            return
        digest = hashlib.sha256(json.dumps(args, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        append_ledger(
            self.opts.ledger,
            {
                "time": time.time(),
                "tool": spec.name,
                "operation_id": op_id,
                "args_sha256": digest,
                "pid": os.getpid(),
                "server": self.opts.name,
            },
        )


def _structured(body: dict[str, Any], *, is_error: bool = False) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(body, sort_keys=True))],
        structured_content=body,
        is_error=is_error,
    )


def _tool_fn(rt: _Runtime, name: str) -> Any:
    # The parameters only shape the advertised input schema; the body reads the raw arguments
    # from the request so any JSON object round-trips into the echo and the ledger hash.
    async def tool(
        ctx: Context[Any, Any],
        payload: str | None = None,
        operationId: str | None = None,
        a: float | None = None,
        b: float | None = None,
    ) -> CallToolResult:
        return await rt.call(name, ctx)

    return tool


def _build_server(opts: _Options, started_at: float) -> MCPServer:
    """The configured `MCPServer` (transport-independent)."""
    rt = _Runtime(opts, started_at)
    mcp = MCPServer(name=opts.name, log_level=opts.log_level, middleware=[rt.gate])
    for spec in opts.specs:
        mcp.add_tool(
            _tool_fn(rt, spec.name),
            name=spec.name,
            description=f"breakwater testserver tool ({describe(spec)})",
            annotations=spec.annotations(),
        )

    async def testserver_state() -> CallToolResult:
        """Counters of this server process: in-flight, started, completed and cancelled calls per tool."""
        return _structured(rt.state())

    mcp.add_tool(
        testserver_state,
        name=STATE_TOOL,
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    )
    return mcp


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="breakwater testserver",
        description="A real MCP server whose misbehaviour is set by flags.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("server")
    g.add_argument("--name", default="breakwater-testserver", help="server name (default: %(default)s)")
    g.add_argument("--seed", type=int, default=None, help="seed of the one random generator (default: unseeded)")
    g.add_argument("--tool", action="append", default=[], metavar="SPEC", help="add a tool (repeatable; see below)")
    g.add_argument("--default-tools", action="store_true", help="register the default tools even with --tool")
    g.add_argument("--idle-logs", type=int, default=0, metavar="N", help="after each call, N log messages outside it")
    g.add_argument("--asking-tools", action="store_true", help="add tools that ask the client mid-call (testing._asks)")
    g.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="server log level on stderr (default: %(default)s)",
    )
    g = p.add_argument_group("transport")
    g.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 instead of stdio")
    g.add_argument("--port", type=int, default=None, help="HTTP port, 0 = pick a free one (implies --http)")
    g.add_argument("--port-file", type=Path, default=None, help="write the actual HTTP port here once listening")
    g.add_argument("--json-response", action="store_true", help="HTTP: answer with JSON instead of SSE")
    g.add_argument("--stateless", action="store_true", help="HTTP: stateless mode (no Mcp-Session-Id)")
    g = p.add_argument_group("start-up")
    g.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="hold every request (so the handshake) until S seconds after start",
    )
    g.add_argument("--start-when", type=Path, default=None, metavar="PATH", help="hold every request until PATH exists")
    g.add_argument("--exit-at-start", type=int, default=None, metavar="CODE", help="exit with CODE before serving")
    g.add_argument("--exit-message", default=None, metavar="TEXT", help="with --exit-at-start: print TEXT to stderr")
    g.add_argument("--exit-after", type=float, default=None, metavar="S", help="exit with code 9 S seconds after start")
    g.add_argument("--congestion-dir", type=Path, default=None, metavar="DIR", help="share handshake service via DIR")
    g.add_argument("--congestion-work", type=float, default=0.1, metavar="S", help="service per handshake (0.1)")
    g.add_argument("--congestion-cores", type=float, default=1.0, metavar="C", help="processors shared (1)")
    g.add_argument("--congestion-sigma", type=float, default=0.0, metavar="X", help="lognormal sigma of the work (0)")
    g = p.add_argument_group("HTTP faults (counted per process)")
    g.add_argument("--refuse-first", type=int, default=0, metavar="N", help="RST the first N TCP connections at accept")
    g.add_argument("--reset-first", type=int, default=0, metavar="N", help="read the first N requests, then RST")
    g.add_argument("--status-first", type=int, default=0, metavar="N", help="answer the next N requests with --status")
    g.add_argument("--status", type=int, default=503, metavar="CODE", help="status for --status-first (503)")
    g.add_argument("--retry-after", default=None, metavar="S", help="Retry-After header for --status-first")
    g.add_argument("--status-tool", default=None, metavar="NAME", help="--status-first counts only calls of this tool")
    g = p.add_argument_group("observation")
    g.add_argument("--ledger", type=Path, default=None, help="side-effect ledger of mutating tools (JSON lines)")
    g.add_argument("--state-file", type=Path, default=None, help="JSON counters, rewritten atomically on change")
    g.add_argument("--control-file", type=Path, default=None, help="JSON tool overrides, re-read at each call")
    return p


def _crash(message: str | None) -> None:
    if message is not None:
        print(message, file=sys.stderr, flush=True)
    os._exit(9)


def main(argv: list[str]) -> int:
    """Run `breakwater testserver ARGS`; returns the exit code."""
    started_at = time.monotonic()
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.exit_at_start is not None:
        if ns.exit_message is not None:
            print(ns.exit_message, file=sys.stderr, flush=True)
        return int(ns.exit_at_start)

    http = ns.http or ns.port is not None
    if not http and (ns.refuse_first or ns.reset_first or ns.status_first or ns.port_file or ns.json_response):
        parser.error("--refuse-first, --reset-first, --status-first, --port-file and --json-response need --http")
    if ns.startup_delay < 0 or ns.congestion_work <= 0 or ns.congestion_cores <= 0 or ns.congestion_sigma < 0:
        parser.error("--startup-delay must be >= 0; --congestion-work/--congestion-cores > 0; --congestion-sigma >= 0")
    try:
        raw_specs = list(ns.tool) + (list(DEFAULT_TOOLS) if ns.default_tools or not ns.tool else [])
        specs = tuple(parse_tool_spec(s) for s in raw_specs)
    except ValueError as exc:
        parser.error(f"--tool: {exc}")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        parser.error(f"--tool: duplicate tool names in {names}")

    opts = _Options(
        name=ns.name,
        seed=ns.seed,
        specs=specs,
        startup_delay=ns.startup_delay,
        start_when=ns.start_when,
        congestion=(
            Congestion(ns.congestion_dir, ns.congestion_work, ns.congestion_cores, ns.congestion_sigma)
            if ns.congestion_dir is not None
            else None
        ),
        ledger=ns.ledger,
        state_file=ns.state_file,
        control_file=ns.control_file,
        log_level=ns.log_level,
    )
    mcp = _build_server(opts, started_at)
    _idle_logs.add_idle_logs(mcp, ns.idle_logs)  # a background job's log messages, after each call (testing._idle_logs)
    if ns.asking_tools:
        add_asking_tools(mcp)
    if ns.exit_after is not None:  # a crash after the handshake, with the exit message on stderr
        threading.Timer(ns.exit_after, _crash, (ns.exit_message,)).start()
    if not http:
        anyio.run(mcp.run_stdio_async)
        return 0
    faults = HttpFaults(
        refuse_left=ns.refuse_first,
        reset_left=ns.reset_first,
        status_left=ns.status_first,
        status=ns.status,
        retry_after=ns.retry_after,
        status_tool=ns.status_tool,
    )
    anyio.run(
        lambda: serve_streamable_http(
            mcp,
            port=ns.port or 0,
            port_file=ns.port_file,
            json_response=ns.json_response,
            stateless=ns.stateless,
            faults=faults,
            log_level=ns.log_level,
        ),
        backend="asyncio",
    )
    return 0


# --------------------------------------------------------------------------------------------
# Python API for tests and benchmarks
# --------------------------------------------------------------------------------------------


def launch_command(*flags: str) -> list[str]:
    """The argv that launches a testserver subprocess with `flags`.

    Through the fork server named by `BREAKWATER_TEST_FORK_SERVER` when it is set (the test suite's
    own start-up CPU: `breakwater.testing._fork_server`, `_launcher`), else as `python -m breakwater testserver`.
    """
    path = os.environ.get(_launcher.ENV)
    if path:
        return _launcher.launcher_command(path, flags)
    return [sys.executable, "-m", "breakwater", "testserver", *flags]


def stdio_params(*flags: str, env: Mapping[str, str] | None = None) -> StdioServerParameters:
    """`StdioServerParameters` for `mcp.Client` that launch a stdio testserver with `flags`."""
    cmd = launch_command(*flags)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(env) if env is not None else None)


@dataclass(frozen=True)
class RunningServer:
    """A testserver subprocess serving HTTP."""

    url: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid


@contextlib.asynccontextmanager
async def serve_http(
    *flags: str,
    start_timeout: float = 20.0,
    stderr: int | IO[bytes] | None = None,
) -> AsyncIterator[RunningServer]:
    """Start a testserver on a free HTTP port, yield it once it listens, terminate it on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="bw-testserver-"))
    port_file = tmp / "port"
    cmd = launch_command("--http", "--port", "0", "--port-file", str(port_file), *flags)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        with anyio.fail_after(start_timeout):
            while not port_file.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"testserver exited with {proc.returncode} before listening: {cmd}")
                await anyio.sleep(0.02)
        port = int(port_file.read_text().strip())
        yield RunningServer(url=f"http://127.0.0.1:{port}/mcp", port=port, process=proc)
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


async def _stop(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
    await anyio.to_thread.run_sync(proc.wait)
