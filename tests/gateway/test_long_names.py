"""Tool names the model APIs accept: a downstream name longer than `[gateway] tool_name_max` is cut, stays unique and stable.

The Anthropic and OpenAI APIs refuse a whole request when one tool name is over 64 characters, and the
gateway's `server__` prefix makes upstream names longer. The server is a real stdio test server
listing tools whose names differ only past the cut.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from breakwater.config._checks import namespaced
from breakwater.testing.server import launch_command
from helpers import isolated_env

pytestmark = pytest.mark.anyio

SERVER = "enterprise-database"
LONG = "synchronize_all_customer_data_across_multiple_systems_for_region"
TOOLS = (f"{LONG}_one", f"{LONG}_two", "ping")
#: The most the Anthropic and OpenAI APIs accept for a tool name.
API_LIMIT = 64


def _config(tmp_path: Path) -> Path:
    command = launch_command(*(arg for tool in TOOLS for arg in ("--tool", f"{tool}:latency=0")))
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {SERVER: {"command": command[0], "args": command[1:]}}}))
    return path


@asynccontextmanager
async def _serve(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[Client]:
    args = ["-m", "breakwater", "serve", "--no-share", "--config", str(_config(tmp_path))]
    async with Client(StdioServerParameters(command=sys.executable, args=args, env=env)) as client:
        yield client


async def _listed(tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    """Downstream name -> the upstream tool a call of it reaches, through a real `serve`."""
    reached: dict[str, Any] = {}
    with anyio.fail_after(60):
        async with _serve(tmp_path, env) as client:
            names: list[str] = []
            while len(names) < len(TOOLS):  # the server's tools are listed once it has connected
                listed = (await client.list_tools()).tools
                names = [t.name for t in listed if t.name.startswith(SERVER) and not t.name.endswith("testserver_state")]
                await anyio.sleep(0.1)
            for name in names:
                result = await client.call_tool(name, {"payload": "x"})
                assert not result.is_error, result
                reached[name] = (result.structured_content or {})["tool"]
    return reached


async def test_long_names_are_cut_to_the_limit_and_each_reaches_its_own_tool(tmp_path: Path) -> None:
    reached = await _listed(tmp_path, isolated_env(tmp_path))
    assert sorted(reached.values()) == sorted(TOOLS)
    assert reached[f"{SERVER}__ping"] == "ping"  # a short name is left as it is
    for name, tool in reached.items():
        assert len(name) <= API_LIMIT, name
        assert name.startswith(f"{SERVER}__{tool}"[: API_LIMIT - 11])


async def test_a_lower_limit_gives_the_same_names_at_every_start(tmp_path: Path) -> None:
    """For a client that adds its own prefix: 47 leaves room for Claude Code's `mcp__breakwater__`."""
    first = await _listed(tmp_path / "a", isolated_env(tmp_path / "a", BREAKWATER_TOOL_NAME_MAX="47"))
    again = await _listed(tmp_path / "b", isolated_env(tmp_path / "b", BREAKWATER_TOOL_NAME_MAX="47"))
    assert first == again
    assert all(len(f"mcp__breakwater__{name}") <= API_LIMIT for name in first)
    assert sorted(first.values()) == sorted(TOOLS)


def test_names_keep_their_start_differ_by_the_whole_and_fit_the_limit() -> None:
    for limit in (22, 47, 64, 128):
        one, two = (namespaced("{server}__{tool}", SERVER, tool, limit) for tool in TOOLS[:2])
        assert one != two and len(one) == len(two) == min(limit, len(f"{SERVER}__{TOOLS[0]}"))
        assert one == namespaced("{server}__{tool}", SERVER, TOOLS[0], limit)
    assert namespaced("{server}__{tool}", SERVER, "ping", 64) == f"{SERVER}__ping"


def test_names_hold_only_what_the_model_apis_take() -> None:
    """The spec allows "." in a tool name, Anthropic's and OpenAI's APIs do not: one such name failed every request."""
    api = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
    for server, tool in [("bn", "admin.tools.list"), ("my.server", "get user"), ("s", "päth/ünicode")]:
        name = namespaced("{server}__{tool}", server, tool, 64)
        assert api.match(name), name
    assert namespaced("{server}__{tool}", "bn", "admin.tools.list", 64) == "bn__admin_tools_list"


def test_a_template_with_a_dot_is_noted(tmp_path: Path) -> None:
    """A user's `{server}.{tool}` gets "_" where its "." was: `config check` says so."""
    from breakwater.config import load_config

    path = tmp_path / "breakwater.toml"
    path.write_text('[gateway]\ntool_name_template = "{server}.{tool}"\n[servers.a]\ncommand = "x"\n')
    assert any("'.' in it become '_'" in note for note in load_config(path).notes)


@pytest.mark.parametrize("value", ["10", "129", "many"])
def test_a_limit_out_of_range_is_a_config_error_that_names_the_knob(tmp_path: Path, value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(_config(tmp_path))],
        env=isolated_env(tmp_path, BREAKWATER_TOOL_NAME_MAX=value),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "BREAKWATER_TOOL_NAME_MAX" in done.stderr and "fix:" in done.stderr, done.stderr
