"""The error envelope: one class per code, what the model reads, and the way back to typed errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent

from breakwater.errors import (
    CODE_TO_ERROR,
    BreakwaterError,
    BudgetExhaustedError,
    CallError,
    CallTimeoutError,
    CircuitOpenError,
    ErrorCode,
    OutcomeUnknownError,
    OverloadedError,
    ServerCircuitOpenError,
    ServerUnavailableError,
    ToolError,
    _circuit_advice,
    _fmt_seconds,
    refusal_error,
)
from breakwater.gate._envelope import ENVELOPE_META_KEY, error_from_result, error_result, error_text, render_error_table
from breakwater.gate._envelope_data import _round_s, envelope

ENVELOPE = {
    "ok",
    "code",
    "retryable",
    "retry_after_s",
    "attempt",
    "max_attempts",
    "server",
    "tool",
    "operation_id",
    "message",
}


def all_leaves(cls: type[CallError] = CallError) -> list[type[CallError]]:
    """The classes under `cls` with no subclasses: the ones that carry a code (the phase groups do not)."""
    found: list[type[CallError]] = []
    for sub in cls.__subclasses__():
        below = all_leaves(sub)
        found.extend(below or [sub])
    return found


def test_one_class_per_code_and_one_code_per_class() -> None:
    leaves = all_leaves()
    assert set(CODE_TO_ERROR) == set(ErrorCode)
    # The thirteen codes of the call gate, plus the gateway's TOOL_CHANGED (definition drift), CLIENT_CANNOT_ANSWER
    # and RESULT_TOO_LARGE (the transport's result-size limit).
    assert {c.value for c in ErrorCode} == {
        "TIMEOUT", "OUTCOME_UNKNOWN", "CIRCUIT_OPEN", "SERVER_CIRCUIT_OPEN", "OVERLOADED", "BUDGET_EXHAUSTED",
        "SERVER_CONNECTING", "SERVER_UNAVAILABLE", "UNKNOWN_TOOL", "UPSTREAM_ERROR", "TOOL_ERROR", "CANCELLED",
        "INVALID_ARGUMENTS", "TOOL_CHANGED", "CLIENT_CANNOT_ANSWER", "RESULT_TOO_LARGE",
    }  # fmt: skip
    assert sorted(c.__name__ for c in CODE_TO_ERROR.values()) == sorted(c.__name__ for c in leaves)
    assert len({c.code for c in leaves}) == len(leaves)
    for code, cls in CODE_TO_ERROR.items():
        assert cls.code is code
        assert issubclass(cls, CallError) and issubclass(cls, BreakwaterError)
        assert cls.__doc__ and cls.summary and cls.advice


def sample(code: ErrorCode) -> CallError:
    cls = CODE_TO_ERROR[code]
    return cls(
        server="shop",
        tool="create_order",
        retry_after_s=4.25 if cls.default_retryable else None,
        attempt=2,
        max_attempts=3,
        operation_id="op-123",
        detail={"reason": "because", "next_retry_at": "2027-01-15T08:00:04Z"},
    )


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_becomes_an_is_error_result_with_the_envelope(code: ErrorCode) -> None:
    err = sample(code)
    res = error_result(err)
    wire = json.loads(res.model_dump_json(by_alias=True, exclude_none=True))
    assert wire["isError"] is True
    data = wire["structuredContent"]
    assert set(data) >= ENVELOPE
    assert data["ok"] is False
    assert data["code"] == code.value
    assert data["retryable"] is err.retryable
    assert data["attempt"] == 2 and data["max_attempts"] == 3
    assert (data["server"], data["tool"], data["operation_id"]) == ("shop", "create_order", "op-123")
    assert data["reason"] == "because"
    text = wire["content"][-1]["text"]
    assert text.startswith("Tool 'create_order' on server 'shop': ")
    assert err.advice_text() in text
    assert len(text) < 400  # short: the model reads this on every failure


@pytest.mark.parametrize("code", list(ErrorCode))
@pytest.mark.parametrize("wait", [float("inf"), float("nan"), 1e308, -1.0, 0.0])
def test_any_wait_prints_and_never_as_a_number_no_clock_can_say(code: ErrorCode, wait: float) -> None:
    """No wait breakwater computes is infinite, but an error must never fail to print (it raised OverflowError)."""
    err = CODE_TO_ERROR[code](server="shop", tool="create_order", retry_after_s=wait, detail={"breaker": "open"})
    text = error_result(err).content[-1]
    assert isinstance(text, TextContent) and err.advice_text() in text.text
    assert not any(word in err.advice_text() for word in ("inf s", "nan s", "about -"))


@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_result_is_the_one_the_models_constructors_build(code: ErrorCode) -> None:
    """`error_result` calls the models' validators directly (an open breaker's refusal must be cheap): the result
    is equal, field for field and set for set, to the one `CallToolResult(...)` builds, and the same on the wire."""
    err = sample(code)
    built = error_result(err)
    note = TextContent(type="text", text=error_text(err), _meta={ENVELOPE_META_KEY: True})
    content: list[ContentBlock] = [note]
    structured = json.loads(json.dumps(built.structured_content))
    validated = CallToolResult(content=content, structured_content=structured, is_error=True)
    assert built == validated and repr(built) == repr(validated)
    assert built.model_fields_set == validated.model_fields_set
    assert built.content[-1].model_fields_set == note.model_fields_set
    for options in ({"by_alias": True, "exclude_none": True}, {"by_alias": True}, {"exclude_unset": True}, {}):
        assert built.model_dump_json(**options) == validated.model_dump_json(**options), options  # type: ignore[arg-type]
        assert built.model_dump(mode="json", **options) == validated.model_dump(mode="json", **options)  # type: ignore[arg-type]
    assert CallToolResult.model_validate(built.model_dump(by_alias=True)) == built
    assert built.model_copy(deep=True) == built
    again = error_result(err)
    assert again.content[-1].meta is not built.content[-1].meta  # nothing shared between two results


@pytest.mark.parametrize("code", list(ErrorCode))
def test_round_trip_to_a_typed_exception(code: ErrorCode) -> None:
    err = sample(code)
    back = error_from_result(error_result(err))
    assert type(back) is type(err)
    assert back is not None
    for field in ("message", "server", "tool", "retryable", "retry_after_s", "attempt", "max_attempts", "operation_id"):
        assert getattr(back, field) == getattr(err, field), field
    assert back.detail == err.detail


def test_the_text_says_what_to_do_next() -> None:
    opened = error_text(CircuitOpenError(server="web", tool="search", retry_after_s=5.0))
    assert "another tool" in opened and "about 5 s" in opened
    unknown = error_text(OutcomeUnknownError(server="shop", tool="create_order", attempt=1))
    assert "may or may not have happened" in unknown and "Do not retry" in unknown and "ask the user" in unknown
    spent = error_text(BudgetExhaustedError())
    assert "Do not retry" in spent and "ask the user" in spent
    down = error_text(ServerUnavailableError(server="db", retry_after_s=42.4))
    assert down.startswith("Server 'db': ") and "about 42 s" in down
    # A tool's error it marks transient (retried, then given up on): `retryable: true` beside "rather than repeating
    # the same call" told the model both. A tool's other errors: fix the input.
    transient = error_text(ToolError(server="bs", tool="ro", retryable=True, retry_after_s=3.0, attempt=3))
    assert "transient" in transient and "about 3 s" in transient and "rather than repeating" not in transient
    plain = error_text(ToolError(server="bs", tool="ro", attempt=1))
    assert "fix the input" in plain and "transient" not in plain


def test_a_tool_error_passes_the_upstream_content_through() -> None:
    upstream: list[ContentBlock] = [
        TextContent(type="text", text="order A1 is already shipped"),
        ImageContent(type="image", data="aGk=", mime_type="image/png"),
    ]
    err = ToolError(
        "order A1 is already shipped",
        content=upstream,
        upstream_structured_content={"state": "shipped"},
        server="shop",
        tool="cancel_order",
        attempt=1,
    )
    res = error_result(err)
    assert res.content[:2] == upstream  # the tool's own words first, unchanged
    note = res.content[2]
    assert isinstance(note, TextContent) and note.meta == {ENVELOPE_META_KEY: True}
    assert res.structured_content["upstream"] == {"state": "shipped"}
    back = error_from_result(res)
    assert isinstance(back, ToolError)
    assert back.content == upstream  # breakwater's note is stripped again
    assert back.upstream_structured_content == {"state": "shipped"}


def test_a_raw_upstream_error_result_becomes_a_tool_error() -> None:
    raw = CallToolResult(
        content=[TextContent(type="text", text="Error executing tool refund: card declined")],
        structured_content={"retryable": True},
        is_error=True,
    )
    err = error_from_result(raw)
    assert isinstance(err, ToolError)
    assert err.message == "Error executing tool refund: card declined"
    assert err.retryable is True
    assert err.content == raw.content
    assert error_from_result(CallToolResult(content=[])) is None


def test_detail_may_not_shadow_the_envelope() -> None:
    with pytest.raises(ValueError, match="shadow"):
        CircuitOpenError(detail={"code": "OK"})


def test_str_names_code_and_place() -> None:
    err = CircuitOpenError("paused", server="web", tool="search")
    assert str(err) == "CIRCUIT_OPEN: web/search: paused"
    assert CircuitOpenError().message == CircuitOpenError.summary


def test_the_readme_table_is_rendered_from_the_classes() -> None:
    table = render_error_table()
    rows = table.strip().splitlines()[2:]
    assert len(rows) == len(ErrorCode)
    for code, row in zip(ErrorCode, rows, strict=True):
        cls = CODE_TO_ERROR[code]
        assert row.startswith(f"| `{code.value}` | `{cls.__name__}` |")
        assert (cls.__doc__ or "").strip().splitlines()[0] in row
        assert "{wait}" not in row


def test_timeout_advice_says_slow_now_and_never_invites_a_retry() -> None:
    """TIMEOUT: the tool's usual latency, another tool or going on without it, and when breakwater tries it again."""
    plain = CallTimeoutError(server="erp", tool="tax", detail={"timeout_s": 1.0, "usual_s": 0.021})
    text = error_text(plain)
    assert "answering slowly right now (it usually answers in 21 ms)" in text
    assert "use another tool if one can do the job, or go on without it." in text
    opened = CallTimeoutError(
        server="erp", tool="tax", retry_after_s=5.2, detail={"timeout_s": 1.0, "usual_s": 0.021, "breaker": "open"}
    )
    assert "breakwater tries the tool again in about 5.2 s" in error_text(opened)
    # No answer seen yet: no history says it turned slow, and it may simply need more than its timeout.
    unseen = error_text(CallTimeoutError(server="fs", tool="search_files", detail={"timeout_s": 5.0}))
    assert "slowly right now" not in unseen
    assert "No recent answer of it to compare with: it may always take longer than its 5 s timeout" in unseen
    assert "[call] timeout_s" in unseen
    refused = CircuitOpenError(server="erp", tool="tax", retry_after_s=9.0, detail={"usual_s": 0.021})
    assert "go on without it; breakwater tries this one again in about 9 s" in error_text(refused)
    for err in (plain, opened, refused, CallTimeoutError(), CircuitOpenError(), ServerCircuitOpenError()):
        assert "retry" not in error_text(err).lower(), error_text(err)


