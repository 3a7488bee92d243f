"""The call journal: every attempt of every call, recorded off the call path.

The call gate hands each attempt (and each refusal: open breaker, full bulkhead, spent budget) to
`Journal.record()` as an `AttemptRecord`. `record()` only appends to a bounded in-memory queue: no
lock, no I/O, no await, so it costs a few hundred nanoseconds whatever the disk or the database is
doing. A background thread drains the queue in batches into a store:

* `SQLiteJournalStore`: the embedded default, one file in the user's data directory, WAL;
* `PostgresJournalStore`: a journal shared by a team (`postgresql://…`), psycopg 3, same schema.

When the queue is full the attempt is dropped and counted (`Journal.dropped`): a slow or full disk
costs history, never latency. The same thread deletes attempts older than the retention and, every
`learn_refresh_s`, recomputes the learned timeouts (`Journal.learned_timeout`), so the gate's
lookup is one dictionary read. Learned values come from the stored attempts, so they survive a
restart as soon as the writer's first refresh has run.

Arguments and results are never stored: they may hold personal data. `record_sizes` opts in to
their sizes and a hash of the arguments (for idempotency debugging), computed by the caller.

Times in the journal are wall-clock seconds (`Clock.time()`): attempts from several processes and
hosts land in one table, and people read them as dates.
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import json
import logging
import math
import operator
import os
import sqlite3
import threading
import time as _time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from breakwater import _paths
from breakwater._clock import Clock, SystemClock
from breakwater.config import CallPolicy, Config, JournalPolicy, ServerSpec
from breakwater.errors import ErrorCode

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "ANSWERED_OUTCOMES",
    "DOWNSTREAM_CLIENT",
    "HISTOGRAM_ACCURACY",
    "JOURNAL_DB_ENV",
    "RECONCILED",
    "REFUSAL_OUTCOMES",
    "ROLLUP_BUCKET_S",
    "SCHEMA_VERSION",
    "TIMEOUT_SOURCES",
    "TRACE_ID",
    "AttemptObserver",
    "AttemptRecord",
    "CallTracer",
    "Journal",
    "JournalError",
    "JournalStore",
    "LearnInput",
    "PostgresJournalStore",
    "SQLiteJournalStore",
    "ToolStats",
    "arguments_digest",
    "default_journal_path",
    "fan_out",
    "histogram_quantiles",
    "learned_value",
    "new_call_id",
    "open_store",
    "outcome_of",
    "parse_duration",
    "percentile",
    "summarize",
    "timeout_in_force",
]

log = logging.getLogger("breakwater.journal")

#: Overrides where the embedded SQLite journal lives (when `[journal] url` is empty).
JOURNAL_DB_ENV = "BREAKWATER_JOURNAL_DB"
#: The schema this code writes; stores migrate older schemas up to it and refuse newer ones.
SCHEMA_VERSION = 2

#: The downstream client (the agent's MCP client name) of the call running in this context; the gateway sets it.
DOWNSTREAM_CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("breakwater_downstream_client", default=None)
#: The trace the call running in this context belongs to (OpenTelemetry will set it); None = the call id.
TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("breakwater_trace_id", default=None)

#: Outcomes of attempts that got an answer: their durations are the tool's latency.
ANSWERED_OUTCOMES = ("completed", "tool_error")
#: Outcomes of calls refused before anything was sent upstream.
REFUSAL_OUTCOMES = (
    "circuit_open",
    "overloaded",
    "budget_exhausted",
    "server_connecting",
    "server_unavailable",
    "unknown_tool",
    "tool_changed",
    "invalid_arguments",
)
#: A call settled by asking the server what became of its operation (`get_operation` answered
#: `completed`): a success, but not an attempt of the tool.
RECONCILED = "reconciled"
# What a learned timeout is computed from: answers, plus timeouts at the time they were cut (a
# censored sample is at least that long; leaving it out would teach the gate ever shorter timeouts).
_LEARN_OUTCOMES = (*ANSWERED_OUTCOMES, "timeout")

_PURGE_INTERVAL_S = 300.0
_BATCH = 512
_REOPEN_S = 5.0
_TABLE = "breakwater_attempts"
_ROLLUP_TABLE = "breakwater_rollups"
_BACKFILL_PAGE = 20_000
_VERSION_TABLE = "breakwater_journal_schema_version"


class JournalError(Exception):
    """The journal's store cannot be used (unknown URL, a schema newer than this code, no driver)."""


# ---------------------------------------------------------------------------------------------- records


@dataclass(slots=True, kw_only=True)
class AttemptRecord:
    """One attempt of one logical call, or one refusal (then `duration_s` is 0).

    Not frozen on purpose: a frozen dataclass's `__init__` goes through `object.__setattr__` per
    field, which would triple the cost of building one on the call path.
    """

    server: str
    tool: str
    #: The logical call: every attempt (and reconciliation) of one call shares it.
    call_id: str
    #: 1 for the first attempt, counting every send (a re-send of the same attempt counts too); a
    #: refusal carries the number the refused attempt would have had. Each call has exactly one row
    #: with attempt 1: `stats` counts calls that way.
    attempt: int
    #: Wall-clock seconds (`Clock.time()`) when the attempt started.
    started_at: float
    duration_s: float
    #: `completed`, `tool_error`, `timeout`, `cancelled`, `upstream_error`, `outcome_unknown`,
    #: `circuit_open`, `budget_exhausted`, `overloaded`, … (`outcome_of(code)`).
    outcome: str
    #: The error code the caller saw for this attempt (None when it completed).
    error_code: str | None = None
    #: Retries made in this call before this attempt.
    retries: int = 0
    trace_id: str | None = None
    operation_id: str | None = None
    #: Breaker states just after the attempt was recorded by the breakers.
    server_breaker: str | None = None
    tool_breaker: str | None = None
    #: This attempt's failure opened a breaker (tool or server).
    breaker_opened: bool = False
    #: The downstream client's name (the agent's MCP client), when known.
    client: str | None = None
    #: Opt-in (`record_sizes`): JSON sizes in bytes and a short hash of the arguments.
    arguments_size: int | None = None
    result_size: int | None = None
    arguments_hash: str | None = None


_COLUMNS: tuple[str, ...] = tuple(AttemptRecord.__dataclass_fields__)
# One C call per row instead of a generator of getattr calls: the writer's main per-row cost.
_as_row = operator.attrgetter(*_COLUMNS)


def outcome_of(code: ErrorCode | str | None) -> str:
    """The journal outcome for the error code an attempt ended with (None: `completed`).

    Both breakers' refusals are `circuit_open` (the code keeps which one); everything else is the
    code in lower case.
    """
    if code is None:
        return "completed"
    value = code.value if isinstance(code, ErrorCode) else code
    if value == ErrorCode.SERVER_CIRCUIT_OPEN.value:
        return "circuit_open"
    return value.lower()


_call_prefix = uuid.uuid4().hex[:12]
_call_counter = itertools.count(1)


def new_call_id() -> str:
    """A call id unique across processes, at a fraction of `uuid4()`'s cost (a per-process prefix and a counter)."""
    return f"{_call_prefix}-{next(_call_counter)}"


