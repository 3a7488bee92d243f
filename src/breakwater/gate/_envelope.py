"""The error envelope: how a failed call looks to the model, and back.

Every failure reaches the model as an ordinary `CallToolResult` with `isError: true`, one short
plain-language text (what happened, then what to do next) and a `structuredContent` object a
program can branch on:

    {"ok": false, "code", "retryable", "retry_after_s", "attempt", "max_attempts",
     "server", "tool", "operation_id", "message", ...detail}

A TOOL_ERROR keeps the upstream tool's own content blocks first, so the model reads the tool's words
before breakwater's note. The note is marked in its `_meta` so `error_from_result` can strip it again.
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent

from breakwater._wire import ENVELOPE_META_KEY, ERROR_META_KEY
from breakwater.errors import CODE_TO_ERROR, ENVELOPE_KEYS, CallError, ErrorCode, ToolError
from breakwater.gate._envelope_data import envelope, error_text

__all__ = ["ENVELOPE_META_KEY", "envelope_of", "error_from_result", "error_result", "error_text", "render_error_table"]

# The models' own validators, called with the fields by name: the same validation as `Model(...)`,
# without `BaseModel.__init__`'s Python frame (keyword arguments packed, `self_instance` filled in),
# which cost a quarter of building the result on an open breaker's refusal (the path that must be
# cheap; `model_validate` costs more still). tests/gate/test_envelope.py holds the results equal.
_text_content = TextContent.__pydantic_validator__.validate_python
_call_tool_result = CallToolResult.__pydantic_validator__.validate_python


def error_result(err: CallError) -> CallToolResult:
    """`err` as the `isError` result the model sees."""
    note = _text_content({"type": "text", "text": error_text(err), "meta": {ENVELOPE_META_KEY: True}})
    structured = envelope(err)
    content = [note]
    if isinstance(err, ToolError):
        if err.upstream_structured_content is not None:
            structured["upstream"] = err.upstream_structured_content
        content = [*err.content, note]
    result: CallToolResult = _call_tool_result({"content": content, "structured_content": structured, "is_error": True})
    return result


def _is_note(block: Any) -> bool:
    meta = getattr(block, "meta", None)
    return isinstance(block, TextContent) and isinstance(meta, dict) and meta.get(ENVELOPE_META_KEY) is True


def envelope_of(result: CallToolResult) -> dict[str, Any] | None:
    """The breakwater envelope of an error `result`, wherever it is, or None (a success, or an upstream's own error).

    In `structuredContent`, or, from the gateway for a tool whose output schema it does not fit, under
    `_meta["io.breakwater/error"]` (`breakwater.gateway._passthrough.fitted`).
    """
    if not result.is_error:
        return None
    moved = result.meta.get(ERROR_META_KEY) if result.meta else None
    data = moved if isinstance(moved, dict) else result.structured_content
    if isinstance(data, dict) and data.get("ok") is False and data.get("code") in ErrorCode.__members__:
        return data
    return None


def error_from_result(result: CallToolResult) -> CallError | None:
    """The typed error a result stands for, or None if it is not an error.

    A breakwater envelope becomes its own class again; any other `isError` result (straight from
    an upstream tool) becomes a `ToolError` carrying its content.
    """
    if not result.is_error:
        return None
    data = envelope_of(result)
    if data is not None:
        cls = CODE_TO_ERROR[ErrorCode(data["code"])]
        retry_after = data.get("retry_after_s")
        common: dict[str, Any] = {
            "server": data.get("server"),
            "tool": data.get("tool"),
            "retryable": bool(data.get("retryable", cls.default_retryable)),
            "retry_after_s": float(retry_after) if isinstance(retry_after, (int, float)) else None,
            "attempt": int(data.get("attempt") or 0),
            "max_attempts": int(data.get("max_attempts") or 1),
            "operation_id": data.get("operation_id"),
            "detail": {k: v for k, v in data.items() if k not in ENVELOPE_KEYS and k != "upstream"},
        }
        message = data.get("message")
        message = message if isinstance(message, str) else None
        if cls is ToolError:
            content = [b for b in result.content if not _is_note(b)]
            # A moved envelope left the tool's own structured content where the tool put it.
            upstream = data.get("upstream") if data is result.structured_content else result.structured_content
            return ToolError(message, content=content, upstream_structured_content=upstream, **common)
        return cls(message, **common)
    # An upstream error result that never went through a breakwater envelope.
    data = result.structured_content
    retryable = isinstance(data, dict) and data.get("retryable") is True
    texts = [b.text for b in result.content if isinstance(b, TextContent)]
    return ToolError(
        " ".join(texts) or None,
        content=result.content,
        upstream_structured_content=data,
        retryable=retryable,
    )


def render_error_table() -> str:
    """The README's error-code table (Markdown), read from the exception classes."""
    lines = [
        "| code | exception | retryable | what happened | what the model is told to do |",
        "|---|---|---|---|---|",
    ]
    for code in ErrorCode:
        cls = CODE_TO_ERROR[code]
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        advice = cls.advice.format(wait="a while")
        lines.append(f"| `{code.value}` | `{cls.__name__}` | {'yes' if cls.default_retryable else 'no'} | {doc} | {advice} |")
    return "\n".join(lines) + "\n"
