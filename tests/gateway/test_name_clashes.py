"""Server names that are not tool-name characters, and tools two servers would name alike.

Cursor's and Claude Desktop's users name servers "Framelink Figma MCP"; a downstream tool name may hold
only `A-Za-z0-9_.-`, so the gateway lists that server's tools as `Framelink_Figma_MCP__…`. Before its
list is known (the first minute), a call of such a name must still reach the server's "connecting"
answer, not "no such tool". And when two (server, tool) pairs come out as one name ("a b" and "a_b",
or "a"'s `b__ping` and "a__b"'s `ping`), both stay listed and callable. Real `serve`, real test servers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from breakwater.config import load_config
from breakwater.config._checks import distinct_name, downstream_names, route_by_shape
from breakwater.testing.server import launch_command
from helpers import isolated_env

pytestmark = pytest.mark.anyio


def _entry(name: str, *flags: str) -> dict[str, Any]:
    command = launch_command("--name", name, *flags)
    return {"command": command[0], "args": command[1:]}


@asynccontextmanager
async def _serve(tmp_path: Path, servers: dict[str, Any], **env: str) -> AsyncIterator[Client]:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    args = ["-m", "breakwater", "serve", "--no-share", "--config", str(config)]
    params = StdioServerParameters(command=sys.executable, args=args, env=isolated_env(tmp_path, **env))
    async with Client(params) as client:
        yield client


async def test_tools_named_alike_are_all_listed_and_each_call_reaches_its_own_server(tmp_path: Path) -> None:
    servers = {
        "a": _entry("a", "--tool", "b__ping:latency=0"),
        "a__b": _entry("a__b", "--tool", "ping:latency=0"),
        "My Server": _entry("My Server", "--tool", "ping:latency=0"),
        "My_Server": _entry("My_Server", "--tool", "ping:latency=0"),
    }
    reached: dict[str, tuple[str, str]] = {}
    with anyio.fail_after(60):
        async with _serve(tmp_path, servers) as client:
            names: list[str] = []
            while len(names) < len(servers):
                names = [t.name for t in (await client.list_tools()).tools if "ping" in t.name]
                await anyio.sleep(0.1)
            for name in names:
                result = await client.call_tool(name, {})
                assert not result.is_error, result
                answer = result.structured_content or {}
                reached[name] = (answer["server"], answer["tool"])
    assert sorted(reached.values()) == [("My Server", "ping"), ("My_Server", "ping"), ("a", "b__ping"), ("a__b", "ping")]
    # The stronger claim keeps the plain name (the more specific server; the one whose name needs no "_"), whatever
    # the config's order, so a name means the tool `route_by_shape` routes it to before any list is known; the
    # other is told apart by a tail of its own.
    assert reached["a__b__ping"] == ("a__b", "ping") and reached["My_Server__ping"] == ("My_Server", "ping")
    assert all(len(name) <= 64 for name in reached)


async def test_a_server_whose_name_is_not_tool_name_characters_is_connecting_not_missing(tmp_path: Path) -> None:
    """Never seen (no last-known tools) and still starting: its tool's call says "connecting", naming the server."""
    servers = {
        "My Server": _entry("My Server", "--startup-delay", "60", "--tool", "ping:latency=0"),
        "a": _entry("a", "--startup-delay", "60"),
        "a__b": _entry("a__b", "--startup-delay", "60"),
    }
    with anyio.fail_after(60):
        async with _serve(tmp_path, servers, BREAKWATER_CALL_TIMEOUT_S="0.5") as client:
            spaced = await client.call_tool("My_Server__ping", {})
            nested = await client.call_tool("a__b__ping", {})
    for result, server in ((spaced, "My Server"), (nested, "a__b")):
        answer = result.structured_content or {}
        assert result.is_error and answer["code"] == "SERVER_CONNECTING", answer
        assert f"Tool 'ping' on server '{server}'" in result.content[0].text  # type: ignore[union-attr]


def test_a_name_is_routed_by_the_templates_shape_whichever_side_the_server_is_on() -> None:
    servers = ["a", "a.b", "My Server"]
    # A "." becomes "_" in a downstream name (the model APIs refuse it), in the template's own text too.
    assert route_by_shape("{tool}.{server}", servers, "ping_a_b") == ("a.b", "ping")
    assert route_by_shape("{tool}.{server}", servers, "ping_My_Server") == ("My Server", "ping")
    assert route_by_shape("{server}__{tool}", servers, "a__") is None  # a prefix alone names no tool
    # Equal affixes: the server whose name needs no "_" owns the name, as the catalog names it.
    assert route_by_shape("{server}__{tool}", ["My Server", "My_Server"], "My_Server__ping") == ("My_Server", "ping")
    assert route_by_shape("{tool}", servers, "ping") is None  # one server, no affixes: nothing to go by


