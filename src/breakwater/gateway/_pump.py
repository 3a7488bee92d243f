"""A stdio session attached to the shared local gateway: the client's lines to the gateway, its lines back.

The MCP session runs in the gateway. At the first attach this process hands its stdin and stdout to
the gateway (`breakwater.gateway._handoff`), which serves the session on them, and sleeps: it reads
the gateway's mirror of what it read and answered (`_Pump.watch`) only when the gateway rings or goes
away. Otherwise (after a failover, or stdio that cannot be handed over) this process relays, reading
enough of each line to know which requests wait for an answer. The relay runs in asyncio protocol
callbacks (a line read is written on at once, with no task switch), so it adds one process hop each
way and little else.

What it reads is what failover needs. When the gateway goes away mid-session (killed, crashed,
stopped), every request in flight still gets its answer: a `tools/call` that only reads (its
tool's `readOnlyHint`, learned from the `tools/list` answers relayed, or a retry class of "safe"
in the config, which wins, as in the call gate) is sent again, as is any other request (lists,
reads, pings, breakwater's own search and status tools); any other call is answered
`OUTCOME_UNKNOWN` (it may have run; never repeated behind the agent's back). The session attaches
to a new gateway (starting it), replays its `initialize` and its log level there, and goes on; the
agent sees one error at most, never a hang: when no gateway can be had for `GIVE_UP_S`, waiting
requests are answered with an error. When breakwater was upgraded under the session (no gateway of
its version can be started again), the session says so once, answers what waits, and ends, so
that the agent's next start of it runs the new version.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import select
import signal
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from breakwater import _platform
from breakwater._clock import Clock
from breakwater.gateway._attach import Attachment, AttachRefused, SessionOutdated
from breakwater.gateway._handoff import STOP, MirrorParser, answer_id
from breakwater.gateway._start import relayable, reserve_standard_fds
from breakwater.gateway._tool_safety import ToolSafety

__all__ = ["GIVE_UP_S", "MAX_LINE_BYTES", "ToolSafety", "attached_session", "relayable", "reserve_standard_fds"]

logger = logging.getLogger("breakwater.gateway.attach")

#: As `breakwater.gateway._stdio_server.MAX_LINE_BYTES` (not imported: that module loads the SDK, and an
#: attached session is a relay that starts in a fraction of a second without it).
MAX_LINE_BYTES = 64 * 1024 * 1024
#: How long requests wait for a new gateway before they are answered with an error.
GIVE_UP_S = 5.0
_REPLAY = "breakwater-replay-"


class _Lines(asyncio.Protocol):
    """A byte stream as whole lines, each handed to `on_line` as it completes; `on_end` once, at its end.

    A line over MAX_LINE_BYTES is dropped whole (no MCP message is that long). `pause`/`resume` are
    called when this side's own writes back up (flow control for the other direction).
    """

    def __init__(self, on_line: Callable[[bytes], None], on_end: Callable[[], None]) -> None:
        self.on_line, self.on_end = on_line, on_end
        self.buffer = bytearray()
        self.skipping = False
        self.transport: asyncio.BaseTransport | None = None
        self.ended = False
        self.on_pause: Callable[[], None] = lambda: None
        self.on_resume: Callable[[], None] = lambda: None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        start = 0
        while (end := self.buffer.find(b"\n", start)) >= 0:
            if self.skipping:
                self.skipping = False
            else:
                self.on_line(bytes(self.buffer[start : end + 1]))
            start = end + 1
        del self.buffer[:start]
        if len(self.buffer) > MAX_LINE_BYTES:
            self.buffer.clear()
            self.skipping = True

    def eof_received(self) -> bool:
        if self.buffer and not self.skipping:
            self.on_line(bytes(self.buffer) + b"\n")
        self.buffer.clear()
        self._end()
        return True  # keep the transport: the other direction may still be written (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self.on_end()

    def pause_writing(self) -> None:
        self.on_pause()

    def resume_writing(self) -> None:
        self.on_resume()


def _id_key(raw: Any) -> str:
    """A request id as JSON text, so 7 and "7" stay two ids (an integer, the usual id, without the encoder)."""
    return str(raw) if type(raw) is int else json.dumps(raw)


@dataclass
class _Session:
    """What this session must be able to replay or answer if its gateway goes away."""

    initialize: dict[str, Any] | None = None
    initialized: bytes | None = None
    set_level: dict[str, Any] | None = None
    pending: dict[str, tuple[str, Any, bytes]] = field(default_factory=dict)  # id key -> (method, id, line)
    swallow: set[str] = field(default_factory=set)
    safety: ToolSafety = field(default_factory=ToolSafety)

    def note_request(self, line: bytes) -> str | None:
        """Remember a request until it is answered (its id key is returned), and what a new gateway must be told."""
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        method = message.get("method")
        if not isinstance(method, str):
            return None
        if "id" in message:
            if method == "initialize":
                self.initialize = message
            elif method == "logging/setLevel":
                self.set_level = message
            key = _id_key(message["id"])
            self.pending[key] = (method, message["id"], line)
            return key
        if method == "notifications/initialized":
            self.initialized = line
        elif method == "notifications/cancelled":
            params = message.get("params")
            if isinstance(params, dict) and "requestId" in params:
                self.pending.pop(_id_key(params["requestId"]), None)
        return None

    def note_answer(self, line: bytes) -> bool:
        """Forget the request `line` answers; False when the answer is one of ours, not for the client."""
        raw = answer_id(line)
        if raw is None:
            return True
        key = _id_key(json.loads(raw))
        if key in self.swallow:
            self.swallow.discard(key)
            return False
        asked = self.pending.pop(key, None)
        if asked is not None and asked[0] == "tools/list":
            self.safety.learn(line)
        return True

    def replays(self, generation: int) -> list[bytes]:
        """What makes a new gateway's session this one: initialize, initialized, the log level, then the requests in flight.

        An initialize or setLevel the client already had answered is replayed under an id of our own
        (its answer is swallowed); one still waiting is sent as it was, and answered to the client.
        """
        lines: list[bytes] = []
        for name, message in (("init", self.initialize), ("level", self.set_level)):
            if message is None:
                continue
            if _id_key(message["id"]) in self.pending:
                lines.append(self.pending[_id_key(message["id"])][2])
            else:
                key = f"{_REPLAY}{name}-{generation}"
                self.swallow.add(_id_key(key))
                lines.append(json.dumps({**message, "id": key}).encode() + b"\n")
            if name == "init" and self.initialized is not None:
                lines.append(self.initialized)
        lines += [line for method, _, line in self.pending.values() if method not in ("initialize", "logging/setLevel")]
        return lines


def _cut_answer(request_id: Any, *, schema: bool = False) -> bytes:
    """The answer a tool call in flight gets when the gateway under it went away: OUTCOME_UNKNOWN, as the gate answers a cut.

    Written as `breakwater.gate._envelope.error_result` writes it (a test holds them equal), without
    the SDK: loading it in every session at once, just as their gateway died, took seconds. For a tool
    that declares an output `schema`, the envelope goes under `_meta`, as the gateway puts it
    (`gateway._passthrough.fitted`; no schema check here, so for every such tool).
    """
    from breakwater._wire import ENVELOPE_META_KEY, ERROR_META_KEY
    from breakwater.errors import OutcomeUnknownError
    from breakwater.gate._envelope_data import envelope, error_text

    error = OutcomeUnknownError("The shared gateway went away during this call; it may or may not have run.")
    note = {"type": "text", "text": error_text(error), "_meta": {ENVELOPE_META_KEY: True}}
    result: dict[str, Any] = {"content": [note], "structuredContent": envelope(error), "isError": True, "resultType": "complete"}
    if schema:
        result["_meta"] = {ERROR_META_KEY: result.pop("structuredContent")}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode() + b"\n"


class _Pump:
    """Client lines to the current gateway, gateway lines to the client; one gateway after another."""

    def __init__(self, loop: asyncio.AbstractEventLoop, safety: ToolSafety) -> None:
        self.loop = loop
        self.session = _Session(safety=safety)
        self.stdout: asyncio.WriteTransport | None = None
        self.stdin: asyncio.ReadTransport | None = None
        self.gateway: asyncio.Transport | None = None
        self.backlog: list[bytes] = []  # notifications and answers the client sent while no gateway was attached
        self.ended = False  # the client closed its input
        self.changed = asyncio.Event()  # the client ended, or the gateway went away
        self.client = _Lines(self._from_client, self._client_ended)
        self.mirrored = False  # the gateway reads the client itself; its mirror says what it read (`_handoff`)
        self.partial = False  # the gateway may have left the client a cut answer line

    async def open(self) -> None:
        """Read stdin and write stdout through asyncio's pipe transports."""
        out = _Lines(lambda line: None, lambda: None)
        out.on_pause, out.on_resume = self._pause_gateway, self._resume_gateway
        # Copies of the descriptors: uvloop's transports close what they drive (see `_stdio_server.transport_file`).
        out_file = os.fdopen(os.dup(1), "wb", buffering=0)
        self.stdout, _ = await self.loop.connect_write_pipe(lambda: out, out_file)
        in_file = os.fdopen(os.dup(0), "rb", buffering=0)
        self.stdin, _ = await self.loop.connect_read_pipe(lambda: self.client, in_file)

    def send(self, data: bytes) -> None:
        if self.stdout is not None and not self.stdout.is_closing():
            self.stdout.write(data)

    def _pause_gateway(self) -> None:
        if self.gateway is not None:
            self.gateway.pause_reading()

    def _resume_gateway(self) -> None:
        if self.gateway is not None and not self.gateway.is_closing():
            self.gateway.resume_reading()

    def _from_client(self, line: bytes) -> None:
        if not line.strip():
            return
        if self.mirrored:  # the gateway read it (and acts on it): only noted, for a failover
            self.session.note_request(line)
            return
        gateway = self.gateway
        if gateway is not None and not gateway.is_closing():
            # Sent before it is noted: the gateway starts on it while this process parses it (nothing can
            # answer it in between: this callback runs to its end first).
            gateway.write(line)
            self.session.note_request(line)
            return
        request = self.session.note_request(line)
        if request is None and line is not self.session.initialized:  # that one is replayed in its place
            self.backlog.append(line)
        # A request with no gateway to take it waits in `pending`: the next gateway gets it (or failover answers it).

    def _client_ended(self) -> None:
        # The end of input ends the session as it does a direct serve: the gateway sees it, finishes, and closes.
        self.ended = True
        if self.gateway is not None and not self.gateway.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                self.gateway.write_eof()
        self.changed.set()

    def _from_gateway(self, line: bytes) -> None:
        if not self.session.swallow:  # no answer of our own is due: the client's goes out before it is noted
            self.send(line)
            self.session.note_answer(line)
        elif self.session.note_answer(line):
            self.send(line)

    async def attach(self, attachment: Attachment, generation: int) -> _Lines:
        """Make `attachment` the session's gateway: tell it the session so far (all of it, after a failover), then relay."""
        lines = _Lines(self._from_gateway, self.changed.set)
        lines.on_pause = lambda: self.stdin.pause_reading() if self.stdin is not None else None
        lines.on_resume = lambda: self.stdin.resume_reading() if self.stdin is not None else None
        transport, _ = await self.loop.create_unix_connection(lambda: lines, sock=attachment.sock)
        transport.writelines([*self.session.replays(generation), *self.backlog])
        self.backlog.clear()
        self.gateway = transport
        if attachment.rest:
            lines.data_received(attachment.rest)
        if self.ended:
            self._client_ended()
        return lines

    async def watch(self, attachment: Attachment) -> bool:
        """While the gateway serves this session on its stdin and stdout, follow its mirror; True when the session ended.

        False: the gateway went away. What it read and had not answered is then in `session.pending`,
        and the start of the client's next line in `client`'s buffer, for the failover to go on from.
        This process sleeps on the bell meanwhile (`breakwater.gateway._handoff`): it wakes when the
        mirror backs up, and at the bell's end.
        """
        assert attachment.bell is not None
        self.mirrored = True
        parser = MirrorParser()
        if self._mirror(parser.feed(attachment.rest)):
            return True
        bell, sock = attachment.bell, attachment.sock
        woken = asyncio.Event()
        # Each descriptor is watched from when it must be until the end, not re-added per wait: uvloop removes a
        # descriptor from epoll when a reader's poll handle closes, which may come after a new reader was added.
        watched = [bell]
        self.loop.add_reader(bell, woken.set)
        try:
            while True:
                await woken.wait()
                woken.clear()
                try:
                    rung: bytes | None = os.read(bell, 4096)
                except BlockingIOError:
                    rung = None
                except OSError:
                    rung = b""
                if rung == b"":
                    break  # the gateway let go of the bell (or died): the socket's end says which
                # The last word counts: "!" the gateway holds mirror the socket had no room for (read it as it
                # comes), "." it is all in the socket again.
                if rung and rung.endswith(b"!") != (sock.fileno() in watched):
                    self._watch(sock.fileno(), watched, woken, rung.endswith(b"!"))
                if (ended := self._read_mirror(sock, parser)) is not None:
                    return ended
            if sock.fileno() not in watched:
                self._watch(sock.fileno(), watched, woken, True)
            while (ended := self._read_mirror(sock, parser)) is None:
                await woken.wait()
                woken.clear()
            return ended
        finally:
            for fd in watched:
                self.loop.remove_reader(fd)

    def _watch(self, fd: int, watched: list[int], woken: asyncio.Event, on: bool) -> None:
        if on:
            self.loop.add_reader(fd, woken.set)
            watched.append(fd)
        else:
            self.loop.remove_reader(fd)
            watched.remove(fd)

    def _read_mirror(self, sock: socket.socket, parser: MirrorParser) -> bool | None:
        """Read what the mirror has now: True at `E`, False at the socket's end without one (the gateway went away)."""
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
            if not data:
                self.mirrored = False
                return False
            if self._mirror(parser.feed(data)):
                return True

    def _mirror(self, records: Iterable[tuple[bytes, bytes]]) -> bool:
        """Note what the mirror's records say the gateway read and answered; True at the session's end."""
        for kind, payload in records:
            if kind == b"I":
                self.client.data_received(payload)
            elif kind == b"O":
                with contextlib.suppress(ValueError):
                    self.session.pending.pop(_id_key(json.loads(payload)), None)
            elif kind == b"L":
                self.session.note_answer(payload)
            elif kind == b"T":  # the gateway's own word on which tools only read, listed by the agent or not
                self.session.safety.learn(payload)
            elif kind in (b"P", b"C"):
                self.partial = kind == b"P"
            elif kind == b"E":
                return True
        return False

    def lost(self) -> None:
        """The gateway went away: answer every tool call in flight that may change something now; the rest are re-sent."""
        self.gateway = None
        if self.partial:  # what follows must start a line of its own
            self.partial = False
            self.send(b"\n")
        for key, (method, request_id, line) in list(self.session.pending.items()):
            if method == "tools/call" and not self.session.safety.safe_call(line):
                del self.session.pending[key]
                self.send(_cut_answer(request_id, schema=self.session.safety.declares_schema(line)))

    def fail_pending(self, why: str) -> None:
        """Answer every request still waiting with a JSON-RPC error (the gateway cannot be had)."""
        for key, (_method, request_id, _line) in list(self.session.pending.items()):
            del self.session.pending[key]
            error = {"code": -32603, "message": f"breakwater: {why}"}
            self.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode() + b"\n")

    async def close(self) -> None:
        if self.stdout is not None:
            while self.stdout.get_write_buffer_size() and not self.stdout.is_closing():
                await asyncio.sleep(0.001)
            self.stdout.close()
        if self.stdin is not None:
            self.stdin.close()
        await asyncio.sleep(0)
        for fd in (0, 1):
            with contextlib.suppress(OSError):
                os.set_blocking(fd, True)


