"""The hot path's JSON codec: pydantic-core's, with the stdlib's (`breakwater._wire`) for whatever it will not do.

Why. Each proxied call codes four JSON texts in the gateway (the request it reads, the line it writes
upstream, the answer it reads back, the answer it writes). `pydantic_core.to_json` writes a call's
answer in 1.2 µs where `json_line` takes 5.6 µs, and `from_json` reads one in 2.2 µs where the
stdlib takes 4.4-4.9 µs (timeit, issue 16). The SDK already depends on pydantic-core; this module
is imported only where the SDK is (an attaching `serve` never loads it: 37 ms of imports).

What stays the stdlib's. pydantic-core refuses some texts the stdlib reads (a lone surrogate escape,
a byte-order mark, nesting deeper than its limit) and some values the stdlib writes (a lone
surrogate); those take the stdlib's way: the same values read, the same errors raised (a tested
property, tests/test_codec.py, holds the two equal on generated JSON). One difference: pydantic-core
writes a few values the stdlib refuses (a datetime, bytes, a set: a library caller's arguments), as
the SDK's own path writes them, which is where such a call went when the stdlib refused it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from breakwater._wire import json_line

__all__ = ["dumps_answer", "dumps_line", "loads"]


def dumps_line(message: Any, *, allow_nan: bool = True) -> bytes:
    """`_wire.json_line(message, allow_nan=...)`: compact UTF-8 JSON and a newline, the same JSON value."""
    try:
        data = to_json(message, serialize_unknown=False)
    except (PydanticSerializationError, RecursionError):
        return json_line(message, allow_nan=allow_nan)  # the stdlib's way: its escapes, or its error
    if not allow_nan and (b"NaN" in data or b"Infinity" in data):
        return json_line(message, allow_nan=False)  # raises if a number is not finite (the mark may be in a string)
    return data + b"\n"


def dumps_answer(request_id: Any, result: dict[str, Any]) -> bytes | None:
    """The SDK's JSON for a call's answer, without its model; None where pydantic-core will not write `result`.

    `JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result).model_dump_json(by_alias=True,
    exclude_unset=True)`, byte for byte (a tested property, tests/test_codec.py): the model's
    validation of `result` (a `dict[str, Any]`, walked whole) changes nothing a model dump gave, and its
    serializer is this one, with a non-finite float written `null`. On None the caller takes the
    model's way, which raises the SDK's own error for such a value.
    """
    try:
        return to_json({"jsonrpc": "2.0", "id": request_id, "result": result}, inf_nan_mode="null", serialize_unknown=False)
    except (PydanticSerializationError, RecursionError):
        return None


def loads(data: bytes) -> Any:
    """`json.loads(data)`, the same values (`NaN` and `Infinity` read as floats)."""
    try:
        return from_json(data)
    except ValueError:
        return json.loads(data)  # the stdlib's verdict: its value (a surrogate escape, a BOM) or its error
