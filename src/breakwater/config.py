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

from breakwater._breaker import BreakerPolicy
from breakwater._knobs import Knob, build_policy, env_layer, iter_knobs, knob
from breakwater._retry_budget import RetryPolicy
from breakwater._state_store import StatePolicy
from breakwater.errors import ConfigError

__all__ = [
    "BreakerPolicy",
    "CallPolicy",
    "Config",
    "ConnectPolicy",
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


@dataclass(frozen=True, kw_only=True)
class ConnectPolicy:
    """How breakwater connects to one server: admission, timeouts, backoff and budget."""

    attempt_timeout_s: float = knob(
        30.0,
        "Time one connect attempt (spawn or HTTP connect, handshake, tools/list) may take.",
        env="BREAKWATER_CONNECT_ATTEMPT_TIMEOUT_S",
        minimum=0.1,
    )
    budget_s: float = knob(
        150.0,
        "Total time for a round of connect attempts before the server is marked failed.",
        env="BREAKWATER_CONNECT_BUDGET_S",
        minimum=0.0,
    )
    backoff_base_s: float = knob(
        1.0,
        "First retry delay ceiling; each retry waits a uniform draw up to base * 2^n.",
        env="BREAKWATER_CONNECT_BACKOFF_BASE_S",
        minimum=0.001,
    )
    backoff_cap_s: float = knob(
        30.0,
        "Largest retry delay ceiling within the budget.",
        env="BREAKWATER_CONNECT_BACKOFF_CAP_S",
        minimum=0.001,
    )
    background_retry_s: float = knob(
        60.0,
        "Mean delay between background attempts once a server has failed (jittered by +-50 %).",
        env="BREAKWATER_CONNECT_BACKGROUND_RETRY_S",
        minimum=0.1,
    )
    startup_jitter_s: float = knob(
        0.5,
        "Initial connects are spread uniformly over this window.",
        env="BREAKWATER_CONNECT_STARTUP_JITTER_S",
        minimum=0.0,
    )
    max_stdio_connects: int = knob(
        4,
        "Stdio servers spawning and handshaking at once on this machine (shared by breakwater processes).",
        env="BREAKWATER_CONNECT_MAX_STDIO",
        minimum=1,
    )
    max_http_connects: int = knob(
        16,
        "HTTP connects in flight at once from one breakwater process.",
        env="BREAKWATER_CONNECT_MAX_HTTP",
        minimum=1,
    )
    max_per_server_connects: int = knob(
        2,
        "Handshakes in flight to one server on this machine (shared by breakwater processes).",
        env="BREAKWATER_CONNECT_MAX_PER_SERVER",
        minimum=1,
    )
    admission_dir: str = knob(
        "",
        "Directory of lock files that shares the connect caps across processes; empty = the user cache dir.",
        env="BREAKWATER_ADMISSION_DIR",
    )
    health_interval_s: float = knob(
        30.0,
        "A ready server is checked (tools/list) this often; a failed check reconnects. 0 turns it off.",
        env="BREAKWATER_HEALTH_INTERVAL_S",
        minimum=0.0,
    )
    protocol: str = knob(
        "auto",
        "Protocol revision: auto (probe once, then remember), 2026-07-28, or 2025-11-25.",
        env="BREAKWATER_PROTOCOL",
        choices=("auto", "2026-07-28", "2025-11-25"),
    )


@dataclass(frozen=True, kw_only=True)
class CallPolicy:
    """How one tool call is bounded: its deadlines, the server's in-flight cap and the retry class.

    The default timeout is tight on purpose (a few seconds, not the 60 s most clients use): a slow
    tool should cost the agent seconds, not a minute per attempt. Tools that legitimately run long
    either send progress (each notification resets the idle timer, up to `max_s`) or get their own
    `timeout_s` in `[servers.NAME.tools.TOOL]`.
    """

    timeout_s: float = knob(
        5.0,
        "Deadline of one attempt of a tool call that sends no progress; it is cancelled upstream when it passes.",
        env="BREAKWATER_CALL_TIMEOUT_S",
        minimum=0.001,
    )
    idle_timeout_s: float | None = knob(
        None,
        "Once a call sends progress, the longest gap allowed between notifications; unset = timeout_s.",
        env="BREAKWATER_CALL_IDLE_TIMEOUT_S",
        minimum=0.001,
    )
    max_s: float = knob(
        120.0,
        "Hard cap on one attempt, however much progress it sends (never below timeout_s).",
        env="BREAKWATER_CALL_MAX_S",
        minimum=0.001,
    )
    max_in_flight: int = knob(
        32,
        "Calls in flight to one server at once (the bulkhead); one more is refused at once with OVERLOADED.",
        env="BREAKWATER_CALL_MAX_IN_FLIGHT",
        minimum=1,
    )
    min_attempt_s: float = knob(
        0.25,
        "An attempt is not started with less than this left in the turn budget (or its timeout, if shorter).",
        env="BREAKWATER_CALL_MIN_ATTEMPT_S",
        minimum=0.0,
    )
    slow_call_s: float | None = knob(
        None,
        "A call longer than this counts as slow for the breaker's slow-call rate; unset = slow calls are not counted.",
        env="BREAKWATER_CALL_SLOW_CALL_S",
        minimum=0.0,
    )
    retry: str = knob(
        "auto",
        "Retry class: auto (from the tool's MCP annotations), safe, idempotent or never.",
        env="BREAKWATER_CALL_RETRY",
        choices=("auto", "safe", "idempotent", "never"),
    )
    task_max_s: float = knob(
        3600.0,
        "A call the server turned into a task (2026-07-28 tasks extension) is polled this long at most, then "
        "cancelled with tasks/cancel; a turn budget, when shorter, wins.",
        env="BREAKWATER_CALL_TASK_MAX_S",
        minimum=0.001,
    )

    @property
    def idle_s(self) -> float:
        """The idle timeout in force (`idle_timeout_s`, else `timeout_s`)."""
        return self.timeout_s if self.idle_timeout_s is None else self.idle_timeout_s

    @property
    def hard_s(self) -> float:
        """The hard cap in force (`max_s`, raised to `timeout_s` if set lower)."""
        return max(self.max_s, self.timeout_s)


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
    #: Per-tool settings, by tool name.
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)
    source: str | None = None

    def describe(self) -> dict[str, Any]:
        """What was understood, safe to print: secret values are replaced by their key names.

        A secret value that also appears in the command line (`--token` arguments) is masked there too,
        and a URL loses its user-info and query string.
        """
        from breakwater._redact import Redactor, display_url

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


