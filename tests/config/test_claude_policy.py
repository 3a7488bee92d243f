"""Claude Code's managed MCP policy (`allowedMcpServers`, `deniedMcpServers`) holds for the servers behind breakwater.

Behind breakwater Claude Code sees one server, so an administrator's denylist never met the servers breakwater
started, and an allowlist let every one of them through. Each case writes the machine's managed settings and the
user's `~/.claude/settings.json` (both in the test's own folders) and loads a config as `serve` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from breakwater import Breakwater, ServerState
from breakwater.config import Config
from breakwater.config._claude_policy import MANAGED_SETTINGS_ENV
from breakwater.config._files import load_config_serving

SERVERS: dict[str, Any] = {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem"]},
    "files-flagged": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "--flag"]},
    "github": {"command": "docker", "args": ["run", "ghcr.io/github/github-mcp-server"]},
    "tickets": {"type": "http", "url": "https://mcp.tickets.example.com/mcp"},
    "wiki": {"type": "http", "url": "https://wiki.internal.example/mcp"},
}


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the managed settings file, the user's settings file): neither written yet."""
    managed = tmp_path / "etc" / "claude-code" / "managed-settings.json"
    monkeypatch.setenv(MANAGED_SETTINGS_ENV, str(managed))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return managed, tmp_path / "home" / ".claude" / "settings.json"


def _write(path: Path, settings: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings))


def _load(tmp_path: Path, servers: dict[str, Any] | None = None) -> Config:
    path = tmp_path / "project" / "servers.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": SERVERS if servers is None else servers}))
    config: Config = load_config_serving(path)
    return config


def _off(config: Config) -> dict[str, str]:
    return {spec.name: spec.disabled_by or "" for spec in config.servers if not spec.enabled}


def test_without_a_policy_every_server_starts(machine: tuple[Path, Path], tmp_path: Path) -> None:
    assert _off(_load(tmp_path)) == {}