def arguments_digest(arguments: Mapping[str, Any] | None) -> tuple[int, str]:
    """The arguments' canonical JSON size in bytes and a 16-hex-digit SHA-256 prefix (for `record_sizes`).

    Equal arguments hash equal whatever their key order, so a retry that changed its arguments
    shows up as a different hash beside the same operation id.
    """
    blob = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), default=str).encode()
    return len(blob), hashlib.sha256(blob).hexdigest()[:16]


class AttemptObserver(Protocol):
    """What the call gate hands every attempt to. `record()` must be cheap and never block or raise."""

    @property
    def record_sizes(self) -> bool:
        """Whether the gate should fill in argument/result sizes and the argument hash (costs a JSON dump)."""
        ...

    def record(self, record: AttemptRecord) -> bool:
        """Take one attempt; False if it was dropped."""
        ...


class CallTracer(Protocol):
    """What the call gate tells about each logical call as a whole (OpenTelemetry's call span).

    `call_started` runs in the caller's task before the call's first attempt (and before the
    journal reads `TRACE_ID`); whatever it returns is handed back to `call_finished` with the
    exception that ended the call (None: it returned a result). Both must be cheap and never raise.
    """

    def call_started(self, server: str, tool: str, operation_id: str | None) -> Any:
        """The call is about to make its first attempt."""
        ...

    def call_finished(self, handle: Any, error: BaseException | None) -> None:
        """The call is over: answered (`error` None), failed with a `CallError`, or cancelled."""
        ...


class _FanOut:
    """Several observers as one: the gate keeps a single observer reference on its hot path."""

    def __init__(self, observers: Sequence[AttemptObserver]) -> None:
        self._observers = tuple(observers)
        self.record_sizes = any(o.record_sizes for o in self._observers)

    def record(self, record: AttemptRecord) -> bool:
        kept = True
        for o in self._observers:
            kept = o.record(record) and kept
        return kept


def fan_out(observers: Sequence[AttemptObserver]) -> AttemptObserver | None:
    """One observer handing each record to all of `observers` (None for none, the observer itself for one)."""
    if not observers:
        return None
    if len(observers) == 1:
        return observers[0]
    return _FanOut(observers)


# ---------------------------------------------------------------------------------------------- statistics


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
    #: Logical calls (rows with attempt 1).
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


def learned_value(inp: LearnInput, policy: JournalPolicy) -> float | None:
    """A tool's learned timeout: its quantile times the headroom, clamped; None below the minimum samples."""
    if inp.completed < policy.learn_min_samples or inp.quantile_s is None:
        return None
    floor = min(policy.learn_floor_s, policy.learn_ceiling_s)
    return min(policy.learn_ceiling_s, max(floor, inp.quantile_s * policy.learn_headroom))


# ---------------------------------------------------------------------------------------------- rollups

