"""A stdio MCP server with 2025-11-25 tasks (client-directed, `execution.taskSupport`), for the gate's tests.

The SDK 2.3 keeps only the types of that revision's tasks, no runtime, so this server speaks
JSON-RPC lines itself, as the TypeScript SDK's servers do (the npm "everything" server's
`simulate-research-query` is one, and `tests/tasks/test_task_required.py` runs it too). It answers
`server/discover` with -32601, so a client falls back to the 2025-11-25 handshake.

Tools:
- `job` (`taskSupport: "required"`; a plain call gets -32601): runs `seconds` of real time, then ends
  `completed` with `done <label>`; `outcome: "tool_error"` ends `failed` with an `isError` result,
  `outcome: "protocol_error"` ends `failed` with a JSON-RPC error; `ask: true` moves the task to
  `input_required` and, once the client sends `tasks/result`, asks it an `elicitation/create`
  (tagged with the task), whose answer goes into the result;
- `echo` (`taskSupport: "optional"`): answers at once;
- `task_info`: what the server knows of a task (status, polls, whether it was asked to cancel),
  and `created`, the number of tasks made so far.

    python legacy_tasks_server.py [--poll-ms N]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Any

RELATED = "io.modelcontextprotocol/related-task"
TOOLS = [
    {
        "name": "job",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}, "label": {"type": "string"}}},
        "execution": {"taskSupport": "required"},
    },
    {"name": "echo", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}},
    {"name": "task_info", "inputSchema": {"type": "object", "properties": {"task_id": {"type": "string"}}}},
]


class Server:
    def __init__(self, poll_ms: int) -> None:
        self.poll_ms = poll_ms
        self.tasks: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.asks: dict[int, asyncio.Future[Any]] = {}
        self.running: set[asyncio.Future[Any]] = set()  # kept, so the loop does not collect them mid-run

    def start(self, work: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.ensure_future(work)
        self.running.add(future)
        future.add_done_callback(self.running.discard)
        return future

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()

    def task(self, task_id: str) -> dict[str, Any]:
        t = self.tasks[task_id]
        return {
            "taskId": task_id,
            "status": t["status"],
            "createdAt": "2026-12-04T00:00:00Z",
            "lastUpdatedAt": "2026-12-04T00:00:00Z",
            "ttl": t["ttl"],
            "pollInterval": self.poll_ms,
        }

    async def run_job(self, task_id: str, args: dict[str, Any]) -> None:
        t = self.tasks[task_id]
        answer = ""
        if args.get("ask"):
            t["status"] = "input_required"
            t["asking"] = asyncio.get_running_loop().create_future()
            answer = f" ({await t['asking']})"
            t["status"] = "working"
        await asyncio.sleep(float(args.get("seconds", 0)))
        if t["status"] == "cancelled":
            return
        outcome = args.get("outcome")
        if outcome == "protocol_error":
            t["status"], t["result"] = "failed", {"error": {"code": -32603, "message": "API rate limit exceeded"}}
        elif outcome == "tool_error":
            content = [{"type": "text", "text": "the input was not acceptable"}]
            t["status"], t["result"] = "failed", {"result": {"content": content, "isError": True}}
        else:
            content = [{"type": "text", "text": f"done {args.get('label', '')}{answer}"}]
            t["status"], t["result"] = "completed", {"result": {"content": content, "isError": False}}
        t["done"].set()

    async def ask(self, task_id: str) -> None:
        request_id = next(self.ids)
        future = self.asks[request_id] = asyncio.get_running_loop().create_future()
        params = {"message": "Which one?", "requestedSchema": {"type": "object", "properties": {"pick": {"type": "string"}}}}
        params["_meta"] = {RELATED: {"taskId": task_id}}
        self.send({"id": f"ask-{request_id}", "method": "elicitation/create", "params": params})
        answer = await future
        picked = answer.get("content", {}).get("pick") if answer.get("action") == "accept" else answer.get("action")
        self.tasks[task_id]["asking"].set_result(picked)

    async def result(self, request_id: Any, task_id: str) -> None:
        t = self.tasks[task_id]
        if t["status"] == "input_required" and not t["asked"]:
            t["asked"] = True
            self.start(self.ask(task_id))
        await t["done"].wait()
        if "error" in t["result"]:
            self.send({"id": request_id, "error": t["result"]["error"]})
        else:
            result = dict(t["result"]["result"], _meta={RELATED: {"taskId": task_id}})
            self.send({"id": request_id, "result": result})

    def call(self, request_id: Any, params: dict[str, Any]) -> None:
        name, args = params.get("name"), params.get("arguments") or {}
        if name == "task_info":
            t = self.tasks.get(args.get("task_id", ""))
            info = {"created": len(self.tasks), "found": t is not None}
            if t is not None:
                info.update(status=t["status"], polls=t["polls"], cancel_requested=t["cancel_requested"])
            content = [{"type": "text", "text": json.dumps(info)}]
            self.send({"id": request_id, "result": {"content": content, "structuredContent": info}})
        elif name == "echo":
            self.send({"id": request_id, "result": {"content": [{"type": "text", "text": f"echo task={'task' in params}"}]}})
        elif "task" not in params:
            self.send({"id": request_id, "error": {"code": -32601, "message": f"Tool {name} requires task augmentation"}})
        else:
            task_id = f"t{len(self.tasks) + 1}"
            ttl = params["task"].get("ttl")
            self.tasks[task_id] = {"status": "working", "ttl": ttl, "polls": 0, "cancel_requested": False, "asked": False}
            self.tasks[task_id]["done"] = asyncio.Event()
            self.tasks[task_id]["job"] = self.start(self.run_job(task_id, args))
            self.send({"id": request_id, "result": {"task": self.task(task_id)}})

    def handle(self, message: dict[str, Any]) -> None:
        method, request_id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method is None:  # an answer to our elicitation
            future = self.asks.pop(int(str(request_id).removeprefix("ask-")), None)
            if future is not None:
                future.set_result(message.get("result") or {"action": "cancel"})
            return
        if request_id is None:
            return  # notifications
        task_id = params.get("taskId", "")
        if method == "initialize":
            caps: dict[str, Any] = {"tools": {}, "tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}}
            info = {"name": "legacy-tasks", "version": "1"}
            self.send({"id": request_id, "result": {"protocolVersion": "2025-11-25", "capabilities": caps, "serverInfo": info}})
        elif method == "tools/list":
            self.send({"id": request_id, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            self.call(request_id, params)
        elif method in ("tasks/get", "tasks/result", "tasks/cancel") and task_id not in self.tasks:
            self.send({"id": request_id, "error": {"code": -32602, "message": "Failed to retrieve task: Task not found"}})
        elif method == "tasks/get":
            self.tasks[task_id]["polls"] += 1
            self.send({"id": request_id, "result": self.task(task_id)})
        elif method == "tasks/result":
            self.start(self.result(request_id, task_id))
        elif method == "tasks/cancel":
            t = self.tasks[task_id]
            t["cancel_requested"] = True
            if t["status"] in ("working", "input_required"):
                t["status"] = "cancelled"
                t["job"].cancel()
            self.send({"id": request_id, "result": self.task(task_id)})
        elif method == "ping":
            self.send({"id": request_id, "result": {}})
        else:
            self.send({"id": request_id, "error": {"code": -32601, "message": f"Method not found: {method}"}})


async def main(poll_ms: int) -> None:
    server = Server(poll_ms)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        server.handle(json.loads(line))


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(int(args[args.index("--poll-ms") + 1]) if "--poll-ms" in args else 1000))
