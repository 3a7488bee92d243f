"""Prometheus metrics for `breakwater serve --http`, kept in process.

`Metrics` is an `AttemptObserver` (see `breakwater.journal`): the call gate hands it every attempt
and refusal beside the journal, and it keeps counters, a latency histogram, each tool's last few
attempts (the status page's sparklines) and the latest failures. `CallCounter` is an MCP server
middleware that counts whole calls at the gateway's edge by the outcome the agent saw, including
calls refused before they reach the gate (server connecting or failed, unknown tool). A call
answered with a gateway task's handle is counted when the task ends, with its outcome and the
whole duration (`breakwater.gateway._tasks.when_ended`).

Gauges (server and breaker states, retry budgets, in-flight calls, the journal's queue and drops,
the timeout in force) are read from the `Breakwater` when scraped, so they cost nothing between
scrapes. `render()` writes the Prometheus text exposition format (version 0.0.4) by hand: HELP and
TYPE lines, escaped label values, every name prefixed `breakwater_`.

Everything here runs on the event loop that runs the calls; `record()` is a few dictionary
operations and one `bisect`, no lock. A scrape from another thread would read counters that are
at worst one increment behind, never a torn structure: it copies each dict before walking it.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from breakwater._clock import Clock, SystemClock
from breakwater._wire import ERROR_META_KEY
from breakwater.errors import ErrorCode
from breakwater.gateway._tasks import when_ended
from breakwater.journal import ANSWERED_OUTCOMES, RECONCILED, REFUSAL_OUTCOMES, AttemptRecord, outcome_of

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

    from breakwater._breakwater import Breakwater
    from breakwater.gateway._resume import ResumableStreams
    from breakwater.status import ServerStatus
    from breakwater.tasks import TaskInfo

__all__ = [
    "BUILTIN_SERVER",
    "CONTENT_TYPE",
    "DURATION_BUCKETS_S",
    "UNLISTED",
    "CallCounter",
    "Metrics",
    "Resolver",
    "escape_label",
]

#: The Content-Type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Upper bounds of the duration histograms' buckets, in seconds: tool calls run from milliseconds to minutes.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Attempts kept per tool for the status page's sparkline.
SPARK_POINTS = 60
#: Failures kept for the status page.
RECENT_FAILURES = 50
#: The label a call's tool gets when its name is not one the gateway lists: an agent can send any
#: name, and every distinct label value is a new series the scraper must keep.
UNLISTED = "(unlisted)"
BUILTIN_SERVER = "(builtin)"

#: (downstream name, server named by the error envelope or None) -> (server, tool), or None if not listed.
Resolver = Callable[[str, str | None], tuple[str, str] | None]

_NOT_FAILURES = frozenset({"completed", RECONCILED})
_ANSWERED = frozenset(ANSWERED_OUTCOMES)
_UNSENT = frozenset({*REFUSAL_OUTCOMES, RECONCILED})
_ERROR_CODES = frozenset(c.value for c in ErrorCode)


class _Histogram:
    """Bucket counts (not cumulative until rendered), sum and count."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(DURATION_BUCKETS_S) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le = "less or equal").
        self.buckets[bisect.bisect_left(DURATION_BUCKETS_S, seconds)] += 1
        self.sum += seconds
        self.count += 1


@dataclass(slots=True)
class _ToolSeries:
    """What one (server, tool) has seen since the process started."""

    attempts: dict[str, int] = field(default_factory=dict)
    latency: _Histogram = field(default_factory=_Histogram)
    breaker_opens: int = 0
    #: (started_at wall seconds, duration seconds, outcome) of the latest attempts sent upstream.
    recent: deque[tuple[float, float, str]] = field(default_factory=lambda: deque(maxlen=SPARK_POINTS))


@dataclass(slots=True)
class _CallSeries:
    outcomes: dict[str, int] = field(default_factory=dict)
    duration: _Histogram = field(default_factory=_Histogram)


