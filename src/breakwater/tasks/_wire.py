"""The tasks extension's wire shapes, as the client side sends and reads them."""

from __future__ import annotations

from typing import Any, Literal

import mcp.types as types

__all__ = [
    "TASKS_EXTENSION",
    "TERMINAL_TASK_STATUSES",
    "CancelTaskRequest",
    "GetTaskRequest",
    "TaskAck",
    "TaskHandle",
    "TaskIdParams",
    "TaskState",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL_TASK_STATUSES = frozenset({"completed", "failed", "cancelled"})


class TaskHandle(types.Result):
    """`CreateTaskResult`: the answer to a `tools/call` the server turned into a task."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str = "working"
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskState(types.Result):
    """A `tasks/get` answer: the task, with its result, error or input requests inlined."""

    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class TaskAck(types.Result):
    """The empty acknowledgement of `tasks/cancel` and `tasks/update`."""

    result_type: str | None = None


class TaskIdParams(types.RequestParams):
    """Params naming one task."""

    task_id: str


class GetTaskRequest(types.Request[TaskIdParams, Literal["tasks/get"]]):
    """`tasks/get`; over HTTP its `Mcp-Name` header carries the task id, so a balancer can route it."""

    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class CancelTaskRequest(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    """`tasks/cancel` (cooperative: the task may still end `completed`)."""

    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"
