"""What a malformed downstream message gets: the JSON-RPC error the spec names, with what was wrong.

The SDK's framing drops what it cannot validate (a batch, a missing or `"1.0"` `jsonrpc`, a float
id, invalid UTF-8, deep nesting) without a reply, so a client waits forever; and it answers
invalid parameters and requests sent before `initialize` with a bare `-32602 "Invalid request
parameters"`. Here a line that fails the SDK's fast validation is diagnosed once, on the slow path
only: parse errors are -32700, malformed requests -32600, bad parameters -32602 (unknown methods
stay the SDK's -32601), each with a message that says what to fix; the session goes on. A
malformed notification (no id) is not answered, as JSON-RPC says, but logged. May import the
core leaves and `config` only.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import mcp_types as types
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from pydantic import ValidationError

from breakwater._wire import DEADLINE_META_KEY, MAX_JSON_DEPTH, json_depth, non_finite_constant, strict_json
from breakwater.errors import InvalidArgumentsError

__all__ = [
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_DEPTH",
    "PARSE_ERROR",
    "bad_id",
    "deadline_seconds",
    "diagnose",
    "error_line",
    "explain_invalid_params",
    "explain_params_errors",
    "invalid_deadline",
    "lenient_id",
    "limit_repeats",
    "not_json_message",
    "screen_non_finite",
]

logger = logging.getLogger(__name__)


class RepeatLimit(logging.Filter):
    """One line per kind of record (its format string), then one at the 10th, 100th, ... with the count so far.

    A client that sends the same malformed message in a loop wrote a warning for each (445 identical lines in a
    few seconds): what it did is still said, and its count, without filling a disk.
    """

    #: Past this many kinds, further ones are counted by their format string alone (a client varying them).
    MAX_KINDS = 1024

    def __init__(self, *, by_message: bool = False) -> None:
        super().__init__()
        #: A kind is the record's format string, or (`by_message`) the whole line: each Host refused is its own kind.
        self._by_message = by_message
        self._counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not isinstance(record.msg, str) or not isinstance(record.args, tuple):
            return True
        kind = record.msg
        if self._by_message and len(self._counts) < self.MAX_KINDS:
            kind = record.getMessage()
        count = self._counts.get(kind, 0) + 1
        self._counts[kind] = count
        if count == 1:
            return True
        if str(count).strip("0") != "1":  # not a power of ten
            return False
        record.msg += " (%d of these so far; logged at the 1st, 10th, 100th...)"
        record.args = (*record.args, count)
        return True


def limit_repeats(target: logging.Logger, *, by_message: bool = False) -> None:
    """Give `target` a `RepeatLimit` (once)."""
    if not any(isinstance(f, RepeatLimit) for f in target.filters):
        target.addFilter(RepeatLimit(by_message=by_message))


limit_repeats(logger)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

#: Deeper nesting than this is refused (no MCP message comes close; Python's parser would overflow).
MAX_DEPTH = MAX_JSON_DEPTH


def error_line(request_id: Any, code: int, message: str) -> bytes:
    """One JSON-RPC error response, framed for stdio."""
    wire = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(wire, separators=(",", ":")).encode() + b"\n"


def _valid_id(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def diagnose(line: bytes, error: Exception | None = None, *, notifications: bool = False) -> tuple[Any, int, str] | None:
    """Why `line` is not a valid JSON-RPC message: `(id to answer, code, message)`; None if it needs no answer.

    Called only after the SDK's validation failed (`error`), so its cost is off the normal path.
    A malformed notification needs no answer on stdio; over HTTP (`notifications`) every POST gets one.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            None,
            PARSE_ERROR,
            f"Parse error: the message is not valid UTF-8 (byte 0x{line[exc.start]:02x} at offset {exc.start})",
        )
    if not text.strip():
        return None  # a blank line between messages: nothing to answer
    if json_depth(text) > MAX_DEPTH:
        return None, INVALID_REQUEST, f"Invalid request: JSON nested deeper than {MAX_DEPTH} levels"
    try:
        data = strict_json(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        if (constant := non_finite_constant(line)) is not None:
            return lenient_id(line), PARSE_ERROR, not_json_message(constant)
        where = f" at line {exc.lineno}, column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else ""
        return None, PARSE_ERROR, f"Parse error: invalid JSON{where}"
    if isinstance(data, list):
        per = "POST" if notifications else "line"
        return None, INVALID_REQUEST, f"Invalid request: JSON-RPC batches are not supported by MCP; send one message per {per}"
    if not isinstance(data, dict):
        return None, INVALID_REQUEST, f"Invalid request: expected a JSON object, got {type(data).__name__}"
    has_id = "id" in data
    request_id = data.get("id")
    if has_id and not _valid_id(request_id):
        return None, INVALID_REQUEST, f"Invalid request: id must be a string or an integer, got {json.dumps(request_id)[:40]}"
    method = data.get("method")
    if not has_id and isinstance(method, str) and not notifications:
        logger.warning("dropped a malformed notification %r: %s", method[:80], _short(error))
        return None
    if data.get("jsonrpc") != "2.0":
        got = json.dumps(data["jsonrpc"])[:20] if "jsonrpc" in data else "nothing"
        return request_id, INVALID_REQUEST, f'Invalid request: "jsonrpc" must be "2.0", got {got}'
    if "method" in data and not isinstance(method, str):
        return request_id, INVALID_REQUEST, "Invalid request: method must be a string"
    if method is None:
        if "result" in data or "error" in data:
            what = _response_problem(data) or _short(error)
            if notifications:  # over HTTP the POST is answered: the client learns what is wrong with its answer
                return (request_id if has_id else None), INVALID_REQUEST, f"Invalid request: malformed response: {what}"
            logger.warning("dropped a malformed response (id %r): %s", request_id, what)
            return None
        return request_id, INVALID_REQUEST, "Invalid request: no method"
    params = data.get("params")
    if "params" in data and not isinstance(params, dict):
        return request_id, INVALID_PARAMS, f"Invalid params: params must be an object, got {type(params).__name__}"
    return request_id, INVALID_REQUEST, f"Invalid request: {_short(error)}"


def _response_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a message shaped as a response (`result` or `error`, no `method`); None if nothing plain is."""
    if "result" in data and "error" in data:
        return "it has both result and error; a response has one of them"
    if "id" not in data:
        return "no id; a response carries the id of the request it answers"
    if "result" in data:
        result = data["result"]
        return None if isinstance(result, dict) else f"result must be an object, got {_json_type(result)}"
    failure = data["error"]
    if not isinstance(failure, dict):
        return f"error must be an object with a code and a message, got {_json_type(failure)}"
    code, message = failure.get("code"), failure.get("message")
    if not isinstance(code, int) or isinstance(code, bool):
        return f"error.code must be an integer, got {_json_type(code) if 'code' in failure else 'nothing'}"
    if not isinstance(message, str):
        return f"error.message must be a string, got {_json_type(message) if 'message' in failure else 'nothing'}"
    return None


def _json_type(value: Any) -> str:
    """The JSON name of `value`'s type (what a client's author reads), not Python's."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def lenient_id(data: bytes) -> Any:
    """The id of the request in `data` as a lenient parser reads it (one holding NaN), so its client stops waiting;
    None if it has no valid one."""
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return None
    request_id = message.get("id") if isinstance(message, dict) and "method" in message else None
    return request_id if _valid_id(request_id) else None


