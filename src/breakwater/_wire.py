"""Names on the wire that several stages share: breakwater's `_meta` keys and the SDK's local codes.

Each is defined once here; the modules that read or write one import it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

__all__ = [
    "CONNECTION_CLOSED",
    "CUT_META_KEY",
    "DEADLINE_META_KEY",
    "ENVELOPE_META_KEY",
    "ERROR_META_KEY",
    "MAX_JSON_DEPTH",
    "MAX_OPERATION_ID_LEN",
    "OPERATION_ID_META_KEY",
    "RELATED_TASK_META_KEY",
    "REPLAYED_META_KEY",
    "RESULT_TOO_LARGE",
    "has_non_finite",
    "json_depth",
    "json_kind",
    "json_line",
    "non_finite_constant",
    "non_finite_path",
    "operation_id_problem",
    "strict_json",
    "with_nulls_for_non_finite",
]

#: One operation id per logical call, the same on every attempt: `params._meta[...]` of a tools/call.
OPERATION_ID_META_KEY: Final = "io.breakwater/operationId"
#: The longest operation id: the operation stores key by it (`breakwater.idempotency`).
MAX_OPERATION_ID_LEN: Final = 255


def operation_id_problem(value: object) -> str | None:
    """What is wrong with a caller's own operation id, or None. One that was not a non-empty string was replaced by a
    new id of breakwater's, silently: each retry of an agent's then ran again, under a new id."""
    if isinstance(value, str) and value and len(value) <= MAX_OPERATION_ID_LEN:
        return None
    return f"an operation id must be a non-empty string of at most {MAX_OPERATION_ID_LEN} characters, got {value!r:.40}"


#: Marks a result replayed from the record of an earlier call with the same operation id (it did not run again).
REPLAYED_META_KEY: Final = "io.breakwater/replayed"
#: Milliseconds left in the caller's budget, sent by a downstream client to bound its call.
DEADLINE_META_KEY: Final = "io.breakwater/deadlineMs"
#: The error envelope the model reads, in the `_meta` of an `isError` result.
ENVELOPE_META_KEY: Final = "io.breakwater/envelope"
#: Where the gateway puts the error envelope of a tool that declares an output schema (`gateway._passthrough.fitted`).
ERROR_META_KEY: Final = "io.breakwater/error"
#: Where a 2025-11-25 task's own messages, and the result `tasks/result` gives, name the task.
RELATED_TASK_META_KEY: Final = "io.modelcontextprotocol/related-task"
#: Marks an HTTP request that was cut, in the error data: whether it was sent before the cut.
CUT_META_KEY: Final = "io.breakwater/cut"
#: The SDK's client-local code for "the transport ended" (never on the wire): `mcp.types.CONNECTION_CLOSED`,
#: spelled out so that reading a config (which needs this module) does not import the SDK; a stdio
#: session that attaches to a shared gateway never needs it (tests/gateway/test_shared.py pins the value).
CONNECTION_CLOSED: Final = -32000
#: Breakwater's client-local code for "the answer was over `[call] max_result_bytes` and dropped
#: unread" (never on the wire): the stdio transport answers the waiting request with it.
RESULT_TOO_LARGE: Final = -32090
#: What a stdio call in flight is told when the server itself closes its stdout (the SDK's "Connection closed" said
#: neither who closed it nor that the process was going); the gate does not repeat such a call (`gate._classify`).
STDOUT_CLOSED: Final = "the server closed its stdout during the call (it exited, or crashed)"
#: The same told when the server's stdin broke under a write of the call's (it read the call and exited before the
#: write returned): which of its pipes the gateway saw end first is a race, the same exit either way.
STDIN_CLOSED: Final = "the server closed its stdin during the call (it exited, or crashed)"


def json_kind(value: Any) -> str:
    """What JSON type `value` is, for an error (never the value itself: it may be a secret)."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    return {list: "a list", dict: "an object", str: "a string", type(None): "null"}.get(type(value), type(value).__name__)


