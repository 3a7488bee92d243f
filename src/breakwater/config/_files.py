"""Reading configuration files: `mcpServers` JSON and `breakwater.toml` into a `Config`.

`load_config` picks the reader by the file's suffix; `find_config` finds the file when none was
named. Every error is a `ConfigError` that names the file, the key and the fix. May import the
core leaves and the rest of `config` only.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any

from breakwater._wire import json_depth, json_kind
from breakwater.config import _jsonc
from breakwater.config._checks import (
    alike_servers,
    check_header,
    check_server_name,
    check_template_for_servers,
    check_text,
    check_url,
)
from breakwater.config._dialect import (
    IGNORED_ENTRY_KEYS,
    SIGN_IN_KEYS,
    SKIPPED_TYPES,
    TRANSPORT_KEYS,
    USED_ENTRY_KEYS,
    entry_notes,
    entry_transport,
    entry_url_key,
    read_env_file,
    top_level_notes,
)
from breakwater.config._expand import Expander, has_reference
from breakwater.config._knobs import build_policy, env_layer
from breakwater.config._model import Config, ServerSpec, ToolSettings, Transport
from breakwater.config._oauth import parse_oauth
from breakwater.config._policies import GLOBAL_SECTIONS, POLICY_SECTIONS, CallPolicy, RetryPolicy
from breakwater.config._redact import register_secrets
from breakwater.errors import ConfigError

__all__ = ["DEFAULT_CONFIG_NAMES", "find_config", "load_config", "load_config_for_server", "load_config_lenient"]

DEFAULT_CONFIG_NAMES = ("breakwater.toml", ".mcp.json")

# Keys a `[servers.NAME.tools.TOOL]` table accepts and the policy each one belongs to.
# Both bound a whole server (its bulkhead, its connection's reader), so no tool can set its own.
_TOOL_CALL_KEYS = frozenset(f.name for f in dc_fields(CallPolicy)) - {"max_in_flight", "max_result_bytes"}
_TOOL_RETRY_KEYS = frozenset({"max_attempts"})

# Every key a client writes in an entry is known: used, kept for sign-in, or ignored with a note.
_ENTRY_KEYS = USED_ENTRY_KEYS | SIGN_IN_KEYS | frozenset(IGNORED_ENTRY_KEYS)
_TOML_TOP_KEYS = frozenset({"servers_file", "servers", *POLICY_SECTIONS, *GLOBAL_SECTIONS})
_SERVER_POLICY_KEYS = frozenset({*POLICY_SECTIONS, "tools"})


def _fail(message: str, path: str, key: str, fix: str) -> ConfigError:
    return ConfigError(message, path=path, key=key, fix=fix)


def _required_text(entry: Mapping[str, Any], path: str, where: str, key: str, missing: str, example: str) -> str:
    """`entry[key]`, a non-blank string; else an error that says which of absent, not a string or blank it is."""
    if key not in entry:
        raise _fail(missing, path, f"{where}.{key}", f'add "{key}": "{example}"')
    value = entry[key]
    if not isinstance(value, str):
        raise _fail(f"expected a string, got {json_kind(value)}", path, f"{where}.{key}", f'write "{key}": "{example}"')
    if not value.strip():
        raise _fail(f"{key} is empty", path, f"{where}.{key}", f'write "{key}": "{example}"')
    return value


def _unknown_key(path: str, where: str, key: str, known: frozenset[str]) -> ConfigError:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(known))}"
    return _fail("unknown key", path, f"{where}.{key}" if where else key, fix)


def _str_map(value: Any, path: str, key: str, expand: Expander, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _fail("expected a table of strings", path, key, f'write {key} as {{"NAME": "value"}}')
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise _fail("expected a string value", path, f"{key}.{k}", "quote the value")
        # Values only: Claude Code expands no names.
        out[k] = expand(str(v), where=where, key=f"{key}.{k}", secret=True)
        if key.endswith(".headers"):
            check_header(k, out[k], path=path, key=f"{key}.{k}")
        else:
            if not k or "=" in k:
                raise _fail(f"invalid environment variable name {k!r}", path, f"{key}.{k}", "use letters, digits and _")
            check_text(k, path=path, key=f"{key}.{k}", what="name", strict=True)
            check_text(out[k], path=path, key=f"{key}.{k}", secret=True)
    return out


# ---- one server entry (mcpServers JSON or [servers.NAME]) ---------------------------------------


def _parse_entry(
    entry: Any,
    *,
    path: str,
    where: str,
    expand: Expander,
    extra_keys: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate one server entry; returns (connection fields, the rest for the caller)."""
    if not isinstance(entry, dict):
        raise _fail("expected an object describing the server", path, where, 'e.g. {"command": "npx", "args": [...]}')
    rest: dict[str, Any] = {}
    for key, value in entry.items():
        if key in extra_keys:
            rest[key] = value
        elif key not in _ENTRY_KEYS:
            raise _unknown_key(path, where, key, USED_ENTRY_KEYS | extra_keys)
    transport = entry_transport(entry, path, where)
    fields: dict[str, Any] = {"transport": transport}
    if transport == "stdio":
        fields.update(_stdio_fields(entry, path, where, expand))
    else:
        fields.update(_http_fields(entry, transport, path, where, expand))
    fields["enabled"] = _entry_enabled(entry, path, where)
    if "shared" in entry:
        fields["shared"] = _flag(entry["shared"], path, f"{where}.shared", '"shared": true')
    fields["notes"] = tuple(entry_notes(where.rsplit(".", 1)[-1], entry))
    fields["transport_guessed"] = transport == "http" and not any(k in entry for k in TRANSPORT_KEYS)
    if "disabledTools" in entry:
        fields["disabled_tools"] = frozenset(_names(entry["disabledTools"], path, f"{where}.disabledTools"))
    fields["expanded_secrets"] = expand.take_secrets(where)
    return fields, rest


