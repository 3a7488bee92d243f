"""An attached session's stdin and stdout, handed to the shared gateway: what both sides say about them.

Why. A session relayed through its `serve` process (`breakwater.gateway._pump`) is four processes
on every call (agent, `serve`, gateway, upstream), and on a 2-core machine the fourth one costs more
than its code: two byte relays chained cost +0.47 ms a call where one costs +0.06 ms
(docs/benchmarks.md, issue 16). So at its first attach `serve` passes its stdin and stdout to the
gateway with the handshake line (SCM_RIGHTS), and the gateway serves the session on them directly,
as `serve --no-share` serves its own: `serve` is off the call path, asleep. The hand-over is
three steps: `serve` offers (`"handoff": true` in its handshake line), the gateway accepts (the same in
its answer), and only then does `serve` send the descriptors (`hand_over`), so neither side reads
the agent's input while the other might.

What failover still needs. If the gateway dies, `serve` must answer every request in flight (the
reads again, OUTCOME_UNKNOWN for the rest) and carry on. So the gateway tells it, over the session's
socket, what it read and what it answered: the *mirror*, a stream of records (`RECORD`):

    I <bytes>    a chunk read from the agent, written before the gateway acts on it (write-ahead)
    O <id>       the JSON id of an answer the gateway wrote to the agent (batched: `MIRROR_FLUSH_S`)
    L <line>     a whole `tools/list` answer, from which `serve` learns which tools only read
    T <json>     the session's tools as the gateway sees them (which only read, which declare an output
                 schema): at the start and at each change, so that needs no `tools/list` of the agent's
    P            an answer line is still partly unwritten (the agent's pipe was full)
    C            the last partly written line has been written since
    E            the session ended (the agent closed its input, or `serve` asked): nothing to fail over

The other way, `serve` writes one thing on the socket: `STOP` (one byte), when a stop signal reached it
(SIGTERM, Ctrl-C, a hang-up). The gateway then ends the session as a stop signal ends a `serve
--no-share` one: it refuses each new request at once (nothing run), its calls in flight get `[gateway] drain_s`
(the rest are cut with the gate's envelope), their answers go out, and `E` follows. A second signal
makes `serve` exit at once: the socket's end cuts what is left. Killed by the first, `serve` left the
gateway to answer every call in flight a bare "Connection closed", half done.

`serve` does not read the mirror per call: the agent's calls never wake it. The records wait in the
socket's kernel buffer. With the descriptors `serve` sends the write end of a pipe of its own, the
*bell*, and sleeps until its read end wakes it: the gateway rings (one byte) when the mirror backs
up (the socket's buffer is full, so `serve` must read it now), and the bell's end, when the gateway
closes it or dies, says the session is over or the gateway gone; `serve` then reads the socket to
its end and knows which (`E`). Gone: `serve` takes its stdin and stdout back (the mirror's unfinished
last chunk is the start of its next line), answers what was in flight and relays through a new
gateway as before.

Where the mirror can be behind: an answer written in the instant before the gateway died, its `O`
not yet sent, is answered a second time (the agent ignores an answer to an id it no longer waits
for); an answer cut mid-line (`P` without `C`) is ended with a newline first, so the failover's
answers start on a line of their own. While the mirror is backed up the gateway reads no more of the
agent's input, so it never holds more than one chunk that `serve` has not been sent. What it read
and could not yet hand to the kernel when it was killed (a chunk it read in the microsecond before,
or the tail of one larger than the socket's buffer while `serve` was being woken to read it) is
lost with it: a request there would not be answered. That is the one case this design accepts.

This module imports neither asyncio nor the SDK: `serve` uses it before its loop exists.
"""

from __future__ import annotations

import array
import os
import re
import socket
import stat
import struct
from collections.abc import Iterator

__all__ = [
    "CAN_HAND_OFF",
    "MIRROR_FLUSH_S",
    "RECORD",
    "STOP",
    "MirrorParser",
    "answer_id",
    "can_offer",
    "hand_over",
    "handable",
    "is_pipe",
    "record",
]

#: How long the gateway holds answered ids before it sends them to the session (lazily: a lost `O` costs
#: at most a duplicate answer at a failover, never a lost one).
MIRROR_FLUSH_S = 0.05
#: Whether this platform passes descriptors over a Unix socket (not Windows, which does not share anyway).
CAN_HAND_OFF = hasattr(socket, "SCM_RIGHTS") and hasattr(socket, "recv_fds")
#: What `serve` writes on a handed-over session's socket when a stop signal reached it: drain the session, then end it.
STOP = b"S"
#: Each record: one kind byte and a 4-byte big-endian payload length, then the payload.
RECORD = struct.Struct(">cI")
#: The start of every response the SDK writes (`model_dump_json` keeps the declared field order).
_RESPONSE = re.compile(rb'^\{"jsonrpc":"2\.0","id":(-?\d+|"(?:[^"\\]|\\.)*"),"(result|error)"')


def record(kind: bytes, payload: bytes = b"") -> bytes:
    """One mirror record."""
    return RECORD.pack(kind, len(payload)) + payload


def answer_id(line: bytes) -> bytes | None:
    """The JSON text of the id `line` answers, or None when it is no answer (a request, a notification, no JSON)."""
    match = _RESPONSE.match(line)
    if match is not None:
        return match.group(1)
    if b'"id"' not in line[:200] or b'"method"' in line:
        return None
    import json

    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or "id" not in message or "method" in message:
        return None
    return json.dumps(message["id"]).encode()


def handable(fd: int) -> bool:
    """Whether the gateway can serve a session on `fd`: a pipe or a socket (a terminal stays with `serve`)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def is_pipe(fd: int) -> bool:
    """Whether `fd` is a pipe (the bell)."""
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def can_offer() -> bool:
    """Whether this session can hand its stdin and stdout to the gateway: pipes or sockets, on a platform that passes them."""
    return CAN_HAND_OFF and handable(0) and handable(1)


def hand_over(sock: socket.socket) -> int:
    """Send this process's stdin and stdout, and a bell's write end, to the gateway, which has just said it will serve
    the session on them; the bell's read end is returned (non-blocking).

    From here on this process must not read its stdin nor write its stdout until the gateway is gone.
    """
    bell, ringer = os.pipe()
    try:
        fds = array.array("i", (0, 1, ringer))
        if sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]) != 1:
            raise OSError("the handshake socket took none of the hand-over")
    except BaseException:
        os.close(bell)
        raise
    finally:
        os.close(ringer)  # the gateway's now: its end (closed, or its process gone) is what wakes us
    os.set_blocking(bell, False)
    return bell


class MirrorParser:
    """Mirror records out of the bytes `serve` reads from its socket, in order, whatever the chunking."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every whole record `data` completes, as (kind, payload)."""
        self._buffer += data
        start, size = 0, len(self._buffer)
        while size - start >= RECORD.size:
            kind, length = RECORD.unpack_from(self._buffer, start)
            end = start + RECORD.size + length
            if end > size:
                break
            yield kind, bytes(self._buffer[start + RECORD.size : end])
            start = end
        del self._buffer[:start]