#: Deeper JSON nesting than this is refused (no MCP message or tool argument comes close; Python's parser would overflow).
MAX_JSON_DEPTH = 256


def json_depth(text: str) -> int:
    """How deeply the JSON in `text` nests (arrays and objects), counted without parsing it, so too deep a
    document is refused before the parser's recursion meets it."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


class _NonFinite(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not a JSON value")
        self.name = name


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


# Built once: `json.dumps` and `json.loads` with any option build a new encoder or decoder (and its
# scanner) on every call, which was half of their cost on the hot path's four codings per call (issue 16).
_LINE = {nan: json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=nan) for nan in (True, False)}
_LINE_ASCII = {nan: json.JSONEncoder(separators=(",", ":"), allow_nan=nan) for nan in (True, False)}
_STRICT = json.JSONDecoder(parse_constant=_refuse_constant)


def json_line(message: Any, *, allow_nan: bool = True) -> bytes:
    """`message` as one line of the stdio wire: compact UTF-8 JSON and a newline.

    A lone surrogate (from an upstream's escaped JSON) cannot be UTF-8: the line is then written with
    every non-ASCII character escaped rather than failing. Anything `json.dumps` refuses (TypeError,
    or a NaN with `allow_nan=False`) is raised.
    """
    text = _LINE[allow_nan].encode(message)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return _LINE_ASCII[allow_nan].encode(message).encode() + b"\n"


def strict_json(text: str | bytes) -> Any:
    """`json.loads` as RFC 8259 reads JSON: `NaN`, `Infinity` and `-Infinity` are a ValueError, not floats.

    Nesting deeper than the parser's recursion can take is a ValueError too (it was a RecursionError,
    which callers that catch what a bad document raises let through as a traceback).
    """
    try:
        if isinstance(text, bytes):
            return _STRICT.decode(text.decode(json.detect_encoding(text), "surrogatepass"))  # as `json.loads` reads bytes
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None


def non_finite_constant(data: bytes) -> str | None:
    """The non-finite constant (`NaN`, `Infinity`, `-Infinity`) that makes `data` JSON only to a lenient parser; None if
    there is none (or `data` is no JSON at all, which the caller's own parser reports).

    For a message the lenient parser already accepted: only when a mark occurs (it may sit inside a string)
    is the text parsed a second time, strictly.
    """
    if b"NaN" not in data and b"Infinity" not in data:  # every spelling holds one: two scans, the normal cost
        return None
    try:
        strict_json(data)
    except _NonFinite as exc:
        return exc.name
    except (ValueError, RecursionError):
        return None
    return None


def has_non_finite(value: Any) -> bool:
    """Whether parsed JSON `value` holds a NaN or infinite float anywhere (`non_finite_path` says where)."""
    # The walk every call pays (arguments, results): no paths built, no generator per container, and the
    # common leaves (strings, ints, bools, None) never pushed.
    stack = [value]
    isfinite = math.isfinite
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            children: Any = item.values()
        elif kind is list:
            children = item
        elif isinstance(item, float):
            if not isfinite(item):
                return True
            continue
        elif isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        for child in children:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is float:
                if not isfinite(child):
                    return True
            else:
                stack.append(child)
    return False


def non_finite_path(value: Any, root: str = "") -> str | None:
    """Where the first NaN or infinite float sits in parsed JSON `value` (`a.b[2]` under `root`); None if nowhere."""
    if not has_non_finite(value):
        return None
    stack: list[tuple[str, Any]] = [(root, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return path or "(the value)"
        elif isinstance(item, dict):
            stack.extend((f"{path}.{key}" if path else str(key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def with_nulls_for_non_finite(value: Any) -> Any:
    """`value` with each NaN or infinite float made None: what `JSON.stringify` and pydantic's JSON output make of them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: with_nulls_for_non_finite(child) for key, child in value.items()}
    if isinstance(value, list):
        return [with_nulls_for_non_finite(child) for child in value]
    return value
