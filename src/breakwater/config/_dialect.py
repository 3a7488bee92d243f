"""The keys Claude Code, Cursor, Claude Desktop, VS Code, Gemini CLI (and Cline, Roo, Windsurf) write in server entries.

OpenCode's and Zed's entries have shapes of their own, turned into this one first (`_shapes.py`).

Each key is used, kept for sign-in, or ignored with a note that `config check` prints; only a key
no client writes (a typo) is an error. Entries of a kind breakwater cannot connect to (WebSocket,
Claude Code's IDE and SDK links) are skipped with a note, so the rest of the file still works.
Also `envFile` (VS Code, Cursor): the dotenv file whose variables a stdio server gets, and Gemini CLI's
ways: `httpUrl`, its `mcp.allowed` and `mcp.excluded` lists, `$VAR` without braces in its own files.
Codex's `config.toml` has keys of its own (`_codex.py`). May import the core leaves only.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from breakwater import _platform
from breakwater._paths import read_user_file
from breakwater._wire import json_kind
from breakwater.errors import ConfigError

__all__ = [
    "GEMINI_OAUTH_KEYS",
    "HTTP_KINDS",
    "IGNORED_ENTRY_KEYS",
    "NUMBERS_NOTE",
    "SIGN_IN_KEYS",
    "SKIPPED_KEYS",
    "SKIPPED_TYPES",
    "SWITCHED_OFF",
    "TRANSPORT_KEYS",
    "URL_KEYS",
    "USED_ENTRY_KEYS",
    "bare_reference_notes",
    "claude_disabled_servers",
    "claude_local_servers",
    "claude_project",
    "command_words",
    "entry_notes",
    "entry_transport",
    "entry_url_key",
    "gemini_file",
    "gemini_server_lists",
    "misspelt_tables",
    "project_key",
    "read_env_file",
    "skipped_entry",
    "top_level_notes",
]

#: Keys breakwater reads (`enabled` is breakwater.toml's spelling of JSON's `disabled`; `serverUrl` is
#: Windsurf's spelling of `url`, `httpUrl` Gemini CLI's for a streamable HTTP one; `shared` is breakwater's
#: own: a stdio server every session of the shared local gateway uses, not one each).
USED_ENTRY_KEYS = frozenset(
    {
        "type",
        "transport",
        "command",
        "args",
        "env",
        "envFile",
        "cwd",
        "url",
        "serverUrl",
        "httpUrl",
        "transportType",
        "disabledTools",
        "includeTools",
        "excludeTools",
        "headers",
        "headersHelper",
        "disabled",
        "enabled",
        "shared",
    }
)

_SIGN_IN = "sign-in: breakwater auth login {name}"

#: Kept as written for OAuth sign-in: Claude Code's `oauth` object, Cursor's `auth` (a pre-registered client).
SIGN_IN_KEYS = frozenset({"oauth", "auth"})

#: Keys that mean nothing to breakwater, and what the note says about each.
IGNORED_ENTRY_KEYS: dict[str, str] = {
    "alwaysAllow": "tools Cline and Roo run without asking; breakwater never asks, your agent does",
    "autoApprove": "tools Cline and Windsurf run without asking; breakwater never asks, your agent does",
    "watchPaths": "files whose change makes Roo restart the server; breakwater does not watch them",
    "trust": "Gemini CLI runs this server's tools without asking; breakwater never asks, your agent does",
    "timeout": (
        "the client's request timeout (Cline and Roo: seconds; Gemini CLI and OpenCode: milliseconds); set timeout_s under"
        " [servers.NAME.call] in breakwater.toml"
    ),
    "authProviderType": (
        "Gemini CLI's way to get a token (Google credentials); breakwater signs in by OAuth: breakwater auth login NAME"
    ),
    "targetAudience": "Gemini CLI's Google service-account sign-in; not used",
    "targetServiceAccount": "Gemini CLI's Google service-account sign-in; not used",
    "description": "a label for people; not used",
    "icon": "a label for people; not used",
    "dev": "VS Code's watch-and-debug settings for a server under development; not used",
    "sandboxEnabled": "VS Code runs this server in its sandbox; breakwater does not, the server runs unsandboxed",
    "sandbox": "VS Code's sandbox rules; breakwater does not sandbox, the server runs unsandboxed",
    "gallery": "where VS Code installed the server from; not used",
    "version": "the version VS Code installed; not used",
}

#: Entry types breakwater cannot connect to, skipped with a note saying why.
SKIPPED_TYPES: dict[str, str] = {
    "ws": "a WebSocket server; breakwater speaks stdio, streamable HTTP and SSE",
    "sse-ide": "Claude Code's own link to an IDE extension; only Claude Code can use it",
    "ws-ide": "Claude Code's own link to an IDE extension; only Claude Code can use it",
    "sdk": "a server inside a Claude Agent SDK program; only that program can reach it",
    "claudeai-proxy": "a claude.ai connector reached through claude.ai; only Claude Code can use it",
}

#: Keys that make an entry one breakwater cannot connect to, skipped with a note saying why.
SKIPPED_KEYS: dict[str, str] = {"tcp": "a WebSocket server (Gemini CLI's tcp); breakwater speaks stdio, streamable HTTP and SSE"}

#: Keys of an `oauth` object only Gemini CLI writes: endpoints breakwater discovers, and what Gemini CLI's own
#: redirect needs. Ignored with a note.
GEMINI_OAUTH_KEYS = frozenset({"authorizationUrl", "tokenUrl", "registrationUrl", "redirectUri", "tokenParamName", "audiences"})

#: Keys only Gemini CLI writes in an entry: a file holding one is read as Gemini CLI reads its settings.
_GEMINI_ONLY_KEYS = frozenset({"httpUrl", "includeTools", "excludeTools", "trust", "authProviderType", "tcp"})

_TOP_LEVEL_QUIET = frozenset({"mcpServers", "servers", "context_servers", "$schema"})


#: The keys an entry names its transport under: `type`, `transport`, Cline's older `transportType`.
TRANSPORT_KEYS = ("type", "transport", "transportType")
#: What `type` (or `transport`) the clients write for a streamable HTTP server.
HTTP_KINDS = frozenset({"http", "streamable-http", "streamable_http", "streamableHttp"})


#: The keys of Gemini CLI's top-level `mcp` object (VS Code's user settings hold its servers in an `mcp` object too).
_GEMINI_MCP_KEYS = frozenset({"allowed", "excluded", "serverCommand"})

#: The keys an entry's address can be written under: `url`, Windsurf's `serverUrl`, Gemini CLI's `httpUrl`.
URL_KEYS = ("url", "serverUrl", "httpUrl")


def entry_url_key(entry: Mapping[str, Any], path: str, where: str) -> str:
    """The key the entry's address is under (`url` when none is); two at once is an error (which would win is a guess)."""
    written = [k for k in URL_KEYS if k in entry]
    if len(written) > 1:
        raise ConfigError(
            f"both {written[0]} and {written[1]} are set",
            path=path,
            key=f"{where}.{written[1]}",
            fix='keep one ("serverUrl" is Windsurf\'s "url", "httpUrl" Gemini CLI\'s for a streamable HTTP server)',
        )
    return written[0] if written else "url"


