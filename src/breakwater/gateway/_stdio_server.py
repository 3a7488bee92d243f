"""The gateway's downstream stdio transport: the SDK's `stdio_server`, without worker threads, for any stdin.

The SDK reads stdin and writes stdout through `anyio.wrap_file`, a worker-thread hop per line read
and two per line written: about a dozen thread hand-offs per proxied call, which on a busy 2-core
machine cost more than the gateway's own work (see docs/benchmarks.md, proxy overhead). When stdin
and stdout are pipes, sockets or terminals (what every agent launches us with) this transport reads
and writes them with asyncio's non-blocking pipe transports instead. Anything else is what real
supervisors hand a process (systemd and containers without `-i` give `/dev/null`, `nohup` a file,
some a closed descriptor): it cannot be polled, so one daemon thread reads it (and writes, for a
stdout that is a file) and the end of input ends the session cleanly, as with a pipe. Framing and
serialisation are the SDK's own, so the bytes on the wire are identical; a line the SDK cannot
validate gets the JSON-RPC error the spec names (`_frames.py`), never silence.

Where asyncio has no pipe transports for the standard handles (Windows: `_platform.FAST_STDIO`), the
portable path serves every kind of stdin that way, on threads, as the SDK's own `stdio_server` does;
the framing, the line bound and the answers to bad lines stay the same. The choice is made at start.

Like the SDK, it points fd 0 at the null device and fd 1 at stderr while serving, so a stray print
or a child process cannot corrupt the wire, and restores both on exit. SIGTERM and SIGINT end the
session like the end of input: the caller's `server.run` returns and everything it opened (the
upstream processes) is closed in order; on Windows Ctrl-Break and Ctrl-C do (`_platform.STOP_SIGNALS`).
With a drain (`on_end`), stdin is still read while it runs: each new request is refused at once
(`_drain.stdio_refusal`), and a cancellation still reaches the call it names.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server as sdk_stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from breakwater import _platform
from breakwater.connect._lines import HandOffReader
from breakwater.gateway._drain import stdio_refusal
from breakwater.gateway._fast_call import FastLane
from breakwater.gateway._frames import INVALID_REQUEST, bad_id, diagnose, error_line, screen_non_finite
from breakwater.gateway._pump import reserve_standard_fds

__all__ = [
    "MAX_LINE_BYTES",
    "Ending",
    "LineOutput",
    "let_handlers_start",
    "pump_input",
    "pump_output",
    "reserve_standard_fds",
    "stdio_server",
    "transport_file",
]

#: Longest line accepted from the client. The SDK has no limit; a bound keeps one bad client from
#: exhausting memory, and 64 MiB is far above any real MCP message. A longer one is answered with
#: an error and skipped.
MAX_LINE_BYTES = 64 * 1024 * 1024

_CHUNK = 64 * 1024
#: How often a stdin thread waiting for its chunk to be fed looks whether the session ended meanwhile.
_FEED_WAIT_S = 0.5

#: Event-loop turns given, at the end of input, to the requests just read to reach their handlers (`stdio_server`).
_HANDLER_START_TURNS = 8


def _pollable(fd: int) -> bool:
    """Whether asyncio's pipe transports can drive this descriptor: a pipe, a socket or a terminal.

    Not every character device: `/dev/null` is one, and epoll refuses it (EPERM).
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


def transport_file(fd: int, mode: str) -> Any:
    """A file over a copy of `fd` for a pipe transport, which closes it when it closes.

    uvloop's transports close the descriptor they drive whatever the file object says (asyncio's
    close the file), so each gets its own copy and `fd` stays ours to restore and close.
    """
    return os.fdopen(os.dup(fd), mode, buffering=0)


def _divert(fd: int, open_diversion: Callable[[], int]) -> int | None:
    """Move `fd`'s stream to a private descriptor (returned; None if `fd` was closed) and point `fd` at a stand-in."""
    try:
        private: int | None = os.dup(fd)
    except OSError:  # closed: nothing to read from (or write to); the stand-in still keeps fd valid for children
        private = None
    if private is not None:
        os.set_inheritable(private, False)
    diversion = open_diversion()
    try:
        os.dup2(diversion, fd)
    finally:
        os.close(diversion)
    return private


def _restore(fd: int, private: int | None, fast: bool) -> None:
    if private is None:
        return
    if fast:
        # The pipe transports made the shared file description non-blocking; hand it back as it was found.
        with suppress(OSError):
            os.set_blocking(private, True)
    with suppress(OSError):
        os.dup2(private, fd)


