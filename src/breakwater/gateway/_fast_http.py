"""The fast path for a 2025-11-25 `tools/call` POST answered with one JSON body (`--json-response`).

Why it exists. In JSON-response mode the SDK's transport validates the POSTed body into its
envelope model, hands it through a memory stream to the session's dispatcher loop, which spawns the
handler task, whose answer goes through the session's write stream to the transport's message
router task and from there through a per-request memory stream back to the POST's task: four task
hand-offs (each a trip through the event loop, on a shared 2-core machine the costly part) for one
request and one JSON answer (docs/benchmarks.md, issue 16). Measured: 3,258 → 2,168 Python
function calls and 21.9 → 7.8 event-loop iterations per call in JSON mode. The default mode runs its
calls in the POST's task too, with the same checks (`plain_call`) and the context that turns its
response into an SSE stream when needed (`_WatchedContext`; `breakwater.gateway._lazy_call`).

What it does. For a session whose handshake is done, a POST that is a well-formed `tools/call`
request runs the SDK's `ServerRunner` kernel (`_fast_call.on_call`) in the POST's own task, on the session's
live dispatcher and connection (captured from the session's first request, as on stdio:
`breakwater.gateway._fast_call`), and answers it with the transport's own JSON response. The same
middleware, validation, handler and result serialisation run; the header checks (Host/Origin,
session id, Accept, Content-Type) are the transport's, in the same order. The request is entered in
the dispatcher's table of requests in flight, so a `notifications/cancelled` POSTed for it cancels
it as the dispatcher would, and it is answered REQUEST_CANCELLED as the transport answers a
cancelled request in this mode. What the handler sends for the request while it runs (progress,
log messages) is dropped by the transport's router, exactly as in JSON-response mode; a server
request cannot be sent (the request's context says so, as the transport's metadata does).

Everything else — `initialize`, notifications and responses, other methods, a body that does not
parse or does not look like a plain call, a session not yet initialized, an event store — is the
SDK's own handler unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server import streamable_http as sdk
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.dispatcher import as_request_id
from mcp.shared.jsonrpc_dispatcher import (
    _InFlight,
    _JSONRPCDispatchContext,
)
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, ErrorData, JSONRPCError, JSONRPCResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from breakwater._codec import dumps_answer
from breakwater.gateway._fast_call import (
    FastLane,
    call_context,
    call_params,
    handler_error,
    lane_message,
    on_call,
)
from breakwater.gateway._known_heads import OFFER, routable, serving
from breakwater.gateway._one_write import WholeSend
from breakwater.gateway._request_ids import duplicate_id_message, in_flight_key

__all__ = ["answer_fast", "plain_call", "refused_duplicate", "reply_json", "request_cancelled", "session_ended"]

if TYPE_CHECKING:
    from breakwater.gateway._drain import Drain

logger = logging.getLogger("breakwater.gateway")

_Post = Callable[[Scope, Request, Receive, Send], Awaitable[None]]


def answer_fast(manager: StreamableHTTPSessionManager, server: Server[Any], *, drain: Drain | None = None) -> None:
    """Give every JSON-response session `manager` opens from now on the `tools/call` fast path.

    With `drain` (the gateway's), a call POST with a head this path took before comes straight here
    (`breakwater.gateway._known_heads`).
    """
    admit = manager._admit_session

    def admit_fast(requestor: Any) -> sdk.StreamableHTTPServerTransport | None:
        transport = admit(requestor)
        if transport is not None and transport.is_json_response_enabled and transport._event_store is None:
            lane = FastLane(server, _no_lines)
            sdk_post: _Post = transport._handle_post_request
            running: set[anyio.CancelScope] = set()
            route = _JsonRoute(transport, lane, running, drain) if drain is not None else None
            # An instance attribute: the transport's `_handle_request` looks the method up on `self`.
            transport._handle_post_request = partial(_post, transport, lane, sdk_post, running, route)  # type: ignore[method-assign]
            # Every end of a session (DELETE, idle timeout, the manager's stop) terminates its transport: the calls
            # running in their POSTs' tasks end with it, as the dispatcher's own handlers do.
            transport.terminate = partial(_terminate, transport.terminate, running)  # type: ignore[method-assign]
        return transport

    manager._admit_session = admit_fast  # type: ignore[method-assign]


async def _no_lines(data: bytes) -> None:  # an HTTP lane answers through its POST, never as lines
    raise RuntimeError("an HTTP lane writes no lines")


async def _terminate(sdk_terminate: Callable[[], Awaitable[None]], running: set[anyio.CancelScope]) -> None:
    for scope in list(running):
        scope.cancel()
    await sdk_terminate()


async def _post(
    transport: sdk.StreamableHTTPServerTransport,
    lane: FastLane,
    sdk_post: _Post,
    running: set[anyio.CancelScope],
    route: _JsonRoute | None,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> None:
    message = await _plain_call(transport, lane, request)
    if message is None:
        sent = lane_message(await request.body())
        if (
            sent is not None
            and "method" in sent
            and await refused_duplicate(transport, lane, sent.get("id"), scope, request, receive, send)
        ):
            return None
        with lane.bound():  # the session's first request shows the lane its dispatcher
            return await sdk_post(scope, request, receive, send)
    if not await transport._validate_request_headers(request, send):
        return None
    if route is not None and (offer := scope.get(OFFER)) is not None:
        offer.accept(route)  # every check of the request's head passed
    await _respond(transport, lane, request, message, running, scope, receive, send)
    return None


async def _respond(
    transport: sdk.StreamableHTTPServerTransport,
    lane: FastLane,
    request: Request,
    message: dict[str, Any],
    running: set[anyio.CancelScope],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    answer = await _answer(transport, lane, request, message, running)
    if answer is None:  # the session ended under the call: as the SDK's JSON path answers it then
        return await session_ended(transport, message["id"])(scope, receive, send)
    await reply_json(transport, message["id"], answer, scope, receive, send)
    return None


async def reply_json(
    transport: sdk.StreamableHTTPServerTransport,
    request_id: Any,
    answer: dict[str, Any] | JSONRPCError,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """The transport's JSON response to a call (`_create_json_response`): `answer` is its result, or its error.

    On a routed POST (`send` is a `WholeSend`) a result is written byte for byte as that response,
    without the envelope model, the `Response` or the ASGI messages (`WholeSend.reply`, `dumps_answer`).
    """
    if isinstance(answer, dict):
        if isinstance(send, WholeSend) and (body := dumps_answer(request_id, answer)) is not None:
            headers = [(b"content-type", b"application/json")]
            if transport.mcp_session_id:
                headers.append((b"mcp-session-id", transport.mcp_session_id.encode("latin-1")))
            headers.append((b"content-length", b"%d" % len(body)))
            return await send.reply(HTTPStatus.OK, headers, body)
        message: JSONRPCResponse | JSONRPCError = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=answer)
    else:
        message = answer
    await transport._create_json_response(message)(scope, receive, send)
    return None


@dataclass(frozen=True, slots=True)
class _JsonRoute:
    """A JSON-response session's call path, for the POSTs whose head the whole stack accepted before."""

    transport: sdk.StreamableHTTPServerTransport
    lane: FastLane
    running: set[anyio.CancelScope]
    drain: Drain

    def take(self, body: bytes) -> Callable[[Scope, Receive, Send], Awaitable[None]] | None:
        if not routable(self.transport, self.drain) or (message := plain_call(self.lane, body)) is None:
            return None
        return partial(self._serve, message)

    async def _serve(self, message: dict[str, Any], scope: Scope, receive: Receive, send: Send) -> None:
        with serving(self.transport, self.drain):
            await _respond(self.transport, self.lane, Request(scope, receive), message, self.running, scope, receive, send)


async def _plain_call(transport: sdk.StreamableHTTPServerTransport, lane: FastLane, request: Request) -> dict[str, Any] | None:
    """The POSTed `tools/call` if this path can serve it (else None: the SDK's handler takes the POST)."""
    if not lane.ready or not transport._check_content_type(request) or not sdk.check_accept_headers(request)[0]:
        return None
    # Read once: Starlette keeps the body on `request`, so the SDK's handler reads the same bytes.
    return plain_call(lane, await request.body())


async def refused_duplicate(
    transport: sdk.StreamableHTTPServerTransport,
    lane: FastLane | None,
    request_id: Any,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> bool:
    """Answer a POSTed request whose id a request in flight in its session uses (-32600, not run); False if it is not one.

    Why here, before the SDK's handler. The lanes leave such a request to the SDK, whose dispatcher refuses it
    (`_request_ids.unique_ids`); but the SDK's POST handler first opens the request's response stream under its
    id, in the place of the first request's (a call answered on an SSE stream, a request on the SDK's path),
    and closes it after the refusal: the first request's answer then had nowhere to go, and its POST hung.
    """
    request_id = as_request_id(request_id)
    if request_id is None:
        return False  # a notification, or an id the SDK's handler refuses itself
    if str(request_id) not in transport._request_streams and (lane is None or not lane.holds(request_id)):
        return False
    if not await transport._validate_request_headers(request, send):
        return True
    logger.warning("a request reused the id %r of a request in flight; refused, not run", request_id)
    error = ErrorData(code=INVALID_REQUEST, message=duplicate_id_message(request_id))
    await transport._create_json_response(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))(
        request.scope, request.receive, send
    )
    return True


def session_ended(transport: sdk.StreamableHTTPServerTransport, request_id: Any) -> Response:
    """What the SDK's path answers a POSTed request whose session was terminated before it completed, with its id.

    The SDK's answer carries the id null: a client with several requests of the session in flight could not tell
    whose answer it was.
    """
    error = ErrorData(code=INTERNAL_ERROR, message="Session terminated before the request completed")
    headers = {"Content-Type": sdk.CONTENT_TYPE_JSON}
    if transport.mcp_session_id:
        headers[sdk.MCP_SESSION_ID_HEADER] = transport.mcp_session_id
    body = JSONRPCError(jsonrpc="2.0", id=request_id, error=error).model_dump_json(by_alias=True, exclude_unset=True)
    return Response(body, status_code=HTTPStatus.INTERNAL_SERVER_ERROR, headers=headers)


def request_cancelled(request_id: Any) -> JSONRPCError:
    """A request the client cancelled: the 2025-era wire still ends it, with REQUEST_CANCELLED."""
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=sdk.REQUEST_CANCELLED, message="Request cancelled"))


