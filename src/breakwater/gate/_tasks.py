"""The client side of the 2026-07-28 tasks extension: calls a server turns into tasks, polled to their end.

Every upstream `Client` carries `CLIENT_EXTENSION`, so on a 2026-07-28 connection each request
declares `io.modelcontextprotocol/tasks`, and a server that offers it may answer a `tools/call`
with a task handle (`resultType: "task"`) instead of the result. The SDK hands that handle to
the claim's resolver here, inside the gate's attempt, and the resolver:

1. lifts the attempt's deadline (it bounded getting the handle; a task is bounded differently) and
   sets the task's own: the turn budget if there is one, else `call.task_max_s` from now;
2. persists the task (server, tool, task id, operation id, deadline) in a small SQLite table
   (`TaskStore`), so a process that dies mid-task can resume it (`Breakwater.resume_task`);
3. polls `tasks/get` through the injected clock, waiting the server's `pollIntervalMs` (a
   missing one: 1 s) times a jitter factor drawn from the injected `random.Random` in [1, 1.1) —
   never sooner than the server asked. A poll that fails for a transient reason (timeout,
   connection lost, server error) is retried with backoff on whatever connection the upstream has
   by then; it is never taken for the task's failure;
4. maps the end: `completed` → the inlined `CallToolResult` (an `isError` one included: the gate
   classifies it as the tool's own error), `failed` → the JSON-RPC error as an `MCPError` (the gate
   classifies it like any protocol error), `cancelled` → CANCELLED, an id the server no longer
   knows (-32602: expired, or the server restarted) → OUTCOME_UNKNOWN for a `never` tool, else a
   retryable UPSTREAM_ERROR; `input_required` → the task is cancelled (breakwater does not relay
   elicitation or sampling) and the call fails;
5. when the deadline passes or the caller cancels, sends `tasks/cancel` (never
   `notifications/cancelled`, which the spec forbids for tasks) and reports TIMEOUT, or
   OUTCOME_UNKNOWN for a `never` tool, naming the task id.

Legacy (2025-11-25) connections never see a task: the SDK advertises a claim-bearing extension only
at protocol versions where its claims are active, so those calls stay ordinary calls.

When the `Breakwater` instance exits while a task is being polled, the task is left running
upstream and its record kept, so the next start can resume it; only the caller's own cancellation
(or a spent budget) cancels a task. A call made for someone who polls it later (a gateway task,
`TASK_OWNER`) can be kept the same way one at a time (`TaskOwner.keep`): a gateway's graceful stop
keeps the upstream tasks of its gateway tasks, so the restarted gateway resumes them.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import anyio
import anyio.to_thread
import mcp.types as types
import pydantic
from mcp import MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession

from breakwater._clock import Clock, SystemClock
from breakwater._wire import OPERATION_ID_META_KEY as _OPERATION_ID_META_KEY
from breakwater.connect._raw_call import ServerReplyError
from breakwater.errors import CallCancelledError, CallError, CallTimeoutError, OutcomeUnknownError, UpstreamError
from breakwater.gate._classify import RetryClass, answer_of
from breakwater.gate._turn_budget import current_budget
from breakwater.status import ServerState
from breakwater.tasks._store import PendingTask, TaskStore
from breakwater.tasks._wire import (
    TASKS_EXTENSION,
    CancelTaskRequest,
    GetTaskRequest,
    TaskAck,
    TaskHandle,
    TaskIdParams,
    TaskState,
)

if TYPE_CHECKING:
    from breakwater.connect._upstream import Upstream

__all__ = [
    "CLIENT_EXTENSION",
    "TASK_CALL",
    "TASK_OWNER",
    "TaskCall",
    "TaskOwner",
    "TaskRuntime",
]

logger = logging.getLogger("breakwater.tasks")


#: Poll interval when the server suggests none.
DEFAULT_POLL_S = 1.0
#: Never poll faster than this, whatever the server says (a 0 ms hint would be a busy loop).
MIN_POLL_S = 0.01
#: Each wait is the server's interval times a factor in [1, 1 + POLL_JITTER): many clients that
#: started tasks together drift apart instead of polling in lock-step, and none polls early.
POLL_JITTER = 0.1
#: After a failed poll the wait doubles per failure in a row, up to this.
MAX_ERROR_BACKOFF_S = 10.0
#: Each poll request gets at least this long, however tight the tool's attempt timeout.
MIN_POLL_TIMEOUT_S = 1.0
#: The longest `tasks/cancel` may take when the deadline passed or the caller gave up.
CANCEL_BOUND_S = 5.0
#: Task ids this runtime sent `tasks/cancel` for, remembered (the latest this many) so that a task it later sees
#: `cancelled` is not reported as the server's own doing.
_CANCELS_REMEMBERED = 1024

_TERMINAL = frozenset({"completed", "failed", "cancelled"})


# ---- wire shapes --------------------------------------------------------------------------------


# ---- the persisted record -----------------------------------------------------------------------


# ---- one attempt's context ------------------------------------------------------------------------


class TaskCall(NamedTuple):
    """What the resolver needs about the gate's attempt, in case the server turns it into a task.

    A tuple: the gate makes one per attempt, and almost none become tasks.
    """

    runtime: TaskRuntime
    upstream: Upstream
    tool: str
    #: The attempt's `_meta` (it carries the operation id).
    meta: Mapping[str, Any] | None
    retry_class: RetryClass
    #: The attempt's timeout: each poll request gets this long (at least MIN_POLL_TIMEOUT_S).
    timeout_s: float
    #: The longest the task is polled without a turn budget (`call.task_max_s`).
    max_s: float
    #: The gate's attempt, told once the call has become a task (see `AttemptHandle`).
    attempt: AttemptHandle


class AttemptHandle(Protocol):
    """The gate's side of an attempt that became a task (`breakwater.gate._attempt.AttemptDeadline`)."""

    def became_task(self, task_id: str) -> None:
        """The server answered with the handle of task `task_id`: lift the attempt's deadline; time the attempt up to here."""
        ...


