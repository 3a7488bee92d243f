"""A server that needs the user on a page first (URL elicitation required, -32042), behind `breakwater serve`.

A 2025-11-25 client that declared `elicitation.url` gets the server's error as the spec gives it, with
the server's `elicitations`, so it shows the pages to its user itself; any other client gets
CLIENT_CANNOT_ANSWER with each page's address in the text its model reads (and the pages in the
structured content). Real parts: the upstream is a real SDK server in its own process, the gateway
runs as `python -m breakwater serve` over stdio and HTTP (both answer modes), the clients are the SDK's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import ClientRequestContext

from helpers import code_of, envelope_of, isolated_env

pytestmark = pytest.mark.anyio

UPSTREAM = """
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.types import ElicitRequestURLParams, ToolAnnotations

server = MCPServer("cal")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def agenda() -> str:
    page = ElicitRequestURLParams(message="Connect your calendar", url="https://cal.example/auth?s=1", elicitation_id="e1")
    raise UrlElicitationRequiredError([page])


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def connect(ctx: Context) -> str:
    answer = await ctx.session.elicit_url("Connect your calendar", "https://cal.example/auth?s=2", "e2", ctx.request_id)
    await ctx.session.send_elicit_complete("e2", ctx.request_id)  # the user is done on the page
    return answer.action


server.run("stdio")
"""
PAGE = {"mode": "url", "url": "https://cal.example/auth?s=1", "message": "Connect your calendar", "elicitationId": "e1"}


async def _opens_pages(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept")  # never asked here: declaring the callback declares URL elicitation


@asynccontextmanager
async def _gateway(tmp_path: Path, how: str) -> AsyncIterator[Any]:
    """What a `Client` connects to: `serve` over stdio, or the URL of `serve --http` (default or JSON answers)."""
    script = tmp_path / "cal.py"
    script.write_text(UPSTREAM)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"cal": {"command": sys.executable, "args": [str(script)]}}}))
    env = isolated_env(tmp_path, BREAKWATER_PROTOCOL="2025-11-25")  # the -32042 error is the 2025-11-25 server's
    serve = [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(config)]
    if how == "stdio":
        yield StdioServerParameters(command=serve[0], args=serve[1:], env=env)
        return
    port_file = tmp_path / "port"
    extra = ["--json-response"] if how == "http-json" else []
    proc = subprocess.Popen([*serve, "--http", "127.0.0.1:0", "--port-file", str(port_file), *extra], env=env)
    try:
        with anyio.fail_after(30):
            while not (port_file.exists() and port_file.read_text()):
                assert proc.poll() is None, "serve --http exited"
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _call(client: Client, tool: str = "agenda") -> types.CallToolResult:
    with anyio.fail_after(30):
        while True:  # the upstream may still be connecting: the gateway waits for it, within its call wait
            result = await client.call_tool(f"cal__{tool}", {})
            if code_of(result) != "SERVER_CONNECTING":
                return result


@pytest.mark.parametrize("how", ["stdio", "http", "http-json"])
async def test_a_client_that_opens_pages_gets_the_servers_error_with_its_pages(tmp_path: Path, how: str) -> None:
    async with _gateway(tmp_path, how) as target, Client(target, mode="legacy", elicitation_callback=_opens_pages) as client:
        with pytest.raises(MCPError) as needed:
            await _call(client)
    assert needed.value.error.code == -32042
    assert needed.value.error.data == {"elicitations": [PAGE]}
    assert "open https://cal.example/auth?s=1" in needed.value.error.message


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_any_other_client_gets_the_address_in_the_text_its_model_reads(tmp_path: Path, mode: str) -> None:
    """No URL elicitation declared (or a 2026-07-28 client, whose revision has no such error): the envelope."""
    callback = _opens_pages if mode == "2026-07-28" else None
    async with _gateway(tmp_path, "stdio") as target, Client(target, mode=mode, elicitation_callback=callback) as client:
        result = await _call(client)
    envelope = envelope_of(result)  # the tools return text: their output schema moves the envelope to `_meta`
    assert (envelope["code"], envelope["elicitations"]) == ("CLIENT_CANNOT_ANSWER", [PAGE]), result
    text = " ".join(block.text for block in result.content if isinstance(block, types.TextContent))
    assert "Connect your calendar — open https://cal.example/auth?s=1" in text


@pytest.mark.parametrize("how", ["stdio", "http"])
async def test_the_servers_word_that_the_user_is_done_on_the_page_reaches_the_client_it_sent_there(
    tmp_path: Path, how: str
) -> None:
    """`notifications/elicitation/complete` goes to the client that was asked to open that page."""
    asked: list[tuple[str, str | None]] = []
    done: list[str] = []

    async def opens(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams)
        asked.append((params.url, params.elicitation_id))
        return types.ElicitResult(action="accept")

    async def heard(message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            done.append(message.params.elicitation_id)

    async with (
        _gateway(tmp_path, how) as target,
        Client(target, mode="legacy", elicitation_callback=opens, message_handler=heard) as client,
    ):
        result = await _call(client, "connect")
        with anyio.fail_after(10):
            while not done:
                await anyio.sleep(0.02)
    assert not result.is_error, result
    assert asked == [("https://cal.example/auth?s=2", "e2")]
    assert done == ["e2"]
