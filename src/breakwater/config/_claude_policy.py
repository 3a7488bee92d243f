"""Claude Code's managed MCP policy: the servers an organization's administrator allowed or denied.

An administrator restricts which MCP servers Claude Code runs with `allowedMcpServers` and `deniedMcpServers` in
Claude Code's managed settings (`/etc/claude-code/managed-settings.json` on Linux, `/Library/Application
Support/ClaudeCode/managed-settings.json` on macOS, `C:\\Program Files\\ClaudeCode\\` or `C:\\ProgramData\\ClaudeCode\\`
on Windows). Behind breakwater Claude Code sees one server, breakwater, so its check of each server's name, command or
URL never sees the servers breakwater starts: a denied server ran, and an allowlist let everything through. So
breakwater applies the same lists to every server it would start (whatever its file and whichever agent launched it:
the policy is the machine's), and a server they block is off with the reason (`disabled_by`), as Claude Code would
not have started it:

* the lists of the managed settings, the user's `~/.claude/settings.json` and the `.claude/settings.json` and
  `.claude/settings.local.json` of the folder breakwater runs in are merged, one allowlist and one denylist, as
  Claude Code merges them (an allowlist other than the managed one does not count under `allowManagedMcpServersOnly`);
* a server that matches a denylist entry is blocked, whatever the allowlist says;
* with an allowlist (an empty one allows nothing), a stdio server must match one of its `serverCommand` entries when
  it has any, else one of its `serverName` entries; a remote server likewise its `serverUrl` entries, else its names;
* `serverName` is the server's name; `serverCommand` the exact command and arguments, in order; `serverUrl` the URL,
  where `*` stands for any run of characters;
* an entry that is not an object with exactly one of those keys (of the right type) is left out, and said in the
  config's notes, as Claude Code leaves it out; a settings file that cannot be read or parsed counts as absent.

`managed-mcp.json` (a fixed set of servers) needs nothing here: Claude Code enforces it on breakwater's own entry.
May import the core leaves only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from breakwater import _paths
from breakwater.config._model import Config

__all__ = ["MANAGED_SETTINGS_ENV", "ClaudePolicy", "apply_claude_policy", "managed_settings_paths", "read_claude_policy"]

_KEYS = ("serverName", "serverCommand", "serverUrl")
#: The variable that names the managed settings file to read instead of the platform's.
MANAGED_SETTINGS_ENV = "BREAKWATER_CLAUDE_MANAGED_SETTINGS"


def managed_settings_paths(environ: Mapping[str, str]) -> tuple[Path, ...]:
    """Where Claude Code's managed settings live on this platform (`_paths`); `MANAGED_SETTINGS_ENV` in `environ` names
    another file instead (to try a policy before deploying it; the test suite's own)."""
    if given := environ.get(MANAGED_SETTINGS_ENV):
        return (Path(given),)
    return _paths.claude_managed_settings()


@dataclass(frozen=True, slots=True)
class _Entry:
    key: str  # serverName, serverCommand or serverUrl
    value: str | tuple[str, ...]
    where: str  # "deniedMcpServers[2] in /etc/claude-code/managed-settings.json"

    def matches(self, name: str, command: tuple[str, ...] | None, url: str | None) -> bool:
        if self.key == "serverName":
            return self.value == name
        if self.key == "serverCommand":
            return command is not None and self.value == command
        return url is not None and _wildcard(str(self.value)).fullmatch(url) is not None


@dataclass(frozen=True, slots=True)
class ClaudePolicy:
    """The merged lists: `allowed` None when no settings file has an allowlist."""

    denied: tuple[_Entry, ...] = ()
    allowed: tuple[_Entry, ...] | None = None
    #: The allowlist's sources, for the reason a server is off ("allowedMcpServers in /etc/…").
    allow_sources: tuple[str, ...] = ()
    #: Entries left out, each said.
    notes: tuple[str, ...] = ()

    def blocks(self, name: str, command: tuple[str, ...] | None, url: str | None) -> str | None:
        """Why the policy blocks the server (None: it does not): `command` for a stdio server, `url` for a remote one."""
        for entry in self.denied:
            if entry.matches(name, command, url):
                return f"{entry.where} lists it (Claude Code's MCP policy)"
        if self.allowed is None:
            return None
        kind = "serverCommand" if command is not None else "serverUrl"
        by_kind = [entry for entry in self.allowed if entry.key == kind]
        candidates = by_kind or [entry for entry in self.allowed if entry.key == "serverName"]
        if any(entry.matches(name, command, url) for entry in candidates):
            return None
        what = f"its {'command' if command is not None else 'URL'}" if by_kind else "its name"
        return f"allowedMcpServers in {' and '.join(self.allow_sources)} does not allow {what} (Claude Code's MCP policy)"


def read_claude_policy(managed: Iterable[Path], project: Path) -> ClaudePolicy:
    """The policy of the managed settings files (`managed_settings_paths`), the user's `~/.claude/settings.json`, and
    the `.claude/settings.json` and `.claude/settings.local.json` of `project` (the folder breakwater runs in, where
    its agent runs), as Claude Code reads them there (trusted folder or not)."""
    notes: list[str] = []
    managed_files = [(path, _read(path, notes)) for path in managed]
    others: dict[Path, Path] = {}  # by resolved path: the home folder's `.claude/settings.json` is the user's own
    folder = project / ".claude"
    for path in (Path.home() / ".claude" / "settings.json", folder / "settings.json", folder / "settings.local.json"):
        others.setdefault(path.resolve(), path)
    only_managed = any(settings.get("allowManagedMcpServersOnly") is True for _, settings in managed_files)
    denied: list[_Entry] = []
    allowed: list[_Entry] | None = None
    sources: list[str] = []
    files = [
        *((path, settings, True) for path, settings in managed_files),
        *((path, _read(path, notes), False) for path in others.values()),
    ]
    for path, settings, is_managed in files:
        denied += _entries(settings, "deniedMcpServers", path, notes)
        if is_managed or not only_managed:
            listed = _entries(settings, "allowedMcpServers", path, notes)
            # A value that is no list is left out (and said), as if not written: not an allowlist that allows nothing.
            if isinstance(settings.get("allowedMcpServers"), list):
                allowed = [*(allowed or []), *listed]
                sources.append(str(path))
    return ClaudePolicy(tuple(denied), None if allowed is None else tuple(allowed), tuple(sources), tuple(notes))


def _entries(settings: Mapping[str, Any], field: str, path: Path, notes: list[str]) -> list[_Entry]:
    if field not in settings:
        return []
    listed = settings[field]
    if not isinstance(listed, list):
        notes.append(f"{field} in {path} is not a list: left out, as Claude Code leaves it out")
        return []
    entries = []
    for index, item in enumerate(listed):
        where = f"{field}[{index}] in {path}"
        entry = _entry(item, where)
        if entry is None:
            notes.append(f"{where} is not an object with one of {', '.join(_KEYS)}: left out, as Claude Code leaves it out")
        else:
            entries.append(entry)
    return entries


def _entry(item: Any, where: str) -> _Entry | None:
    if not isinstance(item, dict) or len(item) != 1:
        return None
    key, value = next(iter(item.items()))
    if key in ("serverName", "serverUrl") and isinstance(value, str) and value:
        return _Entry(key, value, where)
    if key == "serverCommand" and isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        return _Entry(key, tuple(value), where)
    return None


def _wildcard(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _read(path: Path, notes: list[str]) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        notes.append(f"{path} could not be read ({type(exc).__name__}): its MCP server lists are not applied")
        return {}
    return data if isinstance(data, dict) else {}


def apply_claude_policy(config: Config, policy: ClaudePolicy) -> Config:
    """`config` with every server the policy blocks off (`disabled_by` says why), and the policy's notes."""
    servers = []
    for spec in config.servers:
        command = (spec.command or "", *spec.args) if spec.transport == "stdio" else None
        why = policy.blocks(spec.name, command, None if command is not None else spec.url) if spec.enabled else None
        if why is not None:
            spec = replace(spec, enabled=False, disabled_by=why, notes=(*spec.notes, f"not started: {why}"))
        servers.append(spec)
    if not policy.notes and servers == list(config.servers):
        return config
    return replace(config, servers=tuple(servers), notes=(*config.notes, *policy.notes))