def _reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe or socket whose reading end is closed (poll says POLLERR or POLLHUP for a writer)."""
    try:
        poller = select.poll()
    except AttributeError:  # no poll (Windows): hand-off needs POSIX descriptors passing anyway
        return False
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


async def attached_session(first: Attachment, reattach: Any, *, safety: ToolSafety, clock: Clock) -> int:
    """Relay this process's stdio to `first`, failing over through `reattach()` whenever the gateway goes away."""
    pump = _Pump(asyncio.get_running_loop(), safety)
    attachment: Attachment | None = first
    generation = 0
    try:
        if first.handed_off:
            attachment = None
            stopped: list[int] = []
            try:
                ended = False
                with _stops_through(first, stopped):
                    ended = await pump.watch(first)
                if ended or stopped:
                    if _reader_gone(1):  # the session ended because the agent stopped reading: as `| head` makes it
                        raise BrokenPipeError(errno.EPIPE, "the agent stopped reading this session's output")
                    return _stopped_code(stopped)
            finally:
                first.close()
            generation = 1
            await pump.open()  # this process's stdin and stdout are its own again
            logger.warning("breakwater: the shared gateway went away; attaching to a new one")
            pump.lost()
        else:
            await pump.open()
        while True:
            if attachment is None:
                try:
                    attachment = await _reattach_with_patience(reattach, pump, clock)
                except SessionOutdated as exc:
                    logger.error("breakwater: %s", exc)
                    pump.fail_pending(str(exc))
                    return 1
            pump.changed.clear()
            gateway = await pump.attach(attachment, generation)
            while not gateway.ended:  # the gateway closes once the client has ended, or goes away
                await pump.changed.wait()
                pump.changed.clear()
            if gateway.transport is not None:
                gateway.transport.close()
            attachment = None
            generation += 1
            if pump.ended:
                break
            logger.warning("breakwater: the shared gateway went away; attaching to a new one")
            pump.lost()
    finally:
        if attachment is not None:
            attachment.close()
        await pump.close()
    return 0


