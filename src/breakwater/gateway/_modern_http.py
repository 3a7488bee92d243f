"""A lean entry for a 2026-07-28 `tools/call` POST: one task instead of two, and a client's disconnect its cancel in both modes.

Why it exists. The SDK's modern entry (`mcp.server._streamable_http_modern.handle_modern_request`)
serves a POST in SSE mode with a task group of its own: the handler runs in one spawned task, a
second one waits for the client's disconnect, and the POST's task waits on a memory stream for
what the handler emits (a zero-buffer stream: every notification, and the end, is a hand-off
between two tasks). Each task is a start, a wake-up and an exit on the event loop, and on the
shared 2-core machine of docs/benchmarks.md the wake-ups are where the time goes (issue 16: a
2026-07-28 client was 1.15× mcp-proxy (PyPI) at p50 and 1.43× its instructions per call, the
2025-11-25 paths 0.99×). Measured with `bench/proxy_instructions.py` (the gateway only, callgrind):
3.84 → 3.38 M instructions per call on top of the gateway's own schema lookup for the `Mcp-Param-*`
check (`Gateway.header_schema`, 5.07 → 3.84 M, then 3.14 M with both); 3,141 → 2,092 Python function
calls and 12.9 → 9.7 event-loop iterations per call (cProfile), and the gateway's CPU per call from 1.3×
the 2025-11-25 default mode's to 1.0-1.07× (docs/benchmarks.md, session 6).

What it does. The same ladder as the SDK's entry, in the same order and with the SDK's own
helpers (Host/Origin, Accept, parse, notification, envelope, duplicated routing headers, the
classifier, the `Mcp-Param-*` check, `serve_one` with a fresh `Connection`), then:

* the handler runs in the POST's own task, inside a cancel scope;
* one watcher task (in the session manager's task group, so the POST never waits for it) waits
  for `http.disconnect` and cancels that scope when the client goes away before the answer — the
  2026-07-28 cancel, as the SDK's watcher does — and keeps the SSE keep-alive: when the handler
  has been silent for `_SSE_PING_INTERVAL` (15 s, `[gateway] sse_keepalive_s`), it commits to
  `text/event-stream` and sends `: ping`, as the SDK's entry does;
* what the handler emits (progress, log messages) is written to the response by the emitting task
  itself: the first event commits to `text/event-stream`, exactly as the SDK's entry commits on it;
* the answer of a handler that emitted nothing and finished within the window goes out as one
  `application/json` body with the table-mapped status (the SDK's `_write`); after a commit it is
  the stream's last event (the SDK's `_sse_event`). So every byte on the wire is the SDK's.

Only POSTs whose `Mcp-Method` header says `tools/call`, at a modern `MCP-Protocol-Version`, come here
(with `--json-response` too: the answer is then always one JSON body, see `serve_modern_calls`);
everything else (`server/discover`, lists, `subscriptions/listen`, GET, 2025-11-25) is the SDK's entry
unchanged. A body that disagrees with its
`Mcp-Method` header gets the classifier's HEADER_MISMATCH here as there. It leans on private helpers
of the SDK module, which is pinned (`mcp>=2.3,<2.4`); tests/gateway/test_fast_call.py compares the
two entries answer for answer and shows which one served.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp.server._streamable_http_modern as modern
from mcp.server.connection import Connection
from mcp.server.runner import serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.dispatcher import CallOptions
from mcp.shared.inbound import (
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import HEADER_MISMATCH, PARSE_ERROR, ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from breakwater._clock import Clock
from breakwater.gateway._fast_call import call_envelope, lane_message
from breakwater.gateway._known_heads import OFFER, serving

if TYPE_CHECKING:
    from breakwater.gateway._drain import Drain

__all__ = ["serve_modern_calls"]

logger = logging.getLogger("breakwater.gateway")

_ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]
_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("ascii")
_METHOD_HEADER = b"mcp-method"
_PING = b": ping\r\n\r\n"
#: The handshake-era versions as header bytes: those, and no header, are the 2025-11-25 transport's.
_HANDSHAKE = frozenset(v.encode("latin-1") for v in HANDSHAKE_PROTOCOL_VERSIONS)


def serve_modern_calls(manager: StreamableHTTPSessionManager, clock: Clock, *, drain: Drain | None = None) -> None:
    """Serve `manager`'s 2026-07-28 `tools/call` POSTs with the lean entry (see the module docstring).

    For a JSON-response manager too: the SDK's entry runs the handler there without watching the client,
    so a client that went away (the 2026-07-28 cancel) left its call running upstream to its end, or
    to its timeout, which the tool's breaker then counted. Here the answer is still always one JSON
    body, and what the handler emits before it is dropped, as the SDK's entry drops it.
    With `drain` (the gateway's), a call POST with a head this entry took before comes straight here
    (`breakwater.gateway._known_heads`, `_ModernRoute`).
    """
    limit = manager.asgi_app  # the SDK's body-size limit in front of `manager._handle_request`
    sdk_handle: _ASGI = limit.app
    security = TransportSecurityMiddleware(manager.security_settings)
    known = _ModernRoute(manager, security, clock, drain) if drain is not None else None

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and manager._task_group is not None:
            version = method = None
            for key, value in scope["headers"]:
                if key == _VERSION_HEADER:
                    version = value
                elif key == _METHOD_HEADER:
                    method = value
            if method == b"tools/call" and version is not None and version not in _HANDSHAKE:
                return await _serve(manager, security, clock, scope, receive, send, known=known)
        return await sdk_handle(scope, receive, send)

    limit.app = route


@dataclass(frozen=True, slots=True)
class _ModernRoute:
    """The lean entry, for the 2026-07-28 call POSTs whose head the whole stack accepted before.

    Why. A stateless 2026-07-28 client sends the same head on every call of a tool (no session id),
    and the stack in front of this entry (`_known_heads`: the guards, the web routes, the bearer
    check, the drain's guard, the frame checks, Starlette's router, the session manager) reads only
    the head. Only a body the frame checks leave alone is taken (`_plain_modern_call`); the entry
    then runs every check of its own, as for any POST (issue 16, docs/benchmarks.md session 25).
    """

    manager: StreamableHTTPSessionManager
    security: TransportSecurityMiddleware
    clock: Clock
    drain: Drain

    def take(self, body: bytes) -> _ASGI | None:
        if self.drain.draining or self.manager._task_group is None or not _plain_modern_call(body):
            return None
        return self._serve

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        with serving(None, self.drain):
            await _serve(self.manager, self.security, self.clock, scope, receive, send, known=None)


def _plain_modern_call(body: bytes) -> bool:
    """Whether `body` is a well-formed `tools/call` request with object params: what the frame checks leave alone."""
    message = lane_message(body)
    return message is not None and isinstance(message.get("params"), dict) and call_envelope(message) is not None


async def _serve(
    manager: StreamableHTTPSessionManager,
    security: TransportSecurityMiddleware,
    clock: Clock,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    known: _ModernRoute | None,
) -> None:
    """`handle_modern_request` for one POST in SSE mode, with the ladder in its order (see the module docstring).

    With `known`, a POST that passes every check of the ladder offers its head to it (`_known_heads.Offer`).
    """
    request = Request(scope, receive)
    err = await security.validate_request(request, is_post=True)
    if err is not None:
        return await err(scope, receive, send)
    json_only = manager.json_response
    has_json, has_sse = check_accept_headers(request)
    if not has_json or (not json_only and not has_sse):
        return await Response(status_code=406)(scope, receive, send)
    body = await request.body()
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        rej = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error"))
        return await modern._write(rej, scope, receive, send)
    if modern._is_notification_shaped(decoded):
        return await modern._acknowledge_notification(decoded, request, scope, receive, send)
    try:
        req = JSONRPCRequest.model_validate(decoded)
    except ValidationError:
        return await modern._write(modern._INVALID_BODY, scope, receive, send)
    duplicated = find_duplicated_routing_header(request.headers.items())
    if duplicated is not None:
        rejection = InboundLadderRejection(code=HEADER_MISMATCH, message=f"{duplicated} header appears more than once")
        return await modern._write_rejection(rejection, req.id, scope, receive, send)
    verdict = classify_inbound_request(decoded, headers=dict(request.headers))
    if isinstance(verdict, InboundLadderRejection):
        return await modern._write_rejection(verdict, req.id, scope, receive, send)
    app, lifespan_state = manager.app, manager._lifespan_state
    mcp_param_rejection = await modern._mcp_param_rejection(app, request, req, verdict, lifespan_state)
    if mcp_param_rejection is not None:
        return await modern._write_rejection(mcp_param_rejection, req.id, scope, receive, send)
    if known is not None and (offer := scope.get(OFFER)) is not None:
        offer.accept(known)  # every check of the request's head passed
    connection = Connection.from_envelope(verdict.protocol_version, verdict.client_info, verdict.client_capabilities)
    reply = _Reply(clock, scope, receive, send, json_only=json_only)
    dctx = _LeanContext(
        transport=TransportContext(kind="streamable-http", can_send_request=False, headers=request.headers),
        request_id=req.id,
        message_metadata=ServerMessageMetadata(request_context=request),
        progress_token=progress_token_from_params(req.params),
        reply=reply,
    )
    group = manager._task_group
    assert group is not None  # checked by `route`, and this task has not yielded to the manager's shutdown since
    msg: JSONRPCResponse | JSONRPCError | None = None
    with reply.scope:
        group.start_soon(reply.watch, name="breakwater 2026-07-28 POST watcher")
        params = req.params
        msg = await modern._to_jsonrpc_response(
            req.id, serve_one(app, dctx, req.method, params, connection=connection, lifespan_state=lifespan_state)
        )
        reply.done = True  # from here on a disconnect cancels nothing: the answer is on its way
    if msg is not None:
        await reply.finish(msg)
    return None


@dataclass
class _LeanContext(modern._SingleExchangeDispatchContext):
    """The SDK's single-exchange dispatch context, whose notifications go straight onto this POST's response."""

    reply: _Reply | None = None

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if self.reply is None:
            return
        body = dict(params) if params is not None else None
        await self.reply.event(modern._sse_event(JSONRPCNotification(jsonrpc="2.0", method=method, params=body)), method)


class _Reply:
    """One POST's response: JSON until something is emitted or the keep-alive interval passes, then SSE (`json_only`:
    always JSON, what is emitted before the answer dropped)."""

    def __init__(self, clock: Clock, scope: Scope, receive: Receive, send: Send, *, json_only: bool = False) -> None:
        self.clock = clock
        self.asgi = (scope, receive, send)
        self.send = send
        #: The handler's scope: the watcher cancels it when the client disconnects first.
        self.scope = anyio.CancelScope()
        self.done = False  # the handler has returned (or the answer is being written)
        self.started = False  # committed to text/event-stream
        self.json_only = json_only
        # Read per request: `set_sse_keepalive` sets it process-wide. A JSON body has no pings.
        self.interval = math.inf if json_only else modern._SSE_PING_INTERVAL
        self.last = clock.monotonic()  # when the stream last carried something (or the request began)
        # Sends come from the handler's task, the watcher (pings) and whichever task relays a notification.
        self.lock = anyio.Lock(fast_acquire=True)

    async def _commit(self) -> None:
        await self.send({"type": "http.response.start", "status": 200, "headers": modern._SSE_HEADERS})
        self.started = True

    async def event(self, data: bytes, method: str) -> None:
        """Write one notification's SSE event (committing to SSE first); dropped once the answer is on its way."""
        async with self.lock:
            if self.done or self.json_only:
                logger.debug("dropped %s: %s", method, "a JSON response" if self.json_only else "response stream closed")
                return
            if not self.started:
                await self._commit()
            await self.send({"type": "http.response.body", "body": data, "more_body": True})
            self.last = self.clock.monotonic()

    async def finish(self, msg: JSONRPCResponse | JSONRPCError) -> None:
        """The answer: one JSON body if nothing was streamed, else the stream's last event."""
        async with self.lock:
            if not self.started:
                await modern._write(msg, *self.asgi)
            else:
                await self.send({"type": "http.response.body", "body": modern._sse_event(msg), "more_body": False})

    async def _ping(self) -> None:
        async with self.lock:
            if self.done or self.clock.monotonic() < self.last + self.interval:
                return  # answered, or an event went out since the watcher's deadline was set
            if not self.started:
                await self._commit()
            await self.send({"type": "http.response.body", "body": _PING, "more_body": True})
            self.last = self.clock.monotonic()

    async def watch(self) -> None:
        """Until the answer: cancel the handler when the client disconnects; ping a silent stream."""
        receive = self.asgi[1]
        try:
            while not self.done:
                deadline = self.last + self.interval if not math.isinf(self.interval) else math.inf
                with self.clock.deadline_scope(deadline):
                    while (await receive()).get("type") != "http.disconnect":
                        pass  # a server sends nothing else once the body is read
                    if not self.done:
                        self.scope.cancel()  # the 2026-07-28 cancel: the client closed the request's stream
                    return
                await self._ping()
        except Exception:  # the manager's task group must not fall with one request
            logger.debug("the watcher of a 2026-07-28 POST failed", exc_info=True)
            if not self.done:
                self.scope.cancel()
