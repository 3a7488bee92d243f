"""`breakwater serve`: a real MCP server in front of real upstream processes, seen by the SDK's client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import RequestParamsMeta

from breakwater.testing.server import launch_command, read_state

pytestmark = [pytest.mark.long_module(118), pytest.mark.anyio]

BREAKWATER = [sys.executable, "-m", "breakwater"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stdio_entry(*flags: str) -> dict[str, Any]:
    cmd = launch_command(*flags)
    return {"command": cmd[0], "args": cmd[1:]}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Isolated caches, so one test's last-known tools never leak into another's."""
    yield dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_CONNECT_BACKOFF_BASE_S="0.2",
    )


def write_config(tmp_path: Path, servers: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@asynccontextmanager
async def gateway_stdio(config: Path, env: dict[str, str], **client_kw: Any) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)
    async with Client(params, **client_kw) as client:
        yield client


async def wait_for_tool(client: Client, name: str, timeout: float = 30) -> types.Tool:
    with anyio.fail_after(timeout):
        while True:
            for tool in (await client.list_tools()).tools:
                if tool.name == name:
                    return tool
            await anyio.sleep(0.2)


async def wait_ready(client: Client, servers: int, timeout: float = 30) -> None:
    """Wait until the gateway reports `servers` upstreams ready (through its status tool)."""
    with anyio.fail_after(timeout):
        while (await client.call_tool("breakwater_status", {})).structured_content["summary"].get("ready", 0) < servers:
            await anyio.sleep(0.1)


