"""Gateway tasks across a graceful stop, between the sessions of a shared gateway, and in /metrics.

Real processes throughout: `tests/tasks/tasks_server.py` upstream (over HTTP, or each session's own
over stdio), `breakwater serve` (over HTTP, or stdio sessions attached to a shared gateway) and SDK
clients that declare the tasks extension. What the upstream knows of its own tasks (status, whether a
cancel was asked) is read back through its `task_info` tool; the gateway's task table directly.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CallToolResult

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState, TaskStore
from breakwater.config import CallPolicy, RetryPolicy, ToolSettings
from breakwater.gate._tasks import CLIENT_EXTENSION
from breakwater.gateway._tasks import RESULT_KEPT_S, gateway_task_ttl_s
from breakwater.tasks._wire import CancelTaskRequest, GetTaskRequest, TaskAck, TaskHandle, TaskIdParams, TaskState
from helpers import TASKS_SERVER, gateway_env, gateway_http, http_tasks_server, share_dir

pytestmark = [pytest.mark.long_module(60), pytest.mark.anyio]

HERE = Path(__file__).resolve().parent
BREAKWATER = [sys.executable, "-m", "breakwater"]
FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15)


def config_file(tmp_path: Path, entry: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"jobs": entry}}))
    return path


async def wait_ready(client: Client, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while (await client.call_tool("breakwater_status", {})).structured_content["summary"].get("ready", 0) < 1:
            await anyio.sleep(0.1)
    await client.list_tools()


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    handle = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    return handle.task_id


async def get(client: Client, task_id: str) -> TaskState:
    return await client.session.send_request(GetTaskRequest(params=TaskIdParams(task_id=task_id)), TaskState)


async def poll_until_done(client: Client, task_id: str, timeout: float = 30) -> TaskState:
    with anyio.fail_after(timeout):
        while (state := await get(client, task_id)).status not in ("completed", "failed", "cancelled"):
            await anyio.sleep(0.1)
    return state


def text_of(state: TaskState) -> Any:
    assert state.status == "completed" and state.result is not None, state
    return state.result["structuredContent"]


async def upstream_task(url: str, task_id: str) -> dict[str, Any]:
    async with Client(url) as upstream:
        info = await upstream.call_tool("task_info", {"task_id": task_id})
    assert isinstance(info.structured_content, dict)
    return info.structured_content


async def tasks_created(url: str) -> int:
    """How many tasks the tasks server at `url` has created (the gateway runs a plain call of a task tool as one)."""
    async with Client(url) as upstream:
        info = await upstream.call_tool("stats", {})
    assert isinstance(info.structured_content, dict)
    return int(info.structured_content["created"])


async def row_of(store: TaskStore, owner: str, timeout: float = 15) -> Any:
    with anyio.fail_after(timeout):
        while not (store.path.exists() and (row := store.by_owner(owner))):
            await anyio.sleep(0.05)
    return row


# ---- a graceful stop (SIGTERM of serve --http) --------------------------------------------------------


async def test_sigterm_leaves_gateway_tasks_to_the_restarted_gateway(tmp_path: Path) -> None:
    """SIGTERM while two gateway tasks' upstream tasks run and a plain call holds the drain open: the drain waits
    for the plain call only; polls are answered while it drains (the short task's result from memory once it
    ended), a new call is refused; no `tasks/cancel` reaches the upstream; the restarted gateway answers both ids."""
    with http_tasks_server("--poll-ms", "100") as upstream_url:
        config = config_file(tmp_path, {"type": "http", "url": upstream_url})
        store = TaskStore(tmp_path / "gateway-tasks.sqlite3")
        async with gateway_http(tmp_path, config, "first") as (url, proc):
            async with Client(url, extensions=[CLIENT_EXTENSION]) as client, Client(url) as plain:
                await wait_ready(client)
                short = await start_task(client, "jobs__long_job", {"seconds": 4.5, "label": "short"})
                long = await start_task(client, "jobs__long_job", {"seconds": 12, "label": "long"})
                short_row, long_row = await row_of(store, short), await row_of(store, long)
                # Listed first: the SDK client lists the tools after a call's answer when it never has (to check the
                # result's schema), and that request met the gateway already stopped by the drain's end (CI, twice).
                await plain.list_tools()
                plain_answer: list[CallToolResult] = []
                before = await tasks_created(upstream_url)
                async with anyio.create_task_group() as tg:

                    async def plain_call() -> None:
                        plain_answer.append(await plain.call_tool("jobs__long_job", {"seconds": 8, "label": "plain"}))

                    tg.start_soon(plain_call)
                    # The plain call is in flight: its upstream task exists. A fixed second was not always enough on a
                    # loaded host (CI): the drain then had nothing to wait for, the gateway stopped at once, and the
                    # next poll found nobody there (ConnectError).
                    with anyio.fail_after(10):
                        while await tasks_created(upstream_url) <= before:
                            await anyio.sleep(0.05)
                    proc.send_signal(signal.SIGTERM)
                    await anyio.sleep(0.3)
                    assert (await get(client, long)).status == "working"  # a poll, answered while draining
                    with pytest.raises(MCPError, match="shutting down"):
                        await client.session.call_tool("jobs__quick", {"x": 1}, allow_claimed=True)
                    # The short task's upstream task ends during the drain: its result is answered from memory.
                    assert text_of(await poll_until_done(client, short, timeout=10)) == {"result": "done short"}
            assert plain_answer[0].structured_content == {"result": "done plain"}, plain_answer
            assert proc.wait(30) == 0
        # Nothing was cancelled upstream, and both rows are kept for the next process.
        for row in (short_row, long_row):
            assert (await upstream_task(upstream_url, row.task_id))["cancel_requested"] is False
            assert store.by_owner(row.owner) == row
        async with gateway_http(tmp_path, config, "second") as (url, _), Client(url, extensions=[CLIENT_EXTENSION]) as client:
            assert text_of(await poll_until_done(client, long)) == {"result": "done long"}
            assert text_of(await poll_until_done(client, short)) == {"result": "done short"}
        assert store.by_owner(long) is None and store.by_owner(short) is None


# ---- sessions of a shared gateway -------------------------------------------------------------------


@contextmanager
def shared(tmp_path: Path, entry: dict[str, Any]) -> Iterator[StdioServerParameters]:
    """`breakwater serve` sessions that attach to one shared gateway of the test's own."""
    config = config_file(tmp_path, entry)
    with share_dir("bw-gt-") as directory:
        env = gateway_env(tmp_path, BREAKWATER_SHARE="on", BREAKWATER_SHARE_DIR=str(directory), BREAKWATER_SHARE_IDLE_S="30")
        yield StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)


