"""Per-minute rollups: the counts and log-cell latency histograms of one (server, tool, minute).

Every batch the writer stores is folded into the rollups of the minutes it touches, in the same
transaction, so `stats` and learning read one row per tool-minute instead of every attempt. A
window reads whole minutes from the rollups and its partial first minute from the raw rows;
percentiles read from a histogram are within `HISTOGRAM_ACCURACY` of the exact ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from breakwater.errors import ErrorCode
from breakwater.journal._records import ANSWERED_OUTCOMES, CALLERS_OWN_OUTCOMES, RECONCILED, REFUSAL_OUTCOMES, AttemptRecord
from breakwater.journal._stats import LearnInput, ToolStats

__all__ = ["HISTOGRAM_ACCURACY", "ROLLUP_BUCKET_S", "histogram_quantiles"]


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
_UNCOUNTED = frozenset((RECONCILED, *CALLERS_OWN_OUTCOMES))  # first attempts that are no call of the tool


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


#: The code an agent is told for a call that may or may not have run, as the journal stores it.
_OUTCOME_UNKNOWN = ErrorCode.OUTCOME_UNKNOWN.value


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

    def add(self, duration_s: float, outcome: str, attempt: int, breaker_opened: Any, error_code: str | None = None) -> None:
        """One journal row, classified exactly as the raw statistics query classifies it."""
        c = self.counts
        sent = outcome not in _SENT_EXCLUDED
        if attempt == 1 and outcome not in _UNCOUNTED:
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
        # A tool that is not read-only, cut by its timeout, is a timeout that the agent was told OUTCOME_UNKNOWN.
        if outcome == "outcome_unknown" or error_code == _OUTCOME_UNKNOWN:
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
        (answered,) = histogram_quantiles(self.latency, (quantile,))
        cut = sum(self.cut.values())
        return LearnInput(
            server=server,
            tool=tool,
            completed=self.counts[8],
            quantile_s=value,
            answered_quantile_s=answered,
            cut=cut,
            attempts=cut + sum(self.latency.values()),
        )


#: A rollup row's key: (server, tool, minute number since the epoch).
_RollupKey = tuple[str, str, int]
# The raw columns a rollup is built from, in `_Rollup.add` order after the key parts.
_ROLLUP_SOURCE = "server, tool, started_at, duration_s, outcome, attempt, breaker_opened, error_code"


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
        rollup.add(r.duration_s, r.outcome, r.attempt, r.breaker_opened, r.error_code)
    return out


def _fold_raw(into: dict[tuple[str, str], _Rollup], rows: Iterable[Sequence[Any]]) -> None:
    """Add raw rows (`_ROLLUP_SOURCE` columns) to per-tool rollups."""
    for server, tool, _started, duration, outcome, attempt, opened, error_code in rows:
        rollup = into.get((server, tool))
        if rollup is None:
            rollup = into[(server, tool)] = _Rollup()
        rollup.add(duration, outcome, attempt, opened, error_code)


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


# Rows read per page when a migration builds the rollups of attempts already stored.
_BACKFILL_PAGE = 20_000


def _backfill_pages(
    fetch: Callable[[int, int], Sequence[Sequence[Any]]], write: Callable[[dict[_RollupKey, _Rollup]], None]
) -> int:
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
        for _id, server, tool, started, duration, outcome, attempt, opened, error_code in rows:
            key = (server, tool, _bucket_of(started))
            rollup = acc.get(key)
            if rollup is None:
                rollup = acc[key] = _Rollup()
            rollup.add(duration, outcome, attempt, opened, error_code)
        write(acc)
        total += len(rows)
        after = int(rows[-1][0])