async def call_until_ready(client: Client, name: str, args: dict[str, Any], timeout: float = 30) -> types.CallToolResult:
    """Call until the server behind `name` has connected (the gateway answers SERVER_CONNECTING before)."""
    with anyio.fail_after(timeout):
        while True:
            result = await client.call_tool(name, args)
            if (result.structured_content or {}).get("code") != "SERVER_CONNECTING":
                return result
            await anyio.sleep(0.2)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_tools_pass_through_namespaced_and_unchanged(tmp_path: Path, env: dict[str, str], mode: str) -> None:
    """Both protocol revisions downstream: tools are listed as server__tool with description, schemas and
    annotations unchanged, and a call goes through."""
    config = write_config(tmp_path, {"files": stdio_entry("--tool", "read_file:latency=0.01,readonly")})
    async with gateway_stdio(config, env, mode=mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        tool = await wait_for_tool(client, "files__read_file")
        async with Client(
            StdioServerParameters(
                command=launch_command()[0], args=[*launch_command("--tool", "read_file:latency=0.01,readonly")[1:]]
            ),
            mode=mode,
        ) as direct:
            (upstream,) = [t for t in (await direct.list_tools()).tools if t.name == "read_file"]
        assert tool.model_dump(exclude={"name"}) == upstream.model_dump(exclude={"name"})
        assert tool.annotations is not None and tool.annotations.read_only_hint is True
        names = [t.name for t in (await client.list_tools()).tools]
        assert {"breakwater_search_tools", "breakwater_status"} <= set(names)
        result = await call_until_ready(client, "files__read_file", {"payload": "x"})
        assert not result.is_error, result
        assert (result.structured_content or {})["tool"] == "read_file"


async def test_failed_server_answers_unavailable_and_search_names_it(tmp_path: Path, env: dict[str, str]) -> None:
    """A tool of a server that failed answers SERVER_UNAVAILABLE with its reason, never UNKNOWN_TOOL; the search
    tool names the failed server; a name that belongs to no server is UNKNOWN_TOOL."""
    config = write_config(
        tmp_path,
        {
            "files": stdio_entry("--tool", "read_file:latency=0.01,readonly"),
            "erp": {"command": "breakwater-no-such-erp-server"},
        },
    )
    async with gateway_stdio(config, env) as client:
        await wait_for_tool(client, "files__read_file")
        with anyio.fail_after(20):
            while True:
                result = await client.call_tool("erp__create_invoice", {"amount": 3})
                sc = result.structured_content or {}
                if sc.get("code") == "SERVER_UNAVAILABLE":
                    break
                await anyio.sleep(0.2)
        assert result.is_error
        assert "spawn_failed" in json.dumps(sc) and sc["retry_after_s"] is not None and sc["retry_after_s"] > 0
        assert sc["connect_attempts"] >= 1 and sc["failing_since"] is not None  # what is known: since when, how often
        search = await client.call_tool("breakwater_search_tools", {"query": "invoice"})
        text = search.content[0].text  # type: ignore[union-attr]
        assert "erp" in text and "spawn_failed" in text and "No such tool" not in text
        assert (search.structured_content or {})["complete"] is False
        # A query that matches nothing says so, naming what could not be searched, with no weak matches.
        nothing = await client.call_tool("breakwater_search_tools", {"query": "legacy_tool"})
        assert (nothing.structured_content or {})["matches"] == []
        assert "Nothing matches 'legacy_tool'" in nothing.content[0].text and "erp" in nothing.content[0].text  # type: ignore[union-attr]
        unknown = await client.call_tool("nothing_here", {})
        assert (unknown.structured_content or {})["code"] == "UNKNOWN_TOOL"


async def test_server_coming_up_mid_session_triggers_list_changed(tmp_path: Path, env: dict[str, str]) -> None:
    """A server that becomes ready after tools/list answered: a call to it waits and gets the real result, and the
    client hears tools/list_changed."""
    config = write_config(tmp_path, {"late": stdio_entry("--startup-delay", "3", "--tool", "ping:latency=0.01,readonly")})
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    quick_list = dict(env, BREAKWATER_LIST_WAIT_S="0.2")  # tools/list answers before the server is up
    async with gateway_stdio(config, quick_list, mode="legacy", message_handler=on_message) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "late__ping" not in names  # never seen before: no last-known list yet
        early = await client.call_tool("late__ping", {})  # waits for the connecting server (call timeout 5 s)
        assert not early.is_error, early
        with anyio.fail_after(30):
            await changed.wait()
        await wait_for_tool(client, "late__ping", timeout=5)


async def test_last_known_tools_are_listed_while_the_server_is_down(tmp_path: Path, env: dict[str, str]) -> None:
    """The catalog remembers a server's tools on disk: after a restart, its tools are listed while it is connecting,
    and a call that cannot wait long enough for it answers SERVER_CONNECTING."""
    config = write_config(tmp_path, {"slowpoke": stdio_entry("--tool", "ping:latency=0.01,readonly")})
    async with gateway_stdio(config, env) as client:
        await wait_for_tool(client, "slowpoke__ping")
    # Same server, same config fingerprint, but now it takes a long time to start.
    slow = stdio_entry("--tool", "ping:latency=0.01,readonly")
    config.write_text(json.dumps({"mcpServers": {"slowpoke": slow}}))
    # Pending throughout: the start waits uniform(0, 1 h), which fell inside the 0.5 s call about once in 60 runs at 30 s.
    env_slow = dict(env, BREAKWATER_CONNECT_STARTUP_JITTER_S="3600", BREAKWATER_CALL_TIMEOUT_S="0.5")
    async with gateway_stdio(config, env_slow) as client:
        started = time.monotonic()
        names = [t.name for t in (await client.list_tools()).tools]
        assert "slowpoke__ping" in names
        assert time.monotonic() - started < 2  # last-known tools: tools/list does not wait
        result = await client.call_tool("slowpoke__ping", {})
        assert (result.structured_content or {})["code"] == "SERVER_CONNECTING"


async def test_one_shot_call_on_a_fresh_cache_gets_the_real_result(tmp_path: Path, env: dict[str, str]) -> None:
    """What `mcp-inspector --cli --method tools/call` does against a first-ever `serve` (empty catalog_dir): list the
    tools, then call one at once. Both see the real server, which is ready half a second after start."""
    servers = {
        "S": stdio_entry("--startup-delay", "0.5"),
        "T": stdio_entry("--startup-delay", "0.5", "--tool", "ping:latency=0.01,readonly"),
    }
    config = write_config(tmp_path, servers)
    assert not (tmp_path / "catalog").exists()
    # Generous bounds, so a loaded machine's slow Python start-up cannot fail the test; both end at ready.
    env = dict(env, BREAKWATER_LIST_WAIT_S="30", BREAKWATER_CALL_TIMEOUT_S="30")
    async with gateway_stdio(config, env) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"S__echo", "T__ping"} <= names
        result = await client.call_tool("S__echo", {"message": "hi"})
        assert not result.is_error, result
        assert (result.structured_content or {})["arguments"] == {"message": "hi"}
    # Without listing first: the call itself waits for its connecting server.
    (tmp_path / "catalog").rename(tmp_path / "catalog-old")
    async with gateway_stdio(config, env) as client:
        result = await client.call_tool("T__ping", {})
        assert not result.is_error, result