def not_json_message(constant: str) -> str:
    """The parse error for a message that holds `NaN`, `Infinity` or `-Infinity`."""
    return f"Parse error: {constant} is not JSON (JSON has no NaN or Infinity); send a number, null or a string instead"


def screen_non_finite(line: bytes, message: Any) -> tuple[Any, tuple[Any, int, str] | None]:
    """`(message to pass on, or None; error to answer, or None)` for a line the SDK's lenient parser accepted as
    `message`. Without `NaN`, `Infinity` or `-Infinity` in it (the normal case: two substring scans), the message
    as it is. With one: a request is answered with the parse error and its own id (the client stops waiting); a
    response, an answer a server waits for (to a sampling or elicitation request), is passed on with null in
    their place, as an upstream's answer is; a notification is dropped (JSON-RPC answers none). Both are logged.
    """
    constant = non_finite_constant(line)
    if constant is None:
        return message, None
    request_id = getattr(message, "id", None)
    if getattr(message, "method", None) is not None:
        if request_id is not None:
            return None, (request_id, PARSE_ERROR, not_json_message(constant))
        logger.warning("dropped a notification holding %s, which is not JSON", constant)
        return None, None
    try:  # pydantic's JSON output writes null for them
        cleaned = types.jsonrpc_message_adapter.validate_json(
            message.model_dump_json(by_alias=True, exclude_unset=True), by_name=False
        )
    except ValidationError:
        cleaned = None
    outcome = "passed on with null in their place" if cleaned is not None else "dropped: with null it is no valid answer"
    logger.warning("the client's answer (id %r) holds %s, which is not JSON; %s", request_id, constant, outcome)
    return cleaned, None


