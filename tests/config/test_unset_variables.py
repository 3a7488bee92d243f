"""A variable a server's entry names and the environment lacks turns that server off, not the whole file.

`serve`, `status`, `tools` and `call` read the config so (`load_config_serving`): one server's missing token took
every other server down, where the agents that read these files (Claude Code, Codex) start the rest and warn.
`config check`, and the library's `load_config`, still refuse the file, naming the variable.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from breakwater.config import load_config
from breakwater.config._files import load_config_serving
from breakwater.errors import ConfigError
from breakwater.testing.server import launch_command

OK = dict(zip(("command", "args"), (launch_command()[0], launch_command()[1:]), strict=True))
NEEDS = {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${NOPE_TOKEN_Q}"}}


VS_CODE = {
    "inputs": [{"id": "tok", "type": "promptString", "password": True}],
    "servers": {"fine": OK, "needs": {**NEEDS, "headers": {"Authorization": "Bearer ${input:tok}"}}},
}


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("mcp.json", json.dumps({"mcpServers": {"fine": OK, "needs": NEEDS}}), "NOPE_TOKEN_Q is not set"),
        (
            "breakwater.toml",
            f'[servers.fine]\ncommand = "{OK["command"]}"\n[servers.needs]\nurl = "http://h.test/mcp?key=${{NOPE_TOKEN_Q}}"\n',
            "NOPE_TOKEN_Q is not set",
        ),
        (
            "config.toml",  # Codex's: its keys name variables
            f'[mcp_servers.fine]\ncommand = "{OK["command"]}"\n'
            '[mcp_servers.needs]\nurl = "http://h.test/mcp"\nbearer_token_env_var = "NOPE_TOKEN_Q"\n',
            "NOPE_TOKEN_Q is not set",
        ),
        # VS Code asks for ${input:...} as it starts a server; breakwater runs with no editor to ask.
        ("mcp.json", json.dumps(VS_CODE), "${input:tok}"),
        # A directory not there (a drive not mounted, a folder not made yet) is that server's problem too.
        ("mcp.json", json.dumps({"mcpServers": {"fine": OK, "needs": {**OK, "cwd": "/nonexistent/dir-q"}}}), "the directory"),
    ],
)
def test_a_server_whose_value_cannot_be_had_is_off_and_the_others_run(tmp_path: Path, name: str, text: str, says: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    config = load_config_serving(path, environ={})
    fine, needs = config.server("fine"), config.server("needs")
    assert fine.enabled and not needs.enabled
    assert needs.disabled_by is not None and says in needs.disabled_by
    with pytest.raises(ConfigError, match=re.escape(says.split()[0])):
        load_config(path, environ={})
    if "NOPE_TOKEN_Q" in says:
        assert load_config_serving(path, environ={"NOPE_TOKEN_Q": "t0ken-value"}).server("needs").enabled


def test_a_servers_file_entry_off_for_its_variable_stays_off_when_enabled(tmp_path: Path) -> None:
    """`[servers.NAME] enabled = true` over a servers_file entry off for a variable would start it with `${VAR}` as text."""
    (tmp_path / "servers.json").write_text(json.dumps({"mcpServers": {"fine": OK, "needs": NEEDS}}))
    path = tmp_path / "breakwater.toml"
    path.write_text('servers_file = "servers.json"\n[servers.needs]\nenabled = true\n')
    assert not load_config_serving(path, environ={}).server("needs").enabled


def test_status_serves_the_others_and_warns_and_config_check_refuses(tmp_path: Path) -> None:
    """The servers that are off here are not ready: `status` exits 1 (it said 0, "every enabled server ready", while the
    token was missing), and a call says why the server is not started (it said "disabled in the configuration")."""
    path = tmp_path / "mcp.json"
    (tmp_path / "a-file").write_text("")
    in_a_file = {**OK, "cwd": str(tmp_path / "a-file")}
    servers = {"fine": OK, "needs": NEEDS, "cwdfile": in_a_file, "off": {**OK, "disabled": True}}
    path.write_text(json.dumps({"mcpServers": servers}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0"}

    def breakwater(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "breakwater", *args, "--config", str(path)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)

    status = breakwater("status", "--json")
    assert status.returncode == 1, status.stderr
    states = {s["name"]: s["state"] for s in json.loads(status.stdout)["servers"]}
    assert states == {"fine": "ready", "needs": "disabled", "cwdfile": "disabled", "off": "disabled"}
    assert "server 'needs' is off" in status.stderr and "NOPE_TOKEN_Q is not set" in status.stderr
    assert f"its cwd: {str(tmp_path / 'a-file')!r} is not a directory (point it at a directory)" in status.stderr
    call = breakwater("call", "needs", "anything")
    assert call.returncode == 1 and "The server is not started (a value it names cannot be had here: " in call.stderr
    assert "NOPE_TOKEN_Q is not set" in call.stderr, call.stderr
    # Only the one the config itself turns off, and the status is the servers': exit 0.
    path.write_text(json.dumps({"mcpServers": {"fine": OK, "off": {**OK, "disabled": True}}}))
    assert breakwater("status").returncode == 0
    path.write_text(json.dumps({"mcpServers": {"fine": OK, "needs": NEEDS}}))
    check = breakwater("config", "check")
    assert check.returncode == 2 and "NOPE_TOKEN_Q" in check.stderr