@dataclass(eq=False)
class TaskOwner:
    """Who waits on a call besides its caller (a gateway task, by its id), and what became of the call.

    Set in `TASK_OWNER` around the call; an upstream task the call becomes is persisted with `id` as its owner.
    """

    id: str
    #: The upstream task the gate follows for this owner right now (None: a plain call so far, or over).
    following: PendingTask | None = None
    #: Leave the upstream task running and its row kept, whatever ends the follow in this process (a graceful stop:
    #: the next gateway process resumes it, `breakwater.gateway._drain`); a downstream `tasks/cancel` clears it first.
    kept: bool = False

    def keep(self) -> bool:
        """From now on keep the call's upstream task (above), should it be or become one; True if it follows one now."""
        self.kept = True
        return self.following is not None


#: Set by the gate around each attempt's `tools/call`; read by the claim's resolver.
TASK_CALL: ContextVar[TaskCall | None] = ContextVar("breakwater_task_call", default=None)
#: Set by whoever waits on a call besides its caller (a gateway task); its id is persisted with the task.
TASK_OWNER: ContextVar[TaskOwner | None] = ContextVar("breakwater_task_owner", default=None)


class _Transient(Exception):
    """A poll that failed for a reason another poll may not meet."""


class TaskRuntime:
    """Polls, cancels and persists the tasks of one `Breakwater` instance (see the module docstring)."""

    def __init__(self, *, clock: Clock, rng: random.Random, store: TaskStore | None) -> None:
        self._clock = clock
        self._rng = rng
        #: Where started tasks are remembered; None keeps nothing (no resume after a restart).
        self.store = store
        #: Set while the owning `Breakwater` shuts down: tasks are then left running and remembered.
        self.closing = False
        self._cancels_sent: OrderedDict[str, None] = OrderedDict()

    @property
    def clock(self) -> Clock:
        """The clock that paces polls and bounds tasks."""
        return self._clock

    @property
    def rng(self) -> random.Random:
        """The source of the polls' jitter."""
        return self._rng

    def attempt(
        self,
        upstream: Upstream,
        tool: str,
        meta: Mapping[str, Any] | None,
        retry_class: RetryClass,
        timeout_s: float,
        max_s: float,
        attempt: AttemptHandle,
    ) -> TaskCall:
        """The context of one gate attempt, for `TASK_CALL`."""
        return TaskCall(self, upstream, tool, meta, retry_class, timeout_s, max_s, attempt)

    # ---- following a task to its end ---------------------------------------------------------------

    async def follow(self, call: TaskCall, handle: TaskHandle) -> types.CallToolResult:
        """Poll the task `handle` names until it ends, the deadline passes or the caller cancels."""
        clock = self._clock
        now, wall = clock.monotonic(), clock.time()
        deadline, cut_by = now + call.max_s, "task_max_s"
        budget = current_budget()
        if budget is not None and budget.deadline <= deadline:
            deadline, cut_by = budget.deadline, "turn budget"
        # The attempt's timeout bounded getting the handle; from here on the task's deadline does.
        call.attempt.became_task(handle.task_id)
        op_id = call.meta.get(_OPERATION_ID_META_KEY) if call.meta else None
        owner = TASK_OWNER.get()
        pending = PendingTask(
            server=call.upstream.spec.name,
            tool=call.tool,
            task_id=handle.task_id,
            operation_id=op_id if isinstance(op_id, str) else None,
            retry_class=call.retry_class.value,
            started_at=wall,
            deadline_at=wall + (deadline - now),
            owner=owner.id if owner is not None else None,
        )
        await self._store(self.store.add if self.store else None, pending)
        poll_timeout_s = max(call.timeout_s, MIN_POLL_TIMEOUT_S)
        interval_s = _interval(handle.poll_interval_ms)
        return await self._follow(call.upstream, pending, deadline, cut_by, poll_timeout_s, interval_s, immediate=False)

    async def resume(self, upstream: Upstream, pending: PendingTask, *, poll_timeout_s: float) -> types.CallToolResult:
        """Poll a remembered task again (after a restart), until it ends or its deadline passes.

        Raises the `CallError` the gate would have (an `MCPError` of a failed task becomes a
        non-retryable UPSTREAM_ERROR naming its code).
        """
        clock = self._clock
        now = clock.monotonic()
        deadline, cut_by = now + (pending.deadline_at - clock.time()), "deadline set when it started"
        budget = current_budget()
        if budget is not None and budget.deadline <= deadline:
            deadline, cut_by = budget.deadline, "turn budget"
        try:
            return await self._follow(
                upstream, pending, deadline, cut_by, max(poll_timeout_s, MIN_POLL_TIMEOUT_S), DEFAULT_POLL_S, immediate=True
            )
        except CallError as err:
            if err.detail.get("reason") == "task_lost" and _process_since(upstream, pending):
                raise _server_gone(pending) from err
            raise
        except MCPError as exc:
            raise UpstreamError(
                f"The task failed on the server with a protocol error ({exc.code}: {exc.message}).",
                retryable=False,
                detail={"task_id": pending.task_id, "upstream_code": exc.code, "upstream_message": exc.message[:500]},
            ) from exc

    async def _follow(
        self,
        upstream: Upstream,
        pending: PendingTask,
        deadline: float,
        cut_by: str,
        poll_timeout_s: float,
        interval_s: float,
        *,
        immediate: bool,
    ) -> types.CallToolResult:
        owner = TASK_OWNER.get()
        if owner is not None:
            owner.following = pending
        forget = True
        ended = False  # the task reached an end the server keeps for its ttl (completed, failed, cancelled)
        started = self._clock.monotonic()
        try:
            with self._clock.deadline_scope(deadline):
                try:
                    result = await self._until_done(upstream, pending, poll_timeout_s, interval_s, immediate=immediate)
                except (ServerReplyError, CallCancelledError):
                    ended = True
                    raise
                ended = True
                return result
            sent = await self.cancel(upstream, pending.task_id)
            raise _cut(pending, cut_by, sent, self._clock.monotonic() - started)
        except anyio.get_cancelled_exc_class():
            if self.closing or (owner is not None and owner.kept):
                # Shutting down, not giving up: leave the task running and remembered for the next start.
                forget = False
            else:
                await self.cancel(upstream, pending.task_id)
            raise
        finally:
            if owner is not None:
                owner.following = None
                # A kept task that ended during a graceful stop: its outcome is in this process's memory only, so
                # the row stays and the next process answers it again from the server's record.
                forget = forget and not (ended and owner.kept)
            if forget:
                await self._store(self.store.remove if self.store else None, pending.server, pending.task_id)

    async def _until_done(
        self, upstream: Upstream, pending: PendingTask, poll_timeout_s: float, interval_s: float, *, immediate: bool
    ) -> types.CallToolResult:
        errors = 0
        wait = 0.0 if immediate else interval_s
        while True:
            if wait > 0:
                await self._clock.sleep(wait * self._rng.uniform(1.0, 1.0 + POLL_JITTER))
            try:
                state = await self._get(upstream, pending, poll_timeout_s)
            except _Transient as why:
                errors += 1
                logger.debug("poll of task %s on %s failed (%s); polling again", pending.task_id, pending.server, why)
                wait = min(max(interval_s, MIN_POLL_S) * 2**errors, max(MAX_ERROR_BACKOFF_S, interval_s))
                continue
            errors = 0
            if state.poll_interval_ms is not None:
                interval_s = _interval(state.poll_interval_ms)
            wait = interval_s
            if state.status == "completed":
                try:
                    return types.CallToolResult.model_validate(state.result or {})
                except pydantic.ValidationError as exc:
                    raise _broken(pending, "the completed task's result is not a CallToolResult") from exc
            if state.status == "failed":
                raise _failure(state.error)
            if state.status == "cancelled":
                ours = pending.task_id in self._cancels_sent
                by = "breakwater" if ours else "server"
                raise CallCancelledError(
                    "Breakwater had asked the server to cancel the task, and it did."
                    if ours
                    else "The server cancelled the task before it finished.",
                    detail={"task_id": pending.task_id, "task_status": "cancelled", "cancelled_by": by},
                )
            if state.status == "input_required":
                await self.cancel(upstream, pending.task_id)
                raise UpstreamError(
                    "The task asked for input (elicitation or sampling), which breakwater does not relay; it was cancelled.",
                    retryable=False,
                    detail={"task_id": pending.task_id, "task_status": "input_required"},
                )

    async def ready_session(self, upstream: Upstream) -> ClientSession:
        """The upstream's current session, waiting (within the task's deadline) for it to be ready."""
        while True:
            client = upstream.client
            if upstream.state is ServerState.READY and client is not None:
                return client.session
            if upstream.state is ServerState.READY:
                await self._clock.sleep(MIN_POLL_S)  # between a drop and its report: a moment
            else:
                await upstream.ready_event.wait()

    async def _get(self, upstream: Upstream, pending: PendingTask, timeout_s: float) -> TaskState:
        session = await self.ready_session(upstream)
        request = GetTaskRequest(params=TaskIdParams(task_id=pending.task_id))
        try:
            with self._clock.deadline_scope(self._clock.monotonic() + timeout_s):
                return await session.send_request(request, TaskState)
        except MCPError as exc:
            if exc.code == types.INVALID_PARAMS:
                raise _lost(pending, exc.message) from exc
            if exc.code == types.CONNECTION_CLOSED and answer_of(exc, upstream) is exc:  # not the server's own -32000
                upstream.report_lost()
            # Timeouts, a lost connection, a server hiccup, or a server that restarted and forgot the
            # HTTP session: another poll (on the reconnected session) may well get an answer.
            terminated = exc.code == types.INVALID_REQUEST and "session terminated" in exc.message.lower()
            if exc.code in (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT, types.INTERNAL_ERROR) or terminated:
                raise _Transient(f"{exc.code}: {exc.message}") from exc
            raise _broken(pending, f"tasks/get answered {exc.code}: {exc.message}") from exc
        except pydantic.ValidationError as exc:
            raise _broken(pending, "tasks/get answered something that is not a task") from exc
        except (Exception, BaseExceptionGroup) as exc:
            if isinstance(exc, BaseExceptionGroup) and exc.subgroup(anyio.get_cancelled_exc_class()) is not None:
                raise  # a cancellation beside a transport failure is still a cancellation
            # Transport failures (httpx2 errors, closed streams, often inside exception groups).
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        # Only the poll's own deadline scope ends the block without a return.
        raise _Transient("no answer within the poll timeout")

    async def cancel(self, upstream: Upstream, task_id: str) -> bool:
        """Send `tasks/cancel` (shielded, bounded); True if the server acknowledged it.

        The same request on both revisions; a 2025-11-25 server answers with the task, which reads as the ack."""
        client = upstream.client
        if client is None or upstream.state is not ServerState.READY:
            return False
        request = CancelTaskRequest(params=TaskIdParams(task_id=task_id))
        self._cancels_sent[task_id] = None
        while len(self._cancels_sent) > _CANCELS_REMEMBERED:
            self._cancels_sent.popitem(last=False)
        with anyio.CancelScope(shield=True), self._clock.deadline_scope(self._clock.monotonic() + CANCEL_BOUND_S):
            try:
                await client.session.send_request(request, TaskAck)
                return True
            except (Exception, BaseExceptionGroup):
                logger.debug("tasks/cancel of %s on %s failed", task_id, upstream.spec.name, exc_info=True)
        return False

    async def _store(self, op: Any, *args: Any) -> None:
        if op is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(op, *args)
            except Exception:
                # A task is polled whether or not it could be remembered (a full disk, a loop shutting
                # down its worker threads); only resuming needs the row.
                logger.warning("could not update the task table", exc_info=True)


