"""A stdio server's stdout, line by line: bounded, linear in its size, and quiet about junk.

The SDK's reader joins each chunk onto the line read so far (`buffer + chunk`), which copies a long
line's beginning again at every 64 KiB chunk: a 50 MB answer costs gigabytes of copying and holds
the event loop (every other server's calls) for seconds. Here the pieces of a line are kept apart
and joined once, and a line longer than `[call] max_result_bytes` is not kept at all: only its
head and tail survive (to find the request it answers), and the request gets a RESULT_TOO_LARGE
error instead of the answer.

The SDK also logs a full traceback for every stdout line that is not JSON-RPC (a server that prints
a banner or debug text writes one per call). Such lines are dropped (they were never messages) and
logged once per kind, then counted: a summary at the 10th, 100th, 1000th... so a chatty server
costs a few log lines, not one traceback per line. The SDK's HTTP and SSE clients log a traceback for
every event that is not JSON-RPC too: `quiet_sdk_junk_logs` puts the same limit on those records.
May import the core leaves only.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp.types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from breakwater._wire import RESULT_TOO_LARGE

__all__ = [
    "UPSTREAM_NAME",
    "HandOffReader",
    "LineSplitter",
    "Oversized",
    "StdoutParser",
    "is_power_of_ten",
    "quiet_sdk_junk_logs",
]

logger = logging.getLogger("breakwater.stdio")

#: Bytes kept of each end of an oversized line: enough for the envelope's `"id"`, wherever a
#: server's JSON encoder puts it (the Python SDK first, the TypeScript SDK last).
_KEEP = 1024
_MAX_PENDING = 10_000  # far above any server's calls in flight (max_in_flight)
_SAMPLE = 80  # characters of a junk line shown in the log
_ID_RE = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line longer than the limit: its size and both ends (the middle was dropped unread)."""

    size: int
    head: bytes
    tail: bytes


