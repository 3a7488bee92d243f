"""A stdio session attached to the shared local gateway: find it (or start it), then relay bytes both ways.

`breakwater serve` over stdio calls `attached_session`: it connects to the gateway of its config's
fingerprint (`breakwater.gateway._share`), starting one detached when none answers (under a lock,
so sessions that start together start one gateway), and then copies the client's lines to the
socket and the gateway's lines to stdout. The MCP session itself runs in the gateway; this process
only reads enough of each line to know which requests are waiting for an answer.

That is what failover needs. When the gateway goes away mid-session (killed, crashed, stopped),
every request in flight still gets its answer: a `tools/call` is answered `OUTCOME_UNKNOWN` (it may
have run; never repeated behind the agent's back), any other request (lists, reads, pings) is sent
again. The session then attaches to a new gateway (starting it), replays its `initialize` and its
log level there, and goes on; the agent sees one error at most, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from breakwater._clock import Clock
from breakwater.gateway._share import HANDSHAKE_LIMIT, peer_uid

__all__ = ["AttachRefused", "Attachment", "attached_session", "connect_gateway", "relayable"]

#: As `breakwater.gateway._stdio_server.MAX_LINE_BYTES` (not imported: that module loads the SDK, and an
#: attached session is a byte pump that starts in a fraction of a second without it).
MAX_LINE_BYTES = 64 * 1024 * 1024

logger = logging.getLogger("breakwater.gateway.attach")

#: How long a session waits for the gateway it started to answer before it serves on its own.
SPAWN_WAIT_S = 15.0
_POLL_S = 0.01
#: How long requests wait for a new gateway before they are answered with an error.
GIVE_UP_S = 5.0
_REPLAY = "breakwater-replay-"
#: The start of every response the SDK writes (`model_dump_json` keeps the declared field order).
_RESPONSE = re.compile(rb'^\{"jsonrpc":"2\.0","id":(-?\d+|"(?:[^"\\]|\\.)*"),"(result|error)"')


def relayable() -> bool:
    """Whether stdin and stdout can be polled (pipes, sockets, terminals: what agents give); else serve directly."""
    for fd in (0, 1):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return False
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))):
            return False
    return True


class _Stdout:
    """Whole lines to fd 1, through asyncio's pipe writer; only ever written from the relay's main task, so unlocked."""

    def __init__(self) -> None:
        self._writer: asyncio.StreamWriter | None = None

    async def open(self, loop: asyncio.AbstractEventLoop) -> None:
        out_file = os.fdopen(1, "wb", buffering=0, closefd=False)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out_file)
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def send(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._writer.drain()
            self._writer.close()


async def _stdin(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    in_file = os.fdopen(0, "rb", buffering=0, closefd=False)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), in_file)
    return reader, transport


async def _next_line(reader: asyncio.StreamReader) -> tuple[bytes | None, bool]:
    """The next line (None at the end of input), and whether it was over MAX_LINE_BYTES (then skipped whole)."""
    oversized = False
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return (b"", True) if oversized else ((exc.partial or None), False)
        except asyncio.LimitOverrunError as exc:
            await reader.readexactly(exc.consumed)
            oversized = True
            continue
        return (b"" if oversized else line), oversized


class AttachRefused(Exception):
    """A gateway answered, but will not take this session (another version, another user, a bad handshake)."""


@dataclass
class Attachment:
    """An open, handshaken connection to a shared gateway."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    info: dict[str, Any]

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.close()