def _interval(ms: int | None) -> float:
    return DEFAULT_POLL_S if ms is None else max(MIN_POLL_S, ms / 1000)


def _failure(error: Mapping[str, Any] | None) -> MCPError:
    """The JSON-RPC error of a failed task, as the exception the gate classifies: the server's, whatever its code
    (`ServerReplyError`: a -32000 or -32001 of its own is no lost connection or timeout of ours)."""
    error = error or {}
    code = error.get("code")
    message = error.get("message")
    code = code if isinstance(code, int) and not isinstance(code, bool) else types.INTERNAL_ERROR
    message = message if isinstance(message, str) and message else "the task failed"
    return ServerReplyError(code=code, message=message, data=error.get("data"))


def _lost(pending: PendingTask, why: str) -> CallError:
    detail = {"task_id": pending.task_id, "reason": "task_lost", "upstream_message": why[:500]}
    if pending.retry_class == RetryClass.NEVER.value:
        return OutcomeUnknownError(
            "The server no longer knows the task (it expired or the server restarted), so whether it took effect is unknown.",
            detail=detail,
        )
    return UpstreamError(
        "The server no longer knows the task (it expired or the server restarted); its result is lost.",
        retryable=True,
        detail=detail,
    )


def _process_since(upstream: Upstream, pending: PendingTask) -> bool:
    """Whether `upstream` is a stdio server whose current process started after the task did (so the task ran on
    another process, now gone: a session's own server ends with its session, every one with its gateway)."""
    began = upstream.attempt_started_at
    return upstream.spec.transport == "stdio" and began is not None and began > pending.started_at


