"""The shared local gateway: one `Gateway` for every session of a user and config, each with its own MCP session.

`breakwater gateway run` (started by the first `breakwater serve` that finds none, detached) opens
the gateway once (its upstreams, breakers, retry budget and journal are the ones every session
uses) and listens on the fingerprint's Unix socket. Each accepted connection, after the handshake
(`breakwater.gateway._share`), is one run of the SDK's server loop, exactly as `serve` runs it over
stdin and stdout: on the agent's own stdin and stdout when the session handed them over with its
handshake (`breakwater.gateway._handoff`, the usual case), else over the socket, with the session's
own stdio servers beside the shared ones (`breakwater.gateway._session`), started in the session's
own directory and environment as the handshake gives them (`SessionContext`): the session has its
own capabilities, log level, subscriptions, cancellations and progress, and what an upstream asks
during a call (sampling, elicitation) goes to the session whose call it is, as with HTTP clients of
one gateway.

With no session attached for `[gateway] share_idle_s` the gateway closes everything and exits.

`breakwater gateway stop` (or SIGTERM) drains it, as `serve` drains on SIGTERM: the socket goes at once
(a session failing over starts the next gateway), each session reads no more of its agent's input
(what the agent sends meanwhile waits in its pipe for its `serve`), its calls in flight get
`[gateway] drain_s` to finish and the rest are cut with the gate's envelope (`_drain`); then the
session lets go of its agent's output before its server stops, so whatever is still unanswered is
answered by its `serve`, as after a crash (never the SDK's bare "Connection closed"), and its `serve`
relays on through the next gateway. The stop's connection closes when the drain is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from breakwater._clock import Clock
from breakwater._platform import running_loop
from breakwater.config import Config
from breakwater.connect._lines import HandOffReader
from breakwater.gateway._drain import CUT_GRACE_S, drain_stdio
from breakwater.gateway._fast_call import FastLane
from breakwater.gateway._handed import CLOSE_WAIT_S, HandedOutput, Mirror, MirroredReader, MirrorSocket, tell_tools, until_closed
from breakwater.gateway._handoff import CAN_HAND_OFF, handable, is_pipe
from breakwater.gateway._server import Gateway
from breakwater.gateway._session import session_gateway
from breakwater.gateway._share import SessionContext, bind_socket, peer_uid, pid_path, turn_away
from breakwater.gateway._stdio_server import (
    MAX_LINE_BYTES,
    Ending,
    LineOutput,
    pump_input,
    pump_output,
    transport_file,
)
from breakwater.status import ServerState, ServerStatus, StatusReport

__all__ = ["SharedGateway", "bind_socket", "listening"]

logger = logging.getLogger("breakwater.gateway.shared")

_HANDSHAKE_S = 5.0  # a connection that says nothing for this long is no session
_STDIO_POLL_S = 0.002  # how often the socket is looked at for a session's descriptors (they follow our answer at once)


class _SocketOutput(LineOutput):
    """Whole lines to one attached session's socket."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        super().__init__(None, fast=True)  # no descriptor: `send` below is the only way out
        self._sock_writer = writer
        self._closed = False

    async def send(self, data: bytes) -> None:
        async with self._lock:
            if self._closed:  # let go at a stop: what is unanswered is the session's `serve`'s to answer
                return
            self._sock_writer.write(data)
            await self._sock_writer.drain()

    async def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError, RuntimeError):
            self._sock_writer.close()


