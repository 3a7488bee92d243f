"""Where a client's JSON file keeps its servers, and entries of other shapes read as the common one.

Most clients write `mcpServers` (VS Code: `servers`) with the entry keys `_dialect.py` lists. Two write
other shapes, turned here into that common entry before it is read (`_entry.py`):

* OpenCode (`opencode.json`): `mcp.NAME` (`mcp.servers.NAME` in its second config version) with
  `"type": "local"`, `command` as a list (program and arguments), `environment`, `cwd`, `enabled` or
  `disabled`; or `"type": "remote"`, `url`, `headers`, `oauth` (`clientId`, `clientSecret`, `scope`,
  or `false`). A remote server is tried over streamable HTTP, then SSE, as OpenCode does. Its
  `{env:VAR}` and `{file:PATH}` are read by `_expand.py`.
* Zed (`settings.json`): `context_servers.NAME` with `"source": "custom"` and the common keys, or the
  older `"command": {"path", "args", "env"}`; a server an extension provides (`"source": "extension"`)
  only Zed can start, and is skipped with a note.

An error names the key as the user wrote it (`environment`, not `env`). May import the core leaves and
`_dialect.py` only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from breakwater._wire import json_kind
from breakwater.errors import ConfigError

__all__ = [
    "OPENCODE_KINDS",
    "common_entry",
    "gateway_entry",
    "opencode_entry",
    "opencode_file",
    "opencode_tool_patterns",
    "server_table",
]

#: OpenCode's `type` values.
OPENCODE_KINDS = frozenset({"local", "remote"})

_OPENCODE_OAUTH = {"clientId": "clientId", "clientSecret": "clientSecret", "scope": "scopes"}


def server_table(data: Mapping[str, Any], path: str = "") -> tuple[str, Any] | None:
    """Where a JSON file keeps its servers (`mcpServers`, VS Code's `servers` or its settings' `mcp.servers`, Zed's
    `context_servers`, OpenCode's `mcp` or `mcp.servers`), and the table; None when it keeps none.

    Two such tables in one file are an error: reading one would drop the other's servers without a word.
    """
    found = [(top, data[top]) for top in ("mcpServers", "servers", "context_servers") if top in data]
    mcp = data.get("mcp")
    if isinstance(mcp, dict):
        if "servers" in mcp:
            found.append(("mcp.servers", mcp["servers"]))
            if stray := [name for name, v in mcp.items() if name != "servers" and opencode_entry(v)]:
                found.append((f"mcp.{stray[0]}", mcp[stray[0]]))
        # Any entry with a `type` makes `mcp` OpenCode's table: a misspelt type is then that entry's error, not "no servers".
        elif any(isinstance(v, dict) and "type" in v for v in mcp.values()):
            found.append(("mcp", mcp))
    if len(found) > 1:
        first, second = found[0][0], found[1][0]
        raise _fail(f"servers are listed under both {first} and {second}", path, second, f"move them all under {first}")
    return found[0] if found else None


def opencode_entry(entry: Any) -> bool:
    """Whether `entry` is in OpenCode's shape (`"type": "local"` or `"remote"`)."""
    return isinstance(entry, dict) and isinstance(kind := entry.get("type"), str) and kind in OPENCODE_KINDS


def opencode_file(path: Path, top: str, entries: Any) -> bool:
    """Whether the file is OpenCode's (read with its `{env:VAR}` and `{file:PATH}`): by its name or its entries' shape."""
    if path.name in ("opencode.json", "opencode.jsonc") or top == "mcp":
        return True
    return isinstance(entries, dict) and any(opencode_entry(e) for e in entries.values())


def _fail(message: str, path: str, key: str, fix: str) -> ConfigError:
    return ConfigError(message, path=path, key=key, fix=fix)


def common_entry(entry: Any, path: str, where: str) -> tuple[Any, dict[str, str], list[str]]:
    """`entry` in the common shape, the keys renamed on the way (common -> as written), and notes."""
    if not isinstance(entry, dict):
        return entry, {}, []
    if opencode_entry(entry):
        return _opencode(entry, path, where)
    if "source" in entry or isinstance(entry.get("command"), dict):
        return _zed(entry, path, where)
    return entry, {}, []


#: The keys of OpenCode's two entry shapes (its config schema, `McpLocalConfig` and `McpRemoteConfig`); OpenCode refuses
#: any other, and so does breakwater, rather than read a key OpenCode would not (`args`, `env`) and start something else.
_OPENCODE_KEYS = {
    "local": frozenset({"type", "command", "environment", "enabled", "disabled", "timeout", "cwd"}),
    "remote": frozenset({"type", "url", "enabled", "disabled", "headers", "oauth", "timeout"}),
}
_OPENCODE_HINTS = {
    "args": 'OpenCode takes the arguments in "command", after the program: "command": ["npx", "-y", "pkg"]',
    "env": 'OpenCode\'s key is "environment"',
}


def _opencode(entry: dict[str, Any], path: str, where: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    kind = entry["type"]
    known, other = _OPENCODE_KEYS[kind], next(k for k in _OPENCODE_KEYS if k != kind)
    for key in entry:
        if key not in known and key in _OPENCODE_KEYS[other]:
            raise _fail(f"a {kind} server has no {key}", path, f"{where}.{key}", f'remove "{key}", or write "type": "{other}"')
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = _OPENCODE_HINTS.get(key) or (
                f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(known))}"
            )
            raise _fail(f"unknown key in an OpenCode {kind} server", path, f"{where}.{key}", hint)
    out = {k: v for k, v in entry.items() if k not in ("type", "command", "environment", "oauth")}
    renames: dict[str, str] = {}
    notes: list[str] = []
    if kind == "local":
        command = entry.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(w, str) for w in command):
            said = "is empty" if command == [] else f"got {json_kind(command)}" if command is not None else "is missing"
            if isinstance(command, list) and command:
                said = f"holds {json_kind(next(w for w in command if not isinstance(w, str)))} where a word goes"
            fix = '"command": ["npx", "-y", "pkg"]'
            raise _fail(f"expected the program and its arguments as a list; it {said}", path, f"{where}.command", fix)
        out |= {"type": "stdio", "command": command[0], "args": command[1:]}
        if "environment" in entry:
            out["env"], renames["env"] = entry["environment"], "environment"
    else:  # remote: OpenCode tries streamable HTTP, then SSE, as an entry of no stated type is tried here
        oauth = entry.get("oauth")
        if isinstance(oauth, dict):
            out["oauth"] = {_OPENCODE_OAUTH.get(k, k): v for k, v in oauth.items() if k != "redirectUri"}
            if "redirectUri" in oauth:
                notes.append(
                    "oauth.redirectUri ignored: breakwater's redirect is http://localhost:PORT/callback (oauth.callbackPort)"
                )
        elif oauth is not None and oauth is not False:
            raise _fail("expected an object, or false", path, f"{where}.oauth", '"oauth": {"clientId": "..."} or "oauth": false')
        if "url" not in entry:
            raise _fail("a remote server needs an http(s) url", path, f"{where}.url", 'add "url": "https://.../mcp"')
    return out, renames, notes