def _server_gone(pending: PendingTask) -> CallError:
    detail = {"task_id": pending.task_id, "reason": "task_server_gone"}
    gone = (
        "The task ran on an earlier process of this stdio server, which has exited (a session's own server process "
        "ends with its session, and every one with the gateway that started it); the current process does not know it"
    )
    if pending.retry_class == RetryClass.NEVER.value:
        return OutcomeUnknownError(f"{gone}, so whether it took effect is unknown.", detail=detail)
    return UpstreamError(f"{gone}; its result is lost.", retryable=True, detail=detail)


def _broken(pending: PendingTask, why: str) -> CallError:
    return UpstreamError(
        f"The server's task could not be followed: {why}.",
        retryable=False,
        detail={"task_id": pending.task_id, "reason": "task_protocol_error"},
    )


def _cut(pending: PendingTask, cut_by: str, cancel_sent: bool, elapsed_s: float) -> CallError:
    detail = {
        "task_id": pending.task_id,
        "cut_by": cut_by,
        "task_cancel_sent": cancel_sent,
        "elapsed_s": round(elapsed_s, 3),
    }
    what = "the turn budget" if cut_by == "turn budget" else "its time limit"
    if pending.retry_class == RetryClass.NEVER.value:
        return OutcomeUnknownError(
            f"The task did not finish within {what}; breakwater asked the server to cancel it, "
            "but it may already have taken effect.",
            detail=detail,
        )
    # Not retried by the gate: another attempt would need as long again.
    return CallTimeoutError(
        f"The task did not finish within {what} and breakwater asked the server to cancel it.", retryable=False, detail=detail
    )