def test_inspector_one_shot_call_on_a_fresh_cache_gets_the_real_result(tmp_path: Path, env: dict[str, str]) -> None:
    """The MCP Inspector CLI's one-shot `tools/call` (it starts `breakwater serve`, lists, calls once and exits) gets
    the tool's real answer from a first-ever serve whose server is ready half a second after start."""
    from conformance.node_tools import node_tools

    tools = node_tools()
    config = write_config(tmp_path, {"everything": stdio_entry("--startup-delay", "0.5")})
    assert not (tmp_path / "catalog").exists()
    inspector = tools.bin / "mcp-inspector"
    run_env = dict(env, PATH=tools.env()["PATH"], BREAKWATER_LIST_WAIT_S="30", BREAKWATER_CALL_TIMEOUT_S="30")
    # The Inspector starts its server with a few safe variables only, as the SDKs do: the test's own (the fresh
    # catalog dir, no shared gateway to outlive the test) reach `serve` through `env`.
    ours = [f"{k}={v}" for k, v in run_env.items() if k.startswith("BREAKWATER_")]
    serve = ["env", *ours, sys.executable, "-m", "breakwater", "serve", "--config", str(config)]
    cmd = [str(inspector), "--cli", "--method", "tools/call", "--tool-name", "everything__echo", "--tool-arg", "message=hi"]
    done = subprocess.run([*cmd, "--", *serve], capture_output=True, text=True, timeout=120, env=run_env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert answer.get("isError") is not True, answer
    assert answer["structuredContent"]["arguments"] == {"message": "hi"}
    assert (tmp_path / "catalog").is_dir()  # its first-ever serve was the one the test set up


async def test_first_list_waits_only_for_servers_on_their_way(tmp_path: Path, env: dict[str, str]) -> None:
    """A first-ever tools/list waits (up to list_wait_s) for connecting servers, not for one that keeps failing, and
    answers with what it has when the wait ends; a call to the failing server answers at once with its reason."""
    servers = {
        "quick": stdio_entry("--startup-delay", "0.3"),
        "stuck": stdio_entry("--startup-delay", "60"),
        "broken": stdio_entry("--exit-at-start", "3", "--exit-message", "bad token"),
    }
    config = write_config(tmp_path, servers)
    async with gateway_stdio(config, dict(env, BREAKWATER_LIST_WAIT_S="8")) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "quick__echo" in names and not any(n.startswith(("stuck__", "broken__")) for n in names)
        started = time.monotonic()
        broken = await client.call_tool("broken__echo", {"message": "hi"})
        # Retrying after an exit: no wait. A call that waited would wait out its 5 s timeout (or, if the server came
        # up meanwhile, get a result, which the code check below refuses); 3 s leaves a loaded machine room (1.7 s seen).
        assert time.monotonic() - started < 3.0
        sc = broken.structured_content or {}
        assert sc["code"] in ("SERVER_CONNECTING", "SERVER_UNAVAILABLE") and "bad token" in json.dumps(sc)
        # A server on its way up is waited for, but never past the caller's own deadline (`_meta`).
        started = time.monotonic()
        meta = cast(RequestParamsMeta, {"io.breakwater/deadlineMs": 500})
        stuck = await client.call_tool("stuck__echo", {"message": "hi"}, meta=meta)
        assert 0.4 < time.monotonic() - started < 2.5
        assert (stuck.structured_content or {})["code"] == "SERVER_CONNECTING"


async def test_progress_is_relayed_and_cancel_reaches_upstream(tmp_path: Path, env: dict[str, str]) -> None:
    """Upstream progress reaches the downstream caller; a downstream cancel stops the upstream tool."""
    state = tmp_path / "state.json"
    config = write_config(
        tmp_path,
        {"work": stdio_entry("--state-file", str(state), "--tool", "crunch:latency=60,progress=0.2,readonly")},
    )
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    env_long = dict(env, BREAKWATER_CALL_TIMEOUT_S="120", BREAKWATER_CALL_IDLE_TIMEOUT_S="5")
    async with gateway_stdio(config, env_long) as client:
        await wait_ready(client, 1)
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await client.call_tool("work__crunch", {}, progress_callback=on_progress)

            tg.start_soon(call)
            with anyio.fail_after(20):
                while len(seen) < 3:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        assert len(seen) >= 3 and seen == sorted(seen)
        with anyio.fail_after(10):
            while read_state(state)["in_flight"].get("crunch", 0) != 0:
                await anyio.sleep(0.05)
        assert read_state(state)["cancelled"].get("crunch", 0) == 1


async def test_deadline_in_meta_becomes_the_budget(tmp_path: Path, env: dict[str, str]) -> None:
    """`_meta["io.breakwater/deadlineMs"]` bounds the call: a 60 s tool with 500 ms left ends in well under 5 s."""
    config = write_config(tmp_path, {"work": stdio_entry("--tool", "crunch:latency=60,readonly")})
    env_long = dict(env, BREAKWATER_CALL_TIMEOUT_S="120")
    async with gateway_stdio(config, env_long) as client:
        await wait_ready(client, 1)
        started = time.monotonic()
        meta = cast(RequestParamsMeta, {"io.breakwater/deadlineMs": 500})
        result = await client.call_tool("work__crunch", {}, meta=meta)
        assert time.monotonic() - started < 5
        assert result.is_error
        assert (result.structured_content or {})["code"] in ("BUDGET_EXHAUSTED", "TIMEOUT")


# ---- HTTP ------------------------------------------------------------------------------------------


@asynccontextmanager
async def gateway_http(tmp_path: Path, config: Path, env: dict[str, str], *extra: str) -> AsyncIterator[str]:
    port_file = tmp_path / "gw-port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--config", str(config), "--http", "127.0.0.1:0", "--port-file", str(port_file), *extra],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text():
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_gateway_serves_both_revisions(tmp_path: Path, env: dict[str, str], mode: str) -> None:
    """Streamable HTTP on 127.0.0.1: both revisions list and call upstream tools."""
    config = write_config(tmp_path, {"files": stdio_entry("--tool", "read_file:latency=0.01,readonly")})
    async with gateway_http(tmp_path, config, env) as url, Client(url, mode=mode) as client:
        await wait_for_tool(client, "files__read_file")
        result = await call_until_ready(client, "files__read_file", {})
        assert not result.is_error
        # `breakwater status --gateway` asks the running gateway instead of connecting on its own.
        status = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [*BREAKWATER, "status", "--gateway", url, "--json"], capture_output=True, text=True, env=env, timeout=60
            )
        )
        assert status.returncode == 0, status.stderr
        assert [(s["name"], s["state"]) for s in json.loads(status.stdout)["servers"]] == [("files", "ready")]
        # Without the endpoint's path it said "Server returned an error response", and to check that the gateway runs.
        command = [*BREAKWATER, "status", "--gateway", url.removesuffix("/mcp")]
        bare = await anyio.to_thread.run_sync(lambda: subprocess.run(command, capture_output=True, text=True, env=env))
        assert bare.returncode == 2 and "answers at /mcp" in bare.stderr, bare.stderr


