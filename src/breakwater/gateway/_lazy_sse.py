"""A 2025-11-25 POST answered with one JSON body when nothing reaches the client before the answer.

Streamable HTTP (2025-11-25) lets a server answer a POSTed request either with `text/event-stream`
or with one `application/json` body, and obliges the client to accept both. The SDK's sessionful
transport commits to an SSE stream for every request before the handler runs: a
`sse_starlette.EventSourceResponse` per POST, with its own task group (stream, ping, disconnect
and exit-signal watchers, the data sender) and two memory streams. For a tool call that carries no
progress, log message or server request, that machinery carries exactly one event, and it was the
largest single cost on the gateway's HTTP path: `bench/proxy_overhead.py` measured 3.5 ms of
gateway CPU per call in the default SSE mode against 2.4 ms with `--json-response` (same run).

A plain `tools/call` (most POSTs) runs its handler in the POST's own task and commits to SSE only
when it sends something or outlives the window (`breakwater.gateway._lazy_call`). Any other request
(a list, a read, a call `plain_call` leaves to the SDK) goes to the session's dispatcher as the SDK
sends it, and this path waits for the first message the handler sends for it, up to `COMMIT_S`:

* the response itself: it is sent as one JSON body (as `--json-response` would), and that is all;
* anything else first (progress, a log message, a sampling or elicitation request), or nothing
  within `COMMIT_S` (a long call, which needs the stream's keep-alive pings): the answer commits to
  the SDK's own SSE stream, with that first message as its first event, exactly as before.

So nothing is lost mid-call: whatever the SDK would have streamed is streamed. Everything else (an
`initialize`, a notification or response POST, a body that does not parse, a header the SDK refuses)
goes to the SDK's own handler unchanged.

Resumable streams (`breakwater.gateway._resume`): a 2025-11-25 request's events get ids from the
start but are only kept in memory until the answer is known; a call answered as one JSON body
needs no resumption and writes nothing; one that commits to SSE writes what it carried to the
stream log, sends a priming event (its id lets a client resume even before the first message),
and every later event is kept as the SDK's router stores it. The streams this path opens carry
the `[gateway] sse_keepalive_s` pings, and the commit window is never longer than that interval,
so a balancer never sees a silent connection for longer than the keep-alive promises. It bypasses
`StreamableHTTPServerTransport._handle_post_request` (SDK 2.3, pinned `<2.4`) only for the plain
request case, reusing the transport's own helpers for every wire shape; the conformance suite and
tests/gateway/test_gateway_relay.py are what show the protocol is still spoken.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import anyio
import pydantic_core
from mcp.server import streamable_http as sdk
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from mcp_types.version import is_version_at_least
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from breakwater._clock import Clock
from breakwater.gateway._fast_call import FastLane, session_lane
from breakwater.gateway._fast_http import plain_call, refused_duplicate, session_ended
from breakwater.gateway._known_heads import OFFER, routable, serving
from breakwater.gateway._lazy_call import COMMIT_S, Call, Lazy, serve_call, stream_response
from breakwater.gateway._resume import ResumableStreams, SessionStreams

if TYPE_CHECKING:
    from breakwater.gateway._drain import Drain

__all__ = ["COMMIT_S", "answer_lazily"]

logger = logging.getLogger("breakwater.gateway")

_Post = Callable[[Scope, Request, Receive, Send], Awaitable[None]]


def answer_lazily(
    manager: StreamableHTTPSessionManager,
    clock: Clock,
    *,
    keepalive_s: float,
    streams: ResumableStreams | None = None,
    drain: Drain | None = None,
) -> None:
    """Give every session `manager` opens (or adopts) from now on the lazy POST path (see the module docstring).

    `keepalive_s` is the ping interval of the streams it opens (0: none); with `streams`, 2025-11-25
    request streams that commit to SSE can be resumed with `Last-Event-ID`. With `drain` (the
    gateway's), a call POST with a head this path took before comes straight here
    (`breakwater.gateway._known_heads`).
    """
    lazy = Lazy(clock, keepalive_s, lambda: manager._task_group)

    def spawn(task: Callable[[], Awaitable[None]]) -> None:
        # The manager's task group runs while the app does; a task started there outlives the request.
        group = manager._task_group
        if group is not None:
            group.start_soon(task)

    def prepare(transport: sdk.StreamableHTTPServerTransport | None) -> sdk.StreamableHTTPServerTransport | None:
        if transport is None or transport.is_json_response_enabled:
            return transport
        view: SessionStreams | None = None
        if streams is not None and transport.mcp_session_id is not None:
            view = streams.for_session(transport, spawn)
            transport._event_store = view
            # Only the streams this path opens are primed (and kept); the SDK's own (initialize) are not.
            transport._mint_priming_event = _no_priming  # type: ignore[method-assign]
            transport._handle_get_request = partial(_get, transport, transport._handle_get_request, view)  # type: ignore[method-assign]
        sdk_post: _Post = transport._handle_post_request
        calls: set[Call] = set()
        route = _LazyRoute(transport, lazy, view, calls, drain) if drain is not None else None
        # An instance attribute: the transport's `_handle_request` looks the method up on `self`.
        transport._handle_post_request = partial(_post, transport, sdk_post, lazy, view, calls, route)  # type: ignore[method-assign]
        # Every end of a session (DELETE, idle timeout, the manager's stop) terminates its transport: the calls
        # running in their POSTs' tasks end with it, as the dispatcher's own handlers do.
        transport.terminate = partial(_terminate, transport.terminate, calls)  # type: ignore[method-assign]
        return transport

    admit = manager._admit_session
    manager._admit_session = lambda requestor: prepare(admit(requestor))  # type: ignore[method-assign]
    # A roaming manager's adopted sessions (breakwater.gateway._sessions) get the same path.
    adopted = getattr(manager, "_adopted_transport", None)
    if adopted is not None:
        manager._adopted_transport = lambda session_id: prepare(adopted(session_id))  # type: ignore[attr-defined]


async def _terminate(sdk_terminate: Callable[[], Awaitable[None]], calls: set[Call]) -> None:
    for call in list(calls):
        call.end()
    await sdk_terminate()


async def _no_priming(stream_id: str, protocol_version: str) -> sdk.SSEEvent | None:
    return None


async def _get(
    transport: sdk.StreamableHTTPServerTransport,
    sdk_get: Callable[[Request, Send], Awaitable[None]],
    view: SessionStreams,
    request: Request,
    send: Send,
) -> None:
    """A GET: a `Last-Event-ID` this session no longer keeps is a 404 (the client stops reconnecting), else the SDK's."""
    last_event_id = request.headers.get(sdk.LAST_EVENT_ID_HEADER)
    if last_event_id and sdk.check_accept_headers(request)[1] and not await view.known(last_event_id):
        response = transport._create_error_response(
            "Not Found: the stream of that Last-Event-ID is unknown or expired (its events are kept for [gateway] resume_ttl_s)",
            HTTPStatus.NOT_FOUND,
            INVALID_REQUEST,
        )
        await response(request.scope, request.receive, send)
        return
    await sdk_get(request, send)


async def _post(
    transport: sdk.StreamableHTTPServerTransport,
    sdk_post: _Post,
    lazy: Lazy,
    view: SessionStreams | None,
    calls: set[Call],
    route: _LazyRoute | None,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> None:
    writer = transport._read_stream_writer
    has_json, has_sse = sdk.check_accept_headers(request)
    if writer is None or not (has_json and has_sse) or not transport._check_content_type(request):
        return await sdk_post(scope, request, receive, send)
    # Read once: Starlette keeps the body on `request`, so the SDK's handler reads the same bytes.
    try:
        body = await request.body()
    except ClientDisconnect:  # gone before its body was whole: nobody to answer, nothing went wrong here
        logger.debug("the client went away before its request body was whole")
        return None
    lane = session_lane(transport.mcp_session_id)
    call = plain_call(lane, body) if lane is not None else None
    if lane is not None and call is not None:
        if not await transport._validate_request_headers(request, send):
            return None
        if route is not None and (offer := scope.get(OFFER)) is not None:
            offer.accept(route)  # every check of the request's head passed
        return await _serve_plain(transport, writer, lane, lazy, view, calls, call, scope, request, receive, send)
    try:
        message = jsonrpc_message_adapter.validate_python(pydantic_core.from_json(body), by_name=False)
    except ValueError:  # pydantic's ValidationError included: the SDK answers it
        return await sdk_post(scope, request, receive, send)
    if not isinstance(message, JSONRPCRequest) or message.method == "initialize":
        return await sdk_post(scope, request, receive, send)
    if await refused_duplicate(transport, lane, message.id, scope, request, receive, send):
        return None
    if not await transport._validate_request_headers(request, send):
        return None
    try:
        await _answer(transport, writer, lazy, view, message, scope, request, receive, send)
    except Exception as err:
        await _post_failed(transport, writer, err, scope, receive, send)
    return None


async def _serve_plain(
    transport: sdk.StreamableHTTPServerTransport,
    writer: Any,
    lane: FastLane,
    lazy: Lazy,
    view: SessionStreams | None,
    calls: set[Call],
    call: dict[str, Any],
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> None:
    try:
        await serve_call(transport, lane, lazy, view, calls, call, scope, request, receive, send)
    except Exception as err:
        await _post_failed(transport, writer, err, scope, receive, send)


@dataclass(frozen=True, slots=True)
class _LazyRoute:
    """A default-mode session's call path, for the POSTs whose head the whole stack accepted before."""

    transport: sdk.StreamableHTTPServerTransport
    lazy: Lazy
    view: SessionStreams | None
    calls: set[Call]
    drain: Drain

    def take(self, body: bytes) -> Callable[[Scope, Receive, Send], Awaitable[None]] | None:
        transport = self.transport
        if not routable(transport, self.drain) or transport._read_stream_writer is None:
            return None
        lane = session_lane(transport.mcp_session_id)
        call = plain_call(lane, body) if lane is not None else None
        if lane is None or call is None:
            return None
        return partial(self._serve, lane, call)

    async def _serve(self, lane: FastLane, call: dict[str, Any], scope: Scope, receive: Receive, send: Send) -> None:
        transport = self.transport
        with serving(transport, self.drain):
            request = Request(scope, receive)
            writer = transport._read_stream_writer
            await _serve_plain(transport, writer, lane, self.lazy, self.view, self.calls, call, scope, request, receive, send)


async def _post_failed(
    transport: sdk.StreamableHTTPServerTransport, writer: Any, err: Exception, scope: Scope, receive: Receive, send: Send
) -> None:
    """A POST whose handling raised: answered 500 and the error handed to the session, as the SDK's handler does."""
    logger.exception("Error handling POST request")
    response = transport._create_error_response("Error handling POST request", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR)
    await response(scope, receive, send)
    await writer.send(Exception(err))


async def _answer(
    transport: sdk.StreamableHTTPServerTransport,
    writer: Any,
    lazy: Lazy,
    view: SessionStreams | None,
    message: JSONRPCRequest,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> None:
    request_id = str(message.id)
    streams = anyio.create_memory_object_stream[sdk.EventMessage](sdk.REQUEST_STREAM_BUFFER_SIZE)
    transport._request_streams[request_id] = streams
    reader = streams[1]
    protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
    # Older clients cannot read a priming event (and the SDK offers them no resumption either).
    if view is not None and not (is_version_at_least(protocol_version, "2025-11-25") and view.open(request_id)):
        view = None
    committed = False
    try:
        await writer.send(transport._create_session_message(message, request, request_id, protocol_version))
        first: sdk.EventMessage | None = None
        try:
            with lazy.clock.deadline_scope(lazy.clock.monotonic() + lazy.commit_s):
                first = await reader.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            # The session was terminated while the request was in flight (as in the SDK's JSON mode).
            await transport._clean_up_memory_streams(request_id)
            await session_ended(transport, message.id)(scope, receive, send)
            return
        if first is not None and isinstance(first.message, JSONRPCResponse | JSONRPCError):
            await transport._clean_up_memory_streams(request_id)
            await transport._create_json_response(first.message)(scope, receive, send)
            return
        priming = await view.commit(message) if view is not None else None
        committed = True
    finally:
        if view is not None and not committed:
            view.discard(request_id)
    await stream_response(transport, lazy, request_id, reader, priming, first, scope, receive, send)