class Metrics:
    """Counters and histograms fed by the call gate (as an `AttemptObserver`) and the gateway's edge.

    ```python
    metrics = Metrics()
    async with Breakwater(config, observers=[metrics]) as bw:
        ...
        text = metrics.render(bw)   # Prometheus text format
    ```
    """

    def __init__(self) -> None:
        self._tools: dict[tuple[str, str], _ToolSeries] = {}
        self._calls: dict[tuple[str, str], _CallSeries] = {}
        self._failures: deque[AttemptRecord] = deque(maxlen=RECENT_FAILURES)
        #: Wall-clock time this instance was made (the process's start, for the gateway).
        self.started_at = time.time()
        #: The HTTP app's resumable streams (`breakwater.gateway._resume`), when it has them.
        self.streams: ResumableStreams | None = None
        #: The 2025-11-25 sessions this replica holds open (the HTTP app's session manager), when it serves HTTP.
        self.sessions: Callable[[], int] | None = None

    # ---- the call path ------------------------------------------------------------------------

    @property
    def record_sizes(self) -> bool:
        """Never: metrics have no use for argument sizes, so they never make the gate compute them."""
        return False

    def record(self, record: AttemptRecord) -> bool:
        """Count one attempt or refusal. Never blocks, never raises for a well-formed record."""
        key = (record.server, record.tool)
        series = self._tools.get(key)
        if series is None:
            series = self._tools[key] = _ToolSeries()
        outcome = record.outcome
        series.attempts[outcome] = series.attempts.get(outcome, 0) + 1
        if outcome in _ANSWERED:
            series.latency.observe(record.duration_s)
        if outcome not in _UNSENT:
            series.recent.append((record.started_at, record.duration_s, outcome))
        if record.breaker_opened:
            series.breaker_opens += 1
        if outcome not in _NOT_FAILURES:
            self._failures.append(record)
        return True

    def count_call(self, server: str, tool: str, outcome: str, duration_s: float) -> None:
        """Count one whole call as the downstream agent saw it (what `CallCounter` reports)."""
        key = (server, tool)
        series = self._calls.get(key)
        if series is None:
            series = self._calls[key] = _CallSeries()
        series.outcomes[outcome] = series.outcomes.get(outcome, 0) + 1
        series.duration.observe(duration_s)

    # ---- reads for the status page -------------------------------------------------------------

    def recent_points(self, server: str, tool: str) -> list[tuple[float, float, str]]:
        """The tool's latest attempts sent upstream, oldest first: (started_at, duration_s, outcome)."""
        series = self._tools.get((server, tool))
        return [] if series is None else list(series.recent)

    def recent_failures(self, limit: int = RECENT_FAILURES) -> list[AttemptRecord]:
        """The latest attempts that did not complete (refusals included), newest first."""
        failures = list(self._failures)
        failures.reverse()
        return failures[:limit]

    def attempt_counts(self, server: str, tool: str) -> dict[str, int]:
        """Attempts (and refusals) of one tool since start, by outcome."""
        series = self._tools.get((server, tool))
        return {} if series is None else dict(series.attempts)

    # ---- the exposition ------------------------------------------------------------------------

    def render(self, bw: Breakwater | None = None) -> str:
        """Every metric in the Prometheus text format; gauges from `bw` when given."""
        out = _Writer()
        tools = dict(self._tools)
        calls = dict(self._calls)
        out.family(
            "breakwater_calls_total",
            "counter",
            "Tool calls through the gateway, by the outcome the agent saw (completed, tool_error, or the error code "
            "in lower case). Counted at the gateway's edge, so calls refused before the call gate count too.",
            (
                ({"server": s, "tool": t, "outcome": o}, n)
                for (s, t), c in sorted(calls.items())
                for o, n in sorted(c.outcomes.items())
            ),
        )
        out.histogram(
            "breakwater_call_duration_seconds",
            "Whole-call time at the gateway's edge: every attempt, retry wait and reconciliation of one call.",
            (({"server": s, "tool": t}, c.duration) for (s, t), c in sorted(calls.items())),
        )
        out.family(
            "breakwater_attempts_total",
            "counter",
            "Attempts sent upstream by outcome, plus refusals before sending (circuit_open, overloaded, "
            "budget_exhausted) and reconciliations; the journal's rows.",
            (
                ({"server": s, "tool": t, "outcome": o}, n)
                for (s, t), r in sorted(tools.items())
                for o, n in sorted(r.attempts.items())
            ),
        )
        out.histogram(
            "breakwater_attempt_duration_seconds",
            "Duration of attempts that got an answer (completed or tool_error); timeouts are counted in "
            "breakwater_attempts_total instead, as `breakwater stats` does.",
            (({"server": s, "tool": t}, r.latency) for (s, t), r in sorted(tools.items())),
        )
        out.family(
            "breakwater_breaker_opens_total",
            "counter",
            "Attempts whose failure opened a breaker (the tool's or its server's).",
            (({"server": s, "tool": t}, r.breaker_opens) for (s, t), r in sorted(tools.items())),
        )
        if self.streams is not None:
            out.family(
                "breakwater_streams_resumed_total",
                "counter",
                "2025-11-25 SSE streams this replica replayed to a client that reconnected with Last-Event-ID.",
                [({}, self.streams.resumed)],
            )
            out.family(
                "breakwater_streams_orphaned_total",
                "counter",
                "Calls a resumed stream answered with OUTCOME_UNKNOWN because the replica running them was gone.",
                [({}, self.streams.orphaned)],
            )
        if self.sessions is not None:
            out.family(
                "breakwater_http_sessions",
                "gauge",
                "2025-11-25 sessions this replica holds open (each until DELETE or [gateway] session_ttl_s idle); "
                "past 10,000 a new one is refused 503.",
                [({}, self.sessions())],
            )
        if bw is not None:
            _render_gauges(out, bw)
        out.family("breakwater_start_time_seconds", "gauge", "When this process started (Unix seconds).", [({}, self.started_at)])
        return out.text()

    def middleware(self, resolve: Resolver) -> CallCounter:
        """The MCP server middleware that feeds `breakwater_calls_total` (see `CallCounter`)."""
        return CallCounter(self, resolve)


