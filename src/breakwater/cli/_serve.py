"""`breakwater serve`: one MCP server in front of every configured server, over stdio or streamable HTTP."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from breakwater import _platform
from breakwater._platform import loop_options
from breakwater.cli._common import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_LISTEN,
    EXIT_OK,
    Parser,
    add_config_flag,
    fail,
    load_or_exit,
)
from breakwater.config import Config
from breakwater.errors import ConfigError

if TYPE_CHECKING:
    import asyncio

    from breakwater._clock import Clock

__all__ = ["parse_listen", "serve_main"]


#: What `serve` says when a person starts it in a terminal: it waited in silence for JSON-RPC, and what was typed got nothing.
_TERMINAL_HINT = (
    "breakwater: serving MCP on stdin and stdout, for an agent to start (e.g. claude mcp add breakwater -- breakwater serve); "
    "to look at your servers yourself: breakwater status, breakwater tools, breakwater demo (Ctrl-C ends this)"
)


def _from_a_terminal() -> bool:
    try:
        return os.isatty(0)
    except OSError:
        return False


def parse_listen(value: str) -> tuple[str, int]:
    """`[HOST:]PORT` (IPv6 hosts in brackets) as `(host, port)`; the host defaults to 127.0.0.1.

    What could only be read by guessing is refused with the spelling it needs: a URL (`http://127.0.0.1:8080` was
    taken as a host named `http://127.0.0.1`), a bare IPv6 address (`::1` was a host `:` on port 1), a port in
    other digits than ASCII's (`８０８０` was port 8080).
    """
    text = value.strip()
    if "://" in text:
        raise argparse.ArgumentTypeError(
            f"expected [HOST:]PORT, got the URL {value!r}: pass its host and port, e.g. 127.0.0.1:8080"
        )
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or not inside or not rest.startswith(":"):
            raise argparse.ArgumentTypeError(f"expected [IPV6]:PORT, got {value!r}, e.g. [::1]:8080")
        host, port = inside, rest[1:]
    elif text.count(":") > 1:
        raise argparse.ArgumentTypeError(
            f"expected [HOST:]PORT, got {value!r}: an IPv6 address goes in brackets, e.g. [::1]:8080"
        )
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = "127.0.0.1", text
    host = host.lower() or "127.0.0.1"  # host names are case-insensitive: LOCALHOST was "not loopback"
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535 or any(c.isspace() or c in "/@" for c in host):
        raise argparse.ArgumentTypeError(f"expected [HOST:]PORT, got {value!r}")
    return host, int(port)


def parse_allowed_host(value: str) -> str:
    """An `--allowed-host` NAME, as the Host header names it: `[v6]` and `name:port` taken without brackets or port.

    Values that could never match a Host header (a URL, a path, a wildcard, nothing) are refused: they were taken
    without a word and every request was then refused 421.
    """
    name = value.strip()
    if name.startswith("[") and "]" in name:  # [fd00::7] or [fd00::7]:8443
        name = name[1 : name.index("]")]
    elif name.count(":") == 1 and name.rpartition(":")[2].isdigit():  # gw.example.com:8443
        name = name.rpartition(":")[0]
    if not name or any(c in name for c in "/*@ ") or "://" in value:
        raise argparse.ArgumentTypeError(
            f"expected a host name or address as clients write it (gw.example.com, 10.0.0.5, [fd00::5]), got {value!r}"
        )
    return name.lower()


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen_failure(host: str, port: int, exc: OSError) -> str:
    """What went wrong binding `host:port`, and what to do instead, in one line."""
    where = f"{_shown(host)}:{port}"
    why = _platform.bind_error(exc)
    if why == "in_use":
        return (
            f"cannot listen on {where}: the port is in use; pass another port (--http {_shown(host)}:OTHERPORT, "
            "or --http 0 for any free one) or stop what listens there"
        )
    if why == "denied":
        return f"cannot listen on {where}: permission denied (ports below 1024 need privileges); pass a port above 1023"
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {where}: the host name {host!r} does not resolve; pass an IP address such as 127.0.0.1"
    if why == "unavailable":
        return f"cannot listen on {where}: {host} is not an address of this machine; listen on 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on {where}: {exc.strerror or exc}; pass another --http address"


def _graceful_server_class() -> Any:
    import asyncio

    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, minus its re-raise of SIGTERM/SIGINT after its own shutdown.

        uvicorn raises the signal again once the HTTP side has stopped, which kills the process
        before breakwater's shutdown runs: the journal's last batch was lost and stdio upstreams
        were left to notice on their own. The signal still stops the server; the process then
        exits once everything is closed: with code 0 after SIGTERM (a supervisor's stop), 130 after
        Ctrl-C (`interrupted`).
        """

        interrupted = False
        #: The gateway's `Drain`: a first SIGTERM or Ctrl-C drains it (`[gateway] drain_s`) before the server stops.
        drain: Any = None
        drain_s = 0.0
        _loop: asyncio.AbstractEventLoop | None = None
        _drain_task: asyncio.Future[None] | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                self.interrupted = signal.SIGINT in self._captured_signals
                self._captured_signals.clear()

        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # As over stdio: a first SIGTERM or Ctrl-C drains, a second cuts what is in flight at once (each call
            # answered with the drain's envelope), a third stops now. Ctrl-C stopped at once, and a call in flight
            # got a stream that ended with no answer at all.
            drain, loop = self.drain, self._loop
            if sig in (signal.SIGTERM, signal.SIGINT) and drain is not None and not self.should_exit and loop:
                self._captured_signals.append(sig)
                if not drain.draining:
                    drain.draining = True  # /readyz answers 503 from this instant
                    # A signal handler may only hand work to the loop; the drain itself runs there.
                    loop.call_soon_threadsafe(self._start_drain)
                    return
                if not drain.hurried:
                    loop.call_soon_threadsafe(drain.cut_now)
                    return
            super().handle_exit(sig, frame)

        def _start_drain(self) -> None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())

        async def _drain_then_exit(self) -> None:
            try:
                await self.drain.run(self.drain_s)
            finally:
                # Whatever is still open now is stuck: uvicorn's own wait for connections stays short.
                self.config.timeout_graceful_shutdown = 1
                self.should_exit = True

    return GracefulServer