async def refused_as_unknown(client: Client, task_id: str) -> None:
    for request in (GetTaskRequest, CancelTaskRequest):
        with pytest.raises(MCPError) as refused:
            await client.session.send_request(request(params=TaskIdParams(task_id=task_id)), TaskAck)
        assert refused.value.code == -32602 and "not found" in refused.value.message, refused.value


async def test_a_session_cannot_poll_or_cancel_another_sessions_task_http_upstream(tmp_path: Path) -> None:
    """Two sessions of one shared gateway, one HTTP upstream for both: B's tasks/get and tasks/cancel of A's id are
    answered -32602 as for an unknown id, and touch nothing: A's upstream task is not cancelled, A gets its result."""
    with http_tasks_server("--poll-ms", "100") as upstream_url, shared(tmp_path, {"type": "http", "url": upstream_url}) as params:
        store = TaskStore(tmp_path / "gateway-tasks.sqlite3")
        async with Client(params, extensions=[CLIENT_EXTENSION]) as a, Client(params, extensions=[CLIENT_EXTENSION]) as b:
            await wait_ready(a)
            await wait_ready(b)
            task_id = await start_task(a, "jobs__long_job", {"seconds": 3, "label": "A's"})
            row = await row_of(store, task_id)
            await refused_as_unknown(b, task_id)
            assert (await upstream_task(upstream_url, row.task_id))["cancel_requested"] is False
            assert store.by_owner(task_id) == row
            assert text_of(await poll_until_done(a, task_id)) == {"result": "done A's"}