def entry_transport(entry: Mapping[str, Any], path: str, where: str) -> Literal["stdio", "http", "sse"]:
    """The transport an entry names (`type`, `transport`, or Cline's older `transportType`), else the one its keys imply."""
    written = [k for k in TRANSPORT_KEYS if k in entry]
    key = written[0] if written else "type"
    for other in written:
        if not isinstance(entry[other], str):
            raise ConfigError(
                f"expected a string, got {json_kind(entry[other])}",
                path=path,
                key=f"{where}.{other}",
                fix='write "stdio", "http" or "sse"',
            )
    if len({_kind_of(entry[k]) for k in written}) > 1:  # which one wins would be a guess
        raise ConfigError(
            f"{written[0]} and {written[1]} name different transports", path=path, key=f"{where}.{written[1]}", fix="keep one"
        )
    kind = entry.get(key)
    url_key = entry_url_key(entry, path, where)
    if kind is None:
        kind = "http" if url_key in entry and "command" not in entry else "stdio"
    elif url_key == "httpUrl" and kind not in HTTP_KINDS:
        raise ConfigError(
            f"httpUrl is a streamable HTTP server's address, and {key} says {kind!r}",
            path=path,
            key=f"{where}.{key}",
            fix='remove it, or write the address as "url"',
        )
    if kind in HTTP_KINDS:
        return "http"
    if kind == "sse":
        return "sse"
    if kind == "stdio":
        return "stdio"
    close = [k for k in _KNOWN_KINDS if k.lower() == kind.lower()] or difflib.get_close_matches(kind, _KNOWN_KINDS, n=1)
    fix = f"did you mean {close[0]!r}?" if close else 'use "stdio", "http" or "sse"'
    raise ConfigError(f"unknown transport {kind!r}", path=path, key=f"{where}.{key}", fix=fix)


