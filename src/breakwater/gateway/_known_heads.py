"""Known heads: a call POST whose head the whole stack has accepted before goes straight to its session's call path.

Why it exists. Every POST to `/mcp` crosses the whole ASGI stack before it reaches the session's
call path: uvicorn's proxy-headers middleware, `RequestGuard`, the web routes, the bearer check,
`DrainGuard`, `FrameErrors`, Starlette's error and exception middleware and router, the SDK's session
manager and its DNS-rebinding check, and the transport's header checks, each with its own `send`
wrapper on the way back. Every one of those checks reads only the request's head (and state this
module checks again), and an agent's client sends the same head on every call of a session (host,
session id, protocol version, accept, content type, token): only Content-Length changes. Measured
with `bench/proxy_instructions.py`: 1.43 → 1.14 M instructions per call in the gateway with
`--json-response`, 1.45 → 1.21 M in the default mode (issue 16, docs/benchmarks.md session 17).

What it does. uvicorn's httptools protocol, with one change. When a POST went through the whole
stack and the session's call path took it as a plain `tools/call` (`breakwater.gateway._fast_http`,
`breakwater.gateway._lazy_sse`; a 2026-07-28 call, which has no session, `breakwater.gateway._modern_http`),
the path *accepts* the request's offer: the server remembers the
head (method, path, query, HTTP version and every header but Content-Length, byte for byte) and the
`Route` that ran it. A later request, on any connection, whose head is identical gets the same
verdict from every check that reads only the head, so it skips them; what the checks read beyond the
head is checked again by the route (`Route.take`) once the body is whole: a plain call in the body,
the drain, the session's life. Anything else, or a request the route does not take, goes the whole
way as before. No check reads the connection (the client's address included), so a head accepted on
one connection is accepted on any: a burst's new connections are routed from their first call.

Never remembered, always the whole way: a head that differs in any byte, a request without
Content-Length or with a body above `ROUTED_BODY_MAX` (64 KiB, uvicorn's read high-water mark: such
a body is never paused mid-read), `Expect: 100-continue` (the client waits for the app to read),
`Transfer-Encoding`, HTTP/1.0, a request uvicorn answers itself (over its concurrency limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from breakwater.gateway._one_write import whole_responses

if TYPE_CHECKING:
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    from breakwater.gateway._drain import Drain

__all__ = [
    "BODY_READ_TIMEOUT_S",
    "HEAD_MAX",
    "KNOWN_HEADS_MAX",
    "OFFER",
    "ROUTED_BODY_MAX",
    "Offer",
    "Route",
    "routable",
    "routing_protocol",
    "serving",
]

#: The scope key of a routable request's `Offer` (absent from every other request's scope).
OFFER = "breakwater.route"
#: The largest body a routed request may carry: uvicorn's read high-water mark, so it is read whole unpaused.
ROUTED_BODY_MAX = 65536
#: How long a request may take to arrive whole once it began (head and body): past it, it is answered 408 and its
#: connection closed. uvicorn bounds only the idle time between requests (`timeout_keep_alive`), so a client that
#: sent part of a request and stopped held its connection, and the app's task reading it, for ever.
BODY_READ_TIMEOUT_S = 30.0
#: The largest request head (request line and header fields) a connection may send: past it, it is answered 431 and
#: closed. httptools (uvicorn's parser) keeps a header value growing for as long as it comes, so a client without the
#: token grew the gateway by hundreds of MB, one endless header per connection: the token is checked only once the
#: head is whole. h11 caps heads at 16 KiB; an MCP client's head is well under 2 KiB (its 2026-07-28 `Mcp-*` headers
#: and a long OAuth bearer token included), so 64 KiB leaves room for long cookies and proxies' headers.
HEAD_MAX = 65536
#: How long a connection whose head was refused is still read (and what it sends dropped) before it is closed.
_LINGER_S = 2.0
#: Heads a server remembers; past it, it forgets them all and learns the live ones again (one whole-stack POST each).
KNOWN_HEADS_MAX = 1024

_App = Callable[[Any, Any, Any], Awaitable[None]]
_Head = tuple[bytes, bytes, str, tuple[tuple[bytes, bytes], ...]]


class Route(Protocol):
    """What a session's call path leaves on a connection for its next POSTs with the same head."""

    def take(self, body: bytes) -> _App | None:
        """The ASGI app that serves a POST with this `body` the way the whole stack would, or None (not taken)."""


