"""Names on the wire that several stages share: breakwater's `_meta` keys and the SDK's local codes.

Each is defined once here; the modules that read or write one import it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CONNECTION_CLOSED",
    "CUT_META_KEY",
    "DEADLINE_META_KEY",
    "ENVELOPE_META_KEY",
    "OPERATION_ID_META_KEY",
    "REPLAYED_META_KEY",
    "RESULT_TOO_LARGE",
    "json_depth",
]

#: One operation id per logical call, the same on every attempt: `params._meta[...]` of a tools/call.
OPERATION_ID_META_KEY: Final = "io.breakwater/operationId"
#: Marks a result replayed from the record of an earlier call with the same operation id (it did not run again).
REPLAYED_META_KEY: Final = "io.breakwater/replayed"
#: Milliseconds left in the caller's budget, sent by a downstream client to bound its call.
DEADLINE_META_KEY: Final = "io.breakwater/deadlineMs"
#: The error envelope the model reads, in the `_meta` of an `isError` result.
ENVELOPE_META_KEY: Final = "io.breakwater/envelope"
#: Marks an HTTP request that was cut, in the error data: whether it was sent before the cut.
CUT_META_KEY: Final = "io.breakwater/cut"
#: The SDK's client-local code for "the transport ended" (never on the wire): `mcp.types.CONNECTION_CLOSED`,
#: spelled out so that reading a config (which needs this module) does not import the SDK; a stdio
#: session that attaches to a shared gateway never needs it (tests/gateway/test_shared.py pins the value).
CONNECTION_CLOSED: Final = -32000
#: Breakwater's client-local code for "the answer was over `[call] max_result_bytes` and dropped
#: unread" (never on the wire): the stdio transport answers the waiting request with it.
RESULT_TOO_LARGE: Final = -32090


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
