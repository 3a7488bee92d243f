"""A `null` where an entry's key is optional, and Claude Code's approvals of a project's `.mcp.json` servers.

VS Code's and Gemini CLI's users write `"env": null`, `"args": null`, `"cwd": null`: those clients read a null as the
key not written, and breakwater refused the whole file. Claude Code starts a `.mcp.json` server only once the user
approved it (`enabledMcpjsonServers`, `enableAllProjectMcpServers`); breakwater started a server added to the
repository's file after the user approved the others.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from breakwater.config import ServerSpec, load_config
from breakwater.errors import ConfigError

STDIO = {"command": "python3", "args": ["-V"]}
HTTP = {"url": "http://127.0.0.1:9/mcp"}

#: (file name, table, entry without the key, the key written as null). Every optional key of every JSON dialect.
OPTIONAL: list[tuple[str, str, dict[str, Any], str]] = [
    *[
        ("mcp.json", "mcpServers", STDIO, key)
        for key in (
            "args",
            "env",
            "envFile",
            "cwd",
            "type",
            "transport",
            "transportType",
            "disabled",
            "enabled",
            "shared",
            "disabledTools",
            "includeTools",
            "excludeTools",
            "url",
            "serverUrl",
            "httpUrl",
            "headers",
            "headersHelper",
            "oauth",
            "auth",
            "alwaysAllow",
            "timeout",
        )
    ],
    *[
        ("mcp.json", "servers", HTTP, key)  # VS Code's
        for key in ("headers", "headersHelper", "oauth", "type", "command", "args", "env", "envFile", "cwd", "disabled")
    ],
    *[("settings.json", "mcpServers", {**STDIO, "trust": True}, k) for k in ("includeTools", "excludeTools", "cwd")],
    *[("opencode.json", "mcp", {"type": "local", "command": ["python3"]}, k) for k in ("environment", "cwd", "enabled")],
    *[("opencode.json", "mcp", {"type": "remote", **HTTP}, key) for key in ("headers", "oauth", "disabled", "timeout")],
    *[("settings.json", "context_servers", {"source": "custom", **STDIO}, key) for key in ("args", "env", "settings")],
    ("settings.json", "context_servers", {"command": {"path": "python3"}}, "command.args"),
    ("settings.json", "context_servers", {"command": {"path": "python3"}}, "command.env"),
    ("mcp.json", "mcpServers", {**HTTP, "oauth": {"clientId": "c"}}, "oauth.callbackPort"),
    ("mcp.json", "mcpServers", {**HTTP, "oauth": {"clientId": "c"}}, "oauth.scopes"),
]


def _with_null(entry: dict[str, Any], key: str) -> dict[str, Any]:
    outer, _, inner = key.partition(".")
    return {**entry, outer: {**entry[outer], inner: None}} if inner else {**entry, key: None}


def _without(entry: dict[str, Any], key: str) -> dict[str, Any]:
    outer, _, inner = key.partition(".")
    if inner:
        return {**entry, outer: {k: v for k, v in entry[outer].items() if k != inner}}
    return {k: v for k, v in entry.items() if k != key}


def _load(folder: Path, name: str, table: str, entry: dict[str, Any]) -> ServerSpec:
    path = folder / name
    path.write_text(json.dumps({table: {"s": entry}}))
    (spec,) = load_config(path, environ={}).servers
    return spec


@pytest.mark.parametrize(("name", "table", "entry", "key"), OPTIONAL, ids=[f"{t}.{k}" for _, t, _, k in OPTIONAL])
def test_a_null_optional_key_reads_as_not_written(tmp_path: Path, name: str, table: str, entry: dict[str, Any], key: str) -> None:
    without = _load(tmp_path, name, table, _without(entry, key))
    with_null = _load(tmp_path, name, table, _with_null(entry, key))
    (note,) = [n for n in with_null.notes if n.startswith(f"{key}: null, read as not written")]
    assert "remove the key" in note and "Claude Code skips" in note
    assert (with_null.transport, with_null.command, with_null.args, with_null.env, with_null.cwd, with_null.url) == (
        without.transport,
        without.command,
        without.args,
        without.env,
        without.cwd,
        without.url,
    )
    assert (with_null.enabled, with_null.headers, with_null.oauth, with_null.tool_filter, with_null.shared) == (
        without.enabled,
        without.headers,
        without.oauth,
        without.tool_filter,
        without.shared,
    )


#: (file name, table, entry, the key named, the fix's words): a null where no value can be left out.
REQUIRED: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("mcp.json", "mcpServers", {"command": None, "args": ["x"]}, "mcpServers.s.command", '"command": "npx"'),
    ("mcp.json", "servers", {"type": "http", "url": None}, "servers.s.url", '"url": "https://example.com/mcp"'),
    ("mcp.json", "mcpServers", {"serverUrl": None}, "mcpServers.s.serverUrl", '"serverUrl": "https://'),
    ("settings.json", "context_servers", {"command": {"path": None}}, "context_servers.s.command.path", '"path": "npx"'),
    ("opencode.json", "mcp", {"type": "local", "command": None}, "mcp.s.command", '"command": ["npx", "-y", "pkg"]'),
    ("opencode.json", "mcp", {"type": "remote", "url": None}, "mcp.s.url", '"url": "https://example.com/mcp"'),
]


@pytest.mark.parametrize(("name", "table", "entry", "key", "fix"), REQUIRED, ids=[r[3] for r in REQUIRED])
def test_a_null_where_a_value_is_required_names_file_key_and_fix(
    tmp_path: Path, name: str, table: str, entry: dict[str, Any], key: str, fix: str
) -> None:
    path = tmp_path / name
    path.write_text(json.dumps({table: {"s": entry}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.path == str(path) and info.value.key == key, str(info.value)
    assert "got null" in info.value.detail and fix in (info.value.fix or ""), str(info.value)


def test_a_null_argument_names_its_index(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": {"s": {"command": "x", "args": ["a", None]}}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.key == "servers.s.args[1]" and "null" in info.value.detail and info.value.fix == "remove it"


def test_a_vs_code_file_with_nulls_is_checked_and_started_as_the_user_sees_it(tmp_path: Path) -> None:
    """`config check` and `status`, as a user runs them, on VS Code's file: the server starts, the note says why."""
    (tmp_path / ".vscode").mkdir()
    path = tmp_path / ".vscode" / "mcp.json"
    entry: dict[str, Any] = {"type": "stdio", "command": sys.executable, "args": ["-m", "breakwater", "testserver"]}
    entry |= {"env": None, "envFile": None, "cwd": None, "headers": None}
    path.write_text(json.dumps({"servers": {"echo": entry}, "inputs": None}))
    env = {**os.environ, "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0", "COLUMNS": "400"}
    for command in (["config", "check"], ["status", "--wait", "20"]):
        result = subprocess.run(
            [sys.executable, "-m", "breakwater", *command, "--config", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    check = subprocess.run(
        [sys.executable, "-m", "breakwater", "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert "env, envFile, cwd, headers: null, read as not written" in check.stdout, check.stdout


# ---- Claude Code's approvals ---------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with three `.mcp.json` servers, and a home of its own (Claude Code's settings are read there)."""
    home, folder = tmp_path / "home", tmp_path / "repo"
    (home / ".claude").mkdir(parents=True)
    (folder / ".claude").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    servers = {"a": {"command": "x"}, "b": {"command": "y"}, "my.server": {"command": "z"}}
    (folder / ".mcp.json").write_text(json.dumps({"mcpServers": servers}))
    return folder


def _started(folder: Path) -> dict[str, ServerSpec]:
    return {spec.name: spec for spec in load_config(folder / ".mcp.json", environ={}).servers}


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data))


def test_a_server_claude_code_has_not_approved_is_not_started(project: Path) -> None:
    """Approved `a` (and `my.server`, which Claude Code compares as `my_server`): `b`, added later, waits as in Claude Code."""
    _write(project / ".claude" / "settings.local.json", {"enabledMcpjsonServers": ["a", "my_server"]})
    read = _started(project)
    assert read["a"].enabled and read["my.server"].enabled and not read["b"].enabled
    said = read["b"].disabled_by or ""
    assert said.startswith("not approved in Claude Code"), said
    assert f"not started: {said}" in read["b"].notes
    # The fix is the project's file Claude Code itself writes when the user approves, not the user's settings, where a
    # name is approved in every project (any repository's server of that name would start).
    local = project.resolve() / ".claude" / "settings.local.json"
    assert f"run claude in {project.resolve()}" in said and f'add "b" to enabledMcpjsonServers in {local}' in said, said
    assert str(Path.home()) not in said, said
    _write(local, {"enabledMcpjsonServers": ["a", "my_server", "b"]})  # the fix, followed
    assert all(spec.enabled for spec in _started(project).values())


def test_every_server_starts_once_all_are_approved_or_none_was_ever_answered(project: Path) -> None:
    assert all(spec.enabled for spec in _started(project).values())  # never opened in Claude Code: nobody to ask
    _write(Path.home() / ".claude" / "settings.json", {"enableAllProjectMcpServers": True, "enabledMcpjsonServers": ["a"]})
    assert all(spec.enabled for spec in _started(project).values())
    _write(project / ".claude" / "settings.json", {"disabledMcpjsonServers": ["b"]})  # a "no" wins over "all"
    read = _started(project)
    assert read["a"].enabled and not read["b"].enabled and "rejected in Claude Code" in (read["b"].disabled_by or "")


def test_the_repositorys_own_settings_approve_nothing_until_the_folder_is_trusted(project: Path) -> None:
    """`.claude/settings.json` is committed with the repository: Claude Code reads approvals there only once the user
    trusted the folder (`hasTrustDialogAccepted` in ~/.claude.json)."""
    _write(Path.home() / ".claude" / "settings.json", {"enabledMcpjsonServers": ["a"]})
    _write(
        project / ".claude" / "settings.json", {"enabledMcpjsonServers": ["b", "my.server"], "enableAllProjectMcpServers": True}
    )
    read = _started(project)
    assert read["a"].enabled and not read["b"].enabled and not read["my.server"].enabled
    _write(Path.home() / ".claude.json", {"projects": {str(project.resolve()): {"hasTrustDialogAccepted": True}}})
    assert all(spec.enabled for spec in _started(project).values())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_local_settings_that_came_with_the_repository_approve_nothing(project: Path) -> None:
    """A repository that commits `.claude/settings.local.json` approving its own servers: Claude Code ignores it."""
    _write(Path.home() / ".claude" / "settings.json", {"enabledMcpjsonServers": ["a"]})
    _write(project / ".claude" / "settings.local.json", {"enabledMcpjsonServers": ["b"]})
    assert _started(project)["b"].enabled  # no repository: nobody committed it
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", ".claude/settings.local.json"], check=True)
    said = _started(project)["b"].disabled_by or ""
    assert "Claude Code ignores approvals there: git tracks it" in said, said
    # Where Claude Code ignores them, the fix names the user's settings, and what approving a name there means.
    user = Path.home() / ".claude" / "settings.json"
    assert f'add "b" to enabledMcpjsonServers in {user} (which approves that name in every project)' in said, said


def test_a_trusted_parent_folder_approves_nothing_of_a_repository_under_it(project: Path) -> None:
    """A user who trusted their code folder in Claude Code is not asked again for a repository cloned under it, but
    Claude Code reads that repository's committed `.claude/settings.json` only once the repository's own entry is
    trusted (checked with Claude Code 2.1.197: it asks about `b`); nor does a parent's entry approve its servers."""
    _write(Path.home() / ".claude" / "settings.json", {"enabledMcpjsonServers": ["a"]})
    _write(project / ".claude" / "settings.json", {"enableAllProjectMcpServers": True})
    parent = {"hasTrustDialogAccepted": True, "enabledMcpjsonServers": ["my.server"]}
    _write(Path.home() / ".claude.json", {"projects": {str(project.parent.resolve()): parent}})
    read = _started(project)
    assert read["a"].enabled and not read["b"].enabled and not read["my.server"].enabled
    assert (read["b"].disabled_by or "").startswith("not approved in Claude Code"), read["b"].disabled_by
    own = {"hasTrustDialogAccepted": True}
    _write(Path.home() / ".claude.json", {"projects": {str(project.parent.resolve()): parent, str(project.resolve()): own}})
    assert all(spec.enabled for spec in _started(project).values())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_repository_is_trusted_at_its_git_root(project: Path) -> None:
    """Claude Code keys a project by its git root: a `.mcp.json` in a folder of the repository is trusted with it."""
    subprocess.run(["git", "init", "-q", str(project.parent)], check=True)
    _write(Path.home() / ".claude" / "settings.json", {"enabledMcpjsonServers": ["a"]})
    _write(project / ".claude" / "settings.json", {"enableAllProjectMcpServers": True})
    assert not _started(project)["b"].enabled
    _write(Path.home() / ".claude.json", {"projects": {str(project.parent.resolve()): {"hasTrustDialogAccepted": True}}})
    assert all(spec.enabled for spec in _started(project).values())


def test_the_project_entry_of_claude_json_approves_as_older_claude_codes_did(project: Path) -> None:
    entry = {"enabledMcpjsonServers": ["a", "b"], "mcpServers": None}
    _write(Path.home() / ".claude.json", {"projects": {str(project.resolve()): entry}})
    read = _started(project)
    assert read["a"].enabled and read["b"].enabled and not read["my.server"].enabled


def test_import_writes_an_unapproved_server_off_and_says_how_to_serve_it(project: Path) -> None:
    _write(project / ".claude" / "settings.local.json", {"enabledMcpjsonServers": ["a", "my.server"]})
    result = subprocess.run(
        [sys.executable, "-m", "breakwater", "config", "import", ".mcp.json"],
        capture_output=True,
        text=True,
        cwd=project,
        env={**os.environ, "COLUMNS": "400"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    written = json.loads((project / "breakwater.servers.json").read_text())["mcpServers"]
    assert written["b"]["disabled"] is True and "disabled" not in written["a"]
    assert 'b written with "disabled": true: Claude Code has not approved them' in result.stdout
    assert "b: not started: not approved in Claude Code" in result.stdout
