"""A test fleet on 127.0.0.1: `breakwater serve --http` replicas behind HAProxy, and synthetic clients.

Used by `tests/gateway/test_fleet.py` (one small run) and `bench/fleet.py` (the rows of
docs/benchmarks.md). Everything is real: HAProxy (Debian's `haproxy`), the replicas and their
shared `breakwater testserver` upstream are processes; Redis is the machine's.

* `haproxy_config()` renders the balancer config the README's "Running a fleet" shows: round-robin
  (or affinity on `Mcp-Session-Id`), an idle timeout, health checks on `/readyz`, and replays of
  exactly the requests that cannot have run (a refused connection, a draining replica's 503).
* `Fleet` starts the upstream (its mutating tool records every execution in a ledger), the
  replicas and HAProxy, and restarts the replicas one by one (`rolling_restart`).
* `run_load()` drives clients of both revisions through the balancer: Poisson arrivals, a share
  of mutating calls with operation ids, 2025-11-25 sessions that re-initialize on a 404 and, as the
  SDK's client does, resume a cut SSE stream with `Last-Event-ID` (`resume_stream`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

from breakwater.testing._ledger import read_ledger
from breakwater.testing._sse import read_stream, resume_stream
from breakwater.testing.server import serve_http

__all__ = ["Fleet", "FleetOptions", "LoadStats", "haproxy_config", "run_load"]

#: How `_call_once` reports a lost answer: a transport error, a stream that ended without it, the balancer's 502/503/504.
_CUT_MARKS = (
    "RemoteProtocolError",
    "ReadError",
    "WriteError",
    "ConnectError",
    "no response",
    "cut, and the stream could not be resumed",
    "HTTP 502",
    "HTTP 503",
    "HTTP 504",
    "HTTPStatusError: Server error",  # a 2025-11-25 initialize that met a dying replica
)
#: Retries of a cut call (the second only when the first was cut as well).
_CUT_RETRIES = 2
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
OPERATION_ID_META_KEY = "io.breakwater/operationId"
REPLAYED_META_KEY = "io.breakwater/replayed"
#: The upstream's tools: a read-only one and a mutating one (a ledger line per execution, written first).
UPSTREAM_TOOLS = (
    "work:latency=lognormal(0.15,0.7),readonly",
    "order:latency=lognormal(0.15,0.7),mutating",
    # Silent longer than the benchmark's idle timeout: only a keep-alive keeps its stream open.
    "report:latency=uniform(2.5,3.5),readonly",
)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Where `lasting_port` looks: below Linux's default ephemeral range (32768-60999), whose ports the kernel hands out as
#: the source ports of outgoing connections.
_LASTING_PORTS = range(20000, 32768)


def lasting_port(rng: random.Random | None = None) -> int:
    """A TCP port free on 127.0.0.1 now, that no outgoing connection takes while its server is down: a replica killed
    and started again on its port found it taken ("the port is in use") by some connection's source port."""
    draw = rng or random.Random()
    for _ in range(200):
        port = draw.choice(_LASTING_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


#: How long the fleet's clients keep an idle connection to the balancer: well below its `timeout http-keep-alive` (2 s),
#: so that the balancer never closes one under a new request (a POST sent just as HAProxy closes the connection is
#: lost, `RemoteProtocolError`, and must not be re-sent blindly). The fleet's own client (`Fleet.http`) kept them for
#: httpx's default 5 s, and a test's retry through the balancer after ~2 s idle was lost so, once in a CI run.
_KEEPALIVE_EXPIRY_S = 0.5


def haproxy_config(
    *,
    listen_port: int,
    replicas: Sequence[tuple[str, str]],
    idle_timeout_s: float,
    affinity: bool = False,
    check_interval_ms: int = 200,
    host: str = "127.0.0.1",
) -> str:
    """The HAProxy config of a fleet of `serve --http` replicas, given as (name, "HOST:PORT") (the README shows one).

    `host` is the name clients reach the balancer by (the replicas must allow it: `--allowed-host`).
    """
    # Affinity is a stick table learnt from the answer to `initialize`, which carries the new session id;
    # hashing the request header cannot pin a session: its initialize has no id yet, so it lands on
    # any replica, and the hash then sends the session elsewhere 2 times in 3 (measured: bench/lab_truth.py).
    sticky = (
        "\n    stick-table type string len 128 size 100k expire 30m"
        "\n    stick store-response res.hdr(Mcp-Session-Id)"
        "\n    stick on req.hdr(Mcp-Session-Id)"
    )
    balance = "balance roundrobin" + (sticky if affinity else "")
    servers = "\n".join(f"    server {name} {address} check" for name, address in replicas)
    idle_ms = max(1, round(idle_timeout_s * 1000))
    return f"""global
    maxconn 2000
    log stderr format raw daemon info

defaults
    mode http
    log global
    option httplog
    timeout connect 1s
    # The idle timeout: a stream silent this long is cut. Keep [gateway] sse_keepalive_s below it.
    timeout client {idle_ms}ms
    timeout server {idle_ms}ms
    timeout http-keep-alive 2s
    # Replay only what cannot have run: a refused connection, or a draining replica's 503.
    # Never empty-response or response-timeout: a call cut mid-way may have run.
    # A request is replayable only if HAProxy holds all of it: wait for the whole body before sending.
    option http-buffer-request
    retries 3
    option redispatch 1
    retry-on conn-failure 503

frontend mcp
    bind {host}:{listen_port}
    default_backend gateways

backend gateways
    {balance}
    # /readyz checks Host like /mcp does (DNS rebinding): send the name clients use.
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host {host}:{listen_port}
    http-check expect status 200
    default-server inter {check_interval_ms}ms fall 1 rise 2
{servers}
"""


@dataclass
class FleetOptions:
    """One fleet's settings."""

    replicas: int = 3
    #: Shared sessions (and breakers) through Redis; None runs each replica on its own.
    redis_url: str | None = None
    affinity: bool = False
    idle_timeout_s: float = 2.0
    drain_s: float = 5.0
    #: 0 turns the SSE keep-alive off.
    keepalive_s: float = 0.5
    upstream_tools: Sequence[str] = UPSTREAM_TOOLS


@dataclass
class Replica:
    """One `serve --http` process on a fixed port (so a restart comes back where HAProxy looks)."""

    name: str
    port: int
    config: Path
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    exits: list[tuple[int, float]] = field(default_factory=list)

    def start(self) -> None:
        cmd = [sys.executable, "-m", "breakwater", "serve", "--config", str(self.config), "--http", f"127.0.0.1:{self.port}"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)

    async def wait_ready(self, http: httpx2.AsyncClient, timeout: float = 60.0) -> None:
        with anyio.fail_after(timeout):
            while True:
                assert self.proc is not None and self.proc.poll() is None, f"{self.name} exited: {self.log.read_text()[-2000:]}"
                with contextlib.suppress(httpx2.HTTPError):
                    if (await http.get(f"http://127.0.0.1:{self.port}/readyz")).status_code == 200:
                        return
                await anyio.sleep(0.1)

    async def stop(self, sig: int = signal.SIGTERM) -> tuple[int, float]:
        """Signal the replica and wait for it: (exit code, seconds from the signal to the exit)."""
        proc = self.proc
        assert proc is not None
        started = time.monotonic()
        proc.send_signal(sig)
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=120))
        self.exits.append((code, time.monotonic() - started))
        return self.exits[-1]