#: Every transport name an entry may hold, for the "did you mean" of a misspelt one (OpenCode's, read in `_shapes.py`, too).
_KNOWN_KINDS = sorted({"stdio", "sse", *HTTP_KINDS, "local", "remote"})


def _kind_of(kind: str) -> str:
    return "http" if kind in HTTP_KINDS else kind


def entry_notes(name: str, entry: dict[str, object]) -> list[str]:
    """The notes `config check` prints for one entry's keys that are kept for sign-in or ignored."""
    notes = []
    for key in entry:
        if key in SIGN_IN_KEYS and entry[key] is not None:  # (`"oauth": null` keeps nothing)
            notes.append(f"{key} kept; {_SIGN_IN.format(name=name)}")
        elif key in IGNORED_ENTRY_KEYS:
            notes.append(f"{key} ignored: {IGNORED_ENTRY_KEYS[key]}")
    oauth = entry.get("oauth")
    if isinstance(oauth, dict) and (gemini := sorted(GEMINI_OAUTH_KEYS & oauth.keys())):
        notes.append(
            f"oauth.{', oauth.'.join(gemini)} ignored: breakwater discovers the sign-in endpoints from the server, and its"
            " redirect is http://localhost:PORT/callback (oauth.callbackPort)"
        )
    if numbers := _numbers(entry):
        # Never the value: it may be a secret (a PIN).
        notes.append(
            f"{', '.join(numbers)}{NUMBERS_NOTE}; Claude Code takes only strings there (quote it for a file it reads too)"
        )
    command = entry.get("command")
    if isinstance(command, str) and (words := command_words(command, (), None, None)) != [command]:
        # Only the program: the words after it are arguments, which may hold a secret.
        notes.append(
            f"command holds its arguments: started as {words[0]!r} with the rest as its first arguments, split as a"
            " shell splits them (Claude Code does not start it: for a file every client reads alike, write"
            f' "command": "{words[0]}" and put each word after it in "args")'
        )
    return notes


#: What `config check` says of an entry's numbers where strings go, after their keys.
NUMBERS_NOTE = ": a number where a string goes, passed as the file writes it"


