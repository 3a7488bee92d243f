"""Long-running tools as tasks: the 2026-07-28 `io.modelcontextprotocol/tasks` extension, for server authors.

A tool that takes minutes must not hold a request open for minutes. Pass a `TaskSupport` to an SDK
`MCPServer` and name the tools it covers::

    from mcp.server.mcpserver import MCPServer
    from breakwater.tasks._server import TaskSupport

    tasks = TaskSupport(tools=["render_video"], poll_interval_s=2)
    mcp = MCPServer("studio", extensions=[tasks])

    @mcp.tool()
    async def render_video(scene: str) -> str: ...

A `tools/call` of `render_video` from a client that declared the extension on that request (a
2026-07-28 connection) is answered at once with a task handle (`resultType: "task"`, `taskId`,
`status`, `createdAt`, `lastUpdatedAt`, `ttlMs`, `pollIntervalMs`); the tool runs in the background
and the client polls `tasks/get` until the task is `completed` (the tool's result inlined, an
`isError` result included), `failed` (a JSON-RPC error the tool raised as `MCPError`) or
`cancelled`. Any other client gets the ordinary synchronous call, except for tools named in
`required`, which answer -32021 (missing required client capability) instead.

What the helper keeps, and why:

* Task records live in this process's memory for `ttl_s` from creation (then `tasks/get` says
  -32602, as for an id it never issued). They are deliberately not written to a database: the work
  itself is a coroutine of this process, so after a restart a stored record could only ever say
  "lost" — which a client already learns from -32602, and breakwater's client then reports as an
  outcome it cannot confirm. A tool whose side effect must survive restarts should also be
  `breakwater.idempotency.idempotent`: its operation record is durable, and a re-sent call with
  the same operation id gets the stored outcome instead of running twice.
* `tasks/cancel` is cooperative, as the spec says: the tool's coroutine is cancelled at its next
  `await`; if it finishes first (or swallows the cancellation) the task ends `completed`.
* `tasks/update` is acknowledged but has nothing to deliver to: tools run by this helper never
  enter `input_required` (a tool that needs the user should ask before the task starts).
* Progress notifications are not sent for tasks (the extension does not support them): the
  request they would belong to has already been answered.
* Task ids are 128-bit random values, unguessable, so they can act as bearer handles. A server
  behind authentication should still check that the caller of `tasks/*` may see the task (the
  spec's auth-binding rule), e.g. in its own middleware.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from breakwater._clock import Clock, SystemClock
from breakwater.status import iso

__all__ = [
    "EXTENSION_ID",
    "TERMINAL_STATUSES",
    "TaskInfo",
    "TaskStatus",
    "TaskSupport",
    "current_task_id",
    "declared_tasks",
    "missing_tasks_capability",
]

logger = logging.getLogger("breakwater.tasks")

#: The extension's identifier, in `capabilities.extensions` and in each request's client capabilities.
EXTENSION_ID = "io.modelcontextprotocol/tasks"
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
#: Statuses a task never leaves.
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
_CURRENT_TASK: ContextVar[str | None] = ContextVar("breakwater_current_task", default=None)


def current_task_id() -> str | None:
    """The id of the task the running code belongs to (inside a tool run as a task), else None."""
    return _CURRENT_TASK.get()


class TaskIdParams(types.RequestParams):
    """Params of `tasks/get` and `tasks/cancel`."""

    task_id: str


class UpdateTaskParams(TaskIdParams):
    """Params of `tasks/update`."""

    input_responses: dict[str, Any] | None = None


def declared_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the tasks extension (only a 2026-07-28 request can)."""
    if ctx.protocol_version not in _MODERN:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return bool(extensions) and EXTENSION_ID in (extensions or {})


def missing_tasks_capability(what: str) -> MCPError:
    """The spec's -32021 for a request that needs the tasks extension its client did not declare."""
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Missing required client capability: {what} needs the {EXTENSION_ID} extension",
        data={"requiredCapabilities": {"extensions": {EXTENSION_ID: {}}}},
    )