class Offer:
    """In a routable POST's scope: `accept` it once the whole stack has taken the request as a plain call."""

    __slots__ = ("_head", "_known")

    def __init__(self, known: dict[_Head, Route], head: _Head) -> None:
        self._known = known
        self._head = head

    def accept(self, route: Route) -> None:
        """Send the server's next POSTs with this head to `route`."""
        known = self._known
        if len(known) >= KNOWN_HEADS_MAX and self._head not in known:
            known.clear()  # ended sessions' heads go with the live ones; each live one is learnt again
        known[self._head] = route


def _head(scope: Any) -> _Head | None:
    """The part of a POST's request that every check before the call path reads, or None when it may not be routed."""
    if scope["http_version"] != "1.1":
        return None
    length = b""
    rest = []
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value
        elif name == b"expect" or name == b"transfer-encoding":
            return None
        else:
            rest.append((name, value))
    if not length.isdigit() or int(length) > ROUTED_BODY_MAX:
        return None
    return scope["raw_path"], scope["query_string"], scope["method"], tuple(rest)


class _Deadlined(HttpToolsProtocol):
    """uvicorn's httptools protocol, bounding how long a request may take to arrive whole once it began, and how long
    a connection may stay silent before its first (`read_timeout_s`)."""

    read_timeout_s = BODY_READ_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scope = None  # type: ignore[assignment]  # uvicorn sets it at each request's first byte
        #: Armed while a connection is silent, or a request is arriving in more than one read (`_read_timed_out`).
        self._read_timer: asyncio.TimerHandle | None = None
        #: Bytes of the head arriving, counted from the read after the one it began in (`_count_head`).
        self._head_bytes = 0
        #: A head began (`on_message_begin`) and is not whole yet (`on_headers_complete`); `_head_began`: in this read.
        self._head_open = False
        self._head_began = False
        #: The head was over `HEAD_MAX`: answered 431, the connection closing; what still comes is dropped.
        self._refused = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # A connection that never sends a byte held its descriptor for ever (uvicorn's keep-alive timer starts
        # only after a response): 300 of them under `ulimit -n 256` left a real client an empty reply.
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._head_began = False
        super().data_received(data)
        if self._head_open and not self._refused:
            self._count_head(len(data))
        if self._refused:
            return
        # A request that arrived whole in this read (the common case) costs this check only; one still
        # arriving (its head cut, or its body) gets a deadline: uvicorn's own timers run on the loop too.
        if self._read_timer is None and _arriving(self.scope, self.cycle) and not self.transport.is_closing():
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.scope is None and self.cycle is None:  # connected and silent since: nothing to answer
            self.transport.close()
            return
        if not _arriving(self.scope, self.cycle):
            return
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope or not cycle.response_started:
            self.transport.write(_timed_out(self.read_timeout_s))
        # The app reading the body then sees the client gone (`http.disconnect`) and ends.
        self.transport.close()

    def _stop_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = self._head_began = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_open = False
        # The head's size as parsed (a head that arrived in one read was not counted as it came).
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if self._refused or size > HEAD_MAX:
            self._refuse_head()
            return  # no request: nothing runs, no cycle is made
        super().on_headers_complete()

    def _count_head(self, size: int) -> None:
        """Count a read of a head still arriving; refuse it past `HEAD_MAX`.

        A read in which the head began is not counted (where in it the head began is the parser's to know), so a
        head is refused at most one read (256 KiB) past the cap, and never one under it."""
        if self._head_began:
            return
        self._head_bytes += size
        if self._head_bytes > HEAD_MAX:
            self._refuse_head()

    def _refuse_head(self) -> None:
        """Answer 431 and end the connection: its writing side at once, its reading side after `_LINGER_S`.

        Closed at once with the rest of the head unread, the kernel resets the connection and the client, still
        sending, loses the answer; so what still comes is read and dropped for a moment first (nginx's lingering close).
        """
        self._refused = True
        self._head_open = False
        self._stop_read_timer()
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(_head_too_large())
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._read_timer = self.loop.call_later(_LINGER_S, transport.close)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        # uvicorn leaves `more_body` set on a request answered before its body was whole (a 413 unread):
        # the body did arrive, so the read timeout must not count it.
        self.cycle.more_body = False
        self._stop_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_read_timer()
        super().connection_lost(exc)


