"""The keys Claude Code, Cursor, Claude Desktop, VS Code (and Cline, Roo, Windsurf) write in server entries.

Each key is used, kept for sign-in, or ignored with a note that `config check` prints; only a key
no client writes (a typo) is an error. Entries of a kind breakwater cannot connect to (WebSocket,
Claude Code's IDE and SDK links) are skipped with a note, so the rest of the file still works.
Also `envFile` (VS Code, Cursor): the dotenv file whose variables a stdio server gets. May import
the core leaves only.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from breakwater import _platform
from breakwater.errors import ConfigError

__all__ = [
    "HTTP_KINDS",
    "IGNORED_ENTRY_KEYS",
    "SIGN_IN_KEYS",
    "SKIPPED_TYPES",
    "TRANSPORT_KEYS",
    "USED_ENTRY_KEYS",
    "command_words",
    "entry_notes",
    "entry_transport",
    "entry_url_key",
    "read_env_file",
    "top_level_notes",
]

#: Keys breakwater reads (`enabled` is breakwater.toml's spelling of JSON's `disabled`; `serverUrl` is
#: Windsurf's spelling of `url`; `shared` is breakwater's own: a stdio server every session of the
#: shared local gateway uses, not one each).
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
        "transportType",
        "disabledTools",
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
    "timeout": "Cline's and Roo's request timeout; set timeout_s under [servers.NAME.call] in breakwater.toml",
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

_TOP_LEVEL_QUIET = frozenset({"mcpServers", "servers", "$schema"})


#: The keys an entry names its transport under: `type`, `transport`, Cline's older `transportType`.
TRANSPORT_KEYS = ("type", "transport", "transportType")
#: What `type` (or `transport`) the clients write for a streamable HTTP server.
HTTP_KINDS = frozenset({"http", "streamable-http", "streamable_http", "streamableHttp"})


def entry_url_key(entry: Mapping[str, Any], path: str, where: str) -> str:
    """`url`, or Windsurf's `serverUrl` for it; both at once is an error (which one would win is a guess)."""
    if "serverUrl" not in entry:
        return "url"
    if "url" in entry:
        raise ConfigError(
            "both url and serverUrl are set",
            path=path,
            key=f"{where}.serverUrl",
            fix='keep one ("serverUrl" is Windsurf\'s "url")',
        )
    return "serverUrl"


def entry_transport(entry: Mapping[str, Any], path: str, where: str) -> Literal["stdio", "http", "sse"]:
    """The transport an entry names (`type`, `transport`, or Cline's older `transportType`), else the one its keys imply."""
    key = next((k for k in TRANSPORT_KEYS if k in entry), "type")
    kind = entry.get(key)
    if kind is None:
        kind = "http" if entry_url_key(entry, path, where) in entry and "command" not in entry else "stdio"
    if kind in HTTP_KINDS:
        return "http"
    if kind == "sse":
        return "sse"
    if kind == "stdio":
        return "stdio"
    raise ConfigError(f"unknown transport {kind!r}", path=path, key=f"{where}.{key}", fix='use "stdio", "http" or "sse"')


def entry_notes(name: str, entry: dict[str, object]) -> list[str]:
    """The notes `config check` prints for one entry's keys that are kept for sign-in or ignored."""
    notes = []
    for key in entry:
        if key in SIGN_IN_KEYS:
            notes.append(f"{key} kept; {_SIGN_IN.format(name=name)}")
        elif key in IGNORED_ENTRY_KEYS:
            notes.append(f"{key} ignored: {IGNORED_ENTRY_KEYS[key]}")
    command = entry.get("command")
    if isinstance(command, str) and (words := command_words(command, (), None, None)) != [command]:
        # Only the program: the words after it are arguments, which may hold a secret.
        notes.append(
            f"command holds its arguments: started as {words[0]!r} with the rest as its first arguments, split as a"
            " shell splits them (Claude Code does not start it: for a file every client reads alike, write"
            f' "command": "{words[0]}" and put each word after it in "args")'
        )
    return notes


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


def top_level_notes(data: dict[str, object], top: str) -> list[str]:
    """Notes for a file's keys beside the servers (VS Code's `inputs`, the rest of `~/.claude.json`)."""
    notes = []
    other = "servers" if top == "mcpServers" else "mcpServers"
    if other in data:
        notes.append(f"{other} ignored: this file's servers are read from {top!r}")
    if data.get("inputs"):
        notes.append(
            "inputs ignored: VS Code prompts for these when it starts a server, and breakwater runs in the "
            "background with no one to ask; a ${input:...} reference is an error, write ${VAR} and set VAR instead"
        )
    rest = sorted(k for k in data if k not in _TOP_LEVEL_QUIET and k != "inputs")
    if rest:
        notes.append(f"{', '.join(rest)} ignored: the client's own settings, not servers")
    return notes


def read_env_file(path: Path, *, config_path: str, key: str) -> dict[str, str]:
    """A dotenv file as VS Code and Cursor read `envFile`: `NAME=value` lines, `#` comments, optional quotes and `export`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the envFile {str(path)!r}: {getattr(exc, 'strerror', None) or exc}",
            path=config_path,
            key=key,
            fix="create it, fix the path, or remove envFile",
        ) from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
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