class LineSplitter:
    """Bytes in, complete lines out; a line over `limit` bytes comes out as an `Oversized`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set once the line in progress went over the limit
        self._tail = b""

    @property
    def between_lines(self) -> bool:
        """Whether no line is in progress (the last chunk fed ended with its newline)."""
        return self._size == 0 and self._head is None

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        """The lines `chunk` completes (without their newlines)."""
        done: list[bytes | Oversized] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            done.append(self._finish())
            start = end + 1
        self._add(chunk[start:])
        return done

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._head is not None:
            self._tail = (self._tail + piece)[-_KEEP:]
        elif self._size > self.limit:
            joined = b"".join(self._parts) + piece
            self._head, self._tail, self._parts = joined[:_KEEP], joined[-_KEEP:], []
        else:
            self._parts.append(piece)

    def _finish(self) -> bytes | Oversized:
        line: bytes | Oversized
        if self._head is not None:
            line = Oversized(self._size, self._head, self._tail)
        else:
            line = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._size, self._head, self._tail = [], 0, None, b""
        return line


class StdoutParser:
    """Lines of one server's stdout to session messages, remembering which requests await an answer."""

    def __init__(self, server: str, limit: int) -> None:
        self.server = server
        self.limit = limit
        #: Requests sent and not yet answered, by id (their method): an oversized answer is matched to one.
        self.pending: dict[Any, str] = {}
        #: Messages the server sent on its own (notifications, requests) so far: while it stays put,
        #: nothing is on its way to a callback (the gateway's relay skips waiting for deliveries).
        self.notices = 0
        self._junk: dict[str, int] = {}

    def sent(self, message: SessionMessage) -> None:
        """A message went to the server's stdin."""
        inner = message.message
        if isinstance(inner, types.JSONRPCRequest):
            if len(self.pending) >= _MAX_PENDING:  # answers lost some other way; keep the newest
                del self.pending[next(iter(self.pending))]
            self.pending[inner.id] = inner.method
        elif isinstance(inner, types.JSONRPCNotification) and inner.method == "notifications/cancelled":
            # A cancelled request may never be answered: do not wait for it forever.
            self.pending.pop((inner.params or {}).get("requestId"), None)

    def parse(self, line: bytes | Oversized) -> SessionMessage | None:
        """The message on `line`, an error for the request an oversized line answered, or None to drop it."""
        if isinstance(line, Oversized):
            return self._too_large(line)
        if not line.strip():
            return None
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            try:  # as the SDK reads it: invalid UTF-8 becomes U+FFFD, not a lost message
                message = types.jsonrpc_message_adapter.validate_json(line.decode("utf-8", "replace"), by_name=False)
            except ValueError:
                return self._malformed(line)
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            self.pending.pop(message.id, None)
        else:
            self.notices += 1
        return SessionMessage(message)

    def _malformed(self, line: bytes) -> SessionMessage | None:
        """An error for the request in flight that `line` answers without being a JSON-RPC response (`"result":
        null`, an `error` that is a string); any other line that is no JSON-RPC message is junk (`_note_junk`).

        Dropped as junk, such an answer left its call waiting for the whole timeout, and the model was told the
        server was slow and the outcome unknown, when the server had answered at once."""
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            data = None
        request_id = data.get("id") if isinstance(data, dict) and "method" not in data else None
        if not isinstance(request_id, int | str) or isinstance(request_id, bool) or request_id not in self.pending:
            self._note_junk(line)
            return None
        assert isinstance(data, dict)
        method = self.pending.pop(request_id)
        if isinstance(data.get("error"), dict):
            what = "an error object without a valid code and message"
        elif "error" in data:
            what = f"an error that is {_kind(data['error'])}, not a JSON-RPC error object"
        elif "result" in data:
            what = f"a result that is {_kind(data['result'])}, not an object"
        else:
            what = "neither a result nor an error"
        logger.warning("%s answered %s with %s; the request fails with that", self.server, method, what)
        error = types.ErrorData(code=types.INTERNAL_ERROR, message=f"the server answered with {what}")
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    def _too_large(self, line: Oversized) -> SessionMessage | None:
        request_id = self._answered_id(line)
        if request_id is None:
            logger.warning(
                "%s wrote a %d-byte line on stdout, over [call] max_result_bytes = %d, that answers no request "
                "in flight; dropped unread",
                self.server,
                line.size,
                self.limit,
            )
            return None
        method = self.pending.pop(request_id)
        logger.info(  # the caller gets RESULT_TOO_LARGE and the journal records it: no warning per call
            "%s answered %s with %d bytes, over [call] max_result_bytes = %d; dropped unread",
            self.server,
            method,
            line.size,
            self.limit,
        )
        error = types.ErrorData(
            code=RESULT_TOO_LARGE,
            message=f"the answer was {line.size} bytes, over [call] max_result_bytes = {self.limit}; it was dropped unread",
            data={"bytes": line.size, "max_result_bytes": self.limit},
        )
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    def _answered_id(self, line: Oversized) -> Any:
        for end in (line.head, line.tail):
            for match in _ID_RE.finditer(end):
                try:
                    candidate = json.loads(match.group(1))
                except ValueError:
                    continue
                if candidate in self.pending:
                    return candidate
        # Ends that name no id in flight (cut mid-way through it): with one request waiting, it is that one's.
        if len(self.pending) == 1:
            return next(iter(self.pending))
        return None

    def _note_junk(self, line: bytes) -> None:
        try:
            json.loads(line)
            kind = "JSON but not a JSON-RPC message"
        except ValueError:
            kind = "not JSON"
        count = self._junk.get(kind, 0) + 1
        self._junk[kind] = count
        if count == 1:
            sample = line[:_SAMPLE].decode("utf-8", "replace")
            logger.warning(
                "%s wrote a line on stdout that is %s (%d bytes: %r); ignored (stdout carries only JSON-RPC; "
                "log to stderr). Further such lines are counted, not logged one by one.",
                self.server,
                kind,
                len(line),
                sample,
            )
        elif is_power_of_ten(count):
            logger.warning("%s has written %d lines on stdout that are %s; all ignored", self.server, count, kind)


