"""The statistics math: per-tool figures over a window (`ToolStats`), nearest-rank percentiles,
the timeout in force and the timeout learned from recorded latencies.

Pure functions and frozen values: the stores compute `ToolStats` and `LearnInput`, the writer
turns `LearnInput` into learned timeouts with `learned_value`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from breakwater.config import CallPolicy, JournalPolicy, ServerSpec

__all__ = ["TIMEOUT_SOURCES", "LearnInput", "ToolStats", "learned_value", "percentile", "timeout_in_force"]


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-quantile of ascending values (PostgreSQL's `percentile_disc`); None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    return sorted_values[min(n, max(1, math.ceil(q * n))) - 1]


@dataclass(frozen=True, kw_only=True)
class ToolStats:
    """One tool's record over a window (what `breakwater stats` shows).

    Latency percentiles are over attempts that got an answer (`completed` or `tool_error`): a
    timeout says how long breakwater waited, not how long the tool took, so it shows in
    `timeout_rate` instead.
    """

    server: str
    tool: str
    #: Logical calls (rows with attempt 1), but those refused for the caller's own request (`CALLERS_OWN_OUTCOMES`).
    calls: int
    #: Calls with a completed attempt (or settled as completed by reconciliation).
    succeeded: int
    #: Attempts sent upstream (refusals excluded).
    attempts: int
    #: Attempts refused before anything was sent (open breaker, full bulkhead, spent budget…).
    refused: int
    timeouts: int
    outcome_unknown: int
    breaker_opens: int
    #: Attempts sent after the first of their call.
    retries: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    #: The timeout learned from this window's latencies, if there are enough (see `Journal.learned_timeout`).
    learned_timeout_s: float | None = None
    #: The per-attempt timeout a call of this tool gets now, and where it comes from: `configured`
    #: (the tool's or its server's own table), `learned`, or `default` (see `timeout_in_force`).
    timeout_s: float | None = None
    timeout_source: str | None = None

    @property
    def success_rate(self) -> float | None:
        """Calls that completed / calls."""
        return self.succeeded / self.calls if self.calls else None

    @property
    def timeout_rate(self) -> float | None:
        """Attempts that timed out / attempts sent."""
        return self.timeouts / self.attempts if self.attempts else None

    @property
    def retries_per_call(self) -> float | None:
        """Retries sent, per call."""
        return self.retries / self.calls if self.calls else None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, with the derived rates."""
        out = asdict(self)
        out["success_rate"] = self.success_rate
        out["timeout_rate"] = self.timeout_rate
        out["retries_per_call"] = self.retries_per_call
        return out


@dataclass(frozen=True, kw_only=True)
class LearnInput:
    """What a learned timeout is computed from, for one tool over the learning window."""

    server: str
    tool: str
    #: Completed attempts in the window (the minimum-samples test counts these).
    completed: int
    #: The learning quantile of answered and timed-out attempts' durations.
    quantile_s: float | None
    #: The learning quantile of the answered attempts' durations alone (None when unknown).
    answered_quantile_s: float | None = None
    #: Attempts in the window that the tool's timeout cut, and all attempts the quantiles count.
    cut: int = 0
    attempts: int = 0

    @classmethod
    def of(cls, server: str, tool: str, completed: int, samples: list[float], answered: list[float], q: float) -> LearnInput:
        """From the window's durations: `samples` (answered and cut), `answered` (those the tool answered)."""
        return cls(
            server=server,
            tool=tool,
            completed=completed,
            quantile_s=percentile(sorted(samples), q),
            answered_quantile_s=percentile(sorted(answered), q),
            cut=len(samples) - len(answered),
            attempts=len(samples),
        )


#: Where the timeout in force comes from (the gate's order: configured, learned, default).
TIMEOUT_SOURCES = ("configured", "learned", "default")


def timeout_in_force(spec: ServerSpec | None, tool: str, learned: float | None) -> tuple[float, str]:
    """The per-attempt timeout the gate gives `tool` of `spec`, and its source (one of `TIMEOUT_SOURCES`).

    The gate's order: the tool's own `timeout_s`, its server's own `[servers.NAME.call] timeout_s`
    (both `configured`), a learned value, else the `[call]` default. `spec` None (a journal read
    without the config that wrote it) knows no configured values and the built-in default.
    """
    own = spec.tools.get(tool) if spec is not None else None
    if own is not None and "timeout_s" in own.explicit:
        return own.call.timeout_s, "configured"
    if spec is not None and "timeout_s" in spec.call_explicit:
        return spec.call.timeout_s, "configured"
    if learned is not None and learned > 0:
        return learned, "learned"
    if own is not None:
        return own.call.timeout_s, spec.default_timeout_source if spec is not None else "default"
    return (spec.call if spec is not None else CallPolicy()).timeout_s, spec.default_timeout_source if spec else "default"


#: Cuts that lift the quantile more than this many times the answered attempts' own quantile are hangs, not the
#: tool's latency (a lognormal tail rarely reaches 4x its p99: the gate's `FAR_BELOW`)...
HANG_FACTOR = 4.0
#: ...when they are at most this share of the window's attempts. More is the tool turning slower: every call cut.
HANG_SHARE = 0.1


def learned_value(inp: LearnInput, policy: JournalPolicy) -> float | None:
    """A tool's learned timeout: its quantile times the headroom, clamped; None below the minimum samples.

    A timed-out attempt counts at its timeout, so a tool that turned slower than its timeout gets a longer one. But a
    few hangs far beyond every answer are not its latency: counted, each short slow spell doubled the timeout (1, 2,
    4, 8 s for a tool that answers in 0.1 s) for the whole window, and the agent waited that much longer at the next.
    Many cuts raise it, but at most to `HANG_FACTOR` times the answers' own quantile: a tool stuck for minutes is
    an incident for the breaker, and each refresh doubled its timeout (0.2 s tool: 1, 2, 4, 8, 16.5 s, kept for the
    window), so every call after it recovered and slowed again waited that long.
    """
    if inp.completed < policy.learn_min_samples or inp.quantile_s is None:
        return None
    quantile, answered = inp.quantile_s, inp.answered_quantile_s
    if answered is not None and quantile > answered * HANG_FACTOR:
        quantile = answered if inp.cut <= HANG_SHARE * inp.attempts else answered * HANG_FACTOR
    floor = min(policy.learn_floor_s, policy.learn_ceiling_s)
    return min(policy.learn_ceiling_s, max(floor, quantile * policy.learn_headroom))
