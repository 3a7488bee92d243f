"""A tool left out for its invalid definition is named as the gateway would list it, through the configured template.

The agent (and the person reading `status` or `tools`) knows tools by their downstream names; with
`tool_name_template = "{server}.{tool}"` a line saying `broken__broken_schema` names nothing they can
find. The server is `tests/connect/broken_upstream.py`, a real stdio process listing tools that break
the MCP schema.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from breakwater import Breakwater, ConnectPolicy, ServerSpec
from breakwater.catalog._catalog import Catalog
from breakwater.config import BreakerPolicy, Config, GatewayPolicy, JournalPolicy
from breakwater.gateway._server import Gateway
from breakwater.gateway._session import session_gateway
from breakwater.gateway._share import shared_config

SCRIPT = Path(__file__).parents[1] / "connect" / "broken_upstream.py"
TEMPLATE = "{server}-{tool}"


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "breakwater.toml"
    path.write_text(
        f"[gateway]\ntool_name_template = {json.dumps(TEMPLATE)}\n"
        f'[journal]\nurl = "off"\n'
        f"[servers.broken]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps([str(SCRIPT), '--bad-tools'])}\n"
    )
    return path


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        COLUMNS="250",  # one line per left-out tool, however wide the terminal the suite runs in
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    return subprocess.run(
        [sys.executable, "-m", "breakwater", *args, "--config", str(_config(tmp_path))],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=90,
        check=False,
    )


def test_status_and_tools_name_left_out_tools_through_the_template(tmp_path: Path) -> None:
    """`status` and `tools` (text and JSON) say `broken-broken_schema`, never `broken__broken_schema`."""
    status = _run(tmp_path, "status", "--wait", "30")
    assert "tool 'broken-broken_schema' (listed as 'broken_schema') left out: inputSchema" in status.stdout + status.stderr
    tools = _run(tmp_path, "tools", "--wait", "30")
    assert "- broken-broken_schema: inputSchema" in tools.stdout, tools.stdout
    as_json = json.loads(_run(tmp_path, "tools", "--json", "--wait", "30").stdout)
    assert {(t["name"], t["tool"]) for t in as_json["left_out"]} == {
        ("broken-broken_schema", "broken_schema"),
        ("broken-no_schema", "no_schema"),
        ("broken-echo", "echo"),
        ("broken-", ""),  # a tool without a name
        ("broken-any_type", "any_type"),  # a schema no model API takes
    }
    for text in (status.stdout, status.stderr, tools.stdout, json.dumps(as_json)):
        assert "broken__" not in text


@asynccontextmanager
async def _gateway(tmp_path: Path, name: str, flag: str, policy: GatewayPolicy, **spec_kw: Any) -> AsyncIterator[Gateway]:
    """A gateway over `broken_upstream.py FLAG` as server `name`, ready, its `watch` running: in-process, as `serve`
    builds one."""
    connect = ConnectPolicy(startup_jitter_s=0, health_interval_s=0)
    spec = ServerSpec(name=name, transport="stdio", command=sys.executable, args=(str(SCRIPT), flag), connect=connect, **spec_kw)
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"), gateway=policy)
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            await bw.wait_ready(timeout=30)
            yield gateway
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_status_and_search_tools_name_left_out_tools_through_the_template(tmp_path: Path) -> None:
    """What the agent reads: both built-in tools name a left-out tool as it would be listed, and the status tool says
    which template (so `status --gateway` can name them too)."""
    policy = GatewayPolicy(tool_name_template=TEMPLATE)
    async with _gateway(tmp_path, "broken", "--bad-tools", policy) as gateway, Client(gateway.server) as client:
        status = (await client.call_tool(policy.status_tool, {})).structured_content or {}
        search = await client.call_tool(policy.search_tool, {"query": "schema"})
    assert status["tool_name_template"] == TEMPLATE
    left_out = {t["name"] for t in status["left_out"]}
    assert left_out == {"broken-broken_schema", "broken-no_schema", "broken-echo", "broken-", "broken-any_type"}
    text = search.content[0].text  # type: ignore[union-attr]
    assert "- broken-no_schema: inputSchema" in text and "broken__" not in text


@pytest.mark.anyio
async def test_the_status_tool_names_a_breaker_that_is_not_closed(tmp_path: Path) -> None:
    """A ready server whose breaker refused every call read as healthy to the agent ("ready", no error)."""
    policy = GatewayPolicy()
    breaker = BreakerPolicy(consecutive_failures=1, failure_rate=1.0, open_base_s=60.0)
    async with _gateway(tmp_path, "rude", "--rude", policy, breaker=breaker) as gateway, Client(gateway.server) as client:
        before = (await client.call_tool(policy.status_tool, {})).structured_content or {}
        failed = await client.call_tool("rude__malformed", {"shape": "null"})
        after = (await client.call_tool(policy.status_tool, {})).structured_content or {}
    assert before["breakers"] == [] and failed.is_error
    opened = {b["name"]: (b["state"], b["retry_after_s"] > 0) for b in after["breakers"]}
    assert opened == {"rude": ("open", True), "rude/malformed": ("open", True)}, after["breakers"]  # the server's, the tool's


@pytest.mark.anyio
async def test_a_finished_connection_is_no_longer_held_for_list_changed(tmp_path: Path) -> None:
    """Each 2025-11-25 connection that listed or called was held until a notification to it failed: 26 MB per 1,000
    HTTP sessions (`serve --http`, measured), and an id that a later connection could reuse."""
    async with _gateway(tmp_path, "rude", "--rude", GatewayPolicy()) as gateway:
        for _ in range(3):
            async with Client(gateway.server, mode="legacy") as client:
                await client.list_tools()
                held = len(gateway._legacy_connections)
        assert held == 1  # while its connection lived
        assert gateway._legacy_connections == {}


@pytest.mark.anyio
async def test_a_sessions_own_servers_breakers_are_named_too(tmp_path: Path) -> None:
    """An attached session whose config has a stdio server of its own: the status tool reads both sides' gates (it
    failed for every such session, "'SessionServers' object has no attribute 'gate_status'")."""
    policy = GatewayPolicy()
    connect = ConnectPolicy(startup_jitter_s=0, health_interval_s=0)
    breaker = BreakerPolicy(consecutive_failures=1, failure_rate=1.0, open_base_s=60.0)
    rude = (str(SCRIPT), "--rude")
    own = ServerSpec(name="rude", transport="stdio", command=sys.executable, args=rude, connect=connect, breaker=breaker)
    config = Config(servers=(own,), journal=JournalPolicy(url="off"), gateway=policy)
    async with Breakwater(shared_config(config), admission_dir=tmp_path / "admission") as bw:
        shared = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        async with session_gateway(shared, config) as gateway, Client(gateway.server) as client:
            with anyio.fail_after(30):
                while gateway.bw.upstream("rude").state != "ready":
                    await anyio.sleep(0.05)
            failed = await client.call_tool("rude__malformed", {"shape": "null"})
            after = (await client.call_tool(policy.status_tool, {})).structured_content or {}
    assert failed.is_error
    assert {b["name"]: b["state"] for b in after["breakers"]} == {"rude": "open", "rude/malformed": "open"}, after
