"""One cut HTTP request fails one call, not the whole upstream connection.

SDK 2.3's streamable-HTTP client runs each POST in a task of the transport's task group. If a POST
raises a transport error before its response is read (connection refused, reset, a response cut
mid-body, a read timeout), the error escapes that task and crashes the whole transport: every other
call in flight on the connection fails with it and the client must reconnect (one `Client` multiplexes every call; the
chaos run saw one cut take down every concurrent call). This httpx transport sits under the SDK's
client and turns such an error on a JSON-RPC request into an HTTP 502 whose body is a JSON-RPC error
for that request id, which the SDK delivers to the one waiting call. The error says whether the
request provably never left (`sent: false`: connect failures) and what failed, so the gate can
classify it honestly (`breakwater.gate._classify`): a call that was never sent is safe to retry for
every tool; one cut after sending is an unknown outcome.

An HTTP error status on a request is made a JSON-RPC error for that request too, unless its body is one
already. The SDK answers every status without such a body alike ("Server returned an error response",
-32603: a server fault that may have half-run), which hid what the status says: a 401 or a 503 refused the
request before it ran (safe to send again), a 404 on a request that carried the session's id is the server
saying it no longer knows the session (MCP: start a new one; the SDK client relayed a server's JSON "Session
not found" as the server's answer, so every call failed until the health check). Each becomes the error
the gate reads as what it is (`status` in the cut's data; the SDK's own "Session terminated" for a 404).

JSON response bodies are read here in full, so a cut in the middle of one is caught too; one longer
than `[call] max_result_bytes` is dropped as it arrives and its request answered RESULT_TOO_LARGE
(the SDK's own cap applies to SSE events only, and it would read a JSON body of any size). SSE bodies
stream through whole events only; when the stream is cut, the partial event is dropped and the
same error arrives as the stream's last event (the SDK would otherwise report a bare "SSE stream
ended", indistinguishable from the whole connection closing).

Before the handshake has finished the wrapper stays out of the way (`armed` is False): connect
failures must reach the connect loop as the exceptions it classifies (refused, TLS, auth).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2

from breakwater._wire import CONNECTION_CLOSED as _CONNECTION_CLOSED
from breakwater._wire import CUT_META_KEY as CUT_KEY
from breakwater._wire import RESULT_TOO_LARGE
from breakwater.auth._unsent import NOT_SENT

#: JSON-RPC's "invalid request", the code of the SDK client's own "Session terminated".
_INVALID_REQUEST = -32600

__all__ = ["CUT_KEY", "SDK_UNREADABLE", "CutTolerantTransport", "cut_info", "posted_message", "retry_after_s", "unreadable_reply"]

#: Where the synthetic error's `data` carries what happened: {"sent": bool, "error": "ReadError"}.
#: The SDK's local code for a lost connection, which the gate already treats as a transport failure.
_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)


def cut_info(data: Any) -> dict[str, Any] | None:
    """The cut description in a JSON-RPC error's `data`, when this transport made the error."""
    if isinstance(data, dict):
        info = data.get(CUT_KEY)
        if isinstance(info, dict):
            return info
    return None


