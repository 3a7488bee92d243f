"""The shared gateway's side of a session whose `serve` handed over its stdin and stdout (`breakwater.gateway._handoff`).

The session is served on the agent's own pipes, exactly as `serve --no-share` serves its own; what
is read and answered is mirrored to the session's socket, so that its `serve` can fail over if this
gateway dies. The mirror's costs on the call path: one socket write per chunk read (the chunk, with
any answered ids that wait, in one record each) and a regular-expression match per line written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types

from breakwater._clock import Clock
from breakwater.connect._lines import HandOffReader
from breakwater.gateway._handoff import MIRROR_FLUSH_S, STOP, answer_id, record
from breakwater.gateway._stdio_server import LineOutput
from breakwater.gateway._waits import first_of

if TYPE_CHECKING:
    from breakwater.gateway._server import Gateway

__all__ = ["HandedOutput", "Mirror", "MirrorSocket", "MirroredReader", "tell_tools", "until_closed"]

_NO_HINTS = types.ToolAnnotations()
#: How long a session's last answers may take to reach an agent that has stopped reading, once the session ends.
CLOSE_WAIT_S = 1.0


class Mirror:
    """The records a handed-over session's `serve` needs to fail over, written to its socket; `bell` wakes it to read them."""

    def __init__(self, transport: asyncio.WriteTransport, bell: int, clock: Clock) -> None:
        self._transport = transport
        os.set_blocking(bell, False)  # a bell that cannot take a byte has plenty waiting already
        self._bell: int | None = bell
        self._clock = clock
        self._answered: list[bytes] = []
        self._due = anyio.Event()
        self._partial = False
        #: The ids (JSON text) of the `tools/list` requests read and not yet answered: their answers go whole.
        self._lists: set[str] = set()
        #: The agent's input, paused while the mirror is backed up (`backed_up`).
        self.input: asyncio.ReadTransport | None = None

    def read(self, data: bytes) -> None:
        """A chunk read from the agent, before anything acts on it; the answered ids waiting go with it."""
        if b'"tools/list"' in data:
            self._note_lists(data)
        if self._answered:
            self._answered.append(record(b"I", data))
            self._transport.write(b"".join(self._answered))
            self._answered.clear()
        else:
            self._transport.write(record(b"I", data))

    def wrote(self, data: bytes, unwritten: int) -> None:
        """`data` (whole lines) was handed to the agent's pipe; `unwritten` bytes of it, or before it, are still buffered."""
        if unwritten and not self._partial:
            self._partial = True
            self._transport.write(record(b"P"))  # at once: a failover must end the cut line first
        elif not unwritten and self._partial:
            self._partial = False
            self._later(record(b"C"))
        for line in data.splitlines(keepends=True) if data.count(b"\n") > 1 else (data,):
            key = answer_id(line)
            if key is None:
                continue
            if self._lists and _normal(key) in self._lists:
                self._lists.discard(_normal(key))
                self._transport.write(record(b"L", line))
            else:
                self._later(record(b"O", key))

    def ended(self) -> None:
        """The agent closed its input and the session is over: nothing to fail over."""
        self._transport.write(b"".join([*self._answered, record(b"E")]))
        self._answered.clear()
        self.close()

    def tools(self, payload: bytes) -> None:
        """Which tools only read, for `serve`'s failover (`tell_tools`)."""
        self._transport.write(record(b"T", payload))

    def stop_input(self) -> None:
        """Read no more of the agent's input (a stop's drain): what it sends next waits in its pipe for `serve`."""
        if self.input is not None and not self.input.is_closing():
            self.input.pause_reading()
        self.input = None  # nor again when the mirror drains

    async def let_go(self, output: HandedOutput) -> None:
        """The end of a stop's drain: the last answers out, their ids to `serve`, and from here nothing more to the agent."""
        await output.close()
        if self._answered and not self._transport.is_closing():
            self._transport.write(b"".join(self._answered))
            self._answered.clear()

    def close(self) -> None:
        """Let go of the bell: its end wakes `serve`, which reads the socket to its end (`E`: the session is over)."""
        if self._bell is not None:
            os.close(self._bell)
            self._bell = None

    def backed_up(self) -> None:
        """The socket's buffer is full: what is left over waits here, where our death would lose it. `serve` must read,
        and no more of the agent's input is read meanwhile, so that at most one chunk is ever held here."""
        self._ring(b"!")
        if self.input is not None and not self.input.is_closing():
            self.input.pause_reading()

    def drained(self) -> None:
        """All of the mirror is in the socket again: `serve` may go back to sleep, and the agent's input is read again."""
        self._ring(b".")
        if self.input is not None and not self.input.is_closing():
            self.input.resume_reading()

    def _ring(self, signal: bytes) -> None:
        if self._bell is not None:
            with contextlib.suppress(OSError):  # its reader gone: nobody to wake
                os.write(self._bell, signal)

    async def flushing(self) -> None:
        """Send the answered ids that wait, `MIRROR_FLUSH_S` after the first of them (a chunk read sends them sooner)."""
        while True:
            await self._due.wait()
            self._due = anyio.Event()
            await self._clock.sleep(MIRROR_FLUSH_S)
            if self._answered and not self._transport.is_closing():
                self._transport.write(b"".join(self._answered))
                self._answered.clear()

    def _later(self, data: bytes) -> None:
        if not self._answered:
            self._due.set()
        self._answered.append(data)

    def _note_lists(self, data: bytes) -> None:
        for line in data.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                message = json.loads(line)
                if message.get("method") == "tools/list" and "id" in message:
                    self._lists.add(json.dumps(message["id"]))


