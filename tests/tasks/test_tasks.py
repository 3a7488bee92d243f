"""The 2026-07-28 tasks extension, both sides, with real processes.

The server is `tests/tasks/tasks_server.py` (an SDK `MCPServer` made task-capable with
`breakwater.tasks.TaskSupport`), run over stdio and on a real 127.0.0.1 port; the client is a
`Breakwater` (its gate) or, through `breakwater serve`, an SDK client. What the server says about
its own tasks (status, polls, cancellation) is read back through its `task_info` tool.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from breakwater import Breakwater, Config, ConnectPolicy, FakeClock, ServerSpec, ServerState, TaskStore
from breakwater.config import CallPolicy
from breakwater.gate._tasks import CLIENT_EXTENSION, POLL_JITTER
from breakwater.tasks._wire import CancelTaskRequest, GetTaskRequest, TaskAck, TaskHandle, TaskIdParams, TaskState
from breakwater.testing.server import launch_command
from helpers import TASKS_SERVER, gateway_env, gateway_http, http_tasks_server

pytestmark = [pytest.mark.long_module(92), pytest.mark.anyio]

HERE = Path(__file__).resolve().parent
BREAKWATER = [sys.executable, "-m", "breakwater"]
FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15)


def stdio_spec(*flags: str, name: str = "jobs", **policies: Any) -> ServerSpec:
    policies.setdefault("connect", FAST_CONNECT)
    return ServerSpec(name=name, transport="stdio", command=TASKS_SERVER[0], args=(*TASKS_SERVER[1:], *flags), **policies)


def http_spec(url: str, *, name: str = "jobs", **policies: Any) -> ServerSpec:
    policies.setdefault("connect", FAST_CONNECT)
    return ServerSpec(name=name, transport="http", url=url, **policies)


@asynccontextmanager
async def breakwater(tmp_path: Path, *specs: ServerSpec, **kwargs: Any) -> AsyncIterator[Breakwater]:
    kwargs.setdefault("task_store", TaskStore(tmp_path / "tasks.sqlite3"))
    async with Breakwater(Config(servers=specs), admission_dir=tmp_path / "admission", journal=None, **kwargs) as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def envelope(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def text(result: CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, TextContent))


async def task_info(bw: Breakwater, task_id: str, server: str = "jobs") -> dict[str, Any]:
    """What the server itself knows of a task (an ordinary tool call, never a task)."""
    result = await bw.call_tool(server, "task_info", {"task_id": task_id})
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    with anyio.fail_after(timeout):
        while True:
            value = await check()
            if value:
                return value
            await anyio.sleep(0.05)


# ---- the gate: a call the server turns into a task --------------------------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_long_call_runs_as_a_task_and_returns_the_final_result(tmp_path: Path, transport: str) -> None:
    """A 1.5 s job through a gate whose attempt timeout is 0.5 s: the server made it a task, the gate
    polled it (at the server's 200 ms interval) and returned the tool's own result; the task is
    `completed` on the server and no longer remembered by breakwater."""
    call = CallPolicy(timeout_s=0.5)
    with nullcontext() if transport == "stdio" else http_tasks_server("--poll-ms", "200") as url:
        spec = stdio_spec("--poll-ms", "200", call=call) if url is None else http_spec(url, call=call)
        async with breakwater(tmp_path, spec) as bw:
            assert bw.upstream("jobs").protocol == "2026-07-28"
            started = time.monotonic()
            result = await bw.call_tool("jobs", "long_job", {"seconds": 1.5, "label": transport})
            elapsed = time.monotonic() - started
            assert not result.is_error, result
            assert result.structured_content == {"result": f"done {transport}"}
            assert 1.5 <= elapsed < 10
            stats = (await bw.call_tool("jobs", "stats", {})).structured_content
            assert stats == {"created": 1, "refused_polls": 0}
            assert bw.pending_tasks() == []


async def test_a_long_task_is_not_a_slow_call_to_the_breakers(tmp_path: Path) -> None:
    """A healthy tool whose tasks run longer than its slow-call threshold: the breakers judge the attempt by
    how long the task handle took, so the task's own length never counts as slow (and never opens them)."""
    call = CallPolicy(timeout_s=0.5, slow_call_s=1.0)
    async with breakwater(tmp_path, stdio_spec("--poll-ms", "100", call=call)) as bw:
        for label in ("a", "b"):
            result = await bw.call_tool("jobs", "long_job", {"seconds": 1.5, "label": label})
            assert not result.is_error, result
        breakers = {b.name: b for b in bw.gate.breaker_snapshots()}
        tool = next(b for name, b in breakers.items() if name.endswith("long_job"))
        assert tool.calls_in_window == 2 and tool.slow_in_window == 0, tool


async def test_a_task_being_polled_gives_its_bulkhead_slot_back(tmp_path: Path) -> None:
    """With a bulkhead of one call in flight, a long job that became a task holds no slot while it is polled:
    a quick call beside it goes through instead of being refused as OVERLOADED, and the count returns to 0."""
    call = CallPolicy(timeout_s=0.5, max_in_flight=1)
    async with breakwater(tmp_path, stdio_spec("--poll-ms", "100", call=call)) as bw:
        box: list[CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def long() -> None:
                box.append(await bw.call_tool("jobs", "long_job", {"seconds": 1.5, "label": "slot"}))

            async def polled() -> bool:
                return bool(bw.pending_tasks())

            tg.start_soon(long)
            await eventually(polled)
            assert bw.gate.in_flight() == {"jobs": 0}
            quick = await bw.call_tool("jobs", "quick", {"x": 4})
            assert not quick.is_error, quick
        (result,) = box
        assert not result.is_error, result
        assert bw.gate.in_flight() == {"jobs": 0}


async def test_poll_interval_is_honoured_with_jitter_on_the_fake_clock(tmp_path: Path) -> None:
    """The server suggests 5 s between polls. On a fake clock that only moves when the test says so,
    each wait the gate takes is 5 s times a factor in [1, 1.1), and the server sees exactly one
    tasks/get per wait: one while the job still runs, one after it finished."""
    clock = FakeClock()
    spec = stdio_spec("--poll-ms", "5000", connect=ConnectPolicy(startup_jitter_s=0, attempt_timeout_s=30, health_interval_s=0))
    async with breakwater(tmp_path, spec, clock=clock, rng=random.Random(7)) as bw:
        box: list[CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                box.append(await bw.call_tool("jobs", "long_job", {"seconds": 1.0, "label": "fake"}))

            tg.start_soon(call)
            await clock.wait_for_sleepers(1)
            (pending,) = bw.pending_tasks()
            assert (pending.server, pending.tool) == ("jobs", "long_job")
            waits = [clock.sleepers[0] - clock.monotonic()]
            assert await task_info(bw, pending.task_id) == {
                "found": True,
                "status": "working",
                "polls": 0,
                "cancel_requested": False,
            }

            clock.advance(waits[0])  # first poll: the job (1 s of real time) is still running
            await clock.wait_for_sleepers(1)
            waits.append(clock.sleepers[0] - clock.monotonic())
            info = await task_info(bw, pending.task_id)
            assert info["polls"] == 1, info

            async def finished() -> bool:
                status: str = (await task_info(bw, pending.task_id))["status"]
                return status == "completed"

            await eventually(finished)
            clock.advance(waits[1])  # second poll: completed
        (result,) = box
        assert not result.is_error, result
        assert text(result) == "done fake"
        for wait in waits:
            assert 5.0 <= wait < 5.0 * (1 + POLL_JITTER), waits
        assert len(set(waits)) == 2, "each wait draws its own jitter"
        info = await task_info(bw, pending.task_id)
        assert (info["status"], info["polls"]) == ("completed", 2)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_spent_budget_cancels_the_task_with_tasks_cancel(tmp_path: Path, transport: str) -> None:
    """A 30 s job under a 1 s turn budget: at the budget the gate sends tasks/cancel and reports
    OUTCOME_UNKNOWN (the tool is unannotated, so `never`) naming the task; the server's task then
    ends `cancelled`."""
    with nullcontext() if transport == "stdio" else http_tasks_server() as url:
        spec = stdio_spec() if url is None else http_spec(url)
        async with breakwater(tmp_path, spec) as bw:
            started = time.monotonic()
            async with bw.budget(seconds=1.0):
                result = await bw.call_tool("jobs", "long_job", {"seconds": 30})
            elapsed = time.monotonic() - started
            env = envelope(result)
            assert env["code"] == "OUTCOME_UNKNOWN", env
            assert env["cut_by"] == "turn budget" and env["task_cancel_sent"] is True, env
            assert env["operation_id"], env
            assert 0.9 <= elapsed < 5, elapsed

            async def cancelled() -> dict[str, Any] | None:
                info = await task_info(bw, env["task_id"])
                return info if info["status"] == "cancelled" else None

            info = await eventually(cancelled)
            assert info["cancel_requested"] is True
            assert bw.pending_tasks() == []


async def test_cancelling_the_caller_cancels_the_task(tmp_path: Path) -> None:
    """The caller gives up on a task-backed call: tasks/cancel reaches the server and its task ends
    `cancelled`; breakwater forgets the task."""
    async with breakwater(tmp_path, stdio_spec()) as bw:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bw.call_tool, "jobs", "long_job", {"seconds": 30})

            async def started() -> list[Any]:
                return bw.pending_tasks()

            (pending,) = await eventually(started)
            tg.cancel_scope.cancel()
        assert bw.pending_tasks() == []

        async def cancelled() -> bool:
            info = await task_info(bw, pending.task_id)
            return bool(info["status"] == "cancelled" and info["cancel_requested"])

        await eventually(cancelled)


async def test_tool_error_is_a_completed_task_and_a_protocol_error_a_failed_one(tmp_path: Path) -> None:
    """The tool's own isError result arrives as TOOL_ERROR with its content (task `completed`); a
    JSON-RPC error raised by the tool is a `failed` task and an UPSTREAM_ERROR naming the error."""
    async with breakwater(tmp_path, stdio_spec("--poll-ms", "50")) as bw:
        result = await bw.call_tool("jobs", "tool_error", {})
        env = envelope(result)
        assert env["code"] == "TOOL_ERROR", env
        assert "the input was not acceptable" in text(result)
        result = await bw.call_tool("jobs", "protocol_error", {})
        env = envelope(result)
        assert env["code"] == "UPSTREAM_ERROR" and "API rate limit exceeded" in env["reason"], env
        assert env["retryable"] is False
    # The server's verdicts, through the SDK client with the extension, polling by hand.
    params = StdioServerParameters(command=TASKS_SERVER[0], args=[*TASKS_SERVER[1:], "--poll-ms", "50"])
    async with Client(params, extensions=[CLIENT_EXTENSION]) as client:
        await client.list_tools()
        statuses = {}
        for tool in ("tool_error", "protocol_error"):
            handle = await client.session.call_tool(tool, {}, allow_claimed=True)
            assert isinstance(handle, TaskHandle)
            state = await poll_until_done(client, handle.task_id)
            statuses[tool] = state
        assert statuses["tool_error"].status == "completed"
        assert statuses["tool_error"].result is not None and statuses["tool_error"].result["isError"] is True
        assert statuses["protocol_error"].status == "failed"
        assert statuses["protocol_error"].error == {"code": -32603, "message": "API rate limit exceeded"}


@pytest.mark.parametrize("code", [-32000, -32001, -32090])
async def test_a_failed_tasks_error_is_the_servers_whatever_its_code(tmp_path: Path, code: int) -> None:
    """A task that failed with a code the SDK also gives its own failures (-32000 connection closed, -32001 timed
    out, -32090 too large) is the server's answer: UPSTREAM_ERROR with its message, not a lost connection, a timeout
    or an oversize result (it was made INTERNAL_ERROR, and -32090 read as RESULT_TOO_LARGE)."""
    async with breakwater(tmp_path, stdio_spec("--poll-ms", "50")) as bw:
        env = envelope(await bw.call_tool("jobs", "coded_error", {"code": code}))
    assert env["code"] == "UPSTREAM_ERROR" and f"the server's own error {code}" in env["reason"], env


async def poll_until_done(client: Client, task_id: str, timeout: float = 10) -> TaskState:
    with anyio.fail_after(timeout):
        while True:
            state = await client.session.send_request(GetTaskRequest(params=TaskIdParams(task_id=task_id)), TaskState)
            if state.status in ("completed", "failed", "cancelled"):
                return state
            await anyio.sleep(0.05)


async def test_a_failed_poll_is_polled_again_not_a_failed_call(tmp_path: Path) -> None:
    """The server refuses the first three tasks/get with -32603: the gate polls again (with backoff)
    and returns the job's result."""
    async with breakwater(tmp_path, stdio_spec("--poll-ms", "50", "--fail-polls", "3")) as bw:
        result = await bw.call_tool("jobs", "long_job", {"seconds": 0.5, "label": "flaky"})
        assert not result.is_error, result
        assert text(result) == "done flaky"
        stats = (await bw.call_tool("jobs", "stats", {})).structured_content
        assert stats == {"created": 1, "refused_polls": 3}


async def test_an_expired_task_is_outcome_unknown(tmp_path: Path) -> None:
    """The server keeps task records for 1 s; a 5 s job outlives its record, so the next poll gets
    -32602: for an unannotated (`never`) tool that is OUTCOME_UNKNOWN, not a result and not a retry."""
    async with breakwater(tmp_path, stdio_spec("--poll-ms", "300", "--ttl-s", "1")) as bw:
        env = envelope(await bw.call_tool("jobs", "long_job", {"seconds": 5}))
        assert env["code"] == "OUTCOME_UNKNOWN" and env["reason"] == "task_lost", env
        assert env["attempt"] == 1
        assert bw.pending_tasks() == []


async def test_a_server_without_the_extension_works_unchanged(tmp_path: Path) -> None:
    """breakwater's own test server knows nothing of tasks: calls go through as before, on 2026-07-28."""
    cmd = launch_command("--name", "plain", "--tool", "read_file:latency=0.05,readonly")
    spec = ServerSpec(name="plain", transport="stdio", command=cmd[0], args=tuple(cmd[1:]), connect=FAST_CONNECT)
    async with breakwater(tmp_path, spec) as bw:
        assert bw.upstream("plain").protocol == "2026-07-28"
        result = await bw.call_tool("plain", "read_file", {"payload": "x"})
        assert not result.is_error, result
        assert bw.pending_tasks() == []


async def test_a_legacy_connection_gets_ordinary_calls(tmp_path: Path) -> None:
    """Pinned to 2025-11-25, the same server runs the job synchronously (no task created), and a
    tool that only runs as a task answers the spec's -32021."""
    spec = stdio_spec(connect=ConnectPolicy(startup_jitter_s=0, protocol="2025-11-25"), call=CallPolicy(timeout_s=10))
    async with breakwater(tmp_path, spec) as bw:
        assert bw.upstream("jobs").protocol == "2025-11-25"
        result = await bw.call_tool("jobs", "long_job", {"seconds": 0.3, "label": "legacy"})
        assert text(result) == "done legacy"
        env = envelope(await bw.call_tool("jobs", "must_task", {"seconds": 0.1}))
        assert env["code"] == "UPSTREAM_ERROR" and "-32021" in env["reason"], env
        stats = (await bw.call_tool("jobs", "stats", {})).structured_content
        assert stats == {"created": 0, "refused_polls": 0}


async def test_server_side_rules_for_clients_without_the_extension() -> None:
    """Straight to the server with the SDK client: without the extension a task-capable tool runs
    synchronously and a required one answers -32021 with requiredCapabilities; with it, an unknown
    task id answers -32602."""
    params = StdioServerParameters(command=TASKS_SERVER[0], args=TASKS_SERVER[1:])
    async with Client(params, mode="2026-07-28") as client:
        discover = client.session.discover_result
        result = await client.call_tool("long_job", {"seconds": 0.1, "label": "sync"})
        assert text(result) == "done sync"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("must_task", {"seconds": 0.1})
        assert refused.value.code == -32021
        assert refused.value.data == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    async with Client(params, extensions=[CLIENT_EXTENSION]) as client:
        discover = client.session.discover_result
        assert discover is not None and discover.capabilities.extensions == {"io.modelcontextprotocol/tasks": {}}
        with pytest.raises(MCPError) as unknown:
            await client.session.send_request(GetTaskRequest(params=TaskIdParams(task_id="nope")), TaskState)
        assert unknown.value.code == -32602


# ---- resuming after a restart ---------------------------------------------------------------------

CRASHING_CLIENT = """
import sys, anyio
from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, TaskStore

async def main() -> None:
    url, store, admission = sys.argv[1:4]
    spec = ServerSpec(name="jobs", transport="http", url=url, connect=ConnectPolicy(startup_jitter_s=0))
    async with Breakwater(Config(servers=(spec,)), journal=None, task_store=TaskStore(store), admission_dir=admission) as bw:
        await bw.wait_ready(timeout=20)
        await bw.call_tool("jobs", "long_job", {"seconds": 4, "label": "resumed"})

anyio.run(main)
"""


async def test_a_second_instance_resumes_a_task_the_first_started(tmp_path: Path) -> None:
    """A process starts a 4 s job as a task on an HTTP server and is killed (SIGKILL) while polling.
    A new `Breakwater` with the same task table lists the task and, resumed, gets the job's result."""
    store_path = tmp_path / "tasks.sqlite3"
    with http_tasks_server("--poll-ms", "100") as url:
        child = subprocess.Popen(
            [sys.executable, "-c", CRASHING_CLIENT, url, str(store_path), str(tmp_path / "admission")],
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        try:
            deadline = time.monotonic() + 30
            while not (store_path.exists() and TaskStore(store_path).all()):
                assert time.monotonic() < deadline and child.poll() is None, "the first process never started a task"
                await anyio.sleep(0.05)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        async with breakwater(tmp_path, http_spec(url), task_store=TaskStore(store_path)) as bw:
            (pending,) = bw.pending_tasks()
            assert (pending.server, pending.tool, pending.retry_class) == ("jobs", "long_job", "never")
            assert pending.operation_id and pending.deadline_at > time.time()
            result = await bw.resume_task(pending.task_id)
            assert not result.is_error, result
            assert text(result) == "done resumed"
            assert bw.pending_tasks() == []
            with pytest.raises(KeyError):
                await bw.resume_task(pending.task_id)


async def test_leaving_breakwater_leaves_the_task_running_and_remembered(tmp_path: Path) -> None:
    """Shutting down is not giving up: a call still polling when its `Breakwater` exits (and its
    caller is then cancelled) sends no tasks/cancel and keeps the task's row; the next instance
    resumes it to the result."""
    store = TaskStore(tmp_path / "tasks.sqlite3")
    with http_tasks_server("--poll-ms", "100") as url:
        async with anyio.create_task_group() as callers:
            async with breakwater(tmp_path, http_spec(url), task_store=store) as bw:
                callers.start_soon(bw.call_tool, "jobs", "long_job", {"seconds": 3, "label": "kept"})

                async def started() -> list[Any]:
                    return bw.pending_tasks()

                (pending,) = await eventually(started)
            callers.cancel_scope.cancel()
        async with breakwater(tmp_path, http_spec(url), task_store=store) as bw:
            assert bw.pending_tasks() == [pending]
            info = await task_info(bw, pending.task_id)
            assert info["cancel_requested"] is False, info
            result = await bw.resume_task(pending.task_id, server="jobs", raise_on_error=True)
            assert text(result) == "done kept"


# ---- through the gateway ------------------------------------------------------------------------------


def gateway_config(tmp_path: Path, entry: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"jobs": entry}}))
    return path


