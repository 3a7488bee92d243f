"""Every policy object: frozen, keyword-only, validated on construction, each field a documented knob.

`[connect]`, `[call]`, `[breaker]` and `[retry]` apply per server (with per-server and per-tool
overrides); `[gateway]`, `[journal]`, `[state]` and `[telemetry]` configure breakwater itself. The
README's knob table is rendered from these classes (`make docs`), and a test keeps it in step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from breakwater._backoff import Backoff
from breakwater.config._checks import check_journal_url, check_tool_name_template
from breakwater.config._knobs import Policy, knob
from breakwater.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ConnectPolicy(Policy):
    """How breakwater connects to one server: admission, timeouts, backoff and budget."""

    attempt_timeout_s: float = knob(
        30.0,
        "Time one connect attempt (spawn or HTTP connect, handshake, tools/list) may take.",
        env="BREAKWATER_CONNECT_ATTEMPT_TIMEOUT_S",
        minimum=0.1,
        maximum=3600,
    )
    budget_s: float = knob(
        150.0,
        "Total time for a round of connect attempts before the server is marked failed.",
        env="BREAKWATER_CONNECT_BUDGET_S",
        minimum=0.0,
        maximum=86400,
    )
    backoff_base_s: float = knob(
        1.0,
        "First retry delay ceiling; each retry waits a uniform draw up to base * 2^n.",
        env="BREAKWATER_CONNECT_BACKOFF_BASE_S",
        minimum=0.001,
        maximum=3600,
    )
    backoff_cap_s: float = knob(
        30.0,
        "Largest retry delay ceiling within the budget.",
        env="BREAKWATER_CONNECT_BACKOFF_CAP_S",
        minimum=0.001,
        maximum=3600,
    )
    background_retry_s: float = knob(
        60.0,
        "Mean delay between background attempts once a server has failed (jittered by +-50 %).",
        env="BREAKWATER_CONNECT_BACKGROUND_RETRY_S",
        minimum=0.1,
        maximum=86400,
    )
    startup_jitter_s: float = knob(
        0.5,
        "Initial connects are spread uniformly over this window.",
        env="BREAKWATER_CONNECT_STARTUP_JITTER_S",
        minimum=0.0,
        maximum=3600,
    )
    max_stdio_connects: int = knob(
        4,
        "Stdio servers spawning and handshaking at once on this machine (shared by breakwater processes).",
        env="BREAKWATER_CONNECT_MAX_STDIO",
        minimum=1,
        maximum=1024,
    )
    max_http_connects: int = knob(
        16,
        "HTTP connects in flight at once from one breakwater process.",
        env="BREAKWATER_CONNECT_MAX_HTTP",
        minimum=1,
        maximum=1024,
    )
    max_per_server_connects: int = knob(
        2,
        "Handshakes in flight to one server on this machine (shared by breakwater processes).",
        env="BREAKWATER_CONNECT_MAX_PER_SERVER",
        minimum=1,
        maximum=1024,
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
        maximum=86400,
    )
    protocol: str = knob(
        "auto",
        "Protocol revision: auto (probe once, then remember), 2026-07-28, or 2025-11-25.",
        env="BREAKWATER_PROTOCOL",
        choices=("auto", "2026-07-28", "2025-11-25"),
    )


@dataclass(frozen=True, kw_only=True)
class CallPolicy(Policy):
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
        maximum=86400,
    )
    idle_timeout_s: float | None = knob(
        None,
        "Once a call sends progress, the longest gap allowed between notifications; unset = timeout_s.",
        env="BREAKWATER_CALL_IDLE_TIMEOUT_S",
        minimum=0.001,
        maximum=86400,
    )
    max_s: float = knob(
        120.0,
        "Hard cap on one attempt, however much progress it sends (never below timeout_s).",
        env="BREAKWATER_CALL_MAX_S",
        minimum=0.001,
        maximum=86400,
    )
    max_in_flight: int = knob(
        32,
        "Calls in flight to one server at once (the bulkhead); one more is refused at once with OVERLOADED.",
        env="BREAKWATER_CALL_MAX_IN_FLIGHT",
        minimum=1,
        maximum=100000,
    )
    min_attempt_s: float = knob(
        0.25,
        "An attempt is not started with less than this left in the turn budget (or its timeout, if shorter).",
        env="BREAKWATER_CALL_MIN_ATTEMPT_S",
        minimum=0.0,
        maximum=3600,
    )
    slow_call_s: float | None = knob(
        None,
        "A call longer than this counts as slow for the breaker's slow-call rate; unset = slow calls are not counted.",
        env="BREAKWATER_CALL_SLOW_CALL_S",
        minimum=0.0,
        maximum=86400,
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
        maximum=2592000,
    )

    @property
    def idle_s(self) -> float:
        """The idle timeout in force (`idle_timeout_s`, else `timeout_s`)."""
        return self.timeout_s if self.idle_timeout_s is None else self.idle_timeout_s

    @property
    def hard_s(self) -> float:
        """The hard cap in force (`max_s`, raised to `timeout_s` if set lower)."""
        return max(self.max_s, self.timeout_s)


@dataclass(frozen=True, kw_only=True)
class GatewayPolicy(Policy):
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
        maximum=600,
    )
    list_wait_s: float = knob(
        5.0,
        "tools/list waits up to this long for connecting servers with no last-known tools, then answers with what "
        "it has (later changes go out as list_changed).",
        env="BREAKWATER_LIST_WAIT_S",
        minimum=0.0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tool_name_template(self.tool_name_template)


@dataclass(frozen=True, kw_only=True)
class JournalPolicy(Policy):
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
class BreakerPolicy(Policy):
    """When a breaker trips and how long it stays open.

    The defaults are for tools called a few times a minute, not for 100-call RPC windows: a
    2-minute window holds ~5 calls of a tool called 2–3 times a minute, so the rate rule (≥ 50 % of
    ≥ 5 calls) can fire at all; 4 consecutive failures catch a dead tool before a fifth caller pays
    its timeout (the target is ≤ 4 slow calls before the breaker opens; bench/slow_tool.py counts them). A false
    trip costs one ~5 s pause and one probe.
    """

    window_s: float = knob(
        120.0,
        "Sliding window over which failure and slow-call rates are measured.",
        env="BREAKWATER_BREAKER_WINDOW_S",
        minimum=1.0,
        maximum=86400,
    )
    minimum_calls: int = knob(
        5,
        "Calls needed in the window before a rate can trip the breaker.",
        env="BREAKWATER_BREAKER_MINIMUM_CALLS",
        minimum=1,
        maximum=1000000000,
    )
    failure_rate: float = knob(
        0.5,
        "Trip when this share of calls in the window failed (0–1).",
        env="BREAKWATER_BREAKER_FAILURE_RATE",
        minimum=0.0,
        maximum=1.0,
    )
    consecutive_failures: int = knob(
        4,
        "Trip after this many failures in a row, whatever the window says.",
        env="BREAKWATER_BREAKER_CONSECUTIVE_FAILURES",
        minimum=1,
        maximum=1000000000,
    )
    slow_call_rate: float = knob(
        0.8,
        "Trip when this share of calls in the window were slow (over the tool's expected latency; 0–1).",
        env="BREAKWATER_BREAKER_SLOW_CALL_RATE",
        minimum=0.0,
        maximum=1.0,
    )
    open_base_s: float = knob(
        5.0,
        "How long the breaker stays open the first time; doubles per consecutive re-open.",
        env="BREAKWATER_BREAKER_OPEN_BASE_S",
        minimum=0.001,
        maximum=86400,
    )
    open_max_s: float = knob(
        300.0,
        "The longest the breaker stays open.",
        env="BREAKWATER_BREAKER_OPEN_MAX_S",
        minimum=0.001,
        maximum=86400,
    )
    open_jitter: float = knob(
        0.2,
        "Random spread of the open duration (0.2 = ±20 %), so replicas do not probe in lock-step.",
        env="BREAKWATER_BREAKER_OPEN_JITTER",
        minimum=0.0,
        maximum=0.99,
    )
    probe_lease_s: float = knob(
        30.0,
        "A half-open probe that has not reported back after this long is given up and another is allowed.",
        env="BREAKWATER_BREAKER_PROBE_LEASE_S",
        minimum=0.001,
        maximum=86400,
    )
    timeouts_to_trip: int = knob(
        2,
        "Trip after this many timeouts in a row of a tool whose recent p99 latency is a quarter of its timeout or "
        "less (it turned slow; an unlucky tool does not time out twice running); 0 = only the rules above.",
        env="BREAKWATER_BREAKER_TIMEOUTS_TO_TRIP",
        minimum=0,
    )
    probe_timeout_factor: float = knob(
        3.0,
        "A half-open probe of a tool with a known recent p99 gets this many times that p99 as its deadline "
        "(within probe_timeout_floor_s and the timeout), so a still-slow tool costs its probe little; 0 = the timeout.",
        env="BREAKWATER_BREAKER_PROBE_TIMEOUT_FACTOR",
        minimum=0.0,
    )
    probe_timeout_floor_s: float = knob(
        0.1,
        "The shortest deadline a half-open probe gets.",
        env="BREAKWATER_BREAKER_PROBE_TIMEOUT_FLOOR_S",
        minimum=0.001,
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # rates within 0-1 and open_jitter below 1: their knobs' ranges
        if self.open_max_s < self.open_base_s:
            raise ConfigError(
                f"open_max_s ({self.open_max_s}) is below open_base_s ({self.open_base_s})",
                key="open_max_s",
                fix="raise open_max_s or lower open_base_s",
            )


@dataclass(frozen=True, kw_only=True)
class RetryPolicy(Policy):
    """How often and how patiently a failed call is retried.

    Retried: what a second attempt can fix — a connection refused or cut before the request was
    sent, a retryable error result, a server's retry-after. Not retried by default: a timeout. A
    deadline that passed is evidence the tool is slow now, and a retry would wait the whole timeout
    again (gRPC and Finagle do not retry deadline-exceeded by default either).
    """

    max_attempts: int = knob(
        3,
        "Attempts per call, the first one included (1 = never retry).",
        env="BREAKWATER_RETRY_MAX_ATTEMPTS",
        minimum=1,
        maximum=100,
    )
    retry_timeouts: bool = knob(
        False,
        "Also retry an attempt that timed out (off: a passed deadline means the tool is slow now, and a retry "
        "would wait the whole timeout again).",
        env="BREAKWATER_RETRY_RETRY_TIMEOUTS",
    )
    backoff_base_s: float = knob(
        0.5,
        "Ceiling of the random wait before the first retry; doubles per retry (full jitter).",
        env="BREAKWATER_RETRY_BACKOFF_BASE_S",
        minimum=0.001,
        maximum=3600,
    )
    backoff_cap_s: float = knob(
        10.0,
        "The longest wait between two attempts, before any retry-after hint.",
        env="BREAKWATER_RETRY_BACKOFF_CAP_S",
        minimum=0.001,
        maximum=3600,
    )
    max_retry_after_s: float = knob(
        30.0,
        "A server's retry-after hint longer than this is not waited for; the call fails instead.",
        env="BREAKWATER_RETRY_MAX_RETRY_AFTER_S",
        minimum=0.0,
        maximum=86400,
    )
    budget_ratio: float = knob(
        0.1,
        "Retry tokens a server earns per first-attempt success (0.1: retries may add about 10 %).",
        env="BREAKWATER_RETRY_BUDGET_RATIO",
        minimum=0.0,
        maximum=10.0,
    )
    budget_floor_per_min: float = knob(
        3.0,
        "Retry tokens a server earns per minute regardless of traffic, so rarely called tools can retry.",
        env="BREAKWATER_RETRY_BUDGET_FLOOR_PER_MIN",
        minimum=0.0,
        maximum=10000,
    )
    budget_max_tokens: float = knob(
        10.0,
        "Most retry tokens a server can bank (the bucket starts full).",
        env="BREAKWATER_RETRY_BUDGET_MAX_TOKENS",
        minimum=0.0,
        maximum=1000000000,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backoff_cap_s < self.backoff_base_s:
            raise ConfigError(
                f"backoff_cap_s ({self.backoff_cap_s}) is below backoff_base_s ({self.backoff_base_s})",
                key="backoff_cap_s",
                fix="raise backoff_cap_s or lower backoff_base_s",
            )

    @property
    def backoff(self) -> Backoff:
        """The full-jitter schedule these knobs describe."""
        return Backoff(base_s=self.backoff_base_s, cap_s=self.backoff_cap_s)

    def delay(self, retry: int, rng: random.Random, retry_after_s: float | None = None) -> float | None:
        """The wait before retry number `retry` (0 = first retry), or None if the hint is too long to wait.

        A server's retry-after is a floor: waiting less would only earn another refusal.
        """
        drawn = self.backoff.delay(retry, rng)
        if retry_after_s is None:
            return drawn
        if retry_after_s > self.max_retry_after_s:
            return None
        return max(drawn, retry_after_s)


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
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://", "memory://")):
            raise ConfigError(
                f"unsupported state store {self.url!r}",
                key="url",
                fix='use "redis://HOST:PORT/DB" (or leave it empty for in-process state)',
            )
        if not self.namespace or any(c in self.namespace for c in "{} \t\n"):
            raise ConfigError(f"invalid namespace {self.namespace!r}", key="namespace", fix="use letters, digits, - _ . :")


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