def test_config_check_notes_servers_whose_tools_would_be_named_alike(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    names = ["a b", "a_b", "日本", "中国", "ok"]
    config.write_text(json.dumps({"mcpServers": {name: {"command": "sh"} for name in names}}, ensure_ascii=False))
    notes = load_config(config).notes
    assert [n.split(" name ")[0] for n in notes] == ["servers 'a b', 'a_b'", "servers '日本', '中国'"]
    assert "(a_b__…)" in notes[0] and "rename" in notes[0]


async def test_a_tool_the_entry_disables_is_not_listed_and_a_call_of_it_says_why(tmp_path: Path) -> None:
    """Cline's, Roo's and Windsurf's `disabledTools` hide a tool from the agent; behind breakwater too. Search names
    it as left out, and a call by its name is refused with the reason, never sent."""
    servers = {
        "box": {**_entry("box", "--tool", "read:latency=0,readonly", "--tool", "wipe:latency=0"), "disabledTools": ["wipe"]}
    }
    with anyio.fail_after(60):
        async with _serve(tmp_path, servers) as client:
            names: list[str] = []
            while "box__read" not in names:
                names = [t.name for t in (await client.list_tools()).tools]
                await anyio.sleep(0.1)
            search = await client.call_tool("breakwater_search_tools", {"query": "wipe"})
            wiped = await client.call_tool("box__wipe", {})
            state = (await client.call_tool("box__testserver_state", {})).structured_content or {}
    assert "box__wipe" not in names
    left_out = (search.structured_content or {})["left_out"]
    assert [(t["name"], t["reason"]) for t in left_out] == [("box__wipe", "disabled in the config (disabledTools)")]
    answer = wiped.structured_content or {}
    assert wiped.is_error and answer["code"] == "UNKNOWN_TOOL"
    assert "leaves it out: disabled in the config (disabledTools)" in wiped.content[0].text  # type: ignore[union-attr]
    assert state["started"]["wipe"] == 0  # never sent


def test_downstream_names_give_a_clashing_name_to_the_stronger_claim_whatever_the_order() -> None:
    """The rule tools and prompts are named by: the more specific server, then the one whose name needs no "_", then
    the first listed; a (server, name) listed twice is named alike both times (one entry), never renamed apart."""
    pairs = [("a", "b__ping"), ("My Server", "ping"), ("a__b", "ping"), ("My_Server", "ping"), ("a", "b__ping")]
    names = downstream_names("{server}__{tool}", pairs, 64)
    assert names[2] == "a__b__ping" and names[3] == "My_Server__ping"
    assert names[0] == names[4] == distinct_name("a__b__ping", "a", "b__ping", 64)
    assert names[1] == distinct_name("My_Server__ping", "My Server", "ping", 64)
    assert downstream_names("{server}__{tool}", list(reversed(pairs)), 64) == list(reversed(names))


def test_one_servers_two_tools_named_alike_keep_their_names_whatever_the_order_it_lists_them_in() -> None:
    """`get.item` and `get_item` both come out `srv__get_item`: which one that name called hung on the server's order,
    so an approved name could point at another tool after the server reordered its list. The exact name keeps it."""
    pairs = [("srv", "get.item"), ("srv", "get_item")]
    names = downstream_names("{server}__{tool}", pairs, 64)
    assert names == [distinct_name("srv__get_item", "srv", "get.item", 64), "srv__get_item"]
    assert downstream_names("{server}__{tool}", list(reversed(pairs)), 64) == list(reversed(names))


async def test_a_tool_named_as_one_of_breakwaters_own_is_listed_under_a_name_of_its_own(tmp_path: Path) -> None:
    """With `tool_name_template = "{tool}"` a server's `breakwater_status` came out as breakwater's own status tool:
    two tools of one name in the list (which a client may refuse whole), and the server's unreachable. The built-in
    keeps its name; the server's tool gets one of its own and answers from the server."""
    servers = {"t": _entry("t", "--tool", "breakwater_status:latency=0", "--tool", "add:latency=0")}
    renamed = distinct_name("breakwater_status", "t", "breakwater_status", 64)
    with anyio.fail_after(60):
        async with _serve(tmp_path, servers, BREAKWATER_TOOL_NAME_TEMPLATE="{tool}") as client:
            names: list[str] = []
            while "add" not in names:
                names = [t.name for t in (await client.list_tools()).tools]
                await anyio.sleep(0.1)
            builtin = (await client.call_tool("breakwater_status", {})).structured_content or {}
            upstream = (await client.call_tool(renamed, {})).structured_content or {}
    assert len(names) == len(set(names)) and {"breakwater_status", renamed} <= set(names)
    assert "servers" in builtin and (upstream["server"], upstream["tool"]) == ("t", "breakwater_status")
