"""OpenCode's opencode.json and Zed's settings.json: servers of other shapes load as those agents read them.

OpenCode's file is the one its own `opencode mcp add` writes (run for real from `.tools/`), and `opencode mcp list`
checks that OpenCode connects to breakwater after `config import`. Zed has no command that writes its file, so its
two entry shapes are written here as its docs show them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from breakwater.config import load_config
from breakwater.errors import ConfigError


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _import(path: Path, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "breakwater", "config", "import", str(path), "--replace"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr


def test_what_opencode_mcp_add_writes_loads_and_opencode_connects_to_breakwater_after_import(tmp_path: Path) -> None:
    from conformance.node_tools import node_tools

    tools = node_tools()
    env = dict(
        tools.env(), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / ".config"), MY_KEY="key-from-env", BREAKWATER_SHARE="off"
    )
    opencode = str(tools.bin / "opencode")
    run = {"env": env, "cwd": tmp_path, "stdin": subprocess.DEVNULL, "capture_output": True, "timeout": 120, "check": True}
    subprocess.run(
        [
            opencode,
            "mcp",
            "add",
            "adder",
            "--env",
            "K={env:MY_KEY}",
            "--",
            sys.executable,
            "-m",
            "breakwater",
            "testserver",
            "--tool",
            "add",
        ],
        **run,
    )  # type: ignore[call-overload]
    subprocess.run(
        [
            opencode,
            "mcp",
            "add",
            "remote",
            "--url",
            "https://mcp.example.com/mcp",
            "--header",
            "Authorization=Bearer {env:MY_KEY}",
        ],
        **run,
    )  # type: ignore[call-overload]
    path = tmp_path / ".config" / "opencode" / "opencode.jsonc"
    written = json.loads(path.read_text())["mcp"]
    assert written["adder"]["type"] == "local" and written["adder"]["command"][0] == sys.executable
    config = load_config(path, environ={"MY_KEY": "key-from-env"})
    adder, remote = config.server("adder"), config.server("remote")
    assert (adder.transport, adder.command, adder.args, dict(adder.env)) == (
        "stdio",
        sys.executable,
        ("-m", "breakwater", "testserver", "--tool", "add"),
        {"K": "key-from-env"},
    )
    assert (remote.transport, remote.transport_guessed, dict(remote.headers)) == (
        "http",
        True,
        {"Authorization": "Bearer key-from-env"},
    )
    _import(path, env)
    done = subprocess.run(
        [opencode, "mcp", "list"],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    listed = [line for line in (done.stdout + done.stderr).splitlines() if "✓ breakwater" in line]
    assert len(listed) == 1 and "connected" in listed[0], done.stdout + done.stderr


def test_opencodes_second_config_version_and_its_file_references(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("token-from-file\n")
    path = _write(
        tmp_path / "opencode.json",
        {
            "$schema": "https://opencode.ai/config.json",
            "mcp": {
                "servers": {
                    "local": {"type": "local", "command": ["x", "--flag"], "cwd": ".", "environment": {"T": "{file:secret.txt}"}},
                    "off": {"type": "local", "command": ["y"], "disabled": True},
                    "remote": {
                        "type": "remote",
                        "url": "https://h.example/mcp",
                        "oauth": {"clientId": "cid", "scope": "read write"},
                    },
                }
            },
        },
    )
    config = load_config(path, environ={})
    local, off, remote = config.server("local"), config.server("off"), config.server("remote")
    assert (local.command, local.args, local.cwd, dict(local.env)) == ("x", ("--flag",), str(tmp_path), {"T": "token-from-file"})
    assert "token-from-file" in local.secrets and not off.enabled
    assert remote.oauth is not None and (remote.oauth.client_id, remote.oauth.scopes) == ("cid", "read write")


def test_zeds_context_servers_in_both_shapes(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(
        """{
  // Zed's settings
  "theme": "One Dark",
  "context_servers": {
    "custom": {"source": "custom", "command": "x", "args": ["a"], "env": {"K": "v"}},
    "older": {"command": {"path": "y", "args": ["b"], "env": {"L": "w"}}, "settings": {}},
    "remote": {"source": "custom", "url": "https://h.example/mcp", "headers": {"X-Key": "k"}},
    "from-extension": {"source": "extension", "settings": {"token": "t"}},
    "configured-extension": {"settings": {"database_url": "postgresql://localhost/db"}}
  }
}"""
    )
    config = load_config(path, environ={})
    assert {s.name: (s.transport, s.command or s.url, s.args) for s in config.servers} == {
        "custom": ("stdio", "x", ("a",)),
        "older": ("stdio", "y", ("b",)),
        "remote": ("http", "https://h.example/mcp", ()),
    }
    assert dict(config.server("older").env) == {"L": "w"}
    skipped = [n for n in config.notes if "only Zed can start it" in n]
    assert len(skipped) == 2 and "theme ignored" in " ".join(config.notes)


BAD = [
    # Both were "no mcpServers object; write mcpServers": another dialect's key, and no word about OpenCode's `type`.
    ("opencode.json", {"$schema": "https://opencode.ai/config.json", "mcp": 5}, "mcp", "expected an object of servers"),
    ("opencode.json", {"mcp": {"a": {"command": ["echo"]}}}, "mcp.a.type", "an OpenCode server without its type"),
    ("opencode.json", {"mcp": {"a": {"type": "local", "command": "npx -y pkg"}}}, "mcp.a.command", "as a list; it got a string"),
    ("opencode.json", {"mcp": {"a": {"type": "local", "command": []}}}, "mcp.a.command", "it is empty"),
    ("opencode.json", {"mcp": {"a": {"type": "local", "command": ["x"], "environment": ["K=v"]}}}, "mcp.a.environment", "table"),
    (
        "opencode.json",
        {"mcp": {"a": {"type": "local", "command": ["x"], "environment": {"K": "{env:UNSET_V}"}}}},
        "mcp.a.environment.K",
        "UNSET_V is not set",
    ),
    (
        "opencode.json",
        {"mcp": {"a": {"type": "local", "command": ["x"], "environment": {"K": "{file:nope.txt}"}}}},
        "mcp.a.environment.K",
        "cannot read",
    ),
    (
        "opencode.json",
        {"mcp": {"a": {"type": "remote", "url": "https://h/mcp", "command": ["x"]}}},
        "mcp.a.command",
        "a remote server has no command",
    ),
    ("opencode.json", {"mcp": {"a": {"type": "remote", "url": "https://h/mcp", "oauth": "yes"}}}, "mcp.a.oauth", "or false"),
    ("opencode.json", {"mcp": {"a": {"type": "remote"}}}, "mcp.a.url", "needs an http(s) url"),
    (
        "settings.json",
        {"context_servers": {"a": {"command": {"args": ["b"]}}}},
        "context_servers.a.command.path",
        "needs a command",
    ),
    (
        "settings.json",
        {"context_servers": {"a": {"command": {"path": "x", "argz": []}}}},
        "context_servers.a.command.argz",
        "unknown key",
    ),
    (
        "settings.json",
        {"context_servers": {"a": {"source": "registry", "command": "x"}}},
        "context_servers.a.source",
        "unknown source",
    ),
]


@pytest.mark.parametrize(("name", "data", "key", "says"), BAD, ids=[f"{c[2]}-{i}" for i, c in enumerate(BAD)])
def test_a_wrong_entry_of_another_shape_names_the_key_as_written(
    tmp_path: Path, name: str, data: dict[str, Any], key: str, says: str
) -> None:
    path = _write(tmp_path / name, data)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    text = str(info.value)
    assert str(path) in text and f": {key}:" in text and says in text and "fix:" in text, text


def test_import_of_zed_settings_writes_zeds_entry(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "settings.json",
        {
            "theme": "One Dark",
            "context_servers": {"a": {"source": "custom", "command": "x"}, "e": {"source": "extension", "settings": {}}},
        },
    )
    _import(path, dict(os.environ))
    agent = json.loads(path.read_text())
    assert agent["theme"] == "One Dark" and list(agent["context_servers"]) == [
        "breakwater",
        "e",
    ]  # the extension's stays with Zed
    ours = agent["context_servers"]["breakwater"]
    assert ours["source"] == "custom" and ours["args"][-2:] == ["--config", str((tmp_path / "breakwater.toml").resolve())]
    assert [s.name for s in load_config(tmp_path / "breakwater.toml", environ={}).servers] == ["a"]


def test_an_entry_of_another_shape_that_starts_breakwater_serve_is_skipped(tmp_path: Path) -> None:
    """The agent's own file, pointed at by mistake, lists breakwater: in OpenCode's and Zed's shapes too."""
    opencode = _write(
        tmp_path / "opencode.json",
        {"mcp": {"bw": {"type": "local", "command": ["/x/breakwater", "serve"]}, "a": {"type": "local", "command": ["x"]}}},
    )
    zed = _write(
        tmp_path / "settings.json",
        {
            "context_servers": {
                "bw": {"command": {"path": "breakwater", "args": ["serve", "--config", "c"]}},
                "a": {"source": "custom", "command": "x"},
            }
        },
    )
    for path, top in ((opencode, "mcp"), (zed, "context_servers")):
        config = load_config(path, environ={})
        assert [s.name for s in config.servers] == ["a"]
        assert any(n.startswith(f"{top}.bw skipped: it starts breakwater serve") for n in config.notes)