def posted_message(request: httpx2.Request) -> dict[str, Any] | None:
    """The JSON object a POST carries (a JSON-RPC message), or None (another method, a body not read or not an object)."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    return message if isinstance(message, dict) else None


def _request_id(request: httpx2.Request) -> str | int | None:
    """The JSON-RPC id of a POSTed request (None for notifications, responses and other methods)."""
    message = posted_message(request)
    if message is not None and "method" in message:
        ident = message.get("id")
        if isinstance(ident, (str, int)) and not isinstance(ident, bool):
            return ident
    return None


class CutTolerantTransport(httpx2.AsyncBaseTransport):
    """Wraps an httpx transport; see the module docstring."""

    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport,
        *,
        on_unreachable: Callable[[], None] | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self._inner = inner
        #: A JSON answer longer than this is dropped unread (`[call] max_result_bytes`); None: no bound.
        self._max_body_bytes = max_body_bytes
        #: Called when the server cannot be reached at all: the connection, not just one call, is gone.
        self._on_unreachable = on_unreachable
        #: Off until the handshake is done (see the module docstring).
        self.armed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self.armed or request.method != "POST":
            return await self._inner.handle_async_request(request)
        if NOT_SENT in request.extensions:  # the OAuth flow gave it up before sending it (`auth._unsent`)
            return _not_sent(request)
        try:
            response = await self._inner.handle_async_request(request)
            if response.status_code >= 400 and (request_id := _request_id(request)) is not None:
                return await _status_error(request, request_id, response)
            content_type = response.headers.get("content-type", "").lower()
            if content_type.startswith("application/json"):
                return await self._read_json(request, response)
            elif content_type.startswith("text/event-stream") and (request_id := _request_id(request)) is not None:
                return httpx2.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=_WholeEvents(response.stream, request_id),
                    request=request,
                    extensions=response.extensions,
                )
        except httpx2.TransportError as exc:
            sent = not isinstance(exc, _NOT_SENT)
            if not sent and self._on_unreachable is not None:
                self._on_unreachable()
            return _cut(request, _cut_text(exc, sent), sent=sent, kind=type(exc).__name__)
        return response

    async def _read_json(self, request: httpx2.Request, response: httpx2.Response) -> httpx2.Response:
        """The JSON body read in full, or, once it passes the limit, the request's RESULT_TOO_LARGE error."""
        limit = self._max_body_bytes
        try:
            if limit is None:
                await response.aread()
                return response
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    return _too_large(request, limit)
                chunks.append(chunk)
        finally:
            await response.aclose()
        return _with_body(request, response, b"".join(chunks))

    async def aclose(self) -> None:
        await self._inner.aclose()


#: The most of an error status's body read to see whether it is a JSON-RPC error (a server's page of HTML is dropped).
_ERROR_BODY_MAX = 64 * 1024
#: JSON-RPC's "method not found": at a 404 it is the server's answer about the method, not about the session.
_METHOD_NOT_FOUND = -32601
#: The statuses that refuse a request before it runs; after any other 5xx (a proxy's 502 or 504) the call may have run.
_REFUSED_BEFORE_RUN = frozenset({503})


async def _status_error(request: httpx2.Request, request_id: str | int, response: httpx2.Response) -> httpx2.Response:
    """An error status on a request, with a JSON-RPC error body for `request_id` (see the module docstring).

    The status and headers stay as they are: the OAuth flow above this transport reads a 401's challenge."""
    body = b""
    try:
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > _ERROR_BODY_MAX:
                break
    finally:
        await response.aclose()
    status = response.status_code
    code = _json_rpc_error_code(body)
    if status == 404 and "mcp-session-id" in request.headers and code != _METHOD_NOT_FOUND:
        error: dict[str, Any] = {
            "code": _INVALID_REQUEST,
            # The SDK's own words for this (the gate and the tasks resolver read them), and what they mean here.
            "message": "Session terminated: the server no longer knows this session (HTTP 404), so it did not run the request",
        }
    elif code is not None:
        return _with_body(request, response, body)  # the server's own JSON-RPC error: the SDK relays it
    else:
        what = f"HTTP {status} {response.reason_phrase}".rstrip()
        cut: dict[str, Any] = {"sent": not (status < 500 or status in _REFUSED_BEFORE_RUN), "error": what, "status": status}
        if status == 401 or (status == 403 and "insufficient_scope" in response.headers.get("www-authenticate", "")):
            # The credentials were refused, or fall short (a step-up): a reconnect signs in again, or says who must.
            cut["credentials"] = True
        error = {"code": _CONNECTION_CLOSED, "message": f"the server refused the request: {what}", "data": {CUT_KEY: cut}}
        retry_after = retry_after_s(response.headers.get("retry-after"))
        if retry_after is not None:
            error["data"]["retryAfter"] = retry_after
    content = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    return _with_body(request, response, content, as_json=True)