def test_a_denylist_blocks_by_name_by_exact_command_and_by_url_pattern(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, _ = machine
    denied = [
        {"serverName": "github"},
        {"serverCommand": ["npx", "-y", "@modelcontextprotocol/server-filesystem"]},
        {"serverUrl": "https://*.tickets.example.com/*"},
    ]
    _write(managed, {"deniedMcpServers": denied})
    off = _off(_load(tmp_path))
    assert set(off) == {"github", "files", "tickets"}  # not files-flagged (another command), not wiki
    assert off["github"] == f"deniedMcpServers[0] in {managed} lists it (Claude Code's MCP policy)"
    assert off["files"].startswith(f"deniedMcpServers[1] in {managed}")
    assert off["tickets"].startswith(f"deniedMcpServers[2] in {managed}")


def test_the_users_own_denylist_counts_too(machine: tuple[Path, Path], tmp_path: Path) -> None:
    _, user = machine
    _write(user, {"deniedMcpServers": [{"serverName": "wiki"}]})
    assert set(_off(_load(tmp_path))) == {"wiki"}


def test_an_allowlist_with_commands_and_urls_asks_each_server_for_its_own_kind(
    machine: tuple[Path, Path], tmp_path: Path
) -> None:
    managed, _ = machine
    allowed = [
        {"serverName": "github"},  # a name does not allow a stdio server once commands are listed
        {"serverCommand": ["npx", "-y", "@modelcontextprotocol/server-filesystem"]},
        {"serverName": "wiki"},  # nor a remote one once URLs are
        {"serverUrl": "https://mcp.tickets.example.com/*"},
    ]
    _write(managed, {"allowedMcpServers": allowed})
    off = _off(_load(tmp_path))
    assert set(off) == {"files-flagged", "github", "wiki"}
    assert off["github"] == f"allowedMcpServers in {managed} does not allow its command (Claude Code's MCP policy)"
    assert "does not allow its URL" in off["wiki"]


def test_an_allowlist_of_names_only_allows_by_name_and_an_empty_one_allows_nothing(
    machine: tuple[Path, Path], tmp_path: Path
) -> None:
    managed, _ = machine
    _write(managed, {"allowedMcpServers": [{"serverName": "github"}, {"serverName": "tickets"}]})
    assert set(_off(_load(tmp_path))) == {"files", "files-flagged", "wiki"}
    _write(managed, {"allowedMcpServers": []})
    assert set(_off(_load(tmp_path))) == set(SERVERS)


def test_the_denylist_wins_over_the_allowlist(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, _ = machine
    _write(managed, {"allowedMcpServers": [{"serverName": "github"}], "deniedMcpServers": [{"serverName": "github"}]})
    assert "deniedMcpServers[0]" in _off(_load(tmp_path))["github"]


def test_the_user_broadens_the_allowlist_unless_only_the_managed_one_counts(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, user = machine
    _write(user, {"allowedMcpServers": [{"serverName": "wiki"}]})
    _write(managed, {"allowedMcpServers": [{"serverName": "github"}]})
    assert set(_off(_load(tmp_path))) == set(SERVERS) - {"github", "wiki"}
    _write(managed, {"allowedMcpServers": [{"serverName": "github"}], "allowManagedMcpServersOnly": True})
    assert set(_off(_load(tmp_path))) == set(SERVERS) - {"github"}


def test_breakwaters_own_file_cannot_turn_a_blocked_server_on(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, _ = machine
    _write(managed, {"deniedMcpServers": [{"serverName": "github"}]})
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": SERVERS}))
    toml = tmp_path / "breakwater.toml"
    toml.write_text(f'servers_file = "{servers}"\n[servers.github]\nenabled = true\n')
    assert set(_off(load_config_serving(toml))) == {"github"}


def test_a_malformed_entry_is_left_out_and_said_and_the_rest_holds(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, _ = machine
    denied = [{"serverName": "github", "serverCommand": ["x"]}, {"serverCommand": "npx"}, "wiki", {"serverName": "tickets"}]
    _write(managed, {"deniedMcpServers": denied})
    config = _load(tmp_path)
    assert set(_off(config)) == {"tickets"}
    left_out = [note for note in config.notes if "left out, as Claude Code leaves it out" in note]
    assert [note.split(" is ")[0] for note in left_out] == [f"deniedMcpServers[{i}] in {managed}" for i in range(3)]


def test_a_managed_file_that_cannot_be_parsed_is_said(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, _ = machine
    managed.parent.mkdir(parents=True)
    managed.write_text('{"deniedMcpServers": [')
    config = _load(tmp_path)
    assert _off(config) == {}
    assert any(str(managed) in note and "could not be read" in note for note in config.notes), config.notes


@pytest.mark.anyio
async def test_a_blocked_server_is_disabled_with_its_reason_and_never_started(machine: tuple[Path, Path], tmp_path: Path) -> None:
    managed, _ = machine
    marker = tmp_path / "started"
    # A server whose start would leave a file behind: a policy that blocks it must keep it from ever running.
    servers = {"tattle": {"command": "sh", "args": ["-c", f"touch {marker}; sleep 30"]}}
    _write(managed, {"deniedMcpServers": [{"serverCommand": ["sh", "-c", f"touch {marker}; sleep 30"]}]})
    async with Breakwater(_load(tmp_path, servers), admission_dir=tmp_path / "admission") as bw:
        status = {s.name: s for s in bw.status().servers}
        assert status["tattle"].state is ServerState.DISABLED
        assert status["tattle"].disabled_by is not None and "deniedMcpServers[0]" in status["tattle"].disabled_by
        result = await bw.call_tool("tattle", "anything", {})
        assert result.is_error
    assert not marker.exists()


def test_an_allowlist_that_is_no_list_is_left_out_not_read_as_allowing_nothing(
    machine: tuple[Path, Path], tmp_path: Path
) -> None:
    managed, _ = machine
    _write(managed, {"allowedMcpServers": {"serverName": "github"}})
    config = _load(tmp_path)
    assert _off(config) == {}
    assert any(note.startswith(f"allowedMcpServers in {managed} is not a list") for note in config.notes), config.notes


def test_the_project_folders_settings_count_as_claude_code_reads_them_there(
    machine: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code reads the lists of the folder it runs in, `.claude/settings.json` and `.claude/settings.local.json`,
    trusted or not (checked with Claude Code itself: `claude mcp list` there): a denylist there blocks, an allowlist
    there restricts, or broadens the managed one."""
    managed, _ = machine
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    monkeypatch.chdir(project)
    _write(project / ".claude" / "settings.json", {"deniedMcpServers": [{"serverName": "github"}]})
    _write(project / ".claude" / "settings.local.json", {"deniedMcpServers": [{"serverName": "wiki"}]})
    off = _off(_load(tmp_path))
    assert set(off) == {"github", "wiki"}
    assert off["wiki"].startswith(f"deniedMcpServers[0] in {project / '.claude' / 'settings.local.json'}")
    (project / ".claude" / "settings.local.json").unlink()
    _write(project / ".claude" / "settings.json", {"allowedMcpServers": [{"serverName": "tickets"}]})
    assert set(_off(_load(tmp_path))) == set(SERVERS) - {"tickets"}
    _write(managed, {"allowedMcpServers": [{"serverName": "wiki"}]})
    assert set(_off(_load(tmp_path))) == set(SERVERS) - {"tickets", "wiki"}
    _write(managed, {"allowedMcpServers": [{"serverName": "wiki"}], "allowManagedMcpServersOnly": True})
    assert set(_off(_load(tmp_path))) == set(SERVERS) - {"wiki"}