def _normal(key: bytes) -> str:
    """An id's JSON text as `json.dumps` writes it (the SDK's serializer may escape differently)."""
    try:
        return json.dumps(json.loads(key))
    except ValueError:
        return key.decode("utf-8", "replace")


class MirrorSocket(asyncio.StreamReaderProtocol):
    """The protocol of an attached session's socket: once a mirror is attached, its flow control rings the bell.

    The transport's write buffer limits are then zero, so "paused" means: some of the mirror is not in
    the kernel yet; "resumed": all of it is.
    """

    mirror: Mirror | None = None

    def attach(self, mirror: Mirror) -> None:
        """From now on this socket carries `mirror`."""
        self.mirror = mirror
        transport = self._transport  # type: ignore[attr-defined]  # asyncio's own, set in `connection_made`
        transport.set_write_buffer_limits(high=0, low=0)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.mirror is not None:
            self.mirror.backed_up()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.mirror is not None:
            self.mirror.drained()


class MirroredReader(HandOffReader):
    """The agent's input: each chunk is mirrored before it is read (or handed to the call lane)."""

    def __init__(self, mirror: Mirror, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._mirror = mirror

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]  # asyncio feeds it bytes
        self._mirror.read(data)
        super().feed_data(data)


class HandedOutput(LineOutput):
    """Lines to the agent's own stdout, each noted in the mirror; closed within `CLOSE_WAIT_S` at the end."""

    def __init__(self, fd: int, mirror: Mirror, clock: Clock) -> None:
        super().__init__(fd, fast=True)
        self._mirror = mirror
        self._clock = clock
        self._closed = False

    async def open(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await super().open(loop)  # on a copy of the descriptor
        finally:
            assert self._fd is not None
            os.close(self._fd)
        self._fd = None

    async def send(self, data: bytes) -> None:
        async with self._lock:
            writer = self._writer
            if writer is None or self.broken:  # closed (the session is ending), or the agent stopped reading
                return
            try:
                writer.write(data)
                self._mirror.wrote(data, writer.transport.get_write_buffer_size())
                await writer.drain()
            except (OSError, RuntimeError) as exc:
                self._failed(exc, writer.transport)  # the agent stopped reading (`| head`): its session ends

    async def close(self) -> None:
        """Let the agent have what is buffered, for a while, then close its pipe (it sees the end of the session)."""
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:  # never opened
            os.close(self._fd)
            self._fd = None
        writer, self._writer = self._writer, None
        if writer is None:
            return
        # Shielded: a session ends by cancellation too (the gateway stops), and its pipe must be let go then as well.
        with anyio.CancelScope(shield=True):
            deadline = self._clock.monotonic() + CLOSE_WAIT_S
            with self._clock.deadline_scope(deadline), contextlib.suppress(ConnectionError, RuntimeError):
                await writer.drain()
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()
            else:
                writer.transport.close()


async def until_closed(
    reader: asyncio.StreamReader,
    scope: anyio.CancelScope,
    on_stop: Callable[[], Coroutine[Any, Any, None]],
    on_close: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """Wait for the end of a handed-over session's socket (its `serve` went away), run `on_close`, then cancel `scope`.

    `STOP` on it (a stop signal reached `serve`) runs `on_stop`, which drains the session and ends it. The socket's
    end (a second signal: `serve` exits at once; or it was killed) runs `on_close`, which cuts the calls still in
    flight through the drain, so that each is answered with the gate's envelope on the agent's pipe, which this
    gateway still holds: cancelled at once instead, they were answered a bare -32000 "Connection closed".
    """
    async with anyio.create_task_group() as tg:
        stopping = False
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if STOP in data and not stopping:
                    stopping = True
                    tg.start_soon(on_stop)
        await on_close()
        scope.cancel()


async def tell_tools(gateway: Gateway, mirror: Mirror) -> None:
    """Tell the session's `serve`, in its mirror, which tools only read: at once, and again whenever they change.

    So its failover sends a read-only call in flight again even when the agent never listed the tools
    (`_pump.ToolSafety`). Off the call path: this wakes only when a server or the catalog changes.
    """
    told = b""
    while True:
        tools = [
            {
                "name": entry.name,
                "annotations": {"readOnlyHint": (entry.tool.annotations or _NO_HINTS).read_only_hint is True},
                "outputSchema": None if entry.tool.output_schema is None else {},
            }
            for entry in gateway.entries()
        ]
        payload = json.dumps({"result": {"tools": tools}}).encode()
        if payload != told:
            mirror.tools(payload)
            told = payload
        await first_of(gateway.bw.wait_changed, gateway.catalog.wait_changed)