class _ThreadFeed(asyncio.ReadTransport):
    """Feeds a StreamReader from a blocking descriptor on a daemon thread, with the reader's own flow control."""

    def __init__(self, fd: int, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._fd, self._reader, self._loop = fd, reader, loop
        self._room = threading.Event()
        self._room.set()
        self._closing = False
        reader.set_transport(self)
        threading.Thread(target=self._run, name="breakwater-stdin", daemon=True).start()

    def _run(self) -> None:
        while not self._closing:
            self._room.wait()
            try:
                chunk = os.read(self._fd, _CHUNK)
            except OSError:
                chunk = b""
            if self._closing:
                return
            with suppress(RuntimeError):  # the loop is gone: nobody is listening any more
                if not chunk:
                    self._loop.call_soon_threadsafe(self._reader.feed_eof)
                    return
                # Each chunk is fed before the next is read, so that the reader's `pause_reading` comes in time:
                # queued on the loop unwaited, /dev/zero as stdin grew past a gigabyte in 12 s.
                fed = threading.Event()
                self._loop.call_soon_threadsafe(self._feed, chunk, fed)
                while not fed.wait(_FEED_WAIT_S):
                    if self._closing or self._loop.is_closed():
                        return

    def _feed(self, chunk: bytes, fed: threading.Event) -> None:
        try:
            self._reader.feed_data(chunk)
        finally:
            fed.set()

    def pause_reading(self) -> None:
        self._room.clear()

    def resume_reading(self) -> None:
        self._room.set()

    def is_reading(self) -> bool:
        return self._room.is_set()

    def close(self) -> None:
        self._closing = True
        self._room.set()

    def is_closing(self) -> bool:
        return self._closing


class LineOutput:
    """Whole lines to the client, one at a time: asyncio's pipe writer, or blocking writes on a thread for a file.

    A client that stopped reading (its end of the pipe closed: `| head`, a crashed agent) is not an
    error of whoever was writing: the first failed write marks the output `broken` and calls
    `on_broken` (the session then ends as at the end of input), and every line after it is dropped.
    """

    def __init__(self, fd: int | None, fast: bool, on_broken: Callable[[], None] | None = None) -> None:
        self._fd = fd
        self._fast = fast
        self._writer: asyncio.StreamWriter | None = None
        self._transport: asyncio.WriteTransport | None = None
        # fast_acquire: an uncontended write must not cost a trip through the event loop (issue 16).
        self._lock = anyio.Lock(fast_acquire=True)
        #: Called once, at the first write that fails because the reader is gone.
        self.on_broken = on_broken
        #: A write failed because the reader is gone: nothing more reaches the client.
        self.broken = False

    async def open(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._fast and self._fd is not None and _pollable(self._fd):
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, transport_file(self._fd, "wb"))
            self._transport = transport
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def send(self, data: bytes) -> None:
        async with self._lock:
            if self.broken:
                return
            try:
                if self._writer is not None:
                    self._writer.write(data)
                    await self._writer.drain()
                elif self._fd is not None:
                    await anyio.to_thread.run_sync(_write_all, self._fd, data)
            except (OSError, RuntimeError) as exc:
                self._failed(exc, self._transport)

    def _failed(self, exc: OSError | RuntimeError, transport: asyncio.BaseTransport | None) -> None:
        """After a write failed: the reader is gone (EPIPE and the like, or, under uvloop, a write to the transport an
        earlier EPIPE closed), so the output breaks; any other error is raised."""
        if isinstance(exc, RuntimeError) and not (transport is not None and transport.is_closing()):
            raise exc
        self._break()

    def _break(self) -> None:
        if not self.broken:
            self.broken = True
            if self.on_broken is not None:
                self.on_broken()

    async def close(self) -> None:
        if self._writer is not None:
            with suppress(ConnectionError, RuntimeError):
                await self._writer.drain()
        if self._transport is not None:
            self._transport.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def _next_line(reader: asyncio.StreamReader) -> tuple[bytes | None, bool]:
    """The next line (None at the end of input), and whether it was over MAX_LINE_BYTES (then skipped whole)."""
    oversized = False
    hand_off = None
    try:
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:  # the end of input, maybe after a last line without a newline
                if oversized:
                    return b"", True
                return (exc.partial or None), False
            except asyncio.LimitOverrunError as exc:
                # Drop what is buffered and keep dropping up to the newline: the rest of that line is no message
                # (nor is its tail a line to hand over).
                if not oversized and isinstance(reader, HandOffReader):
                    hand_off, reader.hand_off = reader.hand_off, None
                await reader.readexactly(exc.consumed)
                oversized = True
                continue
            return (b"" if oversized else line), oversized
    finally:
        if oversized and isinstance(reader, HandOffReader):
            reader.hand_off = hand_off


async def _open_input(
    in_fd: int | None, loop: asyncio.AbstractEventLoop, fast: bool
) -> tuple[asyncio.StreamReader, asyncio.BaseTransport | None]:
    """A reader over stdin: asyncio's pipe transport when it can be polled, else a reading thread; closed = ended."""
    reader = HandOffReader(limit=MAX_LINE_BYTES)
    if in_fd is None:
        reader.feed_eof()
        return reader, None
    if fast and _pollable(in_fd):
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), transport_file(in_fd, "rb"))
        return reader, transport
    return reader, _ThreadFeed(in_fd, reader, loop)