_names = st.none() | st.text(max_size=12)
# Finite: an infinite wait has no advice text (`_fmt_seconds` cannot round it), and no refusal carries one.
_seconds = st.none() | st.floats(min_value=-1e6, max_value=1e6) | st.floats(min_value=0, max_value=20)
_detail = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k not in ENVELOPE),
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    max_size=4,
)
#: The classes `gate._admit` builds with `refusal_error`.
_REFUSALS = [CircuitOpenError, ServerCircuitOpenError, OverloadedError, BudgetExhaustedError]


@settings(max_examples=300, deadline=None)
@given(
    cls=st.sampled_from(_REFUSALS),
    server=_names,
    tool=_names,
    retry_after_s=_seconds,
    attempt=st.integers(0, 5),
    max_attempts=st.integers(1, 5),
    operation_id=_names,
    detail=_detail,
)
def test_a_refusal_built_by_position_is_the_one_the_constructor_builds(
    cls: type[CallError],
    server: str | None,
    tool: str | None,
    retry_after_s: float | None,
    attempt: int,
    max_attempts: int,
    operation_id: str | None,
    detail: dict[str, Any],
) -> None:
    """`refusal_error` (the call path's positional shortcut) makes the error the keyword constructor makes: the
    same attributes in the same order, the same args, text and envelope."""
    assert cls.__init__ is CallError.__init__  # the shortcut sets what `CallError.__init__` sets, nothing more
    fast = refusal_error(cls, server, tool, retry_after_s, attempt, max_attempts, operation_id, dict(detail))
    slow = cls(
        server=server,
        tool=tool,
        retry_after_s=retry_after_s,
        attempt=attempt,
        max_attempts=max_attempts,
        operation_id=operation_id,
        detail=detail,
    )
    assert type(fast) is type(slow)
    assert list(vars(fast).items()) == list(vars(slow).items()) or _same_nan(vars(fast), vars(slow))
    assert (fast.args, str(fast), repr(fast), fast.advice_text()) == (slow.args, str(slow), repr(slow), slow.advice_text())
    assert error_result(fast).model_dump_json(by_alias=True) == error_result(slow).model_dump_json(by_alias=True)


