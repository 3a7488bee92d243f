"""`serve` on Gemini CLI's settings.json and on Codex's config.toml: the servers start as those agents start them.

Real `serve` over stdio, a real SDK client, real servers: a stdio server that reports its environment, the
test server, and an SDK server on a real 127.0.0.1 port that reports the Authorization header it got. What
each agent's file says (a `$NAME` variable, `env_vars`, `bearer_token_env_var`, tool lists, `mcp.excluded`,
`tool_timeout_sec`) must reach the server, or keep a tool from it, as it would behind the agent itself.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import Context, MCPServer

from breakwater.testing.server import launch_command
from helpers import code_of, envelope_of, isolated_env

pytestmark = pytest.mark.anyio

ENV_SERVER = """
import os
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("env")

@mcp.tool()
def getenv(name: str) -> str:
    \"\"\"The value of one environment variable of this process, or <unset>.\"\"\"
    return os.environ.get(name, "<unset>")

mcp.run()
"""


@asynccontextmanager
async def _whoami_server() -> AsyncIterator[str]:
    """An SDK server on a real port whose `whoami` tool answers the Authorization header of its request."""
    mcp = MCPServer("whoami")

    @mcp.tool()
    def whoami(ctx: Context) -> str:
        """The Authorization header this request arrived with."""
        return str((ctx.headers or {}).get("authorization", ""))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(), log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        server.should_exit = True


@asynccontextmanager
async def _serve(tmp_path: Path, config: Path, **env: str) -> AsyncIterator[Client]:
    args = ["-m", "breakwater", "serve", "--no-share", "--config", str(config)]
    params = StdioServerParameters(command=sys.executable, args=args, env=isolated_env(tmp_path, **env))
    async with Client(params) as client:
        yield client


async def _tools_when(client: Client, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        names = sorted(t.name for t in (await client.list_tools()).tools if not t.name.startswith("breakwater_"))
        await anyio.sleep(0.05)
    return names


async def _text(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result
    return str((result.structured_content or {}).get("result", ""))


def _tester(*flags: str) -> dict[str, Any]:
    command = launch_command(*flags)
    return {"command": command[0], "args": command[1:]}


async def test_gemini_settings_behind_breakwater_start_servers_as_gemini_does(tmp_path: Path) -> None:
    script = tmp_path / "env_server.py"
    script.write_text(ENV_SERVER)
    async with _whoami_server() as url:
        folder = tmp_path / ".gemini"
        folder.mkdir()
        settings = folder / "settings.json"
        settings.write_text(
            json.dumps(
                {
                    "theme": "GitHub",
                    "mcp": {"excluded": ["off"]},
                    "mcpServers": {
                        "env": {"command": sys.executable, "args": [str(script)], "env": {"API_KEY": "$MY_KEY"}, "trust": True},
                        "remote": {"httpUrl": url, "headers": {"Authorization": "Bearer $MY_KEY"}, "timeout": 30000},
                        "tester": {**_tester("--tool", "add", "--tool", "wipe"), "excludeTools": ["wipe"]},
                        "off": _tester("--tool", "never"),
                    },
                }
            )
        )
        with anyio.fail_after(60):
            async with _serve(tmp_path, settings, MY_KEY="key-from-env") as client:
                assert await _tools_when(client, 4) == [
                    "env__getenv",
                    "remote__whoami",
                    "tester__add",
                    "tester__testserver_state",
                ]
                assert await _text(client, "env__getenv", {"name": "API_KEY"}) == "key-from-env"
                assert await _text(client, "remote__whoami", {}) == "Bearer key-from-env"
                refused = await client.call_tool("tester__wipe", {})
                assert code_of(refused) == "UNKNOWN_TOOL"
                assert "disabled in the config (excludeTools)" in envelope_of(refused)["message"]
                status = json.loads((await client.call_tool("breakwater_status", {})).content[0].text)  # type: ignore[union-attr]
    states = {s["name"]: s["state"] for s in status["servers"]}
    assert states["off"] == "disabled" and states["tester"] == "ready"


async def test_codex_config_behind_breakwater_starts_servers_as_codex_does(tmp_path: Path) -> None:
    script = tmp_path / "env_server.py"
    script.write_text(ENV_SERVER)
    slow = _tester("--name", "slow", "--tool", "slow:latency=1.5")
    async with _whoami_server() as url:
        folder = tmp_path / ".codex"
        folder.mkdir()
        config = folder / "config.toml"
        config.write_text(
            f"""model = "gpt-5"

[mcp_servers.env]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(script))}]
env_vars = ["MY_KEY"]

[mcp_servers.remote]
url = "{url}"
bearer_token_env_var = "MY_TOKEN"

[mcp_servers.patient]
command = {json.dumps(slow["command"])}
args = {json.dumps(slow["args"])}
tool_timeout_sec = 20
enabled_tools = ["slow"]

[mcp_servers.hasty]
command = {json.dumps(slow["command"])}
args = {json.dumps(slow["args"])}
enabled_tools = ["slow"]
"""
        )
        env = {"MY_KEY": "key-from-env", "NOT_PASSED": "x", "MY_TOKEN": "token-from-env", "BREAKWATER_CALL_TIMEOUT_S": "0.5"}
        with anyio.fail_after(60):
            async with _serve(tmp_path, config, **env) as client:
                assert await _tools_when(client, 4) == ["env__getenv", "hasty__slow", "patient__slow", "remote__whoami"]
                # env_vars passes on what it names, and only that: a stdio server gets a minimal environment.
                assert await _text(client, "env__getenv", {"name": "MY_KEY"}) == "key-from-env"
                assert await _text(client, "env__getenv", {"name": "NOT_PASSED"}) == "<unset>"
                assert await _text(client, "remote__whoami", {}) == "Bearer token-from-env"
                # tool_timeout_sec is the server's timeout: 1.5 s of work fits in it, not in the 0.5 s default.
                assert not (await client.call_tool("patient__slow", {})).is_error
                hasty = envelope_of(await client.call_tool("hasty__slow", {}))
                # (cut at its deadline; a tool of no stated retry class may have run, so it is not "just a timeout")
                assert (hasty["code"], hasty["reason"], hasty["timeout_s"]) == ("OUTCOME_UNKNOWN", "deadline expired", 0.5)


@pytest.mark.parametrize(("client", "at_most"), [("opencode", 4.6), ("claude-code", 4.6), ("cursor", 6.5)])
async def test_a_first_tools_list_is_answered_before_the_agent_gives_up_on_it(
    tmp_path: Path, client: str, at_most: float
) -> None:
    """OpenCode closes a server whose first tools/list takes over 5 s (its `timeout`, default 5000 ms) and loses every
    tool of it; `claude mcp list` gives the list 5 s too, and printed "tools fetch failed": breakwater answers such
    an agent a second sooner than the 5 s it waits for the others. Wall clock."""
    from mcp.types import Implementation

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"quick": _tester("--tool", "add"), "slow": _tester("--startup-delay", "60")}}))
    args = ["-m", "breakwater", "serve", "--no-share", "--config", str(config)]
    params = StdioServerParameters(command=sys.executable, args=args, env=isolated_env(tmp_path))
    async with Client(params, client_info=Implementation(name=client, version="1.0")) as session:
        started = anyio.current_time()
        names = [t.name for t in (await session.list_tools()).tools]
        took = anyio.current_time() - started
    assert "quick__add" in names and not any(n.startswith("slow__") for n in names)
    assert 3.5 <= took <= at_most, took  # it did wait for the slow server, and no longer than the agent allows
