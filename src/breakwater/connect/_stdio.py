"""A stdio transport that keeps what the SDK's own throws away: the exit code and the last stderr lines.

The SDK's `stdio_client` hides its process, so a server that dies during the handshake can only be
reported as "connection closed". This transport spawns the process itself (the SDK's environment
rules and its shutdown sequence), keeps a tail of stderr in memory and exposes the process, so the
supervisor can say "exited with code 3: ModuleNotFoundError: …".

Where Windows differs (the process group, the polite signal, killing the tree, finding `npx.cmd`),
`breakwater._platform` decides; the steps and their grace periods are the same everywhere.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, cast

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import (  # the SDK's shutdown steps and timings, kept identical on purpose (pinned minor version)
    _KILL_REAP_TIMEOUT,
    FORCE_KILL_TIMEOUT,
    PROCESS_TERMINATION_TIMEOUT,
    _close_pipe,
    _close_subprocess_transport,
    _drain_stdout,
    _wait_for_process_exit,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

from breakwater import _platform
from breakwater._wire import STDIN_CLOSED, STDOUT_CLOSED
from breakwater.config._dialect import command_words
from breakwater.connect._lines import HandOffReader, LineSplitter, StdoutParser
from breakwater.connect._raw_call import RawCalls

__all__ = ["StdioProcess"]

logger = logging.getLogger("breakwater.stdio")

STDERR_TAIL_LINES = 20
EXIT_CODE_GRACE_S = 1.0
#: How often a running upstream's exit is looked for: first, and at most once it has run a while (`_watch_exit`).
EXIT_POLL_FIRST_S = 0.05
EXIT_POLL_MAX_S = 2.0
_GROUP_POLL_S = 0.01
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024  # `[call] max_result_bytes`'s default
_FD_SCAN_LIMIT = 4096  # descriptors looked at where none can be listed (`_close_on_exec`)
_CANCEL_CHECK_CHUNKS = 32  # chunks of an upstream's stdout read between two looks for a cancellation (`StdoutReader`)


#: At the end of a stdio session (`StdioProcess.prompt_stop`): the stdin grace, then the polite signal's.
#: Both SDKs' clients give the server they launched 2 s after closing its stdin, then signal it; a
#: gateway that gave its own upstreams the SDK's 2 s + 2 s was stopped by its client mid-shutdown
#: whenever one of them ignores the end of its input (a TypeScript server with a task's timer pending).
PROMPT_STOP_S = (0.9, 0.4)


async def stop_process(process: Process, *, prompt: bool = False) -> None:
    """The MCP shutdown: close stdin and wait; then the polite signal to the whole group and wait; then kill the tree.

    The SDK's sequence and timings (`mcp.client.stdio._stop_server_process`), with each platform's
    signal and tree kill from `_platform`: on Windows the SDK's own version kills only the process
    (its Job Object is made only by its own spawn) and has no polite step. `prompt`: the same steps
    within `PROMPT_STOP_S`, so the whole stop ends before the session's own client loses patience.
    """
    assert process.stdin is not None and process.stdout is not None
    grace_s, polite_s = PROMPT_STOP_S if prompt else (PROCESS_TERMINATION_TIMEOUT, FORCE_KILL_TIMEOUT)
    # What left the group (a browser started in a session of its own) is known only by its parent links,
    # which break as soon as its parent exits: read them before anything stops.
    tree = await anyio.to_thread.run_sync(_platform.descendants, process.pid)
    await _close_pipe(process.stdin)
    # A leader that exits within the grace may leave what it started running (a forked worker, a
    # `sh -c` child, a browser in a session of its own), holding nothing breakwater watches: stopped too.
    if not await _wait_for_process_exit(process, grace_s) or _group_left(process) or _platform.still_running(tree):
        _platform.ask_to_stop(process.pid)
        _platform.ask_each_to_stop(tree)
        with anyio.move_on_after(polite_s):  # noqa: TID251 - a real process's grace after the polite signal
            # Reading returncode reaps the leader; a zombie leader would keep the group alive.
            while _platform.group_alive(process.pid, process.returncode) or _platform.still_running(tree):
                await anyio.sleep(_GROUP_POLL_S)  # noqa: TID251 - a real process exits in real time
        if _platform.group_alive(process.pid, process.returncode) or _platform.still_running(tree):
            await anyio.to_thread.run_sync(_platform.kill_tree, process.pid)
            _platform.kill_each(tree)
        if not await _wait_for_process_exit(process, _KILL_REAP_TIMEOUT):
            logger.warning("stdio server %d is still alive after the kill; abandoning it", process.pid)
    # A kill survivor can hold the stdout pipe open; poison the reader anyway.
    await _close_pipe(process.stdout)
    _close_subprocess_transport(process)


async def _spawn(command: list[str], env: dict[str, str], cwd: str | None) -> Process:
    """Start an upstream with pipes for its stdin, stdout and stderr, and none of breakwater's other descriptors.

    Why. uvloop spawns through libuv, which has no `close_fds`: the child kept an inheritable copy of
    its own end of each stdio socket besides fds 0-2, so an upstream that closed its stdout and kept
    running never showed EOF (it stayed `ready` and every call waited for its timeout), and any
    inheritable descriptor of breakwater's own leaked into every upstream. Under uvloop the child marks
    every descriptor above 2 close-on-exec before libuv moves the pipes onto 0-2 (`_close_on_exec`):
    what asyncio's own spawn does with `close_fds=True`. anyio's `open_process` has no `preexec_fn`,
    so that spawn goes through its backend (pinned minor version).
    """
    options = _platform.spawn_options()
    if _platform.running_loop() != "uvloop":
        return await anyio.open_process(command, env=env, cwd=cwd, **options)
    from anyio._core._eventloop import get_async_backend

    pipe = asyncio.subprocess.PIPE
    spawned: Process = await get_async_backend().open_process(
        command, stdin=pipe, stdout=pipe, stderr=pipe, env=env, cwd=cwd, preexec_fn=_close_on_exec, **options
    )
    return spawned


def _close_on_exec() -> None:
    """In the forked child, before exec: every descriptor above 2 closes at exec. Never raises (a raise aborts the spawn)."""
    fds: Iterable[int] = ()
    for listing in ("/proc/self/fd", "/dev/fd"):
        with suppress(OSError, ValueError):
            fds = [int(name) for name in os.listdir(listing)]
            break
    else:
        fds = range(3, _FD_SCAN_LIMIT)
    for fd in fds:
        if fd > 2:
            with suppress(OSError):
                os.set_inheritable(fd, False)


def _group_left(process: Process) -> bool:
    """Whether the exited leader's process group still has members (only ever the upstream's own group).

    The group id is the leader's pid (`_platform.spawn_options` starts it in a session of its own), and
    a pid is not reused while a group of that id has members. Never this process's own group: that
    would take breakwater down with it (a spawn option changed, or a platform without sessions).
    """
    getpgrp = getattr(os, "getpgrp", None)
    if getpgrp is not None and getpgrp() == process.pid:
        return False
    return _platform.group_alive(process.pid, process.returncode)


class StdinWriter:
    """The session's write stream: each message goes to the server's stdin from the task that sends it.

    It was a memory stream to a writer task, which cost every message two trips through the event
    loop (the sender's checkpoint, then the writer's turn) and anyio's process stream a third (a
    checkpoint after each write): on a busy machine each trip is a wake-up (issue 16, docs/benchmarks.md).
    A line is written whole in one `write` (the transport buffers what the pipe does not take), so
    concurrent senders never interleave; `drain` waits only while the pipe is full. A broken pipe
    ends the session's reads too, as the writer task did.
    """

    def __init__(self, process: Process, parser: StdoutParser, end_reads: Callable[[str], None]) -> None:
        assert process.stdin is not None
        self._stdin = process.stdin
        # anyio's wrapper of the asyncio stream (pinned minor version); any other stream goes through `send`.
        writer = getattr(process.stdin, "_stream", None)
        self._writer: asyncio.StreamWriter | None = writer if isinstance(writer, asyncio.StreamWriter) else None
        self._parser = parser
        self._end_reads = end_reads
        self._closed = False
        # Lines written after the first one in a turn of the event loop, sent together at the turn's end (`_flush`).
        self._batch: list[bytes] | None = None
        # asyncio keeps the end of the child's stdin as a future that holds a broken pipe's error, and logs it as
        # "exception was never retrieved" when that future is collected unread (3.11's `pipe_connection_lost`).
        # A line written as the server died is then an error in the log with a traceback (and, under the
        # tests' runner, a failed test: seen in CI), for a death the session already handles. It is read here.
        self._watch = asyncio.ensure_future(_stdin_end(self._writer)) if self._writer is not None else None

    async def send(self, message: SessionMessage) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        self._parser.sent(message)
        await self.write_line((message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode())

    async def write_line(self, data: bytes) -> None:
        """Write one encoded message (a raw call's line, `_raw_call.py`, or a session message's)."""
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            if self._writer is not None:
                if self._writer.is_closing():
                    raise anyio.BrokenResourceError
                if self._batch is not None:
                    self._batch.append(data)
                else:
                    self._writer.write(data)
                    self._batch = []
                    asyncio.get_running_loop().call_soon(self._flush)
                await self._writer.drain()
            else:
                await self._stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            self._closed = True
            self._end_reads(STDIN_CLOSED)
            raise anyio.BrokenResourceError from exc

    def _flush(self) -> None:
        """Write the lines that joined this turn's batch, in one `write`.

        Why. A burst of calls (50 concurrent POSTs whose tasks all run in one turn of the loop) wrote
        50 lines with 50 `write`s, and each write to a pipe whose reader sleeps may hand the CPU to
        the server at once: in a burst, cProfile charged the gateway 370 µs of wall time per call to
        `os.write` (20 µs in sequential calls). The first line of a turn still goes out at once, so a
        lone call waits for nothing; the rest go out together at the end of the turn, in order.
        """
        batch, self._batch = self._batch, None
        if batch and self._writer is not None and not self._writer.is_closing():
            self._writer.write(b"".join(batch))

    def close(self) -> None:
        self._closed = True

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> StdinWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _stdin_end(writer: asyncio.StreamWriter) -> None:
    """Wait for the child's stdin to be closed or broken, and read how (`StdinWriter.__init__` says why)."""
    with suppress(Exception):
        await writer.wait_closed()