class SharedGateway:
    """Serves attached sessions over a Unix socket until it has been idle for `idle_s`."""

    def __init__(self, gateway: Gateway, config: Config, *, fingerprint: str, version: str, idle_s: float, clock: Clock) -> None:
        """`gateway` is opened on `config`'s shared servers; each session adds its own stdio servers (`_session.py`)."""
        self.gateway = gateway
        self.config = config
        self.fingerprint = fingerprint
        self.version = version
        # Absolute: `gateway list` may run in another directory than the session that started it.
        self.config_path = os.path.abspath(config.path) if config.path else config.path
        self.idle_s = idle_s
        self.clock = clock
        self.sessions = 0
        #: The gateways of the attached sessions that run servers of their own (what `status` reports for those).
        self._own_views: set[Gateway] = set()
        self._arriving = 0  # connections accepted whose handshake is not over: no idle exit under them
        self.started = clock.time()
        self._changed = anyio.Event()
        self._stop = anyio.Event()
        self._idle_since = clock.monotonic()

    def info(self, *, ok: bool = True, reason: str | None = None) -> dict[str, Any]:
        """The handshake answer: who this gateway is and how many sessions it serves."""
        answer: dict[str, Any] = {
            "breakwater": "gateway",
            "ok": ok,
            "pid": os.getpid(),
            "version": self.version,
            "fingerprint": self.fingerprint,
            "sessions": self.sessions,
            "config": self.config_path,
            "started": self.started,
            "event_loop": running_loop(),
        }
        if reason is not None:
            answer["reason"] = reason
        return answer

    def _note(self, delta: int) -> None:
        self.sessions += delta
        if delta:
            # Idle is counted from the last session's coming or going: a look (`gateway list`, `status`) is no session,
            # and one every few seconds kept an idle gateway, and its servers, alive for ever.
            self._idle_since = self.clock.monotonic()
        self._changed.set()
        self._changed = anyio.Event()

    async def serve(self, listener: socket.socket) -> None:
        """Accept sessions until idle for `idle_s` (or told to stop: they drain first); then return, every session closed."""
        loop = asyncio.get_running_loop()
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as accepting:
                tg.start_soon(self._exit_when_idle, accepting)
                while True:
                    conn, _ = await loop.sock_accept(listener)
                    self._arriving += 1
                    self._note(0)
                    tg.start_soon(self._connection, conn, name="breakwater shared session")
            # Nobody is accepted from here on: a session that fails over, or arrives now, starts the next gateway.
            turn_away(listener)
            listener.close()
            await self._until_drained()
            tg.cancel_scope.cancel()

    def stop(self) -> None:
        """End `serve`: every session drains, then lets go (their `serve` processes fail over to a new gateway)."""
        self._stop.set()
        self._note(0)

    async def _until_drained(self) -> None:
        """Wait for the sessions a stop drains (`_drained`) to end, for at most their window and its grace."""
        if not self._stop.is_set():
            return
        deadline = self.clock.monotonic() + self.config.gateway.drain_s + CUT_GRACE_S + CLOSE_WAIT_S + 1.0
        with self.clock.deadline_scope(deadline):
            while self.sessions or self._arriving:
                await self._changed.wait()

    def _ending(self, gateway: Gateway) -> Ending:
        """A session's drain: its calls in flight get `[gateway] drain_s`, the rest are cut with the gate's envelope.

        Run once, by whichever comes first: the agent's end of input (`_run`) or the gateway's stop (`_drained`).
        Without it at the end of input, a call in flight was answered a bare -32000 "Connection closed" and cut
        halfway in the shared gateway, where a `serve --no-share` session let it finish and answered it.
        """
        return Ending(partial(drain_stdio, gateway.drain, self.config.gateway.drain_s), gateway.drain.cut_now)

    async def _drained(
        self,
        ending: Ending,
        pause: Callable[[], None],
        let_go: Callable[[], Awaitable[None]],
        session: anyio.CancelScope,
    ) -> None:
        """At a stop: `pause` the session's input, drain it (`_ending`), then `let_go` of its output before its server
        stops, and end the `session`."""
        await self._stop.wait()
        pause()
        await ending.run()  # the requests read already reach their handlers first, and count
        await let_go()
        session.cancel()

    async def _asked_to_stop(
        self, ending: Ending, reader: MirroredReader, output: HandedOutput, mirror: Mirror, session: anyio.CancelScope
    ) -> None:
        """A stop signal reached the session's `serve` (`_handoff.STOP`): end the session as it ends a `serve --no-share`
        one. The calls in flight drain and their answers go out, then `E`; meanwhile each new request is refused at
        once (`Ending.refusing`), nothing run. Pausing the input instead (as a gateway stop does, for the next gateway)
        left them unanswered: no next gateway reads them, the session is over."""
        ending.refusing.on = True
        reader.hand_off = None  # every line to the refusing pump: the lane takes no new call
        await ending.run()
        await output.close()
        mirror.ended()
        session.cancel()

    async def _serve_gone(self, ending: Ending, reader: MirroredReader, output: HandedOutput) -> None:
        """The session's socket closed: its `serve` is gone (a second stop signal exits it at once, or it was killed).

        The calls in flight are cut now through the drain (`Ending.cut`: `Drain.cut_now`), whether or not a first
        signal began it, and their envelopes (OUTCOME_UNKNOWN naming the operation for a mutating call) are written
        to the agent's pipe, which this gateway still holds, so the agent reads them before its end of the session,
        as `serve --no-share` answers them at a second Ctrl-C. Cancelled at once instead, the session answered them
        the SDK's bare -32000 "Connection closed". Nothing new is run meanwhile (`Ending.refusing`).
        """
        ending.refusing.on = True
        reader.hand_off = None  # every line to the refusing pump: the lane takes no new call
        if ending.cut is not None:
            ending.cut()  # idempotent: a second signal's `STOP` may have cut already
        await ending.run()  # the cut's answers are written by its end (`drain_stdio`)
        await output.close()

    async def _exit_when_idle(self, scope: anyio.CancelScope) -> None:
        while not self._stop.is_set():
            changed = self._changed
            if self.sessions or self._arriving:
                await changed.wait()
                continue
            with self.clock.deadline_scope(self._idle_since + self.idle_s) as waiting:
                await changed.wait()
            if waiting.cancelled_caught and not (self.sessions or self._arriving):
                logger.info("no session for %.1f s: exiting", self.idle_s)
                break
        scope.cancel()

    async def _connection(self, conn: socket.socket) -> None:
        stdio: list[int] = []  # the session's stdin, stdout and bell, when it hands them over (`_handoff`)
        arriving = True

        def arrived(delta: int) -> None:  # the handshake is over: a session (+1), or none (0)
            nonlocal arriving
            if arriving:
                arriving = False
                self._arriving -= 1
                self._note(delta)

        try:
            # `asyncio.open_unix_connection`, with the reader that hands calls to the session's lane. The socket is a
            # transport's from the start: uvloop's `add_reader` (and `sock_recv`) on a descriptor that then becomes a
            # transport's can leave the transport deaf (the poll handle's deferred close deletes it from epoll).
            loop = asyncio.get_running_loop()
            reader = HandOffReader(limit=MAX_LINE_BYTES, loop=loop)
            protocol = MirrorSocket(reader, loop=loop)
            transport, _ = await loop.create_unix_connection(lambda: protocol, sock=conn)
        except OSError:
            conn.close()
            arrived(0)
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        try:
            line = b""
            with self.clock.deadline_scope(self.clock.monotonic() + _HANDSHAKE_S):
                line = await reader.readline()
            hello, answer = self._handshake(conn, line)
            if answer.get("handoff"):
                transport.pause_reading()  # the descriptors come with the next byte: for `_stdio_of`, not the reader
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
            if hello is None:
                return
            if hello["breakwater"] == "stop":
                logger.info("asked to stop (breakwater gateway stop): draining")
                arrived(0)  # no session: the drain does not wait for this connection
                self.stop()
                await anyio.sleep_forever()  # closed when the drain is over: `gateway stop` waits for that
            if hello["breakwater"] != "attach":
                return
            if answer.get("handoff"):
                stdio = await self._stdio_of(conn)
                if not stdio:  # it never came: the session finds its socket closed and serves on its own
                    return
                transport.resume_reading()
            context = SessionContext.from_json(hello.get("session"))
            arrived(+1)
            try:
                if stdio:
                    handed, stdio = stdio, []
                    await self._handed_session(handed, reader, writer, protocol, context)
                else:
                    await self._session(reader, _SocketOutput(writer), context)
            finally:
                self._note(-1)
        except (OSError, EOFError, asyncio.IncompleteReadError):
            logger.debug("an attached session went away", exc_info=True)
        except Exception:  # one session's failure ends that session, never the gateway every other session is on
            logger.exception("an attached session failed")
        finally:
            arrived(0)
            for fd in stdio:
                os.close(fd)
            transport.close()

    def _handshake(self, conn: socket.socket, line: bytes) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The session's first line (what it wants: "attach", "info", "stop") and the answer; no hello when refused.

        Nothing of it is logged: an attaching session's line carries its environment (`SessionContext`). That may be
        megabytes (a Nix shell's, a CI job's): the line is bounded by the reader's limit (`MAX_LINE_BYTES`) alone. Cut
        at 64 KiB, as it was, every session of an environment past that served itself, told "not a breakwater session".
        """
        try:
            hello = json.loads(line) if line else None
        except ValueError:
            hello = None
        uid = peer_uid(conn)
        want = hello.get("breakwater") if isinstance(hello, dict) else None
        reason: str | None = None
        if want not in ("attach", "info", "stop"):
            reason = "not a breakwater session (expected a handshake line)"
        elif uid is not None and hasattr(os, "getuid") and uid != os.getuid():
            reason = f"this gateway serves uid {os.getuid()} only"
        elif want == "attach" and isinstance(hello, dict) and hello.get("fingerprint") != self.fingerprint:
            reason = "another config: this gateway serves a different one"
        elif want == "attach" and isinstance(hello, dict) and hello.get("version") != self.version:
            reason = f"this gateway runs breakwater {self.version}; restart it (breakwater gateway stop) to use another"
        answer = self.info(ok=reason is None, reason=reason)
        if reason is not None or not isinstance(hello, dict):
            return None, answer
        if want == "info":
            answer["status"] = self.gateway.bw.status().to_json()
            if hello.get("sessions") is True and self._own_views:
                # The sessions' own stdio servers, as the session that fares worst with each sees it: `status` reported
                # a fresh connection of its own ("ready") while the agent's calls were refused (its copy was killed).
                answer["sessions_status"] = _worst_of([view.bw.status() for view in self._own_views]).to_json()
        elif want == "attach":
            if hello.get("handoff") is True and CAN_HAND_OFF:
                answer["handoff"] = True  # send your stdin and stdout (`_handoff`)
            # What `serve --no-share` prints on its stderr, where the agent keeps it: the gateway's own went to its log.
            journal = self.gateway.bw.journal
            if journal is not None and (trouble := journal.trouble()) is not None:
                answer["warnings"] = [trouble]
        return hello, answer

    async def _stdio_of(self, conn: socket.socket) -> list[int]:
        """The session's stdin, stdout and bell, sent after our answer; [] (any received closed) if not all, in time.

        Read from the socket itself while its transport is paused, polling on the clock: they come at once, and a
        reader added to the loop for this descriptor would outlive the wait (see `_connection`).
        """
        received: list[int] | None = None
        deadline = self.clock.monotonic() + _HANDSHAKE_S
        while received is None and self.clock.monotonic() < deadline:
            try:
                data, fds, _flags, _address = socket.recv_fds(conn, 1, 3)
                received = list(fds) if data or fds else []
                # Received descriptors are inheritable (PEP 446 covers only those Python opens). The stdio servers
                # this gateway then starts on uvloop inherited them, the bell's write end among them: the session's
                # `serve` heard its session end only when every such server had exited, 2 s after its client left
                # with a server that ignores the end of its input (the npm "everything" one), so the client signalled it.
                for fd in received:
                    os.set_inheritable(fd, False)
            except BlockingIOError:
                await self.clock.sleep(_STDIO_POLL_S)
        received = received or []
        if len(received) == 3 and handable(received[0]) and handable(received[1]) and is_pipe(received[2]):
            return received
        for fd in received:
            os.close(fd)
        return []

    async def _handed_session(
        self,
        stdio: list[int],
        sock_reader: asyncio.StreamReader,
        sock_writer: asyncio.StreamWriter,
        protocol: MirrorSocket,
        context: SessionContext | None,
    ) -> None:
        """One MCP session on the stdin and stdout its `serve` handed over, mirrored to its socket (`_handoff`).

        It ends when the agent closes its input (the mirror then says so), when the gateway stops, or when
        the socket closes (its `serve` was stopped: the agent's pipes are let go at once).
        """
        loop = asyncio.get_running_loop()
        in_fd, out_fd, bell = stdio
        mirror = Mirror(sock_writer.transport, bell, self.clock)
        protocol.attach(mirror)
        output = HandedOutput(out_fd, mirror, self.clock)
        reader = MirroredReader(mirror, limit=MAX_LINE_BYTES, loop=loop)
        read_transport: asyncio.BaseTransport | None = None
        try:
            try:
                # On a copy: uvloop's transports close the descriptor they drive, whatever its file object says.
                read_transport, _ = await loop.connect_read_pipe(
                    lambda: asyncio.StreamReaderProtocol(reader, loop=loop), transport_file(in_fd, "rb")
                )
            finally:
                os.close(in_fd)
            mirror.input = read_transport  # duck-typed: uvloop's is no subclass of asyncio's (no isinstance here)
            # An agent that stopped reading ends its session as one that closed its input does (`serve` sees `E`).
            output.on_broken = read_transport.close
            await output.open(loop)
            async with self._session_gateway(context) as gateway:
                ending = self._ending(gateway)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(mirror.flushing)
                        tg.start_soon(tell_tools, gateway, mirror)
                        asked = partial(self._asked_to_stop, ending, reader, output, mirror, tg.cancel_scope)
                        gone = partial(self._serve_gone, ending, reader, output)
                        tg.start_soon(until_closed, sock_reader, tg.cancel_scope, asked, gone)
                        tg.start_soon(self._drained, ending, mirror.stop_input, partial(mirror.let_go, output), tg.cancel_scope)
                        await self._run(gateway, reader, output, ending)
                        mirror.ended()
                        tg.cancel_scope.cancel()
                finally:
                    # Before the session's own servers are stopped: the agent sees its session end at once.
                    await output.close()
                    if read_transport is not None:
                        read_transport.close()
        finally:  # again, for a session that failed to start: each is closed once
            await output.close()
            if read_transport is not None:
                read_transport.close()
            mirror.close()

    async def _session(self, reader: asyncio.StreamReader, output: _SocketOutput, context: SessionContext | None) -> None:
        """One MCP session over the socket, until either side closes it; its own servers start in `context`."""
        async with self._session_gateway(context) as gateway, anyio.create_task_group() as tg:
            ending = self._ending(gateway)
            # Its input is read on through the drain: what `serve` wrote to the socket and we never read would be
            # answered OUTCOME_UNKNOWN by it, though it never ran.
            tg.start_soon(self._drained, ending, lambda: None, output.close, tg.cancel_scope)
            await self._run(gateway, reader, output, ending)
            tg.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def _session_gateway(self, context: SessionContext | None) -> AsyncIterator[Gateway]:
        """`session_gateway`, known to `info` while it serves when it runs servers of its own; a view of its own
        (`_view`) when it runs none."""
        async with session_gateway(self.gateway, self.config, context) as gateway:
            if gateway is self.gateway:
                async with self._view() as view:
                    yield view
                return
            self._own_views.add(gateway)
            try:
                yield gateway
            finally:
                self._own_views.discard(gateway)

    @contextlib.asynccontextmanager
    async def _view(self) -> AsyncIterator[Gateway]:
        """A session's own view of the shared servers, as a session with servers of its own has one.

        Why: a session's end drains its calls in flight (`_ending`) with its gateway's `Drain`. On the shared
        gateway itself, with no per-session server in the config, one session's end (its agent closed its input, or
        Ctrl-C) waited for every session's calls, cut another session's long call OUTCOME_UNKNOWN, and left the
        drain cutting: from then on every call of every session was refused as cut, until the gateway idled out."""
        shared = self.gateway
        view = Gateway(shared.bw, self.config.gateway, catalog=shared.catalog, relay=shared.relay, view_of=shared)
        async with anyio.create_task_group() as tg:
            tg.start_soon(view.watch)
            yield view
            tg.cancel_scope.cancel()

    async def _run(self, gateway: Gateway, reader: asyncio.StreamReader, output: LineOutput, ending: Ending) -> None:
        server = gateway.server
        read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
        write_stream, write_stream_reader = create_context_streams[SessionMessage](0)

        lane = FastLane(server, output.send)

        async def read() -> None:
            async with read_stream_writer, lane.serving():
                await pump_input(reader, read_stream_writer, output, lane, ending.refusing)
                # The agent closed its input: the session ends once its calls in flight are answered (`_ending`).
                await ending.run()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(pump_output, write_stream_reader, output)
            await server.run(read_stream, write_stream, server.create_initialization_options())
            tg.cancel_scope.cancel()
        # The session is over for its client now: its `serve` exits while its own servers are still being stopped.
        await output.close()


@contextlib.asynccontextmanager
async def listening(path: Path, listener: socket.socket | None = None) -> AsyncIterator[socket.socket | None]:
    """`bind_socket(path)` (or `listener`, bound there already), the socket file removed on exit if still this gateway's.

    Beside it, this process's pid (`pid_path`): the socket's peer credentials name the session that bound it, and a
    gateway that cannot answer (stopped) can only be named, and told apart from one starting, from there.
    """
    listener = listener if listener is not None else bind_socket(path)
    if listener is None:
        yield None
        return
    inode = path.stat().st_ino
    pid_file = pid_path(path)
    with contextlib.suppress(OSError):
        fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(f"{os.getpid()}\n")
    try:
        yield listener
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if path.stat().st_ino == inode:
                path.unlink()
                pid_file.unlink()


def _worst_of(reports: list[StatusReport]) -> StatusReport:
    """One report from the sessions' own: each server as the session that fares worst with it sees it."""
    worst: dict[str, ServerStatus] = {}
    for report in reports:
        for server in report.servers:
            known = worst.get(server.name)
            if known is None or _BADNESS.index(server.state) > _BADNESS.index(known.state):
                worst[server.name] = server
    return StatusReport(servers=tuple(worst.values()), timeouts=reports[0].timeouts)


#: Server states from the best to the worst, as a session that cannot use the server meets them.
_BADNESS = (
    ServerState.DISABLED,
    ServerState.READY,
    ServerState.PENDING,
    ServerState.CONNECTING,
    ServerState.RETRYING,
    ServerState.FAILED,
)
