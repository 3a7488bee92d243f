"""A mutating call carrying the client's operation id runs at most once across the fleet, whichever replica gets it.

A client whose call was cut — its replica killed with `kill -9`, its stream dropped by the balancer
— cannot know whether the call ran. It retries through the balancer with the same operation id
(`_meta["io.breakwater/operationId"]`), and the retry meets another replica. With `[state] url` on
Redis, `serve --http` records every such call it forwards (`breakwater.state._operations`), and a
call whose id is already recorded is answered from the record instead of being run again:

* the first call finished (on any replica) → its answer, exactly as it was, marked
  `_meta["io.breakwater/replayed"]` (reconciled: nothing ran twice);
* the first call is still running on a live replica → wait for its answer (within the call's
  window: its deadline, else the tool's `max_s`); past the window, OUTCOME_UNKNOWN;
* the replica running it died (its lease lapsed) → for a tool the server deduplicates itself
  (retry class `idempotent`), the call is forwarded again under the same id, so the server answers
  from its own record and the gate reconciles (`get_operation`); for any other mutating tool,
  OUTCOME_UNKNOWN with the operation id: it may have run, and it is not run again;
* the same id with other arguments or for another tool → INVALID_ARGUMENTS (use a new id);
* Redis lost its records lately (restarted empty) → wait, up to a lease, for the replicas running
  calls to write theirs back (`breakwater.state._operations`), then one of the above.

A call refused before anything was sent (attempt 0: connecting, circuit open, overloaded …) drops
its record, so its retry runs. Calls without a client-chosen id, and read-only tools, skip all of
this: only the client can retry a call under the same id.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types

from breakwater._wire import REPLAYED_META_KEY
from breakwater.errors import CallError, InvalidArgumentsError, OutcomeUnknownError
from breakwater.gate._classify import RetryClass
from breakwater.gate._envelope import error_result
from breakwater.state._operations import OperationRecords

if TYPE_CHECKING:
    from breakwater._breakwater import Breakwater

__all__ = ["answer_once", "fingerprint", "forwarded_once", "window_for"]

# How often a retry asks again about an operation another live replica runs (first wait, then the cap).
_FIRST_POLL_S = 0.05
_MAX_POLL_S = 1.0
# A cancelled call's record is still written, within this bound.
_WRITE_GRACE_S = 1.0


def fingerprint(server: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 of the call (server, tool, canonical JSON arguments): the same id must name the same call."""
    canonical = json.dumps([server, tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


async def forwarded_once(
    records: OperationRecords,
    bw: Breakwater,
    op_id: str | None,
    server: str,
    tool: str,
    arguments: Mapping[str, Any],
    deadline_s: float | None,
    run: Callable[[], Awaitable[types.CallToolResult]],
) -> types.CallToolResult:
    """The gateway's call of `tool`: through `answer_once` when the client chose an operation id for a mutating tool."""
    retry_class = bw.gate.retry_class(server, tool)
    if op_id is None or retry_class is None or retry_class is RetryClass.SAFE:
        return await run()  # only a client can retry under the same id; a read-only call may run again
    return await answer_once(
        records,
        op_id=op_id,
        server=server,
        tool=tool,
        arguments=arguments,
        server_deduplicates=retry_class is RetryClass.IDEMPOTENT,
        window_s=window_for(bw.gate.hard_cap_s(server, tool), deadline_s),
        run=run,
    )


async def answer_once(
    records: OperationRecords,
    *,
    op_id: str,
    server: str,
    tool: str,
    arguments: Mapping[str, Any],
    server_deduplicates: bool,
    window_s: float,
    run: Callable[[], Awaitable[types.CallToolResult]],
) -> types.CallToolResult:
    """`run()` if no replica ran the call under `op_id` yet; else what became of that call (see the module doc)."""
    clock = records.clock
    fp = fingerprint(server, tool, arguments)
    deadline = clock.monotonic() + window_s
    poll = _FIRST_POLL_S
    while True:
        claimed, record, raw = await records.claim(op_id, fp)
        if claimed:
            return await _run_recorded(records, op_id, fp, run)
        if record is None:
            # Redis came back empty: the replica running the call (if one does) writes its record back within a
            # lease. Waited out whatever the window, as it is bounded by Redis (`ops-settling`), not by the call.
            await clock.sleep(_FIRST_POLL_S)
            continue
        assert raw is not None
        if record.get("fingerprint") != fp:
            return error_result(_mismatch(op_id, server, tool))
        if record.get("state") == "done":
            return _replayed(record.get("result"), op_id, server, tool)
        if not await records.alive(str(record.get("replica"))):
            if server_deduplicates:
                if await records.take_over(op_id, raw, fp):
                    return await _run_recorded(records, op_id, fp, run)
                continue  # another retry took it over first: wait for its answer
            return error_result(_lost(op_id, server, tool))
        if clock.monotonic() + poll > deadline:
            return error_result(_still_running(op_id, server, tool))
        await clock.sleep(poll)
        poll = min(poll * 2, _MAX_POLL_S)


async def _run_recorded(
    records: OperationRecords, op_id: str, fp: str, run: Callable[[], Awaitable[types.CallToolResult]]
) -> types.CallToolResult:
    try:
        result = await run()
    except BaseException:
        # Cancelled (the client went away, the replica is stopping) or broken mid-call: it may have run.
        with anyio.CancelScope(shield=True), records.clock.deadline_scope(records.clock.monotonic() + _WRITE_GRACE_S):
            unknown = OutcomeUnknownError(
                "An earlier call with this operation id was cancelled while it ran, so whether it took effect is "
                "unknown; it was not run again.",
                operation_id=op_id,
                detail={"reason": "cancelled", "operation_state": "unknown"},
            )
            await records.finish(op_id, fp, _dump(error_result(unknown)))
        raise
    envelope = result.structured_content if result.is_error else None
    if isinstance(envelope, dict) and envelope.get("attempt") == 0 and envelope.get("code") != "OUTCOME_UNKNOWN":
        await records.release(op_id)  # refused before anything was sent: a retry may run it
    else:
        await records.finish(op_id, fp, _dump(result))
    return result


def _dump(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _replayed(stored: Any, op_id: str, server: str, tool: str) -> types.CallToolResult:
    try:
        result = types.CallToolResult.model_validate(stored)
    except ValueError:
        return error_result(_lost(op_id, server, tool))
    result.meta = {**(result.meta or {}), REPLAYED_META_KEY: True}
    return result


def _mismatch(op_id: str, server: str, tool: str) -> CallError:
    return InvalidArgumentsError(
        "This operation id was already used for a different call (another tool or other arguments); "
        "nothing was run. Use a new operation id for a new call.",
        server=server,
        tool=tool,
        operation_id=op_id,
        detail={"reason": "operation_mismatch"},
    )


def _lost(op_id: str, server: str, tool: str) -> CallError:
    return OutcomeUnknownError(
        "The gateway replica that was running this call stopped before it answered (it was killed or crashed), "
        "so whether the call took effect is unknown; it was not run again. Check the real state before "
        "calling it again with a new operation id.",
        server=server,
        tool=tool,
        operation_id=op_id,
        detail={"reason": "replica_lost", "operation_state": "unknown"},
    )


def _still_running(op_id: str, server: str, tool: str) -> CallError:
    return OutcomeUnknownError(
        "An earlier call with this operation id is still running on another gateway replica, and did not finish "
        "within this call's window; it was not run again. Send the same operation id again later for its answer.",
        server=server,
        tool=tool,
        retryable=True,
        operation_id=op_id,
        detail={"reason": "running_elsewhere", "operation_state": "executing"},
    )


def window_for(hard_cap_s: float | None, deadline_s: float | None) -> float:
    """How long a retry may wait for a call another replica runs: its deadline, else the tool's hard cap."""
    candidates = [s for s in (hard_cap_s, deadline_s) if s is not None]
    return min(candidates) if candidates else math.inf