async def connect_gateway(path: Path, hello: dict[str, Any]) -> Attachment | None:
    """Connect and shake hands; None when nothing listens at `path`, `AttachRefused` when the gateway says no."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE_BYTES)
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    attachment = Attachment(reader, writer, {})
    try:
        sock = writer.get_extra_info("socket")
        uid = peer_uid(sock) if sock is not None else None
        if uid is not None and hasattr(os, "getuid") and uid != os.getuid():
            raise AttachRefused(f"the gateway at {path} runs as uid {uid}, not as this user")
        writer.write(json.dumps(hello).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
        try:
            info = json.loads(line[:HANDSHAKE_LIMIT]) if line else None
        except ValueError:
            info = None
        if not isinstance(info, dict) or info.get("breakwater") != "gateway":
            raise AttachRefused(f"what listens at {path} is not a breakwater gateway")
        if not info.get("ok"):
            raise AttachRefused(str(info.get("reason") or "refused"))
        attachment.info = info
        return attachment
    except BaseException:
        attachment.close()
        raise


async def _lock(path: Path, clock: Clock, deadline: float) -> Any:
    """The start-up lock (a `filelock.FileLock`, held), polled on the clock; None if `deadline` passed first."""
    import filelock

    lock = filelock.FileLock(str(path), mode=0o600)
    while True:
        try:
            lock.acquire(timeout=0)
            return lock
        except filelock.Timeout:
            if clock.monotonic() >= deadline:
                return None
            await clock.sleep(_POLL_S)


async def open_attachment(
    sock_path: Path, lock_path: Path, hello: dict[str, Any], spawn: Sequence[str], log_path: Path, clock: Clock
) -> Attachment:
    """Attach to the gateway at `sock_path`, starting it with `spawn` (detached, logging to `log_path`) if none answers.

    Raises `AttachRefused` when a gateway refuses, `TimeoutError` when the started one never answers.
    """
    found = await connect_gateway(sock_path, hello)
    if found is not None:
        return found
    deadline = clock.monotonic() + SPAWN_WAIT_S
    lock = await _lock(lock_path, clock, deadline)
    try:
        found = await connect_gateway(sock_path, hello)  # started by whoever held the lock
        if found is not None:
            return found
        with log_path.open("ab") as log:
            child = subprocess.Popen(
                list(spawn), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
            )
        while clock.monotonic() < deadline:
            found = await connect_gateway(sock_path, hello)
            if found is not None:
                return found
            if child.poll() is not None:
                raise TimeoutError(f"the shared gateway exited with code {child.returncode} (its log: {log_path})")
            await clock.sleep(_POLL_S)
        raise TimeoutError(f"the shared gateway did not answer within {SPAWN_WAIT_S:g} s (its log: {log_path})")
    finally:
        if lock is not None:
            lock.release()


def _id_key(raw: Any) -> str:
    return json.dumps(raw)


@dataclass
class _Session:
    """What this session must be able to replay or answer if its gateway goes away."""

    initialize: dict[str, Any] | None = None
    initialized: bytes | None = None
    set_level: dict[str, Any] | None = None
    pending: dict[str, tuple[str, Any, bytes]] = field(default_factory=dict)  # id key -> (method, id, line)
    swallow: set[str] = field(default_factory=set)

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
        match = _RESPONSE.match(line)
        if match is None:
            if b'"id"' not in line[:200] or b'"method"' in line:
                return True
            try:
                message = json.loads(line)
            except ValueError:
                return True
            if not isinstance(message, dict) or "id" not in message or "method" in message:
                return True
            key = _id_key(message["id"])
        else:
            key = _id_key(json.loads(match.group(1)))
        if key in self.swallow:
            self.swallow.discard(key)
            return False
        self.pending.pop(key, None)
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


def _cut_answer(request_id: Any) -> bytes:
    """The answer a tool call in flight gets when the gateway under it went away: OUTCOME_UNKNOWN, as the gate answers a cut."""
    from breakwater.errors import OutcomeUnknownError
    from breakwater.gate._envelope import error_result

    error = OutcomeUnknownError("The shared gateway went away during this call; it may or may not have run.")
    result = error_result(error).model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode() + b"\n"


class _Pump:
    """Client lines to the current gateway, gateway lines to the client; one gateway after another."""

    def __init__(self, output: _Stdout, reader: asyncio.StreamReader, builtins: frozenset[str]) -> None:
        self.output = output
        self.client = reader
        self.session = _Session()
        self.builtins = builtins
        self.writer: asyncio.StreamWriter | None = None
        self.switched = anyio.Event()  # set (and replaced) whenever `writer` changes
        self.ended = False

    async def from_client(self) -> None:
        while True:
            line, oversized = await _next_line(self.client)
            if line is None:
                break
            if oversized or not line.strip():
                continue  # an oversized line cannot be relayed whole; the agent's SDK never sends one
            if not line.endswith(b"\n"):
                line += b"\n"
            request = self.session.note_request(line)
            await self._send(line, request)
        # The end of input ends the session as it does a direct serve: the gateway sees it, finishes, and closes.
        self.ended = True
        if self.writer is not None:
            with contextlib.suppress(OSError, RuntimeError):
                self.writer.write_eof()

    async def _send(self, line: bytes, request: str | None) -> None:
        failed: asyncio.StreamWriter | None = None
        while True:
            writer = self.writer
            if writer is None or writer is failed:
                switched = self.switched
                await switched.wait()
                continue
            try:
                writer.write(line)
                await writer.drain()
                return
            except (OSError, RuntimeError):
                if request is not None and request in self.session.pending:
                    return  # failover answers it or sends it again; sending it here too would repeat it
                failed = writer

    async def from_gateway(self, attachment: Attachment) -> None:
        """Relay one gateway's lines until it closes."""
        reader = attachment.reader
        while True:
            try:
                line = await reader.readline()
            except (OSError, ValueError, asyncio.LimitOverrunError):
                return
            if not line:
                return
            if self.session.note_answer(line):
                await self.output.send(line)

    async def switch_to(self, attachment: Attachment, generation: int) -> None:
        """Make `attachment` the session's gateway: replay the session there, re-send what is safe to re-send."""
        writer = attachment.writer
        if generation:
            for line in self.session.replays(generation):
                writer.write(line)
            await writer.drain()
        self.writer = writer
        self.switched.set()
        self.switched = anyio.Event()

    async def lost(self) -> None:
        """The gateway went away: answer every tool call in flight now; the rest are re-sent to the next one."""
        self.writer = None
        for key, (method, request_id, line) in list(self.session.pending.items()):
            if method == "tools/call" and not self._builtin_call(line):
                del self.session.pending[key]
                await self.output.send(_cut_answer(request_id))

    async def fail_pending(self, why: str) -> None:
        """Answer every request still waiting with a JSON-RPC error (the gateway cannot be had)."""
        for key, (_method, request_id, _line) in list(self.session.pending.items()):
            del self.session.pending[key]
            error = {"code": -32603, "message": f"breakwater: {why}"}
            await self.output.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode() + b"\n")

    def _builtin_call(self, line: bytes) -> bool:
        # breakwater's own search and status tools change nothing: asking again is safe.
        with contextlib.suppress(ValueError, AttributeError):
            return bool(json.loads(line).get("params", {}).get("name") in self.builtins)
        return False


