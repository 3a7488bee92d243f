"""The policies of breakwater itself, one section each: `[gateway]`, `[journal]`, `[state]`, `[telemetry]`.

Unlike the per-server policies in `_policies`, these have no per-server override.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from breakwater.config._checks import (
    DEFAULT_TOOL_NAME_MAX,
    HASH_TAIL,
    MAX_TOOL_NAME,
    TOOL_NAME_OK,
    check_journal_url,
    check_tool_name_template,
    check_url_port,
)
from breakwater.config._knobs import Policy, knob
from breakwater.errors import ConfigError

__all__ = ["GatewayPolicy", "JournalPolicy", "StatePolicy", "TelemetryPolicy"]


@dataclass(frozen=True, kw_only=True)
class GatewayPolicy(Policy):
    """How the gateway names, lists and explains tools."""

    tool_name_template: str = knob(
        "{server}__{tool}",
        "Downstream tool name; {server} and {tool} are replaced, other characters outside A-Z a-z 0-9 _ - become _ "
        "(a dot too: model APIs refuse it).",
        env="BREAKWATER_TOOL_NAME_TEMPLATE",
    )
    tool_name_max: int = knob(
        DEFAULT_TOOL_NAME_MAX,
        "Longest downstream tool or prompt name. A longer one keeps its start and ends in - and a hash of the "
        "whole, so names stay unique and the same across starts. 64 is the most the Anthropic and OpenAI APIs "
        "accept; a client that puts its own prefix before each name needs that many characters less (Claude Code "
        "writes mcp__NAME__: 47 for breakwater added as breakwater).",
        env="BREAKWATER_TOOL_NAME_MAX",
        minimum=2 * HASH_TAIL,
        maximum=MAX_TOOL_NAME,
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
        path=True,
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
        maximum=600,
    )
    list_wait_s: float = knob(
        5.0,
        "tools/list waits up to this long for connecting servers with no last-known tools, and the prompts and "
        "resources lists for any connecting server, then answers with what it has (later changes go out as "
        "list_changed).",
        env="BREAKWATER_LIST_WAIT_S",
        minimum=0.0,
        maximum=300.0,
    )
    drain_s: float = knob(
        20.0,
        "On SIGTERM, serve --http answers /readyz with 503 and refuses new sessions and calls, then waits up to "
        "this long for calls in flight; what is left is cancelled (upstream too) and answered with an error envelope. "
        "Stdio serve does the same when its client closes stdin or on SIGTERM, and a shared gateway on breakwater "
        "gateway stop or SIGTERM.",
        env="BREAKWATER_DRAIN_S",
        minimum=0.0,
        maximum=3600,
    )
    sse_keepalive_s: float = knob(
        15.0,
        "An SSE comment is sent on every open HTTP stream this often while it is silent, so a load balancer's idle "
        "timeout (often 60 s) does not cut a long call; 0 turns it off.",
        env="BREAKWATER_SSE_KEEPALIVE_S",
        minimum=0.0,
        maximum=3600,
    )
    resume_events: int = knob(
        1000,
        "A 2025-11-25 call whose answer goes out as an SSE stream keeps up to this many of its events (the oldest go "
        "first) for a client that reconnects with Last-Event-ID; in Redis with [state] url (any replica resumes it), "
        "else in this replica's memory. 0 turns resumption off.",
        env="BREAKWATER_RESUME_EVENTS",
        minimum=0,
        maximum=1_000_000,
    )
    resume_ttl_s: float = knob(
        300.0,
        "A resumable stream is kept while its call runs and this long after its last event; a reconnect after that gets 404.",
        env="BREAKWATER_RESUME_TTL_S",
        minimum=1.0,
        maximum=86400,
    )
    resume_max_bytes: int = knob(
        64 * 1024 * 1024,
        "The events of the resumable streams this replica keeps in memory (without [state] url) hold at most this much "
        "JSON text in all; past it the least recently written streams go first, and a reconnect to one gets 404.",
        env="BREAKWATER_RESUME_MAX_BYTES",
        minimum=1024,
        maximum=1024 * 1024 * 1024 * 64,
    )
    session_ttl_s: float = knob(
        1800.0,
        "A 2025-11-25 HTTP session unused this long is closed; with [state] url on Redis its record there expires "
        "after the same time (every request renews it), so any replica serves the session until then.",
        env="BREAKWATER_SESSION_TTL_S",
        minimum=1.0,
        maximum=604800,
    )
    operation_ttl_s: float = knob(
        3600.0,
        "With [state] url on Redis, serve --http records each mutating call it forwards under a client's operation "
        "id for this long, so a retry of a cut call with the same id (to any replica) gets its answer, or "
        "OUTCOME_UNKNOWN if the replica running it died, and never runs it twice.",
        env="BREAKWATER_OPERATION_TTL_S",
        minimum=1.0,
        maximum=604800,
    )

    event_loop: str = knob(
        "auto",
        "The event loop of serve and the shared gateway: auto takes uvloop where it is installed (Linux and macOS; "
        "fewer instructions per proxied call), asyncio keeps asyncio's own loop.",
        env="BREAKWATER_EVENT_LOOP",
        choices=("auto", "asyncio"),
    )
    share: bool = knob(
        True,
        "stdio serve attaches to the user's shared local gateway for this config (starting it when none runs), so "
        "sessions share HTTP upstreams; false (or serve --no-share) gives each session its own gateway.",
        env="BREAKWATER_SHARE",
    )
    share_idle_s: float = knob(
        300.0,
        "A shared gateway exits after this long with no attached session.",
        env="BREAKWATER_SHARE_IDLE_S",
        minimum=0.05,
        maximum=604800,
    )
    share_stdio: str = knob(
        "",
        "Comma-separated stdio servers a shared gateway runs once for every session (* = all), as it does those "
        'whose entry says "shared": true; every other stdio server runs once per attached session, since many '
        "keep per-connection state.",
        env="BREAKWATER_SHARE_STDIO",
    )
    share_dir: str = knob(
        "",
        "Directory of the shared gateways' sockets (kept 0700); empty = the user runtime dir. A socket's path "
        "must fit in 107 bytes (103 on macOS): a deeper directory serves each session on its own, and says so.",
        env="BREAKWATER_SHARE_DIR",
        path=True,
    )
    share_startup_jitter_s: float = knob(
        0.1,
        "A shared gateway spreads its first connects over at most this window (each server's [connect] "
        "startup_jitter_s, if smaller): it is one process for every session, not a herd of them.",
        env="BREAKWATER_SHARE_STARTUP_JITTER_S",
        minimum=0.0,
        maximum=3600,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tool_name_template(self.tool_name_template)
        for key in ("search_tool", "status_tool"):
            name = getattr(self, key)
            if name and (TOOL_NAME_OK.search(name) or len(name) > MAX_TOOL_NAME):
                # A name a model API refuses costs the agent every tool: `TOOL_NAME_OK`.
                fix = f"use letters, digits, _ and - (at most {MAX_TOOL_NAME}), or empty to turn it off"
                raise ConfigError(f"{name!r} is not a tool name", key=key, fix=fix)
        if self.search_tool and self.search_tool == self.status_tool:
            raise ConfigError("the same name as search_tool: two tools of one name", key="status_tool", fix="name them apart")


@dataclass(frozen=True, kw_only=True)
class JournalPolicy(Policy):
    """The call journal: where attempts are recorded, for how long, and how timeouts are learned from them."""

    url: str = knob(
        "",
        "Where the journal lives: empty = SQLite in the user data dir, a file path or sqlite:///PATH, "
        "postgresql://... for a shared journal, or off.",
        env="BREAKWATER_JOURNAL",
        path=True,
        off=True,
    )
    retention_days: float = knob(
        14.0,
        "Attempts older than this are deleted (checked every few minutes by the writer).",
        env="BREAKWATER_JOURNAL_RETENTION_DAYS",
        minimum=0.001,
        maximum=3650,
    )
    queue_size: int = knob(
        10_000,
        "Attempts waiting to be written; when full, new ones are dropped and counted, never waited on.",
        env="BREAKWATER_JOURNAL_QUEUE_SIZE",
        minimum=1,
        maximum=10000000,
    )
    flush_interval_s: float = knob(
        0.5,
        "The writer writes what is queued at least this often (sooner when a batch fills).",
        env="BREAKWATER_JOURNAL_FLUSH_INTERVAL_S",
        minimum=0.001,
        maximum=3600,
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
        maximum=1000000000,
    )
    learn_window_s: float = knob(
        3600.0,
        "The latencies a learned timeout is computed from: this many recent seconds of attempts.",
        env="BREAKWATER_JOURNAL_LEARN_WINDOW_S",
        minimum=1.0,
        maximum=2592000,
    )
    learn_quantile: float = knob(
        0.999,
        "The latency quantile a learned timeout starts from (timed-out attempts count at their timeout).",
        env="BREAKWATER_JOURNAL_LEARN_QUANTILE",
        minimum=0.5,
        maximum=1.0,
    )
    learn_headroom: float = knob(
        2.0,
        "A learned timeout is the quantile times this factor.",
        env="BREAKWATER_JOURNAL_LEARN_HEADROOM",
        minimum=1.0,
        maximum=100,
    )
    learn_floor_s: float = knob(
        1.0,
        "Smallest learned timeout.",
        env="BREAKWATER_JOURNAL_LEARN_FLOOR_S",
        minimum=0.001,
        maximum=86400,
    )
    learn_ceiling_s: float = knob(
        120.0,
        "Largest learned timeout.",
        env="BREAKWATER_JOURNAL_LEARN_CEILING_S",
        minimum=0.001,
        maximum=86400,
    )
    learn_refresh_s: float = knob(
        60.0,
        "How often learned timeouts are recomputed from the journal (by the writer, off the call path).",
        env="BREAKWATER_JOURNAL_LEARN_REFRESH_S",
        minimum=0.01,
        maximum=86400,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_journal_url(self.url)
        if self.learn_ceiling_s < self.learn_floor_s:
            raise ConfigError(
                f"below learn_floor_s ({self.learn_floor_s})", key="learn_ceiling_s", fix="raise it or lower learn_floor_s"
            )


@dataclass(frozen=True, kw_only=True)
class TelemetryPolicy(Policy):
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
        maximum=86400,
    )


@dataclass(frozen=True, kw_only=True)
class StatePolicy(Policy):
    """Where breaker, retry-budget and learned-timeout state lives (`[state]`)."""

    url: str = knob(
        "",
        "Shared state store: empty = in this process only; redis://HOST:PORT/DB shares breakers and budgets between replicas.",
        env="BREAKWATER_STATE_URL",
    )
    namespace: str = knob(
        "breakwater",
        "Prefix of every key and channel in the shared store; one per deployment (replicas of one gateway share it).",
        env="BREAKWATER_STATE_NAMESPACE",
    )
    timeout_s: float = knob(
        0.05,
        "Longest wait for one store command; slower means the store is degraded and local state takes over.",
        env="BREAKWATER_STATE_TIMEOUT_S",
        minimum=0.001,
        maximum=60,
    )
    refresh_s: float = knob(
        1.0,
        "The local mirror is re-read this often besides pub/sub updates (bounds staleness if a message is lost).",
        env="BREAKWATER_STATE_REFRESH_S",
        minimum=0.01,
        maximum=3600,
    )
    retry_s: float = knob(
        0.5,
        "While degraded, the store is tried again this often.",
        env="BREAKWATER_STATE_RETRY_S",
        minimum=0.01,
        maximum=3600,
    )
    key_ttl_s: float = knob(
        86400.0,
        "Idle keys expire after this long (breaker state, budgets, learned timeouts), so nothing accumulates.",
        env="BREAKWATER_STATE_KEY_TTL_S",
        minimum=1.0,
        maximum=31536000,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.url.startswith(("redis://", "rediss://")):
            check_url_port(self.url, "url")
            database = urlsplit(self.url).path.strip("/")
            if database and not database.isdigit():
                raise ConfigError("the Redis URL's database is not a number", key="url", fix='use "redis://HOST:PORT/DB"')
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://", "memory://")):
            # The scheme only: a URL's user-info holds the store's password.
            scheme = self.url.split("://", 1)[0] if "://" in self.url else "(none)"
            raise ConfigError(
                f"unsupported state store scheme {scheme!r}",
                key="url",
                fix='use "redis://HOST:PORT/DB" (or leave it empty for in-process state)',
            )
        if not self.namespace or any(c in self.namespace for c in "{} \t\n"):
            raise ConfigError(f"invalid namespace {self.namespace!r}", key="namespace", fix="use letters, digits, - _ . :")