def unknown_task(task_id: str, *, expired: bool = False) -> MCPError:
    """The spec's -32602 for a task id the server does not (or no longer) know."""
    why = "Task has expired" if expired else "Task not found"
    return MCPError(code=types.INVALID_PARAMS, message=f"Failed to retrieve task: {why}", data={"taskId": task_id})


@dataclass(kw_only=True)
class TaskInfo:
    """One task as the server sees it (read it with `TaskSupport.get()`)."""

    task_id: str
    tool: str
    status: TaskStatus
    created_at: float
    last_updated_at: float
    #: Seconds from creation the record is kept (None: until the process ends).
    ttl_s: float | None
    poll_interval_s: float
    status_message: str | None = None
    #: The final `CallToolResult` (wire JSON), once `completed`.
    result: dict[str, Any] | None = None
    #: The JSON-RPC error, once `failed`.
    error: dict[str, Any] | None = None
    #: `tasks/get` requests answered for this task.
    polls: int = 0
    cancel_requested: bool = False
    _created_mono: float = 0.0
    _runner: asyncio.Task[None] | None = field(default=None, repr=False)
    _done: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _on_end: list[Callable[[TaskInfo], None]] = field(default_factory=list, repr=False)

    @property
    def terminal(self) -> bool:
        """True once the task is completed, failed or cancelled."""
        return self.status in TERMINAL_STATUSES

    def on_end(self, callback: Callable[[TaskInfo], None]) -> None:
        """Call `callback(task)` once the task's work is over and its status settled (at once if it is already)."""
        if self._done.is_set():
            callback(self)
        else:
            self._on_end.append(callback)

    def wire(self) -> dict[str, Any]:
        """The `Task` object of the spec: what the handle and `tasks/get` carry (plus the inlined outcome)."""
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": iso(self.created_at),
            "lastUpdatedAt": iso(self.last_updated_at),
            "ttlMs": None if self.ttl_s is None else round(self.ttl_s * 1000),
            "pollIntervalMs": max(1, round(self.poll_interval_s * 1000)),
        }
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        if self.status == "completed" and self.result is not None:
            out["result"] = self.result
        if self.status == "failed" and self.error is not None:
            out["error"] = self.error
        return out