def _zed(entry: dict[str, Any], path: str, where: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    source = entry.get("source", "custom")
    if source != "custom":
        fix = 'use "custom" (a server an extension provides is Zed\'s)'
        raise _fail(f"unknown source {source!r}", path, f"{where}.source", fix)
    out = {k: v for k, v in entry.items() if k not in ("source", "settings", "command")}
    notes = ["settings ignored: settings a Zed extension reads; not used"] if "settings" in entry else []
    command = entry.get("command")
    if isinstance(command, dict):  # Zed's older shape
        for key in command:
            if key not in ("path", "args", "env"):
                raise _fail("unknown key", path, f"{where}.command.{key}", "use path, args and env")
        out |= {"command" if k == "path" else k: v for k, v in command.items()}
    elif command is not None:
        out["command"] = command
    older = {"command": "command.path", "args": "command.args", "env": "command.env"}  # as written in the older shape
    return out, older if isinstance(command, dict) else {}, notes


def gateway_entry(top: str, sample: Any, command: list[str]) -> dict[str, Any]:
    """The one entry that starts breakwater, in the shape of the table `top` (whose first entry is `sample`)."""
    if top == "mcp" or opencode_entry(sample):
        return {"type": "local", "command": command}
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if top == "context_servers":
        return {"source": "custom", **entry}
    return {"type": "stdio", **entry} if top != "mcpServers" else entry


def _opencode_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)


def opencode_tool_patterns(raw: dict[str, Any], servers: list[str], gateway: str, named: Callable[[str, str], str]) -> list[str]:
    """Rewrite, in place, OpenCode's tool patterns (`tools`, `agent.NAME.tools`) that name the moved servers' tools.

    OpenCode names a server's tool `SERVER_TOOL` and its `tools` patterns (`"github_*": false`) switch them off or
    on, per agent too. Behind breakwater the same tool is `GATEWAY_` and its name through breakwater (`named`), so a
    pattern left as it was would match nothing and a tool the user switched off would come back. Returns what was
    rewritten, for the notes.
    """
    by_prefix = {_opencode_name(s): s for s in sorted(servers, key=len, reverse=True)}
    tables = [("tools", raw.get("tools"))]
    agents = raw.get("agent")
    if isinstance(agents, dict):
        tables += [(f"agent.{name}.tools", a.get("tools")) for name, a in agents.items() if isinstance(a, dict)]
    done = []
    for where, table in tables:
        if not isinstance(table, dict):
            continue
        for pattern in list(table):
            prefix = next((p for p in by_prefix if pattern.startswith(p + "_")), None)
            if prefix is not None:
                # OpenCode makes each character outside [a-zA-Z0-9_-] of a tool's name `_`; a `*` stays a `*`.
                through = named(by_prefix[prefix], pattern[len(prefix) + 1 :])
                new = f"{gateway}_" + "*".join(_opencode_name(part) for part in through.split("*"))
                table[new] = table.pop(pattern)
                done.append(f"{where}: {pattern!r} is now {new!r}")
    return done
