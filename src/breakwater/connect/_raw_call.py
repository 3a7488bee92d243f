"""`tools/call` on a stdio upstream without the SDK client session's plumbing.

Why it exists. Per proxied call, `mcp.Client.call_tool` builds a request model and dumps it, and
its dispatcher opens an OpenTelemetry span, a memory-stream pair and a timeout scope for the answer;
the answer is validated twice on the way in (the JSON-RPC envelope from the wire, then the result),
and it waits behind the session's receive loop, which hands it over through that memory stream.
Over stdio that made the gateway spend more CPU per call than the whole direct call it relays
(docs/benchmarks.md, issue 16). Here the request line is written from the calling task, the answer
line is recognised by the reader before the SDK parses it (one JSON parse, `breakwater._codec`), and the caller
wakes straight from the reader: one hop and one validation of the result.

What stays the SDK's. The request is stamped by the session's own per-revision stamp (2026-07-28's
`_meta` envelope), the answer is checked by the same functions `ClientSession.send_request` runs
(the revision's result check, later revisions' fields dropped, the result adapter), a result that is
not a plain `CallToolResult` (input required, a claimed shape such as a task) goes to the client's
own drivers, and `structuredContent` is checked against the tool's output schema by the session, as
`Client.call_tool` does. Every other message on the connection — server-to-client requests
(sampling, elicitation), log messages, list changes, and the SDK's own requests — is the SDK's, as
before. Progress for a raw call is delivered by the calling task before its answer, in the order the
server sent them. Cancellation sends the SDK's courtesy `notifications/cancelled` ("caller
cancelled"), so cancelling still reaches the server. A call whose arguments pydantic-core cannot
write (a library caller's object of no JSON shape) goes through the SDK, which raises the same error;
so does every call while a tracer provider is set, so the SDK's client span and the trace context it
injects into `_meta` are there whenever something records them.

Raw requests carry string ids with their own prefix, so they never meet the SDK's integer ids.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp import Client, MCPError
from mcp.client.extension import ClaimContext, UnexpectedClaimedResult
from mcp.client.session import _clamp_inbound_ttl, _later_revision_fields
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CONNECTION_CLOSED, ErrorData
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace
from pydantic import ValidationError

from breakwater._codec import dumps_line, loads

if TYPE_CHECKING:
    from breakwater.connect._lines import StdoutParser

__all__ = ["RAW_ID_PREFIX", "RawCalls", "ServerReplyError", "call_tool", "plain_result", "sdk_spans_recorded"]

logger = logging.getLogger("breakwater.stdio")

#: Prefix of the raw requests' ids (strings: the SDK's own ids are integers, so the two never meet).
RAW_ID_PREFIX = "bw-"
_MARK = b'"' + RAW_ID_PREFIX.encode()
_METHOD = "tools/call"
#: The SDK's bound on a courtesy cancel's write (`jsonrpc_dispatcher._ABANDON_WRITE_TIMEOUT`).
_ABANDON_WRITE_S = 2.0
_CANCEL_REASON = "caller cancelled"  # the SDK's words for it
_META_ALIASES = {"progress_token": "progressToken"}
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ

ProgressFn = ProgressFnT
WriteLine = Callable[[bytes], Awaitable[None]]


class ServerReplyError(MCPError):
    """The server's own JSON-RPC error answer to a request, as it came off the wire.

    Its code may be one breakwater and the SDK also give failures they make themselves (-32000
    connection closed, -32001 request timed out, -32090 result too large): a server may send any
    number, so this class, not the code, says the server answered (`gate._classify`). The raw path
    raises it for every error answer it reads; the SDK's path raises plain `MCPError`s, its own and
    the server's alike (`gate._classify.server_answer` tells them apart where it can).
    """


class _WireError(ErrorData):
    """An error answer read off the wire by `take()`, unlike the ones made here (`take_error`, `close`)."""


class _Pending:
    """One raw request waiting for its answer; the reader fills it, the calling task drains it."""

    __slots__ = ("answer", "progress", "waiter")

    def __init__(self) -> None:
        self.answer: dict[str, Any] | ErrorData | None = None
        self.progress: collections.deque[tuple[float, float | None, str | None]] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class RawCalls:
    """The raw `tools/call` requests in flight on one stdio connection (see the module docstring).

    The transport calls `take(line)` for each line the server writes before the SDK parses it,
    `take_error(message)` for an error the parser made itself (an oversized answer), and `close()`
    when the connection ends.
    """

    def __init__(self, write_line: WriteLine, parser: StdoutParser) -> None:
        self._write_line = write_line
        self._parser = parser
        self._pending: dict[str, _Pending] = {}
        self._count = 0
        self._closed = False
        #: What ended the connection, when the transport knew (`close(why)`): told to a call refused after it too.
        self._closed_why: str | None = None

    def take(self, line: bytes) -> bool:
        """Consume `line` if it answers, or reports the progress of, a raw call in flight."""
        if not self._pending or _MARK not in line:
            return False
        try:
            message = loads(line)
        except UnicodeDecodeError:  # as the SDK's parser reads it: invalid UTF-8 becomes U+FFFD, not a lost answer
            try:
                message = json.loads(line.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                return False
        except (ValueError, RecursionError):  # not ours to judge: the SDK's parser logs it
            return False
        if not isinstance(message, dict):
            return False
        if "method" in message:
            return self._take_progress(message)
        key = message.get("id")
        pending = self._pending.get(key) if isinstance(key, str) else None  # an id of another type is not ours
        if pending is None or pending.answer is not None:
            return False
        if "error" in message:
            try:
                pending.answer = _WireError.model_validate(message["error"], by_name=False)
            except ValidationError:
                return False  # malformed: the SDK's parser drops it, as it would any junk line
        elif isinstance(result := message.get("result"), dict):
            pending.answer = result
        else:
            return False
        self._parser.pending.pop(key, None)
        pending.wake()
        return True

    def take_error(self, message: types.JSONRPCMessage) -> bool:
        """Consume an error the parser built for a raw call (its answer was over `max_result_bytes`)."""
        if not isinstance(message, types.JSONRPCError) or not isinstance(message.id, str):
            return False
        pending = self._pending.get(message.id)
        if pending is None:
            return False
        pending.answer = message.error
        pending.wake()
        return True

    def _take_progress(self, message: dict[str, Any]) -> bool:
        params = message.get("params")
        if message.get("method") != "notifications/progress" or not isinstance(params, dict):
            return False
        token = params.get("progressToken")
        pending = self._pending.get(token) if isinstance(token, str) else None
        progress, total, text = params.get("progress"), params.get("total"), params.get("message")
        if pending is None or not _number(progress) or not (total is None or _number(total)):
            return False
        if text is not None and not isinstance(text, str):
            return False  # not a progress notification the SDK would deliver either
        assert isinstance(progress, int | float)
        self._parser.notices += 1  # the gateway's relay reads it: something may be on its way to the caller
        pending.progress.append((progress, total, text))
        pending.wake()
        return True

    @property
    def closed(self) -> bool:
        """Whether the connection ended (`close()`)."""
        return self._closed

    def close(self, why: str | None = None) -> None:
        """The connection ended: every call still waiting is answered CONNECTION_CLOSED, as the SDK's are (`why`, when
        the transport knows more than that)."""
        self._closed = True
        self._closed_why = why or self._closed_why
        for pending in self._pending.values():
            if pending.answer is None:
                pending.answer = ErrorData(code=CONNECTION_CLOSED, message=why or "Connection closed")
                pending.wake()

    async def request(self, params: dict[str, Any], on_progress: ProgressFn | None) -> dict[str, Any] | None:
        """Send one `tools/call` with `params` (stamped already) and wait for its result.

        Returns None, having sent nothing, when the stdlib encoder cannot write `params`. Raises
        `ServerReplyError` for the server's error answer and `MCPError` for a closed connection or an
        answer over the size limit, as `send_raw_request` raises `MCPError` for all three.
        """
        if self._closed:
            raise MCPError(code=CONNECTION_CLOSED, message=self._closed_why or "Connection closed")
        self._count += 1
        request_id = f"{RAW_ID_PREFIX}{self._count}"
        if on_progress is not None:  # the request id doubles as the progress token, as the SDK does it
            params["_meta"] = {**params.get("_meta", {}), "progressToken": request_id}
        line = _encode({"jsonrpc": "2.0", "id": request_id, "method": _METHOD, "params": params})
        if line is None:
            return None
        pending = _Pending()
        self._pending[request_id] = pending
        self._parser.pending[request_id] = _METHOD
        sent = False
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            sent = True
            try:
                await self._write_line(line)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                # The write's failure closed the calls (`StdinWriter`): with why, when the server's end broke.
                raise MCPError(code=CONNECTION_CLOSED, message=self._closed_why or "Connection closed") from None
            answer = await self._wait(pending, on_progress)
        except anyio.get_cancelled_exc_class():
            if sent and pending.answer is None and not self._closed:
                await self._cancel(request_id)
            raise
        finally:
            del self._pending[request_id]
            self._parser.pending.pop(request_id, None)
        if isinstance(answer, ErrorData):
            error = ServerReplyError if type(answer) is _WireError else MCPError  # the server's, or made here
            raise error(code=answer.code, message=answer.message, data=answer.data)
        return answer

    async def _wait(self, pending: _Pending, on_progress: ProgressFn | None) -> dict[str, Any] | ErrorData:
        loop = asyncio.get_running_loop()
        while True:
            while pending.progress:
                progress, total, text = pending.progress.popleft()
                if on_progress is not None:
                    await on_progress(progress, total, text)
            if pending.answer is not None:
                return pending.answer
            pending.waiter = loop.create_future()
            try:
                await pending.waiter
            finally:
                pending.waiter = None

    async def _cancel(self, request_id: str) -> None:
        notice = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": _CANCEL_REASON},
        }
        line = _encode(notice)
        assert line is not None
        # Shielded and bounded, as the SDK's courtesy cancel: the caller is already cancelled.
        with anyio.move_on_after(_ABANDON_WRITE_S, shield=True) as scope:  # noqa: TID251 - a real pipe's write bound
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # gone: nothing to stop
                await self._write_line(line)
        if scope.cancelled_caught:
            logger.warning("courtesy cancel for request %r gave up: transport write blocked", request_id)


async def call_tool(
    client: Client,
    raw: RawCalls,
    name: str,
    arguments: Mapping[str, Any] | None,
    *,
    progress_callback: ProgressFn | None,
    meta: Mapping[str, Any] | None,
) -> types.CallToolResult | None:
    """`client.call_tool(...)` with its first round sent through `raw`; None if `raw` could not send it.

    Mirrors `Client.call_tool` and `ClientSession.call_tool`/`send_request` of the pinned SDK
    (2.3): the same stamp, result checks, input-required driver, claims and output-schema check.
    """
    session = client.session
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = dict(arguments)
    if meta:
        # `RequestParamsMeta` names its one declared key in Python (`progress_token`); the wire's is camelCase.
        params["_meta"] = {_META_ALIASES.get(key, key): value for key, value in meta.items() if value is not None}
    data: dict[str, Any] = {"method": _METHOD, "params": params}
    session._stamp(data, {})  # the revision's envelope; the headers it sets are HTTP's
    raw_result = await raw.request(data["params"], progress_callback)
    if raw_result is None:
        return None
    first = _result(session, raw_result)
    if isinstance(first, types.CallToolResult):
        if not first.is_error:
            await session.validate_tool_result(name, first)
        return first
    return await _finish(client, name, arguments, first, progress_callback, meta)


def _result(session: Any, raw: dict[str, Any]) -> Any:
    """`ClientSession.send_request`'s checks of a `tools/call` answer, then the call's result adapter."""
    _clamp_inbound_ttl(raw)
    version = session._negotiated_version or "2025-11-25"
    if not plain_result(version, raw):
        with contextlib.suppress(KeyError):  # a revision without a row for it: nothing to check, as in the SDK
            _methods.validate_server_result(_METHOD, version, raw)
    if not (foreign := _later_revision_fields(_METHOD, version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return session._call_tool_adapter.validate_python(raw, by_name=False)


def plain_result(version: str, raw: dict[str, Any]) -> bool:
    """Whether the revision's check of a `tools/call` result is sure to pass for `raw`, so `_result` skips it.

    Text blocks of `{"type": "text", "text": str}` only, a bool `isError`, object-valued `structuredContent`
    and `_meta`, a string `resultType` (which 2026-07-28 requires and earlier revisions ignore), nothing
    else: every revision's result surface admits that (a hypothesis test holds it). The check validates
    the result into the revision's model and dumps it again, only to raise if it does not fit: 55 of
    the 92 µs `_result` took per call under cProfile (`serve --http`, issue 16); the result adapter
    after it still builds the call's model. Measured: 1.21 → 1.14 M instructions per stdio call.
    """
    if version not in _RESULT_VERSIONS or not raw.keys() <= _PLAIN_RESULT_KEYS:
        return False
    content, result_type = raw.get("content"), raw.get("resultType", _ABSENT)
    if type(content) is not list or type(raw.get("isError", False)) is not bool:
        return False
    if type(result_type) is not str and (result_type is not _ABSENT or version in MODERN_PROTOCOL_VERSIONS):
        return False
    for key in ("structuredContent", "_meta"):
        if key in raw and type(raw[key]) is not dict:
            return False
    for block in content:
        if type(block) is not dict or block.keys() != _TEXT_KEYS or block["type"] != "text" or type(block["text"]) is not str:
            return False
    return True


_ABSENT = object()
_PLAIN_RESULT_KEYS = frozenset({"content", "isError", "structuredContent", "_meta", "resultType"})
_TEXT_KEYS = frozenset({"type", "text"})
_RESULT_VERSIONS = frozenset(version for (method, version) in _methods.SERVER_RESULTS if method == _METHOD)


async def _finish(
    client: Client,
    name: str,
    arguments: Mapping[str, Any] | None,
    first: Any,
    progress_callback: ProgressFn | None,
    meta: Mapping[str, Any] | None,
) -> types.CallToolResult:
    """A first answer that is not a plain result: the rest of `Client.call_tool`, later rounds through the SDK."""

    async def again(responses: Any, state: str | None) -> Any:
        return await client.session.call_tool(
            name,
            dict(arguments) if arguments is not None else None,
            progress_callback=progress_callback,
            input_responses=responses,
            request_state=state,
            meta=meta,  # type: ignore[arg-type]
            allow_input_required=True,
            allow_claimed=True,
        )

    result = await client._drive_input_required(first, again)
    if isinstance(result, types.CallToolResult):
        return result
    claim = client._folded_extensions.by_model.get(type(result))
    if claim is None:
        raise UnexpectedClaimedResult(result)
    final: types.CallToolResult = await claim.resolve(
        result, ClaimContext(session=client.session, tool_name=name, read_timeout_seconds=None)
    )
    if not final.is_error:
        await client.session.validate_tool_result(name, final)
    return final


def sdk_spans_recorded() -> bool:
    """Whether a tracer provider is set, so the SDK's spans are recorded (the raw path opens none: it steps aside)."""
    # `get_tracer_provider()` looks the environment up on every call while none is set (a few µs, twice per
    # call); the module's own global says the same at once. A provider named only by the environment variable
    # is installed by that first lookup, so the variable is read once here too.
    if getattr(trace, "_TRACER_PROVIDER", None) is not None:
        return True
    return _PROVIDER_FROM_ENV and type(trace.get_tracer_provider()) is not trace.ProxyTracerProvider


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _encode(message: dict[str, Any]) -> bytes | None:
    try:
        return dumps_line(message, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # no JSON shape (a library caller's object): the SDK's path, and its error
        return None