async def attached_session(
    first: Attachment,
    reattach: Any,
    *,
    builtins: frozenset[str],
    clock: Clock,
) -> int:
    """Relay this process's stdio to `first`, failing over through `reattach()` whenever the gateway goes away."""
    loop = asyncio.get_running_loop()
    reader, read_transport = await _stdin(loop)
    output = _Stdout()
    await output.open(loop)
    pump = _Pump(output, reader, builtins)
    attachment: Attachment | None = first
    generation = 0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump.from_client)
            while not pump.ended:
                if attachment is None:
                    attachment = await _reattach_with_patience(reattach, pump, clock)
                await pump.switch_to(attachment, generation)
                await pump.from_gateway(attachment)
                attachment.close()
                attachment = None
                generation += 1
                if pump.ended:
                    break
                logger.warning("breakwater: the shared gateway went away; attaching to a new one")
                await pump.lost()
            tg.cancel_scope.cancel()
    finally:
        if attachment is not None:
            attachment.close()
        await output.close()
        read_transport.close()
        await asyncio.sleep(0)
        for fd in (0, 1):
            with contextlib.suppress(OSError):
                os.set_blocking(fd, True)
    return 0


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
                await pump.fail_pending(f"the shared gateway is gone and could not be restarted: {exc}")
            await clock.sleep(pause)
            pause = min(pause * 2, 2.0)