async def test_status_of_a_gateway_names_its_open_breakers_and_a_server_that_refuses_every_call_is_not_ready(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The table said `ready`, exit 0, while the server's breaker refused every call (the JSON named it)."""
    config = write_config(tmp_path, {"ts": stdio_entry("--tool", "bad:rpc_error=1,readonly")})
    async with gateway_http(tmp_path, config, {**env, "BREAKWATER_BREAKER_CONSECUTIVE_FAILURES": "1"}) as url:
        async with Client(url) as client:
            await wait_for_tool(client, "ts__bad")
            assert (await call_until_ready(client, "ts__bad", {})).is_error
        status = await anyio.to_thread.run_sync(
            lambda: subprocess.run([*BREAKWATER, "status", "--gateway", url], capture_output=True, text=True, env=env, timeout=60)
        )
    assert status.returncode == 1, status.stdout + status.stderr
    assert "ts: breaker open" in status.stdout and "ts/bad: breaker open" in status.stdout, status.stdout


async def test_http_rejects_foreign_origin_and_requires_token_when_set(tmp_path: Path, env: dict[str, str]) -> None:
    """DNS-rebinding protection: a foreign Origin is refused; with --token, a request without it is 401."""
    config = write_config(tmp_path, {})
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    async with gateway_http(tmp_path, config, env) as url, httpx2.AsyncClient() as http:
        evil = await http.post(url, json=body, headers={**headers, "origin": "http://evil.example"})
        assert evil.status_code == 403
        ok = await http.post(url, json=body, headers={**headers, "origin": url.rsplit("/", 1)[0]})
        assert ok.status_code == 200
    async with gateway_http(tmp_path, config, env, "--token", "s3cret-token") as url, httpx2.AsyncClient() as http:
        refused = await http.post(url, json=body, headers=headers)
        assert refused.status_code == 401
        # A JSON-RPC error, which the SDK's client relays to its caller (`{"error": ...}` read "an error response").
        assert refused.json()["error"]["message"].startswith("missing or wrong bearer token"), refused.text
        with pytest.raises(BaseException) as raised:  # the SDK raises it from its task group, in a group
            async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient())):
                pass
        leaves, found = [raised.value], []
        while leaves:
            leaf = leaves.pop()
            leaves += list(getattr(leaf, "exceptions", ()))
            found += [str(leaf)] if isinstance(leaf, MCPError) else []
        assert any("this breakwater gateway wants the token it was started with" in said for said in found), raised.value
        authed = await http.post(url, json=body, headers={**headers, "authorization": "Bearer s3cret-token"})
        assert authed.status_code == 200
        # `status --gateway` without the token said it could not reach the gateway and to check it runs.
        status = await anyio.to_thread.run_sync(
            lambda: subprocess.run([*BREAKWATER, "status", "--gateway", url], capture_output=True, text=True, env=env, timeout=60)
        )
        assert status.returncode == 2 and "wants a token (HTTP 401)" in status.stderr, status.stderr  # none was sent


