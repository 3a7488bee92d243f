"""Step 6 of a call: what became of an attempt whose answer was lost.

After a timeout or a cut stream on an `idempotent` tool the call may have run. The gate waits for
the server to be back (within the call's window) and, if the server offers `get_operation` (as
`breakwater.idempotency.add_operation_tool` registers it), asks it first: `completed` → the stored
result, `failed` → the stored error, `unknown` → OUTCOME_UNKNOWN, `pending`/`executing` → wait and
ask again, `not_found` (or no answer) → re-issue with the same id. A server's OPERATION_IN_PROGRESS
reply is waited on the same way, never counted as a failure. The call's window is the turn budget,
else the tool's hard cap (`max_s`) from the first lost answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from breakwater.connect._readiness import wait_until_ready
from breakwater.errors import CallError, OutcomeUnknownError, ToolError
from breakwater.gate._call import Call, GateContext, ServerRecord, observe, stopped
from breakwater.gate._classify import IN_PROGRESS_REASON, RetryClass, Verdict
from breakwater.journal import RECONCILED

__all__ = ["GET_OPERATION_TOOL", "Resend", "after_lost_answer"]

#: A tool by this name on the same server reports an operation's record (`add_operation_tool`).
GET_OPERATION_TOOL = "get_operation"

# Longest wait between two questions about a running operation when the server gives no hint:
# the owner may finish any moment (the idempotency module caps its own hint at 2 s too).
_MAX_POLL_S = 2.0
_RUNNING_STATES = frozenset({"pending", "executing"})


@dataclass(frozen=True, slots=True)
class Resend:
    """Send the same operation again after `delay_s`, without spending an attempt or a retry token."""

    delay_s: float


def offers_get_operation(srv: ServerRecord) -> bool:
    """Whether the server can be asked what became of an operation."""
    return srv.tool(GET_OPERATION_TOOL) is not None


async def after_lost_answer(
    ctx: GateContext, call: Call, verdict: Verdict, err: CallError
) -> types.CallToolResult | Resend | None:
    """Settle an attempt whose answer may have been lost: the stored result, a `Resend`, or None (an ordinary retry decides).

    Raises the stored error of a failed operation, OUTCOME_UNKNOWN for an unknown one, and `err`
    (noting why) when the call's window closes first.
    """
    srv, info = call.srv, call.info
    in_progress = verdict.reason == IN_PROGRESS_REASON
    if verdict.outcome_unknown and info.retry_class is RetryClass.NEVER and offers_get_operation(srv):
        err.detail.setdefault("check_with", f"{GET_OPERATION_TOOL}(operation_id) on server '{srv.name}'")
    reconciles = info.retry_class is RetryClass.IDEMPOTENT and call.op_id is not None
    if not (reconciles and verdict.retryable and (verdict.outcome_unknown or in_progress)):
        return None
    clock = ctx.clock
    if call.window is None:
        call.window = clock.monotonic() + info.call.hard_s
        if call.budget is not None:
            call.window = min(call.window, call.budget.deadline)
    if offers_get_operation(srv):
        asked = clock.monotonic()
        settled = await _reconcile(ctx, call, err, verdict.retry_after_s)
        if settled is not None:
            srv.retry_budget.record_success(was_retry=True)
            if call.journal is not None:
                spent = clock.monotonic() - asked
                observe(ctx, call, None, attempt=call.journal.sent, duration_s=spent, outcome=RECONCILED)
            return settled
        # Not found (or the server could not say): re-issue with the same id, which the server
        # deduplicates, as an ordinary retry (attempts, backoff, retry budget).
        return None
    if not in_progress:
        return None
    # No way to ask: send the same id again after the server's hint, without spending an attempt
    # or a retry token on an operation that is merely still running.
    call.attempt -= 1
    delay = info.retry.delay(0, ctx.rng, verdict.retry_after_s)
    if delay is None or clock.monotonic() + delay + call.needed_s > call.window:
        raise stopped(err, "the operation was still running when the call's window closed")
    return Resend(delay)


async def _reconcile(ctx: GateContext, call: Call, err: CallError, hint: float | None) -> types.CallToolResult | None:
    """Ask the server what became of the call's operation until it knows or the window closes.

    Returns the stored result of a completed operation, or None when the operation is not there
    (it never arrived, or was released before it started) and the same id should be sent again.
    """
    assert call.op_id is not None and call.window is not None
    srv, info, op_id, window = call.srv, call.info, call.op_id, call.window
    polls = 0
    clock = ctx.clock
    while True:
        # An operation reported running is waited on; before the first question, the hint of an
        # OPERATION_IN_PROGRESS reply (if that is what brought us here) is honoured too.
        if polls or hint is not None:
            delay = min(info.retry.backoff.delay(polls, ctx.rng), _MAX_POLL_S)
            if hint is not None:
                delay = max(delay, hint)
            if clock.monotonic() + delay >= window:
                raise stopped(err, "the operation was still running when the call's window closed")
            await clock.sleep(delay)
        # Back within the call's timeout, or not at all: a server that is retrying or failed ends the wait at once (waiting
        # for its ready event held an idempotent tool's call to its cap, 120 s, for a server that could not restart).
        if not await wait_until_ready(srv.upstream, clock=clock, seconds=call.timeout_s, deadline=window):
            raise stopped(err, "the server did not come back within the call's window")
        status = await _ask(ctx, srv, op_id, min(call.timeout_s, window - clock.monotonic()))
        if status is None:
            return None
        state = status.get("state")
        err.detail["operation_state"] = state
        if state == "completed":
            try:
                return types.CallToolResult.model_validate(status.get("result"))
            except ValueError:
                # A record we cannot read back: the same id replays it exactly, so ask for that.
                return None
        if state == "failed":
            raise _stored_failure(call, status)
        if state == "unknown":
            raise OutcomeUnknownError(
                "The server recorded that this operation stopped mid-run (its process died or the call was "
                "cancelled), so whether it took effect is unknown; it was not run again.",
                server=srv.name,
                tool=info.name,
                attempt=err.attempt,
                max_attempts=err.max_attempts,
                operation_id=op_id,
                detail={"operation_state": "unknown", "reason": status.get("reason") or "unknown"},
            )
        if state not in _RUNNING_STATES:
            return None  # not_found: nothing ran under this id
        polls += 1
        hint = _retry_after_hint(status)


async def _ask(ctx: GateContext, srv: ServerRecord, op_id: str, timeout_s: float) -> dict[str, Any] | None:
    """`get_operation(op_id)`'s structured answer, or None if the server could not say in time."""
    client = srv.upstream.client
    if client is None or timeout_s <= 0:
        return None
    srv.in_flight += 1
    result: types.CallToolResult | None = None
    try:
        # The deadline scope swallows its own expiry: `result` then stays None.
        with ctx.clock.deadline_scope(ctx.clock.monotonic() + timeout_s):
            result = await client.call_tool(GET_OPERATION_TOOL, {"operation_id": op_id})
    except (Exception, BaseExceptionGroup):
        # A lost or refused question proves nothing; the caller re-sends the same id instead,
        # which the server deduplicates anyway. Breakers learn from real attempts only.
        return None
    else:
        if result is None:
            return None
        data = result.structured_content
        if result.is_error or not isinstance(data, dict) or not isinstance(data.get("state"), str):
            return None
        return data
    finally:
        srv.in_flight -= 1


def _stored_failure(call: Call, status: Mapping[str, Any]) -> CallError:
    """The error a failed operation recorded, as the call's answer (never retried: it would fail alike)."""
    error = status.get("error") if isinstance(status.get("error"), dict) else {}
    assert isinstance(error, dict)
    kind = error.get("kind")
    message = error.get("message")
    if kind == "crash" or not isinstance(message, str) or not message:
        # MCPServer shows only this for a crash; the exception text stays in the server's log.
        message = f"Error executing tool {call.info.name}"
    return ToolError(
        server=call.srv.name,
        tool=call.info.name,
        content=[types.TextContent(type="text", text=message)],
        retryable=False,
        operation_id=call.op_id,
        detail={"operation_state": "failed", "error_kind": kind},
    )


def _retry_after_hint(data: Mapping[str, Any]) -> float | None:
    value = data.get("retry_after_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None