def _same_nan(a: dict[str, Any], b: dict[str, Any]) -> bool:
    # NaN is not equal to itself: compare the texts instead.
    return list(a) == list(b) and repr(a) == repr(b)


@settings(max_examples=300, deadline=None)
@given(
    code=st.sampled_from([c for c in ErrorCode if c is not ErrorCode.TOOL_ERROR]),
    server=_names,
    tool=_names,
    message=st.none() | st.text(max_size=40),
    retry_after_s=_seconds,
    attempt=st.integers(0, 5),
    operation_id=_names,
    detail=_detail,
)
def test_a_result_built_without_validation_is_the_validated_one(
    code: ErrorCode,
    server: str | None,
    tool: str | None,
    message: str | None,
    retry_after_s: float | None,
    attempt: int,
    operation_id: str | None,
    detail: dict[str, Any],
) -> None:
    """`error_result` builds breakwater's own envelope without the models' validation (it is only ours): equal,
    field for field and set for set, to the one the models' constructors build, and the same on the wire."""
    err = CODE_TO_ERROR[code](
        message, server=server, tool=tool, retry_after_s=retry_after_s, attempt=attempt, operation_id=operation_id, detail=detail
    )
    built = error_result(err)
    note = TextContent(type="text", text=error_text(err), _meta={ENVELOPE_META_KEY: True})
    validated = CallToolResult(content=[note], structured_content=built.structured_content, is_error=True)
    assert built == validated and repr(built) == repr(validated)
    assert built.model_fields_set == validated.model_fields_set
    assert built.content[0].model_fields_set == note.model_fields_set
    assert built.__pydantic_extra__ is validated.__pydantic_extra__ is None
    assert built.__pydantic_private__ is validated.__pydantic_private__ is None
    for options in ({"by_alias": True, "exclude_none": True}, {"by_alias": True}, {"exclude_unset": True}, {}):
        assert built.model_dump_json(**options) == validated.model_dump_json(**options), options  # type: ignore[arg-type]


