"""Tools a 2025-11-25 server runs only as tasks (`execution.taskSupport: "required"`), called as tasks.

Why. On the 2025-11-25 revision a server that declares `tasks.requests.tools.call` may mark a tool
`required`: it refuses a plain `tools/call` of it with -32601 ("requires task augmentation"). The
reference "everything" server's `simulate-research-query` is one. Called plainly, as every other
tool, such a tool failed on every call behind breakwater: a healthy tool the model could only see
fail. The 2026-07-28 tasks extension is server-directed and is followed by `_tasks.TaskRuntime`;
this module is the requestor side of the older, client-directed form.

What it does, inside the gate's attempt (so breakers, the journal and retries see one attempt):

1. sends the `tools/call` with `params.task = {"ttl": ...}` (the task's own time limit) and reads the
   `CreateTaskResult`; a server that answers with the result itself (it ignored the augmentation, as
   the spec lets a server without the capability do) is answered as a plain call;
2. lifts the attempt's deadline (it bounded getting the handle) and bounds the task by the turn
   budget, or `call.task_max_s` from now, as for a 2026-07-28 task;
3. polls `tasks/get` at the server's `pollInterval` (none: 1 s) times a jitter factor from the
   injected `random.Random`, through the injected clock; a poll that fails for a transient reason is
   retried with backoff on whatever connection the upstream has by then;
4. once the task is `completed` or `failed`, or asks for input (`input_required`), sends
   `tasks/result`, which the server answers when the task ends: the tool's `CallToolResult` (an
   `isError` one for a tool that failed) or the JSON-RPC error the call would have had. While it
   waits, the server's questions (elicitation, sampling) arrive as requests and are relayed to the
   caller like any other call's. `cancelled` ends the call as CANCELLED;
5. when the deadline passes or the caller cancels, sends `tasks/cancel` and reports as for a
   2026-07-28 task (TIMEOUT, or OUTCOME_UNKNOWN for a `never` tool, naming the task id).

What it leaves out. `optional` tools are called plainly, as before (a task costs two more round
trips and the result is the same). Progress is relayed while the creating request is open, not
after (the SDK forgets the token once that request is answered). The task is not persisted for a
resume after a restart: `Breakwater.resume_task` follows 2026-07-28 tasks only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio
import mcp.types as types
import pydantic
from mcp import Client, MCPError
from mcp.shared.dispatcher import ProgressFnT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater._wire import OPERATION_ID_META_KEY, RELATED_TASK_META_KEY
from breakwater.errors import CallCancelledError
from breakwater.gate._classify import answer_of
from breakwater.gate._tasks import (
    MAX_ERROR_BACKOFF_S,
    MIN_POLL_S,
    MIN_POLL_TIMEOUT_S,
    POLL_JITTER,
    TaskCall,
    _broken,
    _cut,
    _interval,
    _lost,
    _Transient,
)
from breakwater.gate._turn_budget import current_budget
from breakwater.tasks._store import PendingTask

__all__ = ["call_as_task", "requires_task"]

logger = logging.getLogger("breakwater.tasks")

#: Statuses after which `tasks/result` answers at once (or, for `input_required`, carries the questions).
_FETCH = frozenset({"completed", "failed", "input_required"})
_WIRE_KEYS = {"progress_token": "progressToken"}
#: Extra retention asked beyond the task's deadline, so the result outlives the last poll.
_TTL_MARGIN_S = 60.0


def requires_task(client: Client, tool: types.Tool) -> bool:
    """Whether `tool` must be called as a 2025-11-25 task on `client`'s connection."""
    execution = tool.execution
    if execution is None or execution.task_support != "required":
        return False
    if (client.session._negotiated_version or "") in MODERN_PROTOCOL_VERSIONS:
        return False  # a 2026-07-28 server makes tasks itself (`_tasks`); `execution` is not of that revision
    tasks = client.server_capabilities.tasks
    requests = tasks.requests if tasks is not None else None
    return requests is not None and requests.tools is not None and requests.tools.call is not None


async def call_as_task(
    call: TaskCall,
    client: Client,
    name: str,
    arguments: Mapping[str, Any] | None,
    *,
    meta: Mapping[str, Any] | None,
    progress: ProgressFnT | None,
) -> types.CallToolResult:
    """`tools/call` of `name` as a task, followed to its end (module docstring)."""
    runtime, clock = call.runtime, call.runtime.clock
    session = client.session
    params: dict[str, Any] = {"name": name, "task": {"ttl": round((call.max_s + _TTL_MARGIN_S) * 1000)}}
    if arguments is not None:
        params["arguments"] = dict(arguments)
    if meta:
        # As `_raw_call` writes it: the SDK's Python name of the progress token is camelCase on the wire.
        params["_meta"] = {_WIRE_KEYS.get(key, key): value for key, value in meta.items() if value is not None}
    data: dict[str, Any] = {"method": "tools/call", "params": params}
    opts: dict[str, Any] = {}
    session._stamp(data, opts)  # type: ignore[arg-type]
    if progress is not None:
        opts["on_progress"] = progress
    raw = await session._dispatcher.send_raw_request("tools/call", data["params"], opts)  # type: ignore[arg-type]
    if "task" not in raw:  # answered as a plain call
        result = types.CallToolResult.model_validate(raw, by_name=False)
        if not result.is_error:
            await session.validate_tool_result(name, result)
        return result
    try:
        task = types.CreateTaskResult.model_validate(raw, by_name=False).task
    except pydantic.ValidationError as exc:
        given = raw["task"].get("taskId") if isinstance(raw["task"], dict) else None
        raise _broken(_pending(call, str(given)), "the server's answer to a task-augmented call is not a task") from exc
    started = clock.monotonic()
    deadline, cut_by = started + call.max_s, "task_max_s"
    budget = current_budget()
    if budget is not None and budget.deadline <= deadline:
        deadline, cut_by = budget.deadline, "turn budget"
    call.attempt.became_task(task.task_id)
    pending = _pending(call, task.task_id)
    try:
        with clock.deadline_scope(deadline):
            result = _untagged(await _until_done(call, pending, task))
            if not result.is_error:  # the output schema, as `Client.call_tool` checks it
                session = await runtime.ready_session(call.upstream)
                await session.validate_tool_result(name, result)
            return result
        sent = await runtime.cancel(call.upstream, pending.task_id)
        raise _cut(pending, cut_by, sent, clock.monotonic() - started)
    except anyio.get_cancelled_exc_class():
        if not runtime.closing:
            await runtime.cancel(call.upstream, pending.task_id)
        raise


