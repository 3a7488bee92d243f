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
    fail=P             raise an exception (the client sees isError, "Error executing tool ...")
    error=P            return isError: true with a text
    business=P         return isError: true with structuredContent
                       {"ok": false, "retryable": false, "code": "NOT_FOUND", "message": ...}
    retryable_error=P  the same with "retryable": true and code "UNAVAILABLE"
    hang=P             never return until the call is cancelled
    crash=P            the whole process exits with os._exit(3) halfway through the latency
    mutating           each call appends one line to the --ledger (a side effect)
    commit=start|end   when the ledger line is written: before the latency (default: an effect
                       whose response may be lost) or just before a successful result
    readonly, idempotent, destructive, openworld
                       MCP ToolAnnotations hints (readOnlyHint, ...); =false sets them false

One uniform draw per call picks the outcome, so the probabilities are exact and must sum to at
most 1 (crash, hang, fail, error, business, retryable_error, then success). Example:
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
  "handshakes": n, "pid", "name"}, rewritten atomically on every change, so a test can prove
  cancelled work stopped even when the connection is gone.
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

HTTP faults (per process)
-------------------------
--refuse-first N resets the first N TCP connections at accept (SO_LINGER 0) before reading a
byte. HTTP requests are then counted in order: the first --reset-first N are read in full and
the connection is reset with no response; the next --status-first M get --status (with
--retry-after as Retry-After).

Python API
----------
launch_command(*flags) -> argv; stdio_params(*flags) -> StdioServerParameters;
`async with serve_http(*flags) as srv:` (srv.url, srv.port, srv.process);
read_state(path), read_ledger(path), count_ledger(path, tool=, operation_id=).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
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
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from breakwater._wire import OPERATION_ID_META_KEY
from breakwater.gateway._listen import tcp_listener

if TYPE_CHECKING:
    import asyncio

    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

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

STATE_TOOL = "testserver_state"

DEFAULT_TOOLS: tuple[str, ...] = (
    "echo:readonly,idempotent",
    "add:readonly,idempotent",
    "slow:latency=2,progress=0.5,readonly",
    "hang:hang=1,readonly",
    "flaky:fail=0.5,readonly",
    "create_order:mutating,destructive",
)

_HANDSHAKE_METHODS = frozenset({"initialize", "server/discover"})
_CONGESTION_TICK_S = 0.025
_LIVENESS_TTL_S = 0.5
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_OUTCOMES = ("crash", "hang", "fail", "error", "business", "retryable_error")
_ANNOTATION_KEYS = frozenset({"readonly", "idempotent", "destructive", "openworld"})


