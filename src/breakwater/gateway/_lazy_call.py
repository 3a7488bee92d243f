"""A 2025-11-25 `tools/call` POST in the default mode: its handler in the POST's own task, its SSE stream only if needed.

Why it exists. The SDK (and, before session 7, `breakwater.gateway._lazy_sse`) served a POSTed call by
writing it into the session's read stream, where the dispatcher's loop spawned the handler, whose answer
went through the session's write stream to the transport's router and from there through the request's
stream back to the POST, which waited for it with a deadline of its own: each hop a wake-up of another
task. `--json-response` already ran the handler in the POST's task (`breakwater.gateway._fast_http`);
the default mode cost ~0.4 M instructions and ~8 event-loop iterations per call more (issue 16).
Measured with `bench/proxy_instructions.py`: 2.36 → 2.02 M instructions per call (JSON mode: 1.97;
docs/benchmarks.md, session 7).

What it does, for a plain `tools/call` (`breakwater.gateway._fast_http.plain_call`) on a session whose
handshake is done:

* the SDK's `ServerRunner` kernel (`_fast_call.on_call`) runs in the POST's task, on the session's live dispatcher, with
  the request entered in the dispatcher's table (a POSTed `notifications/cancelled` cancels it, as the
  dispatcher would) and the SDK's metadata for it (the unanswered-request hook, the resumable stream's
  close callbacks);
* the response stays one `application/json` body until the call sends something for the request
  (progress, a log message, a sampling or elicitation request: `_WatchedContext.before_send`) or
  outlives the commit window (`Lazy.commit_s`, never longer than the keep-alive interval;
  `_Window`). Then, before that message reaches the transport's router, the response becomes the
  SDK's own SSE stream (`stream_response`: the request's stream, the SDK's SSE writer, sse-starlette's
  pings), served by a task in the session manager's task group, and everything on it, the answer
  last, goes the SDK's way (the router), so nothing overtakes what was sent before it. A resumable
  stream (`breakwater.gateway._resume`) is committed to its log before anything is stored for it;
* the session's end (a DELETE, the idle timeout, the manager's stop: every one terminates the
  transport) cancels the call, which then ends as the SDK's path ends it: a 500 "Session terminated
  before the request completed" when nothing was streamed, else the stream ends;
* every answer, error and REQUEST_CANCELLED envelope is the SDK's model, serialised by the transport's
  own helpers (tests/gateway/test_lazy_sse.py compares raw POSTs byte for byte with the SDK's path).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, cast

import anyio
from anyio.abc import TaskGroup
from mcp.server import streamable_http as sdk
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import _InFlight
from mcp_types import (
    CONNECTION_CLOSED,
    DEFAULT_NEGOTIATED_VERSION,
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
)
from mcp_types.version import is_version_at_least
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from breakwater._clock import Clock
from breakwater.gateway._fast_call import FastLane, call_context, handler_error, on_call
from breakwater.gateway._fast_http import _WatchedContext, reply_json, request_cancelled, session_ended
from breakwater.gateway._resume import SessionStreams

__all__ = ["COMMIT_S", "Call", "Lazy", "serve_call", "stream_response"]

logger = logging.getLogger("breakwater.gateway")

#: How long a POST may stay silent before it commits to an SSE stream (whose pings then keep the connection
#: alive). A call that answers within it with nothing before its answer is sent as one JSON body.
COMMIT_S = 1.0

#: The SDK dispatcher's bound on a last answer written while the session shuts down (real time, as there).
_SHUTDOWN_WRITE_S = 1.0


class Lazy:
    """The settings of one app's lazy path, and its commit window."""

    def __init__(self, clock: Clock, keepalive_s: float, group: Callable[[], TaskGroup | None]) -> None:
        self.clock = clock
        self.keepalive_s = keepalive_s
        # A stream silent until it commits must not stay silent longer than its pings would let it.
        self.commit_s = min(COMMIT_S, keepalive_s) if keepalive_s > 0 else COMMIT_S
        #: The session manager's task group while the app runs (None before and after).
        self.group = group
        self.window = _Window(clock, self.commit_s, group)