async def test_a_session_cannot_adopt_another_live_sessions_task(tmp_path: Path) -> None:
    """Each session has its own stdio upstream: B polling A's id used to adopt it, resume it on B's own server (which
    answered -32602), delete A's row and tell B OUTCOME_UNKNOWN. Now B is refused and A's row and result are intact."""
    entry = {"command": TASKS_SERVER[0], "args": [*TASKS_SERVER[1:], "--poll-ms", "100"]}
    with shared(tmp_path, entry) as params:
        store = TaskStore(tmp_path / "gateway-tasks.sqlite3")
        async with Client(params, extensions=[CLIENT_EXTENSION]) as a, Client(params, extensions=[CLIENT_EXTENSION]) as b:
            await wait_ready(a)
            await wait_ready(b)
            task_id = await start_task(a, "jobs__long_job", {"seconds": 3, "label": "A's"})
            row = await row_of(store, task_id)
            with pytest.raises(MCPError) as refused:
                await get(b, task_id)
            assert refused.value.code == -32602, refused.value
            assert store.by_owner(task_id) == row
            assert text_of(await poll_until_done(a, task_id)) == {"result": "done A's"}


# ---- /metrics ---------------------------------------------------------------------------------------


async def scrape(base: str) -> str:
    def read() -> str:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    return await anyio.to_thread.run_sync(read)


def calls_total(metrics: str, tool: str) -> dict[str, float]:
    found = re.findall(rf'^breakwater_calls_total\{{server="jobs",tool="{tool}",outcome="([a-z_]+)"\}} (\S+)$', metrics, re.M)
    return {outcome: float(n) for outcome, n in found}


def duration_sum(metrics: str, tool: str) -> float:
    found = re.findall(rf'^breakwater_call_duration_seconds_sum\{{server="jobs",tool="{tool}"\}} (\S+)$', metrics, re.M)
    return float(found[0]) if found else 0.0


async def test_metrics_count_a_gateway_task_by_its_end(tmp_path: Path) -> None:
    """A call that became a gateway task is counted once it ends, with the outcome the agent got from `tasks/get` and
    the whole duration: not `completed` after the 1 s sync window."""
    with http_tasks_server("--poll-ms", "100") as upstream_url:
        config = config_file(tmp_path, {"type": "http", "url": upstream_url})
        async with gateway_http(tmp_path, config, "m") as (url, _), Client(url, extensions=[CLIENT_EXTENSION]) as client:
            await wait_ready(client)
            base = url.removesuffix("/mcp")
            failing = await start_task(client, "jobs__late_error", {"seconds": 2.5})
            assert calls_total(await scrape(base), "late_error") == {}  # not counted before it ends
            state = await poll_until_done(client, failing)
            assert state.result is not None and state.result["isError"] is True, state
            # The tool has an output schema, so the envelope rides in `_meta` (`gateway._passthrough.fitted`).
            assert state.result["_meta"]["io.breakwater/error"]["code"] == "UPSTREAM_ERROR", state
            with anyio.fail_after(5):
                while not calls_total(metrics := await scrape(base), "late_error"):
                    await anyio.sleep(0.05)
            assert calls_total(metrics, "late_error") == {"upstream_error": 1.0}, metrics
            assert duration_sum(metrics, "late_error") >= 2.5


# ---- the record's lifetime, and who cancelled ---------------------------------------------------------