def _untagged(result: types.CallToolResult) -> types.CallToolResult:
    """`result` without the `related-task` tag `tasks/result` put on it: the task was breakwater's, not the caller's."""
    meta = result.meta
    if not meta or RELATED_TASK_META_KEY not in meta:
        return result
    rest = {key: value for key, value in meta.items() if key != RELATED_TASK_META_KEY}
    return result.model_copy(update={"meta": rest or None})


def _pending(call: TaskCall, task_id: str) -> PendingTask:
    """The task as `_tasks`' errors name it (never stored: no times kept)."""
    op_id = call.meta.get(OPERATION_ID_META_KEY) if call.meta else None
    return PendingTask(
        server=call.upstream.spec.name,
        tool=call.tool,
        task_id=task_id,
        operation_id=op_id if isinstance(op_id, str) else None,
        retry_class=call.retry_class.value,
        started_at=0.0,
        deadline_at=0.0,
        owner=None,
    )


async def _until_done(call: TaskCall, pending: PendingTask, task: types.Task) -> types.CallToolResult:
    clock, rng = call.runtime.clock, call.runtime.rng
    poll_timeout_s = max(call.timeout_s, MIN_POLL_TIMEOUT_S)
    interval_s = _interval(task.poll_interval)
    status, errors = task.status, 0
    while True:
        if status == "cancelled":
            raise CallCancelledError(
                "The server cancelled the task before it finished.",
                detail={"task_id": pending.task_id, "task_status": "cancelled"},
            )
        try:
            if status in _FETCH:
                return await _result(call, pending)
            wait = interval_s * rng.uniform(1.0, 1.0 + POLL_JITTER)
            if errors:
                wait = min(max(interval_s, MIN_POLL_S) * 2**errors, max(MAX_ERROR_BACKOFF_S, interval_s))
            await clock.sleep(wait)
            state = await _get(call, pending, poll_timeout_s)
        except _Transient as why:
            errors += 1
            logger.debug("following task %s on %s failed (%s); polling again", pending.task_id, pending.server, why)
            status = "working"  # ask again before fetching again
            continue
        errors = 0
        status = state.status
        if state.poll_interval is not None:
            interval_s = _interval(state.poll_interval)


async def _get(call: TaskCall, pending: PendingTask, timeout_s: float) -> types.GetTaskResult:
    clock = call.runtime.clock
    session = await call.runtime.ready_session(call.upstream)
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=pending.task_id))
    with clock.deadline_scope(clock.monotonic() + timeout_s):
        state: types.GetTaskResult = await _asked(call, pending, session.send_request(request, types.GetTaskResult))
        return state
    raise _Transient("no answer within the poll timeout")


async def _result(call: TaskCall, pending: PendingTask) -> types.CallToolResult:
    """`tasks/result`: the call's own answer once the task ends (the task's deadline bounds the wait)."""
    session = await call.runtime.ready_session(call.upstream)
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=pending.task_id))
    result: types.CallToolResult = await _asked(call, pending, session.send_request(request, types.CallToolResult), result=True)
    return result


async def _asked(call: TaskCall, pending: PendingTask, request: Any, *, result: bool = False) -> Any:
    """Await one task request; sort its failures into transient ones, a lost task, and the call's own error."""
    try:
        return await request
    except MCPError as exc:
        if exc.code == types.CONNECTION_CLOSED and answer_of(exc, call.upstream) is exc:  # not the server's own -32000
            call.upstream.report_lost()
        terminated = exc.code == types.INVALID_REQUEST and "session terminated" in exc.message.lower()
        if exc.code in (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT) or terminated:
            raise _Transient(f"{exc.code}: {exc.message}") from exc
        if exc.code == types.INVALID_PARAMS and "task" in exc.message.lower():
            raise _lost(pending, exc.message) from exc
        if result:
            raise  # the JSON-RPC error the call itself would have answered: the gate classifies it
        if exc.code == types.INTERNAL_ERROR:
            raise _Transient(f"{exc.code}: {exc.message}") from exc
        raise _broken(pending, f"tasks/get answered {exc.code}: {exc.message}") from exc
    except pydantic.ValidationError as exc:
        what = "a CallToolResult" if result else "a task"
        raise _broken(pending, f"tasks/{'result' if result else 'get'} answered something that is not {what}") from exc
    except (Exception, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(anyio.get_cancelled_exc_class()) is not None:
            raise  # a cancellation beside a transport failure is still a cancellation
        raise _Transient(f"{type(exc).__name__}: {exc}") from exc