def bad_id(line: bytes) -> tuple[Any, int, str] | None:
    """For a line the SDK read as a notification: an error if it carries an `id` that is not a string or integer.

    The SDK ignores such an id (a float, true, null) and treats the request as a notification, so
    the client would wait forever for its answer.
    """
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(data, dict) and "id" in data and not _valid_id(data["id"]):
        return None, INVALID_REQUEST, f"Invalid request: id must be a string or an integer, got {json.dumps(data['id'])[:40]}"
    return None


def _short(error: Exception | None) -> str:
    if isinstance(error, ValidationError):
        return explain_validation(error)
    return str(error).splitlines()[0][:200] if error is not None else "malformed message"


def explain_validation(error: ValidationError) -> str:
    """The first few problems of a pydantic error, as `where: what` for a person."""
    parts = []
    for item in error.errors()[:3]:
        where = ".".join(str(p) for p in item.get("loc", ()))
        parts.append(f"{where}: {item.get('msg', 'invalid')}" if where else str(item.get("msg", "invalid")))
    more = error.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def explain_invalid_params(exc: BaseException, method: str, initialized: bool) -> MCPError | None:
    """A detailed -32602 for what the SDK would answer with a bare "Invalid request parameters"; None to leave it."""
    if isinstance(exc, ValidationError):
        return MCPError(code=INVALID_PARAMS, message=f"Invalid params for {method}: {explain_validation(exc)}")
    if isinstance(exc, MCPError) and exc.error.code == INVALID_PARAMS and exc.error.message == "Invalid request parameters":
        if not initialized:
            return MCPError(code=INVALID_PARAMS, message=f"{method} was sent before initialize: send initialize first")
        return MCPError(code=INVALID_PARAMS, message=f"Invalid params for {method}")
    return None


async def explain_params_errors(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Server middleware: the SDK's bare -32602 becomes one that says what was wrong (or that initialize comes first)."""
    try:
        return await call_next(ctx)
    except (ValidationError, MCPError) as exc:
        better = explain_invalid_params(exc, ctx.method, initialized=not isinstance(exc, MCPError))
        if better is None:
            raise
        raise better from None


# It only rewrites errors: the lanes' kernel keeps it around the handler (`_fast_call.PASSIVE_FOR_CALLS`).
explain_params_errors.breakwater_for_calls = "keep"  # type: ignore[attr-defined]


#: The longest deadline a caller may ask for (a day); anything longer is surely a unit mistake.
MAX_DEADLINE_MS = 86_400_000


def invalid_deadline(value: Any, *, server: str, tool: str) -> InvalidArgumentsError | None:
    """Why a `_meta` deadline (`io.breakwater/deadlineMs`) cannot be used, as the call's error; None if it can (or is unset)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= MAX_DEADLINE_MS:
        return None
    return InvalidArgumentsError(
        f"_meta {DEADLINE_META_KEY} must be a number of milliseconds from 0 to {MAX_DEADLINE_MS}, got {json.dumps(value)[:40]}.",
        server=server,
        tool=tool,
        detail={"reason": "invalid_deadline"},
    )


def deadline_seconds(value: Any) -> float:
    """A deadline `invalid_deadline` accepted, in seconds."""
    return float(value) / 1000
