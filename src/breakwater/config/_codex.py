"""Codex's `config.toml`: its `[mcp_servers.NAME]` tables, read as Codex reads them.

A `.toml` file with a top-level `mcp_servers` table is Codex's (`~/.codex/config.toml`, a project's
`.codex/config.toml`), not breakwater's: `serve --config` and `servers_file` take it as it is. Codex's
keys (codex-rs `RawMcpServerConfig`):

* `command`, `args`, `env`, `cwd`, `url`, `enabled`: as in every client's entry;
* `env_vars`: variables passed on from breakwater's environment to the stdio server (a name, or
  `{name = ..., source = "local"}`), when set; as Codex, nothing else of it but the SDK's few (`[connect]
  inherit_env = "minimal"`, unless BREAKWATER_CONNECT_INHERIT_ENV says otherwise);
* `http_headers`; `env_http_headers` (header -> the variable holding its value); `bearer_token_env_var`
  (the variable holding the `Authorization: Bearer` token). An unset variable named there is an
  error, as an unset `${VAR}` is in a JSON file. An inline `bearer_token` is refused, as Codex refuses it;
* `enabled_tools` and `disabled_tools`: the server's tools listed (`ToolFilter`);
* `tool_timeout_sec` is the server's `[call] timeout_s`, and `startup_timeout_sec` (or `_ms`) its
  `[connect] attempt_timeout_s` (Codex's startup covers the handshake and the first tools/list, as
  an attempt does), both labelled `configured`;
* `scopes` and `oauth.client_id` are sign-in settings (`breakwater auth login NAME`);
* approvals (`default_tools_approval_mode`, `tools.TOOL.approval_mode`), `required`,
  `supports_parallel_tool_calls`, `oauth_resource`, `experimental_environment` and `name` are ignored
  with a note.

Codex expands no variables in the file, so neither does breakwater here. The rest of the file
(model, sandbox, profiles) is Codex's own, noted and ignored. May import the core leaves and the rest
of `config` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from breakwater.config._checks import check_server_name
from breakwater.config._dialect import skipped_entry
from breakwater.config._entry import Entries, fail, parse_entry, str_map, tool_filter, unknown_key
from breakwater.config._expand import Expander, unset_off
from breakwater.config._model import OAuthSettings, ServerSpec
from breakwater.errors import ConfigError

__all__ = ["CODEX_TOP", "servers_from_codex"]

#: The top-level table that makes a `.toml` file Codex's.
CODEX_TOP = "mcp_servers"

_COMMON = frozenset({"command", "args", "env", "cwd", "url", "enabled"})
_HTTP_ONLY = ("http_headers", "env_http_headers", "bearer_token_env_var", "bearer_token", "oauth", "oauth_resource")
_HANDLED = frozenset({"env_vars", *_HTTP_ONLY, "enabled_tools", "disabled_tools", "scopes"})
#: Codex's timeout keys: the policy section and knob each one sets, and its unit in seconds.
_TIMEOUTS = {
    "tool_timeout_sec": ("call", "timeout_s", 1.0),
    "startup_timeout_sec": ("connect", "attempt_timeout_s", 1.0),
    "startup_timeout_ms": ("connect", "attempt_timeout_s", 0.001),
}

#: Keys that mean nothing to breakwater, and what the note says about each.
_IGNORED = {
    "required": "codex exec stops when this server fails to start; breakwater serves the others and answers for this one",
    "supports_parallel_tool_calls": "Codex's hint to its model; breakwater passes calls on as they come",
    "default_tools_approval_mode": "approvals are your agent's; breakwater never asks",
    "tools": "Codex's per-tool approvals; approvals are your agent's",
    "oauth_resource": "breakwater asks for a token for the server's own URL, as the MCP spec says",
    "experimental_environment": "Codex's choice of where to start the server; breakwater starts it here",
    "name": "a label for people; not used",
}
_KEYS = _COMMON | _HANDLED | frozenset(_TIMEOUTS) | frozenset(_IGNORED)


def servers_from_codex(
    path: Path, data: Mapping[str, Any], defaults: Mapping[str, Any], expand: Expander, entries_ok: Entries
) -> tuple[list[ServerSpec], list[str]]:
    """The servers of a Codex `config.toml` already parsed into `data`, and the notes about it."""
    spath = str(path)
    tables = data[CODEX_TOP]
    if not isinstance(tables, dict):
        raise fail("expected a table of servers", spath, CODEX_TOP, "write [mcp_servers.NAME] tables")
    notes = [f"{', '.join(rest)} ignored: Codex's own settings, not servers"] if (rest := sorted(set(data) - {CODEX_TOP})) else []
    literal = replace(expand, literal=True)
    specs = []
    for name, table in tables.items():
        where = f"{CODEX_TOP}.{name}"
        with entries_ok.tolerated(name):
            check_server_name(name, path=spath, key=where)
            if (why := skipped_entry(table)) is not None:
                notes.append(f"{where} skipped: {why}")
                continue
            specs.append(_server(name, table, spath, where, defaults, literal))
    return specs, notes


def _server(name: str, table: Any, spath: str, where: str, defaults: Mapping[str, Any], expand: Expander) -> ServerSpec:
    if not isinstance(table, dict):
        raise fail("expected a table describing the server", spath, where, f'write [{where}] with command = "..." or url = "..."')
    if unknown := next((key for key in table if key not in _KEYS), None):
        raise unknown_key(spath, where, unknown, _KEYS)
    if "command" not in table and "url" not in table:
        raise fail("neither command nor url is set", spath, where, 'add command = "the-program" (stdio) or url = "https://..."')
    if "command" in table and "url" in table:
        raise fail("both command and url are set", spath, f"{where}.url", "keep command (a stdio server) or url (an HTTP one)")
    fields, _ = parse_entry({k: v for k, v in table.items() if k in _COMMON}, path=spath, where=where, expand=expand)
    if fields["transport"] == "stdio":
        for key in _HTTP_ONLY:
            if key in table:
                raise fail(f"a stdio server has no {key}", spath, f"{where}.{key}", f"remove {key}, or the command for a url")
        passed = _passed_on(table.get("env_vars"), spath, f"{where}.env_vars", expand.environ)
        fields["env"] = passed | dict(fields.get("env", {}))
        if unset := [n for n in _var_names(table.get("env_vars")) if n not in passed]:
            fields["notes"] = (*fields["notes"], f"env_vars: {', '.join(unset)} not set here, so not passed on")
    else:
        for key in ("args", "env", "env_vars", "cwd"):  # as Codex refuses them beside a url
            if key in table:
                raise fail(f"an HTTP server has no {key}", spath, f"{where}.{key}", f"remove {key}, or the url for a command")
        fields["headers"] = _headers(table, spath, where, expand)
        if (oauth := _oauth(table, spath, where)) is not None:
            fields["oauth"] = oauth
    # The values of variables its keys name (env_vars too, which env holds and `secrets` scrubs) are secrets.
    fields["expanded_secrets"] = (*fields["expanded_secrets"], *expand.take_secrets(where))
    fields["tool_filter"] = tool_filter(table, spath, where, deny=("disabled_tools",), allow=("enabled_tools",))
    fields["notes"] = (*fields["notes"], *(f"{key} ignored: {why}" for key, why in _IGNORED.items() if key in table))
    spec = ServerSpec(name=name, source=spath, **defaults, **unset_off(fields, expand, where))
    if spec.transport == "stdio" and "BREAKWATER_CONNECT_INHERIT_ENV" not in expand.environ:
        # Codex gives its servers a minimal environment and what env_vars names; breakwater's default gives all of it.
        spec = replace(spec, connect=replace(spec.connect, inherit_env="minimal"))
    return _with_timeouts(spec, table, spath, where)


def _variable(expand: Expander, name: Any, spath: str, key: str, where: str) -> str | None:
    """The value of the variable `name` (a secret); unset is an error, or None while importing (recorded as missing)."""
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "${}= "):
        raise fail("expected the name of an environment variable", spath, key, 'write the name alone: "GITHUB_TOKEN"')
    return expand.variable(name, where=where, key=key)


def _passed_on(value: Any, spath: str, key: str, environ: Mapping[str, str]) -> dict[str, str]:
    """`env_vars`: the variables of breakwater's own environment the stdio server gets, those that are set."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise fail("expected a list of variable names", spath, key, 'env_vars = ["GITHUB_TOKEN"]')
    out = {}
    for i, item in enumerate(value):
        name, source = (item.get("name"), item.get("source", "local")) if isinstance(item, dict) else (item, "local")
        if source != "local":
            raise fail(f"source {source!r} is not on this machine", spath, f"{key}[{i}].source", 'use "local", or leave it out')
        if not isinstance(name, str) or not name.strip():
            raise fail("expected the name of an environment variable", spath, f"{key}[{i}]", 'env_vars = ["GITHUB_TOKEN"]')
        if name in environ:  # Codex passes on the ones that are set, and so does breakwater
            out[name] = environ[name]
    return out


