"""The gateway as a task-capable server: downstream clients that declare the tasks extension get tasks.

The simplest honest design: the gateway is itself a `breakwater.tasks._server.TaskSupport` server for every
upstream tool. A downstream `tools/call` that declares `io.modelcontextprotocol/tasks` (on a
2026-07-28 connection) runs the gateway's ordinary call handler as a gateway task, through the
call gate, which itself follows the upstream's task if the upstream made one (polling, budget,
`tasks/cancel`). If the call ends within `SYNC_WINDOW_S` the downstream simply gets the result (a
quick tool must not cost a poll interval); otherwise it gets the gateway's task handle and polls
the gateway's `tasks/get`; its `tasks/cancel` cancels the gate call, which cancels the upstream
task. A downstream that does not declare the extension gets the ordinary synchronous call: the
gate resolves any upstream task itself and answers with the final result.

The built-in search and status tools answer at once, never as tasks. Progress notifications reach
the downstream while its request is open; once it has been answered with a task handle they are
dropped (the extension has no progress for tasks).

Restarts: the gate persists each upstream task with the gateway task's id as its owner. A
downstream that polls a gateway task id no session of this process was given is looked up there; if
found, the gateway adopts the id and resumes polling the upstream task (`Breakwater.resume_task`), so
the client that started the call before the restart gets its result. A gateway task whose call had
not become an upstream task is lost with the process (-32602, as the spec allows). A graceful stop
(`breakwater.gateway._drain`) leaves the upstream tasks of gateway tasks running and remembered
(`TaskOwner.keep`), as a killed process does, and answers their polls while it drains.

Sessions: every id this process issues or adopts is in one process-wide registry (`_ISSUED`), with
the downstream session it was issued to when requests come on a session (stdio, and each session
attached to a shared gateway); `serve --http`'s 2026-07-28 requests carry no session, and all its
clients hold its one bearer token, the spec's binding principal, so there an id is a bearer handle.
A `tasks/*` request naming an id issued to another live session is answered -32602, as an unknown
id, and touches nothing; an id whose session ended is taken over by the session that asks for it.

Record lifetime: a gateway task's `ttlMs` (the spec's retention from creation) is at least the
longest `call.task_max_s` in force plus `RESULT_KEPT_S`, so a record never expires, cancelling its
call, while the gate may still be following the upstream task, and its result stays readable a while.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio.to_thread
import mcp.types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.session import ServerSession

from breakwater.gate._tasks import TASK_OWNER, TaskOwner
from breakwater.tasks._server import (
    EXTENSION_ID,
    TaskIdParams,
    TaskInfo,
    TaskSupport,
    declared_tasks,
    unknown_task,
)
from breakwater.tasks._store import PendingTask

if TYPE_CHECKING:
    from mcp.server.lowlevel.server import Server

    from breakwater._breakwater import Breakwater
    from breakwater.config import Config

__all__ = ["GatewayTasks", "gateway_task_ttl_s", "issued_here", "keep_resumed", "when_ended"]

logger = logging.getLogger("breakwater.gateway")

#: The least a gateway task's record (and result) is kept from its creation.
GATEWAY_TASK_TTL_S = 3600.0
#: How long a gateway task's result stays readable after the longest task the config allows could end.
RESULT_KEPT_S = 600.0
#: The poll interval the gateway suggests downstream (it polls upstream at the upstream's own pace).
GATEWAY_POLL_INTERVAL_S = 1.0
#: A call that ends within this long is answered directly; only slower ones become gateway tasks.
SYNC_WINDOW_S = 1.0

_Handler = Callable[[ServerRequestContext[Any], Any], Awaitable[HandlerResult]]


def gateway_task_ttl_s(config: Config) -> float:
    """A gateway task's record lifetime: `GATEWAY_TASK_TTL_S`, or longer than any task the config lets the gate follow."""
    longest = config.call.task_max_s
    for spec in config.servers:
        longest = max(longest, spec.call.task_max_s, *(tool.call.task_max_s for tool in spec.tools.values()))
    return max(GATEWAY_TASK_TTL_S, longest + RESULT_KEPT_S)


