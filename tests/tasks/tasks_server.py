"""A task-capable MCP server for the tasks tests, built on the SDK with `breakwater.tasks.TaskSupport`.

    python tests/tasks/tasks_server.py [--http PORT] [--poll-ms N] [--ttl-s S] [--fail-polls N]

Tools (all async, so a cancel interrupts them):

* `long_job(seconds, label)`: sleeps, then answers `done <label>` (task-capable);
* `tool_error()`: the tool's own `isError` result (task-capable): a task that ends `completed`;
* `protocol_error()`: raises a JSON-RPC error (task-capable): a task that ends `failed`;
* `coded_error(code)`: the same with the given code;
* `late_error(seconds)`: works for `seconds`, then raises a JSON-RPC error (task-capable: a task that ends `failed`);
* `must_task(seconds)`: like `long_job`, but only as a task (`required`);
* `quick(x)`: an ordinary tool, never a task;
* `task_info(task_id)`: what the server knows of a task (status, polls, cancel requested);
* `stats()`: how many tasks were created, and how many polls were refused.

`--fail-polls N` answers the first N `tasks/get` requests with a JSON-RPC internal error (-32603),
as a server that hiccups does.
"""

from __future__ import annotations

if __name__ == "__main__":  # the suite runs it as a fork of a process that imported the SDK already (`fork_script`)
    from breakwater.testing._launcher import fork_script

    fork_script(__file__)

import argparse
import sys
from typing import Any

import anyio
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from breakwater.tasks import TaskSupport


def build(poll_ms: int, ttl_s: float | None, fail_polls: int = 0) -> MCPServer:
    tasks = TaskSupport(
        tools=["long_job", "tool_error", "protocol_error", "coded_error", "late_error"],
        required=["must_task"],
        poll_interval_s=poll_ms / 1000,
        ttl_s=ttl_s,
    )
    refused = [0]

    async def flaky_polls(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "tasks/get" and refused[0] < fail_polls:
            refused[0] += 1
            raise MCPError(code=-32603, message="temporarily unavailable")
        return await call_next(ctx)

    mcp = MCPServer("tasks-test", extensions=[tasks], middleware=[flaky_polls])

    @mcp.tool()
    async def long_job(seconds: float, label: str = "") -> str:
        """Work for `seconds`, then say done."""
        await anyio.sleep(seconds)
        return f"done {label}".strip()

    @mcp.tool()
    async def must_task(seconds: float) -> str:
        """Work for `seconds`; callable only as a task."""
        await anyio.sleep(seconds)
        return "done"

    @mcp.tool()
    async def tool_error() -> str:
        """Report an error as the tool's own result."""
        await anyio.sleep(0.05)
        raise ToolError("the input was not acceptable")

    @mcp.tool()
    async def protocol_error() -> str:
        """Fail with a JSON-RPC error."""
        await anyio.sleep(0.05)
        raise MCPError(code=-32603, message="API rate limit exceeded")

    @mcp.tool()
    async def coded_error(code: int) -> str:
        """Fail with a JSON-RPC error of the given code (one the SDK also gives its own failures, say)."""
        await anyio.sleep(0.05)
        raise MCPError(code=code, message=f"the server's own error {code}")

    @mcp.tool()
    async def late_error(seconds: float) -> str:
        """Work for `seconds`, then fail with a JSON-RPC error."""
        await anyio.sleep(seconds)
        raise MCPError(code=-32603, message="the render farm is on fire")

    @mcp.tool()
    async def quick(x: int) -> int:
        """Answer at once."""
        return x * 2

    @mcp.tool()
    async def task_info(task_id: str) -> dict[str, Any]:
        """What the server knows of one task."""
        task = tasks.get(task_id)
        if task is None:
            return {"found": False}
        return {"found": True, "status": task.status, "polls": task.polls, "cancel_requested": task.cancel_requested}

    @mcp.tool()
    async def stats() -> dict[str, Any]:
        """Tasks created since start."""
        return {"created": tasks.created, "refused_polls": refused[0]}

    return mcp


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    parser.add_argument("--poll-ms", type=int, default=200, help="pollIntervalMs suggested to clients")
    parser.add_argument("--ttl-s", type=float, default=600.0, help="task records kept this long (0 = forever)")
    parser.add_argument("--fail-polls", type=int, default=0, help="refuse the first N tasks/get with -32603")
    args = parser.parse_args(argv)
    mcp = build(args.poll_ms, args.ttl_s or None, args.fail_polls)
    if args.http is None:
        mcp.run("stdio")
    else:
        mcp.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main(sys.argv[1:])
