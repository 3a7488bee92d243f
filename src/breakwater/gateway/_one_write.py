"""A response whose length is known goes out in one transport write (uvicorn writes its head and body apart).

And a routed call's JSON answer goes out below the ASGI layer (`WholeSend.reply`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

__all__ = ["WholeSend", "whole_responses"]

_Send = Callable[[Any], Awaitable[None]]


class _OneWrite:
    """The transport of one uvicorn request cycle while it writes a whole response: one write instead of two.

    uvicorn (httptools and h11 alike) writes a response's status line and headers with one
    `transport.write` and its body with another: two `sendto` system calls and two TCP segments for
    every answer (seen with `strace -e trace=sendto` on `serve --http`), the second one waking the client
    again. A response whose length is known (a JSON answer, an error) is written here into a buffer and
    handed to the real transport once; a stream (SSE, no Content-Length) is never held.
    """

    __slots__ = ("_chunks", "transport")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._chunks.append(data)

    def flush(self) -> None:
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks = []
            self.transport.write(data)

    def close(self) -> None:  # a response with `Connection: close`: what it wrote goes out first
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class WholeSend:
    """uvicorn's `send` for one request cycle, writing a response with a Content-Length in one transport write.

    As an ASGI `send` it holds a response's start until its body comes (`_OneWrite`); a stream (no
    Content-Length) is never held. `reply` writes a whole response without the ASGI messages.
    """

    __slots__ = ("_cycle", "_held", "_send")

    def __init__(self, send: Any) -> None:
        self._send = send
        self._cycle = send.__self__
        self._held: Any = None

    async def __call__(self, message: Any) -> None:
        send = self._send
        kind = message["type"]
        held = self._held
        if kind == "http.response.start" and held is None:
            if any(key.lower() == b"content-length" for key, _ in message.get("headers") or ()):
                self._held = message
                return
        elif held is not None:
            self._held = None
            if kind == "http.response.body" and not message.get("more_body", False):
                cycle = self._cycle
                transport = cycle.transport
                buffer = _OneWrite(transport)
                cycle.transport = buffer
                try:
                    await send(held)
                    await send(message)
                finally:
                    cycle.transport = transport
                    buffer.flush()
                return
            await send(held)
        await send(message)

    async def reply(self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> None:
        """Write one whole response as uvicorn's `send` writes `http.response.start` and a last body, in one write.

        Why. A routed call's JSON answer through a Starlette `Response` and uvicorn's `send` cost a
        response object, two ASGI messages and a check of every header against uvicorn's patterns: a
        measurable part of a call's instructions (issue 16, docs/benchmarks.md session 25). `headers`
        are the caller's own, lower-case and valid (a media type, a session id the SDK's transport
        holds to visible ASCII, the length of `body`), so they are written as they are; what uvicorn
        adds is added the same way: its default headers first, `connection: close` when the
        connection will not be kept, the access log line, and the cycle's end (the next pipelined
        request, the keep-alive timer).
        """
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected or cycle.response_started:
            return
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        if cycle.access_log and cycle.access_logger.isEnabledFor(logging.INFO):  # its arguments, only for a line written
            scope = cycle.scope
            cycle.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),
                scope["method"],
                get_path_with_query_string(scope),
                scope["http_version"],
                status,
            )
        content = [STATUS_LINE[status]]
        for name, value in (*cycle.default_headers, *headers):
            content += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        cycle.transport.write(b"".join(content))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()


def whole_responses(send: _Send) -> _Send:
    """`send` as a `WholeSend` when it is uvicorn's own (a request cycle's bound method); else `send` itself."""
    cycle = getattr(send, "__self__", None)
    # Duck-typed: uvloop's transports are no subclasses of asyncio's.
    if cycle is None or not callable(getattr(getattr(cycle, "transport", None), "write", None)):
        return send
    return WholeSend(send)
