"""The shared local gateway: one `Gateway` for every session of a user and config, each with its own MCP session.

`breakwater gateway run` (started by the first `breakwater serve` that finds none, detached) opens
the gateway once (its upstreams, breakers, retry budget and journal are the ones every session
uses) and listens on the fingerprint's Unix socket. Each accepted connection, after the handshake
(`breakwater.gateway._share`), is one run of the SDK's server loop over that socket, exactly as
`serve` runs it over stdin and stdout, with the session's own stdio servers beside the shared ones
(`breakwater.gateway._session`), started in the session's own directory and environment as
the handshake gives them (`SessionContext`): the session has its own capabilities, log level,
subscriptions, cancellations and progress, and what an upstream asks during a call (sampling,
elicitation) goes to the session whose call it is, as with HTTP clients of one gateway.

With no session attached for `[gateway] share_idle_s` the gateway closes everything and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from breakwater._clock import Clock
from breakwater._platform import running_loop
from breakwater.config import Config
from breakwater.connect._lines import HandOffReader
from breakwater.gateway._fast_call import FastLane
from breakwater.gateway._server import Gateway
from breakwater.gateway._session import session_gateway
from breakwater.gateway._share import HANDSHAKE_LIMIT, SessionContext, bind_socket, peer_uid
from breakwater.gateway._stdio_server import MAX_LINE_BYTES, LineOutput, pump_input, pump_output

__all__ = ["SharedGateway", "bind_socket", "listening"]

logger = logging.getLogger("breakwater.gateway.shared")

_HANDSHAKE_S = 5.0  # a connection that says nothing for this long is no session


class _SocketOutput(LineOutput):
    """Whole lines to one attached session's socket."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        super().__init__(None, fast=True)  # no descriptor: `send` below is the only way out
        self._sock_writer = writer

    async def send(self, data: bytes) -> None:
        async with self._lock:
            self._sock_writer.write(data)
            await self._sock_writer.drain()

    async def close(self) -> None:
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
        self.started = clock.time()
        self._changed = anyio.Event()
        self._stop = anyio.Event()

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
        self._changed.set()
        self._changed = anyio.Event()

    async def serve(self, listener: socket.socket) -> None:
        """Accept sessions until idle for `idle_s` (or told to stop); then return, with every session closed."""
        loop = asyncio.get_running_loop()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._exit_when_idle, tg.cancel_scope)
            while True:
                conn, _ = await loop.sock_accept(listener)
                tg.start_soon(self._connection, conn, name="breakwater shared session")

    def stop(self) -> None:
        """End `serve`: every session is closed (their `serve` processes fail over to a new gateway)."""
        self._stop.set()
        self._note(0)

    async def _exit_when_idle(self, scope: anyio.CancelScope) -> None:
        while not self._stop.is_set():
            changed = self._changed
            if self.sessions:
                await changed.wait()
                continue
            with self.clock.deadline_scope(self.clock.monotonic() + self.idle_s) as waiting:
                await changed.wait()
            if waiting.cancelled_caught and not self.sessions:
                logger.info("no session for %.1f s: exiting", self.idle_s)
                break
        scope.cancel()

    async def _connection(self, conn: socket.socket) -> None:
        try:
            # `asyncio.open_unix_connection`, with the reader that hands calls to the session's lane.
            loop = asyncio.get_running_loop()
            reader = HandOffReader(limit=MAX_LINE_BYTES, loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            transport, _ = await loop.create_unix_connection(lambda: protocol, sock=conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        except OSError:
            conn.close()
            return
        output = _SocketOutput(writer)
        try:
            hello = await self._handshake(conn, reader, output)
            if hello is not None and hello["breakwater"] == "attach":
                self._note(+1)
                try:
                    await self._session(reader, output, SessionContext.from_json(hello.get("session")))
                finally:
                    self._note(-1)
        except (OSError, EOFError, asyncio.IncompleteReadError):
            logger.debug("an attached session went away", exc_info=True)
        finally:
            await output.close()

    async def _handshake(self, conn: socket.socket, reader: asyncio.StreamReader, output: _SocketOutput) -> dict[str, Any] | None:
        """The session's first line (what it wants: "attach", "info", "stop"), answered; None when refused.

        Nothing of it is logged: an attaching session's line carries its environment (`SessionContext`).
        """
        line = b""
        with self.clock.deadline_scope(self.clock.monotonic() + _HANDSHAKE_S):
            line = await reader.readline()
        try:
            hello = json.loads(line[:HANDSHAKE_LIMIT]) if line else None
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
        if reason is None and want == "info":
            answer["status"] = self.gateway.bw.status().to_json()
        await output.send(json.dumps(answer).encode() + b"\n")
        if reason is not None:
            return None
        if want == "stop":
            logger.info("asked to stop (breakwater gateway stop)")
            self.stop()
        assert isinstance(hello, dict)  # `want` is one of the three only when it is
        return hello

    async def _session(self, reader: asyncio.StreamReader, output: _SocketOutput, context: SessionContext | None) -> None:
        """One MCP session over the socket, until either side closes it; its own servers start in `context`."""
        async with session_gateway(self.gateway, self.config, context) as gateway:
            await self._run(gateway, reader, output)

    async def _run(self, gateway: Gateway, reader: asyncio.StreamReader, output: _SocketOutput) -> None:
        server = gateway.server
        read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
        write_stream, write_stream_reader = create_context_streams[SessionMessage](0)

        lane = FastLane(server, output.send)

        async def read() -> None:
            async with read_stream_writer, lane.serving():
                await pump_input(reader, read_stream_writer, output, lane)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(pump_output, write_stream_reader, output)
            await server.run(read_stream, write_stream, server.create_initialization_options())
            tg.cancel_scope.cancel()
        # The session is over for its client now: its `serve` exits while its own servers are still being stopped.
        await output.close()


@contextlib.asynccontextmanager
async def listening(path: Path, listener: socket.socket | None = None) -> AsyncIterator[socket.socket | None]:
    """`bind_socket(path)` (or `listener`, bound there already), the socket file removed on exit if still this gateway's."""
    listener = listener if listener is not None else bind_socket(path)
    if listener is None:
        yield None
        return
    inode = path.stat().st_ino
    try:
        yield listener
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if path.stat().st_ino == inode:
                path.unlink()