def test_a_gateway_tasks_record_outlives_the_longest_task_the_config_allows() -> None:
    """A gateway task's ttl (retention from creation, as the spec's `ttlMs` is) covers `task_max_s` wherever it is
    set, plus a while to read the result: the record no longer expires, cancelling the call, while the gate follows."""
    url = "http://127.0.0.1:1/mcp"
    render = {"render": ToolSettings(call=CallPolicy(task_max_s=9000), retry=RetryPolicy())}
    config = Config(
        servers=(
            ServerSpec(name="jobs", transport="http", url=url, call=CallPolicy(task_max_s=8000)),
            ServerSpec(name="studio", transport="http", url=url, tools=render),
        ),
        call=CallPolicy(task_max_s=7200),
    )
    assert gateway_task_ttl_s(config) == 9000 + RESULT_KEPT_S
    assert gateway_task_ttl_s(Config(servers=())) >= CallPolicy().task_max_s + RESULT_KEPT_S


async def test_the_handles_ttl_follows_call_task_max_s(tmp_path: Path) -> None:
    """Through `breakwater serve` with `call.task_max_s` of two hours, the handle's `ttlMs` is longer than that."""
    config = config_file(tmp_path, {"command": TASKS_SERVER[0], "args": [*TASKS_SERVER[1:], "--poll-ms", "100"]})
    env = gateway_env(tmp_path, BREAKWATER_CALL_TASK_MAX_S="7200")
    params = StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)
    async with Client(params, extensions=[CLIENT_EXTENSION]) as client:
        await wait_ready(client)
        handle = await client.session.call_tool("jobs__long_job", {"seconds": 1.5}, allow_claimed=True)
        assert isinstance(handle, TaskHandle) and handle.ttl_ms == (7200 + RESULT_KEPT_S) * 1000, handle


@asynccontextmanager
async def breakwater(tmp_path: Path, spec: ServerSpec) -> AsyncIterator[Breakwater]:
    store = TaskStore(tmp_path / "tasks.sqlite3")
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission", journal=None, task_store=store) as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


async def started_task(bw: Breakwater) -> Any:
    with anyio.fail_after(15):
        while not bw.pending_tasks():
            await anyio.sleep(0.05)
    return bw.pending_tasks()[0]


async def test_a_task_breakwater_had_cancelled_is_not_reported_as_the_servers_doing(tmp_path: Path) -> None:
    """A task the server ends `cancelled` after breakwater asked it to is not "The server cancelled the task"."""
    with http_tasks_server("--poll-ms", "100") as url:
        spec = ServerSpec(name="jobs", transport="http", url=url, connect=FAST_CONNECT)
        async with breakwater(tmp_path, spec) as bw:
            answers: list[CallToolResult] = []
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    answers.append(await bw.call_tool("jobs", "long_job", {"seconds": 20}))

                tg.start_soon(call)
                pending = await started_task(bw)
                assert await bw.tasks.cancel(bw.upstream("jobs"), pending.task_id)
    envelope = answers[0].structured_content
    assert isinstance(envelope, dict) and envelope["code"] == "CANCELLED", answers
    assert envelope["cancelled_by"] == "breakwater" and "server cancelled" not in envelope["message"], envelope


async def test_a_task_whose_stdio_server_process_is_gone_says_so(tmp_path: Path) -> None:
    """A task of a stdio server, resumed after the process it ran on ended (a session's own server ends with its
    session): the new process cannot know it, and the answer says that rather than "expired or restarted"."""
    spec = ServerSpec(
        name="jobs",
        transport="stdio",
        command=TASKS_SERVER[0],
        args=(*TASKS_SERVER[1:], "--poll-ms", "100"),
        connect=FAST_CONNECT,
    )
    async with anyio.create_task_group() as callers:
        async with breakwater(tmp_path, spec) as bw:
            callers.start_soon(bw.call_tool, "jobs", "long_job", {"seconds": 20})
            pending = await started_task(bw)
        callers.cancel_scope.cancel()
    async with breakwater(tmp_path, spec) as bw:
        result = await bw.resume_task(pending.task_id, server="jobs")
    envelope = result.structured_content
    assert isinstance(envelope, dict) and envelope["reason"] == "task_server_gone", envelope
    assert "earlier process of this stdio server" in envelope["message"], envelope
