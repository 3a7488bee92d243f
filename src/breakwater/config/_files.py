"""Reading configuration files: `mcpServers` JSON and `breakwater.toml` into a `Config`.

`load_config` picks the reader by the file's suffix; `find_config` finds the file when none was
named. Every error is a `ConfigError` that names the file, the key and the fix. May import the
core leaves and the rest of `config` only.
"""

from __future__ import annotations

import difflib
import errno
import json
import os
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import fields as dc_fields
from dataclasses import replace
from pathlib import Path
from typing import Any

from breakwater._paths import read_user_file
from breakwater._wire import json_depth, json_kind
from breakwater.config import _jsonc
from breakwater.config._checks import TOOL_NAME_OK, alike_servers, check_server_name, check_template_for_servers
from breakwater.config._claude import claude_unstarted_servers
from breakwater.config._claude_policy import apply_claude_policy, managed_settings_paths, read_claude_policy
from breakwater.config._codex import CODEX_TOP, servers_from_codex
from breakwater.config._dialect import (
    claude_disabled_servers,
    claude_local_servers,
    gemini_file,
    gemini_server_lists,
    misspelt_tables,
    skipped_entry,
    top_level_notes,
)
from breakwater.config._entry import STRICT, Entries, fail, flag, parse_entry, required_null, unknown_key, without_nulls
from breakwater.config._expand import OFF_FOR_VALUES, Expander, unset_off
from breakwater.config._knobs import build_policy, env_layer
from breakwater.config._model import Config, ServerSpec, ToolSettings
from breakwater.config._policies import GLOBAL_SECTIONS, POLICY_SECTIONS, CallPolicy, RetryPolicy
from breakwater.config._redact import register_secrets
from breakwater.config._shapes import common_entry, opencode_file, server_table
from breakwater.errors import ConfigError

__all__ = ["DEFAULT_CONFIG_NAMES", "find_config", "load_config", "load_config_for_server", "load_config_lenient"]

DEFAULT_CONFIG_NAMES = ("breakwater.toml", ".mcp.json")

# Keys a `[servers.NAME.tools.TOOL]` table accepts and the policy each one belongs to.
# Both bound a whole server (its bulkhead, its connection's reader), so no tool can set its own.
_TOOL_CALL_KEYS = frozenset(f.name for f in dc_fields(CallPolicy)) - {"max_in_flight", "max_result_bytes"}
_TOOL_RETRY_KEYS = frozenset({"max_attempts", "retry_timeouts"})  # as the README says: per server or per tool

_TOML_TOP_KEYS = frozenset({"servers_file", "servers", *POLICY_SECTIONS, *GLOBAL_SECTIONS})
_SERVER_POLICY_KEYS = frozenset({*POLICY_SECTIONS, "tools"})


# ---- mcpServers JSON -----------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    """The file as text; unreadable, non-UTF-8 or NUL-bearing files are a ConfigError that says where."""
    spath = str(path)
    try:
        raw = read_user_file(path)
    except OSError as exc:
        fix = {
            errno.EACCES: "let this user read it (or run as its owner)",
            errno.EFBIG: "name the file that holds the servers (is this a log or a data file?)",
        }.get(exc.errno or 0, "check the path")
        said = f"cannot read the file: {exc.strerror or exc}"
        if not path.is_absolute():
            # Read from the folder breakwater runs in, which an agent that starts it chooses and the user may not know.
            said = f"cannot read the file {Path.cwd() / path}: {exc.strerror or exc}"
            if fix == "check the path":
                fix = f"check the path (a relative one is read from the folder breakwater runs in, {Path.cwd()})"
                fix += ": give the absolute path"
        raise ConfigError(said, path=spath, fix=fix) from None
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


class _Twice(dict[str, Any]):
    """A JSON object that wrote `key` twice. Marked, not raised, while parsing: the parser builds the innermost
    objects first, so only a walk of the whole document (`_unusable`) can say where the object is."""

    key = ""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and type(out) is dict:
            out = _Twice(out)
            out.key = key
        out.setdefault(key, value)
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unusable(data: Any, path: str) -> None:
    """Refuse a key written twice (the first would silently be lost) and a lone surrogate (`"\\ud83d"`: JSON escapes
    it, but no text holds it, so no process, header or file name could be given it), naming the key where it is."""
    todo: list[tuple[Any, str]] = [(data, "")]
    while todo:
        value, where = todo.pop()
        if isinstance(value, dict):
            if isinstance(value, _Twice):
                key = f"{where}.{value.key}" if where else value.key
                raise ConfigError(
                    f"the key {value.key!r} appears twice (the first would silently be lost)",
                    path=path,
                    key=key,
                    fix="remove or rename one of them",
                )
            for k, v in value.items():
                inner = f"{where}.{k}" if where else k
                if _SURROGATE.search(k):
                    raise _surrogate(path, inner)
                todo.append((v, inner))
        elif isinstance(value, list):
            todo.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, str) and _SURROGATE.search(value):
            raise _surrogate(path, where)


