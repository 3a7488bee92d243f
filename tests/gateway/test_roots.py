"""A server that serves one client gets that client's roots through breakwater, as it would without it.

Claude Code and VS Code answer `roots/list` with the directories they work in, and a filesystem
server started without directories works only in those. Each test runs real `breakwater serve`
processes over stdio, driven by the SDK's client speaking the handshake era (as Claude Code does),
in both launch modes: attached to the shared gateway (the default) and `--no-share`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client

from conformance.node_tools import NodeTools, node_tools
from helpers import code_of, gateway_pids, share_dir

pytestmark = pytest.mark.anyio

MODES = ("attached", "no-share")


@pytest.fixture
def share() -> Iterator[Path]:
    """A socket directory of the test's own; its gateways die after."""
    with share_dir("bw-rt-") as directory:
        yield directory


def env_for(tmp_path: Path, share: Path) -> dict[str, str]:
    return {
        **os.environ,
        "BREAKWATER_SHARE": "on",  # the suite turns it off (tests/conftest.py); these tests launch as an agent does
        "BREAKWATER_SHARE_DIR": str(share),
        "BREAKWATER_SHARE_IDLE_S": "20",
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
    }


class Roots:
    """What the client answers to `roots/list`, changeable while it runs; and how often it was asked."""

    def __init__(self, *paths: Path) -> None:
        self.paths = list(paths)
        self.asked = 0

    async def __call__(self, context: ClientRequestContext) -> types.ListRootsResult:
        self.asked += 1
        return types.ListRootsResult(roots=[types.Root.model_validate({"uri": p.as_uri()}) for p in self.paths])


@asynccontextmanager
async def session(config: Path, env: dict[str, str], mode: str, roots: Roots | None) -> AsyncIterator[Client]:
    """A `breakwater serve` session of a handshake-era client that lists `roots` (none: a client without roots)."""
    flags = ["--no-share"] if mode == "no-share" else []
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config), *flags], env=env
    )
    async with Client(stdio_client(params), mode="legacy", list_roots_callback=roots) as client:
        yield client


def text(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.fixture(scope="module")
def tools() -> NodeTools:
    return node_tools()


def filesystem(tools: NodeTools, tmp_path: Path, *directories: Path) -> Path:
    """A config with the npm filesystem server, started with `directories` (none: it waits for roots)."""
    main = tools.package_main("@modelcontextprotocol/server-filesystem")
    config = tmp_path / "mcp.json"
    entry = {"command": str(tools.node), "args": [str(main), *map(str, directories)]}
    config.write_text(json.dumps({"mcpServers": {"fs": entry}}))
    return config


@pytest.mark.parametrize("mode", MODES)
async def test_a_filesystem_server_without_directories_works_in_the_clients_roots_and_follows_them(
    tools: NodeTools, tmp_path: Path, share: Path, mode: str
) -> None:
    """Without roots behind breakwater it had no allowed directory at all, and every file call failed."""
    project, other = (tmp_path / "project").resolve(), (tmp_path / "other").resolve()
    for directory in (project, other):
        directory.mkdir()
        (directory / "notes.txt").write_text(f"notes of {directory.name}\n")
    roots = Roots(project)
    async with session(filesystem(tools, tmp_path), env_for(tmp_path, share), mode, roots) as client:

        async def allowed() -> str:
            return text(await client.call_tool("fs__list_allowed_directories", {}))

        async def until_allowed(directory: Path) -> None:
            with anyio.fail_after(30):
                while str(directory) not in await allowed():
                    await anyio.sleep(0.1)

        await until_allowed(project)
        read = await client.call_tool("fs__read_text_file", {"path": str(project / "notes.txt")})
        assert text(read) == "notes of project\n"

        # The client moves to another directory and says so: the server asks again, through breakwater.
        roots.paths = [other]
        await client.session.send_notification(types.RootsListChangedNotification())
        await until_allowed(other)
        assert str(project) not in await allowed()
        refused = await client.call_tool("fs__read_text_file", {"path": str(project / "notes.txt")})
        assert refused.is_error  # the server works where the client works now, not where it did
    assert roots.asked >= 2


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_without_roots_leaves_the_server_its_own_directories(
    tools: NodeTools, tmp_path: Path, share: Path, mode: str
) -> None:
    """breakwater declares roots to the server, and answers for a client without them as such a client does."""
    given = (tmp_path / "given").resolve()
    given.mkdir()
    (given / "a.txt").write_text("given\n")
    async with session(filesystem(tools, tmp_path, given), env_for(tmp_path, share), mode, None) as client:
        assert text(await client.call_tool("fs__read_text_file", {"path": str(given / "a.txt")})) == "given\n"
        assert str(given) in text(await client.call_tool("fs__list_allowed_directories", {}))


_ROOTS_SERVER = """
import json
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("roots")


@server.tool()
async def roots(ctx: Context) -> str:
    declared = ctx.session.client_params.capabilities.roots is not None
    try:
        listed = [str(root.uri) for root in (await ctx.session.list_roots()).roots]
    except Exception as exc:
        listed = f"error: {exc}"
    return json.dumps({"declared": declared, "listed": listed})


@server.tool()
async def needs_roots(ctx: Context) -> str:
    return str((await ctx.session.list_roots()).roots[0].uri)  # a client without roots: this tool fails


server.run("stdio")
"""


async def test_each_attached_session_gets_its_own_roots_and_a_shared_server_none(tmp_path: Path, share: Path) -> None:
    """Two sessions of one shared gateway: each one's own server lists that session's roots; a server both
    share is not told either's (it serves two clients), and says it was declared none, as before."""
    script = tmp_path / "roots_server.py"
    script.write_text(_ROOTS_SERVER)
    entry: dict[str, Any] = {"command": sys.executable, "args": [str(script)]}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"own": entry, "common": {**entry, "shared": True}}}))
    # The server asks for roots mid-call, as a handshake-era server can (on 2026-07-28 it would return an input request).
    env = {**env_for(tmp_path, share), "BREAKWATER_PROTOCOL": "2025-11-25"}
    a, b = tmp_path / "a", tmp_path / "b"

    async def ask(client: Client, server: str) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(text(await client.call_tool(f"{server}__roots", {})))
        return answer

    async with (
        session(config, env, "attached", Roots(a)) as first,
        session(config, env, "attached", Roots(b)) as second,
        session(config, env, "attached", None) as rootless,
    ):
        with anyio.fail_after(60):
            assert await ask(first, "own") == {"declared": True, "listed": [a.as_uri()]}
            assert await ask(second, "own") == {"declared": True, "listed": [b.as_uri()]}
            answer = await ask(rootless, "own")
            assert answer["declared"] and "the client does not list roots" in answer["listed"], answer
            # The tool failed because its client could not answer: not "fix your input", as for sampling.
            needed = await rootless.call_tool("own__needs_roots", {})
            assert code_of(needed) == "CLIENT_CANNOT_ANSWER", needed
            for client in (first, second):
                common = await ask(client, "common")
                assert common["declared"] is False, common
        assert len(gateway_pids(share)) == 1  # the three sessions shared one gateway
