"""The fast path for a 2025-11-25 `tools/call` POST answered with one JSON body (`--json-response`).

Why it exists. In JSON-response mode the SDK's transport validates the POSTed body into its
envelope model, hands it through a memory stream to the session's dispatcher loop, which spawns the
handler task, whose answer goes through the session's write stream to the transport's message
router task and from there through a per-request memory stream back to the POST's task: four task
hand-offs (each a trip through the event loop, on a shared 2-core machine the costly part) for one
request and one JSON answer (docs/benchmarks.md, issue 16). Measured: 3,258 → 2,168 Python
function calls and 21.9 → 7.8 event-loop iterations per call in JSON mode; in the default mode
(`start_call`) 2,872 → 2,510 and 15.6 → 9.4.

What it does. For a session whose handshake is done, a POST that is a well-formed `tools/call`
request runs the SDK's own `ServerRunner.on_request` in the POST's own task, on the session's
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
parse or does not look like a plain call, a session not yet initialized, the default SSE mode
(`_lazy_sse`), an event store — is the SDK's own handler unchanged.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from mcp.server import streamable_http as sdk
from mcp.server.lowlevel.server import Server
from mcp.server.runner import ServerRunner
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.jsonrpc_dispatcher import (
    JSONRPCDispatcher,
    _InFlight,
    _JSONRPCDispatchContext,
    progress_token_from_params,
)
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from breakwater._wire import strict_json
from breakwater.gateway._fast_call import FastLane, call_params, handler_error, session_lane

__all__ = ["answer_fast", "start_call"]

logger = logging.getLogger("breakwater.gateway")

_Post = Callable[[Scope, Request, Receive, Send], Awaitable[None]]


def answer_fast(manager: StreamableHTTPSessionManager, server: Server[Any]) -> None:
    """Give every JSON-response session `manager` opens from now on the `tools/call` fast path."""
    admit = manager._admit_session

    def admit_fast(requestor: Any) -> sdk.StreamableHTTPServerTransport | None:
        transport = admit(requestor)
        if transport is not None and transport.is_json_response_enabled and transport._event_store is None:
            lane = FastLane(server, _no_lines)
            sdk_post: _Post = transport._handle_post_request
            # An instance attribute: the transport's `_handle_request` looks the method up on `self`.
            transport._handle_post_request = partial(_post, transport, lane, sdk_post)  # type: ignore[method-assign]
        return transport

    manager._admit_session = admit_fast  # type: ignore[method-assign]


async def _no_lines(data: bytes) -> None:  # an HTTP lane answers through its POST, never as lines
    raise RuntimeError("an HTTP lane writes no lines")


async def _post(
    transport: sdk.StreamableHTTPServerTransport,
    lane: FastLane,
    sdk_post: _Post,
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> None:
    message = await _plain_call(transport, lane, request)
    if message is None:
        with lane.bound():  # the session's first request shows the lane its dispatcher
            return await sdk_post(scope, request, receive, send)
    if not await transport._validate_request_headers(request, send):
        return None
    answer = await _answer(transport, lane, request, message)
    await transport._create_json_response(answer)(scope, receive, send)
    return None


async def _plain_call(transport: sdk.StreamableHTTPServerTransport, lane: FastLane, request: Request) -> dict[str, Any] | None:
    """The POSTed `tools/call` if this path can serve it (else None: the SDK's handler takes the POST)."""
    if not lane.ready or not transport._check_content_type(request) or not sdk.check_accept_headers(request)[0]:
        return None
    # Read once: Starlette keeps the body on `request`, so the SDK's handler reads the same bytes.
    body = await request.body()
    if b'"tools/call"' not in body:
        return None
    try:
        message = strict_json(body)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        return None
    if not isinstance(message, dict) or call_params(message) is None:
        return None
    dispatcher = lane.dispatcher
    if dispatcher is None or coerce_request_id(message["id"]) in dispatcher._in_flight:
        return None  # a duplicate id: the SDK's rules for it
    return message


async def _answer(
    transport: sdk.StreamableHTTPServerTransport, lane: FastLane, request: Request, message: dict[str, Any]
) -> JSONRPCResponse | JSONRPCError:
    """The dispatcher's `_handle_request` for one POSTed call, in the POST's task: its answer."""
    dispatcher, runner = lane.dispatcher, lane.runner
    assert dispatcher is not None and runner is not None
    request_id, params = message["id"], message.get("params")
    metadata = transport._message_metadata(request)
    dctx = _JSONRPCDispatchContext(
        transport=dispatcher._transport_builder(metadata),
        _dispatcher=dispatcher,
        _request_id=request_id,
        message_metadata=metadata,
        _progress_token=progress_token_from_params(params),
    )
    scope = anyio.CancelScope()
    key = coerce_request_id(request_id)
    entry = _InFlight(scope=scope, dctx=dctx)
    dispatcher._in_flight[key] = entry
    answer: JSONRPCResponse | JSONRPCError | None = None
    try:
        with scope:
            result = await runner.on_request(dctx, "tools/call", params)
            answer = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
    except Exception as exc:
        answer = JSONRPCError(jsonrpc="2.0", id=request_id, error=handler_error(exc))
    finally:
        dctx.close()
        if dispatcher._in_flight.get(key) is entry:
            del dispatcher._in_flight[key]
    if dctx.cancel_requested.is_set() or answer is None:
        # Cancelled by the client: the 2025-era wire still ends the request, with REQUEST_CANCELLED.
        return JSONRPCError(
            jsonrpc="2.0", id=request_id, error=ErrorData(code=sdk.REQUEST_CANCELLED, message="Request cancelled")
        )
    return answer


# ---- the default (lazy SSE) mode: the request skips the session's read stream, the answer its router ----


@dataclass
class _WatchedContext(_JSONRPCDispatchContext[Any]):
    """The request's dispatch context, noting whether anything was sent on the request's own stream."""

    emitted: bool = False

    async def notify(self, method: str, params: Any, opts: Any = None) -> None:
        self.emitted = True
        await super().notify(method, params, opts)

    async def send_raw_request(self, method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        self.emitted = True
        return await super().send_raw_request(method, params, opts)


#: The SDK dispatcher's bound on a last answer written while the session shuts down (real time, as there).
_SHUTDOWN_WRITE_S = 1.0


def start_call(transport: sdk.StreamableHTTPServerTransport, session_message: SessionMessage) -> bool:
    """Start a POSTed plain `tools/call` on its session's handler directly; False: send it to the session as usual.

    For `_lazy_sse`, which then waits on the request's stream as before. The SDK would write the
    message into the session's read stream, where the dispatcher's receive loop spawns its handler,
    whose answer goes through the session's write stream to the transport's router and from there
    to the request's stream: this spawns the handler at once (in the dispatcher's own task group,
    with the POST's context, as the dispatcher does), and when nothing was sent on the request's
    stream before it, puts the answer on that stream itself. Anything sent before the answer goes the
    SDK's way, and then the answer too, so it cannot overtake it.
    """
    lane = session_lane(transport.mcp_session_id)
    message = session_message.message
    if lane is None or not lane.ready or not isinstance(message, JSONRPCRequest) or message.method != "tools/call":
        return False
    dispatcher, runner = lane.dispatcher, lane.runner
    if dispatcher is None or runner is None or dispatcher._tg is None or not dispatcher._running:
        return False
    raw: dict[str, Any] = {"jsonrpc": "2.0", "id": message.id, "method": message.method}
    if message.params is not None:
        raw["params"] = message.params
    key = coerce_request_id(message.id)
    if call_params(raw) is None or key in dispatcher._in_flight:
        return False
    metadata = session_message.metadata
    dctx = _WatchedContext(
        transport=dispatcher._transport_builder(metadata),
        _dispatcher=dispatcher,
        _request_id=message.id,
        message_metadata=metadata,
        _progress_token=progress_token_from_params(message.params),
    )
    scope = anyio.CancelScope()
    dispatcher._in_flight[key] = _InFlight(scope=scope, dctx=dctx)
    handle = partial(_handle, transport, dispatcher, runner, message, dctx, scope)
    dispatcher._spawn(handle, sender_ctx=contextvars.copy_context())
    return True


async def _handle(
    transport: sdk.StreamableHTTPServerTransport,
    dispatcher: JSONRPCDispatcher[Any],
    runner: ServerRunner[Any],
    request: JSONRPCRequest,
    dctx: _WatchedContext,
    scope: anyio.CancelScope,
) -> None:
    """The dispatcher's `_handle_request` for one call, with the answer's short cut (see `start_call`)."""
    answer_started = False
    try:
        with scope:
            try:
                result = await runner.on_request(dctx, request.method, request.params)
            finally:
                dctx.close()
                key = coerce_request_id(request.id)
                if (entry := dispatcher._in_flight.get(key)) is not None and entry.dctx is dctx:
                    del dispatcher._in_flight[key]
            if not dctx.cancel_requested.is_set():
                answer_started = True
                if dctx.emitted or not await _deliver(transport, request.id, result):
                    await dispatcher._write_result(request.id, result)
    except anyio.get_cancelled_exc_class():
        if not answer_started and not dctx.cancel_requested.is_set():
            closed = ErrorData(code=CONNECTION_CLOSED, message="Connection closed")
            await dispatcher._final_write(
                partial(dispatcher._write_error, request.id, closed),
                shield=True,
                timeout=_SHUTDOWN_WRITE_S,
                describe=f"shutdown error response for request {request.id!r}",
            )
        raise
    except Exception as exc:
        if not dctx.cancel_requested.is_set():
            answer_started = True
            await dispatcher._write_error(request.id, handler_error(exc))
    if not answer_started:
        await dispatcher._settle_unanswered(dctx)


async def _deliver(transport: sdk.StreamableHTTPServerTransport, request_id: Any, result: dict[str, Any]) -> bool:
    """Put the answer on the request's stream, as the transport's router would; False if it cannot be done here."""
    streams = transport._request_streams.get(str(request_id))
    if streams is None:
        return False
    response = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
    # As the router does: an event store (resumable streams, breakwater.gateway._resume) gets the answer first.
    event_id = await transport._event_store.store_event(str(request_id), response) if transport._event_store else None
    try:
        streams[0].send_nowait(sdk.EventMessage(response, event_id))
    except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return False
    return True