def _surrogate(path: str, key: str) -> ConfigError:
    return ConfigError(
        "a lone surrogate escape (\\ud800-\\udfff without its pair), which is no character",
        path=path,
        key=key,
        fix="write the character itself, or both halves of its surrogate pair",
    )


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
        data = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_int=_jsonc.number,
            parse_float=_jsonc.number,
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", path=str(path), fix=fix) from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"invalid JSON: {exc}", path=str(path), fix=fix) from None
    _unusable(data, str(path))
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", path=str(path), fix='write {"mcpServers": {...}}')
    return data


def _servers_from_json(
    path: Path, defaults: Mapping[str, Any], expand: Expander, entries_ok: Entries = STRICT
) -> tuple[list[ServerSpec], list[str]]:
    """The file's servers, and the notes about it (keys beside the servers, entries skipped)."""
    data = _read_json(path)
    found, local = server_table(data, str(path)), claude_local_servers(data, Path.cwd())
    # Claude Code's ~/.claude.json with only other folders' servers: none for this folder, which the notes say.
    if found is None and local is None and not isinstance(data.get("projects"), dict):
        raise _no_servers(data, str(path))
    top, entries = found or ("mcpServers", {})
    # The rest of the file is the client's own settings (VS Code's "inputs", all of ~/.claude.json).
    notes = top_level_notes(data, top)
    if not isinstance(entries, dict):
        raise ConfigError("expected an object of servers", path=str(path), key=top, fix=f'write "{top}": {{"name": {{...}}}}')
    listed = {name: (f"{top}.{name}", entry) for name, entry in entries.items()}
    if local is not None:
        folder, servers = local
        where = f"projects.{folder}.mcpServers"
        if not isinstance(servers, dict):
            raise ConfigError("expected an object of servers", path=str(path), key=where, fix='write "mcpServers": {}')
        # Claude Code's local scope wins over its user scope for a name both hold.
        listed |= {name: (f"{where}.{name}", entry) for name, entry in servers.items()}
        notes.append(f"{where} read, the servers `claude mcp add` keeps for this folder: {', '.join(servers) or 'none'}")
    elif isinstance(data.get("projects"), dict):
        notes.append(
            f"projects: none is {Path.cwd()} or a folder above it, so no servers of `claude mcp add`'s local scope are read"
            " (run breakwater in the project's folder)"
        )
    if gemini_file(path, data, top):
        expand = replace(expand, bare=True)  # Gemini CLI reads $NAME as a variable in its own files
    elif opencode_file(path, top, entries):
        expand = replace(expand, opencode=True)  # and OpenCode {env:NAME} and {file:PATH}
    allowed, excluded = gemini_server_lists(data, str(path))
    # Switched off in Claude Code for this folder (`/mcp`), and a project's `.mcp.json` servers its user rejected or
    # has not approved.
    rejected = claude_unstarted_servers(path, listed) | claude_disabled_servers(data, Path.cwd(), str(path))
    specs = []
    for name, (where, entry) in listed.items():
        with entries_ok.tolerated(name):
            check_server_name(name, path=str(path), key=where)
            entry, nulls = without_nulls(entry)
            required_null(entry, nulls, str(path), where)
            if (why := skipped_entry(entry, opencode=expand.opencode)) is not None:
                notes.append(f"{where} skipped: {why}")
                continue
            entry, names, reshaped = common_entry(entry, str(path), where)
            fields, _ = parse_entry(entry, path=str(path), where=where, expand=expand, names=names, nulls=nulls)
            fields = unset_off(fields, expand, where)
            fields["notes"] = (*fields["notes"], *reshaped)
            said = rejected.get(name)
            if name in excluded or (allowed is not None and name not in allowed):
                said = "mcp.excluded lists it" if name in excluded else "mcp.allowed does not list it"
                said += " (Gemini CLI's settings)"
            if said is not None:
                fields |= {"enabled": False, "disabled_by": said, "notes": (*fields["notes"], f"not started: {said}")}
            specs.append(ServerSpec(name=name, source=str(path), **defaults, **fields))
    # A name no server has (a typo) matched nothing, and the server it meant was off (allowed) or on (excluded) unsaid.
    for key, given in (("mcp.allowed", allowed or frozenset()), ("mcp.excluded", excluded)):
        for named in sorted(given - set(listed)):
            close = difflib.get_close_matches(named, list(listed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            notes.append(f"{key} names {named!r}, which is no server in this file{hint}")
    return specs, notes


# ---- breakwater.toml -----------------------------------------------------------------------------


def _no_servers(data: Mapping[str, Any], path: str) -> ConfigError:
    """The error for a JSON file with no table of servers: OpenCode's `mcp` named as such, when the file has one."""
    mcp = data.get("mcp")
    opencode = 'write "mcp": {"name": {"type": "local", "command": ["the-program"]}} (OpenCode)'
    if "mcp" in data and not isinstance(mcp, dict):
        return ConfigError(f"expected an object of servers, got {json_kind(mcp)}", path=path, key="mcp", fix=opencode)
    if isinstance(mcp, dict):
        # An OpenCode entry without its `type` (every OpenCode server has one): named, not "no mcpServers".
        for name, entry in mcp.items():
            if isinstance(entry, dict) and ("command" in entry or "url" in entry):
                return ConfigError(
                    "an OpenCode server without its type",
                    path=path,
                    key=f"mcp.{name}.type",
                    fix='add "type": "local" (a command) or "type": "remote" (a url)',
                )
    misspelt = misspelt_tables(data)
    if isinstance(mcp, dict):  # VS Code's user settings (and OpenCode's second version) keep them in `mcp.servers`
        misspelt += [(f"mcp.{key}", "mcp.servers") for key, meant in misspelt_tables(mcp) if meant == "servers"]
    if misspelt:
        # `{"mcpServer": ...}` was told only `no "mcpServers" object`, as if the file held no servers at all.
        key, meant = misspelt[0]
        return ConfigError(
            f'no "mcpServers" object (the file has "{key}")',
            path=path,
            key=key,
            fix=f'did you mean "{meant}"? rename the key',
        )
    return ConfigError('no "mcpServers" object', path=path, key="mcpServers", fix='write {"mcpServers": {"name": {...}}}')


def _policy_table(value: Any, path: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail("expected a table", path, where, f"write [{where}] with key = value lines")
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
                raise unknown_key(spath, twhere, key, _TOOL_CALL_KEYS | _TOOL_RETRY_KEYS)
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
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(text, exc, spath) from None
    except RecursionError:
        raise ConfigError("nested too deeply", path=spath, fix="flatten the file") from None
    except ValueError as exc:
        raise ConfigError(f"invalid TOML: {exc}", path=spath, fix="fix the TOML syntax") from None


#: Where tomllib says its error is.
_TOML_AT = re.compile(r"\(at line (\d+), column \d+\)")


def toml_error(text: str, exc: tomllib.TOMLDecodeError, path: str) -> ConfigError:
    """A TOML syntax error, with the key of the line it is on and, for a Windows path in a double-quoted string (whose
    backslashes start escapes: "Invalid hex value"), the fix that works: single quotes."""
    at = _TOML_AT.search(str(exc))
    line = text.splitlines()[int(at.group(1)) - 1] if at and int(at.group(1)) <= len(text.splitlines()) else ""
    key, equals, value = line.partition("=")
    where = key.strip() if equals and key.strip() else None
    if equals and "\\" in value and '"' in value:
        fix = (
            "a backslash in a double-quoted TOML string starts an escape: put a Windows path in single quotes "
            "('C:\\Users\\me\\mcp.json') or double each backslash"
        )
    else:
        fix = "fix the TOML syntax"
    return ConfigError(f"invalid TOML: {exc}", path=path, key=where, fix=fix)


def _servers_from_file(
    path: Path, defaults: Mapping[str, Any], expand: Expander, entries_ok: Entries = STRICT
) -> tuple[list[ServerSpec], list[str]]:
    """The servers of a client's file (mcpServers JSON, or Codex's config.toml), and the notes about it."""
    if path.suffix == ".toml":
        data = _read_toml(path)
        if CODEX_TOP not in data:
            raise fail(
                "no [mcp_servers] table",
                str(path),
                CODEX_TOP,
                "point servers_file at Codex's config.toml or an mcpServers JSON file",
            )
        return servers_from_codex(path, data, defaults, expand, entries_ok)
    return _servers_from_json(path, defaults, expand, entries_ok)


def _servers_file_specs(
    path: Path, servers_file: Any, defaults: Mapping[str, Any], expand: Expander, entries_ok: Entries
) -> tuple[dict[str, ServerSpec], list[str]]:
    """The servers of the JSON file `servers_file` names (relative to the TOML file), by name, and its notes."""
    spath = str(path)
    if servers_file is None:
        return {}, []
    if not isinstance(servers_file, str):
        raise fail("expected a path", spath, "servers_file", 'servers_file = ".mcp.json"')
    json_path = (path.parent / os.path.expanduser(servers_file)).resolve()
    if not json_path.exists():
        raise fail(f"{json_path} does not exist", spath, "servers_file", "point servers_file at an mcpServers JSON file")
    file_expand = Expander(
        expand.environ, str(json_path), strict=expand.strict, missing=expand.missing, disable_unset=expand.disable_unset
    )
    try:
        specs, notes = _servers_from_file(json_path, defaults, file_expand, entries_ok)
    except ConfigError as exc:
        if exc.key is not None and "." in exc.key:
            raise  # an entry's error names the servers file and the key in it
        # The file as a whole: named as breakwater.toml's servers_file, which is what the user must fix.
        said = f"{json_path}{': ' + exc.key if exc.key else ''}: {exc.detail}"
        raise fail(said, spath, "servers_file", exc.fix or "point servers_file at a file of servers") from None
    return {spec.name: spec for spec in specs}, [f"{servers_file}: {note}" for note in notes]


def _server_base(
    name: str, table: Mapping[str, Any], spath: str, known: Mapping[str, ServerSpec], expand: Expander
) -> ServerSpec:
    """`[servers.NAME]`'s connection: defined inline (command or url), or the servers_file's, maybe disabled."""
    where = f"servers.{name}"
    if any(k in table for k in ("command", "url")):
        fields, _ = parse_entry(table, path=spath, where=where, expand=expand, extra_keys=_SERVER_POLICY_KEYS)
        return ServerSpec(name=name, source=spath, **unset_off(fields, expand, where))
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        raise fail(
            "this server is neither defined here nor in servers_file",
            spath,
            where,
            f"did you mean {close[0]!r}?" if close else 'add command = "..." (stdio) or url = "..." (http), or fix the name',
        )
    base_spec = known[name]
    for key in table:
        if key not in _SERVER_POLICY_KEYS | {"enabled", "shared"}:
            raise unknown_key(spath, where, key, _SERVER_POLICY_KEYS | {"enabled", "shared", "command", "url"})
    if "enabled" in table:
        enabled = flag(table["enabled"], spath, f"{where}.enabled", "enabled = false")
        # Not on: a server off for a variable that is not set would start with the reference as its text.
        if not (enabled and (base_spec.disabled_by or "").startswith(OFF_FOR_VALUES)):
            base_spec = replace(base_spec, enabled=enabled, disabled_by=None if enabled else f"{where}.enabled is false")
    if "shared" in table:
        base_spec = replace(base_spec, shared=flag(table["shared"], spath, f"{where}.shared", "shared = true"))
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
    policies = {}
    for section in POLICY_SECTIONS:
        # What the servers_file's entry set itself (Codex's tool_timeout_sec) sits between the top-level table and
        # this server's own: the entry's values are those that differ from the defaults it was read with.
        entry: dict[str, Any] = {}
        if base_spec is known.get(name):
            default = _as_values(_layered(section, top[section], spath, environ))
            entry = {k: v for k, v in _as_values(getattr(base_spec, section)).items() if v != default[k]}
        policies[section] = _layered(
            section, top[section], spath, environ, (entry, base_spec.source, where), (own[section], spath, f"{where}.{section}")
        )
    tools = _tool_settings(
        _policy_table(table.get("tools", {}), spath, f"{where}.tools"),
        spath=spath,
        where=where,
        call=policies["call"],
        retry=policies["retry"],
    )
    return replace(base_spec, **policies, call_explicit=base_spec.call_explicit | frozenset(own["call"]), tools=tools)


def _load_toml(path: Path, data: Mapping[str, Any], environ: Mapping[str, str], expand: Expander, entries_ok: Entries) -> Config:
    spath = str(path)
    for key in data:
        if key not in _TOML_TOP_KEYS:
            # `[mcp_server.x]` meant Codex's table as often as breakwater's `[servers.x]`: both are offered.
            raise unknown_key(spath, "", key, _TOML_TOP_KEYS | {CODEX_TOP})
    top = {section: _policy_table(data.get(section, {}), spath, section) for section in POLICY_SECTIONS}
    defaults = {section: _layered(section, top[section], spath, environ) for section in POLICY_SECTIONS}
    specs, notes = _servers_file_specs(path, data.get("servers_file"), defaults, expand, entries_ok)
    for name, table in _policy_table(data.get("servers", {}), spath, "servers").items():
        if name in specs and isinstance(table, dict) and any(k in table for k in ("command", "url")):
            notes.append(f"servers.{name} is defined here and in servers_file: this one is used")
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


def load_config_serving(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Config:
    """`load_config` for the commands that run servers (`serve`, `status`, `tools`, `call`): a server whose entry
    names a variable that is not set is off, with that reason (`disabled_by`), instead of the whole file refused.
    One server's missing token took every other server down, where the agents that read these files start the rest."""
    return _load(Path(path), os.environ if environ is None else environ, strict=True, disable_unset=True)[0]


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
    entries_ok = Entries(only=name)
    config = _load(Path(path), os.environ if environ is None else environ, strict=True, entries_ok=entries_ok)[0]
    return config, entries_ok.broken


def _load(
    p: Path, env: Mapping[str, str], *, strict: bool, entries_ok: Entries = STRICT, disable_unset: bool = False
) -> tuple[Config, list[tuple[str, str]]]:
    # An agent starts `breakwater serve --config ~/bw.toml` without a shell (Claude Code, Cursor, VS Code), so `~`
    # reaches it as written: it was "cannot read the file /project/~/bw.toml".
    p = p.expanduser()
    expand = Expander(env, str(p), strict=strict, disable_unset=disable_unset)
    data = _read_toml(p) if p.suffix == ".toml" else None
    if data is not None and CODEX_TOP in data and (own := sorted(_TOML_TOP_KEYS.intersection(data))):
        # Read as Codex's file, its breakwater settings (and servers_file's servers) would be dropped without a word.
        raise ConfigError(
            f"holds Codex's [{CODEX_TOP}] beside breakwater's own {', '.join(own)}: a file is read as one or the other",
            path=str(p),
            key=CODEX_TOP,
            fix=f"in breakwater's file write each server as [servers.NAME], or point servers_file at Codex's "
            f"config.toml; in Codex's file, leave out {', '.join(own)}",
        )
    if data is not None and CODEX_TOP not in data:
        config = _load_toml(p, data, env, expand, entries_ok)
    else:  # a client's file: mcpServers JSON, or Codex's config.toml
        defaults = {section: build_policy(cls, [env_layer(cls, env)]) for section, cls in POLICY_SECTIONS.items()}
        specs, notes = _servers_from_file(p, defaults, expand, entries_ok)
        config = Config(servers=tuple(specs), **defaults, **_global_policies({}, None, env), path=str(p), notes=tuple(notes))
    # Last, so no entry of any file (`enabled = true` included) starts a server the machine's policy blocks.
    config = apply_claude_policy(config, read_claude_policy(managed_settings_paths(env), Path.cwd()))
    template = config.gateway.tool_name_template
    try:
        check_template_for_servers(template, len(config.servers))
    except ConfigError as exc:
        raise ConfigError(exc.detail, path=str(p), key=exc.key, fix=exc.fix) from None
    if alike := alike_servers(template, (spec.name for spec in config.servers)):
        config = replace(config, notes=(*config.notes, *alike))
    if replaced := sorted(set(TOOL_NAME_OK.findall("".join(text for text, *_ in string.Formatter().parse(template))))):
        said = f"gateway.tool_name_template: {' '.join(repr(c) for c in replaced)} in it become '_' in each tool's name"
        config = replace(config, notes=(*config.notes, f"{said} (the model APIs take A-Z a-z 0-9 _ - only)"))
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