# --------------------------------------------------------------------------------------------
# Tool specs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """A latency distribution: fixed seconds, lognormal(median, sigma) or uniform(low, high)."""

    kind: Literal["fixed", "lognormal", "uniform"] = "fixed"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Latency:
        """Parse `0.2`, `lognormal(0.2,0.5)` or `uniform(0.1,0.3)`."""
        text = text.strip()
        m = re.fullmatch(r"(lognormal|uniform)\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)", text)
        if m is not None:
            kind: Literal["lognormal", "uniform"] = "lognormal" if m.group(1) == "lognormal" else "uniform"
            a, b = _number(m.group(2)), _number(m.group(3))
            if kind == "lognormal" and (a <= 0 or b < 0):
                raise ValueError(f"lognormal needs median > 0 and sigma >= 0, got {text!r}")
            if kind == "uniform" and not 0 <= a <= b:
                raise ValueError(f"uniform needs 0 <= low <= high, got {text!r}")
            return cls(kind, a, b)
        seconds = _number(text)
        if seconds < 0:
            raise ValueError(f"latency must be >= 0, got {text!r}")
        return cls("fixed", seconds)

    def draw(self, rng: random.Random) -> float:
        """One latency in seconds; a fixed latency consumes no random draw."""
        if self.kind == "lognormal":
            return rng.lognormvariate(math.log(self.a), self.b)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return self.a


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """One tool's behaviour, as parsed from a `--tool` spec (see the module docstring)."""

    name: str
    latency: Latency = Latency()
    progress: float | None = None
    fail: float = 0.0
    error: float = 0.0
    business: float = 0.0
    retryable_error: float = 0.0
    hang: float = 0.0
    crash: float = 0.0
    mutating: bool = False
    commit: Literal["start", "end"] = "start"
    readonly: bool | None = None
    idempotent: bool | None = None
    destructive: bool | None = None
    openworld: bool | None = None

    def with_items(self, items: Mapping[str, str], *, runtime: bool = False) -> ToolSpec:
        """A copy with `items` (key -> raw value text) applied; raises ValueError on a bad key or value."""
        changes: dict[str, Any] = {}
        for raw_key, raw_value in items.items():
            key = raw_key.strip().replace("-", "_")
            if runtime and key in _ANNOTATION_KEYS:
                raise ValueError(f"{key!r} is an annotation and cannot change at run time")
            changes[key] = _parse_value(key, raw_value)
        spec = dataclasses.replace(self, **changes)
        spec._validate()
        return spec

    def annotations(self) -> ToolAnnotations | None:
        """The MCP annotations this spec asks for (None when no hint was given)."""
        hints = (self.readonly, self.destructive, self.idempotent, self.openworld)
        if all(h is None for h in hints):
            return None
        return ToolAnnotations(
            read_only_hint=self.readonly,
            destructive_hint=self.destructive,
            idempotent_hint=self.idempotent,
            open_world_hint=self.openworld,
        )

    def _validate(self) -> None:
        total = sum(getattr(self, o) for o in _OUTCOMES)
        if total > 1 + 1e-9:
            raise ValueError(f"tool {self.name!r}: outcome probabilities sum to {total:g} > 1")
        if self.progress is not None and self.progress <= 0:
            raise ValueError(f"tool {self.name!r}: progress interval must be > 0")


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("", "1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _parse_value(key: str, raw: str) -> Any:
    if key == "latency":
        return Latency.parse(raw)
    if key == "progress":
        return None if raw.strip().lower() in ("none", "off", "0") else _number(raw)
    if key in _OUTCOMES:
        p = _number(raw)
        if not 0 <= p <= 1:
            raise ValueError(f"{key} is a probability in [0, 1], got {raw!r}")
        return p
    if key in ("mutating", *_ANNOTATION_KEYS):
        return _parse_bool(raw)
    if key == "commit":
        if raw not in ("start", "end"):
            raise ValueError(f"commit must be start or end, got {raw!r}")
        return raw
    known = ", ".join(["latency", "progress", *_OUTCOMES, "mutating", "commit", *sorted(_ANNOTATION_KEYS)])
    raise ValueError(f"unknown tool key {key!r} (known: {known})")


def _split_items(text: str) -> list[str]:
    """Split on commas outside parentheses, so `latency=uniform(1,2),fail=0.1` stays two items."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def parse_tool_spec(text: str) -> ToolSpec:
    """Parse `NAME[:key=value[,key=value...]]` (see the module docstring); raises ValueError."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid tool name {name!r} (letters, digits, '_', '.', '-')")
    if name == STATE_TOOL:
        raise ValueError(f"{STATE_TOOL!r} is built in")
    items: dict[str, str] = {}
    for item in _split_items(rest):
        key, _, value = item.partition("=")
        items[key] = value
    return ToolSpec(name=name).with_items(items)


# --------------------------------------------------------------------------------------------
# Files shared with tests: state, ledger, control
# --------------------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    # Readers must never see a half-written file, so write beside it and rename over it.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a `--state-file` written by a testserver process."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def read_ledger(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All side-effect records of a `--ledger` file, oldest first ([] when it does not exist yet)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def count_ledger(path: str | os.PathLike[str], *, tool: str | None = None, operation_id: str | None = None) -> int:
    """How many side effects the ledger holds, optionally only for one tool and/or operation id."""
    return sum(
        1
        for rec in read_ledger(path)
        if (tool is None or rec.get("tool") == tool) and (operation_id is None or rec.get("operation_id") == operation_id)
    )


