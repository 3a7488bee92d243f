"""A planted secret never appears in anything breakwater writes: outputs, errors, logs, caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from breakwater.testing.server import launch_command, serve_http

pytestmark = pytest.mark.anyio

SECRET = "sk-planted-7f3a9c2e1d"


def everything_written(root: Path) -> str:
    """The text of every file under `root`."""
    chunks = []
    for path in root.rglob("*"):
        if path.is_file():
            chunks.append(path.read_bytes().decode("utf-8", errors="replace"))
    return "\n".join(chunks)


async def test_planted_secret_never_leaks(tmp_path: Path) -> None:
    """Secrets in env, headers and a URL's query: not in status, tools, call, config check, gateway results, logs or caches."""
    state_dir = tmp_path / "state"
    env = dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(state_dir / "admission"),
        BREAKWATER_CATALOG_DIR=str(state_dir / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        XDG_CACHE_HOME=str(state_dir / "cache"),
    )
    async with serve_http("--status-first", "100000", "--status", "401") as locked:
        crash = launch_command("--exit-at-start", "1", "--exit-message", f"bad credentials: API_KEY={SECRET}")
        ok = launch_command("--tool", "echo:latency=0")
        servers: dict[str, Any] = {
            "crashy": {"command": crash[0], "args": crash[1:], "env": {"API_KEY": SECRET}},
            "fine": {"command": ok[0], "args": ok[1:], "env": {"API_KEY": SECRET}},
            "locked": {"type": "http", "url": f"{locked.url}?token={SECRET}", "headers": {"Authorization": f"Bearer {SECRET}"}},
        }
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": servers}))
        outputs: list[str] = []
        for command in (
            ["status", "--json", "--wait", "15"],
            ["status", "--wait", "5"],
            ["tools", "--json", "--wait", "5"],
            ["tools", "echo", "--wait", "5"],
            ["call", "fine", "echo", "--wait", "15"],
            ["call", "crashy", "anything", "--wait", "5"],
            ["call", "locked", "anything", "--wait", "5", "--json"],
            ["config", "check"],
            ["config", "check", "--json"],
        ):
            result = subprocess.run(
                [sys.executable, "-m", "breakwater", *command, "--config", str(config)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )
            outputs += [result.stdout, result.stderr]
        # The reasons are there, just not the secret.
        assert any("auth_required" in o for o in outputs) and any("bad credentials" in o for o in outputs)

        stderr_log = tmp_path / "gateway-stderr.log"
        with stderr_log.open("w") as errfile:
            params = StdioServerParameters(
                command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env
            )
            async with Client(stdio_client(params, errlog=errfile)) as client:
                with anyio.fail_after(30):
                    while True:
                        status = await client.call_tool("breakwater_status", {})
                        summary = (status.structured_content or {})["summary"]
                        if summary.get("ready") == 1 and summary.get("failed", 0) + summary.get("retrying", 0) >= 2:
                            break
                        await anyio.sleep(0.2)
                for name, args in (
                    ("crashy__anything", {}),
                    ("locked__anything", {}),
                    ("fine__echo", {"payload": "hello"}),
                    ("breakwater_search_tools", {"query": "anything"}),
                    ("breakwater_status", {}),
                ):
                    outputs.append((await client.call_tool(name, args)).model_dump_json())
        outputs.append(stderr_log.read_text())
    leaks = [
        o[max(0, o.find(SECRET) - 300) : o.find(SECRET) + 50] for o in [*outputs, everything_written(state_dir)] if SECRET in o
    ]
    assert leaks == []