@contextlib.contextmanager
def _stops_through(attachment: Attachment, stopped: list[int]) -> Iterator[None]:
    """While a handed-over session runs in the gateway, a stop signal asks the gateway to end it (`_handoff.STOP`).

    The first signal is noted in `stopped`; the gateway drains the session and ends it, and the mirror says so.
    A second one cancels the watch (this process exits at once, and the socket's end cuts what is left).
    """
    loop = asyncio.get_running_loop()
    scope = anyio.CancelScope()

    def asked(signum: int) -> None:  # on the loop, after the signal's handler (`_platform.on_stop_signals`)
        if stopped:
            scope.cancel()
            return
        stopped.append(signum)
        with contextlib.suppress(OSError):
            attachment.sock.send(STOP)

    def on_signal(signum: int) -> None:  # on the main thread, between two steps of the loop
        loop.call_soon_threadsafe(asked, signum)

    with _platform.on_stop_signals(on_signal), scope:
        yield


#: `serve`'s exit code after Ctrl-C, as every command's (`cli._common.EXIT_INTERRUPTED`: 128 + SIGINT).
INTERRUPTED = 130


def _stopped_code(stopped: list[int]) -> int:
    """The exit code of a session that ended: `INTERRUPTED` after Ctrl-C; 0 otherwise (a hang-up is told apart above)."""
    return INTERRUPTED if signal.SIGINT in stopped else 0


async def _reattach_with_patience(reattach: Any, pump: _Pump, clock: Clock) -> Attachment:
    """A new gateway, trying again (with a growing pause) while none can be had.

    Requests keep waiting for the next gateway only for a while: once the gateway has been gone for
    `GIVE_UP_S`, each failed try answers every request waiting with an error, so a session whose
    gateway cannot be restarted (its config deleted, say) answers everything instead of hanging.
    """
    pause = 0.05
    since = clock.monotonic()
    while True:
        try:
            attachment: Attachment = await reattach()
            return attachment
        except (OSError, TimeoutError, AttachRefused) as exc:
            logger.warning("breakwater: cannot attach to a shared gateway (%s); trying again", exc)
            if clock.monotonic() - since >= GIVE_UP_S:
                pump.fail_pending(f"the shared gateway is gone and could not be restarted: {exc}")
            await clock.sleep(pause)
            pause = min(pause * 2, 2.0)