def _sse_messages(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]


async def test_a_2025_post_is_one_json_body_unless_something_comes_before_its_answer(tmp_path: Path, env: dict[str, str]) -> None:
    """Default (SSE) mode: a call with nothing before its answer gets `application/json`; a call whose
    progress comes first gets an SSE stream, the progress first and the answer last (gateway/_lazy_sse.py)."""
    config = write_config(
        tmp_path, {"s": stdio_entry("--tool", "quick:latency=0,readonly", "--tool", "slow:latency=0.6,progress=0.1,readonly")}
    )
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    async with gateway_http(tmp_path, config, env) as url, httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(url, json=init, headers=headers)
        session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)

        async def call(i: int, name: str, meta: dict[str, Any]) -> httpx2.Response:
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": {}, "_meta": meta}}
            return await http.post(url, json=body, headers=session)

        with anyio.fail_after(30):
            # Until the upstream is ready (a call that waits for it longer than a second may be streamed).
            while True:
                ready = await call(2, "s__quick", {})
                answer = (
                    ready.json()
                    if ready.headers["content-type"].startswith("application/json")
                    else _sse_messages(ready.text)[-1]
                )
                if not answer["result"].get("isError"):
                    break
                await anyio.sleep(0.1)
        quick = await call(3, "s__quick", {})
        assert quick.headers["content-type"].startswith("application/json")
        assert quick.json()["id"] == 3 and not quick.json()["result"].get("isError")
        slow = await call(4, "s__slow", {"progressToken": "p"})
        assert slow.headers["content-type"].startswith("text/event-stream")
        messages = _sse_messages(slow.text)
        assert messages[0]["method"] == "notifications/progress"
        assert messages[-1]["id"] == 4 and not messages[-1]["result"].get("isError")


