"""Configuration: which servers to connect to, and the policy for each.

Two file shapes are read:

* an `mcpServers` JSON file as Claude Code (`.mcp.json`), Claude Desktop, Cursor and VS Code
  (`"servers"`) write it, unchanged, with default policy;
* a `breakwater.toml`, which may point at such a file (`servers_file`), define servers inline
  (`[servers.NAME]`), and set policy: `[connect]`, `[call]`, `[breaker]` and `[retry]` for every
  server, `[servers.NAME.connect]` (`.call`, `.breaker`, `.retry`) for one, and
  `[servers.NAME.tools.TOOL]` for one tool (any `[call]` knob but `max_in_flight`, plus
  `max_attempts`).

Without `--config`, breakwater looks for `breakwater.toml`, then `.mcp.json`, in the current
directory. Every error names the file, the key and the fix.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any, Literal

from breakwater.config._knobs import Knob, build_policy, env_layer, iter_knobs
from breakwater.config._policies import (
    GLOBAL_SECTIONS,
    POLICY_SECTIONS,
    BreakerPolicy,
    CallPolicy,
    ConnectPolicy,
    GatewayPolicy,
    JournalPolicy,
    RetryPolicy,
    StatePolicy,
    TelemetryPolicy,
)
from breakwater.errors import ConfigError

__all__ = [
    "BreakerPolicy",
    "CallPolicy",
    "Config",
    "ConnectPolicy",
    "GatewayPolicy",
    "JournalPolicy",
    "RetryPolicy",
    "ServerSpec",
    "StatePolicy",
    "TelemetryPolicy",
    "ToolSettings",
    "all_knobs",
    "find_config",
    "load_config",
]

Transport = Literal["stdio", "http", "sse"]

DEFAULT_CONFIG_NAMES = ("breakwater.toml", ".mcp.json")


# Keys a `[servers.NAME.tools.TOOL]` table accepts and the policy each one belongs to.
_TOOL_CALL_KEYS = frozenset(f.name for f in dc_fields(CallPolicy)) - {"max_in_flight"}
_TOOL_RETRY_KEYS = frozenset({"max_attempts"})


@dataclass(frozen=True, kw_only=True)
class ToolSettings:
    """One tool's own settings from `[servers.NAME.tools.TOOL]`, layered over its server's."""

    call: CallPolicy
    retry: RetryPolicy
    #: The keys the tool's table set itself (they win over a learned timeout).
    explicit: frozenset[str] = frozenset()


def _secret_keys(values: Mapping[str, str]) -> dict[str, str]:
    return dict(values)


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    """One upstream MCP server as configured.

    `env` and `headers` hold secrets: they are excluded from `repr` and from every rendering.
    """

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    enabled: bool = True
    connect: ConnectPolicy = field(default_factory=ConnectPolicy)
    call: CallPolicy = field(default_factory=CallPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Keys set in this server's own `[servers.NAME.call]` (they win over a learned timeout).
    call_explicit: frozenset[str] = frozenset()
    #: Keys of `[call]` the config file set for this server anywhere (its own table or the top-level
    #: `[call]`): a value from there is labelled `configured`, not `default` (a learned one still wins
    #: over the top-level table).
    call_configured: frozenset[str] = frozenset()
    #: Per-tool settings, by tool name.
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)
    source: str | None = None

    @property
    def default_timeout_source(self) -> str:
        """The label of a timeout that comes from `call.timeout_s`: `configured` when the file set it, else `default`."""
        return "configured" if "timeout_s" in self.call_configured else "default"

    def describe(self) -> dict[str, Any]:
        """What was understood, safe to print: secret values are replaced by their key names.

        A secret value that also appears in the command line (`--token` arguments) is masked there too,
        and a URL loses its user-info and query string.
        """
        from breakwater.config._redact import Redactor, display_url

        redact = Redactor(self.secrets)
        out: dict[str, Any] = {"name": self.name, "transport": self.transport, "enabled": self.enabled}
        if self.transport == "stdio":
            out["command"] = redact(self.command or "")
            out["args"] = [redact(a) for a in self.args]
            if self.cwd:
                out["cwd"] = self.cwd
            if self.env:
                out["env"] = {k: "<redacted>" for k in sorted(self.env)}
        else:
            out["url"] = display_url(self.url or "")
            if self.headers:
                out["headers"] = {k: "<redacted>" for k in sorted(self.headers)}
        return out

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret value this server carries, so writers can scrub them from anything they print."""
        return tuple(v for v in (*self.env.values(), *self.headers.values()) if len(v) >= 4)

    def fingerprint(self) -> str:
        """A stable hash of what defines the connection (secrets included, but only as a hash)."""
        import hashlib

        blob = json.dumps(
            [
                self.transport,
                self.command,
                list(self.args),
                sorted(self.env.items()),
                self.cwd,
                self.url,
                sorted(self.headers.items()),
            ],
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything breakwater was told: the servers and the defaults they were built from."""

    servers: tuple[ServerSpec, ...]
    connect: ConnectPolicy = field(default_factory=ConnectPolicy)
    call: CallPolicy = field(default_factory=CallPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    gateway: GatewayPolicy = field(default_factory=lambda: GatewayPolicy())
    journal: JournalPolicy = field(default_factory=lambda: JournalPolicy())
    state: StatePolicy = field(default_factory=StatePolicy)
    telemetry: TelemetryPolicy = field(default_factory=lambda: TelemetryPolicy())
    path: str | None = None

    def server(self, name: str) -> ServerSpec:
        """The server called `name` (KeyError if none)."""
        for spec in self.servers:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret value in the config."""
        return tuple(s for spec in self.servers for s in spec.secrets)

    def with_servers(self, servers: tuple[ServerSpec, ...]) -> Config:
        """A copy with another server list."""
        return replace(self, servers=servers)


def all_knobs() -> list[Knob]:
    """Every knob, for the README's generated table."""
    sections = {**POLICY_SECTIONS, **GLOBAL_SECTIONS}
    return [k for section, cls in sections.items() for k in iter_knobs(section, cls)]


# Keys that other clients write into mcpServers entries and that mean nothing to a connection:
# accepted so their files load unchanged, never used.
_FOREIGN_ENTRY_KEYS = frozenset({"alwaysAllow", "autoApprove", "timeout", "description", "envFile", "oauth"})
_ENTRY_KEYS = frozenset({"type", "transport", "command", "args", "env", "cwd", "url", "headers", "disabled", "enabled"})
_TOML_TOP_KEYS = frozenset({"servers_file", "servers", *POLICY_SECTIONS, *GLOBAL_SECTIONS})


def _fail(message: str, path: str, key: str, fix: str) -> ConfigError:
    return ConfigError(message, path=path, key=key, fix=fix)


def _unknown_key(path: str, where: str, key: str, known: frozenset[str]) -> ConfigError:
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(known))}"
    return _fail("unknown key", path, f"{where}.{key}" if where else key, fix)


