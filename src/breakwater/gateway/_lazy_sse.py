"""A 2025-11-25 POST answered with one JSON body when nothing reaches the client before the answer.

Streamable HTTP (2025-11-25) lets a server answer a POSTed request either with `text/event-stream`
or with one `application/json` body, and obliges the client to accept both. The SDK's sessionful
transport commits to an SSE stream for every request before the handler runs: a
`sse_starlette.EventSourceResponse` per POST, with its own task group (stream, ping, disconnect
and exit-signal watchers, the data sender) and two memory streams. For a tool call that carries no
progress, log message or server request, that machinery carries exactly one event, and it was the
largest single cost on the gateway's HTTP path: `bench/proxy_overhead.py` measured 3.5 ms of
gateway CPU per call in the default SSE mode against 2.4 ms with `--json-response` (same run).

This fast path waits for the first message the handler sends for the request, up to `COMMIT_S`:

* the response itself: it is sent as one JSON body (as `--json-response` would), and that is all;
* anything else first (progress, a log message, a sampling or elicitation request), or nothing
  within `COMMIT_S` (a long call, which needs the stream's keep-alive pings): the answer commits to
  the SDK's own SSE stream, with that first message as its first event, exactly as before.

So nothing is lost mid-call: whatever the SDK would have streamed is streamed. Everything else (an
`initialize`, a notification or response POST, a body that does not parse, a header the SDK refuses,
an event store for resumability) goes to the SDK's own handler unchanged. It bypasses
`StreamableHTTPServerTransport._handle_post_request` (SDK 2.3, pinned `<2.4`) only for the plain
request case, reusing the transport's own helpers for every wire shape; the conformance suite and
tests/gateway/test_gateway_relay.py are what show the protocol is still spoken.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from http import HTTPStatus
from typing import Any

import anyio
import pydantic_core
from mcp.server import streamable_http as sdk
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from breakwater._clock import Clock
from breakwater.gateway._fast_http import start_call

__all__ = ["COMMIT_S", "answer_lazily"]

logger = logging.getLogger("breakwater.gateway")

#: How long a POST waits for its first message before it commits to an SSE stream (whose pings then
#: keep the connection alive). A call that answers within it with nothing before its answer is sent
#: as one JSON body.
COMMIT_S = 1.0

_Post = Callable[[Scope, Request, Receive, Send], Awaitable[None]]


def answer_lazily(manager: StreamableHTTPSessionManager, clock: Clock) -> None:
    """Give every session `manager` opens from now on the lazy POST path (see the module docstring)."""
    admit = manager._admit_session

    def admit_lazily(requestor: Any) -> sdk.StreamableHTTPServerTransport | None:
        transport = admit(requestor)
        if transport is not None and not transport.is_json_response_enabled and transport._event_store is None:
            sdk_post: _Post = transport._handle_post_request
            # An instance attribute: the transport's `_handle_request` looks the method up on `self`.
            transport._handle_post_request = partial(_post, transport, sdk_post, clock)  # type: ignore[method-assign]
        return transport

    manager._admit_session = admit_lazily  # type: ignore[method-assign]


async def _post(
    transport: sdk.StreamableHTTPServerTransport,
    sdk_post: _Post,
    clock: Clock,
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
    body = await request.body()
    try:
        message = jsonrpc_message_adapter.validate_python(pydantic_core.from_json(body), by_name=False)
    except ValueError:  # pydantic's ValidationError included: the SDK answers it
        return await sdk_post(scope, request, receive, send)
    if not isinstance(message, JSONRPCRequest) or message.method == "initialize":
        return await sdk_post(scope, request, receive, send)
    if not await transport._validate_request_headers(request, send):
        return None
    try:
        await _answer(transport, writer, clock, message, scope, request, receive, send)
    except Exception as err:  # as the SDK's handler does
        logger.exception("Error handling POST request")
        response = transport._create_error_response(
            "Error handling POST request", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
        )
        await response(scope, receive, send)
        await writer.send(Exception(err))
    return None


async def _answer(
    transport: sdk.StreamableHTTPServerTransport,
    writer: Any,
    clock: Clock,
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
    session_message = transport._create_session_message(message, request, request_id, protocol_version)
    # A plain tools/call skips the session's read stream, and its answer the router (breakwater.gateway._fast_http).
    if not start_call(transport, session_message):
        await writer.send(session_message)
    first: sdk.EventMessage | None = None
    try:
        with clock.deadline_scope(clock.monotonic() + COMMIT_S):
            first = await reader.receive()
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        # The session was terminated while the request was in flight (as in the SDK's JSON mode).
        await transport._clean_up_memory_streams(request_id)
        response = transport._create_error_response(
            "Session terminated before the request completed", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
        )
        await response(scope, receive, send)
        return
    if first is not None and isinstance(first.message, JSONRPCResponse | JSONRPCError):
        await transport._clean_up_memory_streams(request_id)
        await transport._create_json_response(first.message)(scope, receive, send)
        return
    # Something comes before the answer, or the answer takes a while: the SDK's SSE stream, that message first.
    sse_writer, sse_reader = anyio.create_memory_object_stream[sdk.SSEEvent](0)
    transport._sse_stream_writers[request_id] = sse_writer
    lead = transport._create_event_data(first) if first is not None else None
    headers = {
        "Cache-Control": "no-cache, no-transform",
        "Connection": "keep-alive",
        "Content-Type": sdk.CONTENT_TYPE_SSE,
        **({sdk.MCP_SESSION_ID_HEADER: transport.mcp_session_id} if transport.mcp_session_id else {}),
    }
    # `_run_sse_writer` sends its "priming" event before the rest of the request's stream: here, the lead message.
    response = EventSourceResponse(
        content=sse_reader,
        data_sender_callable=partial(transport._run_sse_writer, request_id, sse_writer, reader, lead),
        headers=headers,
    )
    try:
        await response(scope, receive, send)
    except Exception:
        logger.exception("SSE response error")
        await sse_writer.aclose()
        await transport._clean_up_memory_streams(request_id)
    finally:
        await sse_reader.aclose()