@dataclasses.dataclass(eq=False)
class _Issued:
    """A gateway task id this process issued or adopted."""

    tasks: GatewayTasks
    info: TaskInfo
    owner: TaskOwner
    #: The downstream session's channel it is bound to; None where requests carry no session (2026-07-28 HTTP).
    session: object | None
    #: An adopted id, resumed from the task table (its follow is no call in flight for a drain).
    resumed: bool = False


#: Every gateway task id this process issued or adopted and still keeps, across the sessions of a shared gateway
#: (each of which may have a `GatewayTasks` of its own): who may poll it, and whether an id is this process's at all.
_ISSUED: dict[str, _Issued] = {}


def issued_here(task_id: object) -> bool:
    """Whether `task_id` names a gateway task this process issued or adopted (a drain still answers polls of those)."""
    return isinstance(task_id, str) and task_id in _ISSUED


def when_ended(task_id: str, callback: Callable[[TaskInfo], None]) -> bool:
    """Call `callback` with the gateway task `task_id` once it ends (at once if it has); False if no such task here."""
    issued = _ISSUED.get(task_id)
    if issued is None:
        return False
    issued.info.on_end(callback)
    return True


def keep_resumed() -> None:
    """A graceful stop began: leave the upstream tasks of adopted gateway tasks running and remembered (`TaskOwner.keep`).

    Adopted tasks are resumed outside any call, so the drain does not see them among its calls in flight."""
    for issued in list(_ISSUED.values()):
        if issued.resumed:
            issued.owner.keep()


def _session_of(ctx: ServerRequestContext[Any]) -> object | None:
    """The downstream session a request came on, as the object that lives as long as it: the connection's channel.

    On a 2026-07-28 stdio connection the SDK makes a `Connection` per request but one channel per stream; a 2026-07-28
    HTTP request has no channel (None: no session). The SDK keeps the connection without a public accessor."""
    connection = getattr(ctx.session, "_connection", None)
    if connection is None or not getattr(connection, "has_standalone_channel", False):
        return None
    return cast(object, connection.outbound)


def _ended(session: object) -> bool:
    """Whether the session whose channel is `session` is over (its dispatcher closed)."""
    dispatcher = getattr(session, "_outbound", session)
    return bool(getattr(dispatcher, "_closed", False))


def _sweep() -> None:
    """Forget ids whose record is gone (expired, or answered within the sync window)."""
    kept: dict[int, dict[str, TaskInfo]] = {}
    for task_id, issued in list(_ISSUED.items()):
        support = issued.tasks.support
        records = kept.get(id(support))
        if records is None:
            records = kept[id(support)] = {task.task_id: task for task in support.all()}  # one purge per support
        if records.get(task_id) is not issued.info:
            del _ISSUED[task_id]


class _ProgressUntilHandle:
    """A request's session whose progress reports stop once the request was answered with a task handle."""

    def __init__(self, session: ServerSession) -> None:
        self._session = session
        self.open = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.open:
            await self._session.report_progress(progress, total, message)


