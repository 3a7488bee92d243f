"""The error envelope's data, SDK-free: the text the model reads and the `structuredContent` object.

Apart from `breakwater.gate._envelope` (which builds the SDK's `CallToolResult` of them) so that a
stdio session attached to the shared gateway, which never loads the SDK, can answer a cut call.
"""

from __future__ import annotations

import math
from typing import Any

from breakwater.errors import CallError

__all__ = ["envelope", "error_text"]


def error_text(err: CallError) -> str:
    """The sentence pair the model reads: what happened, then what to do next."""
    where = _where(err)
    text = (f"{where}: {err.message}" if where else err.message).rstrip()
    if err.attempt > 1:
        text = f"{text.rstrip('.')} (after {err.attempt} attempts)"
    if not text.endswith((".", "!", "?")):
        text += "."
    return f"{text} {err.advice_text()}"


def _where(err: CallError) -> str:
    if err.tool and err.server:
        return f"Tool '{err.tool}' on server '{err.server}'"
    if err.server:
        return f"Server '{err.server}'"
    if err.tool:
        return f"Tool '{err.tool}'"
    return ""


def envelope(err: CallError) -> dict[str, Any]:
    """The `structuredContent` object for `err` (core keys first, then extra detail)."""
    data: dict[str, Any] = {
        "ok": False,
        "code": err.code._value_,  # the plain str (`.value` is a descriptor call, 3x the cost)
        "retryable": err.retryable,
        "retry_after_s": _round_s(err.retry_after_s),
        "attempt": err.attempt,
        "max_attempts": err.max_attempts,
        "server": err.server,
        "tool": err.tool,
        "operation_id": err.operation_id,
        "message": err.message,
    }
    data.update(err.detail)
    return data


def _round_s(seconds: float | None) -> float | None:
    # Millisecond precision is all a model or a script can use; long floats only cost tokens.
    if seconds is None or not math.isfinite(seconds):
        return None
    return round(max(0.0, seconds), 3)