class TaskSupport(Extension):
    """The tasks extension for an SDK `MCPServer`: pass it in `MCPServer(extensions=[...])`.

    `tools` run as tasks when the request declared the extension and synchronously otherwise
    (`all_tools=True`: every tool of the server); `required` tools run only as tasks (a request
    without the extension gets -32021). `ttl_s` is how long a task's record is kept from its
    creation (None: for the life of the process); `poll_interval_s` is the polling interval
    suggested to clients. With `sync_window_s`, a call that ends within that many seconds is
    answered directly and only slower ones become tasks (the spec lets the server decide per
    request). See the module docstring.
    """

    identifier = EXTENSION_ID

    def __init__(
        self,
        *,
        tools: Iterable[str] = (),
        required: Iterable[str] = (),
        all_tools: bool = False,
        ttl_s: float | None = 3600.0,
        poll_interval_s: float = 1.0,
        sync_window_s: float = 0.0,
        clock: Clock | None = None,
    ) -> None:
        if ttl_s is not None and not (ttl_s > 0 and math.isfinite(ttl_s)):
            raise ValueError(f"ttl_s must be a positive number of seconds or None, got {ttl_s!r}")
        if not (poll_interval_s > 0 and math.isfinite(poll_interval_s)):
            raise ValueError(f"poll_interval_s must be a positive number of seconds, got {poll_interval_s!r}")
        if not (sync_window_s >= 0 and math.isfinite(sync_window_s)):
            raise ValueError(f"sync_window_s must be zero or a positive number of seconds, got {sync_window_s!r}")
        self.sync_window_s = sync_window_s
        self.ttl_s = ttl_s
        self.poll_interval_s = poll_interval_s
        self._clock: Clock = clock or SystemClock()
        self._modes: dict[str, Literal["optional", "required"]] = {}
        self._all_tools = all_tools
        for name in tools:
            self.enable(name)
        for name in required:
            self.enable(name, required=True)
        self._tasks: dict[str, TaskInfo] = {}
        #: Tasks created since start (a counter for tests and metrics).
        self.created = 0

    def enable(self, tool: str, *, required: bool = False) -> None:
        """Make `tool` (its name as clients call it) task-capable; `required` refuses synchronous calls."""
        if not isinstance(tool, str) or not tool:
            raise ValueError(f"a tool name is a non-empty string, got {tool!r}")
        self._modes[tool] = "required" if required else "optional"

    def start(self, tool: str, work: Callable[[], Awaitable[HandlerResult]], *, task_id: str | None = None) -> TaskInfo:
        """Run `work` (which returns the tool's result) in the background as a new task, and return it.

        `intercept_tool_call` uses this for the tools it covers; call it yourself to run other work
        as a task (and answer the request with `await self.answer(task, 0)`: the handle). `task_id` adopts
        an id issued earlier (e.g. by a previous process whose client still polls it); by default a
        fresh unguessable one is made.
        """
        task = self._create(tool, task_id)
        # Recorded before the handle goes out, so a tasks/get right after it resolves (spec MUST).
        task._runner = asyncio.create_task(self._run(task, work), name=f"breakwater task {task.task_id}")
        return task

    def get(self, task_id: str) -> TaskInfo | None:
        """The task with this id, while its record is kept (None once expired or never issued)."""
        self._purge()
        return self._tasks.get(task_id)

    def all(self) -> list[TaskInfo]:
        """Every task whose record is kept, oldest first (for the server's own use: there is no tasks/list)."""
        self._purge()
        return list(self._tasks.values())

    # ---- the SDK extension hooks ------------------------------------------------------------------

    def methods(self) -> list[MethodBinding]:
        """The SDK extension's methods: tasks/get, tasks/update and tasks/cancel (2026-07-28 only)."""
        return [
            MethodBinding("tasks/get", TaskIdParams, self._on_get, protocol_versions=_MODERN),
            MethodBinding("tasks/update", UpdateTaskParams, self._on_update, protocol_versions=_MODERN),
            MethodBinding("tasks/cancel", TaskIdParams, self._on_cancel, protocol_versions=_MODERN),
        ]

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        """The SDK extension's tools/call hook: a call of a task tool, from a client that declared tasks, starts a task
        and is answered with its handle; any other call runs as it would without the extension."""
        mode = self._modes.get(params.name, "optional" if self._all_tools else None)
        if mode is None:
            return await call_next(ctx)
        if not declared_tasks(ctx):
            if mode == "required":
                raise missing_tasks_capability(f"the tool {params.name!r}")
            return await call_next(ctx)
        task = self.start(params.name, lambda: call_next(ctx))
        return await self.answer(task, self.sync_window_s)

    async def answer(self, task: TaskInfo, within_s: float) -> HandlerResult:
        """What to answer the request that started `task`: its own result if it ends within `within_s`
        (the record is then dropped: the client never learned the id), else the task handle.

        A task that failed within the window raises its JSON-RPC error, as a synchronous call would.
        If the request itself is cancelled while waiting, the task is cancelled too (no one could
        ever ask for it).
        """
        if within_s > 0:
            try:
                with self._clock.deadline_scope(self._clock.monotonic() + within_s):
                    await task._done.wait()
            except anyio.get_cancelled_exc_class():
                self._tasks.pop(task.task_id, None)
                if task._runner is not None:
                    task._runner.cancel()
                raise
            if task.terminal:
                self._tasks.pop(task.task_id, None)
                if task.status == "completed":
                    return task.result
                if task.status == "failed" and task.error is not None:
                    raise MCPError.from_error_data(types.ErrorData.model_validate(task.error))
                raise MCPError(code=types.INTERNAL_ERROR, message="the call was cancelled")
        return {"resultType": "task", **task.wire()}

    # ---- task lifecycle ----------------------------------------------------------------------------

    def _create(self, tool: str, task_id: str | None) -> TaskInfo:
        self._purge()
        now = self._clock.time()
        task = TaskInfo(
            task_id=task_id or secrets.token_hex(16),
            tool=tool,
            status="working",
            created_at=now,
            last_updated_at=now,
            ttl_s=self.ttl_s,
            poll_interval_s=self.poll_interval_s,
            _created_mono=self._clock.monotonic(),
        )
        self._tasks[task.task_id] = task
        self.created += 1
        return task

    def _settle(self, task: TaskInfo, status: TaskStatus, **changes: Any) -> None:
        task.status = status
        task.last_updated_at = self._clock.time()
        for key, value in changes.items():
            setattr(task, key, value)

    async def _run(self, task: TaskInfo, work: Callable[[], Awaitable[HandlerResult]]) -> None:
        _CURRENT_TASK.set(task.task_id)  # this asyncio task's own context: nothing leaks out
        try:
            result = await work()
        except asyncio.CancelledError:
            self._settle(task, "cancelled", status_message="The task was cancelled before it finished.")
            raise
        except MCPError as exc:
            # A JSON-RPC error is the one thing `failed` is for (a tool's isError result is `completed`).
            error = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
            self._settle(task, "failed", error=error, status_message=f"The tool failed: {exc.message}")
        except Exception:
            # Like the SDK's modern runner: the details stay in this server's log, never on the wire.
            logger.exception("task %s (%s) crashed", task.task_id, task.tool)
            error = {"code": types.INTERNAL_ERROR, "message": "Internal error"}
            self._settle(task, "failed", error=error, status_message="The tool crashed.")
        else:
            if isinstance(result, types.InputRequiredResult):
                error = {
                    "code": types.INTERNAL_ERROR,
                    "message": "the tool asked for input, which a task run by this helper cannot relay",
                }
                self._settle(task, "failed", error=error, status_message="The tool asked for input.")
            else:
                self._settle(task, "completed", result=_dump(result), status_message=None)
        finally:
            task._runner = None
            task._done.set()
            callbacks, task._on_end = task._on_end, []
            for callback in callbacks:
                try:
                    callback(task)
                except Exception:
                    logger.exception("a callback at the end of task %s failed", task.task_id)

    def _purge(self) -> None:
        now = self._clock.monotonic()
        for task_id, task in list(self._tasks.items()):
            if task.ttl_s is not None and now - task._created_mono >= task.ttl_s:
                del self._tasks[task_id]
                if task._runner is not None:
                    # Its record is gone, so no one could ever read the outcome: stop the work too.
                    task._runner.cancel()

    def _find(self, ctx: ServerRequestContext[Any, Any], task_id: str, method: str) -> TaskInfo:
        if not declared_tasks(ctx):
            raise missing_tasks_capability(method)
        known = task_id in self._tasks
        self._purge()
        task = self._tasks.get(task_id)
        if task is None:
            raise unknown_task(task_id, expired=known)
        return task

    async def _on_get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        task = self._find(ctx, params.task_id, "tasks/get")
        task.polls += 1
        return {"resultType": "complete", **task.wire()}

    async def _on_update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        # No task of this helper ever has outstanding inputRequests, so every response is for a key
        # that is not outstanding, which the spec says to ignore.
        self._find(ctx, params.task_id, "tasks/update")
        return {"resultType": "complete"}

    async def _on_cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        task = self._find(ctx, params.task_id, "tasks/cancel")
        if not task.terminal and task._runner is not None:
            task.cancel_requested = True
            task.status_message = "Cancellation requested."
            task.last_updated_at = self._clock.time()
            task._runner.cancel()
        return {"resultType": "complete"}


def _dump(result: HandlerResult) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        data = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    elif isinstance(result, Mapping):
        data = dict(result)
    else:
        data = {"content": []}
    # The inlined result is the original request's result shape, discriminator included.
    data.setdefault("resultType", "complete")
    return data