class GatewayTasks:
    """Installs the tasks extension on a `Gateway`'s server (see the module docstring)."""

    def __init__(self, server: Server[Any], *, bw: Breakwater, builtin_tools: frozenset[str]) -> None:
        """Install on `server`; the built-in tools (search, status) always answer at once, never as tasks."""
        self._bw = bw
        self._builtin_tools = builtin_tools
        ttl_s = gateway_task_ttl_s(bw.config)
        self.support = TaskSupport(all_tools=True, ttl_s=ttl_s, poll_interval_s=GATEWAY_POLL_INTERVAL_S)
        entry = server.get_request_handler("tools/call")
        assert entry is not None, "the gateway registers tools/call"
        self._call: _Handler = entry.handler
        server.add_request_handler("tools/call", types.CallToolRequestParams, self._on_call_tool)
        for binding in self.support.methods():
            server.add_request_handler(binding.method, binding.params_type, self._bound(binding.method, binding.handler))
        server.extensions[EXTENSION_ID] = self.support.settings()

    async def _on_call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> HandlerResult:
        if not declared_tasks(ctx) or params.name in self._builtin_tools:
            return await self._call(ctx, params)
        session = _ProgressUntilHandle(ctx.session)
        quiet = dataclasses.replace(ctx, session=cast(ServerSession, session))
        owner = TaskOwner("")

        async def work() -> HandlerResult:
            # The gate persists an upstream task with this gateway task as its owner (for restarts).
            TASK_OWNER.set(owner)
            return await self._call(quiet, params)

        task = self.support.start(params.name, work)
        owner.id = task.task_id
        self._issue(task, owner, _session_of(ctx))
        try:
            answer = await self.support.answer(task, SYNC_WINDOW_S)
        except BaseException:
            owner.kept = False  # the request itself was cancelled: so is its task, upstream too
            _ISSUED.pop(task.task_id, None)
            raise
        session.open = not (isinstance(answer, dict) and answer.get("resultType") == "task")
        if session.open:
            _ISSUED.pop(task.task_id, None)  # answered directly: the client never learned the id
        return answer

    def _issue(self, task: TaskInfo, owner: TaskOwner, session: object | None, *, resumed: bool = False) -> None:
        _sweep()
        _ISSUED[task.task_id] = _Issued(self, task, owner, session, resumed)

    def _bound(self, method: str, handler: _Handler) -> _Handler:
        """`handler` for tasks/*, for ids this session may see; an id this process never issued is adopted first."""

        async def handle(ctx: ServerRequestContext[Any], params: TaskIdParams) -> HandlerResult:
            if not declared_tasks(ctx):
                return await handler(ctx, params)  # the spec's -32021
            task_id = params.task_id
            issued = await self._owned(task_id, _session_of(ctx))
            if issued is None:
                await self._adopt(task_id, _session_of(ctx))
                issued = await self._owned(task_id, _session_of(ctx))
            if issued is not None and method == "tasks/cancel":
                issued.owner.kept = False  # asked to stop it: cancelled upstream too, even while the gateway drains
            return await handler(ctx, params)

        return handle

    async def _owned(self, task_id: str, session: object | None) -> _Issued | None:
        """The registry's entry for `task_id` if this session may use it; raises -32602 if another live session holds it."""
        issued = _ISSUED.get(task_id)
        if issued is None:
            return None
        if issued.session is not None and issued.session is not session:
            if not _ended(issued.session):
                raise unknown_task(task_id)  # another live session's: as if unknown, and nothing done
            if issued.tasks is not self:
                # Issued in a session that had servers of its own and ended with them: adopted anew from the table.
                del _ISSUED[task_id]
                return None
            issued.session = session  # its session ended; the client came back on this one
        if issued.tasks is not self:
            raise unknown_task(task_id)
        return issued

    async def _adopt(self, task_id: str, session: object | None) -> None:
        bw = self._bw
        store = bw.tasks.store
        if store is None:
            return
        pending: PendingTask | None = await anyio.to_thread.run_sync(store.by_owner, task_id)
        if pending is None or task_id in _ISSUED or self.support.get(task_id) is not None:
            return
        logger.info("resuming upstream task %s on %s for gateway task %s", pending.task_id, pending.server, task_id)
        owner = TaskOwner(task_id)

        async def resume() -> types.CallToolResult:
            TASK_OWNER.set(owner)
            return await bw.resume_task(pending.task_id, server=pending.server)

        self._issue(self.support.start(pending.tool, resume, task_id=task_id), owner, session, resumed=True)