def _var_names(value: Any) -> list[Any]:
    return [item.get("name") if isinstance(item, dict) else item for item in value or ()]


def _headers(table: Mapping[str, Any], spath: str, where: str, expand: Expander) -> dict[str, str]:
    if "bearer_token" in table:
        raise fail(
            "a token written into the file (Codex refuses it too)",
            spath,
            f"{where}.bearer_token",
            'put it in an environment variable and name that: bearer_token_env_var = "MY_TOKEN"',
        )
    headers = str_map(table["http_headers"], spath, f"{where}.http_headers", expand, where) if "http_headers" in table else {}
    from_env = table.get("env_http_headers", {})
    if not isinstance(from_env, dict):
        raise fail(
            "expected a table of header = variable",
            spath,
            f"{where}.env_http_headers",
            'env_http_headers = { "X-Api-Key" = "MY_KEY" }',
        )
    for header, name in from_env.items():
        if (value := _variable(expand, name, spath, f"{where}.env_http_headers.{header}", where)) is not None:
            headers[header] = value
    if "bearer_token_env_var" in table:
        key = f"{where}.bearer_token_env_var"
        if (token := _variable(expand, table["bearer_token_env_var"], spath, key, where)) is not None:
            # It is the Authorization header (in any case http_headers wrote it): one is sent, not two.
            headers = {name: value for name, value in headers.items() if name.lower() != "authorization"}
            headers["Authorization"] = f"Bearer {token}"
    return headers