def _numbers(entry: Mapping[str, Any]) -> list[str]:
    """The keys of an entry's values that are numbers where a string goes (`env.PORT`, `args[1]`)."""
    found = []
    for key in ("env", "headers"):
        if isinstance(table := entry.get(key), dict):
            found += [f"{key}.{name}" for name, v in table.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    if isinstance(args := entry.get("args"), list):
        found += [f"args[{i}]" for i, v in enumerate(args) if isinstance(v, int | float) and not isinstance(v, bool)]
    return found


_BARE_REFERENCE = re.compile(r"\$[A-Za-z_]\w*")


def bare_reference_notes(entry: Mapping[str, Any]) -> list[str]:
    """Notes for values that are a whole `$NAME`: Gemini CLI's form of a variable, passed as written elsewhere."""
    args = entry.get("args")
    found = [("args", str(i), v) for i, v in enumerate(args) if isinstance(v, str)] if isinstance(args, list) else []
    for key in ("env", "headers"):
        if isinstance(table := entry.get(key), dict):
            found += [(key, name, v) for name, v in table.items() if isinstance(v, str)]
    return [
        f"{key}.{name} is {value!r}, passed as written: only Gemini CLI's own files read $NAME as a variable;"
        f" write ${{{value[1:]}}} for its value"
        for key, name, value in found
        if _BARE_REFERENCE.fullmatch(value)
    ]


def skipped_entry(entry: Any, *, opencode: bool = False) -> str | None:
    """Why an entry is one breakwater cannot connect to (a WebSocket server, an IDE link), or None.

    In an OpenCode file (`opencode`), also an entry that is only `{"enabled": false}`: OpenCode's schema takes it
    as a switch for a server another of its config files defines (refused, it refused a valid OpenCode config).
    """
    if not isinstance(entry, dict):
        return None
    kind = entry.get("type")
    if isinstance(kind, str) and kind in SKIPPED_TYPES:
        return f"{kind!r} is {SKIPPED_TYPES[kind]}"
    if entry.get("source") == "extension" or (set(entry) <= {"settings", "enabled"} and "settings" in entry):
        return "it is a server a Zed extension provides; only Zed can start it"
    if _starts_breakwater(entry):
        return "it starts breakwater serve, which would serve itself (this is the file your agent reads, not the servers')"
    if opencode and entry and set(entry) <= {"enabled"} and isinstance(entry["enabled"], bool):
        return "only OpenCode's switch for a server another of its config files defines; nothing to start here"
    return next((f"it is {why}" for key, why in SKIPPED_KEYS.items() if key in entry), None)


def _starts_breakwater(entry: Mapping[str, Any]) -> bool:
    # `breakwater serve`, `python -m breakwater serve`, `uvx breakwater serve`, by any path, in any client's shape:
    # `command` and `args`, OpenCode's `command` list, Zed's `command` object.
    command: Any = entry.get("command")
    args: Any = entry.get("args")
    if isinstance(command, dict):
        command, args = command.get("path"), command.get("args")
    args = args if isinstance(args, list) else []
    words = command if isinstance(command, list) else [*command.split(), *args] if isinstance(command, str) else []
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return False
    names = [os.path.basename(w.replace("\\", "/")).removesuffix(".exe").lower() for w in words[:3]]
    return any(name == "breakwater" and words[i + 1 : i + 2] == ["serve"] for i, name in enumerate(names))


def command_words(command: str, args: Sequence[str], path: str | None, cwd: str | None) -> list[str]:
    """The program and arguments to start for an entry's `command` and `args` (`path`: the PATH it is found on).

    Cursor's install links write a whole command line into `command` ("npx -y pkg --flag", no `args`)
    and Cursor starts it; `claude mcp add NAME "npx -y pkg"` writes the same, which Claude Code then
    fails to start. So when no program has the whole string as its name, and the string's first word
    (split as a POSIX shell splits words, quotes included; nothing is expanded) names one, its words are
    the program and its first arguments. A path with spaces that is a program is started as it is.
    """
    if not any(c.isspace() for c in command) or _runnable(command, path, cwd):
        return [command, *args]
    try:
        words = shlex.split(command, posix=not _platform.IS_WINDOWS)
    except ValueError:  # an unclosed quote: not a command line after all
        return [command, *args]
    if _platform.IS_WINDOWS:  # non-POSIX splitting keeps the quotes (and the backslashes of paths)
        words = [w[1:-1] if len(w) > 1 and w[0] == w[-1] == '"' else w for w in words]
    if not words or not _runnable(words[0], path, cwd):
        return [command, *args]
    return [*words, *args]


def _runnable(program: str, path: str | None, cwd: str | None) -> bool:
    if os.sep in program or (os.altsep is not None and os.altsep in program):
        return shutil.which(os.path.join(cwd or os.getcwd(), program)) is not None  # an absolute one stays itself
    return shutil.which(program, path=path) is not None


def gemini_file(path: Path, data: Mapping[str, Any], top: str) -> bool:
    """Whether the file is Gemini CLI's settings (or written for it): it is read as Gemini CLI reads them.

    Gemini CLI's own files (`~/.gemini/settings.json`, a project's `.gemini/settings.json`, the system's
    `gemini-cli/settings.json`), or a file with a key only Gemini CLI writes (its top-level `mcp` object, an
    entry's `httpUrl`, `includeTools`, `excludeTools`, `trust`, `authProviderType` or `tcp`).
    """
    mcp = data.get("mcp")
    if path.parent.name in (".gemini", "gemini-cli") or (isinstance(mcp, dict) and _GEMINI_MCP_KEYS & mcp.keys()):
        return True
    entries = data.get(top)
    return isinstance(entries, dict) and any(isinstance(e, dict) and _GEMINI_ONLY_KEYS & e.keys() for e in entries.values())


def gemini_server_lists(data: Mapping[str, Any], path: str) -> tuple[frozenset[str] | None, frozenset[str]]:
    """Gemini CLI's `mcp.allowed` (None when unset: every server) and `mcp.excluded` (servers it does not start)."""
    mcp = data.get("mcp")
    if not isinstance(mcp, dict):
        return None, frozenset()
    lists: list[frozenset[str] | None] = []
    for key in ("allowed", "excluded"):
        value = mcp.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise ConfigError("expected a list of server names", path=path, key=f"mcp.{key}", fix=f'write "{key}": ["name"]')
        lists.append(None if value is None else frozenset(value))
    return lists[0], lists[1] or frozenset()


#: Why a server in a project's `disabledMcpServers` is off: what Claude Code's `/mcp` panel does.
SWITCHED_OFF = "switched off in Claude Code's /mcp"


def project_key(folder: str) -> str:
    """How a project's entry of `~/.claude.json` is named in what breakwater says: `projects["/path"]`."""
    return f"projects[{json.dumps(folder, ensure_ascii=False)}]"


def claude_project(data: Mapping[str, Any], cwd: Path) -> tuple[str, Any] | None:
    """Claude Code's `~/.claude.json`: the project a session in `cwd` belongs to (its key and its entry), or None.

    Claude Code keeps a project's state under `projects[DIR]` (the git root or the folder it was started in); a session
    in `cwd` gets the nearest DIR at or above it.
    """
    projects = data.get("projects")
    if not isinstance(projects, dict):
        return None
    # A key that is no folder ("" read as "/" matched every folder) is nobody's project.
    by_path = {key.replace("\\", "/").rstrip("/") or "/": key for key in projects if isinstance(key, str) and key.strip()}
    for folder in (cwd, *cwd.parents):
        key = by_path.get(folder.as_posix().rstrip("/") or "/")
        if key is not None:
            return key, projects[key]
    return None


def claude_local_servers(data: Mapping[str, Any], cwd: Path) -> tuple[str, Any] | None:
    """Claude Code's `~/.claude.json`: the project whose servers a session in `cwd` gets, and its `mcpServers`.

    `claude mcp add` keeps a server in `projects[DIR].mcpServers` (its local scope, the default) and Claude Code
    starts it for sessions in DIR (the git root or the folder it was started in): the nearest DIR at or above `cwd`.
    """
    found = claude_project(data, cwd)
    if found is None:
        return None
    key, project = found
    # A project that is no object is this folder's, and an error, not "no project here".
    if not isinstance(project, dict):
        return key, project
    servers = project.get("mcpServers")
    return key, {} if servers is None else servers  # `"mcpServers": null`: none, as a null env is


def claude_disabled_servers(data: Mapping[str, Any], cwd: Path, path: str) -> dict[str, str]:
    """Claude Code's `~/.claude.json`: the servers the project of `cwd` switched off, each with why (`disabled_by`).

    Claude Code's `/mcp` panel keeps them in `projects[DIR].disabledMcpServers` and does not start them in that project,
    whichever scope they come from (the user's `mcpServers`, or the project's own). (`disabledMcpjsonServers` there
    names `.mcp.json` servers only: `_claude.py`.)
    """
    found = claude_project(data, cwd)
    if found is None or not isinstance(found[1], dict) or (names := found[1].get("disabledMcpServers")) is None:
        return {}
    key = project_key(found[0])
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(
            "expected a list of server names",
            path=path,
            key=f"projects.{found[0]}.disabledMcpServers",
            fix='write "disabledMcpServers": ["name"] (or switch the servers back on in Claude Code\'s /mcp)',
        )
    return {name: f"{key}.disabledMcpServers lists it ({SWITCHED_OFF})" for name in names}


def misspelt_tables(keys: Iterable[str]) -> list[tuple[str, str]]:
    """Each of `keys` that is a misspelt table of servers (`mcpServer`, `MCPServers`, `mcp_servers`, `server`), with the
    table it is closest to (`mcpServers`, VS Code's `servers`, Zed's `context_servers`)."""
    tables = {t.lower(): t for t in _TOP_LEVEL_QUIET if t != "$schema"}
    found = []
    for key in keys:
        if key not in _TOP_LEVEL_QUIET and (close := difflib.get_close_matches(key.lower(), list(tables), n=1, cutoff=0.8)):
            found.append((key, tables[close[0]]))
    return found


def top_level_notes(data: dict[str, object], top: str) -> list[str]:
    """Notes for a file's keys beside the servers (VS Code's `inputs`, Gemini CLI's settings, the rest of `~/.claude.json`)."""
    notes = []
    for other in ("mcpServers", "servers"):
        if other in data and other != top:
            notes.append(f"{other} ignored: this file's servers are read from {top!r}")
    mcp = data.get("mcp")
    inputs = mcp.get("inputs") if top in ("mcp", "mcp.servers") and isinstance(mcp, dict) else data.get("inputs")
    if inputs:
        notes.append(
            "inputs ignored: VS Code prompts for these when it starts a server, and breakwater runs in the "
            "background with no one to ask; a ${input:...} reference is an error, write ${VAR} and set VAR instead"
        )
    if isinstance(mcp, dict) and top == "mcp.servers" and (unknown := sorted(set(mcp) - {"servers", "inputs"})):
        # VS Code's user settings: a key beside its servers (`inptus`) was dropped without a word.
        for key in unknown:
            close = difflib.get_close_matches(key, ["servers", "inputs"], n=1)
            notes.append(f"mcp.{key} ignored: " + (f"did you mean mcp.{close[0]}?" if close else "VS Code's own setting"))
    if isinstance(mcp, dict) and top not in ("mcp", "mcp.servers"):  # Gemini CLI's `mcp` (OpenCode's holds servers)
        if "serverCommand" in mcp:
            notes.append("mcp.serverCommand ignored: Gemini CLI's one command for every server; breakwater starts each entry's")
        if unknown := sorted(set(mcp) - _GEMINI_MCP_KEYS):
            notes.append(f"mcp.{', mcp.'.join(unknown)} ignored: Gemini CLI's own settings")
    # Read elsewhere: VS Code's inputs above, Gemini CLI's (or VS Code's) `mcp`, Claude Code's `projects` (local scope).
    read = {"inputs", "mcp", "projects"}
    rest = sorted(k for k in data if k not in _TOP_LEVEL_QUIET and k not in read)
    # A misspelt table of servers (`mcpservers`, `mcp_servers`) read as the client's settings: its servers never ran.
    for key, meant in misspelt_tables(rest):
        rest.remove(key)
        notes.append(f"{key} ignored: did you mean {meant}? its servers are not read")
    if rest:
        notes.append(f"{', '.join(rest)} ignored: the client's own settings, not servers")
    return notes


def read_env_file(path: Path, *, config_path: str, key: str) -> dict[str, str]:
    """A dotenv file as VS Code and Cursor read `envFile`: `NAME=value` lines, `#` comments, optional quotes and `export`."""
    try:
        # "utf-8-sig": a BOM (Notepad's) is no part of the first variable's name.
        text = read_user_file(path).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the envFile {str(path)!r}: {getattr(exc, 'strerror', None) or exc}",
            path=config_path,
            key=key,
            fix="save it as UTF-8" if isinstance(exc, UnicodeDecodeError) else "create it, fix the path, or remove envFile",
        ) from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name = name.strip()
        if not sep or not name or not name.isprintable() or any(c.isspace() for c in name):
            # Never quote the line: it may hold a secret.
            raise ConfigError(
                f"line {number} of the envFile {str(path)!r} is not NAME=value",
                path=config_path,
                key=key,
                fix="write one NAME=value per line (# starts a comment)",
            )
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if raw.strip().split("=", 1)[1].strip()[0] == '"':
                value = value.replace("\\n", "\n")
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[name] = value
    return out