class _Window:
    """The commit window of every call of one app in flight: one task and a queue, not a task (or timer) per call.

    Every call gets the same window, so deadlines arrive in order and the queue is a FIFO: adding a call
    is an append; answered calls are dropped from its head (`settle`, and the task skips them). The task
    sleeps on the injected clock until the oldest running call's deadline, commits the calls still running
    whose window passed (`Call.commit`), and waits for the next call when the queue is empty, so it wakes
    about once per window while calls keep coming, not once per call. A task or an event-loop timer per
    call is what this avoids: each costs a start (a heap entry) and a wake-up or a cancel per call, on a
    path where the whole call is ~2 M instructions.
    """

    def __init__(self, clock: Clock, seconds: float, group: Callable[[], TaskGroup | None]) -> None:
        self._clock = clock
        self._seconds = seconds
        self._group = group
        self._due: deque[tuple[float, Call]] = deque()
        #: Set by `add` while the task waits for a call (the queue is empty).
        self._wake: anyio.Event | None = None
        self._running = False

    def add(self, call: Call) -> None:
        self._due.append((self._clock.monotonic() + self._seconds, call))
        if self._wake is not None:
            self._wake.set()
        elif not self._running:
            group = self._group()
            if group is not None:
                self._running = True
                group.start_soon(self._run, name="breakwater SSE commit window")

    def settle(self) -> None:
        """A call has answered: drop the answered calls at the head of the queue (usually all of it).

        So an answered call is not kept until its deadline. What a call holds for a second outlives the
        interpreter's young-generation collections and piles up in the oldest one until a full collection
        walks the whole heap: measured under callgrind, 44 M instructions of collection per 200 calls with
        answered calls kept for their window, against 2 M in JSON mode, which keeps nothing.
        """
        due = self._due
        while due and due[0][1].done:
            due.popleft()

    async def _run(self) -> None:
        try:
            while True:
                await self._commit_due()
                wake = self._wake = anyio.Event()
                await wake.wait()
                self._wake = None
        finally:
            self._running = False
            self._wake = None

    async def _commit_due(self) -> None:
        """Until the queue is empty. A frame of its own: the last call it looked at is not held while the task waits
        for the next (it was, with its request, until another call came)."""
        clock, due = self._clock, self._due
        while due:
            at, call = due[0]
            if call.done:  # answered in time (most calls): dropped without waiting for its deadline
                due.popleft()
                continue
            wait = at - clock.monotonic()
            if wait > 0:
                del call  # an answered call is let go at once (`settle`), not when this sleep ends
                await clock.sleep(wait)
                continue
            due.popleft()
            if not call.done:
                try:
                    call.commit()
                except Exception:  # the manager's task group must not fall with one call
                    logger.exception("cannot commit a call's response to SSE")