async def _answer(
    transport: sdk.StreamableHTTPServerTransport,
    lane: FastLane,
    request: Request,
    message: dict[str, Any],
    running: set[anyio.CancelScope],
) -> dict[str, Any] | JSONRPCError | None:
    """The dispatcher's `_handle_request` for one POSTed call, in the POST's task: its result or its error (None: the
    session ended)."""
    dispatcher, runner = lane.dispatcher, lane.runner
    assert dispatcher is not None and runner is not None
    request_id, params = message["id"], message.get("params")
    dctx = call_context(_JSONRPCDispatchContext, dispatcher, request_id, params, transport._message_metadata(request))
    scope = anyio.CancelScope()
    key = in_flight_key(request_id)  # its exact id: `"50"` is another request (`_request_ids.cancel_exactly`)
    entry = _InFlight(scope=scope, dctx=dctx)
    dispatcher._in_flight[key] = entry  # type: ignore[index]
    running.add(scope)
    answer: dict[str, Any] | JSONRPCError | None = None
    try:
        with scope:
            answer = await on_call(runner, dctx, params)
    except Exception as exc:
        answer = JSONRPCError(jsonrpc="2.0", id=request_id, error=handler_error(exc))
    finally:
        running.discard(scope)
        dctx.close()
        if dispatcher._in_flight.get(key) is entry:  # type: ignore[call-overload]
            del dispatcher._in_flight[key]  # type: ignore[arg-type]
    if dctx.cancel_requested.is_set():
        return request_cancelled(request_id)
    return answer  # None: cancelled by the session's end (`_terminate`), not by the client


