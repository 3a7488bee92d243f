"""The error envelope's data, SDK-free: the text the model reads and the `structuredContent` object.

Apart from `breakwater.gate._envelope` (which builds the SDK's `CallToolResult` of them) so that a
stdio session attached to the shared gateway, which never loads the SDK, can answer a cut call.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from breakwater.errors import CallError

__all__ = ["envelope", "error_text"]


def error_text(err: CallError) -> str:
    """The sentence pair the model reads: what happened, then what to do next."""
    return f"{_headline(err.tool, err.server, err.message, err.attempt)} {err.advice_text()}"


@functools.lru_cache(maxsize=1024)
def _headline(tool: str | None, server: str | None, message: str, attempt: int) -> str:
    # Remembered: an open breaker's refusals (the path that must be cheap) repeat the same few.
    where = _where(tool, server)
    text = (f"{where}: {message}" if where else message).rstrip()
    if attempt > 1:
        text = f"{text.rstrip('.')} (after {attempt} attempts)"
    if not text.endswith((".", "!", "?")):
        text += "."
    return text


def _where(tool: str | None, server: str | None) -> str:
    if tool and server:
        return f"Tool '{tool}' on server '{server}'"
    if server:
        return f"Server '{server}'"
    if tool:
        return f"Tool '{tool}'"
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
        **err.detail,
    }
    return data


def _round_s(seconds: float | None) -> float | None:
    # Millisecond precision is all a model or a script can use; long floats only cost tokens.
    if seconds is None or not math.isfinite(seconds):
        return None
    return round(max(0.0, seconds), 3)