def _str_map(value: Any, path: str, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _fail("expected a table of strings", path, key, f'write {key} as {{"NAME": "value"}}')
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise _fail("expected a string value", path, f"{key}.{k}", "quote the value")
        out[k] = str(v)
    return out


def _parse_entry(
    name: str,
    entry: Any,
    *,
    path: str,
    where: str,
    extra_keys: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate one server entry; returns (connection fields, the rest for the caller)."""
    if not isinstance(entry, dict):
        raise _fail("expected an object describing the server", path, where, 'e.g. {"command": "npx", "args": [...]}')
    rest: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for key, value in entry.items():
        if key in extra_keys:
            rest[key] = value
        elif key not in _ENTRY_KEYS and key not in _FOREIGN_ENTRY_KEYS:
            raise _unknown_key(path, where, key, _ENTRY_KEYS | extra_keys)
    kind = entry.get("type", entry.get("transport"))
    if kind is None:
        kind = "http" if "url" in entry and "command" not in entry else "stdio"
    if kind in ("http", "streamable-http", "streamable_http", "streamableHttp"):
        transport: Transport = "http"
    elif kind == "sse":
        transport = "sse"
    elif kind == "stdio":
        transport = "stdio"
    else:
        raise _fail(f"unknown transport {kind!r}", path, f"{where}.type", 'use "stdio", "http" or "sse"')
    fields["transport"] = transport
    if transport == "stdio":
        command = entry.get("command")
        if not isinstance(command, str) or not command.strip():
            raise _fail("a stdio server needs a command", path, f"{where}.command", 'add "command": "the-program"')
        fields["command"] = command
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise _fail("expected a list of strings", path, f"{where}.args", 'write "args": ["--flag", "value"]')
        fields["args"] = tuple(str(a) for a in args)
        if "env" in entry:
            fields["env"] = _str_map(entry["env"], path, f"{where}.env")
        cwd = entry.get("cwd")
        if cwd is not None:
            if not isinstance(cwd, str):
                raise _fail("expected a directory path", path, f"{where}.cwd", 'write "cwd": "/some/dir"')
            base = Path(path).parent if path else Path.cwd()
            fields["cwd"] = str((base / os.path.expanduser(cwd)).resolve())
        if "url" in entry:
            raise _fail("a stdio server has no url", path, f"{where}.url", 'remove "url" or set "type": "http"')
    else:
        url = entry.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise _fail("an HTTP server needs an http(s) url", path, f"{where}.url", 'add "url": "http://127.0.0.1:8000/mcp"')
        fields["url"] = url
        if "headers" in entry:
            fields["headers"] = _str_map(entry["headers"], path, f"{where}.headers")
        if "command" in entry:
            raise _fail(f"an {transport} server has no command", path, f"{where}.command", 'remove "command" or the url')
    enabled = True
    if "disabled" in entry:
        if not isinstance(entry["disabled"], bool):
            raise _fail("expected true or false", path, f"{where}.disabled", '"disabled": true')
        enabled = not entry["disabled"]
    if "enabled" in entry:
        if not isinstance(entry["enabled"], bool):
            raise _fail("expected true or false", path, f"{where}.enabled", "enabled = false")
        enabled = entry["enabled"]
    fields["enabled"] = enabled
    return fields, rest


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", path=str(path), fix="check the path") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            path=str(path),
            fix="fix the JSON syntax (a trailing comma or a missing quote is the usual cause)",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", path=str(path), fix='write {"mcpServers": {...}}')
    return data


def _servers_from_json(path: Path, defaults: Mapping[str, Any]) -> list[ServerSpec]:
    data = _read_json(path)
    top = "mcpServers" if "mcpServers" in data else "servers" if "servers" in data else None
    if top is None:
        raise ConfigError('no "mcpServers" object', path=str(path), key="mcpServers", fix='write {"mcpServers": {"name": {...}}}')
    for key in data:
        # VS Code keeps "inputs" beside "servers"; anything else is a typo worth reporting.
        if key not in (top, "inputs", "$schema"):
            raise _unknown_key(str(path), "", key, frozenset({"mcpServers", "servers", "inputs"}))
    entries = data[top]
    if not isinstance(entries, dict):
        raise ConfigError("expected an object of servers", path=str(path), key=top, fix=f'write "{top}": {{"name": {{...}}}}')
    specs = []
    for name, entry in entries.items():
        fields, _ = _parse_entry(name, entry, path=str(path), where=f"{top}.{name}")
        specs.append(ServerSpec(name=name, source=str(path), **defaults, **fields))
    return specs


def _policy_table(value: Any, path: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail("expected a table", path, where, f"write [{where}] with key = value lines")
    return value


_SERVER_POLICY_KEYS = frozenset({*POLICY_SECTIONS, "tools"})


def _layered(
    section: str,
    defaults: Mapping[str, Any],
    spath: str,
    environ: Mapping[str, str],
    *more: tuple[Mapping[str, Any], str | None, str],
) -> Any:
    cls = POLICY_SECTIONS[section]
    return build_policy(cls, [(defaults, spath, section), env_layer(cls, environ), *more])


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


def _load_toml(path: Path, environ: Mapping[str, str]) -> Config:
    spath = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", path=spath, fix="check the path") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", path=spath, fix="fix the TOML syntax") from None
    for key in data:
        if key not in _TOML_TOP_KEYS:
            raise _unknown_key(spath, "", key, _TOML_TOP_KEYS)
    top = {section: _policy_table(data.get(section, {}), spath, section) for section in POLICY_SECTIONS}
    defaults = {section: _layered(section, top[section], spath, environ) for section in POLICY_SECTIONS}

    specs: dict[str, ServerSpec] = {}
    servers_file = data.get("servers_file")
    if servers_file is not None:
        if not isinstance(servers_file, str):
            raise _fail("expected a path", spath, "servers_file", 'servers_file = ".mcp.json"')
        json_path = (path.parent / os.path.expanduser(servers_file)).resolve()
        if not json_path.exists():
            raise _fail(f"{json_path} does not exist", spath, "servers_file", "point servers_file at an mcpServers JSON file")
        for spec in _servers_from_json(json_path, defaults):
            specs[spec.name] = spec

    servers = _policy_table(data.get("servers", {}), spath, "servers")
    for name, table in servers.items():
        where = f"servers.{name}"
        table = _policy_table(table, spath, where)
        if any(k in table for k in ("command", "url")):
            fields, _ = _parse_entry(name, table, path=spath, where=where, extra_keys=_SERVER_POLICY_KEYS)
            base_spec = ServerSpec(name=name, source=spath, **fields)
        elif name in specs:
            base_spec = specs[name]
            for key in table:
                if key not in _SERVER_POLICY_KEYS | {"enabled"}:
                    raise _unknown_key(spath, where, key, _SERVER_POLICY_KEYS | {"enabled", "command", "url"})
            if "enabled" in table:
                if not isinstance(table["enabled"], bool):
                    raise _fail("expected true or false", spath, f"{where}.enabled", "enabled = false")
                base_spec = replace(base_spec, enabled=table["enabled"])
        else:
            raise _fail(
                "this server is neither defined here nor in servers_file",
                spath,
                where,
                'add command = "..." (stdio) or url = "..." (http), or fix the name',
            )
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
        specs[name] = replace(base_spec, **policies, call_explicit=frozenset(own["call"]), tools=tools)
    # Servers from servers_file too: the top-level [call] is configuration for every one of them.
    configured = frozenset(top["call"])
    specs = {n: replace(s, call_configured=s.call_explicit | configured) for n, s in specs.items()}
    gateway = build_policy(
        GatewayPolicy,
        [(_policy_table(data.get("gateway", {}), spath, "gateway"), spath, "gateway"), env_layer(GatewayPolicy, environ)],
    )
    journal = build_policy(
        JournalPolicy,
        [(_policy_table(data.get("journal", {}), spath, "journal"), spath, "journal"), env_layer(JournalPolicy, environ)],
    )
    state = build_policy(
        StatePolicy,
        [(_policy_table(data.get("state", {}), spath, "state"), spath, "state"), env_layer(StatePolicy, environ)],
    )
    telemetry = build_policy(
        TelemetryPolicy,
        [(_policy_table(data.get("telemetry", {}), spath, "telemetry"), spath, "telemetry"), env_layer(TelemetryPolicy, environ)],
    )
    return Config(
        servers=tuple(specs.values()), **defaults, gateway=gateway, journal=journal, state=state, telemetry=telemetry, path=spath
    )


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Config:
    """Load a breakwater.toml or an mcpServers JSON file (chosen by the file's suffix and content)."""
    p = Path(path)
    env = os.environ if environ is None else environ
    if p.suffix == ".toml":
        return _load_toml(p, env)
    defaults = {section: build_policy(cls, [env_layer(cls, env)]) for section, cls in POLICY_SECTIONS.items()}
    gateway = build_policy(GatewayPolicy, [env_layer(GatewayPolicy, env)])
    journal = build_policy(JournalPolicy, [env_layer(JournalPolicy, env)])
    state = build_policy(StatePolicy, [env_layer(StatePolicy, env)])
    telemetry = build_policy(TelemetryPolicy, [env_layer(TelemetryPolicy, env)])
    return Config(
        servers=tuple(_servers_from_json(p, defaults)),
        **defaults,
        gateway=gateway,
        journal=journal,
        state=state,
        telemetry=telemetry,
        path=str(p),
    )


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