class Fleet:
    """Upstream, replicas and HAProxy, started in `tmp`; `async with Fleet(...) as fleet:`."""

    def __init__(self, tmp: Path, options: FleetOptions) -> None:
        self.tmp = tmp
        self.options = options
        self.ledger = tmp / "ledger.jsonl"
        self.namespace = f"bw-fleet-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.replicas: list[Replica] = []
        self._haproxy: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.AsyncExitStack()
        self.http = httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(keepalive_expiry=_KEEPALIVE_EXPIRY_S))

    @property
    def url(self) -> str:
        """The MCP endpoint, through the balancer."""
        return f"http://127.0.0.1:{self.port}/mcp"

    async def __aenter__(self) -> Fleet:
        try:
            await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _start(self) -> None:
        flags = [arg for spec in self.options.upstream_tools for arg in ("--tool", spec)]
        # The upstream's port is chosen first so everything starts at once (replicas retry their connect).
        upstream_port = free_port()
        for i in range(self.options.replicas):
            self.replicas.append(self._replica(f"r{i}", f"http://127.0.0.1:{upstream_port}/mcp"))
        for replica in self.replicas:
            replica.start()
        await self._stack.enter_async_context(serve_http(*flags, "--port", str(upstream_port), "--ledger", str(self.ledger)))
        for replica in self.replicas:
            await replica.wait_ready(self.http)
        for tries_left in (2, 1, 0):  # its port taken between being picked and bound (an outgoing connection drew it)
            if await self._start_haproxy():
                return
            assert tries_left, f"haproxy exited: {(self.tmp / 'haproxy.log').read_text()[-1000:]}"
            self.port = free_port()

    async def _start_haproxy(self) -> bool:
        """Start the balancer on `self.port`; True once it answers, False if it exited (its log says why)."""
        cfg, haproxy = self.tmp / "haproxy.cfg", shutil.which("haproxy") or "/usr/sbin/haproxy"
        replicas = [(r.name, f"127.0.0.1:{r.port}") for r in self.replicas]
        idle_s, affinity = self.options.idle_timeout_s, self.options.affinity
        cfg.write_text(haproxy_config(listen_port=self.port, replicas=replicas, idle_timeout_s=idle_s, affinity=affinity))
        with (self.tmp / "haproxy.log").open("ab") as log:
            self._haproxy = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=log, stderr=log)
        with anyio.fail_after(20):
            while self._haproxy.poll() is None:
                with contextlib.suppress(httpx2.HTTPError):
                    if (await self.http.get(f"http://127.0.0.1:{self.port}/readyz")).status_code == 200:
                        return True
                await anyio.sleep(0.1)
        return False

    def _replica(self, name: str, upstream_url: str) -> Replica:
        opts = self.options
        state = f'[state]\nurl = "{opts.redis_url}"\nnamespace = "{self.namespace}"\n' if opts.redis_url else ""
        gateway = f"[gateway]\ndrain_s = {opts.drain_s}\nsse_keepalive_s = {opts.keepalive_s}\n"
        config = self.tmp / f"{name}.toml"
        config.write_text(f'{state}{gateway}catalog_dir = "{self.tmp / name}"\n[servers.shop]\nurl = "{upstream_url}"\n')
        env = dict(
            os.environ, BREAKWATER_JOURNAL="off", BREAKWATER_CONNECT_STARTUP_JITTER_S="0", BREAKWATER_CONNECT_BACKOFF_BASE_S="0.2"
        )
        return Replica(name, lasting_port(), config, env, self.tmp / f"{name}.log")  # restarted on it

    async def rolling_restart(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) each replica in turn, start it again, wait until it is back in the balancer."""
        for replica in self.replicas:
            await replica.stop(signal.SIGKILL if kill else signal.SIGTERM)
            replica.start()
            await replica.wait_ready(self.http)
            # HAProxy puts it back after `rise` good checks.
            await anyio.sleep(0.5)

    def duplicates(self) -> int:
        """Executions beyond the first of each operation id in the ledger."""
        seen: dict[str, int] = {}
        for record in read_ledger(self.ledger):
            op = record.get("operation_id")
            if isinstance(op, str):
                seen[op] = seen.get(op, 0) + 1
        return sum(n - 1 for n in seen.values())

    async def __aexit__(self, *exc: object) -> None:
        for replica in self.replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                replica.proc.kill()
                replica.proc.wait()
        if self._haproxy is not None and self._haproxy.poll() is None:
            self._haproxy.terminate()
            self._haproxy.wait()
        await self.http.aclose()
        await self._stack.aclose()
        if self.options.redis_url:
            with contextlib.suppress(Exception):
                import redis

                client = redis.Redis.from_url(self.options.redis_url)
                keys = list(client.scan_iter(f"{self.namespace}:*"))
                if keys:
                    client.delete(*keys)
                client.close()


# ---- synthetic clients ---------------------------------------------------------------------------


@dataclass
class LoadStats:
    """What the clients saw."""

    calls: int = 0
    failed: int = 0
    not_found: int = 0
    reinits: int = 0
    #: Calls whose connection was cut before their answer (mid-stream, or a 502/504 before any of it).
    cut: int = 0
    #: Cut calls whose answer came through a reconnect with Last-Event-ID.
    resumed: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Calls whose answer was lost for good (cut and not resumed, a 502/503/504), each retried with its operation id.
    retried: int = 0
    #: ... of them calls of the mutating tool (with an operation id).
    cut_mutating: int = 0
    #: ... whose first retry was cut too (its replica was the next one killed), so they were retried once more.
    cut_again: int = 0
    #: ... whose retry got the first call's stored answer (`_meta["io.breakwater/replayed"]`): nothing ran twice.
    reconciled: int = 0
    #: ... whose retry was answered OUTCOME_UNKNOWN with the operation id (the first may have run; not run again).
    unknown: int = 0
    #: ... whose retry ran the call (read-only, or a mutating call the first attempt never got to start).
    rerun: int = 0
    #: ... whose retry got no answer either.
    unanswered: int = 0
    #: Cut calls resumed with Last-Event-ID on another replica and answered OUTCOME_UNKNOWN there: the replica running
    #: them died, so whether they ran is unknown (the follower's honest answer; no retry is made).
    resumed_unknown: int = 0

    def quantile(self, q: float) -> float:
        """The `q` latency quantile in seconds (nan without calls)."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _call_body(request_id: int, tool: str, operation_id: str | None, modern: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if operation_id is not None:
        meta[OPERATION_ID_META_KEY] = operation_id
    if modern:
        meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
        meta["io.modelcontextprotocol/clientInfo"] = {"name": "fleet-load", "version": "1"}
        meta["io.modelcontextprotocol/clientCapabilities"] = {}
    params = {"name": tool, "arguments": {}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _answer(body: bytes, request_id: int) -> dict[str, Any] | None:
    """The JSON-RPC response to `request_id` in a JSON body."""
    with contextlib.suppress(ValueError):
        message = json.loads(body)
        return message if isinstance(message, dict) and message.get("id") == request_id else None
    return None


class _Client:
    """One synthetic agent: calls at Poisson arrivals until told to stop."""

    def __init__(
        self, url: str, stats: LoadStats, rng: random.Random, *, modern: bool, mutating_share: float, slow_share: float
    ) -> None:
        self.url = url
        self.stats = stats
        self.rng = rng
        self.modern = modern
        self.mutating_share = mutating_share
        self.slow_share = slow_share
        self.session: str | None = None
        self.next_id = 0
        #: The last call's result (`_call_once`), to tell a replayed answer from a fresh one.
        self.last_result: dict[str, Any] = {}

    async def _initialize(self, http: httpx2.AsyncClient) -> None:
        params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "fleet-load", "version": "1"}}
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
        response = await http.post(self.url, json=body, headers=ACCEPT)
        response.raise_for_status()
        self.session = response.headers["mcp-session-id"]
        notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(self.url, json=notified, headers=self._headers(None))

    def _headers(self, tool: str | None) -> dict[str, str]:
        if self.modern:
            assert tool is not None
            return {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": tool}
        assert self.session is not None
        return {**ACCEPT, "mcp-protocol-version": "2025-11-25", "mcp-session-id": self.session}

    async def run(self, http: httpx2.AsyncClient, stop: anyio.Event, rate: float) -> None:
        while not stop.is_set():
            await anyio.sleep(self.rng.expovariate(rate))
            if stop.is_set():
                return
            await self.call(http)

    async def call(self, http: httpx2.AsyncClient) -> None:
        draw = self.rng.random()
        mutating = draw < self.mutating_share
        slow = not mutating and draw < self.mutating_share + self.slow_share
        tool = "shop__order" if mutating else "shop__report" if slow else "shop__work"
        operation_id = uuid.uuid4().hex if mutating else None
        started = time.monotonic()
        self.stats.calls += 1
        problem = await self._call_reinit(http, tool, operation_id)
        if problem is not None and problem.startswith(_CUT_MARKS):
            # The answer was lost, so the call may have run: retry through the balancer under the same
            # operation id; the gateway answers it from its record rather than running it twice. Once more
            # only if the retry's own replica was the next one killed.
            self.stats.retried += 1
            self.stats.cut_mutating += mutating
            for retry in range(_CUT_RETRIES):
                self.stats.cut_again += retry > 0
                # On a connection of its own: a pooled one may be one the balancer is closing as it is reused.
                async with httpx2.AsyncClient(timeout=http.timeout) as fresh:
                    problem = await self._call_reinit(fresh, tool, operation_id)
                if problem is None or not problem.startswith(_CUT_MARKS):
                    break
            if problem is None and (self.last_result.get("_meta") or {}).get(REPLAYED_META_KEY):
                self.stats.reconciled += 1
            elif problem is None:
                self.stats.rerun += 1
            elif problem == "isError OUTCOME_UNKNOWN":
                self.stats.unknown += 1
            else:
                self.stats.unanswered += 1
        if problem is None:
            self.stats.latencies.append(time.monotonic() - started)
        else:
            self.stats.failed += 1
            revision = "2026-07-28" if self.modern else "2025-11-25"
            self.stats.failures.append(f"{revision} {tool}: {problem}")

    async def _call_reinit(self, http: httpx2.AsyncClient, tool: str, operation_id: str | None) -> str | None:
        problem = await self._call_once(http, tool, operation_id)
        if problem == "404":
            # What a 2025-11-25 client does when its session is gone: initialize again and re-send.
            self.stats.not_found += 1
            self.stats.reinits += 1
            self.session = None
            problem = await self._call_once(http, tool, operation_id)
        return problem

    async def _call_once(self, http: httpx2.AsyncClient, tool: str, operation_id: str | None) -> str | None:
        """None when the call succeeded, else what went wrong ("404" for a lost session)."""
        resumed = False
        try:
            if not self.modern and self.session is None:
                await self._initialize(http)
            self.next_id += 1
            body = _call_body(self.next_id, tool, operation_id, self.modern)
            async with http.stream("POST", self.url, json=body, headers=self._headers(tool)) as response:
                if response.status_code == 404 and not self.modern:
                    return "404"
                if response.status_code != 200:
                    if response.status_code in (502, 504):
                        self.stats.cut += 1
                    return f"HTTP {response.status_code} {(await response.aread())[:120]!r}"
                if response.headers.get("content-type", "").startswith("application/json"):
                    answer = _answer(await response.aread(), self.next_id)
                    if answer is None:
                        return "a JSON body without the response"
                    last_event_id = None
                else:
                    answer, last_event_id = await read_stream(response, self.next_id)
                    if answer is None:
                        self.stats.cut += 1
                        if self.modern or last_event_id is None:
                            return "no response in the stream (cut)"
        except httpx2.HTTPError as exc:
            if isinstance(exc, httpx2.RemoteProtocolError | httpx2.ReadError):
                self.stats.cut += 1  # the connection died under the call (before any event id reached the client)
            return f"{type(exc).__name__}: {exc}"
        if answer is None:
            # 2025-11-25: what the SDK's client does with a cut stream whose events had ids.
            answer = await resume_stream(http, self.url, self._headers(None), last_event_id, self.next_id)
            if answer is None:
                return "cut, and the stream could not be resumed with Last-Event-ID"
            self.stats.resumed += 1
            resumed = True
        if "error" in answer:
            return f"JSON-RPC error {answer['error'].get('message')}"
        result = answer.get("result") or {}
        self.last_result = result
        if resumed and result.get("isError") and (result.get("structuredContent") or {}).get("code") == "OUTCOME_UNKNOWN":
            self.stats.resumed_unknown += 1
        if result.get("isError"):
            return f"isError {(result.get('structuredContent') or {}).get('code')}"
        return None


async def run_load(
    url: str,
    stop: anyio.Event,
    *,
    modern_clients: int = 3,
    legacy_clients: int = 3,
    rate: float = 4.0,
    mutating_share: float = 0.3,
    slow_share: float = 0.0,
    seed: int = 1,
) -> LoadStats:
    """Drive the clients until `stop` is set (then let each finish its call); what they saw."""
    stats = LoadStats()
    rng = random.Random(seed)
    clients = [
        _Client(
            url,
            stats,
            random.Random(rng.random()),
            modern=i < modern_clients,
            mutating_share=mutating_share,
            slow_share=slow_share,
        )
        for i in range(modern_clients + legacy_clients)
    ]
    limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=_KEEPALIVE_EXPIRY_S)
    async with httpx2.AsyncClient(timeout=60, limits=limits) as http, anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(client.run, http, stop, rate)
    return stats


@contextlib.asynccontextmanager
async def loaded(url: str, **kwargs: Any) -> AsyncIterator[LoadStats]:
    """Run `run_load` in the background of the block; the stats are complete once the block is left."""
    stop = anyio.Event()
    stats = LoadStats()

    async def drive() -> None:
        result = await run_load(url, stop, **kwargs)
        # Every field, so a new counter cannot be left behind.
        for f in dataclasses.fields(LoadStats):
            setattr(stats, f.name, getattr(result, f.name))

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        try:
            yield stats
        finally:
            stop.set()
