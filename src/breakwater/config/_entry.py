"""One server entry, in the dialect of any client that writes one, into the fields of a `ServerSpec`.

The keys each client writes are listed in `_dialect.py`; this module validates an entry's values and
says, for a bad one, the file, the key as written and the fix. The files around the entries (JSON,
breakwater.toml, Codex's config.toml) are read in `_files.py` and `_codex.py`. May import the core
leaves and the rest of `config` only.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from breakwater._wire import json_kind
from breakwater.config._checks import check_header, check_text, check_url
from breakwater.config._dialect import (
    IGNORED_ENTRY_KEYS,
    SIGN_IN_KEYS,
    TRANSPORT_KEYS,
    URL_KEYS,
    USED_ENTRY_KEYS,
    bare_reference_notes,
    entry_notes,
    entry_transport,
    entry_url_key,
    read_env_file,
)
from breakwater.config._expand import Expander, has_reference
from breakwater.config._jsonc import written
from breakwater.config._model import ToolFilter, Transport
from breakwater.config._oauth import parse_oauth
from breakwater.errors import ConfigError

__all__ = [
    "NULLS_NOTE",
    "STRICT",
    "UNSET_NOTE",
    "Entries",
    "fail",
    "flag",
    "parse_entry",
    "required_null",
    "required_text",
    "str_map",
    "tool_filter",
    "unknown_key",
    "without_nulls",
]

# Every key a client writes in an entry is known: used, kept for sign-in, or ignored with a note.
_ENTRY_KEYS = USED_ENTRY_KEYS | SIGN_IN_KEYS | frozenset(IGNORED_ENTRY_KEYS)


def fail(message: str, path: str, key: str, fix: str) -> ConfigError:
    return ConfigError(message, path=path, key=key, fix=fix)


def required_text(
    entry: Mapping[str, Any], path: str, where: str, key: str, missing: str, example: str, written: str | None = None
) -> str:
    """`entry[key]`, a non-blank string; else an error that says which of absent, not a string or blank it is
    (naming the key as `written`, when the user wrote it under another name)."""
    at = f"{where}.{written or key}"
    if key not in entry:
        raise fail(missing, path, at, f'add "{key}": "{example}"')
    value = entry[key]
    if not isinstance(value, str):
        raise fail(f"expected a string, got {json_kind(value)}", path, at, f'write "{key}": "{example}"')
    if not value.strip():
        raise fail(f"{key} is empty", path, at, f'write "{key}": "{example}"')
    return value


def unknown_key(path: str, where: str, key: str, known: frozenset[str]) -> ConfigError:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(known))}"
    return fail("unknown key", path, f"{where}.{key}" if where else key, fix)


def str_map(value: Any, path: str, key: str, expand: Expander, where: str) -> dict[str, str]:
    if value is None:  # `"env": null`: none, as Zed (and every client that reads JSON so) takes it
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise fail("expected a table of strings", path, key, f'write {key} as {{"NAME": "value"}}')
    out: dict[str, str] = {}
    names: dict[str, str] = {}
    for k, v in value.items():
        if v is None:  # VS Code's `"env": {"A": null}` is taken out before (`env_unset`): no header is unset so
            raise fail("expected a string value, got null", path, f"{key}.{k}", f'remove "{k}" or write its value in quotes')
        if not isinstance(v, str) and not _number_here(v, path):
            raise fail(f"expected a string value, got {json_kind(v)}", path, f"{key}.{k}", "quote the value")
        # Values only: Claude Code expands no names.
        out[k] = expand(_text(v, path, f"{key}.{k}"), where=where, key=f"{key}.{k}", secret=True)
        if key.endswith("headers"):  # `headers`, or Codex's `http_headers`
            check_header(k, out[k], path=path, key=f"{key}.{k}")
            # Header names ignore case: both were sent, and which one a server reads is its own choice.
            if (first := names.setdefault(k.lower(), k)) != k:
                raise fail(f"the header {first!r} is written twice (names ignore case)", path, f"{key}.{k}", "keep one of them")
        else:
            if not k or "=" in k:
                raise fail(f"invalid environment variable name {k!r}", path, f"{key}.{k}", "use letters, digits and _")
            check_text(k, path=path, key=f"{key}.{k}", what="name", strict=True)
            check_text(out[k], path=path, key=f"{key}.{k}", secret=True)
    return out


def _env_unset(value: Any, path: str, key: str) -> tuple[str, ...]:
    """The names an entry's `env` writes as null, in a JSON file: variables that server does not inherit, as VS Code
    reads `"env": {"A": null}` (its `Record<string, string | number | null>`). A TOML file has no null."""
    if not isinstance(value, dict) or path.lower().endswith(".toml"):
        return ()
    names = tuple(k for k, v in value.items() if v is None and isinstance(k, str))
    for name in names:
        if not name or "=" in name:
            raise fail(f"invalid environment variable name {name!r}", path, f"{key}.{name}", "use letters, digits and _")
        check_text(name, path=path, key=f"{key}.{name}", what="name", strict=True)
    return names


#: What `config check` says of an entry's `env` names written as null, after their keys.
UNSET_NOTE = (
    ": null, not inherited by this server (as VS Code reads it; Claude Code takes only strings there and skips the"
    " server, OpenCode and Zed refuse it: leave the variable out of the environment the client starts in, for a file"
    " every client reads alike)"
)


def _number_here(value: Any, path: str) -> bool:
    """Whether `value` is a number that may stand where a string goes: in a JSON file, whose numbers are passed as the
    file writes them (VS Code's `env` takes numbers; `config check` notes each, as Claude Code takes only strings). A
    TOML file's is refused as true/false is: Codex takes only strings there, and TOML keeps no text of an integer
    (`0x1F`, `1_000`) to pass as written."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not path.lower().endswith(".toml")


def _text(value: str | float, path: str, key: str) -> str:
    """A string, or a number written where a string goes, as the file wrote it (`1.50` is "1.50", `1e3` is "1e3":
    `_jsonc.number`); `1e400` (JSON's infinity) is no number to pass."""
    if isinstance(value, float) and not math.isfinite(value):
        raise fail("a number too large to write out", path, key, "quote the value as a string")
    return value if isinstance(value, str) else written(value)


# ---- one server entry (mcpServers JSON or [servers.NAME]) ---------------------------------------


def without_nulls(entry: Any) -> tuple[Any, tuple[str, ...]]:
    """A JSON entry without the keys it wrote as `null`, and those keys (Zed's `command.args` too).

    A null reads as the key not written, in every client's shape (and in `oauth`): VS Code reads a null `args`, `env`
    or `headers` as none and a null `envFile` or `cwd` as unset, Gemini CLI every null key as unset, Zed its optional
    keys. (Claude Code skips such an entry as invalid, OpenCode's schema refuses it: `config check` notes each null,
    `NULLS_NOTE`.) A key that cannot be left out (`command`, `url`) is an error naming the null: `required_null`.
    """
    if not isinstance(entry, dict):
        return entry, ()
    nulls = [key for key, value in entry.items() if value is None]
    out = {key: value for key, value in entry.items() if value is not None}
    for inner in ("command", "oauth"):  # Zed's older {"path", "args", "env"}; the sign-in settings
        if isinstance(table := out.get(inner), dict):
            nulls += [f"{inner}.{key}" for key, value in table.items() if value is None]
            out[inner] = {key: value for key, value in table.items() if value is not None}
    return out, tuple(nulls)


#: What `config check` says of an entry's keys written as null, after their keys.
NULLS_NOTE = (
    ": null, read as not written (as VS Code and Gemini CLI read it; Claude Code skips a server whose entry holds a"
    " null, and OpenCode refuses it: remove the key for a file every client reads alike)"
)


def required_null(entry: Mapping[str, Any], nulls: tuple[str, ...], path: str, where: str, written: str = "command") -> None:
    """The error for an entry whose program (or address) is null, so that none is left: null cannot mean "none" there."""
    if not isinstance(entry, Mapping) or "command" in entry or any(k in entry for k in URL_KEYS):
        return
    if written in nulls:
        program = '["npx", "-y", "pkg"]' if entry.get("type") == "local" else '"npx"'  # OpenCode's is a list
        fix = f'write the program to start: "{written.rsplit(".", 1)[-1]}": {program} (or remove the server)'
        raise fail("expected a string, got null: a stdio server needs the program to start", path, f"{where}.{written}", fix)
    if url := next((k for k in URL_KEYS if k in nulls), None):
        fix = f'write the address: "{url}": "https://example.com/mcp" (or remove the server)'
        raise fail("expected a string, got null: an HTTP server needs its address", path, f"{where}.{url}", fix)


def parse_entry(
    entry: Any,
    *,
    path: str,
    where: str,
    expand: Expander,
    extra_keys: frozenset[str] = frozenset(),
    names: Mapping[str, str] | None = None,
    nulls: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate one server entry; returns (connection fields, the rest for the caller).

    `names` are the keys as the user wrote them where the entry was reshaped (`_shapes.py`), for errors; `nulls` the
    keys `without_nulls` took out of it, for the notes and the error of a null program or address.
    """
    if not isinstance(entry, dict):
        raise fail("expected an object describing the server", path, where, 'e.g. {"command": "npx", "args": [...]}')
    rest: dict[str, Any] = {}
    for key, value in entry.items():
        if key in extra_keys:
            rest[key] = value
        elif key not in _ENTRY_KEYS:
            raise unknown_key(path, where, key, USED_ENTRY_KEYS | extra_keys)
    required_null(entry, nulls, path, where, (names or {}).get("command", "command"))
    transport = entry_transport(entry, path, where)
    fields: dict[str, Any] = {"transport": transport}
    if transport == "stdio":
        fields.update(_stdio_fields(entry, path, where, expand, names or {}))
    else:
        fields.update(_http_fields(entry, transport, path, where, expand))
    fields["enabled"] = _entry_enabled(entry, path, where)
    if not fields["enabled"]:
        fields["disabled_by"] = f"{where}.enabled is false" if "enabled" in entry else f"{where}.disabled is true"
    if "shared" in entry:
        fields["shared"] = flag(entry["shared"], path, f"{where}.shared", '"shared": true')
    notes = entry_notes(where.rsplit(".", 1)[-1], entry) + ([f"{', '.join(nulls)}{NULLS_NOTE}"] if nulls else [])
    if unset := fields.get("env_unset"):
        written = (names or {}).get("env", "env")
        notes.append(f"{', '.join(f'{written}.{name}' for name in unset)}{UNSET_NOTE}")
    # `$NAME` is a variable in Gemini CLI's files (`bare`) and nothing in Codex's (`literal`, which has env_vars).
    fields["notes"] = tuple(notes if expand.bare or expand.literal else [*notes, *bare_reference_notes(entry)])
    fields["transport_guessed"] = transport == "http" and not any(k in entry for k in (*TRANSPORT_KEYS, "httpUrl"))
    fields["tool_filter"] = tool_filter(entry, path, where, deny=_DENY_KEYS, allow=_ALLOW_KEYS)
    fields["expanded_secrets"] = expand.take_secrets(where)
    return fields, rest


#: The keys a tool deny-list and allow-list are written under in JSON files (Cline, Roo, Windsurf; Gemini CLI).
_DENY_KEYS = ("disabledTools", "excludeTools")
_ALLOW_KEYS = ("includeTools",)


def tool_filter(entry: Mapping[str, Any], path: str, where: str, *, deny: tuple[str, ...], allow: tuple[str, ...]) -> ToolFilter:
    """The entry's tool lists, under whichever of the `deny` and `allow` keys it wrote (one of each at most)."""
    lists: list[tuple[str, frozenset[str]] | None] = []
    for keys in (deny, allow):
        written = [k for k in keys if k in entry]
        if len(written) > 1:
            raise fail(f"both {written[0]} and {written[1]} are set", path, f"{where}.{written[1]}", "keep one list")
        lists.append((written[0], frozenset(_names(entry[written[0]], path, f"{where}.{written[0]}"))) if written else None)
    denied, allowed = lists
    return ToolFilter(
        without=denied[1] if denied else frozenset(),
        without_key=denied[0] if denied else deny[0],
        only=allowed[1] if allowed else None,
        only_key=allowed[0] if allowed else allow[0],
    )


def _stdio_fields(entry: Mapping[str, Any], path: str, where: str, expand: Expander, names: Mapping[str, str]) -> dict[str, Any]:
    written = names.get("command", "command")
    command = required_text(entry, path, where, "command", "a stdio server needs a command", "the-program", written)
    command = expand(command, where=where, key=f"{where}.{written}")
    if not command.strip():
        raise fail("the command is empty once its variables are expanded", path, f"{where}.{written}", "set the variable")
    check_text(command, path=path, key=f"{where}.{written}", what="command", strict=True, secret=True)
    # `~/bin/server` as a shell would run it; a bare name stays a name, looked up on PATH at spawn.
    # Arguments are passed exactly as written: no shell runs in between (a command line written into
    # `command` alone is split into words at spawn, as Cursor does: `_dialect.command_words`).
    fields: dict[str, Any] = {"command": os.path.expanduser(command) if command.startswith("~") else command}
    args, at = entry.get("args", []), f"{where}.{names.get('args', 'args')}"
    if isinstance(args, list) and None in args:
        raise fail("expected a string, got null where an argument goes", path, f"{at}[{args.index(None)}]", "remove it")
    if not isinstance(args, list) or not all(isinstance(a, str) or _number_here(a, path) for a in args):
        raise fail("expected a list of strings", path, at, 'write "args": ["--flag", "value"]')
    fields["args"] = tuple(expand(_text(a, path, f"{at}[{i}]"), where=where, key=f"{at}[{i}]") for i, a in enumerate(args))
    for i, arg in enumerate(fields["args"]):
        check_text(arg, path=path, key=f"{at}[{i}]", what="argument", secret=True)
    env = _env_file(entry, path, where, expand)
    if "env" in entry:
        at = f"{where}.{names.get('env', 'env')}"
        unset = _env_unset(entry["env"], path, at)
        given = {k: v for k, v in entry["env"].items() if v is not None} if unset else entry["env"]
        # The entry's own env wins over its envFile, as in VS Code: a null there unsets an envFile's value too.
        env.update(str_map(given, path, at, expand, where))
        for name in unset:
            env.pop(name, None)
        if unset:
            fields["env_unset"] = unset
    if env:
        fields["env"] = env
    cwd = entry.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str):
            raise fail("expected a directory path", path, f"{where}.cwd", 'write "cwd": "/some/dir"')
        cwd = expand(cwd, where=where, key=f"{where}.cwd")
        check_text(cwd, path=path, key=f"{where}.cwd", what="directory", strict=True)
        base = Path(path).parent if path else Path.cwd()
        resolved = (base / os.path.expanduser(cwd)).resolve()
        if not resolved.is_dir() and not (has_reference(cwd) and not expand.strict):
            exists = resolved.exists()
            missing = f"{str(resolved)!r} is not a directory" if exists else f"the directory {str(resolved)!r} does not exist"
            fix = "point it at a directory" if exists else "create it or fix the path"
            if not expand.disable_unset:
                raise fail(missing, path, f"{where}.cwd", fix)
            # While serving, that server's problem, as a variable not set is: one unmounted drive took every server down.
            expand.off(where, f"its cwd: {missing} ({fix})")
        fields["cwd"] = str(resolved)
    for key in (*URL_KEYS, "headersHelper"):
        if key in entry:
            raise fail(f"a stdio server has no {key}", path, f"{where}.{key}", f'remove "{key}" or set "type": "http"')
    return fields


def _env_file(entry: Mapping[str, Any], path: str, where: str, expand: Expander) -> dict[str, str]:
    raw = entry.get("envFile")
    if raw is None:
        return {}
    key = f"{where}.envFile"
    if not isinstance(raw, str) or not raw.strip():
        raise fail("expected a file path", path, key, 'write "envFile": "${workspaceFolder}/.env"')
    name = expand(raw, where=where, key=key)
    if has_reference(name) and not expand.strict:
        return {}
    file = Path(os.path.expanduser(name))
    if not file.is_absolute():
        file = (Path(path).parent if path else Path.cwd()) / file
    values = read_env_file(file, config_path=path, key=key)
    for k, v in values.items():
        check_text(v, path=path, key=f"{key}.{k}", secret=True)
    return values


def _http_fields(entry: Mapping[str, Any], transport: Transport, path: str, where: str, expand: Expander) -> dict[str, Any]:
    example = "http://127.0.0.1:8000/mcp"
    url_key = entry_url_key(entry, path, where)
    url = required_text(entry, path, where, url_key, "an HTTP server needs an http(s) url", example)
    url = expand(url, where=where, key=f"{where}.{url_key}")
    lenient = has_reference(url) and not expand.strict
    if not lenient:
        if not url[:8].lower().startswith(("http://", "https://")):  # a scheme is case-insensitive (RFC 3986)
            # Only the scheme is repeated: the rest of a URL may carry a token.
            scheme = url.partition("://")[0] if "://" in url else ""
            said = (
                f"the url's scheme is {scheme!r}, not http or https"
                if scheme.isalpha()
                else "the url does not start with http:// or https://"
            )
            raise fail(said, path, f"{where}.{url_key}", f'write "{url_key}": "{example}" (or https://)')
        check_url(url, path=path, key=f"{where}.{url_key}")
    fields: dict[str, Any] = {"url": url}
    if "headers" in entry:
        fields["headers"] = str_map(entry["headers"], path, f"{where}.headers", expand, where)
    helper = entry.get("headersHelper")
    if helper is not None:
        if not isinstance(helper, str) or not helper.strip():
            raise fail("expected a command", path, f"{where}.headersHelper", 'write "headersHelper": "/path/to/get-headers.sh"')
        check_text(helper, path=path, key=f"{where}.headersHelper", what="command", strict=True)
        fields["headers_helper"] = helper
    if "oauth" in entry and (oauth := parse_oauth(entry["oauth"], path=path, where=where, expand=expand)) is not None:
        fields["oauth"] = oauth
    for key in ("command", "envFile", "args", "env", "cwd"):
        # An empty `args` or `env` beside a url is what some generators write; anything in one would not be used.
        if key in entry and (entry[key] not in ([], {}, "") or key == "command"):
            raise fail(
                f"an {transport} server has no {key}: it is not started here",
                path,
                f"{where}.{key}",
                f'remove "{key}" or the url',
            )
    return fields


def _names(value: Any, path: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail("expected a list of tool names", path, key, f'write "{key.rsplit(".", 1)[-1]}": ["tool_name"]')
    # `gemini mcp add --include-tools a,b` writes ["a,b"]; no tool name holds a comma (the spec's A-Z a-z 0-9 _ - .).
    return [name.strip() for v in value for name in v.split(",") if name.strip()]


def _entry_enabled(entry: Mapping[str, Any], path: str, where: str) -> bool:
    # JSON clients write "disabled": true; breakwater.toml writes enabled = false. Both, contradicting, is an error.
    enabled = True
    if "disabled" in entry:
        enabled = not flag(entry["disabled"], path, f"{where}.disabled", '"disabled": true')
    if "enabled" in entry:
        if flag(entry["enabled"], path, f"{where}.enabled", "enabled = false") != enabled and "disabled" in entry:
            raise fail("enabled and disabled contradict each other", path, f"{where}.enabled", "keep one of them")
        enabled = entry["enabled"]
    return enabled


def flag(value: Any, path: str, key: str, fix: str) -> bool:
    if not isinstance(value, bool):
        raise fail("expected true or false", path, key, fix)
    return value


@dataclass
class Entries:
    """Which server entries may be broken without refusing the file: all but `only`'s, when set (their errors kept)."""

    only: str | None = None
    broken: list[ConfigError] = field(default_factory=list)

    @contextmanager
    def tolerated(self, name: str) -> Iterator[None]:
        """Around the reading of entry `name`: its ConfigError is kept in `broken` when another server is the one."""
        try:
            yield
        except ConfigError as exc:
            if self.only is None or name == self.only:
                raise
            self.broken.append(exc)


STRICT = Entries()