# ---- the SDK extension --------------------------------------------------------------------------


async def _follow_plain(session: ClientSession, handle: TaskHandle, clock: Clock) -> types.CallToolResult:
    """A task met outside a gate attempt (e.g. the gate's own `get_operation` question): poll it on
    this session until it ends; the caller's own scope bounds it, and cancelling cancels the task."""
    request = GetTaskRequest(params=TaskIdParams(task_id=handle.task_id))
    interval = _interval(handle.poll_interval_ms)
    try:
        while True:
            await clock.sleep(interval)
            state = await session.send_request(request, TaskState)
            interval = _interval(state.poll_interval_ms) if state.poll_interval_ms is not None else interval
            if state.status == "completed":
                return types.CallToolResult.model_validate(state.result or {})
            if state.status in _TERMINAL:
                raise _failure(state.error or {"code": types.INTERNAL_ERROR, "message": f"the task ended {state.status}"})
    except anyio.get_cancelled_exc_class():
        with (
            anyio.CancelScope(shield=True),
            # Real time: cleanup while being cancelled must end even when no one moves a fake clock.
            anyio.move_on_after(CANCEL_BOUND_S),  # noqa: TID251 - cleanup bound
            contextlib.suppress(Exception, BaseExceptionGroup),
        ):
            await session.send_request(CancelTaskRequest(params=TaskIdParams(task_id=handle.task_id)), TaskAck)
        raise


class TasksClientExtension(ClientExtension):
    """Declares the tasks extension and resolves task handles (see the module docstring)."""

    identifier = TASKS_EXTENSION

    def __init__(self, *, clock: Clock | None = None) -> None:
        """`clock` paces the polling of tasks met outside a gate attempt (default: the real clock)."""
        self._clock: Clock = clock or SystemClock()

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self._resolve)]

    async def _resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        call = TASK_CALL.get()
        if call is None:
            return await _follow_plain(ctx.session, handle, self._clock)
        return await call.runtime.follow(call, handle)


#: An instance on the real clock, for clients built outside a `Breakwater` (which makes its own on its clock).
CLIENT_EXTENSION = TasksClientExtension()