def _announce(host: str, bound: int, port_file: str | None) -> None:
    from breakwater.gateway._http import LOOPBACK_HOSTS, WILDCARD_HOSTS

    shown = _shown(host)
    if host in WILDCARD_HOSTS:
        # `http://0.0.0.0:PORT` is no address a client can use: they name this machine (or use one of its addresses).
        shown = _shown(socket.gethostname())
        print(
            f"breakwater: listening on every interface ({_shown(host)}:{bound}); clients use this machine's name or one "
            "of its addresses (another name a client uses needs --allowed-host NAME)",
            file=sys.stderr,
        )
    print(f"breakwater: serving MCP on http://{shown}:{bound}/mcp", file=sys.stderr)
    print(f"breakwater: status page on http://{shown}:{bound}/ (also /metrics, /healthz, /readyz)", file=sys.stderr, flush=True)
    if host not in LOOPBACK_HOSTS:
        print("breakwater: non-loopback listener: every request needs the bearer token", file=sys.stderr)
    if port_file:
        Path(port_file).write_text(str(bound))


async def _serve_stdio(config: Config) -> int:
    from breakwater._startup import sdk_imports

    with sdk_imports():
        from breakwater.gateway._drain import drain_stdio
        from breakwater.gateway._open import open_gateway
        from breakwater.gateway._stdio_server import stdio_server

    stopped_by: list[int] = []
    async with open_gateway(config, one_client=True) as gateway:
        # The client went away (stdin closed) or a stop signal came: the calls in flight get `drain_s`.
        drain = partial(drain_stdio, gateway.drain, config.gateway.drain_s)
        # A second stop signal cuts what is still running at once, answered as the drain answers it.
        cut = gateway.drain.cut_now
        async with stdio_server(stopped_by, on_end=drain, cut=cut, server=gateway.server) as (read, write):
            await gateway.server.run(read, write, gateway.server.create_initialization_options())
        # The session is over, and its client signals this process 2 s after closing its stdin: the
        # upstreams are stopped within that (`connect._stdio.PROMPT_STOP_S`), not in the SDK's 2 s + 2 s.
        for spec in config.servers:
            process = gateway.bw.upstream(spec.name).process
            if process is not None:
                process.prompt_stop = True
    if signal.SIGINT in stopped_by:
        # Everything is closed (upstreams stopped); a Ctrl-C still reads as an interruption, as in every command.
        print("breakwater: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


async def _serve_http(
    config: Config,
    sock: socket.socket,
    host: str,
    token: str | None,
    port_file: str | None,
    allowed_hosts: tuple[str, ...],
    json_response: bool,
) -> int:
    from breakwater._startup import sdk_imports

    with sdk_imports():
        import uvicorn

        from breakwater.gateway._http import http_app
        from breakwater.gateway._known_heads import routing_protocol
        from breakwater.gateway._metrics import Metrics
        from breakwater.gateway._open import open_gateway

    bound = sock.getsockname()[1]
    # Over HTTP the gateway also serves /metrics and the status page, fed by every attempt.
    metrics = Metrics()
    async with (
        open_gateway(config, observers=[metrics]) as gateway,
        _session_store(config) as sessions,
        _operation_records(config, gateway),
        _stream_log(config, gateway.bw.clock) as streams,
    ):
        app = http_app(
            gateway,
            host=host,
            token=token,
            metrics=metrics,
            allowed_hosts=allowed_hosts,
            json_response=json_response,
            sessions=sessions,
            streams=streams,
        )
        # A call POST whose head the stack accepted before goes straight to its session's call path (_known_heads).
        routing = uvicorn.Config(app, log_level="warning", lifespan="on", http=routing_protocol())
        server = _graceful_server_class()(routing)
        server.drain, server.drain_s = gateway.drain, config.gateway.drain_s
        # Announced only now: from here to `serve` taking over SIGINT nothing awaits, so a Ctrl-C
        # sent on seeing the port is always uvicorn's graceful stop, never a cancelled start-up.
        _announce(host, bound, port_file)
        await server.serve(sockets=[sock])
    if server.interrupted:
        return fail("interrupted", EXIT_INTERRUPTED)
    return EXIT_OK


@contextlib.asynccontextmanager
async def _session_store(config: Config) -> AsyncIterator[Any]:
    """With a Redis `[state] url`, the store of 2025-11-25 sessions every replica shares; else None (in memory)."""
    if not config.state.url.startswith(("redis://", "rediss://", "unix://")):
        yield None
        return
    from breakwater.state._sessions import SessionStore

    store = SessionStore(config.state, ttl_s=config.gateway.session_ttl_s)
    try:
        yield store
    finally:
        await store.aclose()


@contextlib.asynccontextmanager
async def _operation_records(config: Config, gateway: Any) -> AsyncIterator[None]:
    """With a Redis `[state] url`, the fleet's records of forwarded operations, and this replica's lease in them."""
    import anyio

    if not config.state.url.startswith(("redis://", "rediss://", "unix://")):
        yield
        return
    from breakwater.state._operations import OperationRecords

    records = OperationRecords(config.state, ttl_s=config.gateway.operation_ttl_s, clock=gateway.bw.clock)
    gateway.operations = records
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(records.keep_alive)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        gateway.operations = None
        await records.aclose()


@contextlib.asynccontextmanager
async def _stream_log(config: Config, clock: Clock) -> AsyncIterator[Any]:
    """The events of resumable SSE streams: with a Redis `[state] url` every replica shares them, else this one keeps them
    (each stream dropped when its time is up); None with resumption off."""
    import anyio

    if config.gateway.resume_events <= 0:
        yield None
        return
    from breakwater.state._streams import RedisStreamLog, memory_stream_log

    if not config.state.url.startswith(("redis://", "rediss://", "unix://")):
        memory = memory_stream_log(config.gateway, clock)
        async with anyio.create_task_group() as tg:
            tg.start_soon(memory.sweep)
            yield memory
            tg.cancel_scope.cancel()
        return

    log = RedisStreamLog(config.state, events=config.gateway.resume_events, ttl_s=config.gateway.resume_ttl_s)
    try:
        yield log
    finally:
        await log.aclose()


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater serve",
        description="Serve every configured server's tools as one MCP server, through the call gate. "
        "stdio by default (what Claude Code, Cursor, Claude Desktop and VS Code launch).",
    )
    add_config_flag(parser)
    parser.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        type=parse_listen,
        help="serve streamable HTTP instead (default host 127.0.0.1; any other host needs --token; port 0 picks a free one)",
    )
    parser.add_argument("--token", help="bearer token HTTP clients must send (default: $BREAKWATER_TOKEN)")
    parser.add_argument(
        "--state",
        metavar="URL",
        help="share breaker and retry-budget state with other replicas: redis://HOST:PORT/DB "
        "(default: [state] url, $BREAKWATER_STATE_URL, else in-process)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        type=parse_allowed_host,
        default=[],
        metavar="NAME",
        help="a Host name clients use to reach a non-loopback listener (repeatable; the listen address and, "
        "on 0.0.0.0 or ::, this machine's host name are always allowed)",
    )
    parser.add_argument(
        "--json-response",
        action="store_true",
        help="answer 2025-11-25 HTTP requests with plain JSON instead of an SSE stream: faster, but progress, "
        "log messages, sampling and elicitation cannot reach those clients mid-call (2026-07-28 clients are "
        "unaffected: they get JSON whenever nothing is streamed)",
    )
    parser.add_argument(
        "--no-share",
        action="store_true",
        help="over stdio, run this session's own gateway instead of attaching to the user's shared one "
        "(also [gateway] share = false, BREAKWATER_SHARE=off)",
    )
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    return parser


