"""The gateway's own stdio transport (`breakwater.gateway._stdio_server`), driven over real pipes in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# A tiny MCP server on breakwater's transport whose tool prints to stdout and writes to fd 1: both
# must land on stderr, never on the JSON-RPC wire.
SERVER = textwrap.dedent(
    """
    import os, sys, anyio, mcp.types as types
    from mcp.server.lowlevel import Server
    from breakwater.gateway._stdio_server import stdio_server

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name="noisy", input_schema={"type": "object"})])

    async def call_tool(ctx, params):
        print("stray print")
        os.write(1, b"stray fd write\\n")
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    server = Server("noisy", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        async with stdio_server(fast=sys.argv[1] == "fast") as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
    """
)

REQUESTS = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"id": 11, "method": "ping"},  # no "jsonrpc": answered with the error the spec names, the session goes on
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "noisy", "arguments": {}}},
]


def run_server(tmp_path: Path, path: str) -> tuple[int, list[str], str]:
    """Send the requests, read stdout until the tool call's reply, then close stdin: (exit code, stdout lines, stderr)."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    wire = "".join(json.dumps(r) + "\n" for r in REQUESTS)
    proc = subprocess.Popen(
        [sys.executable, str(script), path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(wire)
    proc.stdin.flush()
    lines: list[str] = []
    while not any('"id": 2' in line or '"id":2' in line for line in lines):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    proc.stdin.close()  # the MCP stdio shutdown: the server sees EOF and exits
    lines += proc.stdout.read().splitlines()
    return proc.wait(timeout=60), lines, proc.stderr.read()


def answers(lines: list[str]) -> dict[int, Any]:
    # Every stdout line must be JSON-RPC: a stray line would break the client's framing.
    messages = [json.loads(line) for line in lines]
    return {m["id"]: m for m in messages if "id" in m}


@pytest.mark.parametrize("path", ["fast", "portable"])
def test_pipes_serve_and_keep_stray_output_off_the_wire(tmp_path: Path, path: str) -> None:
    """Both paths, whichever this platform takes by default: asyncio's pipe transports and the portable threads."""
    code, lines, stderr = run_server(tmp_path, path)
    assert code == 0, stderr
    assert answers(lines)[2]["result"]["content"][0]["text"] == "ok"
    assert answers(lines)[11]["error"]["code"] == -32600
    assert "stray print" in stderr and "stray fd write" in stderr
