"""The hot path's JSON codec (`breakwater._codec`) reads and writes what the stdlib's does.

pydantic-core codes a call's JSON in a third of the stdlib's time; where it would differ (a lone
surrogate, a byte-order mark, deep nesting, a non-finite number where the wire refuses one) the
stdlib decides. These properties hold the two equal on generated JSON, the odd corners included.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp_types import JSONRPCResponse

from breakwater._codec import dumps_answer, dumps_line, loads
from breakwater._wire import json_line

_TEXT = st.text(max_size=6) | st.sampled_from(["\ud800", "\udfff x", "é", "\x00", '"\\', "\u2028"])
_NUMBER = st.integers(min_value=-(2**80), max_value=2**80) | st.floats()
_JSON = st.recursive(
    st.none() | st.booleans() | _NUMBER | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=25,
)


def _same(a: Any, b: Any) -> bool:
    """JSON equality, NaN equal to itself, and `1 == 1.0` not enough (the types must match too).

    Iterative: from Python 3.12 on the stdlib reads 5,000 nested lists (its C parser no longer stops
    at the interpreter's recursion limit), and a recursive comparison of what it read would not.
    """
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            pairs.extend((x[key], y[key]) for key in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def _outcome(fn: Any, *args: Any, **kw: Any) -> tuple[str, Any]:
    """("value", what `fn` returned) or ("error", None) for the errors every caller of the codec catches."""
    try:
        return "value", fn(*args, **kw)
    except (TypeError, ValueError, RecursionError):
        return "error", None


@settings(max_examples=400, deadline=None)
@given(value=_JSON, allow_nan=st.booleans())
def test_a_line_written_holds_the_same_json_and_fails_where_the_stdlibs_does(value: Any, allow_nan: bool) -> None:
    ours, theirs = _outcome(dumps_line, value, allow_nan=allow_nan), _outcome(json_line, value, allow_nan=allow_nan)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "value":
        assert ours[1].endswith(b"\n") and b"\n" not in ours[1][:-1]
        assert _same(json.loads(ours[1]), json.loads(theirs[1]))


@settings(max_examples=400, deadline=None)
@given(value=_JSON, ascii_only=st.booleans(), bom=st.booleans())
def test_a_text_read_gives_the_stdlibs_values_and_errors(value: Any, ascii_only: bool, bom: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)  # NaN and Infinity spelled as the lenient stdlib spells them
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass")
    for ours_fn, theirs_fn in ((loads, json.loads),):
        ours, theirs = _outcome(ours_fn, data), _outcome(theirs_fn, data)
        assert ours[0] == theirs[0], (ours_fn, data, ours, theirs)
        if ours[0] == "value":
            assert _same(ours[1], theirs[1]), (ours_fn, data)


@pytest.mark.parametrize(
    "data",
    [b"[" * 5000 + b"]" * 5000, b'{"a":1,"a":2}', b"1e400", b"-0", b"-0.0", b"\xff", b'"\\ud800"', b"[1,]", b"NaN", b" 7 "],
)
def test_the_odd_corners_read_as_the_stdlib_reads_them(data: bytes) -> None:
    for ours_fn, theirs_fn in ((loads, json.loads),):
        ours, theirs = _outcome(ours_fn, data), _outcome(theirs_fn, data)
        assert ours[0] == theirs[0] and (ours[0] == "error" or _same(ours[1], theirs[1])), (ours_fn, data, ours, theirs)


@settings(max_examples=400, deadline=None)
@given(
    request_id=st.integers(min_value=-(2**53), max_value=2**53) | st.text(max_size=6),
    result=st.dictionaries(_TEXT, _JSON, max_size=5),
)
def test_a_calls_answer_is_written_byte_for_byte_as_the_sdks_model_writes_it(request_id: Any, result: dict[str, Any]) -> None:
    # The routed HTTP answer (`reply_json`) skips the SDK's envelope model; where pydantic-core will not write a
    # value (a lone surrogate, which the model's own serializer refuses or, in a key, replaces) it says so, and the
    # caller takes the model's way.
    fast = dumps_answer(request_id, result)
    if fast is None:
        assert _surrogate(result)
        return
    sdk = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result).model_dump_json(by_alias=True, exclude_unset=True)
    assert fast == sdk.encode()


def _surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_surrogate(k) or _surrogate(v) for k, v in value.items())
    return isinstance(value, list) and any(_surrogate(v) for v in value)


def test_json_nested_past_the_parsers_recursion_is_a_value_error_not_a_recursion_error() -> None:
    """Callers catch what a bad document raises (ValueError): a RecursionError went past them as a traceback."""
    from breakwater._wire import strict_json

    for text in ("[" * 100_000 + "]" * 100_000, b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(ValueError, match="nested deeper than 256 levels"):
            strict_json(text)
