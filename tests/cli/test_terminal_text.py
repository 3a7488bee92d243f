"""A server's or a file's own text reaches the terminal as text: never read as Rich markup, never obeyed as a control.

A server named `m[/]` crashed `status` with a MarkupError, one named `m[x]` was shown as `m`, and a tool whose
description or result held an escape sequence drove the terminal that ran `breakwater tools` or `call`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FORKED_SCRIPT

pytestmark = pytest.mark.long_module(15)

UPSTREAM = """
from mcp.server.mcpserver import MCPServer

server = MCPServer("marked")


@server.tool(name="mk", description="[/] closes [red]nothing[/red] \\x1b[31m red")
def mk() -> str:
    return "done \\x1b[2J [/]\\nsecond line"


server.run()
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run(
        [sys.executable, "-m", "breakwater", *args, "--config", str(tmp_path / "mcp.json")],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )


def test_names_descriptions_and_results_are_shown_not_obeyed(tmp_path: Path) -> None:
    (tmp_path / "up.py").write_text(FORKED_SCRIPT + UPSTREAM)
    entry = {"command": sys.executable, "args": [str(tmp_path / "up.py")]}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"m[/]": entry, "n[x]": entry}}))
    status = _run(tmp_path, "status", "--wait", "20")
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert "m[/]" in status.stdout and "n[x]" in status.stdout
    tools = _run(tmp_path, "tools", "--wait", "20")
    assert tools.returncode == 0 and "[/] closes [red]nothing[/red] \\u001b[31m red" in tools.stdout
    called = _run(tmp_path, "call", "m[/]", "mk", "--wait", "20")
    assert called.returncode == 0 and called.stdout == "done \\u001b[2J [/]\nsecond line\n"
    for result in (status, tools, called):
        assert "\x1b" not in result.stdout + result.stderr