class _Refusing:
    """Whether new requests are refused (set by the first stop signal while the drain runs)."""

    on = False


async def pump_input(
    reader: asyncio.StreamReader, sink: Any, output: LineOutput, lane: FastLane | None = None, refusing: _Refusing | None = None
) -> None:
    """Lines from the client to the session; a line that is no valid message is answered here, never dropped.

    With a `lane` (inside its `serving()`), a `tools/call` it can serve skips the session's streams (`_fast_call`),
    and, from a `HandOffReader`, this task too: measured (`bench/proxy_instructions.py`, issue 16), 1.67 →
    1.62 M instructions per stdio call, one event-loop iteration less."""
    refusing = refusing or _Refusing()
    if lane is not None and isinstance(reader, HandOffReader):
        reader.hand_off = lane.take_lines
        try:
            await _pump_lines(reader, sink, output, lane, refusing)
        finally:
            reader.hand_off = None
    else:
        await _pump_lines(reader, sink, output, lane, refusing)


async def _pump_lines(
    reader: asyncio.StreamReader, sink: Any, output: LineOutput, lane: FastLane | None, refusing: _Refusing
) -> None:
    while True:
        line, oversized = await _next_line(reader)
        if line is None:
            return
        if refusing.on:
            if isinstance(reader, HandOffReader):
                reader.hand_off = None  # every line is this task's now: the lane takes no new call
            if (refusal := stdio_refusal(line)) is not None:
                await output.send(error_line(*refusal))
                continue
        if oversized:
            await output.send(error_line(None, INVALID_REQUEST, f"Invalid request: message over {MAX_LINE_BYTES} bytes"))
            continue
        if lane is not None and lane.take(line):
            continue
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception as exc:
            answer = diagnose(line, exc)
            if answer is not None:
                await output.send(error_line(*answer))
            continue
        if isinstance(message, types.JSONRPCNotification) and b'"id"' in line and (answer := bad_id(line)):
            await output.send(error_line(*answer))
            continue
        message, answer = screen_non_finite(line, message)  # the SDK's parser takes NaN and Infinity; JSON has neither
        if answer is not None:
            await output.send(error_line(*answer))
        if message is None:
            continue
        await sink.send(SessionMessage(message))


async def pump_output(source: Any, output: LineOutput) -> None:
    """The session's messages to the client, one JSON line each."""
    async with source:
        async for session_message in source:
            data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
            await output.send(data.encode() + b"\n")


class Ending:
    """How a session with a drain ends: the drain runs once, whichever asks first (the end of input, the first stop
    signal, a shared gateway's stop)."""

    def __init__(self, on_end: Callable[[], Awaitable[None]], cut: Callable[[], None] | None) -> None:
        self.on_end = on_end
        self.cut = cut
        self.scope = anyio.CancelScope()
        self.refusing = _Refusing()
        self._started = False
        self._done = anyio.Event()

    async def run(self) -> None:
        """Run the drain, or wait for the one running."""
        if self._started:
            await self._done.wait()
            return
        self._started = True
        try:
            with self.scope:
                await let_handlers_start()
                await self.on_end()
        finally:
            self._done.set()

    async def on_signal(self, reading: anyio.CancelScope, reader: asyncio.StreamReader) -> None:
        """The first stop signal: refuse new requests while the drain runs, then stop reading."""
        self.refusing.on = True
        if isinstance(reader, HandOffReader):
            reader.hand_off = None
        await self.run()
        reading.cancel()

    def again(self) -> None:
        """A later stop signal: the second cuts the calls in flight now (`cut`), the one after ends the drain."""
        cut, self.cut = self.cut, None
        if cut is not None:
            cut()
        else:
            self.scope.cancel()


async def _stop_on_signal(
    reading: anyio.CancelScope, ending: Ending | None, reader: asyncio.StreamReader, sink: Any, stopped_by: list[int]
) -> None:
    # A stop signal ends the session as the end of input does, so the caller shuts down in order;
    # with an `on_end` (the drain), stdin is still read meanwhile, and a second one cuts that short.
    loop = asyncio.get_running_loop()
    received = anyio.Event()

    def on_signal(signum: int) -> None:  # on the main thread, between two steps of the loop
        if not received.is_set():
            stopped_by.append(signum)
            loop.call_soon_threadsafe(received.set)
        elif ending is not None:
            loop.call_soon_threadsafe(ending.again)

    with _platform.on_stop_signals(on_signal):
        await received.wait()
        if ending is None:
            reading.cancel()
            await sink.aclose()
            return
        await ending.on_signal(reading, reader)
        await anyio.sleep_forever()  # later signals still come here until the session ends


