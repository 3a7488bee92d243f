"""The fast lane for `tools/call` on a stdio connection: the SDK's own handler kernel, without its plumbing.

Why it exists. Profiled through `bench/proxy_overhead.py --profile` (docs/benchmarks.md, issue 16),
one proxied call cost the gateway ~18 event-loop iterations and ~34 anyio checkpoints, and the
pydantic passes over the request and result only ~35 µs of it (micro-benchmarked: envelope
validation 2.6 µs, surface and params validation 5.7 µs, result dump and per-version sieve 10.4 µs,
response model and JSON 3.3 µs). The rest was hops: the line went from the stdin reader through a
memory stream to the SDK dispatcher's receive loop, which spawned the handler task, whose answer went
through a second memory stream to the stdout writer task; every hop is a wake-up of another task
(anyio's memory streams checkpoint on both ends), and on a shared 2-core machine each wake-up is where
the time goes. Measured with this lane and the upstream transport's own (`connect/_stdio.py`): 2,476
→ 1,497 Python function calls and 22.6 → 8.3 event-loop iterations per proxied call, 3.05 → 2.2 M
instructions (`bench/proxy_instructions.py`; the bare SDK hop costs 2.83 M).

What it does. Once the connection finished its handshake (2025-era, on the SDK's legacy loop), a
line that is a well-formed `tools/call` request skips the envelope model, the two memory streams
and the dispatcher loop: the reader parses it once (stdlib `json`), spawns one task, which runs the
SDK's own `ServerRunner.on_request` for it — the same middleware (OpenTelemetry, breakwater's
`explain_params_errors`), the same surface and params validation, the same handler (the gateway's
tasks wrapper, then `Gateway._on_call_tool`), the same result serialisation and per-version sieve —
and writes the answer as one line itself. So every answer and every error envelope is byte-for-byte
what the SDK path produces (up to JSON spacing), and only the transport plumbing differs.

The kernel (`on_call`). Every lane (this one and the HTTP ones, `_fast_http`) runs a call through
`on_call` rather than `ServerRunner.on_request`: the same steps in the same order (surface and params
validation, the request context, the handler, the result's serialisation and per-version sieve),
without the generic request pipeline's closures, and without the server middleware that leaves a
`tools/call` alone (`PASSIVE_FOR_CALLS`: the lane's own capture, the session recorder, the span
middleware while nothing records spans); breakwater's other middleware (the params explainer, the
metrics counter) still wraps the handler. Params that fail validation, and a server carrying any
middleware breakwater does not know, go through `on_request` itself, so every error is the SDK's.
Measured (`bench/proxy_instructions.py`, issue 16): 1.75 → 1.67 M instructions per stdio call, and
1.67 → 1.50 M with the common answer shaped directly (`serialize_call`).

What stays the SDK's. Everything else on the connection: `initialize`, every other method, every
notification except a `notifications/cancelled` naming a call in this lane, the client's answers
to our server-to-client requests, and any line the checks below do not recognise (a malformed
request gets the SDK's own error). The lane's request context is built on the live SDK dispatcher
(captured by a middleware from the connection's first request), so what the handler sends while the
call runs — progress for the caller's `progressToken`, relayed log messages, sampling and
elicitation requests and their answers — goes through the SDK's dispatcher and writer exactly as
on the SDK path. Cancellation follows the dispatcher's rules (`peer_cancel_mode="interrupt"`): the
client's `notifications/cancelled` cancels the handler, which cancels the upstream call (the SDK
client then tells the upstream), and a cancelled request is never answered; at the end of input or
a stop signal a call still running is answered CONNECTION_CLOSED, as the dispatcher does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
from typing import Any, TypeVar

import anyio
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.runner import ServerRunner, _apply_middleware, _dump_result, _extract_meta
from mcp.shared.dispatcher import DispatchContext, as_request_id, coerce_request_id
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import (
    JSONRPCDispatcher,
    _JSONRPCDispatchContext,
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp_types import CONNECTION_CLOSED, PROTOCOL_VERSION_META_KEY, CallToolResult, ErrorData, TextContent
from mcp_types import methods as sdk_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from pydantic_core import from_json

from breakwater._clock import new_cancel_scope, new_event
from breakwater._codec import dumps_line
from breakwater.gateway._request_ids import in_flight_key, unique_ids

__all__ = [
    "PASSIVE_FOR_CALLS",
    "FastLane",
    "call_context",
    "call_envelope",
    "call_params",
    "handler_error",
    "install",
    "lane_message",
    "on_call",
    "serialize_call",
    "session_lane",
]

logger = logging.getLogger("breakwater.gateway")

#: The lane of the connection whose reader is running in this context (the SDK runs each request's
#: handler in the context of the task that read it, so the capturing middleware finds its lane here).
_LANE: contextvars.ContextVar[FastLane | None] = contextvars.ContextVar("breakwater_fast_lane", default=None)

#: How long a call still running at the end of the session may take to say CONNECTION_CLOSED (the SDK's bound).
_SHUTDOWN_WRITE_S = 1.0

_INSTALLED_FLAG = "_breakwater_fast_lane"

#: The attribute by which a server middleware says how it treats a `tools/call` (`on_call` reads it):
#: true, it leaves the call alone and `on_call` skips it; "keep", it only observes the call (never
#: rewrites the request context) and `on_call` runs it around the handler. A middleware without it
#: (anyone else's) sends every call through the SDK's own `ServerRunner.on_request`.
PASSIVE_FOR_CALLS = "breakwater_for_calls"

_Write = Callable[[bytes], Awaitable[None]]


def install(server: Server[Any]) -> None:
    """Add the middleware that hands each connection's lane its SDK dispatcher (once per server)."""
    if getattr(server, _INSTALLED_FLAG, None) is server:
        return
    setattr(server, _INSTALLED_FLAG, server)

    async def capture(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        _capture(server, ctx)
        return await call_next(ctx)

    setattr(capture, PASSIVE_FOR_CALLS, True)  # a lane that serves calls has its dispatcher already
    server.middleware.append(capture)


#: The lanes of the 2025-11-25 HTTP sessions this process serves, by session id (while each session lives).
_SESSIONS: dict[str, FastLane] = {}


def session_lane(session_id: str | None) -> FastLane | None:
    """The lane of the HTTP session `session_id`, once its first request showed the lane its dispatcher."""
    return _SESSIONS.get(session_id) if session_id is not None else None


def _capture(server: Server[Any], ctx: ServerRequestContext[Any, Any]) -> None:
    lane = _LANE.get()
    if lane is not None and lane.runner is None:
        lane.adopt(ctx)
    elif lane is None:
        connection = getattr(ctx.session, "_connection", None)
        session_id = getattr(connection, "session_id", None)
        if isinstance(session_id, str) and session_id not in _SESSIONS:
            lane = FastLane(server, _no_lines)
            lane.adopt(ctx)
            if lane.runner is not None and connection is not None:
                _SESSIONS[session_id] = lane
                connection.exit_stack.callback(_SESSIONS.pop, session_id, None)


async def _no_lines(data: bytes) -> None:  # an HTTP lane answers through its POST, never as lines
    raise RuntimeError("an HTTP lane writes no lines")


class FastLane:
    """One stdio connection's fast lane for `tools/call` (see the module docstring).

    `take(line)` is called by the line reader for every line before the SDK sees it, inside
    `serving()`, which holds the lane's calls and binds the lane to the reader's context.
    """

    def __init__(self, server: Server[Any], write: _Write) -> None:
        install(server)
        self.server = server
        self._write = write
        self.runner: ServerRunner[Any] | None = None
        self._dispatcher: JSONRPCDispatcher[Any] | None = None
        #: The calls' tasks and their scopes while the lane serves (`serving()`; None outside it).
        self._tasks: dict[asyncio.Task[None], anyio.CancelScope] | None = None
        self._in_flight: dict[Any, tuple[anyio.CancelScope, _JSONRPCDispatchContext[Any]]] = {}
        #: The reading task's context while the lane serves (`serving()`), for calls started outside it.
        self._context: contextvars.Context | None = None
        #: Calls this lane took (the tests and the benchmark read it to know the lane was used).
        self.taken = 0

    def adopt(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """Take the connection's dispatcher and state from one of its requests, on the SDK's legacy loop only."""
        dctx = getattr(ctx.session, "_request_outbound", None)
        connection = getattr(ctx.session, "_connection", None)
        # A 2026-07-28 stdio connection wraps its dispatch contexts (no server-to-client requests): not ours.
        if type(dctx) is not _JSONRPCDispatchContext or connection is None:
            return
        self._dispatcher = dispatcher = dctx._dispatcher
        self.runner = ServerRunner(self.server, connection, ctx.lifespan_context)
        unique_ids(dispatcher, self)

    def holds(self, request_id: Any) -> bool:
        """Whether a request with this id is in flight on the connection: a call of this lane's, or the SDK's."""
        return self._holds(in_flight_key(request_id))

    def _holds(self, key: tuple[str, Any]) -> bool:
        """Whether the request id `key` (`in_flight_key`) is in flight: a lane's call, exactly that id (`50` is not
        `"50"`); or one in the SDK dispatcher's own table, which keys `"7"` and `7` alike (`coerce_request_id`): a
        second one there would take the first one's entry (its cancel), so the SDK's domain is kept for them."""
        dispatcher = self._dispatcher
        if key in self._in_flight:
            return True
        if dispatcher is None:
            return False
        return key in dispatcher._in_flight or coerce_request_id(key[1]) in dispatcher._in_flight  # type: ignore[comparison-overlap]

    @property
    def ready(self) -> bool:
        """Whether the connection finished its 2025-era handshake and the lane knows its dispatcher."""
        runner = self.runner
        if runner is None:
            return False
        connection = runner.connection
        return connection.initialize_accepted and connection.protocol_version not in MODERN_PROTOCOL_VERSIONS

    @property
    def dispatcher(self) -> JSONRPCDispatcher[Any] | None:
        """The connection's SDK dispatcher (once adopted)."""
        return self._dispatcher

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """While the body runs, requests it hands the SDK show this lane their connection (see `_capture`)."""
        token = _LANE.set(self)
        try:
            yield
        finally:
            _LANE.reset(token)

    def serving(self) -> _Serving:
        """The context the reader runs in: the lane's calls live inside it and end (answered) when it ends."""
        return _Serving(self)

    def take_lines(self, data: bytes) -> int:
        """How many bytes of whole lines at the start of `data` this lane took (`connect._lines.HandOffReader`).

        Called from a transport's callback, outside any task: the calls start in the reading task's
        context (as captured by `serving()`), as those the task hands over do."""
        context = self._context
        if context is None:
            return 0
        return context.run(self._take_leading, data)

    def _take_leading(self, data: bytes) -> int:
        taken = 0
        while (end := data.find(b"\n", taken) + 1) > 0 and self.take(data[taken:end]):
            taken = end
        return taken

    def take(self, line: bytes) -> bool:
        """Handle `line` here if it is a `tools/call` request (or a cancel of one) this lane can serve."""
        if b'"tools/call"' in line:
            return self._take_call(line)
        if b"notifications/cancelled" in line and self._in_flight:
            return self._take_cancel(line)
        return False

    def _take_call(self, line: bytes) -> bool:
        if self._tasks is None or not self.ready:
            return False
        message = lane_message(line)
        if message is None:
            return False
        params = call_params(message)
        if params is None:
            return False
        request_id = message["id"]
        key = in_flight_key(request_id)
        if self._holds(key):
            return False  # an id in flight: refused on the SDK's path (`_request_ids.unique_ids`)
        assert self._dispatcher is not None
        dctx = call_context(_JSONRPCDispatchContext, self._dispatcher, request_id, params, cancel_requested=new_event())
        scope = new_cancel_scope()
        self._in_flight[key] = (scope, dctx)
        self.taken += 1
        # A plain asyncio task, not a task group's: the group's bookkeeping and its done callback (one more
        # event-loop iteration after every answer) were 4 % of a call (issue 16). `serving()` ends them.
        task = asyncio.get_running_loop().create_task(self._serve(request_id, message.get("params"), dctx, scope))
        self._tasks[task] = scope
        return True

    def _take_cancel(self, line: bytes) -> bool:
        message = lane_message(line)
        if message is None or message.get("method") != "notifications/cancelled" or "id" in message:
            return False
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if not _valid_id(request_id):
            return False
        entry = self._in_flight.get(in_flight_key(request_id))
        if entry is None:
            return False
        scope, dctx = entry
        dctx.cancel_requested.set()
        scope.cancel()
        return True

    async def _serve(
        self, request_id: Any, params: dict[str, Any] | None, dctx: _JSONRPCDispatchContext[Any], scope: anyio.CancelScope
    ) -> None:
        """The dispatcher's `_handle_request` for one call of this lane, writing the answer line itself.

        `scope` is cancelled by the client's `notifications/cancelled` (which sets `cancel_requested`
        first: such a call is never answered) or by the lane's end (`serving()`: the call is answered
        CONNECTION_CLOSED, unless its answer was already being written), as the SDK's dispatcher does.
        """
        assert self.runner is not None
        answer_started = False
        try:
            with scope:
                try:
                    result = await on_call(self.runner, dctx, params)
                finally:
                    dctx.close()
                    key = in_flight_key(request_id)
                    if (entry := self._in_flight.get(key)) is not None and entry[1] is dctx:
                        del self._in_flight[key]
                if not dctx.cancel_requested.is_set():
                    answer_started = True
                    await self._write(dumps_line({"jsonrpc": "2.0", "id": request_id, "result": result}))
            if scope.cancelled_caught and not answer_started and not dctx.cancel_requested.is_set():
                await self._closed(request_id)
        except anyio.get_cancelled_exc_class():  # the event loop's own end
            if not answer_started and not dctx.cancel_requested.is_set():
                await self._closed(request_id)
            raise
        except Exception as exc:
            error = handler_error(exc)
            if not dctx.cancel_requested.is_set():
                await self._write_error(request_id, error)
        finally:
            if self._tasks is not None:
                self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]

    async def _closed(self, request_id: Any) -> None:
        with anyio.move_on_after(_SHUTDOWN_WRITE_S, shield=True):  # noqa: TID251 - the SDK's real-time bound on a last write
            await self._write_error(request_id, ErrorData(code=CONNECTION_CLOSED, message="Connection closed"))

    async def _write_error(self, request_id: Any, error: ErrorData) -> None:
        body = error.model_dump(by_alias=True, mode="json", exclude_unset=True)
        await self._write(dumps_line({"jsonrpc": "2.0", "id": request_id, "error": body}))


class _Serving:
    def __init__(self, lane: FastLane) -> None:
        self._lane = lane
        self._token: contextvars.Token[FastLane | None] | None = None

    async def __aenter__(self) -> FastLane:
        self._lane._tasks = {}
        self._token = _LANE.set(self._lane)
        self._lane._context = contextvars.copy_context()
        return self._lane

    async def __aexit__(self, *exc: object) -> None:
        lane = self._lane
        lane._context = None
        if self._token is not None:
            _LANE.reset(self._token)
        tasks, lane._tasks = lane._tasks or {}, None
        # The end of input (or a stop signal): calls still running are answered CONNECTION_CLOSED, as the SDK's are,
        # and the lane ends when they have, as a task group would.
        for scope in tasks.values():
            scope.cancel()
        if tasks:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(list(tasks))


_Context = TypeVar("_Context", bound=_JSONRPCDispatchContext[Any])


def call_context(
    cls: type[_Context], dispatcher: JSONRPCDispatcher[Any], request_id: Any, params: Any, metadata: Any = None, **extra: Any
) -> _Context:
    """The dispatch context the SDK dispatcher's `_handle_request` builds for a request, for a call a lane serves."""
    return cls(
        transport=dispatcher._transport_builder(metadata),
        _dispatcher=dispatcher,
        _request_id=request_id,
        message_metadata=metadata,
        _progress_token=progress_token_from_params(params or None),
        **extra,
    )


async def on_call(runner: ServerRunner[Any], dctx: DispatchContext[Any], params: dict[str, Any] | None) -> dict[str, Any]:
    """`runner.on_request(dctx, "tools/call", params)` for a connection past its handshake, leaner (module docstring)."""
    server = runner.server
    kept: list[Any] = []
    for middleware in server.middleware:
        how = getattr(middleware, PASSIVE_FOR_CALLS, None)
        if how == "keep" or type(middleware) is OpenTelemetryMiddleware:  # the SDK's spans observe, never rewrite
            kept.append(middleware)
        elif how is not True:
            return await runner.on_request(dctx, "tools/call", params)
    entry = server.get_request_handler("tools/call")
    version = runner.connection.protocol_version
    if entry is None or not runner.connection.initialize_accepted:
        return await runner.on_request(dctx, "tools/call", params)
    try:
        # Both of the SDK's checks, in its order; a failure is answered by the SDK itself, byte for byte.
        if not _plain_surface(version, params):
            sdk_methods.validate_client_request("tools/call", version, params)
        typed = entry.params_type.model_validate({} if params is None else params, by_name=False)
    except (ValidationError, KeyError):
        return await runner.on_request(dctx, "tools/call", params)
    handler = entry.handler

    async def inner(ctx: ServerRequestContext[Any, Any]) -> HandlerResult:
        result = await handler(ctx, typed)
        if isinstance(result, ErrorData):  # raised inside the chain, as the SDK does, so middleware sees it
            raise MCPError.from_error_data(result)
        return serialize_call(runner, version, result)

    call: CallNext = inner
    for middleware in reversed(kept):
        call = partial(_apply_middleware, middleware, call)
    return _dump_result(await call(runner._make_context(dctx, "tools/call", params, _extract_meta(params), version)))


def _plain_surface(version: str, params: dict[str, Any] | None) -> bool:
    """Whether the revision's surface check of `params` is sure to pass, so `on_call` skips it.

    A name and JSON arguments, nothing else, on a handshake-era revision: every such revision's
    surface admits them (a hypothesis test holds it), and the surface check cost twice the params
    model's validation that follows it (11 µs against 5 µs on the bench machine, issue 16).
    """
    if params is None or version in MODERN_PROTOCOL_VERSIONS or not params.keys() <= _PLAIN_KEYS:
        return False
    arguments = params.get("arguments")
    return type(params.get("name")) is str and (arguments is None or type(arguments) is dict)


_PLAIN_KEYS = frozenset({"name", "arguments"})


def serialize_call(runner: ServerRunner[Any], version: str, result: HandlerResult) -> dict[str, Any]:
    """`runner._serialize("tools/call", version, result)`, the common answer shaped here, in the same form.

    A result of text blocks only (no annotations or `_meta` of their own), with or without a small
    `_meta` and structured content of plain JSON values, on a handshake-era connection with no cache
    hint, is what the SDK's model dump and per-version sieve (a validation and a second dump) turn into
    `{"_meta": ..., "content": [{"text": ..., "type": "text"}, ...], "isError": ..., "structuredContent": ...}`,
    in that key order; building it directly saved 0.1 M of 1.6 M instructions per stdio call
    (`bench/proxy_instructions.py`, issue 16). Anything else (a non-finite number, which the SDK's
    JSON dump turns into null; more than `_PLAIN_VALUES_MAX` values, where the walk below would cost
    more than pydantic's) takes the SDK's way; a hypothesis test holds the two equal, byte for byte.
    """
    if (
        type(result) is CallToolResult
        and version not in MODERN_PROTOCOL_VERSIONS
        and "tools/call" not in runner.server.cache_hints
        and type(result.is_error) is bool
    ):
        meta, structured = result.meta, result.structured_content
        content: list[dict[str, Any]] = []
        for block in result.content:
            if type(block) is not TextContent or block.annotations is not None or block.meta is not None:
                break
            content.append({"text": block.text, "type": "text"})
        else:
            if _plain_json(meta, structured):
                shaped: dict[str, Any] = {} if meta is None else {"_meta": meta}
                shaped["content"] = content
                shaped["isError"] = result.is_error
                if structured is not None:
                    shaped["structuredContent"] = structured
                return shaped
    return runner._serialize("tools/call", version, result)


#: The most values `serialize_call` inspects in structured content before leaving it to the SDK.
_PLAIN_VALUES_MAX = 256
_SCALARS = (str, int, bool, type(None))


def _plain_json(*values: dict[str, Any] | None) -> bool:
    """Whether `values` hold only JSON's own values (str keys, finite floats), so a JSON-mode dump leaves them as they are."""
    stack: list[Any] = list(values)
    budget = _PLAIN_VALUES_MAX
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            return False
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _SCALARS:
            return False
    return True


def call_envelope(message: dict[str, Any]) -> dict[str, Any] | None:
    """The params of `message` if it is a well-formed `tools/call` request of either revision (`{}` for none), else None."""
    if message.get("jsonrpc") != "2.0" or message.get("method") != "tools/call" or not _valid_id(message.get("id")):
        return None
    if message.keys() - _ENVELOPE_KEYS:
        return None
    params = message.get("params")
    if params is None:
        return {}
    return params if isinstance(params, dict) else None


_ENVELOPE_KEYS = frozenset({"jsonrpc", "id", "method", "params"})


def call_params(message: dict[str, Any]) -> dict[str, Any] | None:
    """The params of `message` if it is a plain `tools/call` request a lane may serve (`{}` for none), else None.

    Anything else — another shape of envelope, a 2026-07-28 envelope on a 2025-era connection (the
    SDK refuses it) — is the SDK's to answer, as it always was.
    """
    params = call_envelope(message)
    if params is None:
        return None
    meta = params.get("_meta")
    if isinstance(meta, Mapping) and PROTOCOL_VERSION_META_KEY in meta:
        return None
    return params


def handler_error(exc: Exception) -> ErrorData:
    """The error the SDK dispatcher answers a handler's exception with."""
    error = handler_exception_to_error_data(exc)
    if error is None:
        logger.exception("handler for 'tools/call' raised")
        # The dispatcher's own answer to an unmapped exception (its v1 compatibility code).
        error = ErrorData(code=0, message=str(exc))
    return error


def lane_message(line: bytes) -> dict[str, Any] | None:
    """A line (or an HTTP lane's body) as the lane's JSON object, or None: the SDK's path reads it (and answers what is
    wrong with it).

    Only what the SDK's own parser reads (pydantic-core's): the stdlib also reads a lone surrogate escape, which the
    lane then sent on to a server whose parser dropped it, and the call waited for its timeout (a TIMEOUT, retryable)
    where the SDK's path answers the client at once."""
    try:
        message = from_json(line, allow_inf_nan=False)
    except ValueError:
        return None  # the SDK answers it (parse error, or NaN's: screen_non_finite), or drops it, as it always did
    return message if isinstance(message, dict) else None


def _valid_id(value: Any) -> bool:
    return as_request_id(value) is not None
