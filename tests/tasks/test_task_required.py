"""Tools a 2025-11-25 server takes only as tasks (`execution.taskSupport: "required"`), with real processes.

The servers are `tests/tasks/legacy_tasks_server.py` (JSON-RPC lines of that revision's tasks,
which the SDK 2.3 has no runtime for) and the npm "everything" server, whose
`simulate-research-query` requires a task. The client is a `Breakwater` (its gate) or, through
`breakwater serve`, an SDK client. What the server knows of its tasks is read through its
`task_info` tool.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.context import ClientRequestContext
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

from breakwater import Breakwater, Config, ConnectPolicy, FakeClock, ServerSpec, ServerState
from breakwater.gate._tasks import POLL_JITTER
from helpers import isolated_env

pytestmark = pytest.mark.anyio

SERVER = [sys.executable, str(Path(__file__).resolve().parent / "legacy_tasks_server.py")]
FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15)


def spec(*flags: str, **policies: Any) -> ServerSpec:
    policies.setdefault("connect", FAST_CONNECT)
    return ServerSpec(name="jobs", transport="stdio", command=SERVER[0], args=(*SERVER[1:], *flags), **policies)


@asynccontextmanager
async def breakwater(tmp_path: Path, *specs: ServerSpec, **kwargs: Any) -> AsyncIterator[Breakwater]:
    async with Breakwater(Config(servers=specs), admission_dir=tmp_path / "admission", journal=None, **kwargs) as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def text(result: CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, TextContent))


def envelope(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def task_info(bw: Breakwater, task_id: str = "t1") -> dict[str, Any]:
    result = await bw.call_tool("jobs", "task_info", {"task_id": task_id})
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    with anyio.fail_after(timeout):
        while True:
            if value := await check():
                return value
            await anyio.sleep(0.05)


async def test_a_task_only_tool_is_called_as_a_task_and_an_optional_one_plainly(tmp_path: Path) -> None:
    """`job` requires a task: the gate sends it as one (the server made exactly one), polls it to
    `completed` and answers the tool's own result, without the upstream's task tag. `echo` is
    `optional`: it is called plainly, as before."""
    async with breakwater(tmp_path, spec("--poll-ms", "100")) as bw:
        assert bw.upstream("jobs").protocol == "2025-11-25"
        result = await bw.call_tool("jobs", "job", {"seconds": 0.3, "label": "a"})
        assert not result.is_error, result
        assert text(result) == "done a"
        assert result.meta is None, result.meta
        info = await task_info(bw)
        assert (info["created"], info["status"], info["cancel_requested"]) == (1, "completed", False), info
        assert info["polls"] >= 1, info
        assert text(await bw.call_tool("jobs", "echo", {})) == "echo task=False"
        assert (await task_info(bw))["created"] == 1


async def test_polls_keep_the_servers_interval_with_jitter_on_the_fake_clock(tmp_path: Path) -> None:
    """The server suggests 5 s between polls. On a fake clock each wait is 5 s times a factor in
    [1, 1.1), one `tasks/get` per wait; once the task is done the result is fetched."""
    clock = FakeClock()
    connect = ConnectPolicy(startup_jitter_s=0, attempt_timeout_s=30, health_interval_s=0)
    async with breakwater(tmp_path, spec("--poll-ms", "5000", connect=connect), clock=clock, rng=random.Random(3)) as bw:
        box: list[CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                box.append(await bw.call_tool("jobs", "job", {"seconds": 0.5, "label": "fake"}))

            tg.start_soon(call)
            await clock.wait_for_sleepers(1)
            waits = [clock.sleepers[0] - clock.monotonic()]
            assert (await task_info(bw))["polls"] == 0
            clock.advance(waits[0])
            await clock.wait_for_sleepers(1)
            waits.append(clock.sleepers[0] - clock.monotonic())
            assert (await task_info(bw))["polls"] == 1

            async def done() -> bool:
                return bool((await task_info(bw))["status"] == "completed")

            await eventually(done)
            clock.advance(waits[1])
        (result,) = box
        assert text(result) == "done fake", result
        for wait in waits:
            assert 5.0 <= wait < 5.0 * (1 + POLL_JITTER), waits
        assert len(set(waits)) == 2, "each wait draws its own jitter"
        assert (await task_info(bw))["polls"] == 2


async def test_a_spent_budget_cancels_the_task(tmp_path: Path) -> None:
    """A 30 s job under a 1 s turn budget: `tasks/cancel` reaches the server (its task ends
    `cancelled`) and the call is OUTCOME_UNKNOWN (the tool is unannotated: `never`), naming the task."""
    async with breakwater(tmp_path, spec("--poll-ms", "100")) as bw:
        started = time.monotonic()
        async with bw.budget(seconds=1.0):
            result = await bw.call_tool("jobs", "job", {"seconds": 30})
        elapsed = time.monotonic() - started
        env = envelope(result)
        assert env["code"] == "OUTCOME_UNKNOWN", env
        assert (env["task_id"], env["cut_by"], env["task_cancel_sent"]) == ("t1", "turn budget", True), env
        assert 0.9 <= elapsed < 5, elapsed
        info = await task_info(bw)
        assert (info["status"], info["cancel_requested"]) == ("cancelled", True), info


async def test_a_caller_that_gives_up_cancels_the_task(tmp_path: Path) -> None:
    async with breakwater(tmp_path, spec("--poll-ms", "100")) as bw:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bw.call_tool, "jobs", "job", {"seconds": 30})

            async def polled() -> bool:
                return bool((await task_info(bw)).get("polls"))

            await eventually(polled)
            tg.cancel_scope.cancel()

        async def cancelled() -> bool:
            info = await task_info(bw)
            return bool(info["status"] == "cancelled" and info["cancel_requested"])

        await eventually(cancelled)


async def test_a_tool_error_and_a_protocol_error_of_a_failed_task(tmp_path: Path) -> None:
    """A `failed` task whose `tasks/result` is an `isError` result is TOOL_ERROR with the tool's words;
    one whose `tasks/result` is a JSON-RPC error is UPSTREAM_ERROR naming it."""
    async with breakwater(tmp_path, spec("--poll-ms", "50")) as bw:
        result = await bw.call_tool("jobs", "job", {"outcome": "tool_error"})
        assert envelope(result)["code"] == "TOOL_ERROR"
        assert "the input was not acceptable" in text(result)
        env = envelope(await bw.call_tool("jobs", "job", {"outcome": "protocol_error"}))
        assert env["code"] == "UPSTREAM_ERROR" and "API rate limit exceeded" in env["reason"], env


def gateway(tmp_path: Path, entry: dict[str, Any]) -> StdioServerParameters:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"jobs": entry}}))
    env = isolated_env(tmp_path, BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"))
    args = ["-m", "breakwater", "serve", "--no-share", "--config", str(path)]
    return StdioServerParameters(command=sys.executable, args=args, env=env)


async def tools_of(client: Client) -> dict[str, Any]:
    with anyio.fail_after(30):
        while True:
            tools = {t.name: t for t in (await client.list_tools()).tools if t.name.startswith("jobs__")}
            if tools:
                return tools
            await anyio.sleep(0.1)


async def test_through_the_gateway_the_task_asks_the_client_and_the_tool_is_listed_plainly(tmp_path: Path) -> None:
    """Through `breakwater serve`: the task-only tool is listed without `execution` (the gateway takes it
    as an ordinary call), and the task's question (`input_required`, then `elicitation/create` tagged
    with the task, during `tasks/result`) reaches the client, whose answer is in the result."""
    asked: list[str] = []

    async def answer(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"pick": "blue"})

    target = gateway(tmp_path, {"command": SERVER[0], "args": [*SERVER[1:], "--poll-ms", "100"]})
    async with Client(target, elicitation_callback=answer) as client:
        tools = await tools_of(client)
        assert tools["jobs__job"].execution is None and tools["jobs__echo"].execution is None
        result = await client.call_tool("jobs__job", {"seconds": 0.1, "label": "x", "ask": True})
    assert not result.is_error, result
    assert text(result) == "done x (blue)"
    assert asked == ["Which one?"]


async def test_the_everything_servers_research_task_through_the_gateway(tmp_path: Path) -> None:
    """The npm "everything" server's `simulate-research-query` requires a task; a plain call of it was
    refused (-32601) on every call. Through the gateway it now runs as one and answers its report."""
    from conformance.node_tools import node_tools

    tools = node_tools()
    main = tools.package_main("@modelcontextprotocol/server-everything")
    target = gateway(tmp_path, {"command": str(tools.node), "args": [str(main), "stdio"]})
    async with Client(target) as client:
        listed = await tools_of(client)
        assert listed["jobs__simulate-research-query"].execution is None
        result = await client.call_tool("jobs__simulate-research-query", {"topic": "breakwaters"})
    assert not result.is_error, text(result)
    assert text(result).startswith("# Research Report: breakwaters"), text(result)[:200]


async def test_two_sessions_tasks_each_ask_their_own_client(tmp_path: Path) -> None:
    """One `serve --http` gateway, one stdio upstream, two clients whose task-only calls overlap. Over stdio a
    2025-11-25 request carries nothing that ties it to a call, so with calls of two sessions in flight the
    gateway used to refuse the question; a task's question names its task (`related-task`), so each now
    reaches the client whose call made that task, and each answer goes into its own result."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"jobs": {"command": SERVER[0], "args": [*SERVER[1:], "--poll-ms", "100"]}}}))
    port_file = tmp_path / "port"
    env = isolated_env(tmp_path, BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"))
    serve = [sys.executable, "-m", "breakwater", "serve", "--config", str(path), "--http", "127.0.0.1:0"]
    proc = subprocess.Popen([*serve, "--port-file", str(port_file)], env=env, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text():
                assert proc.poll() is None, "the gateway exited"
                await anyio.sleep(0.05)
        url = f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
        results: dict[str, str] = {}
        both_asked = anyio.Event()
        asked: list[str] = []

        async def session(pick: str) -> None:
            async def answer(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
                asked.append(pick)
                if len(asked) == 2:
                    both_asked.set()
                with anyio.fail_after(20):
                    await both_asked.wait()  # both calls in flight, both questions out, before either is answered
                return ElicitResult(action="accept", content={"pick": pick})

            async with Client(url, mode="legacy", elicitation_callback=answer) as client:
                await tools_of(client)
                result = await client.call_tool("jobs__job", {"seconds": 0.1, "label": pick, "ask": True})
                results[pick] = text(result)

        async with anyio.create_task_group() as tg:
            tg.start_soon(session, "red")
            tg.start_soon(session, "blue")
    finally:
        proc.terminate()
        proc.wait(10)
    assert results == {"red": "done red (red)", "blue": "done blue (blue)"}, results