@dataclass(frozen=True, kw_only=True)
class GatewayPolicy:
    """How the gateway names, lists and explains tools."""

    tool_name_template: str = knob(
        "{server}__{tool}",
        "Downstream tool name; {server} and {tool} are replaced, other characters outside A-Z a-z 0-9 _ - . become _.",
        env="BREAKWATER_TOOL_NAME_TEMPLATE",
    )
    list_unready_tools: bool = knob(
        True,
        "List the last-known tools of servers that are not ready, so agents can see (and call) them.",
        env="BREAKWATER_LIST_UNREADY_TOOLS",
    )
    catalog_dir: str = knob(
        "",
        "Directory of the last-known tool lists; empty = the user cache dir.",
        env="BREAKWATER_CATALOG_DIR",
    )
    search_tool: str = knob(
        "breakwater_search_tools",
        "Name of the built-in tool search; empty turns it off.",
        env="BREAKWATER_SEARCH_TOOL",
    )
    status_tool: str = knob(
        "breakwater_status",
        "Name of the built-in status tool; empty turns it off.",
        env="BREAKWATER_STATUS_TOOL",
    )
    drift: str = knob(
        "warn",
        "When a server changes a tool's definition: accept it, warn (status and search say so), or block the tool "
        "until a person runs breakwater tools --accept.",
        env="BREAKWATER_DRIFT",
        choices=("accept", "warn", "block"),
    )
    search_wait_s: float = knob(
        2.0,
        "The search tool waits up to this long for connecting servers that may hold a match.",
        env="BREAKWATER_SEARCH_WAIT_S",
        minimum=0.0,
    )