#: Rollup granularity: one row per (server, tool, minute) of attempts' start times.
ROLLUP_BUCKET_S = 60
#: Every percentile `stats` reads from a rollup is within this relative distance of the exact one
#: (the nearest-rank value of the same attempts): latencies are counted in log-spaced cells
#: (ratio `(1 + a) / (1 - a)`) and a cell stands for the value that halves its relative width.
HISTOGRAM_ACCURACY = 0.01
_GAMMA = (1 + HISTOGRAM_ACCURACY) / (1 - HISTOGRAM_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
# Zero-length answers (a fake clock, a cached reply) have no logarithm: a cell of their own.
_ZERO_CELL = "z"
_SENT_EXCLUDED = frozenset((*REFUSAL_OUTCOMES, RECONCILED))
_REFUSALS = frozenset(REFUSAL_OUTCOMES)
_ANSWERED = frozenset(ANSWERED_OUTCOMES)


def _cell(duration_s: float) -> str:
    return str(math.ceil(math.log(duration_s) / _LOG_GAMMA)) if duration_s > 0 else _ZERO_CELL


def _cell_value(cell: str) -> float:
    # The cell (g^(i-1), g^i] is represented by 2 g^i / (g + 1): at most HISTOGRAM_ACCURACY from either end.
    return 0.0 if cell == _ZERO_CELL else 2.0 * _GAMMA ** int(cell) / (_GAMMA + 1.0)


def histogram_quantiles(histogram: Mapping[str, int], quantiles: Sequence[float]) -> list[float | None]:
    """Nearest-rank quantiles of the values a log-cell histogram counts (None for an empty one).

    Each answer is the representative of the cell holding the exact nearest-rank value, so it is
    within `HISTOGRAM_ACCURACY` (relative) of it.
    """
    n = sum(histogram.values())
    if n == 0:
        return [None for _ in quantiles]
    cells = sorted(histogram.items(), key=lambda kv: -math.inf if kv[0] == _ZERO_CELL else int(kv[0]))
    out: list[float | None] = []
    for q in quantiles:
        rank, seen = min(n, max(1, math.ceil(q * n))), 0
        for cell, count in cells:
            seen += count
            if seen >= rank:
                out.append(_cell_value(cell))
                break
    return out


def _merge_counts(into: dict[str, int], other: Mapping[str, int]) -> None:
    for cell, count in other.items():
        into[cell] = into.get(cell, 0) + int(count)


class _Rollup:
    """The counts and latency histograms of one (server, tool) over some span of time."""

    __slots__ = ("counts", "cut", "latency")

    # The order of `counts`, and of the rollup table's count columns.
    FIELDS = ("calls", "succeeded", "attempts", "refused", "timeouts", "outcome_unknown", "breaker_opens", "retries", "completed")

    def __init__(self) -> None:
        self.counts = [0] * len(self.FIELDS)
        #: Answered attempts' durations (`completed`, `tool_error`): the latency percentiles.
        self.latency: dict[str, int] = {}
        #: Timed-out attempts' durations (at the time they were cut): learning counts them too.
        self.cut: dict[str, int] = {}

    def add(self, duration_s: float, outcome: str, attempt: int, breaker_opened: Any) -> None:
        """One journal row, classified exactly as the raw statistics query classifies it."""
        c = self.counts
        sent = outcome not in _SENT_EXCLUDED
        if attempt == 1 and outcome != RECONCILED:
            c[0] += 1
        if outcome == "completed" or outcome == RECONCILED:
            c[1] += 1
        if sent:
            c[2] += 1
            if attempt > 1:
                c[7] += 1
        elif outcome in _REFUSALS:
            c[3] += 1
        if outcome == "completed":
            c[8] += 1
        if breaker_opened:
            c[6] += 1
        if outcome in _ANSWERED:
            cell = _cell(duration_s)
            self.latency[cell] = self.latency.get(cell, 0) + 1
        elif outcome == "timeout":
            c[4] += 1
            cell = _cell(duration_s)
            self.cut[cell] = self.cut.get(cell, 0) + 1
        elif outcome == "outcome_unknown":
            c[5] += 1

    def merge(self, counts: Sequence[Any], latency: Mapping[str, int], cut: Mapping[str, int]) -> None:
        """Add a stored rollup row (or another rollup's parts)."""
        self.counts = [a + int(b) for a, b in zip(self.counts, counts, strict=True)]
        _merge_counts(self.latency, latency)
        _merge_counts(self.cut, cut)

    def stats(self, server: str, tool: str) -> ToolStats:
        c = self.counts
        p50, p95, p99 = histogram_quantiles(self.latency, (0.5, 0.95, 0.99))
        return ToolStats(
            server=server,
            tool=tool,
            calls=c[0],
            succeeded=c[1],
            attempts=c[2],
            refused=c[3],
            timeouts=c[4],
            outcome_unknown=c[5],
            breaker_opens=c[6],
            retries=c[7],
            p50_s=p50,
            p95_s=p95,
            p99_s=p99,
        )

    def learn_input(self, server: str, tool: str, quantile: float) -> LearnInput:
        samples = dict(self.latency)
        _merge_counts(samples, self.cut)
        (value,) = histogram_quantiles(samples, (quantile,))
        return LearnInput(server=server, tool=tool, completed=self.counts[8], quantile_s=value)


#: A rollup row's key: (server, tool, minute number since the epoch).
_RollupKey = tuple[str, str, int]
# The raw columns a rollup is built from, in `_Rollup.add` order after the key parts.
_ROLLUP_SOURCE = "server, tool, started_at, duration_s, outcome, attempt, breaker_opened"


def _bucket_of(started_at: float) -> int:
    # Float floor division is exact, so a row is in minute m exactly when m*60 <= started_at < (m+1)*60.
    return int(started_at // ROLLUP_BUCKET_S)


def _first_whole_bucket(since: float) -> int:
    """The first bucket lying wholly at or after `since`: earlier rows come from the raw table."""
    if not math.isfinite(since):
        return -(2**62)
    floor = _bucket_of(since)
    return floor if floor * ROLLUP_BUCKET_S == since else floor + 1


def _rollups_of(records: Iterable[AttemptRecord]) -> dict[_RollupKey, _Rollup]:
    out: dict[_RollupKey, _Rollup] = {}
    for r in records:
        key = (r.server, r.tool, _bucket_of(r.started_at))
        rollup = out.get(key)
        if rollup is None:
            rollup = out[key] = _Rollup()
        rollup.add(r.duration_s, r.outcome, r.attempt, r.breaker_opened)
    return out


def _fold_raw(into: dict[tuple[str, str], _Rollup], rows: Iterable[Sequence[Any]]) -> None:
    """Add raw rows (`_ROLLUP_SOURCE` columns) to per-tool rollups."""
    for server, tool, _started, duration, outcome, attempt, opened in rows:
        rollup = into.get((server, tool))
        if rollup is None:
            rollup = into[(server, tool)] = _Rollup()
        rollup.add(duration, outcome, attempt, opened)


def _loads(value: Any) -> Mapping[str, int]:
    # SQLite hands back the JSON text; psycopg decodes JSONB itself.
    return json.loads(value) if isinstance(value, str) else value or {}


def _fold_rollups(into: dict[tuple[str, str], _Rollup], rows: Iterable[Sequence[Any]]) -> None:
    """Add stored rollup rows (server, tool, *counts, latency, cut) to per-tool rollups."""
    n = len(_Rollup.FIELDS)
    for row in rows:
        rollup = into.get((row[0], row[1]))
        if rollup is None:
            rollup = into[(row[0], row[1])] = _Rollup()
        rollup.merge(row[2 : 2 + n], _loads(row[2 + n]), _loads(row[3 + n]))


def _rollup_filters(first_bucket: int, server: str | None, tool: str | None, mark: str) -> tuple[str, list[Any]]:
    where, params = [f"minute >= {mark}"], list[Any]([first_bucket])
    if server is not None:
        where.append(f"server = {mark}")
        params.append(server)
    if tool is not None:
        where.append(f"tool = {mark}")
        params.append(tool)
    return " AND ".join(where), params


# ---------------------------------------------------------------------------------------------- stores


class JournalStore(Protocol):
    """Where attempts are kept. Every method is synchronous: the journal calls them from its thread.

    Writes (`insert`, `purge`) come from one thread at a time; reads (`tool_stats`, `learn_inputs`)
    may come from any thread, concurrently with writes.
    """

    #: Where the store is, safe to show (no password).
    location: str

    def open(self) -> None:
        """Connect and bring the schema up to `SCHEMA_VERSION` (idempotent)."""
        ...

    def schema_version(self) -> int:
        """The schema version the store is at (0 before `open`)."""
        ...

    def insert(self, records: Sequence[AttemptRecord]) -> None:
        """Write a batch of attempts in one transaction."""
        ...

    def purge(self, before: float) -> int:
        """Delete attempts (and their rollups) older than the start of `before`'s minute; returns how many attempts."""
        ...

    def tool_stats(
        self, since: float, *, server: str | None = None, tool: str | None = None, exact: bool = False
    ) -> list[ToolStats]:
        """Per tool, the attempts that started at or after `since`, ordered by server and tool.

        Read from the per-minute rollups (percentiles within `HISTOGRAM_ACCURACY`), or with `exact`
        from every raw row (exact percentiles, a full scan of the window).
        """
        ...

    def learn_inputs(self, since: float, quantile: float) -> list[LearnInput]:
        """Per tool, the completed count and duration quantile of attempts since `since`."""
        ...

    def recent(
        self, limit: int, *, server: str | None = None, tool: str | None = None, failures_only: bool = False
    ) -> list[AttemptRecord]:
        """The latest `limit` attempts (newest first), optionally only those that did not complete."""
        ...

    def close(self) -> None:
        """Close every connection."""
        ...


def _ddl(real: str, boolean: str, serial: str, table: str) -> tuple[str, ...]:
    # Index names are never qualified: in PostgreSQL an index lives in its table's schema.
    return (
        f"""CREATE TABLE {table} (
            id {serial},
            started_at {real} NOT NULL,
            duration_s {real} NOT NULL,
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            call_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            error_code TEXT,
            retries INTEGER NOT NULL,
            trace_id TEXT,
            operation_id TEXT,
            server_breaker TEXT,
            tool_breaker TEXT,
            breaker_opened {boolean} NOT NULL,
            client TEXT,
            arguments_size BIGINT,
            result_size BIGINT,
            arguments_hash TEXT
        )""",
        f"CREATE INDEX {_TABLE}_started_at ON {table} (started_at)",
        f"CREATE INDEX {_TABLE}_tool ON {table} (server, tool, started_at)",
    )


def _rollup_ddl(big: str, json_type: str, table: str) -> tuple[str, ...]:
    counts = ", ".join(f"{name} {big} NOT NULL" for name in _Rollup.FIELDS)
    return (
        f"""CREATE TABLE {table} (
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            minute {big} NOT NULL,
            {counts},
            latency {json_type} NOT NULL,
            cut {json_type} NOT NULL,
            PRIMARY KEY (server, tool, minute)
        )""",
        f"CREATE INDEX {_ROLLUP_TABLE}_minute ON {table} (minute)",
    )


class _Backfill:
    """A migration step that is code, not SQL: fill the rollups from the attempts already stored."""


_BACKFILL = _Backfill()
Step = str | _Backfill


def _migrations(
    real: str, boolean: str, serial: str, big: str, json_type: str, table: str, rollups: str
) -> list[tuple[int, str, tuple[Step, ...]]]:
    """Every schema change, in order: (version, what it does, steps). Append; never edit a shipped one."""
    return [
        (1, "attempts table", _ddl(real, boolean, serial, table)),
        (2, "per-minute rollups for stats and learning", (*_rollup_ddl(big, json_type, rollups), _BACKFILL)),
    ]


def _backfill(fetch: Callable[[int, int], Sequence[Sequence[Any]]], write: Callable[[dict[_RollupKey, _Rollup]], None]) -> int:
    """Build rollups from the stored attempts, a page of ids at a time (memory stays bounded).

    `fetch(after_id, limit)` returns rows of (id, `_ROLLUP_SOURCE` columns) ordered by id; `write`
    merges rollups into the table (an upsert, so pages may split a minute anywhere).
    """
    after, total = -1, 0
    while True:
        rows = fetch(after, _BACKFILL_PAGE)
        if not rows:
            return total
        acc: dict[_RollupKey, _Rollup] = {}
        for _id, server, tool, started, duration, outcome, attempt, opened in rows:
            key = (server, tool, _bucket_of(started))
            rollup = acc.get(key)
            if rollup is None:
                rollup = acc[key] = _Rollup()
            rollup.add(duration, outcome, attempt, opened)
        write(acc)
        total += len(rows)
        after = int(rows[-1][0])


def _stats_sql(table: str, where: str, percentiles: str) -> str:
    # Calls are counted as first attempts (every call has exactly one row with attempt = 1, sent or
    # refused) and successes as completed rows (a call completes at most once): COUNT(DISTINCT
    # call_id) would cost a temporary B-tree per group, several times the whole scan.
    refusals = ", ".join(f"'{o}'" for o in REFUSAL_OUTCOMES)
    unsent = ", ".join(f"'{o}'" for o in (*REFUSAL_OUTCOMES, RECONCILED))
    return f"""SELECT server, tool,
            SUM(CASE WHEN attempt = 1 AND outcome <> '{RECONCILED}' THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome IN ('completed', '{RECONCILED}') THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome NOT IN ({unsent}) THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome IN ({refusals}) THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome = 'timeout' THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome = 'outcome_unknown' THEN 1 ELSE 0 END),
            SUM(CASE WHEN breaker_opened THEN 1 ELSE 0 END),
            SUM(CASE WHEN attempt > 1 AND outcome NOT IN ({unsent}) THEN 1 ELSE 0 END){percentiles}
        FROM {table} WHERE {where} GROUP BY server, tool ORDER BY server, tool"""


def _filters(since: float, server: str | None, tool: str | None, mark: str) -> tuple[str, list[Any]]:
    where, params = [f"started_at >= {mark}"], list[Any]([since])
    if server is not None:
        where.append(f"server = {mark}")
        params.append(server)
    if tool is not None:
        where.append(f"tool = {mark}")
        params.append(tool)
    return " AND ".join(where), params


def _stats_row(row: Sequence[Any], p50: float | None, p95: float | None, p99: float | None) -> ToolStats:
    return ToolStats(
        server=row[0],
        tool=row[1],
        calls=int(row[2]),
        succeeded=int(row[3]),
        attempts=int(row[4] or 0),
        refused=int(row[5] or 0),
        timeouts=int(row[6] or 0),
        outcome_unknown=int(row[7] or 0),
        breaker_opens=int(row[8] or 0),
        retries=int(row[9] or 0),
        p50_s=p50,
        p95_s=p95,
        p99_s=p99,
    )


def _recent_sql(table: str, server: str | None, tool: str | None, failures_only: bool, mark: str) -> tuple[str, list[Any]]:
    where, params = _filters(-math.inf, server, tool, mark)
    if failures_only:
        where += " AND outcome <> 'completed'"
    sql = f"SELECT {', '.join(_COLUMNS)} FROM {table} WHERE {where} ORDER BY started_at DESC, id DESC LIMIT {mark}"
    return sql, params


def _record_from(row: Sequence[Any]) -> AttemptRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["breaker_opened"] = bool(values["breaker_opened"])
    return AttemptRecord(**values)


def default_journal_path() -> Path:
    """Where the embedded journal lives: `$BREAKWATER_JOURNAL_DB`, else `journal.sqlite3` in the user's data directory."""
    override = os.environ.get(JOURNAL_DB_ENV)
    return Path(override).expanduser() if override else _paths.data_dir() / "journal.sqlite3"


class SQLiteJournalStore:
    """The embedded journal: one SQLite file, WAL, so `breakwater stats` reads while a gateway writes.

    One connection writes, another reads; each has its own lock, so a long `stats` query never
    holds up the writer (WAL readers and the writer do not block each other). Each batch updates
    the per-minute rollups in the same transaction, under SQLite's write lock, so several
    processes sharing the file never lose each other's counts.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_journal_path()
        self.location = str(self.path)
        self._write: sqlite3.Connection | None = None
        self._read: sqlite3.Connection | None = None
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._version = 0

    def __repr__(self) -> str:
        return f"SQLiteJournalStore({self.location!r})"

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are the BEGIN/COMMIT written here, nothing implicit.
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: in WAL mode a process crash loses nothing; a power cut may lose the last batch,
        # which a journal can afford, and every commit skips an fsync.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-32768")  # 32 MiB: a stats window's index pages stay cached
        return conn

    def open(self) -> None:
        with self._write_lock:
            if self._write is None:
                self._write = self._connect()
            self._version = self._migrate(self._write)

    def _migrate(self, conn: sqlite3.Connection) -> int:
        conn.execute("BEGIN IMMEDIATE")  # the write lock first: two processes never migrate at once
        try:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL, "
                "description TEXT NOT NULL)"
            )
            current = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {_VERSION_TABLE}").fetchone()[0]
            if current > SCHEMA_VERSION:
                raise JournalError(
                    f"{self.location}: the journal's schema is version {current}, newer than this breakwater knows "
                    f"({SCHEMA_VERSION}); upgrade breakwater or point [journal] url elsewhere"
                )
            steps = _migrations("REAL", "INTEGER", "INTEGER PRIMARY KEY", "INTEGER", "TEXT", _TABLE, _ROLLUP_TABLE)
            for version, description, statements in steps:
                if version > current:
                    for statement in statements:
                        if isinstance(statement, _Backfill):
                            self._backfill(conn)
                        else:
                            conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {_VERSION_TABLE} (version, applied_at, description) VALUES (?, ?, ?)",
                        (version, _time.time(), description),
                    )
                    current = version
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return int(current)

    def _backfill(self, conn: sqlite3.Connection) -> None:
        def fetch(after: int, limit: int) -> list[Any]:
            sql = f"SELECT id, {_ROLLUP_SOURCE} FROM {_TABLE} WHERE id > ? ORDER BY id LIMIT ?"
            return conn.execute(sql, (after, limit)).fetchall()

        _backfill(fetch, lambda acc: _sqlite_merge(conn, acc))

    def schema_version(self) -> int:
        return self._version

    def insert(self, records: Sequence[AttemptRecord]) -> None:
        cols = ", ".join(_COLUMNS)
        marks = ", ".join("?" for _ in _COLUMNS)
        rows = [_as_row(r) for r in records]
        deltas = _rollups_of(records)
        with self._write_lock:
            conn = self._write
            if conn is None:
                raise JournalError("the store is not open")
            # IMMEDIATE: the rollups are read, then rewritten; another process must not slip in between.
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(f"INSERT INTO {_TABLE} ({cols}) VALUES ({marks})", rows)
                _sqlite_merge(conn, deltas)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def purge(self, before: float) -> int:
        # Whole minutes only, so the raw rows and the rollups always cover the same attempts.
        bucket = _bucket_of(before)
        with self._write_lock:
            conn = self._write
            if conn is None:
                raise JournalError("the store is not open")
            conn.execute("BEGIN IMMEDIATE")
            try:
                removed = conn.execute(f"DELETE FROM {_TABLE} WHERE started_at < ?", (bucket * float(ROLLUP_BUCKET_S),)).rowcount
                conn.execute(f"DELETE FROM {_ROLLUP_TABLE} WHERE minute < ?", (bucket,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return int(removed)

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        with self._read_lock:
            if self._read is None:
                self._read = self._connect()
            yield self._read

    def _exists(self, conn: sqlite3.Connection, table: str = _TABLE) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None

    def _rolled_up(self, since: float, server: str | None, tool: str | None) -> dict[tuple[str, str], _Rollup] | None:
        """Per tool since `since`: stored rollups for whole minutes, raw rows for the partial first one.

        None when the file predates rollups (schema 1: a reader never migrates).
        """
        first = _first_whole_bucket(since)
        acc: dict[tuple[str, str], _Rollup] = {}
        with self._reader() as conn:
            if not self._exists(conn, _ROLLUP_TABLE):
                return None
            where, params = _rollup_filters(first, server, tool, "?")
            counts = ", ".join(_Rollup.FIELDS)
            sql = f"SELECT server, tool, {counts}, latency, cut FROM {_ROLLUP_TABLE} WHERE {where}"
            _fold_rollups(acc, conn.execute(sql, params))
            where, params = _filters(since, server, tool, "?")
            edge = conn.execute(
                f"SELECT {_ROLLUP_SOURCE} FROM {_TABLE} INDEXED BY {_TABLE}_started_at WHERE {where} AND started_at < ?",
                [*params, first * float(ROLLUP_BUCKET_S)],
            )
            _fold_raw(acc, edge)
        return acc

    def tool_stats(
        self, since: float, *, server: str | None = None, tool: str | None = None, exact: bool = False
    ) -> list[ToolStats]:
        acc = None if exact else self._rolled_up(since, server, tool)
        if acc is None:
            return self._exact_stats(since, server, tool)
        return [acc[key].stats(*key) for key in sorted(acc)]

    def _exact_stats(self, since: float, server: str | None, tool: str | None) -> list[ToolStats]:
        where, params = _filters(since, server, tool, "?")
        answered = ", ".join(f"'{o}'" for o in ANSWERED_OUTCOMES)
        with self._reader() as conn:
            if not self._exists(conn):
                return []
            # The time index, not the (server, tool) one the GROUP BY tempts the planner into: a window
            # is a range of recent rows, and rowids follow time, so this reads them nearly in order.
            rows = conn.execute(_stats_sql(f"{_TABLE} INDEXED BY {_TABLE}_started_at", where, ""), params).fetchall()
            # SQLite has no percentile aggregate: fetch the one column and rank in Python.
            durations: dict[tuple[str, str], list[float]] = {}
            for srv, tl, d in conn.execute(
                f"SELECT server, tool, duration_s FROM {_TABLE} INDEXED BY {_TABLE}_started_at "
                f"WHERE {where} AND outcome IN ({answered})",
                params,
            ):
                durations.setdefault((srv, tl), []).append(d)
        out = []
        for row in rows:
            values = sorted(durations.get((row[0], row[1]), ()))
            out.append(_stats_row(row, percentile(values, 0.5), percentile(values, 0.95), percentile(values, 0.99)))
        return out

    def learn_inputs(self, since: float, quantile: float) -> list[LearnInput]:
        acc = self._rolled_up(since, None, None)
        if acc is not None:
            return [acc[key].learn_input(*key, quantile) for key in sorted(acc)]
        outcomes = ", ".join(f"'{o}'" for o in _LEARN_OUTCOMES)
        samples: dict[tuple[str, str], list[float]] = {}
        completed: dict[tuple[str, str], int] = {}
        with self._reader() as conn:
            if not self._exists(conn):
                return []
            for srv, tl, d, outcome in conn.execute(
                f"SELECT server, tool, duration_s, outcome FROM {_TABLE} WHERE started_at >= ? AND outcome IN ({outcomes})",
                (since,),
            ):
                samples.setdefault((srv, tl), []).append(d)
                if outcome == "completed":
                    completed[(srv, tl)] = completed.get((srv, tl), 0) + 1
        return [
            LearnInput(server=s, tool=t, completed=completed.get((s, t), 0), quantile_s=percentile(sorted(v), quantile))
            for (s, t), v in sorted(samples.items())
        ]

    def recent(
        self, limit: int, *, server: str | None = None, tool: str | None = None, failures_only: bool = False
    ) -> list[AttemptRecord]:
        sql, params = _recent_sql(_TABLE, server, tool, failures_only, "?")
        with self._reader() as conn:
            if not self._exists(conn):
                return []
            return [_record_from(r) for r in conn.execute(sql, [*params, limit])]

    def close(self) -> None:
        for lock, name in ((self._write_lock, "_write"), (self._read_lock, "_read")):
            with lock:
                conn = getattr(self, name)
                if conn is not None:
                    conn.close()
                    setattr(self, name, None)


def _sqlite_merge(conn: sqlite3.Connection, deltas: Mapping[_RollupKey, _Rollup]) -> None:
    """Add `deltas` to the stored rollups (inside the caller's write transaction)."""
    n = len(_Rollup.FIELDS)
    counts = ", ".join(_Rollup.FIELDS)
    marks = ", ".join("?" for _ in range(n + 5))
    for key in sorted(deltas):
        delta = deltas[key]
        row = conn.execute(
            f"SELECT {counts}, latency, cut FROM {_ROLLUP_TABLE} WHERE server = ? AND tool = ? AND minute = ?", key
        ).fetchone()
        if row is not None:
            delta.merge(row[:n], json.loads(row[n]), json.loads(row[n + 1]))
        conn.execute(
            f"INSERT OR REPLACE INTO {_ROLLUP_TABLE} (server, tool, minute, {counts}, latency, cut) VALUES ({marks})",
            (*key, *delta.counts, json.dumps(delta.latency, separators=(",", ":")), json.dumps(delta.cut, separators=(",", ":"))),
        )


def _quote(identifier: str) -> str:
    if not identifier.replace("_", "a").isalnum():
        raise JournalError(f"not a plain SQL identifier: {identifier!r}")
    return f'"{identifier}"'


class PostgresJournalStore:
    """A journal shared by a team: PostgreSQL through psycopg 3, the same schema as SQLite.

    `conninfo` is a libpq URL or string (`postgresql://user@host/db`). Tables live in `schema` when
    given (created if missing), else wherever the connection's `search_path` puts them. Batches are
    written with `COPY`; migrations run under a transaction-scoped advisory lock, so replicas that
    start together migrate once. Rollups are merged by the database itself (`ON CONFLICT DO
    UPDATE`, histograms as JSONB), so replicas writing the same minute never lose each other's counts.
    """

    def __init__(self, conninfo: str, *, schema: str | None = None, connect_timeout_s: float = 5.0) -> None:
        self.conninfo = conninfo
        self.schema = schema
        self.connect_timeout_s = connect_timeout_s
        from breakwater.config._redact import display_url

        shown = display_url(conninfo) if "://" in conninfo else "postgresql (conninfo)"
        self.location = f"{shown} (schema {schema})" if schema else shown
        prefix = f"{_quote(schema)}." if schema else ""
        self._table = prefix + _quote(_TABLE)
        self._rollups = prefix + _quote(_ROLLUP_TABLE)
        self._versions = prefix + _quote(_VERSION_TABLE)
        self._write: psycopg.Connection[Any] | None = None
        self._read: psycopg.Connection[Any] | None = None
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._version = 0

    def __repr__(self) -> str:
        return f"PostgresJournalStore({self.location!r})"

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - the dev extra installs it
            raise JournalError("a PostgreSQL journal needs psycopg 3: pip install 'mcp-breakwater[postgres]'") from exc
        return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s)))

    def _writer(self) -> psycopg.Connection[Any]:
        if self._write is None or self._write.closed:
            self._write = self._connect()
        return self._write

    def open(self) -> None:
        with self._write_lock:
            conn = self._writer()
            with conn.transaction():
                # One migrator at a time across every replica; released at commit.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('breakwater_journal_migrate'))")
                if self.schema:
                    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(self.schema)}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._versions} (version INTEGER PRIMARY KEY, "
                    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now(), description TEXT NOT NULL)"
                )
                row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {self._versions}").fetchone()
                current = int(row[0]) if row else 0
                if current > SCHEMA_VERSION:
                    raise JournalError(
                        f"{self.location}: the journal's schema is version {current}, newer than this breakwater knows "
                        f"({SCHEMA_VERSION}); upgrade breakwater or point [journal] url elsewhere"
                    )
                steps = _migrations(
                    "DOUBLE PRECISION",
                    "BOOLEAN",
                    "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                    "BIGINT",
                    "JSONB",
                    self._table,
                    self._rollups,
                )
                for version, description, statements in steps:
                    if version > current:
                        for statement in statements:
                            if isinstance(statement, _Backfill):
                                self._backfill(conn)
                            else:
                                conn.execute(statement)
                        conn.execute(
                            f"INSERT INTO {self._versions} (version, description) VALUES (%s, %s)", (version, description)
                        )
                        current = version
            self._version = current

    def _backfill(self, conn: psycopg.Connection[Any]) -> None:
        def fetch(after: int, limit: int) -> list[Any]:
            sql = f"SELECT id, {_ROLLUP_SOURCE} FROM {self._table} WHERE id > %s ORDER BY id LIMIT %s"
            return conn.execute(sql, (after, limit)).fetchall()

        _backfill(fetch, lambda acc: self._merge(conn, acc))

    def _merge(self, conn: psycopg.Connection[Any], deltas: Mapping[_RollupKey, _Rollup]) -> None:
        """Add `deltas` to the stored rollups in one statement per row, in key order (no deadlocks between replicas)."""
        if not deltas:
            return
        counts = _Rollup.FIELDS
        histogram = (
            "(SELECT COALESCE(jsonb_object_agg(k, n), '{{}}'::jsonb) FROM (SELECT k, SUM(v) AS n FROM ("
            "SELECT key AS k, value::bigint AS v FROM jsonb_each_text(r.{0}) UNION ALL "
            "SELECT key, value::bigint FROM jsonb_each_text(EXCLUDED.{0})) u GROUP BY k) g)"
        )
        sql = (
            f"INSERT INTO {self._rollups} AS r (server, tool, minute, {', '.join(counts)}, latency, cut) "
            f"VALUES ({', '.join('%s' for _ in range(len(counts) + 3))}, %s::jsonb, %s::jsonb) "
            f"ON CONFLICT (server, tool, minute) DO UPDATE SET {', '.join(f'{c} = r.{c} + EXCLUDED.{c}' for c in counts)}, "
            f"latency = {histogram.format('latency')}, cut = {histogram.format('cut')}"
        )
        params = [
            (*key, *deltas[key].counts, json.dumps(deltas[key].latency), json.dumps(deltas[key].cut)) for key in sorted(deltas)
        ]
        with conn.cursor() as cur:
            cur.executemany(sql, params)

    def schema_version(self) -> int:
        return self._version

    def insert(self, records: Sequence[AttemptRecord]) -> None:
        cols = ", ".join(_COLUMNS)
        deltas = _rollups_of(records)
        with self._write_lock:
            conn = self._writer()
            try:
                with conn.transaction():
                    with conn.cursor() as cur, cur.copy(f"COPY {self._table} ({cols}) FROM STDIN") as copy:
                        for r in records:
                            copy.write_row(_as_row(r))
                    self._merge(conn, deltas)
            except Exception:
                self._drop_writer()
                raise

    def _drop_writer(self) -> None:
        # A broken connection is replaced on the next write rather than retried here.
        if self._write is not None:
            self._write.close()
            self._write = None

    def purge(self, before: float) -> int:
        # Whole minutes only, so the raw rows and the rollups always cover the same attempts.
        bucket = _bucket_of(before)
        with self._write_lock:
            try:
                conn = self._writer()
                with conn.transaction():
                    removed = conn.execute(
                        f"DELETE FROM {self._table} WHERE started_at < %s", (bucket * float(ROLLUP_BUCKET_S),)
                    ).rowcount
                    conn.execute(f"DELETE FROM {self._rollups} WHERE minute < %s", (bucket,))
                return int(removed)
            except Exception:
                self._drop_writer()
                raise

    @contextmanager
    def _reader(self) -> Iterator[psycopg.Connection[Any]]:
        with self._read_lock:
            if self._read is None or self._read.closed:
                self._read = self._connect()
            try:
                yield self._read
            except Exception:
                self._read.close()
                self._read = None
                raise

    def _exists(self, conn: psycopg.Connection[Any], table: str | None = None) -> bool:
        row = conn.execute("SELECT to_regclass(%s)", (table or self._table,)).fetchone()
        return row is not None and row[0] is not None

    def _rolled_up(self, since: float, server: str | None, tool: str | None) -> dict[tuple[str, str], _Rollup] | None:
        """Per tool since `since`: stored rollups for whole minutes, raw rows for the partial first one (None before schema 2)."""
        first = _first_whole_bucket(since)
        acc: dict[tuple[str, str], _Rollup] = {}
        with self._reader() as conn:
            if not self._exists(conn, self._rollups):
                return None
            where, params = _rollup_filters(first, server, tool, "%s")
            counts = ", ".join(_Rollup.FIELDS)
            sql = f"SELECT server, tool, {counts}, latency, cut FROM {self._rollups} WHERE {where}"
            _fold_rollups(acc, conn.execute(sql, params))
            where, params = _filters(since, server, tool, "%s")
            edge = conn.execute(
                f"SELECT {_ROLLUP_SOURCE} FROM {self._table} WHERE {where} AND started_at < %s",
                [*params, first * float(ROLLUP_BUCKET_S)],
            )
            _fold_raw(acc, edge)
        return acc

    def tool_stats(
        self, since: float, *, server: str | None = None, tool: str | None = None, exact: bool = False
    ) -> list[ToolStats]:
        acc = None if exact else self._rolled_up(since, server, tool)
        if acc is None:
            return self._exact_stats(since, server, tool)
        return [acc[key].stats(*key) for key in sorted(acc)]

    def _exact_stats(self, since: float, server: str | None, tool: str | None) -> list[ToolStats]:
        where, params = _filters(since, server, tool, "%s")
        answered = ", ".join(f"'{o}'" for o in ANSWERED_OUTCOMES)
        pct = f""",
            percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY duration_s)
                FILTER (WHERE outcome IN ({answered}))"""
        with self._reader() as conn:
            if not self._exists(conn):
                return []
            rows = conn.execute(_stats_sql(self._table, where, pct), params).fetchall()
        return [_stats_row(row, *(row[10] or (None, None, None))) for row in rows]

    def learn_inputs(self, since: float, quantile: float) -> list[LearnInput]:
        acc = self._rolled_up(since, None, None)
        if acc is not None:
            return [acc[key].learn_input(*key, quantile) for key in sorted(acc)]
        outcomes = ", ".join(f"'{o}'" for o in _LEARN_OUTCOMES)
        with self._reader() as conn:
            if not self._exists(conn):
                return []
            rows = conn.execute(
                f"""SELECT server, tool, COUNT(*) FILTER (WHERE outcome = 'completed'),
                        percentile_disc(%s) WITHIN GROUP (ORDER BY duration_s)
                    FROM {self._table} WHERE started_at >= %s AND outcome IN ({outcomes})
                    GROUP BY server, tool ORDER BY server, tool""",
                (quantile, since),
            ).fetchall()
        return [LearnInput(server=r[0], tool=r[1], completed=int(r[2]), quantile_s=r[3]) for r in rows]

    def recent(
        self, limit: int, *, server: str | None = None, tool: str | None = None, failures_only: bool = False
    ) -> list[AttemptRecord]:
        sql, params = _recent_sql(self._table, server, tool, failures_only, "%s")
        with self._reader() as conn:
            if not self._exists(conn):
                return []
            return [_record_from(r) for r in conn.execute(sql, [*params, limit]).fetchall()]

    def close(self) -> None:
        for lock, name in ((self._write_lock, "_write"), (self._read_lock, "_read")):
            with lock:
                conn = getattr(self, name)
                if conn is not None:
                    conn.close()
                    setattr(self, name, None)


