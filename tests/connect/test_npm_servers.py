"""breakwater in front of real third-party MCP servers from npm.

`@modelcontextprotocol/server-everything`, `server-memory` and `server-filesystem` (the TypeScript SDK's
reference servers, installed into `.tools/` by `scripts/install_node_tools.sh` and launched with the Node
binary from there, never `npx`) sit behind one `breakwater serve`, seen by the SDK's client over stdio
and over HTTP: their tools are listed namespaced, with schemas unchanged, and one tool of each is called.
Without npm the test skips, except under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters

from conformance.node_tools import NodeTools, node_tools
from helpers import envelope_of

pytestmark = pytest.mark.anyio

SERVERS = ("everything", "memory", "filesystem")


@pytest.fixture(scope="module")
def tools() -> NodeTools:
    return node_tools()


def npm_config(tools: NodeTools, tmp_path: Path) -> Path:
    files = tmp_path / "files"
    files.mkdir()
    (files / "hello.txt").write_text("hello from breakwater\n")
    (files / "sub").mkdir()
    node = str(tools.node)
    servers = {
        "everything": {"command": node, "args": [str(tools.package_main("@modelcontextprotocol/server-everything")), "stdio"]},
        "memory": {
            "command": node,
            "args": [str(tools.package_main("@modelcontextprotocol/server-memory"))],
            "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
        },
        "filesystem": {"command": node, "args": [str(tools.package_main("@modelcontextprotocol/server-filesystem")), str(files)]},
    }
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    return config


def gateway_env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )


@asynccontextmanager
async def gateway(tmp_path: Path, config: Path, transport: str, mode: str) -> AsyncIterator[Client]:
    cmd = [sys.executable, "-m", "breakwater", "serve", "--config", str(config)]
    if transport == "stdio":
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=gateway_env(tmp_path))
        async with Client(params, mode=mode) as client:
            yield client
        return
    port_file = tmp_path / "gw.port"
    proc = subprocess.Popen(
        [*cmd, "--http", "127.0.0.1:0", "--port-file", str(port_file)],
        env=gateway_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the gateway did not announce its port"
            await anyio.sleep(0.05)
        async with Client(f"http://127.0.0.1:{int(port_file.read_text())}/mcp", mode=mode) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(timeout=15)


async def wait_all_ready(client: Client, timeout: float = 60) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            status = (await client.call_tool("breakwater_status", {})).structured_content or {}
            states = {s["name"]: s["state"] for s in status.get("servers", [])}
            if states and all(v == "ready" for v in states.values()):
                return status
            if any(v == "failed" for v in states.values()):
                raise AssertionError(json.dumps(status, indent=2))
            await anyio.sleep(0.2)


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def direct_tools(tools: NodeTools, entry: dict[str, Any]) -> dict[str, types.Tool]:
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry.get("env"))
    async with Client(params) as client:
        return {t.name: t for t in (await client.list_tools()).tools}


@pytest.mark.parametrize(("transport", "mode"), [("stdio", "legacy"), ("http", "auto")])
async def test_gateway_lists_and_calls_real_npm_servers(tools: NodeTools, tmp_path: Path, transport: str, mode: str) -> None:
    """Downstream 2025-11-25 over stdio and 2026-07-28 over HTTP; the npm servers themselves speak 2025-era."""
    config = npm_config(tools, tmp_path)
    entries = json.loads(config.read_text())["mcpServers"]
    async with gateway(tmp_path, config, transport, mode) as client:
        # `execution` (task support) says how the upstream takes a tool; the gateway takes each as an ordinary
        # call (a task-only one it runs as a task itself) and offers no 2025-11-25 tasks, so it lists none.
        differs_by_era = {"name", "execution"}
        await wait_all_ready(client)
        listed = {t.name: t for t in (await client.list_tools()).tools}

        # Every upstream tool is there under server__tool, definition unchanged.
        for server in SERVERS:
            upstream = await direct_tools(tools, entries[server])
            assert upstream, f"{server} listed no tools"
            for name, tool in upstream.items():
                mine = listed.get(f"{server}__{name}")
                assert mine is not None, f"{server}__{name} missing from {sorted(listed)}"
                assert mine.model_dump(exclude=differs_by_era) == tool.model_dump(exclude=differs_by_era)
                assert mine.execution is None

        echo = await client.call_tool("everything__echo", {"message": "through breakwater"})
        assert not echo.is_error, echo
        assert "through breakwater" in text_of(echo)

        entity = {"name": "breakwater", "entityType": "project", "observations": ["sits in front of MCP servers"]}
        created = await client.call_tool("memory__create_entities", {"entities": [entity]})
        assert not created.is_error, created
        graph = await client.call_tool("memory__read_graph", {})
        assert not graph.is_error, graph
        assert "sits in front of MCP servers" in text_of(graph) + json.dumps(graph.structured_content or {})

        files = str(tmp_path / "files")
        listing = await client.call_tool("filesystem__list_directory", {"path": files})
        assert not listing.is_error, listing
        assert "hello.txt" in text_of(listing) and "sub" in text_of(listing)
        outside = await client.call_tool("filesystem__list_directory", {"path": "/etc"})
        assert outside.is_error  # the server's own refusal passes through as a tool error
        # A model reading files that are not there is the model's mistake, not a failing tool: its breaker stays
        # closed (four such reads opened it, and the next read of a file that exists was refused CIRCUIT_OPEN).
        for n in range(8):
            missing = await client.call_tool("filesystem__read_text_file", {"path": f"{files}/nope{n}.txt"})
            assert envelope_of(missing).get("code") == "TOOL_ERROR", missing
        there = await client.call_tool("filesystem__read_text_file", {"path": f"{files}/hello.txt"})
        assert not there.is_error and "hello from breakwater" in text_of(there), there