def _kind(value: Any) -> str:
    """What a JSON value is, in words ("null", "a string", ...)."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), "something else")


def is_power_of_ten(n: int) -> bool:
    """Whether `n` is 1, 10, 100, ...: when a counted, repeated warning is said again."""
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


#: The SDK client loggers that log a line (most with a traceback) per junk message, and those messages. The SDK's
#: client session logs as "client": an upstream that sent 5,000 progress notifications without a progressToken
#: wrote 5,000 tracebacks (11 MB) into the gateway's log per call.
#: Matched by their start: some the SDK writes with the values already in (an HTTP server's content type, a redirect's
#: target, a refresh's status), which named no server and came again at every connect attempt.
_SDK_JUNK = {
    "mcp.client.streamable_http": frozenset(
        {"Error parsing SSE message", "Error parsing JSON response", "Unexpected content type: ", "Redirect to "}
    ),
    "mcp.client.sse": frozenset({"Error parsing server message"}),
    "mcp.client.stdio": frozenset({"Failed to parse JSONRPC message from server"}),
    "mcp.client.auth.oauth2": frozenset({"Token refresh failed: ", "Invalid protected resource metadata at "}),
    "client": frozenset({"Failed to validate notification: %s", "notification queue for %r is full; dropped the oldest event"}),
}

#: The upstream whose connection this task serves (set for each connect attempt: the SDK's tasks inherit it), so
#: that a line the SDK logs about a message can say whose it was.
UPSTREAM_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("breakwater_upstream_name", default=None)


class _JunkLogLimit(logging.Filter):
    """One line per kind of junk message and upstream, then one at the 10th, 100th, ...; never the traceback."""

    def __init__(self, messages: frozenset[str]) -> None:
        super().__init__()
        self._messages = tuple(messages)
        self._counts: dict[tuple[str | None, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or not record.msg.startswith(self._messages):
            return True
        server, what = UPSTREAM_NAME.get(), record.getMessage()
        count = self._counts.get((server, what), 0) + 1
        self._counts[server, what] = count
        if count > 1 and not is_power_of_ten(count):
            return False
        error = record.exc_info[1] if record.exc_info else None
        record.msg = "%s from %s (%d so far, logged at the 1st, 10th, 100th...)%s"
        record.args = (what, server or "an upstream", count, f": {_first_error(error)}" if error is not None else "")
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _first_error(error: BaseException) -> str:
    """What was wrong, in a line: a validation error's first field and message, else the error's first line."""
    if isinstance(error, ValidationError) and (errors := error.errors()):
        where = ".".join(str(part) for part in errors[0]["loc"])
        return f"{where}: {errors[0]['msg']}" if where else str(errors[0]["msg"])
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


def quiet_sdk_junk_logs() -> None:
    """Limit the SDK clients' per-junk-message tracebacks (idempotent; the limit is per process)."""
    for name, messages in _SDK_JUNK.items():
        sdk_logger = logging.getLogger(name)
        if not any(isinstance(f, _JunkLogLimit) for f in sdk_logger.filters):
            sdk_logger.addFilter(_JunkLogLimit(messages))


class HandOffReader(asyncio.StreamReader):
    """An asyncio stream buffer that offers whole lines to `hand_off` as they arrive, while its reader waits.

    Why: a line read the usual way goes into this buffer, wakes the task parked in `read`/`readuntil`
    (a trip through the event loop), and only then reaches whoever it is for. The hot path's two
    hand-offs (issue 16) skip that trip: the downstream `tools/call` lines to the connection's fast
    lane (`gateway._stdio_server.pump_input`), the upstream's answers to the raw calls waiting for
    them (`_stdio.StdoutReader.tap`). Only while the reading task is parked with nothing unread, so a
    line is never handed over ahead of one that task has not read yet: `hand_off(data)` returns how
    many bytes of whole lines at the start of `data` it took; the first line it does not take, and
    everything after it, stay for the reading task, in order.
    """

    #: Takes whole lines from the start of what arrives (None: every line is the reading task's).
    hand_off: Callable[[bytes], int] | None = None
    #: Nothing has arrived yet: a UTF-8 BOM there (PowerShell's and Notepad's files) is no part of the first line.
    _first = True

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]  # asyncio feeds it bytes
        if self._first:
            # The handshake came after a BOM: its line was a parse error, its id never answered.
            self._first = False
            data = data.removeprefix(b"\xef\xbb\xbf")
            if not data:
                return
        hand_off = self.hand_off
        # `_waiter`: the reading task is parked in a read (asyncio's own attribute, stable since 3.8).
        if hand_off is not None and self._waiter is not None and not self._buffer and data.endswith(b"\n"):  # type: ignore[attr-defined]
            data = data[hand_off(data) :]
            if not data:
                return
        super().feed_data(data)
