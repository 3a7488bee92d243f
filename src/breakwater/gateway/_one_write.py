"""A response whose length is known goes out in one transport write (uvicorn writes its head and body apart)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["whole_responses"]

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


def whole_responses(send: _Send) -> _Send:
    """`send`, writing a response with a Content-Length in one transport write (`_OneWrite`); else `send` itself.

    Only for uvicorn's own `send` (a request cycle's bound method with its connection's asyncio
    transport); the cycle's transport is swapped only while the head and the body are handed to it.
    """
    cycle = getattr(send, "__self__", None)
    # Duck-typed: uvloop's transports are no subclasses of asyncio's.
    if cycle is None or not callable(getattr(getattr(cycle, "transport", None), "write", None)):
        return send
    held: list[Any] = []

    async def send_whole(message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not held:
            if any(key.lower() == b"content-length" for key, _ in message.get("headers") or ()):
                held.append(message)
                return
        elif held:
            start = held.pop()
            if kind == "http.response.body" and not message.get("more_body", False):
                transport = cycle.transport
                buffer = _OneWrite(transport)
                cycle.transport = buffer
                try:
                    await send(start)
                    await send(message)
                finally:
                    cycle.transport = transport
                    buffer.flush()
                return
            await send(start)
        await send(message)

    return send_whole
