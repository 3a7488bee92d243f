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
downstream that polls a gateway task id this process never issued is looked up there; if found,
the gateway adopts the id and resumes polling the upstream task (`Breakwater.resume_task`), so
the client that started the call before the restart gets its result. A gateway task whose call
had not become an upstream task is lost with the process (-32602, as the spec allows).
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

from breakwater.gate._tasks import TASK_OWNER
from breakwater.tasks._server import EXTENSION_ID, TaskIdParams, TaskSupport, current_task_id, declared_tasks
from breakwater.tasks._store import PendingTask

if TYPE_CHECKING:
    from mcp.server.lowlevel.server import Server

    from breakwater._breakwater import Breakwater

__all__ = ["GatewayTasks"]

logger = logging.getLogger("breakwater.gateway")

#: How long the gateway keeps a task's record (and result) from its creation.
GATEWAY_TASK_TTL_S = 3600.0
#: The poll interval the gateway suggests downstream (it polls upstream at the upstream's own pace).
GATEWAY_POLL_INTERVAL_S = 1.0
#: A call that ends within this long is answered directly; only slower ones become gateway tasks.
SYNC_WINDOW_S = 1.0

_Handler = Callable[[ServerRequestContext[Any], Any], Awaitable[HandlerResult]]


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
        self.support = TaskSupport(all_tools=True, ttl_s=GATEWAY_TASK_TTL_S, poll_interval_s=GATEWAY_POLL_INTERVAL_S)
        entry = server.get_request_handler("tools/call")
        assert entry is not None, "the gateway registers tools/call"
        self._call: _Handler = entry.handler
        server.add_request_handler("tools/call", types.CallToolRequestParams, self._on_call_tool)
        for binding in self.support.methods():
            server.add_request_handler(binding.method, binding.params_type, self._adopting(binding.handler))
        server.extensions[EXTENSION_ID] = self.support.settings()

    async def _on_call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> HandlerResult:
        if not declared_tasks(ctx) or params.name in self._builtin_tools:
            return await self._call(ctx, params)
        session = _ProgressUntilHandle(ctx.session)
        quiet = dataclasses.replace(ctx, session=cast(ServerSession, session))

        async def work() -> HandlerResult:
            # The gate persists an upstream task with this gateway task as its owner (for restarts).
            TASK_OWNER.set(current_task_id())
            return await self._call(quiet, params)

        answer = await self.support.answer(self.support.start(params.name, work), SYNC_WINDOW_S)
        session.open = not (isinstance(answer, dict) and answer.get("resultType") == "task")
        return answer

    def _adopting(self, handler: _Handler) -> _Handler:
        """`handler` for tasks/*, first adopting an id a previous gateway process issued (see the module docstring)."""

        async def handle(ctx: ServerRequestContext[Any], params: TaskIdParams) -> HandlerResult:
            if declared_tasks(ctx) and self.support.get(params.task_id) is None:
                await self._adopt(params.task_id)
            return await handler(ctx, params)

        return handle

    async def _adopt(self, task_id: str) -> None:
        bw = self._bw
        store = bw.tasks.store
        if store is None:
            return
        pending: PendingTask | None = await anyio.to_thread.run_sync(store.by_owner, task_id)
        if pending is None or self.support.get(task_id) is not None:
            return
        logger.info("resuming upstream task %s on %s for gateway task %s", pending.task_id, pending.server, task_id)

        async def resume() -> types.CallToolResult:
            return await bw.resume_task(pending.task_id, server=pending.server)

        self.support.start(pending.tool, resume, task_id=task_id)