def _append_ledger(path: Path, record: Mapping[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True) + "\n"
    with path.open("a", encoding="utf-8") as f:
        # Several server processes may share one ledger; the lock keeps lines whole.
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _ControlFile:
    """Run-time tool overrides, re-read only when the file's mtime or size changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._overrides: dict[str, dict[str, str]] = {}

    def overrides(self) -> dict[str, dict[str, str]]:
        try:
            st = self._path.stat()
        except FileNotFoundError:
            self._stamp, self._overrides = None, {}
            return self._overrides
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._overrides = self._load()
            except (OSError, ValueError) as exc:
                # A benchmark rewriting the file must not crash the server; keep the last good overrides.
                print(f"testserver: ignoring control file {self._path}: {exc}", file=sys.stderr)
        return self._overrides

    def _load(self) -> dict[str, dict[str, str]]:
        data = json.loads(self._path.read_text(encoding="utf-8") or "{}")
        tools = data.get("tools", {}) if isinstance(data, dict) else None
        if not isinstance(tools, dict):
            raise ValueError('expected {"tools": {NAME: {KEY: VALUE}}}')
        out: dict[str, dict[str, str]] = {}
        for name, keys in tools.items():
            if not isinstance(keys, dict):
                raise ValueError(f"tools.{name} must be an object")
            out[str(name)] = {str(k): _json_value_text(v) for k, v in keys.items()}
        return out


def _json_value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


# --------------------------------------------------------------------------------------------
# Congestion model
# --------------------------------------------------------------------------------------------


class _Congestion:
    """Processor sharing across every process that uses the same marker directory."""

    def __init__(self, directory: Path, work_s: float, cores: float, sigma: float) -> None:
        self._dir = directory
        self._work_s = work_s
        self._cores = cores
        self._sigma = sigma
        self._seq = itertools.count()
        self._liveness: dict[int, tuple[bool, float]] = {}
        self._count = 0
        self._counted_at = -math.inf
        directory.mkdir(parents=True, exist_ok=True)

    def _alive(self, pid: int) -> bool:
        if pid == os.getpid():
            return True
        now = time.monotonic()
        cached = self._liveness.get(pid)
        if cached is not None and now - cached[1] < _LIVENESS_TTL_S:
            return cached[0]
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        self._liveness[pid] = (alive, now)
        return alive

    def in_flight(self) -> int:
        """Handshakes in flight machine-wide (live markers in the directory), re-counted at most once a tick.

        Every in-flight handshake asks each tick; listing the directory once per process and tick keeps
        the model's own CPU cost from becoming the congestion it models.
        """
        now = time.monotonic()
        if now - self._counted_at < _CONGESTION_TICK_S / 2:
            return self._count
        self._count = self._list_in_flight()
        self._counted_at = now
        return self._count

    def _list_in_flight(self) -> int:
        n = 0
        for entry in os.listdir(self._dir):
            pid_text = entry.partition("-")[0]
            if not pid_text.isdigit():
                continue
            if self._alive(int(pid_text)):
                n += 1
            else:
                # The owner died without cleaning up; drop its marker so it stops counting for everyone.
                with contextlib.suppress(OSError):
                    (self._dir / entry).unlink()
        return n

    async def serve(self, rng: random.Random) -> float:
        """Hold one handshake until it has received its share of service; returns the work drawn."""
        # --congestion-work is the mean, so S*M*work/cores is the capacity bound a benchmark quotes.
        mu = math.log(self._work_s) - self._sigma**2 / 2
        work = self._work_s if self._sigma <= 0 else rng.lognormvariate(mu, self._sigma)
        marker = self._dir / f"{os.getpid()}-{next(self._seq)}.handshake"
        marker.touch()
        try:
            done = 0.0
            last = time.monotonic()
            while done < work:
                rate = min(1.0, self._cores / max(1, self.in_flight()))
                await anyio.sleep(min(_CONGESTION_TICK_S, (work - done) / rate))
                now = time.monotonic()
                done += (now - last) * rate
                last = now
        finally:
            with contextlib.suppress(OSError):
                marker.unlink()
        return work


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Options:
    name: str
    seed: int | None
    specs: tuple[ToolSpec, ...]
    startup_delay: float
    congestion: _Congestion | None
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
        self.control = _ControlFile(opts.control_file) if opts.control_file else None
        self._write_state()

    def state(self) -> dict[str, Any]:
        return {
            **{k: dict(v) for k, v in self.counters.items()},
            "handshakes": self.handshakes,
            "pid": os.getpid(),
            "name": self.opts.name,
        }

    def _write_state(self) -> None:
        if self.opts.state_file is not None:
            _write_atomic(self.opts.state_file, json.dumps(self.state(), sort_keys=True))

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
            if ctx.method in _HANDSHAKE_METHODS:
                self.handshakes += 1
                self._write_state()
                if self.opts.congestion is not None:
                    await self.opts.congestion.serve(self.rng)
        return await call_next(ctx)

    def _draw_outcome(self, spec: ToolSpec) -> str:
        u = self.rng.random()
        edge = 0.0
        for outcome in _OUTCOMES:
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
        _append_ledger(
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
            description=f"breakwater testserver tool ({_describe(spec)})",
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


def _describe(spec: ToolSpec) -> str:
    parts = [f"latency={spec.latency.kind}({spec.latency.a:g},{spec.latency.b:g})"]
    parts += [f"{o}={getattr(spec, o):g}" for o in _OUTCOMES if getattr(spec, o)]
    if spec.progress is not None:
        parts.append(f"progress={spec.progress:g}")
    if spec.mutating:
        parts.append(f"mutating(commit={spec.commit})")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# HTTP transport and its faults
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _HttpFaults:
    refuse_left: int = 0
    reset_left: int = 0
    status_left: int = 0
    status: int = 503
    retry_after: str | None = None
    transports: dict[tuple[str, int], asyncio.Transport] = dataclasses.field(default_factory=dict)


def _rst(transport: asyncio.Transport) -> None:
    """Close with a TCP RST instead of a FIN: SO_LINGER on with a zero timeout, then abort."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _faulty_protocol(faults: _HttpFaults) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class FaultyH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if faults.refuse_left > 0:
                faults.refuse_left -= 1
                # Before the first data_received: the peer's request bytes are never read.
                _rst(transport)
                return
            if self.client is not None:
                faults.transports[self.client] = transport

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client is not None:
                faults.transports.pop(self.client, None)
            super().connection_lost(exc)

    return FaultyH11Protocol


def _faulty_app(app: ASGIApp, faults: _HttpFaults) -> ASGIApp:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (faults.reset_left <= 0 and faults.status_left <= 0):
            await app(scope, receive, send)
            return
        # Drain the body first: closing a socket with unread input would turn every close into an RST.
        message: Message = {"more_body": True}
        while message.get("more_body", False):
            message = await receive()
            if message["type"] == "http.disconnect":
                return
        if faults.reset_left > 0:
            faults.reset_left -= 1
            client = scope.get("client")
            transport = faults.transports.get((client[0], client[1])) if client else None
            if transport is None:
                # Not ours to reset (never expected); uvicorn answers 500 rather than leaving the caller hanging.
                return
            _rst(transport)
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        faults.status_left -= 1
        body = json.dumps({"error": f"injected HTTP {faults.status}"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if faults.retry_after is not None:
            headers.append((b"retry-after", faults.retry_after.encode()))
        await send({"type": "http.response.start", "status": faults.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return wrapped


async def _serve_http(
    mcp: MCPServer,
    *,
    port: int,
    port_file: Path | None,
    json_response: bool,
    stateless: bool,
    faults: _HttpFaults,
    log_level: str,
) -> None:
    import uvicorn

    app = mcp.streamable_http_app(json_response=json_response, stateless_http=stateless, host="127.0.0.1")
    config = uvicorn.Config(
        _faulty_app(app, faults),
        http=_faulty_protocol(faults),
        log_level=log_level.lower(),
        lifespan="on",
        # A hung tool holds its SSE stream open forever; do not let it block a SIGTERM.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    sock = tcp_listener("127.0.0.1", port)
    actual = int(sock.getsockname()[1])

    async def announce() -> None:
        while not server.started:
            await anyio.sleep(0.01)
        if port_file is not None:
            _write_atomic(port_file, f"{actual}\n")
        print(f"listening on http://127.0.0.1:{actual}/mcp", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()


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
    g.add_argument("--exit-at-start", type=int, default=None, metavar="CODE", help="exit with CODE before serving")
    g.add_argument("--exit-message", default=None, metavar="TEXT", help="with --exit-at-start: print TEXT to stderr")
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
    g = p.add_argument_group("observation")
    g.add_argument("--ledger", type=Path, default=None, help="side-effect ledger of mutating tools (JSON lines)")
    g.add_argument("--state-file", type=Path, default=None, help="JSON counters, rewritten atomically on change")
    g.add_argument("--control-file", type=Path, default=None, help="JSON tool overrides, re-read at each call")
    return p


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
        congestion=(
            _Congestion(ns.congestion_dir, ns.congestion_work, ns.congestion_cores, ns.congestion_sigma)
            if ns.congestion_dir is not None
            else None
        ),
        ledger=ns.ledger,
        state_file=ns.state_file,
        control_file=ns.control_file,
        log_level=ns.log_level,
    )
    mcp = _build_server(opts, started_at)
    if not http:
        anyio.run(mcp.run_stdio_async)
        return 0
    faults = _HttpFaults(
        refuse_left=ns.refuse_first,
        reset_left=ns.reset_first,
        status_left=ns.status_first,
        status=ns.status,
        retry_after=ns.retry_after,
    )
    anyio.run(
        lambda: _serve_http(
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
    """The argv that launches a testserver subprocess with `flags`."""
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