class StdoutReader:
    """The session's read stream: the server's stdout, read and parsed (`_lines.py`) when the session asks.

    It was a reader task feeding a memory stream, so every message the server sent took two more
    trips through the event loop (the reader's checkpoint on send, the session's on receive) before
    the session saw it (issue 16, docs/benchmarks.md). The session's receive loop reads the pipe
    itself now; nothing is lost on cancellation (unparsed bytes stay in the pipe's buffer, parsed
    messages in `_ready`). `stdout_closed` is set when the server closes its stdout itself; `end()`
    (a broken stdin) ends the reads at once, as closing the memory stream did.
    """

    def __init__(self, process: Process, parser: StdoutParser, max_line_bytes: int, stdout_closed: anyio.Event) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._parser = parser
        #: The raw `tools/call` requests in flight: their answers and progress never reach the SDK.
        self.raw: RawCalls | None = None
        self._lines = LineSplitter(max_line_bytes)
        self._stdout_closed = stdout_closed
        self._ready: collections.deque[SessionMessage] = collections.deque()
        self._ended = False
        self._reading: anyio.CancelScope | None = None
        self._unchecked = 0  # chunks read since the last look for a cancellation
        #: Set while breakwater closes the process: a pipe ending then is expected.
        self.shutting_down = False

    async def receive(self) -> SessionMessage:
        while not self._ready:
            if self._ended:
                raise anyio.EndOfStream
            # A read of a pipe with data waiting returns without suspending, and anyio delivers a cancellation
            # only to a task that waits on an unfinished future: an upstream that writes without pause (a flood
            # of notifications) kept the session's reader out of reach of every cancellation, so a session end
            # or a SIGTERM waited for the flood to pause (over 60 s seen). Checked every `_CANCEL_CHECK_CHUNKS`
            # chunks: a flood reaches that in a moment, and a call's answer (one chunk) pays nothing for it.
            self._unchecked += 1
            if self._unchecked >= _CANCEL_CHECK_CHUNKS:
                self._unchecked = 0
                await anyio.lowlevel.checkpoint_if_cancelled()
            with anyio.CancelScope() as self._reading:
                try:
                    chunk = await self._stdout.receive()
                except anyio.EndOfStream:
                    self._ended = True
                    self._end_raw(None if self.shutting_down else STDOUT_CLOSED)
                    self._stdout_closed.set()
                    raise
                except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
                    self._ended = True
                    self._end_raw(None if self.shutting_down else STDOUT_CLOSED)
                    if not self.shutting_down:
                        logger.debug("stdout of %s ended", self._parser.server)
                    raise anyio.EndOfStream from None
                finally:
                    self._reading = None
            if self._ended:  # `end()` cut the read short
                raise anyio.EndOfStream
            raw = self.raw
            for line in self._lines.feed(chunk):
                if raw is not None and type(line) is bytes and raw.take(line):
                    continue
                message = self._parser.parse(line)
                if message is not None and not (raw is not None and raw.take_error(message.message)):
                    self._ready.append(message)
            # Not held while the next read waits: a server's last answer stayed in this frame until it wrote again.
            chunk = line = b""
        return self._ready.popleft()

    def tap(self, data: bytes) -> int:
        """How many bytes of whole lines at the start of `data` were raw calls' answers or progress (`HandOffReader`).

        Only while this reader waits for the pipe with nothing read and unparsed, so a line is never
        taken ahead of one the session has not seen yet."""
        raw = self.raw
        if raw is None or self._ready or self._ended or self._reading is None or not self._lines.between_lines:
            return 0
        taken, limit = 0, self._lines.limit
        while (end := data.find(b"\n", taken)) >= 0 and end - taken <= limit and raw.take(data[taken:end]):
            taken = end + 1
        return taken

    def _end_raw(self, why: str | None = None) -> None:
        if self.raw is not None:
            self.raw.close(why)

    def end(self, why: str | None = None) -> None:
        """End the reads at once (a broken stdin: `why` tells the calls in flight, unless breakwater is closing it)."""
        self._ended = True
        self._end_raw(None if self.shutting_down else why)
        if why is not None and not self.shutting_down:
            # A broken stdin says the process is going as surely as its stdout's end: its exit code gets the same
            # grace. Without it, a server that exited at once (a missing token) and broke the handshake's first
            # write before its stdout's end was read was told "the connection closed", not its exit and why.
            self._stdout_closed.set()
        if self._reading is not None:
            self._reading.cancel()

    def __aiter__(self) -> StdoutReader:
        return self

    async def __anext__(self) -> SessionMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._ended = True
        self._end_raw()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> StdoutReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _feed_directly(buffer: asyncio.StreamReader) -> None:
    """Feed what the pipe reads into `buffer` from the pipe's own callback, not one loop iteration later.

    asyncio's subprocess transport relays each chunk a child writes through `loop.call_soon`
    (`BaseSubprocessTransport._pipe_data_received`) before the stream protocol feeds it to its buffer:
    one more event-loop iteration between the upstream's answer and the caller it wakes, on every
    call (issue 16). The pipe's transport takes another protocol through its public `set_protocol`;
    the end of the pipe still goes the usual way, after the data (the transport schedules it).
    """
    transport: Any = getattr(buffer, "_transport", None)  # asyncio's own attribute: the stdout pipe's transport
    # Duck-typed: uvloop's pipe transports are no subclasses of asyncio's, and take a protocol the same way.
    if transport is not None and callable(getattr(transport, "set_protocol", None)) and not transport.is_closing():
        transport.set_protocol(_DirectFeed(transport.get_protocol(), buffer))