@given(st.none() | st.floats() | st.integers(-(10**6), 10**6))
def test_the_envelopes_wait_is_the_rounded_one(seconds: float | None) -> None:
    """`envelope` rounds the wait as `_round_s` does, for every value."""
    err = CircuitOpenError(retry_after_s=seconds)
    expected = _round_s(seconds)
    assert envelope(err)["retry_after_s"] == expected
    assert type(envelope(err)["retry_after_s"]) is type(expected)


@given(st.none() | st.floats(min_value=-1e6, max_value=1e6) | st.integers(-(10**6), 10**6), st.none() | st.floats(0, 100))
def test_an_open_breakers_advice_names_the_wait_as_fmt_seconds_does(seconds: float | None, usual: float | None) -> None:
    """`CircuitOpenError.advice_text` formats the wait as `_fmt_seconds` does."""
    err = CircuitOpenError(retry_after_s=seconds, detail=None if usual is None else {"usual_s": usual})
    wait = f"about {_fmt_seconds(seconds)}" if seconds is not None and seconds > 0 else "a moment"  # a passed wait: none
    assert err.advice_text() == _circuit_advice(wait, usual)


@pytest.mark.parametrize("leaf", [leaf for leaf in all_leaves() if leaf.default_retryable])
def test_an_error_that_must_not_be_retried_never_advises_a_retry(leaf: type[CallError]) -> None:
    """An invalid reply to a call that may have run is UPSTREAM_ERROR with `retryable: false`; its text said "Wait a
    moment and retry once", the opposite of its envelope. Every kind that is retried says otherwise when this one is not."""
    refused = leaf(server="s", tool="t", retryable=False)
    advice = refused.advice_text().lower()
    assert not any(invite in advice for invite in ("and retry", "retry once", "retry after", "retry,")), advice
    assert envelope(refused)["retryable"] is False


def test_the_base_errors_name_no_code_and_cannot_be_raised() -> None:
    """`CallError("x")` raised AttributeError ('default_retryable'): the base names no situation the model is told of."""
    from breakwater.errors import CallError, CallFailed

    for base in (CallError, CallFailed):
        with pytest.raises(TypeError, match=f"{base.__name__} is abstract: raise one of its subclasses"):
            base("x")
