"""VS Code's `"env": {"NAME": null}`: the server does not inherit NAME, set as it is where breakwater runs.

Real `breakwater serve` processes start a real stdio server that reports its own environment, on its own and as a
session's own server behind a shared gateway (whose environment is the session's). The in-call log relay is here
too: a message the server logs during a call reaches the caller named for its server, as one outside a call does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from breakwater.testing.server import launch_command
from helpers import share_dir

# The logging capability is deprecated as of 2026-07-28; a 2025-11-25 client (`mode="legacy"`) still uses it.
pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

BREAKWATER = [sys.executable, "-m", "breakwater"]
SECRET = "s3cr3t-token-value-0123456789"

_ENV_SERVER = """
import json, os
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("env")


@server.tool()
def environment() -> str:
    return json.dumps({name: os.environ.get(name) for name in ("BW_GONE", "BW_KEPT", "FROM_ENTRY", "PATH")})


@server.tool()
async def speak(ctx: Context) -> str:
    await ctx.info("spoken", logger_name="audit-" + os.environ["API_KEY"])
    return "said"


server.run("stdio")
"""


def vscode_config(tmp_path: Path, **more: Any) -> Path:
    """A VS Code mcp.json whose `env` unsets BW_GONE (and the one envFile sets), sets FROM_ENTRY and a secret."""
    script = tmp_path / "env_server.py"
    script.write_text(_ENV_SERVER)
    (tmp_path / "server.env").write_text("BW_GONE=from-the-env-file\n")
    entry = {
        "type": "stdio",
        "command": sys.executable,
        "args": [str(script)],
        "envFile": str(tmp_path / "server.env"),
        "env": {"BW_GONE": None, "FROM_ENTRY": "e", "API_KEY": SECRET},
    }
    path = tmp_path / ".vscode" / "mcp.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"servers": {"env": entry, **more}}))
    return path


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        "BW_GONE": "set-where-breakwater-runs",
        **extra,
    }


async def reported(client: Client) -> dict[str, str | None]:
    result = await client.call_tool("env__environment", {})
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return dict(json.loads(block.text))


@asynccontextmanager
async def serve(config: Path, env: dict[str, str], logs: list[types.LoggingMessageNotificationParams]) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    with (config.parent / "stderr.txt").open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy", logging_callback=on_log) as client:
            yield client


async def test_a_null_env_value_keeps_the_variable_from_the_server(tmp_path: Path) -> None:
    """BW_GONE is set where breakwater runs (and in the entry's envFile); `"BW_GONE": null` keeps it from the server,
    which still inherits the rest (PATH, BW_KEPT) and gets its entry's own values. Breakwater refused the file."""
    config = vscode_config(tmp_path)
    logs: list[types.LoggingMessageNotificationParams] = []
    async with serve(config, base_env(tmp_path, BREAKWATER_SHARE="off", BW_KEPT="k"), logs) as client:
        seen = await reported(client)
        assert seen["BW_GONE"] is None
        assert (seen["BW_KEPT"], seen["FROM_ENTRY"]) == ("k", "e")
        assert seen["PATH"] == os.environ["PATH"]
        # During a call, a log message is named for its server as outside one ("server/its-logger"), secrets redacted.
        await client.set_logging_level("debug")
        said = await client.call_tool("env__speak", {})
        assert not said.is_error, said
    assert [(p.logger, p.data) for p in logs] == [("env/audit-<redacted>", "spoken")]


def test_config_check_says_the_variable_is_not_inherited(tmp_path: Path) -> None:
    """`config check` accepts the file and says what the null does and which clients read it otherwise."""
    config = vscode_config(tmp_path)
    done = subprocess.run(
        [*BREAKWATER, "config", "check", "--config", str(config)], capture_output=True, text=True, env=base_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # wrapped to the terminal's width
    assert "env.BW_GONE: null, not inherited by this server (as VS Code reads it; Claude Code" in said
    assert SECRET not in done.stdout


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """An HTTP testserver, so that sessions have a gateway to share."""
    directory = Path(tempfile.mkdtemp(prefix="bw-unset-"))
    port_file = directory / "port"
    proc = subprocess.Popen([*launch_command("--port", "0", "--port-file", str(port_file))], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "the testserver did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_sessions_own_server_does_not_inherit_the_unset_variable(tmp_path: Path, upstream: str) -> None:
    """Behind a shared gateway, a session's own stdio server inherits the session's environment: never BW_GONE,
    which that session sets, while the session's other variables (BW_KEPT) still reach it."""
    config = vscode_config(tmp_path, web={"type": "http", "url": upstream})
    logs: list[types.LoggingMessageNotificationParams] = []
    with share_dir("bw-unset-") as share:
        env = base_env(tmp_path, BREAKWATER_SHARE="on", BREAKWATER_SHARE_DIR=str(share), BREAKWATER_SHARE_IDLE_S="5")
        async with serve(config, env, logs) as first:
            await reported(first)  # the first session started the gateway; the second attaches to it
            async with serve(config, {**env, "BW_KEPT": "second session's"}, logs) as second:
                seen = await reported(second)
        assert seen["BW_GONE"] is None
        assert (seen["BW_KEPT"], seen["FROM_ENTRY"]) == ("second session's", "e")
        assert list(share.glob("gw-*")), "no gateway was shared: this did not test a session's own server"
