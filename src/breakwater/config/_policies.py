"""Every policy object: frozen, keyword-only, validated on construction, each field a documented knob.

`[connect]`, `[call]`, `[breaker]` and `[retry]` apply per server (with per-server and per-tool
overrides); `[gateway]`, `[journal]`, `[state]` and `[telemetry]` configure breakwater itself (`_service_policies`). The
README's knob table is rendered from these classes (`make docs`), and a test keeps it in step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from breakwater._backoff import Backoff
from breakwater.config._knobs import Policy, knob
from breakwater.config._service_policies import GatewayPolicy, JournalPolicy, StatePolicy, TelemetryPolicy
from breakwater.errors import ConfigError

# All eight policies, the four of `_service_policies` included: the rest of the package imports them from here.
__all__ = [
    "GLOBAL_SECTIONS",
    "POLICY_SECTIONS",
    "BreakerPolicy",
    "CallPolicy",
    "ConnectPolicy",
    "GatewayPolicy",
    "JournalPolicy",
    "RetryPolicy",
    "StatePolicy",
    "TelemetryPolicy",
]


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
        path=True,
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
    protocol_memory_dir: str = knob(
        "",
        "Where each server's protocol revision is kept between starts (with auto); empty = the user cache dir, off = nowhere.",
        env="BREAKWATER_PROTOCOL_MEMORY_DIR",
        path=True,
        off=True,
    )
    inherit_env: str = knob(
        "all",
        "What a stdio server inherits of the environment breakwater (or the session attached to it) runs in: all of it, "
        "as Claude Code, Cursor and VS Code start theirs (a token exported in the shell reaches the server), or minimal: "
        "the MCP SDK's few (HOME, PATH, SHELL, TERM, USER, LOGNAME). Its entry's env goes on top either way; inherited "
        "values of credential-named variables are redacted like the entry's own.",
        env="BREAKWATER_CONNECT_INHERIT_ENV",
        choices=("all", "minimal"),
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
    max_result_bytes: int = knob(
        16 * 1024 * 1024,
        "Largest answer one call may bring back from a server, in bytes; a larger one is dropped unread and the "
        "call fails with RESULT_TOO_LARGE, never retried (per server, like max_in_flight).",
        env="BREAKWATER_CALL_MAX_RESULT_BYTES",
        minimum=1024,
        maximum=1024 * 1024 * 1024,
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
        "A call that runs as a task (one the server turned into a task, 2026-07-28, or a 2025-11-25 tool that "
        "requires one) is polled this long at most, then cancelled with tasks/cancel; a turn budget, when shorter, wins.",
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
        "less, or whose timeout is learned (its tail times the headroom): it turned slow, as an unlucky tool does not "
        "time out twice running; 0 = only the rules above.",
        env="BREAKWATER_BREAKER_TIMEOUTS_TO_TRIP",
        minimum=0,
        maximum=1_000_000,
    )
    probe_timeout_factor: float = knob(
        3.0,
        "A half-open probe of a tool with a known recent p99 gets this many times that p99 as its deadline "
        "(within probe_timeout_floor_s and the timeout), so a still-slow tool costs its probe little; 0 = the timeout.",
        env="BREAKWATER_BREAKER_PROBE_TIMEOUT_FACTOR",
        minimum=0.0,
        maximum=1000.0,
    )
    probe_timeout_floor_s: float = knob(
        0.1,
        "The shortest deadline a half-open probe gets.",
        env="BREAKWATER_BREAKER_PROBE_TIMEOUT_FLOOR_S",
        minimum=0.001,
        maximum=3600.0,
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