def _oauth(table: Mapping[str, Any], spath: str, where: str) -> OAuthSettings | None:
    scopes, oauth = table.get("scopes"), table.get("oauth")
    if scopes is not None and (not isinstance(scopes, list) or not all(isinstance(s, str) and s.strip() for s in scopes)):
        raise fail("expected a list of scopes", spath, f"{where}.scopes", 'scopes = ["read", "write"]')
    client_id = None
    if oauth is not None:
        if not isinstance(oauth, dict) or set(oauth) - {"client_id"}:
            raise fail("expected a table with client_id", spath, f"{where}.oauth", f'[{where}.oauth] client_id = "..."')
        client_id = oauth.get("client_id")
        if not isinstance(client_id, str) or not client_id.strip():
            raise fail("expected a client ID", spath, f"{where}.oauth.client_id", 'client_id = "..."')
    if client_id is None and not scopes:
        return None
    return OAuthSettings(client_id=client_id, scopes=" ".join(scopes) if scopes else None)


def _with_timeouts(spec: ServerSpec, table: Mapping[str, Any], spath: str, where: str) -> ServerSpec:
    """Codex's timeouts as the server's own policy: they win over defaults and learned values, as a config's do."""
    if "startup_timeout_sec" in table and "startup_timeout_ms" in table:  # which one wins would be a guess
        raise fail("both startup_timeout_sec and startup_timeout_ms are set", spath, f"{where}.startup_timeout_ms", "keep one")
    for key, (section, knob, scale) in _TIMEOUTS.items():
        if key not in table:
            continue
        value, example = table[key], f"{key} = {round(30 / scale)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise fail("expected a positive number", spath, f"{where}.{key}", example)
        try:
            policy = replace(getattr(spec, section), **{knob: value * scale})
        except (ValueError, ConfigError) as exc:
            said = str(getattr(exc, "detail", exc))
            raise fail(f"{said} ({key} = {value} is {value * scale:g} s)", spath, f"{where}.{key}", example) from None
        spec = replace(spec, **{section: policy})
        if section == "call":
            spec = replace(spec, call_explicit=spec.call_explicit | {knob}, call_configured=spec.call_configured | {knob})
    return spec