@contextlib.contextmanager
def _hangup_as_terminate() -> Iterator[list[int]]:
    """While inside, SIGHUP and SIGQUIT do what SIGTERM does in whichever mode runs; the list says which one came.

    A hang-up is how an interactive `serve` usually ends (its terminal closed), or a supervisor's stop; `serve` exits
    with the shell's code for the signal, 128 + its number (129, 131).

    Why. Their default action killed `serve` at once, in every mode: no drain, and the stdio upstreams
    were left running with no parent (one that ignores the end of its stdin runs on for good). Each mode
    already stops cleanly on SIGTERM, through its own receiver (the stdio transport's handlers, uvicorn's,
    the attached session's interrupt), so each is raised again as SIGTERM rather than handled once
    more per mode. POSIX only (Windows has neither); a no-op outside the main thread, like every handler.
    """
    hung_up: list[int] = []
    signals = _platform.ENDING_SIGNALS
    if not signals or threading.current_thread() is not threading.main_thread():
        yield hung_up
        return

    def forward(signum: int, _frame: FrameType | None) -> None:
        hung_up.append(signum)
        signal.raise_signal(_platform.TERMINATE_SIGNAL)

    previous = {signum: signal.signal(signum, forward) for signum in signals}
    try:
        yield hung_up
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _terminate_noted() -> Iterator[list[int]]:
    """While inside, a `TERMINATE_SIGNAL` still does what it did (`cli._run`: what Ctrl-C does), and the list says it came.

    Why. Until a mode's own receiver runs (the stdio transport's handlers, uvicorn's), SIGTERM stops `serve`
    as an interruption: 130 and "interrupted", where a supervisor's stop of a `serve` that had just
    started (nothing sent yet) should exit 0, as it does a moment later. No-op outside the main thread.
    """
    terminated: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield terminated
        return
    previous = signal.getsignal(_platform.TERMINATE_SIGNAL)

    def note(signum: int, frame: FrameType | None) -> None:
        terminated.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(_platform.TERMINATE_SIGNAL, note)
    try:
        yield terminated
    finally:
        signal.signal(_platform.TERMINATE_SIGNAL, previous)