def _stdio_fields(entry: Mapping[str, Any], path: str, where: str, expand: Expander) -> dict[str, Any]:
    command = _required_text(entry, path, where, "command", "a stdio server needs a command", "the-program")
    command = expand(command, where=where, key=f"{where}.command")
    check_text(command, path=path, key=f"{where}.command", what="command", strict=True)
    # `~/bin/server` as a shell would run it; a bare name stays a name, looked up on PATH at spawn.
    # Arguments are passed exactly as written: no shell runs in between (a command line written into
    # `command` alone is split into words at spawn, as Cursor does: `_dialect.command_words`).
    fields: dict[str, Any] = {"command": os.path.expanduser(command) if command.startswith("~") else command}
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in args):
        raise _fail("expected a list of strings", path, f"{where}.args", 'write "args": ["--flag", "value"]')
    fields["args"] = tuple(expand(str(a), where=where, key=f"{where}.args[{i}]") for i, a in enumerate(args))
    for i, arg in enumerate(fields["args"]):
        check_text(arg, path=path, key=f"{where}.args[{i}]", what="argument")
    env = _env_file(entry, path, where, expand)
    if "env" in entry:
        # The entry's own env wins over its envFile, as in VS Code.
        env.update(_str_map(entry["env"], path, f"{where}.env", expand, where))
    if env:
        fields["env"] = env
    cwd = entry.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str):
            raise _fail("expected a directory path", path, f"{where}.cwd", 'write "cwd": "/some/dir"')
        cwd = expand(cwd, where=where, key=f"{where}.cwd")
        check_text(cwd, path=path, key=f"{where}.cwd", what="directory", strict=True)
        base = Path(path).parent if path else Path.cwd()
        resolved = (base / os.path.expanduser(cwd)).resolve()
        if not resolved.is_dir() and not (has_reference(cwd) and not expand.strict):
            raise _fail(f"the directory {str(resolved)!r} does not exist", path, f"{where}.cwd", "create it or fix the path")
        fields["cwd"] = str(resolved)
    for key in ("url", "serverUrl", "headersHelper"):
        if key in entry:
            raise _fail(f"a stdio server has no {key}", path, f"{where}.{key}", f'remove "{key}" or set "type": "http"')
    return fields