_OFF = frozenset({"off", "none", "false", "0", "disabled"})


def open_store(url: str) -> JournalStore | None:
    """The store a `[journal] url` (or `--journal`) names; None when the journal is off.

    Empty: SQLite at `default_journal_path()`. `postgresql://…` / `postgres://…`: PostgreSQL.
    `sqlite:///PATH` (SQLAlchemy's spelling: four slashes for an absolute path) or any other text:
    an SQLite file at that path. `off`: no journal.
    Nothing is opened yet.
    """
    url = url.strip()
    if url.lower() in _OFF:
        return None
    if not url:
        return SQLiteJournalStore()
    if url.startswith(("postgresql://", "postgres://")) or (url.startswith(("host=", "dbname=")) and "=" in url):
        return PostgresJournalStore(url)
    if url.startswith("sqlite:///"):
        # SQLAlchemy's spelling: sqlite:///relative.db, sqlite:////absolute/path.db.
        return SQLiteJournalStore(Path(url[len("sqlite:///") :]).expanduser())
    if "://" in url:
        raise JournalError(f"unknown journal URL scheme in {url.split('://')[0]!r}: use a path, sqlite:///PATH or postgresql://")
    return SQLiteJournalStore(Path(url).expanduser())


# ---------------------------------------------------------------------------------------------- the journal