def _interruption(exc: BaseException) -> bool:
    """Whether `exc` is a KeyboardInterrupt, alone or as the only kind in a group (what SIGTERM becomes here)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        interrupts, rest = exc.split(KeyboardInterrupt)
        return interrupts is not None and rest is None
    return False


def serve_main(argv: list[str]) -> int:
    """`breakwater serve`; a hang-up (or SIGQUIT) ends it as SIGTERM does, with 128 + its number (`_hangup_as_terminate`)."""
    with _hangup_as_terminate() as hung_up, _terminate_noted() as terminated:
        try:
            code = _serve_main(argv)
        except BaseException as exc:
            # SIGTERM while no mode's receiver runs is an interruption (`cli._run`): after a hang-up it is still
            # one, and after SIGTERM alone a clean stop (exit 0, as once a mode runs); Ctrl-C stays `interrupted`.
            if (hung_up or terminated) and _interruption(exc):
                return 128 + hung_up[0] if hung_up else EXIT_OK
            raise
    return 128 + hung_up[0] if hung_up else code


def _serve_main(argv: list[str]) -> int:
    """`breakwater serve`: one MCP server in front of every configured server.

    Over stdio the attach path (`attach_or_none`) runs before anything imports asyncio or anyio:
    at a cold start this session may be the one that forks the shared gateway, and the sooner it
    decides the sooner the gateway's imports start (14 sessions start on the same cores).
    """
    from breakwater.config._checks import check_listener_token
    from breakwater.gateway._listen import tcp_listener
    from breakwater.gateway._start import reserve_standard_fds

    args = _parser().parse_args(argv)
    # Over stdio nothing listens: a token there protects nothing, and one that looks set would be trusted.
    http_only = [flag for flag, given in (("--token", args.token), ("--allowed-host", args.allowed_host),
                 ("--json-response", args.json_response)) if given]  # fmt: skip
    if args.http is None and http_only:
        return fail(
            f"{', '.join(http_only)}: only for --http (over stdio nothing listens); add --http [HOST:]PORT or drop it",
            EXIT_CONFIG,
        )
    token = args.token or os.environ.get("BREAKWATER_TOKEN") or None
    if args.http and (problem := check_listener_token(args.http[0], token)):
        print(problem, file=sys.stderr)
        return EXIT_CONFIG
    config = load_or_exit(args.config)
    if args.state is not None:
        try:
            config = replace(config, state=replace(config.state, url=args.state))
        except ConfigError as exc:
            return fail(f"--state: {exc}", EXIT_CONFIG)
    if args.http is None:
        reserve_standard_fds()  # a closed stdin must not become the event loop's descriptor
        if _from_a_terminal():
            print(_TERMINAL_HINT, file=sys.stderr, flush=True)
        if not args.no_share:
            from breakwater.cli._gateway import attach_or_none

            attached = attach_or_none(config, args.state)
            if attached is not None:
                return attached
        import anyio

        _platform.return_large_frees()
        stdio_code: int = anyio.run(_serve_stdio, config, backend_options=loop_options(config.gateway.event_loop))
        return stdio_code
    host, port = args.http
    try:
        # Bound before any server is started: a busy port is one line and no upstream was spawned for nothing.
        sock = tcp_listener(host, port)
    except OSError as exc:
        return fail(_listen_failure(host, port, exc), EXIT_LISTEN)
    import anyio

    _platform.return_large_frees()
    with sock:
        http_code: int = anyio.run(
            _serve_http,
            config,
            sock,
            host,
            token,
            args.port_file,
            tuple(args.allowed_host),
            args.json_response,
            backend_options=loop_options(config.gateway.event_loop),
        )
    return http_code
