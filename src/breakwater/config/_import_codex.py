"""`breakwater config import` for Codex's `config.toml`: its `[mcp_servers.*]` move behind breakwater.

The servers are written, as they were, to `breakwater.servers.toml` (a Codex-shaped file that
`servers_file` reads); the agent's side is Codex's own file with every `[mcp_servers.*]` table taken
out and one `[mcp_servers.breakwater]` put in. breakwater writes TOML without a TOML library (the
standard library only reads it), so the agent's file is edited as text, table by table, and the edit
is kept only when reading it back gives the original's every other setting unchanged and exactly the
one server: anything the text edit cannot be sure of (a server written as dotted keys on another
table's lines) is refused, with the lines to change by hand. May import the core leaves and the rest
of `config` only.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from breakwater.config._codex import CODEX_TOP
from breakwater.config._dialect import skipped_entry
from breakwater.config._model import Config
from breakwater.errors import ConfigError

__all__ = ["SERVERS_TOML", "Named", "codex_files", "name_taken"]

SERVERS_TOML = "breakwater.servers.toml"
_HEADER = re.compile(r"^\s*\[\[?\s*(?P<name>[^\]]*?)\s*\]\]?\s*(#.*)?$")
#: Floor of the agent's wait for one breakwater call: Codex's own default (60 s) would cut a call breakwater
#: still governs (its own timeouts, progress, retries).
_MIN_TOOL_TIMEOUT_S = 60
#: Room in the agent's start-up timeout beyond breakwater's first-list wait: its own start, the handshake, a slow host.
_STARTUP_MARGIN_S = 10


#: A tool's name through the gateway being written, from its server and its own name (or a pattern with `*`).
Named = Callable[[str, str], str]


def codex_files(
    source: Path, config: Config, gateway_command: list[str], gateway_name: str, named: Named
) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """(the servers file's text, the agent's new config.toml, the entries that stay with the agent)."""
    text = source.read_text(encoding="utf-8-sig")
    data = tomllib.loads(text)
    if not isinstance(data.get(CODEX_TOP), dict):  # breakwater's own config, which has no agent to move
        fix = "import takes the file your agent reads: Codex's config.toml, or an mcpServers JSON file"
        raise ConfigError("no [mcp_servers] table", path=str(source), key=CODEX_TOP, fix=fix)
    tables: dict[str, Any] = data[CODEX_TOP]
    if gateway_name in tables:
        raise name_taken(source, f"{CODEX_TOP}.{gateway_name}")
    kept = {name: table for name, table in tables.items() if skipped_entry(table) is not None}
    served = {name: table for name, table in tables.items() if name not in kept}
    servers_text = f"# The servers of {source.name}, as they were; breakwater.toml reads them (servers_file).\n\n"
    servers_text += "\n".join(_tables(f"{CODEX_TOP}.{_key(name)}", table) for name, table in served.items())
    longest = max((s.call.max_s * s.retry.max_attempts for s in config.servers), default=_MIN_TOOL_TIMEOUT_S)
    entry = {
        "command": gateway_command[0],
        "args": gateway_command[1:],
        "tool_timeout_sec": max(_MIN_TOOL_TIMEOUT_S, int(longest) + 10),
        # Codex's start-up (10 s by default) covers breakwater's first tools/list, which waits up to list_wait_s for
        # servers still starting: on a slow machine the two come close.
        "startup_timeout_sec": int(config.gateway.list_wait_s) + _STARTUP_MARGIN_S,
        **_approvals(served, named),
    }
    rest = _without_servers(text).strip()
    agent_text = (rest + "\n\n" if rest else "") + _tables(f"{CODEX_TOP}.{gateway_name}", entry)
    for name, table in kept.items():
        agent_text += "\n" + _tables(f"{CODEX_TOP}.{_key(name)}", table)
    _check_agent_file(agent_text, data, {gateway_name: entry, **kept}, source)
    if tomllib.loads(servers_text).get(CODEX_TOP, {}) != served:  # what this writer cannot say (a date) is not guessed at
        raise ConfigError(
            "a server's settings hold a value breakwater cannot copy into a file of its own",
            path=str(source),
            key=CODEX_TOP,
            fix="write its values as strings, numbers, true/false, lists and tables",
        )
    return servers_text, agent_text, kept


#: Codex's approval modes, the most careful first: `prompt` asks every time, `auto` lets Codex decide, `approve` never asks.
_APPROVALS = ("prompt", "auto", "approve")


def _approvals(served: dict[str, Any], named: Named) -> dict[str, Any]:
    """The moved servers' approvals, for the one entry: Codex asks before a call as it did before the move.

    Codex keeps approvals per server (`default_tools_approval_mode`) and per tool (`tools.TOOL.approval_mode`). Behind
    breakwater every tool is the one server's, under its name through breakwater: each tool's mode moves to that name,
    and the servers' defaults become the most careful of them (a tool never asked about before may be asked about now,
    never the other way round).
    """
    defaults = {str(t.get("default_tools_approval_mode", "auto")) for t in served.values() if isinstance(t, dict)}
    out: dict[str, Any] = {}
    if len(defaults) == 1 and defaults != {"auto"}:
        out["default_tools_approval_mode"] = defaults.pop()
    elif len(defaults) > 1:  # with a mode this breakwater cannot rank, `prompt`: it asks, whatever that mode did
        ranked = [m for m in _APPROVALS if m in defaults]
        out["default_tools_approval_mode"] = ranked[0] if defaults <= set(_APPROVALS) else "prompt"
    tools = {
        named(server, tool): mode
        for server, table in served.items()
        if isinstance(table, dict) and isinstance(table.get("tools"), dict)
        for tool, mode in table["tools"].items()
    }
    if tools:
        out["tools"] = tools
    return out


def name_taken(source: Path, key: str) -> ConfigError:
    """The error for a file that already has a server of the gateway entry's name (`key`)."""
    return ConfigError(
        f"a server is already called {key.rsplit('.', 1)[-1]!r}",
        path=str(source),
        key=key,
        fix="this file may already go through breakwater; rename that server to import it",
    )


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _value(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    # A JSON string is a TOML basic string, but for DEL, which TOML wants escaped and JSON leaves as it is.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def _tables(header: str, table: dict[str, Any]) -> str:
    """`[header]` with the table's values, then its sub-tables as tables of their own."""
    lines = [f"[{header}]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + "\n"
    for k, v in table.items():
        if isinstance(v, dict):
            out += "\n" + _tables(f"{header}.{_key(k)}", v)
    return out


def _without_servers(text: str) -> str:
    """The text without its `[mcp_servers...]` tables (each from its header to the next header); the comments just
    above a header that stays stay with it."""
    out: list[str] = []
    above: list[str] = []  # comment and blank lines at the end of a table taken out
    skipping = False
    for line in text.splitlines(keepends=True):
        header = _HEADER.match(line)
        if header:
            skipping = header["name"].split(".")[0].strip().strip("\"'") == CODEX_TOP
            if not skipping:
                out += above
            above = []
        if not skipping:
            out.append(line)
        elif not line.strip() or line.lstrip().startswith("#"):
            above.append(line)
        else:
            above = []
    return "".join(out).rstrip() + "\n"


def _check_agent_file(agent_text: str, original: dict[str, Any], servers: dict[str, Any], source: Path) -> None:
    """The agent's new file says what the original said, but for its servers, which are exactly `servers`."""
    try:
        written = tomllib.loads(agent_text)
    except tomllib.TOMLDecodeError as exc:
        written = {"unreadable": str(exc)}
    rest = {k: v for k, v in original.items() if k != CODEX_TOP}
    if {k: v for k, v in written.items() if k != CODEX_TOP} != rest or written.get(CODEX_TOP) != servers:
        raise ConfigError(
            f"{CODEX_TOP} are written in a way breakwater cannot take out of the file as text",
            path=str(source),
            key=CODEX_TOP,
            fix=f"write each server as its own [{CODEX_TOP}.NAME] table, or move them by hand: breakwater.toml can read"
            f" this file as it is (servers_file = {str(source)!r}) once the agent's copy lists only breakwater",
        )