@dataclass(eq=False)
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


class Journal:
    """The bounded queue, its writer thread, retention and the learned-timeout cache.

    ```python
    journal = Journal(open_store(config.journal.url), policy=config.journal)
    journal.start()
    journal.record(AttemptRecord(...))      # from the call path: never blocks
    journal.learned_timeout("search", "q")  # from the call path: one dict lookup
    journal.close()                         # flushes what is queued (bounded), stops the thread
    ```

    Without `start()` nothing is written until `flush()` drains the queue in the calling thread
    (what `breakwater stats` and tests use). Counters: `recorded`, `dropped` (queue full),
    `written`, `failed` (a batch the store refused; `last_error` says why).
    """

    def __init__(
        self,
        store: JournalStore,
        *,
        policy: JournalPolicy | None = None,
        clock: Clock | None = None,
        batch_size: int = _BATCH,
    ) -> None:
        self.store = store
        self.policy = policy or JournalPolicy()
        self._clock: Clock = clock or SystemClock()
        self._queue: deque[AttemptRecord] = deque()
        self._capacity = self.policy.queue_size
        # Wake the writer early once this much is queued; below it the flush interval decides.
        self._batch = max(1, min(batch_size, self._capacity))
        self.recorded = 0
        self.dropped = 0
        self.written = 0
        self.failed = 0
        self.purged = 0
        self.last_error: str | None = None
        self._learned: dict[tuple[str, str], float] = {}
        self._wake = threading.Event()
        self._flushes: list[_Flush] = []
        self._flushes_lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._opened = False
        self._next_open_at = 0.0
        self._next_purge_at = -math.inf
        self._next_learn_at = -math.inf
        # The writer thread and a caller's flush() must not drain at the same time.
        self._drain_lock = threading.Lock()

    @classmethod
    def from_policy(cls, policy: JournalPolicy, *, url: str | None = None, clock: Clock | None = None) -> Journal | None:
        """The journal `policy` configures (`url` overrides `policy.url`); None when it is off."""
        store = open_store(policy.url if url is None else url)
        return None if store is None else cls(store, policy=policy, clock=clock)

    def __repr__(self) -> str:
        return f"Journal({self.store!r}, queued={len(self._queue)}, dropped={self.dropped})"

    # ---- the call path ----------------------------------------------------------------------

    def record(self, record: AttemptRecord) -> bool:
        """Queue one attempt for writing; False (and `dropped` + 1) when the queue is full. Never blocks.

        deque.append is atomic under the GIL, so callers need no lock; the length check may let a
        concurrent caller overshoot the capacity by a row, which is harmless.
        """
        queue = self._queue
        if len(queue) >= self._capacity:
            self.dropped += 1
            return False
        queue.append(record)
        self.recorded += 1
        if len(queue) == self._batch:
            self._wake.set()
        return True

    def learned_timeout(self, server: str, tool: str) -> float | None:
        """The tool's learned timeout in seconds, or None (too few samples, learning off, nothing read yet).

        Suitable for `Breakwater(learned_timeout=journal.learned_timeout)`: a dictionary read of
        the cache the writer thread refreshes every `learn_refresh_s`.
        """
        return self._learned.get((server, tool))

    def learned_timeouts(self) -> dict[tuple[str, str], float]:
        """Every learned timeout in force, by (server, tool)."""
        return dict(self._learned)

    @property
    def record_sizes(self) -> bool:
        """`[journal] record_sizes`: the gate fills in sizes and the argument hash only when set."""
        return self.policy.record_sizes

    @property
    def queued(self) -> int:
        """Attempts waiting to be written."""
        return len(self._queue)

    def counters(self) -> dict[str, Any]:
        """The journal's own health, JSON-ready (for status and metrics)."""
        return {
            "location": self.store.location,
            "recorded": self.recorded,
            "dropped": self.dropped,
            "written": self.written,
            "failed": self.failed,
            "purged": self.purged,
            "queued": len(self._queue),
            "last_error": self.last_error,
        }

    # ---- the writer -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (a daemon: a journal never keeps a process alive)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="breakwater-journal", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most `timeout` seconds), stop the writer and close the store."""
        thread = self._thread
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join(timeout)
            if thread.is_alive():
                # The store is wedged (a dead database, a hung disk): leave the daemon thread behind.
                log.warning("journal writer did not stop within %.1f s; %d attempts not written", timeout, len(self._queue))
                return
            self._thread = None
        else:
            self._cycle(final=True)
        self.store.close()
        self._opened = False

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything queued so far and run due maintenance; True when done within `timeout`."""
        if self._thread is None:
            self._cycle()
            return True
        request = _Flush()
        with self._flushes_lock:
            self._flushes.append(request)
        self._wake.set()
        return request.done.wait(timeout)

    def refresh_learned(self) -> None:
        """Recompute learned timeouts from the store now (the writer does this every `learn_refresh_s`)."""
        p = self.policy
        if not p.learn_timeouts:
            self._learned = {}
            return
        inputs = self.store.learn_inputs(self._clock.time() - p.learn_window_s, p.learn_quantile)
        learned = {}
        for inp in inputs:
            value = learned_value(inp, p)
            if value is not None:
                learned[(inp.server, inp.tool)] = value
        self._learned = learned  # one assignment: readers see the old map or the new one

    def purge(self) -> int:
        """Delete attempts older than the retention now (the writer does this every few minutes)."""
        removed = self.store.purge(self._clock.time() - self.policy.retention_days * 86400.0)
        self.purged += removed
        return removed

    def stats(
        self,
        since_s: float,
        *,
        server: str | None = None,
        tool: str | None = None,
        exact: bool = False,
        config: Config | None = None,
    ) -> list[ToolStats]:
        """Per-tool statistics over the last `since_s` seconds, with each tool's learned timeout and
        the timeout in force (resolved against `config`'s per-server and per-tool settings).

        From the per-minute rollups (percentiles within `HISTOGRAM_ACCURACY` of the exact ones);
        `exact` scans every raw row of the window instead.
        """
        since = self._clock.time() - since_s
        rows = self.store.tool_stats(since, server=server, tool=tool, exact=exact)
        learned = self._learned
        specs = {s.name: s for s in config.servers} if config is not None else {}
        out = []
        for r in rows:
            value = learned.get((r.server, r.tool))
            timeout, source = timeout_in_force(specs.get(r.server), r.tool, value)
            out.append(replace(r, learned_timeout_s=value, timeout_s=timeout, timeout_source=source))
        return out

    def _run(self) -> None:
        # A first cycle at once: the store opens and the learned timeouts are read before the first
        # calls (after a restart they would otherwise wait a flush interval on the defaults).
        self._cycle()
        while True:
            self._wake.wait(self.policy.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            self._cycle(final=stopping)
            if stopping:
                return

    def _cycle(self, *, final: bool = False) -> None:
        with self._flushes_lock:
            flushes, self._flushes = self._flushes, []
        with self._drain_lock:
            if self._ensure_open():
                self._drain()
                if not final:
                    self._maintain()
            elif final:
                # Closing with a store that never opened: what is queued can only be counted.
                self.failed += len(self._queue)
                self._queue.clear()
        for request in flushes:
            request.done.set()

    def _ensure_open(self) -> bool:
        if self._opened:
            return True
        now = self._clock.monotonic()
        if now < self._next_open_at:
            return False
        try:
            self.store.open()
        except Exception as exc:
            self._next_open_at = now + _REOPEN_S
            self._note_error("open", exc)
            # Nothing can be written: keep the queue bounded by what record() admits and retry later.
            return False
        self._opened = True
        return True

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            batch = []
            try:
                for _ in range(_BATCH):
                    batch.append(queue.popleft())
            except IndexError:
                pass
            try:
                self.store.insert(batch)
            except Exception as exc:
                self.failed += len(batch)
                self._note_error("write", exc)
                return
            self.written += len(batch)

    def _maintain(self) -> None:
        now = self._clock.time()
        try:
            if now >= self._next_purge_at:
                self._next_purge_at = now + _PURGE_INTERVAL_S
                self.purge()
            if now >= self._next_learn_at:
                self._next_learn_at = now + self.policy.learn_refresh_s
                self.refresh_learned()
        except Exception as exc:
            self._note_error("maintenance", exc)

    def _note_error(self, what: str, exc: Exception) -> None:
        message = f"{what}: {type(exc).__name__}: {exc}".strip()
        if message != self.last_error:
            log.warning("journal %s (%s)", message, self.store.location)
        self.last_error = message


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m`, `1h`, `2d`, `1w` or `250ms` (ValueError otherwise)."""
    text = text.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].strip():
            number = float(text[: -len(unit)])
            break
    else:
        number, unit = float(text), "s"
    seconds = number * _UNITS[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return seconds


def summarize(stats: Iterable[ToolStats]) -> dict[str, int]:
    """Totals over tools (calls, attempts, timeouts, outcome_unknown), for a caption."""
    totals = {"calls": 0, "attempts": 0, "timeouts": 0, "outcome_unknown": 0}
    for s in stats:
        totals["calls"] += s.calls
        totals["attempts"] += s.attempts
        totals["timeouts"] += s.timeouts
        totals["outcome_unknown"] += s.outcome_unknown
    return totals