@dataclass(frozen=True, kw_only=True)
class JournalPolicy:
    """The call journal: where attempts are recorded, for how long, and how timeouts are learned from them."""

    url: str = knob(
        "",
        "Where the journal lives: empty = SQLite in the user data dir, a file path or sqlite:///PATH, "
        "postgresql://... for a shared journal, or off.",
        env="BREAKWATER_JOURNAL",
    )
    retention_days: float = knob(
        14.0,
        "Attempts older than this are deleted (checked every few minutes by the writer).",
        env="BREAKWATER_JOURNAL_RETENTION_DAYS",
        minimum=0.001,
    )
    queue_size: int = knob(
        10_000,
        "Attempts waiting to be written; when full, new ones are dropped and counted, never waited on.",
        env="BREAKWATER_JOURNAL_QUEUE_SIZE",
        minimum=1,
    )
    flush_interval_s: float = knob(
        0.5,
        "The writer writes what is queued at least this often (sooner when a batch fills).",
        env="BREAKWATER_JOURNAL_FLUSH_INTERVAL_S",
        minimum=0.001,
    )
    record_sizes: bool = knob(
        False,
        "Also record argument and result sizes and a hash of the arguments (never their content).",
        env="BREAKWATER_JOURNAL_RECORD_SIZES",
    )
    learn_timeouts: bool = knob(
        True,
        "Learn each tool's timeout from its recorded latencies (configured timeouts still win).",
        env="BREAKWATER_JOURNAL_LEARN_TIMEOUTS",
    )
    learn_min_samples: int = knob(
        50,
        "Completed calls of a tool in the window before its timeout is learned.",
        env="BREAKWATER_JOURNAL_LEARN_MIN_SAMPLES",
        minimum=1,
    )
    learn_window_s: float = knob(
        3600.0,
        "The latencies a learned timeout is computed from: this many recent seconds of attempts.",
        env="BREAKWATER_JOURNAL_LEARN_WINDOW_S",
        minimum=1.0,
    )
    learn_quantile: float = knob(
        0.999,
        "The latency quantile a learned timeout starts from (timed-out attempts count at their timeout).",
        env="BREAKWATER_JOURNAL_LEARN_QUANTILE",
        minimum=0.5,
    )
    learn_headroom: float = knob(
        2.0,
        "A learned timeout is the quantile times this factor.",
        env="BREAKWATER_JOURNAL_LEARN_HEADROOM",
        minimum=1.0,
    )
    learn_floor_s: float = knob(
        1.0,
        "Smallest learned timeout.",
        env="BREAKWATER_JOURNAL_LEARN_FLOOR_S",
        minimum=0.001,
    )
    learn_ceiling_s: float = knob(
        120.0,
        "Largest learned timeout.",
        env="BREAKWATER_JOURNAL_LEARN_CEILING_S",
        minimum=0.001,
    )
    learn_refresh_s: float = knob(
        60.0,
        "How often learned timeouts are recomputed from the journal (by the writer, off the call path).",
        env="BREAKWATER_JOURNAL_LEARN_REFRESH_S",
        minimum=0.01,
    )


@dataclass(frozen=True, kw_only=True)
class TelemetryPolicy:
    """OpenTelemetry traces and metrics (`pip install 'mcp-breakwater[otel]'`); off by default, and free when off."""

    enabled: bool = knob(
        False,
        "Emit a span per call (a child per attempt) and call metrics through OpenTelemetry.",
        env="BREAKWATER_TELEMETRY_ENABLED",
    )
    exporter: str = knob(
        "otlp",
        "Where spans and metrics go: otlp (OTLP/HTTP; endpoint from OTEL_EXPORTER_OTLP_ENDPOINT), console "
        "(stderr), or global (the process's own OpenTelemetry providers, set up by the application).",
        env="BREAKWATER_TELEMETRY_EXPORTER",
        choices=("otlp", "console", "global"),
    )
    service_name: str = knob(
        "breakwater",
        "The service.name resource attribute of what breakwater emits (otlp and console).",
        env="BREAKWATER_TELEMETRY_SERVICE_NAME",
    )
    metric_interval_s: float = knob(
        60.0,
        "How often metrics are exported (otlp and console).",
        env="BREAKWATER_TELEMETRY_METRIC_INTERVAL_S",
        minimum=0.1,
    )


POLICY_SECTIONS: dict[str, type[Any]] = {
    "connect": ConnectPolicy,
    "call": CallPolicy,
    "breaker": BreakerPolicy,
    "retry": RetryPolicy,
}


# Sections that configure breakwater itself rather than each server: no per-server override.
GLOBAL_SECTIONS: dict[str, type[Any]] = {
    "gateway": GatewayPolicy,
    "journal": JournalPolicy,
    "state": StatePolicy,
    "telemetry": TelemetryPolicy,
}


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
