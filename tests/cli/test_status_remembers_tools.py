"""`breakwater status` keeps each ready server's tools as its last-known ones, as the gateway does.

A user's first step is often `breakwater status`: it connects to every server and sees their tools. It did not keep
them, so the first `serve` (or `tools`) after it listed nothing of a server still connecting and made the model wait,
or conclude the tool did not exist. Real CLI processes, a real test server that takes 2 s to start.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import isolated_env, run_breakwater


def test_the_tools_status_saw_are_listed_while_the_server_connects_again(tmp_path: Path) -> None:
    servers = tmp_path / "servers.json"
    slow = {"command": sys.executable, "args": ["-m", "breakwater.testserver", "--startup-delay", "2"]}
    servers.write_text(json.dumps({"mcpServers": {"slow": slow}}))
    env = isolated_env(tmp_path)

    before = run_breakwater(env, "tools", "--config", str(servers), "--wait", "0", "--json")
    assert json.loads(before.stdout)["matches"] == [], before.stdout  # nothing known of it yet

    status = run_breakwater(env, "status", "--config", str(servers), "--wait", "30", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["servers"][0]["state"] == "ready"

    after = run_breakwater(env, "tools", "--config", str(servers), "--wait", "0", "--json")
    listed = {m["tool"]: m["live"] for m in json.loads(after.stdout)["matches"]}
    assert listed.get("add") is False, after.stdout  # listed at once, from what status saw, marked not live
    assert {"echo", "add", "create_order"} <= set(listed), after.stdout
