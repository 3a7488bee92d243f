"""The 2026-07-28 tasks extension, both sides of it.

Server side (public): `TaskSupport` turns a long tool call of an SDK `MCPServer` into a task the client
polls. Client side (private): `_wire` holds the shapes the gate's `TaskRuntime` (`breakwater.gate._tasks`)
sends and reads, and `_store.TaskStore` remembers task ids across restarts. May import: the core leaves and `connect`
types only through the `TaskConnection` protocol.
"""

from breakwater.tasks._server import (
    EXTENSION_ID,
    TERMINAL_STATUSES,
    TaskInfo,
    TaskStatus,
    TaskSupport,
    current_task_id,
    declared_tasks,
    missing_tasks_capability,
)

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
