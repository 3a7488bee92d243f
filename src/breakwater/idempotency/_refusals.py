"""The answers `@idempotent` gives instead of running a tool: an operation in progress, a mismatch, an unknown outcome, a
store it cannot record in, an id it cannot use. Their envelope has the same core keys as breakwater's client-side one,
so one parser reads both (`breakwater.gate` reads it, from the structured content or from `_meta`).
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent

from breakwater._wire import ERROR_META_KEY
from breakwater.idempotency._store import OperationRecord

__all__ = [
    "MAX_RETRY_AFTER_S",
    "REFUSAL_CODES",
    "envelope_in_meta",
    "error_result",
    "in_progress",
    "mismatch",
    "store_unavailable",
    "unknown",
]

#: Cap on `retry_after_s` for an in-progress operation: the owner may finish any moment, so a
#: caller should look again soon even when the lease runs much longer.
MAX_RETRY_AFTER_S = 2.0


def error_result(code: str, message: str, *, retryable: bool, retry_after_s: float | None, **detail: Any) -> CallToolResult:
    # The same core keys as breakwater's client-side envelope, so one parser reads both.
    structured: dict[str, Any] = {
        "ok": False,
        "code": code,
        "retryable": retryable,
        "retry_after_s": retry_after_s,
        "message": message,
        **detail,
    }
    return CallToolResult(content=[TextContent(text=message)], structured_content=structured, is_error=True)


#: The refusals `error_result` makes (the tool's own errors are the tool's).
REFUSAL_CODES = frozenset(
    {
        "OPERATION_IN_PROGRESS",
        "OPERATION_STORE_UNAVAILABLE",
        "OPERATION_MISMATCH",
        "OPERATION_OUTCOME_UNKNOWN",
        "INVALID_OPERATION_ID",
    }
)


def envelope_in_meta(result: Any) -> Any:
    """`result` with a refusal's envelope moved from the structured content to `_meta[ERROR_META_KEY]`."""
    data = result.structured_content if isinstance(result, CallToolResult) and result.is_error else None
    if not isinstance(data, dict) or data.get("code") not in REFUSAL_CODES:
        return result
    return result.model_copy(update={"structured_content": None, "meta": {**(result.meta or {}), ERROR_META_KEY: data}})


def in_progress(record: OperationRecord, now: float) -> CallToolResult:
    remaining = (record.lease_until or now) - now
    retry_after = round(min(MAX_RETRY_AFTER_S, max(0.1, remaining)), 1)
    return error_result(
        "OPERATION_IN_PROGRESS",
        f"Operation {record.operation_id} is still running. Retry with the same operation id in {retry_after:g} s.",
        retryable=True,
        retry_after_s=retry_after,
        tool=record.tool,
        operation_id=record.operation_id,
        state=record.state.value,
    )


def store_unavailable(tool: str, operation_id: str) -> CallToolResult:
    return error_result(
        "OPERATION_STORE_UNAVAILABLE",
        "The server could not record this operation, so it did not run it. Retry with the same operation id.",
        retryable=True,
        retry_after_s=1.0,
        tool=tool,
        operation_id=operation_id,
    )


def mismatch(record: OperationRecord, tool: str) -> CallToolResult:
    where = f"tool '{record.tool}'" if record.tool != tool else "different arguments"
    return error_result(
        "OPERATION_MISMATCH",
        f"Operation id {record.operation_id} was already used with {where}. Use a new operation id for a different call.",
        retryable=False,
        retry_after_s=None,
        tool=tool,
        operation_id=record.operation_id,
    )


def unknown(record: OperationRecord) -> CallToolResult:
    reason = (record.outcome or {}).get("reason", "lease_expired")
    why = "was cancelled" if reason == "cancelled" else "stopped (its server died or lost its lease)"
    return error_result(
        "OPERATION_OUTCOME_UNKNOWN",
        f"Operation {record.operation_id} {why} while running; whether its side effect happened is unknown. "
        "Check the real state before trying again with a new operation id.",
        retryable=False,
        retry_after_s=None,
        tool=record.tool,
        operation_id=record.operation_id,
        reason=reason,
    )