def routing_protocol(read_timeout_s: float = BODY_READ_TIMEOUT_S) -> type[HttpToolsProtocol]:
    """A uvicorn protocol class for one server: its connections share one table of known heads.

    Its connections also bound how long a request may take to arrive whole (`read_timeout_s`, `_Deadlined`).
    """
    known: dict[_Head, Route] = {}

    class RoutingProtocol(_Deadlined):
        """uvicorn's httptools protocol, sending the POSTs whose head the stack accepted to their route."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._held: tuple[RequestResponseCycle, Route] | None = None

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
            scope: Any = cycle.scope
            head = _head(scope) if scope["method"] == "POST" and app is self.app else None
            if head is not None:
                scope[OFFER] = Offer(known, head)
                route = known.get(head)
                if route is not None:
                    if cycle.more_body:
                        self._held = (cycle, route)  # started once the body is whole (`on_message_complete`)
                        return
                    app = self._routed(cycle, route)
            super()._start_asgi_task(cycle, app)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            held = self._held
            if held is not None and held[0] is self.cycle:
                self._held = None
                super()._start_asgi_task(held[0], self._routed(*held))

        def connection_lost(self, exc: Exception | None) -> None:
            self._held = None  # a body cut short: nothing ran, nothing to answer
            super().connection_lost(exc)

        def _routed(self, cycle: RequestResponseCycle, route: Route) -> Any:
            app = route.take(bytes(cycle.body))
            if app is None:
                return self.app

            async def routed(scope: Any, receive: Any, send: Any) -> None:
                await app(scope, receive, whole_responses(send))

            return routed

    RoutingProtocol.read_timeout_s = read_timeout_s
    return RoutingProtocol


def _arriving(scope: Any, cycle: RequestResponseCycle | None) -> bool:
    """Whether a request began and has not arrived whole: its head is cut (uvicorn made its scope, not yet
    its cycle), or its body is still coming (answered or not: a refused body still holds the connection)."""
    if scope is None:
        return False
    return cycle is None or cycle.scope is not scope or cycle.more_body


def _timed_out(read_timeout_s: float) -> bytes:
    """The raw 408 for a request that did not arrive whole in time, as a JSON-RPC error (the MCP endpoint's shape)."""
    message = f"Invalid request: the request did not arrive whole within {read_timeout_s:g} s; send it again"
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}).encode()
    head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def _head_too_large() -> bytes:
    """The raw 431 for a request whose head is over `HEAD_MAX`, as a JSON-RPC error (the MCP endpoint's shape)."""
    message = f"Invalid request: the request's head (request line and headers) is over the {HEAD_MAX}-byte limit"
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}).encode()
    head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def routable(transport: StreamableHTTPServerTransport, drain: Drain) -> bool:
    """Whether a routed POST for `transport` would pass what the skipped stack checks beyond the request's head.

    A drain refuses new requests (`DrainGuard`); a terminated session, or one whose idle time ran out,
    is answered by the transport's own handler.
    """
    idle = transport.idle_scope
    return not (drain.draining or transport._terminated or (idle is not None and idle.cancel_called))


@contextlib.contextmanager
def serving(transport: StreamableHTTPServerTransport | None, drain: Drain) -> Iterator[None]:
    """Around a routed POST: what `DrainGuard` and the transport's `handle_request` keep for every request.

    The drain counts it in flight; the session's idle countdown (a 2025-11-25 session's `transport`)
    stops while it runs and restarts when the last request in flight ends
    (`StreamableHTTPServerTransport.handle_request`).
    """
    idle = transport.idle_scope if transport is not None else None
    timeout = transport._idle_timeout if transport is not None else None
    drain.request_started()
    if transport is not None and idle is not None and timeout is not None:
        transport._requests_in_flight += 1
        idle.deadline = math.inf
    try:
        yield
    finally:
        if transport is not None and idle is not None and timeout is not None:
            transport._requests_in_flight -= 1
            if not transport._requests_in_flight:
                idle.deadline = anyio.current_time() + timeout
        drain.request_done()
