"""The requests a streamable-HTTP connection has in flight, so that closing it can wait for their answers.

A ready connection whose sign-in ended (a request's 401, and the token refresh then refused) is closed and opened
again, so that the server's state says who must sign in. Closed at once, it cut every other request in flight on it: a
call sent a moment before, which the server would refuse for the same token (nothing ran) or had accepted and was
running, was told OUTCOME_UNKNOWN ("it may have run") — on a loaded host, whenever the `subscriptions/listen` stream
met the revoked token before the call did. Over HTTP each request is answered on its own, so the connection waits for
them (`InFlightClient.drained`, within a bound its owner sets) before it closes.

A request is in flight from `send` until its response is closed: after the SDK's POST task has handed the answer
on. Long-lived requests are not waited for: the GET stream and a 2026-07-28 `subscriptions/listen` never end on their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx2

from breakwater.connect._http_cut import posted_message

__all__ = ["InFlightClient"]

#: The 2026-07-28 request that holds a stream open for the server's notifications for the life of the connection.
_LISTEN = "subscriptions/listen"


class InFlightClient(httpx2.AsyncClient):
    """An `httpx2.AsyncClient` that knows its requests in flight (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._open: set[httpx2.Request] = set()
        self._ended_one: anyio.Event | None = None

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        self._open.add(request)
        try:
            response = await super().send(request, **kwargs)
        except BaseException:
            self._end(request)
            raise
        if response.is_closed:  # read in full already (not streamed)
            self._end(request)
        else:
            response.stream = _Closing(response.stream, lambda: self._end(request))
        return response

    async def drained(self) -> None:
        """Return once no request that awaits an answer is in flight (long-lived streams aside)."""
        while any(_awaits_answer(request) for request in self._open):
            if self._ended_one is None:
                self._ended_one = anyio.Event()
            await self._ended_one.wait()
        await anyio.lowlevel.checkpoint()  # the session's reader takes the last answer handed on before the close

    def _end(self, request: httpx2.Request) -> None:
        self._open.discard(request)
        if self._ended_one is not None:
            self._ended_one.set()
            self._ended_one = None


def _awaits_answer(request: httpx2.Request) -> bool:
    """A POSTed JSON-RPC request, other than a listen stream (a GET, a notification or a response awaits nothing)."""
    message = posted_message(request)
    return message is not None and "id" in message and message.get("method") not in (None, _LISTEN)


class _Closing(httpx2.AsyncByteStream):
    """A response body that says when it is closed."""

    def __init__(self, inner: Any, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close = on_close

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The body's own iterator: no generator of ours between it and each chunk of every answer.
        chunks: AsyncIterator[bytes] = self._inner.__aiter__()
        return chunks

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._on_close()
