"""Malformed JSON-RPC over HTTP: the same answer stdio gives (`_frames.py`), with the spec's HTTP status.

The SDK's streamable HTTP transport answers a body it cannot validate with `-32602 "Validation
error: 4 validation errors for union[...]"` (a pydantic dump, for a batch, a missing or `"1.0"`
`jsonrpc`, string params, a non-string method, a malformed response: `{"id": 5, "result": 5}`), accepts a
request with a float, null or boolean id as a notification (202, so the client waits forever), and answers an
oversized body with a plain text 413. This ASGI middleware in front of the MCP endpoint leaves every good request
alone: it hands the SDK the body it read (below) and looks at the SDK's answer. When that
answer is one of the above, the body is diagnosed by the stdio classifier and the answer replaced
with its JSON-RPC error (400, or 413 for the size), with the id when the request had one (a malformed response:
-32600 "malformed response: <what>", with its id when that is a valid one); a missing or non-JSON Content-Type,
which the SDK refused with a plain-text 400, gets the transport's own 415 for `application/jsonx`, as a JSON-RPC
-32600. Its answers carry the request's `Mcp-Session-Id`, as the session's other errors do. The
session is not touched, so it goes on.

One malformed body the SDK does not refuse at all: both its parsers (pydantic's and the standard
library's) take `NaN`, `Infinity` and `-Infinity`, which JSON does not have. So the body is read
before the SDK sees it (the SDK reads it whole anyway, so nothing is held longer), and one that
holds such a constant is answered here with the parse error (-32700, HTTP 400) and never reaches
the session, unless it is the client's answer to a server's request (a sampling or elicitation
result, which a call waits for): that one is passed on with null in their place, as stdio does.
Other bodies are replayed to the SDK unchanged. A body over the size limit is passed
on at the limit, for the SDK to refuse; one whose Content-Length already says so is refused here
at once (413), unread: a client may declare a terabyte and send nothing. The connection stays open
(not `Connection: close`): a client still uploading would otherwise get a reset instead of the 413;
uvicorn's parser drops the rest of the body as it comes, and the connection ends at the keep-alive
timeout or, for a body still coming, at the read timeout (`_known_heads.BODY_READ_TIMEOUT_S`). A
client that goes away before its body is whole gets no answer and leaves no error behind (there is
nobody to answer); how long a body may take to arrive is the server protocol's bound
(`_known_heads.BODY_READ_TIMEOUT_S`). May import `_frames.py` and the core leaves only.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from breakwater._wire import non_finite_constant, with_nulls_for_non_finite
from breakwater.gateway._frames import (
    INVALID_REQUEST,
    PARSE_ERROR,
    bad_id,
    diagnose,
    lenient_id,
    limit_repeats,
    not_json_message,
)

__all__ = ["FrameErrors"]

logger = logging.getLogger(__name__)
limit_repeats(logger)  # one line per kind of bad message, then at the 10th, 100th...

# The SDK's own framing refusals (mcp/server/streamable_http.py): only these are re-explained.
_SDK_FRAMING_PREFIXES = ("Validation error", "Parse error")
_REWRITTEN = frozenset({202, 400, 413})
#: The transport's own words for a Content-Type it does not take (415); its security check said 400 "Invalid
#: Content-Type header" for a missing or non-JSON one, the transport 415 for `application/jsonx`: one answer for both.
_UNSUPPORTED_MEDIA = "Unsupported Media Type: Content-Type must be application/json"


class FrameErrors:
    """ASGI middleware: the SDK's terse or missing answers to malformed POSTs become the spec's JSON-RPC errors."""

    def __init__(self, app: Any, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        session = _session_header(scope["headers"])
        if _declared_over(scope["headers"], self.max_body_bytes):
            await self._refuse(send, self._too_large(), status=413, session=session)
            return
        chunks: list[bytes] = []
        held: dict[str, Any] = {}
        early = await self._read_body(receive, chunks)
        if early is not None and early.get("type") == "http.disconnect":
            logger.debug("the client went away before its request body was whole; nothing to answer")
            return
        if early is None and (constant := non_finite_constant(b"".join(chunks))) is not None:
            cleaned = _answer_with_nulls(b"".join(chunks))
            if cleaned is None:
                error = _error(lenient_id(b"".join(chunks)), PARSE_ERROR, not_json_message(constant))
                await self._refuse(send, error, session=session)
                return
            logger.warning("the client's answer holds %s, which is not JSON; passed on with null in its place", constant)
            chunks[:] = [cleaned]
        replay = [{"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks]
        if early is not None:
            replay.append(early)
        elif replay:
            replay[-1]["more_body"] = False
        else:
            replay.append({"type": "http.request", "body": b"", "more_body": False})

        async def receive_and_keep() -> Any:
            if replay:
                return replay.pop(0)
            message = await receive()
            if message.get("type") == "http.request" and message.get("body"):
                chunks.append(message["body"])
            return message

        async def send_or_rewrite(message: Any) -> None:
            kind = message.get("type")
            if kind == "http.response.start" and message.get("status") in _REWRITTEN:
                held["start"] = message
                held["body"] = []
                return
            if kind == "http.response.body" and "start" in held:
                held["body"].append(message.get("body", b""))
                if message.get("more_body"):
                    return
                start, body = held.pop("start"), b"".join(held.pop("body"))
                better = self._better(start["status"], body, chunks)
                if better is None:
                    await send(start)
                    await send({"type": "http.response.body", "body": body})
                    return
                status, payload = better
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
                headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
                if session is not None and not any(k.lower() == b"mcp-session-id" for k, _ in headers):
                    headers.append((b"mcp-session-id", session))  # as the session's other errors carry it
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
                return
            await send(message)

        await self.app(scope, receive_and_keep, send_or_rewrite)

    async def _read_body(self, receive: Any, chunks: list[bytes]) -> Any:
        """Read the body into `chunks`: None once it is whole; else the message that stopped the reading (a
        disconnect, or the chunk that crossed the size limit, which is kept for the SDK to refuse)."""
        size = 0
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                return message
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                return message
            if body:
                chunks.append(body)
            if not message.get("more_body"):
                return None

    @staticmethod
    async def _refuse(send: Any, payload: bytes, *, status: int = 400, session: bytes | None = None) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        if session is not None:
            headers.append((b"mcp-session-id", session))  # as the session's other errors carry it
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _too_large(self) -> bytes:
        message = f"Invalid request: the body is over the {self.max_body_bytes}-byte limit; send a smaller message"
        return _error(None, INVALID_REQUEST, message)

    def _better(self, status: int, answer: bytes, chunks: list[bytes]) -> tuple[int, bytes] | None:
        """The replacement (status, body) for the SDK's answer, or None to keep it."""
        if status == 413:
            return 413, self._too_large()
        body = b"".join(chunks)
        if status == 202:  # accepted as a notification: wrong if it carried an id the SDK could not read
            found = bad_id(body) if b'"id"' in body else None
        else:
            sdk_message = _sdk_framing_error(answer)
            if sdk_message is None:
                return None
            if sdk_message == "Invalid Content-Type header":  # the SDK's 400 for a missing or non-JSON type
                return 415, _error(None, INVALID_REQUEST, _UNSUPPORTED_MEDIA)  # its 415 for `application/jsonx`
            if not sdk_message.startswith(_SDK_FRAMING_PREFIXES):  # a refusal before the body was read (headers)
                return 400, _error(None, INVALID_REQUEST, f"Invalid request: {sdk_message}")
            found = diagnose(body, ValueError(sdk_message), notifications=True)
        if found is None:
            return None
        request_id, code, message = found
        return 400, _error(request_id, code, message)


def _session_header(headers: Any) -> bytes | None:
    """The request's `Mcp-Session-Id`, if it carries one."""
    for name, value in headers:
        if name == b"mcp-session-id":
            return bytes(value)
    return None


def _declared_over(headers: Any, limit: int) -> bool:
    """Whether the request's Content-Length announces a body over `limit`."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


def _sdk_framing_error(answer: bytes) -> str | None:
    """The message of the SDK's refusal to re-explain: a framing error, or a plain-text one; None to keep the answer."""
    try:
        data = json.loads(answer)
    except ValueError:
        text = answer.decode("utf-8", "replace").strip()
        return text[:200] if text else None  # e.g. "Invalid Content-Type header": not JSON-RPC at all
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message.startswith(_SDK_FRAMING_PREFIXES) else None


def _answer_with_nulls(body: bytes) -> bytes | None:
    """A posted response (the client's answer to a server's request) with null for each NaN and infinity; None if
    `body` is no response (a request or notification holding one is refused)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or "method" in data or "id" not in data or not ("result" in data or "error" in data):
        return None
    return json.dumps(with_nulls_for_non_finite(data)).encode()


def _error(request_id: Any, code: int, message: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}).encode()