async def stream_response(
    transport: sdk.StreamableHTTPServerTransport,
    lazy: Lazy,
    request_id: str,
    reader: Any,
    priming: sdk.SSEEvent | None,
    first: sdk.EventMessage | None,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """Something comes before the answer, or the answer takes a while: the SDK's SSE stream, `first` first."""
    sse_writer, sse_reader = anyio.create_memory_object_stream[sdk.SSEEvent](0)
    transport._sse_stream_writers[request_id] = sse_writer
    lead = transport._create_event_data(first) if first is not None else None
    headers = {
        "Cache-Control": "no-cache, no-transform",
        "Connection": "keep-alive",
        "Content-Type": sdk.CONTENT_TYPE_SSE,
        **({sdk.MCP_SESSION_ID_HEADER: transport.mcp_session_id} if transport.mcp_session_id else {}),
    }

    async def write() -> None:
        if priming is not None and lead is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await sse_writer.send(priming)
        # `_run_sse_writer` sends its "priming" event before the rest of the request's stream: the lead message.
        seen = _LastSeen(reader)
        await transport._run_sse_writer(request_id, sse_writer, cast(Any, seen), lead if lead is not None else priming)
        _let_go(seen.last)

    response = EventSourceResponse(content=sse_reader, data_sender_callable=write, headers=headers, ping=lazy.keepalive_s)
    try:
        await response(scope, receive, send)
    except Exception:
        logger.exception("SSE response error")
        await sse_writer.aclose()
        await transport._clean_up_memory_streams(request_id)
    finally:
        await sse_reader.aclose()


class _LastSeen:
    """A request stream's reader that notes the last event the SDK's SSE writer took from it (the answer, at the end)."""

    __slots__ = ("_reader", "last")

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.last: sdk.EventMessage | None = None

    async def __aenter__(self) -> _LastSeen:
        await self._reader.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._reader.__aexit__(*exc)

    def __aiter__(self) -> _LastSeen:
        return self

    async def __anext__(self) -> sdk.EventMessage:
        event: sdk.EventMessage = await self._reader.__anext__()
        self.last = event
        return event


def _let_go(event: sdk.EventMessage | None) -> None:
    """Empty an answer the SSE writer has written (serialized at once: `_create_event_data`).

    The SDK's router (`StreamableHTTPServerTransport.connect`) keeps the last message it routed in its loop's frame
    until the session's next message: an idle 2025-11-25 session held its last streamed answer until it expired
    (30 minutes by default), ten abandoned 6 MB answers 63 MB.
    """
    message = event.message if event is not None else None
    if isinstance(message, JSONRPCResponse) and isinstance(message.result, dict):
        message.result.clear()


class Call:
    """One POSTed call's response: one JSON body until the call sends something or outlives the window, then SSE."""

    __slots__ = ("asgi", "committed", "done", "ended", "lazy", "message", "primed", "protocol_version", "scope",
                 "streamed", "transport", "view")  # fmt: skip

    def __init__(
        self,
        transport: sdk.StreamableHTTPServerTransport,
        lazy: Lazy,
        view: SessionStreams | None,
        message: dict[str, Any],
        protocol_version: str,
        asgi: tuple[Scope, Receive, Send],
    ) -> None:
        self.transport = transport
        self.lazy = lazy
        self.view = view
        self.message = message  # the POSTed call, as `plain_call` validated it
        self.protocol_version = protocol_version
        #: The POST's ASGI triple, for the stream (dropped once the call is answered without one: see `_Window.settle`).
        self.asgi: tuple[Scope, Receive, Send] | None = asgi
        #: The handler's scope: cancelled by the client's `notifications/cancelled` (the dispatcher) or the session's end.
        self.scope = anyio.CancelScope()
        self.done = False  # the handler has returned: nothing commits the response any more
        self.committed = False  # the response is (becoming) an SSE stream
        self.ended = False  # the session ended under the call
        #: Set once the stream's resumption log knows it (`SessionStreams.commit`): nothing is stored for it before.
        self.primed: anyio.Event | None = None
        #: Set when the SSE response has ended.
        self.streamed: anyio.Event | None = None

    def commit(self) -> None:
        """Make the response an SSE stream: the request's stream for the router, and a task that serves it."""
        if self.committed or self.done:
            return
        group = self.lazy.group()
        if group is None:  # the app is stopping: what the call sends has no stream (as after a disconnect)
            return
        self.committed = True
        transport, request_id = self.transport, str(self.message["id"])
        streams = anyio.create_memory_object_stream[sdk.EventMessage](sdk.REQUEST_STREAM_BUFFER_SIZE)
        transport._request_streams[request_id] = streams
        view = self.view
        # Older clients cannot read a priming event (and the SDK offers them no resumption either).
        if view is not None and not (is_version_at_least(self.protocol_version, "2025-11-25") and view.open(request_id)):
            view = self.view = None
        if view is not None:
            self.primed = anyio.Event()
        self.streamed = anyio.Event()
        assert self.asgi is not None  # not done
        group.start_soon(self._serve, streams[1], self.asgi, name="breakwater 2025-11-25 SSE response")

    async def before_send(self) -> None:
        """Before the call sends its first message: the response becomes an SSE stream (the message its first event)."""
        self.commit()
        primed = self.primed
        if primed is not None and not primed.is_set():
            await primed.wait()

    def end(self) -> None:
        """The session ended: the handler is cancelled (the POST answers as the SDK's path does then)."""
        self.ended = True
        self.scope.cancel()

    async def _serve(self, reader: Any, asgi: tuple[Scope, Receive, Send]) -> None:
        assert self.streamed is not None
        try:
            priming = None
            if self.view is not None:
                message = self.message
                request = JSONRPCRequest.model_construct(
                    jsonrpc="2.0", id=message["id"], method="tools/call", params=message.get("params")
                )
                priming = await self.view.commit(request)
            if self.primed is not None:
                self.primed.set()
            await stream_response(self.transport, self.lazy, str(self.message["id"]), reader, priming, None, *asgi)
        except Exception:  # the manager's task group must not fall with one response
            logger.exception("SSE response error")
        finally:
            if self.primed is not None:
                self.primed.set()
            self.streamed.set()


class _Id(NamedTuple):
    """What `StreamableHTTPServerTransport._create_session_message` reads of the request: its id."""

    id: Any


async def serve_call(
    transport: sdk.StreamableHTTPServerTransport,
    lane: FastLane,
    lazy: Lazy,
    view: SessionStreams | None,
    calls: set[Call],
    message: dict[str, Any],
    scope: Scope,
    request: Request,
    receive: Receive,
    send: Send,
) -> None:
    """The dispatcher's `_handle_request` for one POSTed call, in the POST's task; the answer as JSON or SSE.

    Why. The SDK writes the request into the session's read stream, where the dispatcher's loop spawns
    the handler, whose answer goes through the session's write stream to the transport's router and from
    there through the request's stream to the POST: each hop a wake-up of another task. Running the
    handler here, as `--json-response` does (`breakwater.gateway._fast_http`), measured 2.36 → 2.02 M
    instructions per call (`bench/proxy_instructions.py`; JSON mode 1.97; docs/benchmarks.md, session 7).

    What stays the SDK's: the handler (`ServerRunner`'s kernel, `_fast_call.on_call`: middleware, validation, the gateway's
    handler, the result's serialisation), the request's entry in the dispatcher's table (a POSTed
    `notifications/cancelled` cancels it), and, once the response is an SSE stream, every message on it:
    the router puts them on the request's stream, the SDK's SSE writer writes them, the answer included
    (so it cannot overtake what was sent before it).
    """
    dispatcher, runner = lane.dispatcher, lane.runner
    assert dispatcher is not None and runner is not None
    request_id, params = message["id"], message.get("params")
    protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
    # The SDK's metadata for the request (its hook for an unanswered request, the resumable stream's close
    # callbacks), from the transport's own helper, which reads nothing of the message but its id: an envelope
    # model for it (pydantic's `model_construct`) was a measurable part of the call's cost.
    envelope = cast(JSONRPCRequest, _Id(request_id))
    metadata = transport._create_session_message(envelope, request, str(request_id), protocol_version).metadata
    call = Call(transport, lazy, view, message, protocol_version, (scope, receive, send))
    dctx = call_context(_WatchedContext, dispatcher, request_id, params, metadata, before_send=call.before_send)
    key = coerce_request_id(request_id)
    entry = _InFlight(scope=call.scope, dctx=dctx)
    dispatcher._in_flight[key] = entry
    calls.add(call)
    lazy.window.add(call)
    result: dict[str, Any] | None = None
    error: ErrorData | None = None
    try:
        with call.scope:
            try:
                result = await on_call(runner, dctx, params)
            finally:
                call.done = True
                dctx.close()
                if dispatcher._in_flight.get(key) is entry:
                    del dispatcher._in_flight[key]
    except Exception as exc:
        error = handler_error(exc)
    except anyio.get_cancelled_exc_class():
        # The POST's own task is cancelled (a server stopping without waiting): as the dispatcher's shutdown.
        if call.committed and not dctx.cancel_requested.is_set():
            await _connection_closed(dispatcher, request_id)
        raise
    finally:
        calls.discard(call)
        if not call.committed:
            call.asgi = None
        lazy.window.settle()
    if dctx.cancel_requested.is_set():
        result = error = None  # the client cancelled it: the 2025-era wire ends it with REQUEST_CANCELLED
    if not call.committed:
        return await _json_answer(transport, call, request_id, result, error, (scope, receive, send))
    await _stream_answer(call, dispatcher, dctx, result, error)
    return None


async def _json_answer(
    transport: sdk.StreamableHTTPServerTransport,
    call: Call,
    request_id: Any,
    result: dict[str, Any] | None,
    error: ErrorData | None,
    http: tuple[Scope, Receive, Send],
) -> None:
    """Nothing was streamed: the answer as one JSON body (the transport's own response for it)."""
    scope, receive, send = http
    if call.ended and result is None and error is None:
        return await session_ended(transport, request_id)(scope, receive, send)
    answer: dict[str, Any] | JSONRPCError
    if result is not None:
        answer = result
    elif error is not None:
        answer = JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
    else:
        answer = request_cancelled(request_id)
    return await reply_json(transport, request_id, answer, scope, receive, send)


async def _stream_answer(
    call: Call,
    dispatcher: Any,
    dctx: _WatchedContext,
    result: dict[str, Any] | None,
    error: ErrorData | None,
) -> None:
    """The response is an SSE stream: the answer goes the SDK's way, after whatever the call sent; then its end."""
    request_id = dctx.request_id
    assert request_id is not None and call.streamed is not None
    await call.before_send()
    if result is not None:
        await dispatcher._write_result(request_id, result)
    elif error is not None:
        await dispatcher._write_error(request_id, error)
    elif dctx.cancel_requested.is_set():
        await dispatcher._settle_unanswered(dctx)
    else:  # the session ended under the call
        await _connection_closed(dispatcher, request_id)
    await call.streamed.wait()


async def _connection_closed(dispatcher: Any, request_id: Any) -> None:
    """As the dispatcher answers its handlers at shutdown: CONNECTION_CLOSED, shielded and bounded."""
    await dispatcher._final_write(
        partial(dispatcher._write_error, request_id, ErrorData(code=CONNECTION_CLOSED, message="Connection closed")),
        shield=True,
        timeout=_SHUTDOWN_WRITE_S,
        describe=f"shutdown error response for request {request_id!r}",
    )