def test_import_of_opencode_rewrites_its_tool_patterns_to_the_names_through_breakwater(tmp_path: Path) -> None:
    """`"tools": {"github_*": false}` switched GitHub's tools off in OpenCode; behind breakwater they are named
    `breakwater_github__TOOL`, and a pattern left as it was would switch nothing off."""
    from fnmatch import fnmatchcase

    servers = {"github": {"type": "local", "command": ["x"]}, "my.server": {"type": "local", "command": ["y"]}}
    tools = {"github_*": False, "my_server_read": False, "bash": True}
    path = _write(tmp_path / "opencode.json", {"mcp": servers, "tools": tools, "agent": {"plan": {"tools": {"github_*": True}}}})
    done = subprocess.run(
        [sys.executable, "-m", "breakwater", "config", "import", str(path), "--replace"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    agent = json.loads(path.read_text())
    assert agent["tools"] == {"bash": True, "breakwater_github__*": False, "breakwater_my_server__read": False}
    assert agent["agent"]["plan"]["tools"] == {"breakwater_github__*": True}
    assert "OpenCode's tool pattern tools: 'github_*' is now 'breakwater_github__*'" in done.stdout
    # What OpenCode will call those tools: `breakwater_` and breakwater's own name, each character outside
    # [a-zA-Z0-9_-] made `_` (OpenCode's rule); the patterns match them.
    config = load_config(tmp_path / "breakwater.toml", environ={})
    template = config.gateway.tool_name_template

    def through(server: str, tool: str) -> str:
        return "breakwater_" + re.sub(r"[^a-zA-Z0-9_-]", "_", template.format(server=server, tool=tool))

    assert fnmatchcase(through("github", "create_issue"), "breakwater_github__*")
    assert through("my.server", "read") == "breakwater_my_server__read"


def test_an_opencode_switch_for_a_server_defined_elsewhere_is_skipped_with_a_note(tmp_path: Path) -> None:
    """OpenCode's schema takes `"NAME": {"enabled": false}` (a server another of its config files defines, turned
    off here); breakwater refused the whole file: `mcp.b.command: a stdio server needs a command`."""
    path = tmp_path / "opencode.json"
    path.write_text(json.dumps({"mcp": {"a": {"type": "local", "command": ["x"]}, "b": {"enabled": False}}}))
    config = load_config(path, environ={})
    assert [spec.name for spec in config.servers] == ["a"]
    assert any(note.startswith("mcp.b skipped: only OpenCode's switch") for note in config.notes), config.notes
    # Not a server in any other client's file: there it is an entry without a command, refused as before.
    other = tmp_path / "mcp.json"
    other.write_text(json.dumps({"mcpServers": {"b": {"enabled": False}}}))
    with pytest.raises(ConfigError, match="needs a command"):
        load_config(other, environ={})