def _env_file(entry: Mapping[str, Any], path: str, where: str, expand: Expander) -> dict[str, str]:
    raw = entry.get("envFile")
    if raw is None:
        return {}
    key = f"{where}.envFile"
    if not isinstance(raw, str) or not raw.strip():
        raise _fail("expected a file path", path, key, 'write "envFile": "${workspaceFolder}/.env"')
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
    url = _required_text(entry, path, where, url_key, "an HTTP server needs an http(s) url", example)
    url = expand(url, where=where, key=f"{where}.{url_key}")
    lenient = has_reference(url) and not expand.strict
    if not lenient:
        if not url.startswith(("http://", "https://")):
            # Only the scheme is repeated: the rest of a URL may carry a token.
            scheme = url.partition("://")[0] if "://" in url else ""
            said = (
                f"the url's scheme is {scheme!r}, not http or https"
                if scheme.isalpha()
                else "the url does not start with http:// or https://"
            )
            raise _fail(said, path, f"{where}.{url_key}", f'write "{url_key}": "{example}" (or https://)')
        check_url(url, path=path, key=f"{where}.{url_key}")
    fields: dict[str, Any] = {"url": url}
    if "headers" in entry:
        fields["headers"] = _str_map(entry["headers"], path, f"{where}.headers", expand, where)
    helper = entry.get("headersHelper")
    if helper is not None:
        if not isinstance(helper, str) or not helper.strip():
            raise _fail("expected a command", path, f"{where}.headersHelper", 'write "headersHelper": "/path/to/get-headers.sh"')
        check_text(helper, path=path, key=f"{where}.headersHelper", what="command", strict=True)
        fields["headers_helper"] = helper
    if "oauth" in entry:
        fields["oauth"] = parse_oauth(entry["oauth"], path=path, where=where)
    for key in ("command", "envFile"):
        if key in entry:
            raise _fail(f"an {transport} server has no {key}", path, f"{where}.{key}", f'remove "{key}" or the url')
    return fields