def _json_rpc_error_code(body: bytes) -> int | None:
    """The code of the JSON-RPC error `body` holds, or None when it holds none."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    error = message.get("error") if isinstance(message, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds (its HTTP-date form needs the server's clock, which is not trusted)."""
    try:
        seconds = float(value) if value is not None else -1.0
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _with_body(request: httpx2.Request, response: httpx2.Response, content: bytes, *, as_json: bool = False) -> httpx2.Response:
    """`response` with `content` for its (already read, decoded) body; `as_json`: a JSON body of breakwater's. Decoded
    already: the new response must not claim a content encoding or the old length."""
    dropped = {"content-encoding", "content-length", "content-type"} if as_json else {"content-encoding", "content-length"}
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in dropped]
    if as_json:
        headers.append(("content-type", "application/json"))
    status, extensions = response.status_code, response.extensions
    return httpx2.Response(status, headers=headers, content=content, request=request, extensions=extensions)


def _too_large(request: httpx2.Request, limit: int) -> httpx2.Response:
    request_id = _request_id(request)
    if request_id is None:
        return httpx2.Response(202, request=request)  # not a request: nobody waits for an answer
    error = {
        "code": RESULT_TOO_LARGE,
        "message": f"the answer was over {limit} bytes ([call] max_result_bytes = {limit}); it was dropped unread",
        "data": {"max_result_bytes": limit},
    }
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    return httpx2.Response(200, headers={"content-type": "application/json"}, content=body, request=request)


def _not_sent(request: httpx2.Request) -> httpx2.Response:
    """The answer to a request the OAuth flow gave up before sending it: its attempt was cut, and told so."""
    return _cut(request, "not sent: the call was cut while it waited for a new token", sent=False, kind="cut before sending")


def _cut(request: httpx2.Request, message: str, *, sent: bool, kind: str) -> httpx2.Response:
    """The answer that stands for a request cut (`sent`: after it left): a 502 with its JSON-RPC error, or for a
    notification or a response to the server (lost, as the cut says) a 202: nobody waits for it."""
    request_id = _request_id(request)
    if request_id is None:
        return httpx2.Response(202, request=request)
    body = _error_message(request_id, message, sent=sent, kind=kind)
    headers = {"content-type": "application/json"}
    return httpx2.Response(502, headers=headers, content=body, request=request, extensions={CUT_KEY: True})


def _cut_text(exc: Exception, sent: bool) -> str:
    where = "before the request was sent" if not sent else "after the request was sent, before its answer"
    return f"connection cut {where} ({type(exc).__name__})"


def _error_message(request_id: str | int, message: str, *, sent: bool, kind: str) -> bytes:
    """The JSON-RPC error, for `request_id`, that stands for the cut."""
    error = {"code": _CONNECTION_CLOSED, "message": message, "data": {CUT_KEY: {"sent": sent, "error": kind}}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


# An SSE event ends at a blank line, whichever line ending the server uses.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class _WholeEvents(httpx2.AsyncByteStream):
    """An SSE body passed on one whole event at a time; a cut ends it with the cut's error as an event."""

    def __init__(self, inner: Any, request_id: str | int) -> None:
        self._inner = inner
        self._request_id = request_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = b""
        try:
            async for chunk in self._inner:
                held += chunk
                ends = [m.end() for m in _EVENT_END.finditer(held)]
                if ends:
                    yield held[: ends[-1]]
                    held = held[ends[-1] :]
        except httpx2.TransportError as exc:
            # `held` is an event the cut broke off: dropped, or the SDK would fail to parse it.
            error = _error_message(self._request_id, _cut_text(exc, True), sent=True, kind=type(exc).__name__)
            yield b"event: message\r\ndata: " + error + b"\r\n\r\n"
            return
        if held:
            yield held

    async def aclose(self) -> None:
        await self._inner.aclose()


#: How the SDK's HTTP client words a reply it could not read (it answers the call with -32700 itself).
SDK_UNREADABLE = "Failed to parse JSON response: "
#: pydantic's words for text that is not JSON at all, and where it says what is wrong.
_NOT_JSON = re.compile(r"Invalid JSON: ([^\[]*?) \[")


def unreadable_reply(said: str) -> str:
    """The `reason` of a reply the SDK's HTTP client could not read, from its pydantic error, without the server's bytes."""
    if (not_json := _NOT_JSON.search(said)) is not None:
        return f"unreadable reply: it is not JSON ({not_json.group(1)})"
    return "unreadable reply: it is JSON, but no JSON-RPC message (an answer needs a result object or an error object)"