async def _close(
    output: LineOutput, read_transport: asyncio.BaseTransport | None, in_fd: int | None, out_fd: int | None, fast: bool
) -> None:
    """Close the session's transports and give fds 0 and 1 back what they held before it."""
    await output.close()
    if read_transport is not None:
        read_transport.close()
    # Let the transports run their close callbacks before the descriptors go.
    await asyncio.sleep(0)
    _restore(0, in_fd, fast)
    _restore(1, out_fd, fast)
    # A reading thread may still be inside read(): its descriptor is left open rather than closed
    # under it (where the number could be reused by another file and read from).
    for fd in (None if isinstance(read_transport, _ThreadFeed) else in_fd, out_fd):
        if fd is not None:
            os.close(fd)


async def let_handlers_start() -> None:
    """At the end of input: let the last requests read reach their handlers before the drain looks.

    A lane call's task, or the dispatcher's receive loop and then the handler it spawns, each start a
    loop turn later; a drain that looked at once saw no call in flight and ended, and the session's
    end answered them a bare CONNECTION_CLOSED. asyncio runs ready tasks in order, so a few turns are
    enough (3 on the SDK path, measured; 8 for margin): no clock time passes.
    """
    for _ in range(_HANDLER_START_TURNS):
        await anyio.lowlevel.checkpoint()


@asynccontextmanager
async def stdio_server(
    stopped_by: list[int] | None = None,
    *,
    fast: bool | None = None,
    on_end: Callable[[], Awaitable[None]] | None = None,
    cut: Callable[[], None] | None = None,
    server: Server[Any] | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Serve MCP over this process's stdin and stdout: `(read_stream, write_stream)` for `Server.run`.

    A stop signal that ended the session is appended to `stopped_by` (the caller's exit code says which).
    `fast` picks asyncio's pipe transports or the portable threads; by default, what the platform offers.
    `on_end` runs when the input ended (or a stop signal came), before the session's read side closes,
    so the calls in flight can still answer (`breakwater.gateway._drain.drain_stdio`); after a stop signal
    stdin is read on while it runs, and each new request is refused. A second stop signal calls `cut`
    (`Drain.cut_now`: the calls in flight are cut and answered at once); one more cancels `on_end`.
    `server`, the one `Server.run` serves on these streams, gives `tools/call` its fast lane (`_fast_call`)."""
    fast = _platform.FAST_STDIO if fast is None else fast
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # another event loop (trio)
        loop = None
    if loop is None:
        async with sdk_stdio_server() as streams:
            yield streams
        return

    with suppress(Exception):
        sys.stdout.flush()
    in_fd = _divert(0, lambda: os.open(os.devnull, os.O_RDONLY))
    out_fd = _divert(1, lambda: os.dup(2))
    reader, read_transport = await _open_input(in_fd, loop, fast)
    reading = anyio.CancelScope()
    # A client that stopped reading is gone as surely as one that closed our input: the session ends the same way.
    output = LineOutput(out_fd, fast, on_broken=reading.cancel)
    await output.open(loop)

    read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_stream_reader = create_context_streams[SessionMessage](0)
    ending = None if on_end is None else Ending(on_end, cut)
    refusing = None if ending is None else ending.refusing

    lane = FastLane(server, output.send) if server is not None else None

    async def read_until_stopped() -> None:
        async with read_stream_writer:
            if lane is None:
                with reading:
                    await pump_input(reader, read_stream_writer, output, None, refusing)
                await end()
                return
            # The lane's calls live in `serving`: the drain (`on_end`) runs inside it, so they can still finish.
            async with lane.serving():
                with reading:
                    await pump_input(reader, read_stream_writer, output, lane, refusing)
                await end()

    async def end() -> None:
        if ending is not None:
            await ending.run()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_until_stopped)
            tg.start_soon(pump_output, write_stream_reader, output)
            if threading.current_thread() is threading.main_thread():
                stops = [] if stopped_by is None else stopped_by
                tg.start_soon(_stop_on_signal, reading, ending, reader, read_stream_writer, stops)
            yield read_stream, write_stream
            tg.cancel_scope.cancel()
    finally:
        await _close(output, read_transport, in_fd, out_fd, fast)
    if output.broken:
        # Everything is closed in order; the caller's exit code says the output was cut (`cli._run`: 141).
        raise BrokenPipeError("the client stopped reading the session's output")