def _render_gauges(out: _Writer, bw: Breakwater) -> None:
    """Every gauge (and the counters kept outside the call path), one family group at a time."""
    statuses = bw.status().servers
    _render_servers(out, statuses)
    _render_breakers(out, bw)
    _render_timeouts(out, bw, statuses)
    _render_retry_budgets(out, bw)
    _render_journal_and_store(out, bw)


def _render_servers(out: _Writer, statuses: Sequence[ServerStatus]) -> None:
    from breakwater.status import ServerState

    out.family(
        "breakwater_server_state",
        "gauge",
        "1 for the state each configured server is in, 0 for the others (pending, connecting, ready, retrying, "
        "failed, disabled).",
        (({"server": s.name, "state": state.value}, int(s.state is state)) for s in statuses for state in ServerState),
    )
    out.family(
        "breakwater_server_tools",
        "gauge",
        "Tools a ready server lists.",
        (({"server": s.name}, s.tools) for s in statuses if s.tools is not None),
    )


def _render_breakers(out: _Writer, bw: Breakwater) -> None:
    breakers = []
    for breaker in bw.gate.breakers:
        breakers.append((breaker.key.server, breaker.key.tool or "", breaker.state.value))
    breakers.sort()
    out.family(
        "breakwater_breaker_state",
        "gauge",
        'Breaker states: 1 for the state each breaker is in (closed, open, half_open). tool="" is the server\'s own breaker.',
        (
            ({"server": server, "tool": tool, "state": state}, int(current == state))
            for server, tool, current in breakers
            for state in ("closed", "open", "half_open")
        ),
    )


def _render_timeouts(out: _Writer, bw: Breakwater, statuses: Sequence[ServerStatus]) -> None:
    from breakwater.status import ServerState

    timeouts = []
    for s in statuses:
        if s.state is not ServerState.READY:
            continue
        for listed in bw.upstream(s.name).tools:
            seconds = bw.gate.resolved_timeout(s.name, listed.name)
            if seconds is not None:
                timeouts.append(({"server": s.name, "tool": listed.name}, seconds))
    out.family(
        "breakwater_timeout_seconds",
        "gauge",
        "The per-attempt timeout a call of each tool of a ready server gets now (configured or learned).",
        timeouts,
    )


def _render_retry_budgets(out: _Writer, bw: Breakwater) -> None:
    budgets = bw.gate.retry_budget_snapshots()
    out.family(
        "breakwater_retry_budget_tokens",
        "gauge",
        "Retries each server's retry budget could grant now.",
        (({"server": name}, b.tokens) for name, b in sorted(budgets.items())),
    )
    out.family(
        "breakwater_retries_total",
        "counter",
        "Retries asked of each server's retry budget, by decision (granted or refused).",
        (
            ({"server": name, "decision": decision}, n)
            for name, b in sorted(budgets.items())
            for decision, n in (("granted", b.retries_granted), ("refused", b.retries_refused))
        ),
    )
    out.family(
        "breakwater_in_flight",
        "gauge",
        "Calls in flight to each server (what its bulkhead counts).",
        (({"server": name}, n) for name, n in sorted(bw.gate.in_flight().items())),
    )


def _render_journal_and_store(out: _Writer, bw: Breakwater) -> None:
    journal = bw.journal
    if journal is not None:
        out.family("breakwater_journal_queued", "gauge", "Attempts waiting to be written to the journal.", [({}, journal.queued)])
        out.family(
            "breakwater_journal_dropped_total",
            "counter",
            "Attempts the journal dropped because its queue was full.",
            [({}, journal.dropped)],
        )
        out.family(
            "breakwater_journal_write_failures_total",
            "counter",
            "Attempts the journal's store refused to write.",
            [({}, journal.failed)],
        )
    store = bw.state_store_status()
    out.family(
        "breakwater_state_store_degraded",
        "gauge",
        "1 while the shared state store is unreachable and breakers and budgets run on local state.",
        [({"backend": str(store.get("backend", ""))}, int(store.get("state") == "degraded"))],
    )