class _DirectFeed(asyncio.Protocol):
    """The stdout pipe's protocol: data straight into the stream's buffer, the rest to asyncio's own protocol."""

    def __init__(self, inner: asyncio.BaseProtocol, buffer: asyncio.StreamReader) -> None:
        self._inner = inner
        self._buffer = buffer

    def data_received(self, data: bytes) -> None:
        # Chunks asyncio relayed before the swap are ahead of this one in the loop's queue, so the order holds.
        self._buffer.feed_data(data)

    def eof_received(self) -> bool | None:
        return cast(asyncio.Protocol, self._inner).eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class StdioProcess:
    """One spawn of a stdio server; `open()` is the transport handed to `mcp.Client`."""

    def __init__(
        self,
        command: str,
        args: tuple[str, ...],
        *,
        env: dict[str, str] | None = None,
        inherit: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        """`name` labels its log lines (default: the command); a stdout line over `max_line_bytes` is
        dropped unread and the request it answers gets RESULT_TOO_LARGE (`[call] max_result_bytes`).

        The process gets `env` over `inherit`: by default the SDK's few safe variables of this
        process (`get_default_environment`); a shared gateway passes those of the attached session
        whose server it starts, with that session's directory as `cwd`."""
        self.command = command
        self.args = args
        self.env = env or {}
        self.inherit = inherit
        self.cwd = cwd
        self.process: Process | None = None
        #: Set when the session that launched breakwater ends: the process is stopped within `PROMPT_STOP_S`.
        self.prompt_stop = False
        #: `tools/call` without the SDK session's plumbing, while the process runs (`_raw_call.py`).
        self.raw_calls: RawCalls | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.exited = anyio.Event()
        # The exit code if the process ended on its own, before breakwater began closing it.
        self.exit_code_before_close: int | None = None
        self._shutting_down = False  # set while breakwater closes it: a pipe ending then is expected
        self.max_line_bytes = max_line_bytes
        self.parser = StdoutParser(name or command, max_line_bytes)

    @asynccontextmanager
    async def open(self) -> AsyncGenerator[tuple[Any, Any], None]:
        """Spawn the process and bridge its pipes to the session's streams."""
        env = (get_default_environment() if self.inherit is None else dict(self.inherit)) | dict(self.env)
        words = command_words(self.command, self.args, env.get("PATH"), self.cwd)
        program = _platform.resolve_command(words[0], env)
        if program is None:
            raise FileNotFoundError(errno.ENOENT, "command not found", self.command)
        process = await _spawn([program, *words[1:]], env, self.cwd)
        self.process = process
        self._shutting_down = False
        stdout_closed = anyio.Event()
        read_stream = StdoutReader(process, self.parser, self.max_line_bytes, stdout_closed)
        write_stream = StdinWriter(process, self.parser, read_stream.end)
        self.raw_calls = read_stream.raw = RawCalls(write_stream.write_line, self.parser)
        # Answers wake their callers from the pipe's buffer (`HandOffReader`). asyncio makes that buffer
        # inside `create_subprocess_exec`, with no way to pass another class: its class is swapped.
        # anyio's wrapper of the asyncio stream (pinned minor version); any other stream is read as it is.
        buffer = getattr(process.stdout, "_stream", None)
        if type(buffer) is asyncio.StreamReader:
            buffer.__class__ = HandOffReader
            cast(HandOffReader, buffer).hand_off = read_stream.tap
            _feed_directly(buffer)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read_stderr, process)
            tg.start_soon(self._watch_exit, process, stdout_closed)
            try:
                yield read_stream, write_stream
            finally:
                self._shutting_down = read_stream.shutting_down = True
                self.raw_calls = None
                with anyio.CancelScope(shield=True):
                    if stdout_closed.is_set():
                        # The server closed its stdout: it is exiting on its own; give the event loop a
                        # moment to reap it so the exit code is its own, not the one our shutdown causes.
                        with anyio.move_on_after(EXIT_CODE_GRACE_S):  # noqa: TID251 - a real process's reaping grace
                            await self.exited.wait()
                    self.exit_code_before_close = process.returncode
                    read_stream.close()
                    write_stream.close()
                    # The session reads no more: drain the rest of stdout so a server flushing on its way out can exit.
                    tg.start_soon(_drain_stdout, process)
                    await stop_process(process, prompt=self.prompt_stop)
                tg.cancel_scope.cancel()
        await anyio.lowlevel.cancel_shielded_checkpoint()

    async def _read_stderr(self, process: Process) -> None:
        """Stderr lines into `stderr_tail` (the last few explain an exit)."""
        assert process.stderr
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
            buffer = ""
            async for chunk in TextReceiveStream(process.stderr, encoding="utf-8", errors="replace"):
                lines = (buffer + chunk).split("\n")
                buffer = lines.pop()
                self.stderr_tail.extend(line.rstrip() for line in lines if line.strip())
            if buffer.strip():
                self.stderr_tail.append(buffer.rstrip())

    async def _watch_exit(self, process: Process, stdout_closed: anyio.Event) -> None:
        """Set `exited` once the process has exited (the event loop reaps it and sets its return code).

        Not process.wait(): on asyncio it also waits for pipe EOF, which a grandchild can hold open. The
        look slows from `EXIT_POLL_FIRST_S` to `EXIT_POLL_MAX_S` while the process lives: at a fixed 50 ms
        an idle gateway of seventeen servers woke 29 times a second and spent 1 % of a core on it. A
        process that closes its stdout (as nearly every exit does) is looked at the fast pace again at
        once, so its exit code is known within `EXIT_CODE_GRACE_S`.
        """
        pause = EXIT_POLL_FIRST_S
        while process.returncode is None:
            # A real process exits in real time, whatever the clock says.
            if stdout_closed.is_set():
                await anyio.sleep(EXIT_POLL_FIRST_S)  # noqa: TID251
            else:
                with anyio.move_on_after(pause):  # noqa: TID251
                    await stdout_closed.wait()
                pause = min(pause * 2, EXIT_POLL_MAX_S)
        self.exited.set()