# ---- the default (lazy SSE) mode: the call runs in its POST's task too (`breakwater.gateway._lazy_sse`) ----


def plain_call(lane: FastLane, body: bytes) -> dict[str, Any] | None:
    """The POSTed body as a plain `tools/call` a lane can run in the POST's task, else None.

    The stdio lane's checks (`call_params`); a dispatcher that stopped reading (the session is ending),
    and an id still in flight, leave the request to the SDK, which refuses or answers it as it always did.
    Both HTTP lanes read their POSTs through it (`_plain_call` for `--json-response`).
    """
    if not lane.ready or b'"tools/call"' not in body:
        return None
    message = lane_message(body)  # what the SDK's parser reads, no more
    if message is None or call_params(message) is None:
        return None
    dispatcher = lane.dispatcher
    if dispatcher is None or not dispatcher._running or lane.holds(message["id"]):
        return None  # closing (the SDK refuses it), or an id in flight (refused: `_request_ids.unique_ids`)
    return message


@dataclass
class _WatchedContext(_JSONRPCDispatchContext[Any]):
    """The request's dispatch context in the default mode: `before_send` runs before the first message it sends.

    Every request-scoped message of a handler (progress, relayed log messages, sampling and elicitation
    requests) goes through this context (`ServerSession._request_outbound`), so this is where the POST's
    response learns that it must become an SSE stream before the message reaches the transport's router.
    """

    before_send: Callable[[], Awaitable[None]] | None = None

    async def notify(self, method: str, params: Any, opts: Any = None) -> None:
        if not self._closed and self.before_send is not None:
            await self.before_send()
        await super().notify(method, params, opts)

    async def send_raw_request(self, method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        if self.can_send_request and self.before_send is not None:
            await self.before_send()
        return await super().send_raw_request(method, params, opts)