async def wait_ready(client: Client, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while (await client.call_tool("breakwater_status", {})).structured_content["summary"].get("ready", 0) < 1:
            await anyio.sleep(0.1)
    await client.list_tools()


async def test_gateway_gives_tasks_to_clients_that_declare_them_and_results_to_others(tmp_path: Path) -> None:
    """Through `breakwater serve`: a downstream SDK client with the extension gets the gateway's task
    handle for a 2.5 s job and polls it to the result, and a quick call's result directly; a client
    without the extension gets the ordinary result of the same long call."""
    config = gateway_config(tmp_path, {"command": TASKS_SERVER[0], "args": [*TASKS_SERVER[1:], "--poll-ms", "100"]})
    params = StdioServerParameters(
        command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=gateway_env(tmp_path)
    )
    async with Client(params, extensions=[CLIENT_EXTENSION]) as client:
        discover = client.session.discover_result
        assert discover is not None and "io.modelcontextprotocol/tasks" in (discover.capabilities.extensions or {})
        await wait_ready(client)
        handle = await client.session.call_tool("jobs__long_job", {"seconds": 2.5, "label": "gw"}, allow_claimed=True)
        assert isinstance(handle, TaskHandle) and handle.status == "working", handle
        assert handle.poll_interval_ms is not None and handle.ttl_ms is not None
        state = await poll_until_done(client, handle.task_id)
        assert state.status == "completed", state
        assert state.result is not None and state.result["structuredContent"] == {"result": "done gw"}
        # Quick calls and the built-in tools answer at once even for a client that takes tasks.
        quick = await client.session.call_tool("jobs__quick", {"x": 21}, allow_claimed=True)
        assert isinstance(quick, CallToolResult) and quick.structured_content == {"result": 42}, quick
        status = await client.session.call_tool("breakwater_status", {}, allow_claimed=True)
        assert not isinstance(status, TaskHandle)
    async with Client(params) as plain:
        await wait_ready(plain)
        result = await plain.call_tool("jobs__long_job", {"seconds": 2.5, "label": "plain"})
        assert not result.is_error, result
        assert result.structured_content == {"result": "done plain"}


async def test_gateway_cancel_reaches_the_upstream_task(tmp_path: Path) -> None:
    """A downstream tasks/cancel of the gateway's task cancels the gate call, which sends tasks/cancel
    upstream: the gateway task and the upstream task both end `cancelled`."""
    config = gateway_config(tmp_path, {"command": TASKS_SERVER[0], "args": [*TASKS_SERVER[1:], "--poll-ms", "100"]})
    params = StdioServerParameters(
        command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=gateway_env(tmp_path)
    )
    store = TaskStore(tmp_path / "gateway-tasks.sqlite3")
    async with Client(params, extensions=[CLIENT_EXTENSION]) as client:
        await wait_ready(client)
        handle = await client.session.call_tool("jobs__long_job", {"seconds": 30}, allow_claimed=True)
        assert isinstance(handle, TaskHandle)

        async def upstream_started() -> Any:
            return store.path.exists() and store.by_owner(handle.task_id)

        upstream = await eventually(upstream_started)
        await client.session.send_request(CancelTaskRequest(params=TaskIdParams(task_id=handle.task_id)), TaskAck)
        state = await poll_until_done(client, handle.task_id)
        assert state.status == "cancelled", state
        info = await client.call_tool("jobs__task_info", {"task_id": upstream.task_id})
        assert info.structured_content is not None and info.structured_content["cancel_requested"] is True


async def test_gateway_restart_resumes_a_downstream_task(tmp_path: Path) -> None:
    """A downstream client starts a 4 s job as a gateway task; the gateway is killed (SIGKILL) while
    polling the upstream task. A new gateway with the same task table, asked about the same gateway
    task id, adopts it, resumes polling upstream, and answers `completed` with the job's result."""
    with http_tasks_server("--poll-ms", "100") as upstream_url:
        config = gateway_config(tmp_path, {"type": "http", "url": upstream_url})
        store = TaskStore(tmp_path / "gateway-tasks.sqlite3")
        async with gateway_http(tmp_path, config, "first") as (url, proc):
            async with Client(url, extensions=[CLIENT_EXTENSION]) as client:
                await wait_ready(client)
                handle = await client.session.call_tool("jobs__long_job", {"seconds": 4, "label": "again"}, allow_claimed=True)
                assert isinstance(handle, TaskHandle)

                async def upstream_started() -> Any:
                    return store.path.exists() and store.by_owner(handle.task_id)

                await eventually(upstream_started)
            proc.send_signal(signal.SIGKILL)
            proc.wait(15)
        async with gateway_http(tmp_path, config, "second") as (url, _proc), Client(url, extensions=[CLIENT_EXTENSION]) as client:
            state = await poll_until_done(client, handle.task_id, timeout=30)
            assert state.status == "completed", state
            assert state.result is not None and state.result["structuredContent"] == {"result": "done again"}
