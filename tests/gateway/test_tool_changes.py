"""A server that changes its tools while it runs, and says so, is heard at once.

A real `breakwater serve` (stdio) in front of a real SDK server that adds a tool, and rewords one,
when asked, each time saying its tools changed: `notifications/tools/list_changed` on the connection
(2025-11-25), or on a `subscriptions/listen` stream (2026-07-28). With the health check off, only
that can tell breakwater: the client must get its own `list_changed`, list the new tool and call it,
and `breakwater_status` must show the reworded tool as drift, within seconds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters

pytestmark = pytest.mark.anyio

_GROWING_SERVER = """
import contextlib
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("grow")


async def changed(ctx: Context) -> None:
    await ctx.notify_tools_changed()  # to 2026-07-28 listeners
    with contextlib.suppress(Exception):  # on the connection, where 2025-11-25 has it
        await ctx.session.send_tool_list_changed()


def secret() -> str:
    return "the secret tool answers"


def echo(text: str) -> str:
    return text


server.add_tool(echo, name="echo", description="Echo the text.")


@server.tool()
async def unlock(ctx: Context) -> str:
    server.add_tool(secret, name="secret", description="Only there once unlocked.")
    await changed(ctx)
    return "unlocked"


@server.tool()
async def reword(ctx: Context) -> str:
    server.remove_tool("echo")
    server.add_tool(echo, name="echo", description="Echo the text, now described otherwise.")
    await changed(ctx)
    return "reworded"


server.run("stdio")
"""


def serve(tmp_path: Path, config: Path, era: str, **more: str) -> StdioServerParameters:
    """A `breakwater serve` of `config` whose upstream speaks `era`, with no periodic re-list: only what the
    server says can tell breakwater its lists changed."""
    env = {
        **os.environ,
        **more,
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        "BREAKWATER_HEALTH_INTERVAL_S": "0",
        "BREAKWATER_PROTOCOL": era,
    }
    return StdioServerParameters(command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env)


@pytest.mark.parametrize("era", ["2025-11-25", "2026-07-28"])
async def test_a_tool_the_server_adds_or_rewords_reaches_the_client_at_its_list_changed(tmp_path: Path, era: str) -> None:
    script = tmp_path / "grow.py"
    script.write_text(_GROWING_SERVER)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"g": {"command": sys.executable, "args": [str(script)]}}}))
    heard = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.set()

    async with Client(serve(tmp_path, config, era), mode="legacy", message_handler=on_message) as client:

        async def listed() -> dict[str, types.Tool]:
            return {t.name: t for t in (await client.list_tools()).tools}

        with anyio.fail_after(30):
            while "g__unlock" not in await listed():
                await anyio.sleep(0.1)
        assert "g__secret" not in await listed()
        heard = anyio.Event()  # list_changed from the start-up is not the one this test waits for

        assert not (await client.call_tool("g__unlock", {})).is_error
        with anyio.fail_after(10):
            await heard.wait()
        assert "g__secret" in await listed()
        found = await client.call_tool("g__secret", {})
        assert not found.is_error and "the secret tool answers" in str(found.content)

        heard = anyio.Event()
        assert not (await client.call_tool("g__reword", {})).is_error
        with anyio.fail_after(10):
            await heard.wait()
        status = (await client.call_tool("breakwater_status", {})).structured_content or {}
        assert status["drift"] == {"g": ["echo"]}, status  # the default, warn: listed, and said to have changed
        assert (await listed())["g__echo"].description == "Echo the text, now described otherwise."


_PROMPTS_SERVER = """
import contextlib, sys, time
from mcp.server.mcpserver import Context, MCPServer

time.sleep(float(sys.argv[1]))  # a server that takes its time to start, as npx servers do

server = MCPServer("slow")


@server.prompt()
def review() -> str:
    return "Review this change."


def summarise() -> str:
    return "Summarise this thread."


@server.tool()
async def add_prompt(ctx: Context) -> str:
    server.prompt(name="summarise")(summarise)
    await ctx.notify_prompts_changed()  # to 2026-07-28 listeners
    with contextlib.suppress(Exception):  # on the connection, where 2025-11-25 has it
        await ctx.session.send_prompt_list_changed()
    return "added"


server.run("stdio")
"""


@pytest.mark.parametrize("era", ["2025-11-25", "2026-07-28"])
async def test_prompts_of_a_server_that_comes_late_or_adds_one_reach_a_client_that_listed_them_first(
    tmp_path: Path, era: str
) -> None:
    """A client lists prompts as it starts (Claude Code's slash commands), before a server slower than the
    first list's wait (`list_wait_s`, 0 here) is ready: the gateway says `prompts/list_changed` when it is, and
    again when the server says its prompts changed."""
    script = tmp_path / "slow.py"
    script.write_text(_PROMPTS_SERVER)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"s": {"command": sys.executable, "args": [str(script), "2"]}}}))
    heard = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.PromptListChangedNotification):
            heard.set()

    params = serve(tmp_path, config, era, BREAKWATER_LIST_WAIT_S="0")
    async with Client(params, mode="legacy", message_handler=on_message) as client:

        async def prompts() -> set[str]:
            return {p.name for p in (await client.list_prompts()).prompts}

        assert client.server_capabilities.prompts is not None and client.server_capabilities.prompts.list_changed
        assert await prompts() == set()  # the server is still starting
        await client.list_tools()  # as clients do at start: the gateway now knows this connection
        with anyio.fail_after(30):
            await heard.wait()
        assert await prompts() == {"s__review"}

        heard = anyio.Event()
        assert not (await client.call_tool("s__add_prompt", {})).is_error
        with anyio.fail_after(10):
            await heard.wait()
        assert await prompts() == {"s__review", "s__summarise"}