def _names(value: Any, path: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail("expected a list of tool names", path, key, 'write "disabledTools": ["tool_name"]')
    return value


def _entry_enabled(entry: Mapping[str, Any], path: str, where: str) -> bool:
    # JSON clients write "disabled": true; breakwater.toml writes enabled = false. The last one set wins.
    enabled = True
    if "disabled" in entry:
        enabled = not _flag(entry["disabled"], path, f"{where}.disabled", '"disabled": true')
    if "enabled" in entry:
        enabled = _flag(entry["enabled"], path, f"{where}.enabled", "enabled = false")
    return enabled


def _flag(value: Any, path: str, key: str, fix: str) -> bool:
    if not isinstance(value, bool):
        raise _fail("expected true or false", path, key, fix)
    return value


# ---- mcpServers JSON -----------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    """The file as text; unreadable, non-UTF-8 or NUL-bearing files are a ConfigError that says where."""
    spath = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", path=spath, fix="check the path") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(raw) > 1 and (raw[0] == 0) != (raw[1] == 0)):
        # A BOM, or ASCII text with a NUL beside each character: what PowerShell's `>` and Notepad write.
        raise ConfigError("the file is UTF-16, not UTF-8", path=spath, fix="save the file as UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8: byte 0x{raw[exc.start]:02x} at line {line} (offset {exc.start})",
            path=spath,
            fix="save the file as UTF-8",
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"a NUL character at line {line}", path=spath, fix="remove it (is this a text file?)")
    return text.removeprefix("\ufeff")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


#: Deeper than any real config, far below where a recursive parser runs out of stack.
MAX_NESTING = 64


def _read_json(path: Path) -> dict[str, Any]:
    text = _jsonc.strip(_read_text(path))  # comments and trailing commas, as VS Code's mcp.json has them
    fix = "fix the JSON syntax (a missing quote, comma or bracket is the usual cause)"
    if json_depth(text) > MAX_NESTING:
        raise ConfigError(f"nested deeper than {MAX_NESTING} levels", path=str(path), fix="flatten the file")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", path=str(path), fix=fix) from None
    except _Duplicate as exc:
        raise ConfigError(
            f"the key {exc.key!r} appears twice (the first would silently be lost)",
            path=str(path),
            key=exc.key,
            fix="remove or rename one of them",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"invalid JSON: {exc}", path=str(path), fix=fix) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", path=str(path), fix='write {"mcpServers": {...}}')
    return data


@dataclass
class _Entries:
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


_STRICT = _Entries()


def _servers_from_json(
    path: Path, defaults: Mapping[str, Any], expand: Expander, entries_ok: _Entries = _STRICT
) -> tuple[list[ServerSpec], list[str]]:
    """The file's servers, and the notes about it (keys beside the servers, entries skipped)."""
    data = _read_json(path)
    top = "mcpServers" if "mcpServers" in data else "servers" if "servers" in data else None
    if top is None:
        raise ConfigError('no "mcpServers" object', path=str(path), key="mcpServers", fix='write {"mcpServers": {"name": {...}}}')
    # The rest of the file is the client's own settings (VS Code's "inputs", all of ~/.claude.json).
    notes = top_level_notes(data, top)
    entries = data[top]
    if not isinstance(entries, dict):
        raise ConfigError("expected an object of servers", path=str(path), key=top, fix=f'write "{top}": {{"name": {{...}}}}')
    specs = []
    for name, entry in entries.items():
        with entries_ok.tolerated(name):
            check_server_name(name, path=str(path), key=f"{top}.{name}")
            kind = entry.get("type") if isinstance(entry, dict) else None
            if isinstance(kind, str) and kind in SKIPPED_TYPES:
                notes.append(f"{top}.{name} skipped: {kind!r} is {SKIPPED_TYPES[kind]}")
                continue
            fields, _ = _parse_entry(entry, path=str(path), where=f"{top}.{name}", expand=expand)
            specs.append(ServerSpec(name=name, source=str(path), **defaults, **fields))
    return specs, notes


# ---- breakwater.toml -----------------------------------------------------------------------------


def _policy_table(value: Any, path: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail("expected a table", path, where, f"write [{where}] with key = value lines")
    return value


def _layered(
    section: str,
    defaults: Mapping[str, Any],
    spath: str,
    environ: Mapping[str, str],
    *more: tuple[Mapping[str, Any], str | None, str],
) -> Any:
    cls = POLICY_SECTIONS[section]
    return build_policy(cls, [(defaults, spath, section), env_layer(cls, environ), *more])


def _global_policies(data: Mapping[str, Any], spath: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """`[gateway]`, `[journal]`, `[state]`, `[telemetry]`: the file's table, then the environment."""
    policies: dict[str, Any] = {}
    for section, cls in GLOBAL_SECTIONS.items():
        table = _policy_table(data.get(section, {}), spath or "", section)
        policies[section] = build_policy(cls, [(table, spath, section), env_layer(cls, environ)])
    return policies


def _tool_settings(
    table: Mapping[str, Any], *, spath: str, where: str, call: CallPolicy, retry: RetryPolicy
) -> dict[str, ToolSettings]:
    tools: dict[str, ToolSettings] = {}
    for tool, raw in table.items():
        twhere = f"{where}.tools.{tool}"
        values = _policy_table(raw, spath, twhere)
        for key in values:
            if key not in _TOOL_CALL_KEYS | _TOOL_RETRY_KEYS:
                raise _unknown_key(spath, twhere, key, _TOOL_CALL_KEYS | _TOOL_RETRY_KEYS)
        call_values = {k: v for k, v in values.items() if k in _TOOL_CALL_KEYS}
        retry_values = {k: v for k, v in values.items() if k in _TOOL_RETRY_KEYS}
        # Layer the tool's keys over its server's resolved policy: unset keys inherit.
        tool_call = build_policy(CallPolicy, [(_as_values(call), None, ""), (call_values, spath, twhere)])
        tool_retry = build_policy(RetryPolicy, [(_as_values(retry), None, ""), (retry_values, spath, twhere)])
        tools[tool] = ToolSettings(call=tool_call, retry=tool_retry, explicit=frozenset(values))
    return tools


def _as_values(policy: Any) -> dict[str, Any]:
    return {f.name: getattr(policy, f.name) for f in dc_fields(policy)}


def _read_toml(path: Path) -> dict[str, Any]:
    spath = str(path)
    text = _read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", path=spath, fix="fix the TOML syntax") from None
    except RecursionError:
        raise ConfigError("nested too deeply", path=spath, fix="flatten the file") from None
    except ValueError as exc:
        raise ConfigError(f"invalid TOML: {exc}", path=spath, fix="fix the TOML syntax") from None
    for key in data:
        if key not in _TOML_TOP_KEYS:
            raise _unknown_key(spath, "", key, _TOML_TOP_KEYS)
    return data


def _servers_file_specs(
    path: Path, servers_file: Any, defaults: Mapping[str, Any], expand: Expander, entries_ok: _Entries
) -> tuple[dict[str, ServerSpec], list[str]]:
    """The servers of the JSON file `servers_file` names (relative to the TOML file), by name, and its notes."""
    spath = str(path)
    if servers_file is None:
        return {}, []
    if not isinstance(servers_file, str):
        raise _fail("expected a path", spath, "servers_file", 'servers_file = ".mcp.json"')
    json_path = (path.parent / os.path.expanduser(servers_file)).resolve()
    if not json_path.exists():
        raise _fail(f"{json_path} does not exist", spath, "servers_file", "point servers_file at an mcpServers JSON file")
    file_expand = Expander(expand.environ, str(json_path), strict=expand.strict, missing=expand.missing)
    specs, notes = _servers_from_json(json_path, defaults, file_expand, entries_ok)
    return {spec.name: spec for spec in specs}, [f"{servers_file}: {note}" for note in notes]


def _server_base(
    name: str, table: Mapping[str, Any], spath: str, known: Mapping[str, ServerSpec], expand: Expander
) -> ServerSpec:
    """`[servers.NAME]`'s connection: defined inline (command or url), or the servers_file's, maybe disabled."""
    where = f"servers.{name}"
    if any(k in table for k in ("command", "url")):
        fields, _ = _parse_entry(table, path=spath, where=where, expand=expand, extra_keys=_SERVER_POLICY_KEYS)
        return ServerSpec(name=name, source=spath, **fields)
    if name not in known:
        raise _fail(
            "this server is neither defined here nor in servers_file",
            spath,
            where,
            'add command = "..." (stdio) or url = "..." (http), or fix the name',
        )
    base_spec = known[name]
    for key in table:
        if key not in _SERVER_POLICY_KEYS | {"enabled", "shared"}:
            raise _unknown_key(spath, where, key, _SERVER_POLICY_KEYS | {"enabled", "shared", "command", "url"})
    if "enabled" in table:
        base_spec = replace(base_spec, enabled=_flag(table["enabled"], spath, f"{where}.enabled", "enabled = false"))
    if "shared" in table:
        base_spec = replace(base_spec, shared=_flag(table["shared"], spath, f"{where}.shared", "shared = true"))
    return base_spec


def _toml_server(
    name: str,
    raw: Any,
    *,
    spath: str,
    top: Mapping[str, Mapping[str, Any]],
    environ: Mapping[str, str],
    known: Mapping[str, ServerSpec],
    expand: Expander,
) -> ServerSpec:
    """One `[servers.NAME]` with its policies layered over the top-level tables, and its tools."""
    where = f"servers.{name}"
    check_server_name(name, path=spath, key=where)
    table = _policy_table(raw, spath, where)
    base_spec = _server_base(name, table, spath, known, expand)
    own = {section: _policy_table(table.get(section, {}), spath, f"{where}.{section}") for section in POLICY_SECTIONS}
    policies = {
        section: _layered(section, top[section], spath, environ, (own[section], spath, f"{where}.{section}"))
        for section in POLICY_SECTIONS
    }
    tools = _tool_settings(
        _policy_table(table.get("tools", {}), spath, f"{where}.tools"),
        spath=spath,
        where=where,
        call=policies["call"],
        retry=policies["retry"],
    )
    return replace(base_spec, **policies, call_explicit=frozenset(own["call"]), tools=tools)


def _load_toml(path: Path, environ: Mapping[str, str], expand: Expander, entries_ok: _Entries) -> Config:
    spath = str(path)
    data = _read_toml(path)
    top = {section: _policy_table(data.get(section, {}), spath, section) for section in POLICY_SECTIONS}
    defaults = {section: _layered(section, top[section], spath, environ) for section in POLICY_SECTIONS}
    specs, notes = _servers_file_specs(path, data.get("servers_file"), defaults, expand, entries_ok)
    for name, table in _policy_table(data.get("servers", {}), spath, "servers").items():
        with entries_ok.tolerated(name):
            specs[name] = _toml_server(name, table, spath=spath, top=top, environ=environ, known=specs, expand=expand)
    # Servers from servers_file too: the top-level [call] is configuration for every one of them.
    configured = frozenset(top["call"])
    specs = {n: replace(s, call_configured=s.call_explicit | configured) for n, s in specs.items()}
    return Config(
        servers=tuple(specs.values()), **defaults, **_global_policies(data, spath, environ), path=spath, notes=tuple(notes)
    )


# ---- entry points --------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Config:
    """Load a breakwater.toml or an mcpServers JSON file (chosen by the file's suffix and content).

    `${VAR}` references in server entries are expanded from `environ` (default: the process's);
    an unset one without a default is a `ConfigError`.
    """
    return _load(Path(path), os.environ if environ is None else environ, strict=True)[0]


def load_config_lenient(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> tuple[Config, list[tuple[str, str]]]:
    """`load_config` for `config import`: an unset variable is kept as `${VAR}` and returned as (key, variable)."""
    return _load(Path(path), os.environ if environ is None else environ, strict=False)


def load_config_for_server(
    path: str | os.PathLike[str], name: str, *, environ: Mapping[str, str] | None = None
) -> tuple[Config, list[ConfigError]]:
    """`load_config` for a command about one server (`auth login NAME`): another server's broken entry is left out
    of the config and returned as its error (file, key, fix), to be shown as a warning, instead of refusing the
    whole file. The file itself, its global sections and the named server's entry must be valid as for `serve`.
    """
    entries_ok = _Entries(only=name)
    config = _load(Path(path), os.environ if environ is None else environ, strict=True, entries_ok=entries_ok)[0]
    return config, entries_ok.broken


def _load(
    p: Path, env: Mapping[str, str], *, strict: bool, entries_ok: _Entries = _STRICT
) -> tuple[Config, list[tuple[str, str]]]:
    expand = Expander(env, str(p), strict=strict)
    if p.suffix == ".toml":
        config = _load_toml(p, env, expand, entries_ok)
    else:
        defaults = {section: build_policy(cls, [env_layer(cls, env)]) for section, cls in POLICY_SECTIONS.items()}
        specs, notes = _servers_from_json(p, defaults, expand, entries_ok)
        config = Config(servers=tuple(specs), **defaults, **_global_policies({}, None, env), path=str(p), notes=tuple(notes))
    template = config.gateway.tool_name_template
    try:
        check_template_for_servers(template, len(config.servers))
    except ConfigError as exc:
        raise ConfigError(exc.detail, path=str(p), key=exc.key, fix=exc.fix) from None
    if alike := alike_servers(template, (spec.name for spec in config.servers)):
        config = replace(config, notes=(*config.notes, *alike))
    # Any server's secret is scrubbed from every output of this process, not only that server's.
    register_secrets(config.secrets)
    return config, expand.missing


def find_config(cwd: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use when none was named: breakwater.toml, then .mcp.json, in `cwd`."""
    base = Path.cwd() if cwd is None else Path(cwd)
    for name in DEFAULT_CONFIG_NAMES:
        if (base / name).is_file():
            return base / name
    raise ConfigError(
        f"no {' or '.join(DEFAULT_CONFIG_NAMES)} in {base}",
        fix="pass --config PATH, or create .mcp.json with an mcpServers object",
    )