def test_non_loopback_listener_needs_a_token(tmp_path: Path, env: dict[str, str]) -> None:
    """Listening on 0.0.0.0 without a token is refused with exit code 2 and a fix."""
    config = write_config(tmp_path, {})
    env_no_token = {k: v for k, v in env.items() if k != "BREAKWATER_TOKEN"}
    result = subprocess.run(
        [*BREAKWATER, "serve", "--config", str(config), "--http", f"0.0.0.0:{free_port()}"],
        capture_output=True,
        text=True,
        env=env_no_token,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "--token" in result.stderr


def test_tools_command_gives_the_search_answer(tmp_path: Path, env: dict[str, str]) -> None:
    """`breakwater tools QUERY --json` answers like the search tool, naming servers it could not search."""
    # `deploy` is off here (its variable is not set): search said "No such tool ... (all searched)" without it.
    deploy = {**stdio_entry("--tool", "deploy_service:latency=0"), "env": {"TOKEN": "${BW_TEST_UNSET_DEPLOY_TOKEN}"}}
    config = write_config(
        tmp_path,
        {
            "files": stdio_entry("--tool", "read_file:latency=0.01,readonly"),
            "gone": {"command": "breakwater-gone-cmd"},
            "deploy": deploy,
        },
    )
    result = subprocess.run(
        [*BREAKWATER, "tools", "read", "--config", str(config), "--json", "--wait", "20"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert [m["name"] for m in answer["matches"]] == ["files__read_file"]
    assert answer["complete"] is False
    assert sorted(s["server"] for s in answer["not_searched"]) == ["deploy", "gone"]
    notes = {s["server"]: s for s in answer["not_searched"]}
    assert notes["gone"]["error"]["code"] == "spawn_failed"
    assert "BW_TEST_UNSET_DEPLOY_TOKEN" in notes["deploy"]["disabled_by"]


async def test_downstream_operation_id_reaches_the_upstream(tmp_path: Path, env: dict[str, str]) -> None:
    """An agent that sends `_meta["io.breakwater/operationId"]` gets that same id upstream, on every re-send."""
    from breakwater.testing.server import read_ledger

    ledger = tmp_path / "ledger.jsonl"
    config = write_config(
        tmp_path, {"shop": stdio_entry("--ledger", str(ledger), "--tool", "order:latency=0,mutating,idempotent")}
    )
    async with gateway_stdio(config, env) as client:
        await wait_ready(client, 1)
        meta = cast(RequestParamsMeta, {"io.breakwater/operationId": "agent-op-42"})
        for _ in range(2):
            result = await client.call_tool("shop__order", {"payload": "x"}, meta=meta)
            assert not result.is_error
        fresh = await client.call_tool("shop__order", {"payload": "y"})
        assert not fresh.is_error
    ids = [row["operation_id"] for row in read_ledger(ledger)]
    assert ids[:2] == ["agent-op-42", "agent-op-42"]
    assert ids[2] not in (None, "agent-op-42")


async def test_arguments_that_do_not_fit_the_schema_are_refused_before_sending(tmp_path: Path, env: dict[str, str]) -> None:
    """`add {"a": "two"}` against a schema that wants a number: INVALID_ARGUMENTS naming `a`, and nothing sent."""
    config = write_config(tmp_path, {"calc": stdio_entry()})
    async with gateway_stdio(config, env) as client:
        await wait_ready(client, 1)
        wrong = await client.call_tool("calc__add", {"a": "two", "b": 1})
        sc = wrong.structured_content or {}
        assert wrong.is_error and (sc["code"], sc["field"], sc["attempt"]) == ("INVALID_ARGUMENTS", "a", 0), sc
        assert "argument 'a'" in wrong.content[0].text  # type: ignore[union-attr]
        right = await client.call_tool("calc__add", {"a": 2, "b": 1})
        assert not right.is_error, right
        state = (await client.call_tool("calc__testserver_state", {})).structured_content or {}
    assert "add" in json.dumps(state) and '"two"' not in json.dumps(state)


async def test_a_url_that_keeps_refusing_is_described_with_what_is_known(tmp_path: Path, env: dict[str, str]) -> None:
    """A closed port: the call answers at once (no wait for a server that is retrying after refusals), saying since
    when it has failed, after how many attempts, and when the next one is, not "still starting up"."""
    config = write_config(tmp_path, {"down": {"type": "http", "url": f"http://127.0.0.1:{free_port()}/mcp"}})
    retrying = dict(env, BREAKWATER_CONNECT_BUDGET_S="120", BREAKWATER_CONNECT_BACKOFF_CAP_S="1")
    async with gateway_stdio(config, retrying) as client:
        with anyio.fail_after(30):
            while True:
                server = (await client.call_tool("breakwater_status", {})).structured_content["servers"][0]
                if server["state"] == "retrying" and server["attempts"] >= 2:
                    break
                await anyio.sleep(0.1)
        started = time.monotonic()
        result = await client.call_tool("down__anything", {})
        assert time.monotonic() - started < 1.5
    sc = result.structured_content or {}
    # Caught mid-attempt, the call waits for that attempt's (quick) refusal: the answer is always from `retrying`.
    assert (sc["code"], sc["state"]) == ("SERVER_CONNECTING", "retrying"), sc
    assert sc["failing_since"] == server["failing_since"] and sc["connect_attempts"] >= 2 and sc["next_retry_at"]
    assert "failed to connect since" in sc["message"] and "refused" in sc["message"]
    assert "still starting up" not in result.content[0].text  # type: ignore[union-attr]


def test_search_ranks_real_matches_and_pads_with_nothing() -> None:
    """A query matches on the words that name a tool: "legacy_tool" matches none of these (the word "tool" in a
    description is not a match), "create invoice" ranks the invoice tool first."""
    from breakwater.catalog._catalog import Entry
    from breakwater.catalog._search import rank

    def entry(name: str, description: str) -> Entry:
        server, tool = name.split("__")
        return Entry(name=name, server=server, tool=types.Tool(name=tool, description=description, input_schema={}), live=True)

    entries = [
        entry("everything__echo", "Echoes back the input; a test tool"),
        entry("everything__get-sum", "Returns the sum of two numbers"),
        entry("erp__create_invoice", "Create an invoice for a customer"),
        entry("memory__create_entities", "Create multiple new entities in the knowledge graph"),
        entry("files__read_file", "Read a file; this tool reads text"),
    ]
    assert rank(entries, "legacy_tool") == []
    assert rank(entries, "create invoice")[0][1].name == "erp__create_invoice"
    assert [e.name for _, e in rank(entries, "sum")] == ["everything__get-sum"]
    assert [e.name for _, e in rank(entries, "file tool")] == ["files__read_file"]