class CallCounter:
    """MCP server middleware: counts each `tools/call` with the outcome the agent got, and times it.

    `resolve(name, server)` maps a downstream tool name to (server, tool) for the names the gateway
    lists; `server` is the one the error envelope names, if any (a failed server's tools may never
    have been listed). Any other name is counted as `UNLISTED`, so an agent cannot grow the label
    set without bound.
    """

    #: It counts calls and never rewrites them: the lanes' kernel keeps it (`_fast_call.PASSIVE_FOR_CALLS`).
    breakwater_for_calls = "keep"

    def __init__(self, metrics: Metrics, resolve: Resolver, *, clock: Clock | None = None) -> None:
        self._metrics = metrics
        self._resolve = resolve
        self._clock: Clock = clock or SystemClock()

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        name = params.get("name")
        started = self._clock.monotonic()
        outcome = "protocol_error"
        named: str | None = None
        later = False
        try:
            result = await call_next(ctx)
            if (task_id := _task_handle_id(result)) is not None:
                # Answered with a gateway task's handle: what the agent sees is the task's end, counted then.
                later = when_ended(task_id, lambda task: self._count(name, *_task_outcome(task), started))
            outcome, named = _call_outcome(result)
            return result
        except BaseException as exc:
            # The caller went away (or the server is stopping): the call never answered.
            if not isinstance(exc, Exception):
                outcome = "cancelled"
            raise
        finally:
            if not later:
                self._count(name, outcome, named, started)

    def _count(self, name: Any, outcome: str, named: str | None, started: float) -> None:
        target = self._resolve(name, named) if isinstance(name, str) else None
        server, tool = target if target is not None else ("", UNLISTED)
        self._metrics.count_call(server, tool, outcome, self._clock.monotonic() - started)


def _task_handle_id(result: Any) -> str | None:
    """The task id of a `tools/call` answered with a task handle, else None."""
    if isinstance(result, Mapping) and result.get("resultType") == "task" and isinstance(result.get("taskId"), str):
        return str(result["taskId"])
    return None


def _task_outcome(task: TaskInfo) -> tuple[str, str | None]:
    """A gateway task's end as `_call_outcome` names a call's: the result's, a JSON-RPC error, or cancelled."""
    if task.status == "completed":
        return _call_outcome(task.result)
    return ("protocol_error" if task.status == "failed" else "cancelled"), None


def _call_outcome(result: Any) -> tuple[str, str | None]:
    """From a `tools/call` result: `completed`, `tool_error` or the envelope's code in lower case, and
    the server the envelope names (None without an envelope)."""
    if result is None:
        return "completed", None
    if not isinstance(result, Mapping):
        dump = getattr(result, "model_dump", None)
        result = dump(by_alias=True) if callable(dump) else {}
    if not result.get("isError"):
        return "completed", None
    meta = result.get("_meta")
    moved = meta.get(ERROR_META_KEY) if isinstance(meta, Mapping) else None  # a tool with an output schema: `fitted`
    data = moved if isinstance(moved, Mapping) else result.get("structuredContent")
    if isinstance(data, Mapping) and data.get("ok") is False and data.get("code") in _ERROR_CODES:
        server = data.get("server")
        return outcome_of(str(data["code"])), server if isinstance(server, str) else None
    return "tool_error", None


# ---- the text format ------------------------------------------------------------------------------


def escape_label(value: str) -> str:
    """A label value for the text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items()) + "}"


_HistogramSamples = Iterable[tuple[Mapping[str, str], _Histogram]]


class _Writer:
    def __init__(self) -> None:
        self._lines: list[str] = []

    def _head(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} {kind}")

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """One counter or gauge family (HELP and TYPE even when it has no samples yet)."""
        self._head(name, kind, help_text)
        self._lines.extend(f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples)

    def histogram(self, name: str, help_text: str, samples: _HistogramSamples) -> None:
        self._head(name, "histogram", help_text)
        for labels, h in samples:
            self._lines.extend(_histogram_lines(name, labels, h))

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _histogram_lines(name: str, labels: Mapping[str, str], h: _Histogram) -> Iterator[str]:
    running = 0
    counts = list(h.buckets)
    for bound, n in zip((*DURATION_BUCKETS_S, math.inf), counts, strict=True):
        running += n
        yield f"{name}_bucket{_labels({**labels, 'le': _number(bound)})} {running}"
    # Count from the same copy as the buckets, so +Inf always equals _count in one scrape.
    yield f"{name}_sum{_labels(labels)} {_number(h.sum)}"
    yield f"{name}_count{_labels(labels)} {running}"
