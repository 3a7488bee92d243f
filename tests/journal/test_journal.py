"""The call journal: the store contract (SQLite and PostgreSQL alike), the never-blocking queue,
retention, stats percentiles, learned timeouts, `[journal]` config and `breakwater stats`.

PostgreSQL tests use 127.0.0.1:5432, database `test` (override with `BREAKWATER_TEST_POSTGRES`),
each in a schema of its own that is dropped afterwards. They skip when the server is unreachable,
except under `CI=true`, where an unreachable server is a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import random
import re
import socket
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

import anyio
import pytest
from mcp import Client

from breakwater import Breakwater, FakeClock
from breakwater.cli import main as cli_main
from breakwater.cli._stats_format import parse_duration
from breakwater.config import CallPolicy, JournalPolicy, load_config
from breakwater.errors import BreakwaterError, ConfigError, ErrorCode
from breakwater.journal import (
    HISTOGRAM_ACCURACY,
    SCHEMA_VERSION,
    AttemptRecord,
    Journal,
    JournalError,
    JournalStore,
    LearnInput,
    PostgresJournalStore,
    SQLiteJournalStore,
    arguments_digest,
    attempt_record,
    learned_value,
    new_call_id,
    open_journal_store,
    outcome_of,
    percentile,
)
from breakwater.journal import _rollups as rollups_module
from breakwater.journal._records import _COLUMNS, _as_row
from breakwater.journal._sql import _ddl
from breakwater.journal._stats import HANG_FACTOR
from breakwater.testing.server import Latency, stdio_params

# PostgreSQL: the `pg_conninfo` and `pg_schema` fixtures are in conftest.py.


StoreFactory = Callable[[], JournalStore]


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Builds stores of the parametrized kind on one database (a real file, or a real server); closes them."""
    made: list[JournalStore] = []
    if request.param == "sqlite":
        db = tmp_path / "journal.sqlite3"

        def factory() -> JournalStore:
            made.append(SQLiteJournalStore(db))
            return made[-1]
    else:
        conninfo = request.getfixturevalue("pg_conninfo")
        schema = request.getfixturevalue("pg_schema")

        def factory() -> JournalStore:
            made.append(PostgresJournalStore(conninfo, schema=schema))
            return made[-1]

    yield factory
    for store in made:
        store.close()


def rec(clock: FakeClock, duration: float, *, outcome: str = "completed", **kw: Any) -> AttemptRecord:
    fields: dict[str, Any] = {"server": "s", "tool": "t", "call_id": new_call_id(), "attempt": 1, "started_at": clock.time()}
    fields.update(kw)
    return AttemptRecord(duration_s=duration, outcome=outcome, **fields)


# ---------------------------------------------------------------------------- the store contract


def test_the_call_paths_positional_constructor_is_the_records_own() -> None:
    """`attempt_record` (the gate's cheap way to build a row) takes exactly the fields, in their order, and builds
    the record the keyword constructor does."""
    fields = [f.name for f in dataclasses.fields(AttemptRecord)]
    assert list(inspect.signature(attempt_record).parameters) == fields
    values: list[Any] = [f"v{i}" for i in range(len(fields))]
    built = attempt_record(*values)
    assert built == AttemptRecord(**dict(zip(fields, values, strict=True))) and type(built) is AttemptRecord


def test_rows_round_trip_with_every_field(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store()
    journal = Journal(store, clock=clock)
    size, digest = arguments_digest({"b": 2, "a": [1, "x"]})
    full = AttemptRecord(
        server="orders",
        tool="place",
        call_id="call-1",
        attempt=2,
        started_at=clock.time(),
        duration_s=0.125,
        outcome=outcome_of(ErrorCode.TIMEOUT),
        error_code=ErrorCode.TIMEOUT.value,
        retries=1,
        trace_id="trace-9",
        operation_id="op-7",
        server_breaker="closed",
        tool_breaker="open",
        breaker_opened=True,
        client="claude-code",
        arguments_size=size,
        result_size=None,
        arguments_hash=digest,
    )
    bare = rec(clock, 0.01, call_id="call-2")
    assert journal.record(full) and journal.record(bare)
    journal.flush()
    assert journal.counters()["written"] == 2
    got = store.recent(10)
    assert [r.call_id for r in got] == ["call-2", "call-1"]  # newest first (same time: last written first)
    assert next(r for r in got if r.call_id == "call-1") == full
    assert next(r for r in got if r.call_id == "call-2") == bare
    assert [r.call_id for r in store.recent(10, failures_only=True)] == ["call-1"]
    assert store.recent(10, server="nope") == []
    # Canonical: key order does not change the hash; the content does.
    assert arguments_digest({"a": [1, "x"], "b": 2}) == (size, digest)
    assert arguments_digest({"a": [1, "y"], "b": 2})[1] != digest
    journal.close()


def test_a_batch_of_hundreds_of_rows_reads_back_row_for_row(make_store: StoreFactory) -> None:
    """A batch large enough for SQLite's many-row INSERTs (and a remainder) stores every row, every field, in order."""
    clock = FakeClock()
    store = make_store()
    journal = Journal(store, clock=clock)
    written = []
    for i in range(101):  # two INSERTs of 48 rows and 5 rows more
        clock.advance(0.001)
        odd = i % 2 == 1
        written.append(
            AttemptRecord(
                server=f"s{i % 3}",
                tool=f"t{i % 5}",
                call_id=f"call-{i}",
                attempt=1 + i % 3,
                started_at=clock.time(),
                duration_s=i / 7,
                outcome="timeout" if odd else "completed",
                error_code="TIMEOUT" if odd else None,
                retries=i % 3,
                trace_id=None if i % 4 else f"trace-{i}",
                operation_id=f"op-{i}" if odd else None,
                server_breaker="closed",
                tool_breaker="open" if i % 5 == 0 else "closed",
                breaker_opened=i % 5 == 0,
                client=None if odd else "claude-code",
                arguments_size=i * 10 if odd else None,
                result_size=i if i % 3 == 0 else None,
                arguments_hash=f"{i:016x}" if odd else None,
            )
        )
    for r in written:
        assert journal.record(r)
    journal.flush()
    assert journal.counters()["written"] == 101
    assert store.recent(200) == written[::-1]  # newest first
    journal.close()


def test_schema_is_versioned_and_migrates_once(make_store: StoreFactory) -> None:
    first = make_store()
    first.open()
    assert first.schema_version() == SCHEMA_VERSION
    second = make_store()
    second.open()  # a second process (or replica) finds the schema in place
    assert second.schema_version() == SCHEMA_VERSION
    if isinstance(first, SQLiteJournalStore):
        with sqlite3.connect(first.path) as conn:
            versions = conn.execute("SELECT version FROM breakwater_journal_schema_version").fetchall()
            conn.execute("INSERT INTO breakwater_journal_schema_version VALUES (99, 0, 'from the future')")
    else:
        import psycopg

        assert isinstance(first, PostgresJournalStore)
        with psycopg.connect(first.conninfo, autocommit=True) as pg:
            table = f'"{first.schema}".breakwater_journal_schema_version'
            versions = pg.execute(f"SELECT version FROM {table}").fetchall()
            pg.execute(f"INSERT INTO {table} (version, description) VALUES (99, 'from the future')")
    assert versions == [(1,), (2,), (3,)]
    with pytest.raises(JournalError, match="newer than this breakwater"):
        make_store().open()


def test_marks_of_sent_attempts_stay_only_while_unanswered(make_store: StoreFactory) -> None:
    """A mark and its row in one batch leave nothing behind; a mark whose row comes later stays until then; a
    mark of a dead process reads as outcome unknown. Marks are never attempts (`stats`, `recent`)."""
    from breakwater.journal import SENT
    from breakwater.journal._in_flight import InFlight

    clock = FakeClock()
    store = make_store()
    store.open()
    quick, slow, lost = (rec(clock, 0.0, outcome=SENT, operation_id=f"op-{n}") for n in ("quick", "slow", "lost"))
    store.insert([quick, slow, lost, replace(quick, outcome="completed", duration_s=0.1)])
    assert {m.operation_id for m in store.in_flight(10)} == {"op-slow", "op-lost"}
    assert [r.operation_id for r in store.recent(10)] == ["op-quick"]
    assert store.tool_stats(clock.time() - 60)[0].attempts == 1
    store.insert([replace(slow, outcome="completed", duration_s=2.0)])
    (left,) = store.in_flight(10)
    assert left.operation_id == "op-lost" and not left.outcome_unknown  # this process is alive
    dead = InFlight(**{**vars(left), "writer": left.writer.rsplit(":", 1)[0] + ":999999999"})
    assert dead.outcome_unknown and dead.to_json()["state"] == "outcome_unknown"
    # Purged with the attempts of its minute.
    clock.advance(3 * 86400)
    store.purge(clock.time())
    assert store.in_flight(10) == []


def test_stats_percentiles_and_rates_against_a_known_sample(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store()
    journal = Journal(store, clock=clock, policy=JournalPolicy(learn_timeouts=False))
    answered = [i / 1000 for i in range(1, 1001)]  # 1 ms … 1000 ms: every percentile is known exactly
    random.Random(7).shuffle(answered)
    for i, d in enumerate(answered):
        # 10 % of the answers are the tool's own errors: latency counts, success does not.
        journal.record(rec(clock, d, outcome="tool_error" if i % 10 == 0 else "completed", error_code=None))
    # 20 calls that timed out once and then completed (a retry each), 5 that timed out for good and
    # opened the breaker, 3 that ended OUTCOME_UNKNOWN, 4 refused by the open breaker.
    for _ in range(20):
        call = new_call_id()
        journal.record(rec(clock, 5.0, outcome="timeout", call_id=call, error_code="TIMEOUT"))
        journal.record(rec(clock, 0.5, call_id=call, attempt=2, retries=1))
    for _ in range(5):
        journal.record(rec(clock, 5.0, outcome="timeout", error_code="TIMEOUT", breaker_opened=True))
    for _ in range(3):
        journal.record(rec(clock, 0.2, outcome="outcome_unknown", error_code="OUTCOME_UNKNOWN"))
    for _ in range(4):
        journal.record(rec(clock, 0.0, outcome="circuit_open", error_code="CIRCUIT_OPEN"))
    # Two refused for the caller's own request (an argument the schema refuses, a tool no server lists): no calls of
    # the tool, so not in its success rate (a healthy tool read 50 % for one bad argument).
    journal.record(rec(clock, 0.0, outcome="invalid_arguments", error_code="INVALID_ARGUMENTS"))
    journal.record(rec(clock, 0.0, outcome="unknown_tool", error_code="UNKNOWN_TOOL"))
    # One call whose answer was lost, then settled by get_operation: a success, one attempt, no retry.
    lost = new_call_id()
    journal.record(rec(clock, 5.0, outcome="timeout", call_id=lost, error_code="TIMEOUT"))
    journal.record(rec(clock, 0.05, outcome="reconciled", call_id=lost, attempt=2))
    journal.record(rec(clock, 0.3, tool="other"))
    journal.flush()
    stats = journal.stats(3600)
    assert [(s.server, s.tool) for s in stats] == [("s", "other"), ("s", "t")]
    t = stats[1]
    assert t.calls == 1000 + 20 + 5 + 3 + 4 + 1
    assert t.succeeded == 900 + 20 + 1
    assert t.attempts == 1000 + 40 + 5 + 3 + 1
    assert t.refused == 4 + 2
    assert t.timeouts == 26
    assert t.outcome_unknown == 3
    assert t.breaker_opens == 5
    # Answered attempts: the 1000 known values plus twenty 0.5 s retries. The raw scan ranks them
    # exactly; the rollups (what `stats` reads by default) land within the histogram's accuracy.
    values = sorted([*answered, *[0.5] * 20])
    exact = (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 0.99))
    assert exact == (0.5, 0.949, 0.99)
    raw = journal.stats(3600, exact=True)[1]
    assert (raw.p50_s, raw.p95_s, raw.p99_s) == exact
    assert replace(raw, p50_s=t.p50_s, p95_s=t.p95_s, p99_s=t.p99_s) == t  # both paths count alike
    assert t.p50_s == pytest.approx(0.5, rel=HISTOGRAM_ACCURACY)
    assert t.p95_s == pytest.approx(0.949, rel=HISTOGRAM_ACCURACY)
    assert t.p99_s == pytest.approx(0.99, rel=HISTOGRAM_ACCURACY)
    assert t.success_rate == pytest.approx(921 / 1033)
    assert (t.timeout_s, t.timeout_source) == (CallPolicy().timeout_s, "default")  # nothing learned, no config
    assert t.timeout_rate == pytest.approx(26 / 1049)
    assert t.retries == 20
    assert t.retries_per_call == pytest.approx(20 / 1033)
    assert journal.stats(3600, tool="other")[0].calls == 1
    assert journal.stats(3600, server="nope") == []
    clock.advance(3601)
    assert journal.stats(3600) == []  # the window moved past every row
    assert journal.stats(7200)[1].calls == t.calls
    journal.close()


OUTCOMES = ("completed",) * 16 + ("tool_error", "timeout", "circuit_open", "outcome_unknown")


def scattered(clock: FakeClock, n: int, span_s: float, seed: int) -> list[AttemptRecord]:
    """`n` attempts of three tools at random times over the last `span_s` seconds (not minute-aligned,
    not in time order), with every kind of outcome, retries, breaker opens and lognormal latencies."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        outcome = rng.choice(OUTCOMES)
        attempt = 1 if rng.random() < 0.9 else 2
        out.append(
            rec(
                clock,
                0.0 if outcome == "circuit_open" else rng.lognormvariate(math.log(0.08), 0.9),
                outcome=outcome,
                tool=rng.choice("abc"),
                attempt=attempt,
                retries=attempt - 1,
                breaker_opened=rng.random() < 0.01,
                started_at=clock.time() - rng.uniform(0, span_s),
            )
        )
    return out


def oracle(records: list[AttemptRecord], since: float, tool: str) -> tuple[int, int, list[float]]:
    """(calls, attempts sent, sorted answered durations) of `tool` since `since`, computed here from the records."""
    mine = [r for r in records if r.tool == tool and r.started_at >= since]
    calls = sum(1 for r in mine if r.attempt == 1)
    sent = sum(1 for r in mine if r.outcome != "circuit_open")
    return calls, sent, sorted(r.duration_s for r in mine if r.outcome in ("completed", "tool_error"))


class StatsFilters(TypedDict, total=False):
    """The filter keywords of `Journal.stats`."""

    server: str
    tool: str


def test_rollup_stats_match_the_raw_scan_on_any_window(make_store: StoreFactory) -> None:
    """Windows that start mid-minute (whole minutes from the rollups, the partial first one from raw
    rows), with and without filters: the counts are exact and every percentile is within the
    histogram's accuracy of the exact nearest-rank value, checked against the raw scan and against
    the records themselves."""
    clock = FakeClock()
    journal = Journal(make_store(), clock=clock, policy=JournalPolicy(learn_timeouts=False))
    records = scattered(clock, 6000, 1800, seed=11)
    for record in records:
        journal.record(record)
    journal.flush()
    worst = 0.0
    filter_sets: tuple[StatsFilters, ...] = ({}, {"tool": "b"}, {"server": "s", "tool": "c"}, {"server": "nope"})
    for since_s in (1800.5, 1234.567, 600.0, 60.0, 59.9, 7.25):
        for filters in filter_sets:
            rolled = journal.stats(since_s, **filters)
            exact = journal.stats(since_s, exact=True, **filters)
            assert [(s.server, s.tool) for s in rolled] == [(s.server, s.tool) for s in exact]
            for r, e in zip(rolled, exact, strict=True):
                assert replace(r, p50_s=e.p50_s, p95_s=e.p95_s, p99_s=e.p99_s) == e
                calls, sent, durations = oracle(records, clock.time() - since_s, r.tool)
                assert (r.calls, r.attempts) == (calls, sent)
                for q, got, raw in ((0.5, r.p50_s, e.p50_s), (0.95, r.p95_s, e.p95_s), (0.99, r.p99_s, e.p99_s)):
                    want = percentile(durations, q)
                    assert raw == pytest.approx(want)  # PostgreSQL hands back float8 through the driver
                    assert got is not None and want is not None
                    assert got == pytest.approx(want, rel=HISTOGRAM_ACCURACY)
                    worst = max(worst, abs(got / want - 1))
    assert 0 < worst <= HISTOGRAM_ACCURACY
    # Learning reads the same rollups: the quantile of answers and timeouts, within the same accuracy.
    since = clock.time() - 900.5
    for inp in journal.store.learn_inputs(since, 0.999):
        mine = [r for r in records if r.tool == inp.tool and r.started_at >= since]
        samples = sorted(r.duration_s for r in mine if r.outcome in ("completed", "tool_error", "timeout"))
        assert inp.completed == sum(1 for r in mine if r.outcome == "completed")
        assert inp.quantile_s == pytest.approx(percentile(samples, 0.999), rel=HISTOGRAM_ACCURACY)
    journal.close()


def test_writers_sharing_a_minute_never_lose_counts(make_store: StoreFactory) -> None:
    """Two writers (two processes' connections, or two replicas) adding to the same rollup rows at
    once: every attempt is counted, every latency sample is kept."""
    clock = FakeClock()
    stores = [make_store(), make_store()]
    for store in stores:
        store.open()
    batches = [[rec(clock, 0.01 * (1 + i % 7)) for i in range(40)] for _ in range(60)]

    def write(store: JournalStore, mine: list[list[AttemptRecord]]) -> None:
        for batch in mine:
            store.insert(batch)

    threads = [threading.Thread(target=write, args=(store, batches[i::2])) for i, store in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    (stats,) = stores[0].tool_stats(clock.time() - 60)
    assert (stats.calls, stats.attempts) == (2400, 2400)
    exact = stores[0].tool_stats(clock.time() - 60, exact=True)[0]
    assert (stats.p50_s, stats.p99_s) == pytest.approx((exact.p50_s, exact.p99_s), rel=HISTOGRAM_ACCURACY)


def create_schema_1(store: JournalStore, records: list[AttemptRecord]) -> None:
    """A journal as breakwater 0.1 (schema 1) left it: the attempts table and nothing else."""
    cols = ", ".join(_COLUMNS)
    if isinstance(store, SQLiteJournalStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "CREATE TABLE breakwater_journal_schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL, "
                "description TEXT NOT NULL)"
            )
            for statement in _ddl("REAL", "INTEGER", "INTEGER PRIMARY KEY", "breakwater_attempts"):
                conn.execute(statement)
            conn.execute("INSERT INTO breakwater_journal_schema_version VALUES (1, 0, 'attempts table')")
            marks = ", ".join("?" for _ in _COLUMNS)
            conn.executemany(f"INSERT INTO breakwater_attempts ({cols}) VALUES ({marks})", [_as_row(r) for r in records])
        return
    import psycopg

    assert isinstance(store, PostgresJournalStore) and store.schema
    with psycopg.connect(store.conninfo, autocommit=True) as pg:
        prefix = f'"{store.schema}".'
        pg.execute(f'CREATE SCHEMA IF NOT EXISTS "{store.schema}"')
        pg.execute(
            f"CREATE TABLE {prefix}breakwater_journal_schema_version (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now(), description TEXT NOT NULL)"
        )
        serial = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        for statement in _ddl("DOUBLE PRECISION", "BOOLEAN", serial, f"{prefix}breakwater_attempts"):
            pg.execute(statement)
        pg.execute(f"INSERT INTO {prefix}breakwater_journal_schema_version (version, description) VALUES (1, 'attempts table')")
        with pg.cursor() as cur, cur.copy(f"COPY {prefix}breakwater_attempts ({cols}) FROM STDIN") as copy:
            for r in records:
                copy.write_row(_as_row(r))


def test_a_schema_1_journal_is_migrated_and_its_rollups_backfilled(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollups_module, "_BACKFILL_PAGE", 700)  # several pages, splitting minutes anywhere
    clock = FakeClock()
    records = scattered(clock, 3000, 3000, seed=5)
    old = make_store()
    create_schema_1(old, records)
    before = old.tool_stats(clock.time() - 3600)  # a reader never migrates: it scans the raw rows
    assert sum(s.calls for s in before) == sum(1 for r in records if r.attempt == 1)
    journal = Journal(make_store(), clock=clock, policy=JournalPolicy(learn_timeouts=False))
    journal.record(rec(clock, 0.2, tool="a"))  # lands in a minute the backfill already filled
    journal.flush()
    assert journal.store.schema_version() == SCHEMA_VERSION
    rolled, exact = journal.stats(3600), journal.stats(3600, exact=True)
    assert [replace(r, p50_s=e.p50_s, p95_s=e.p95_s, p99_s=e.p99_s) for r, e in zip(rolled, exact, strict=True)] == exact
    assert [(s.tool, s.calls) for s in rolled] == [(s.tool, s.calls + (s.tool == "a")) for s in before]
    for r, e in zip(rolled, exact, strict=True):
        assert r.p95_s == pytest.approx(e.p95_s, rel=HISTOGRAM_ACCURACY)
    journal.close()


def rollup_rows(store: JournalStore) -> int:
    if isinstance(store, SQLiteJournalStore):
        with sqlite3.connect(store.path) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM breakwater_rollups").fetchone()[0])
    import psycopg

    assert isinstance(store, PostgresJournalStore)
    with psycopg.connect(store.conninfo, autocommit=True) as pg:
        row = pg.execute(f'SELECT COUNT(*) FROM "{store.schema}".breakwater_rollups').fetchone()
        assert row is not None
        return int(row[0])


def test_retention_is_enforced_by_the_writer(make_store: StoreFactory) -> None:
    clock = FakeClock()
    journal = Journal(make_store(), clock=clock, policy=JournalPolicy(retention_days=14, flush_interval_s=0.01))
    journal.start()
    try:
        for _ in range(10):
            journal.record(rec(clock, 0.1))
        assert journal.flush()
        clock.advance(13 * 86400)
        journal.record(rec(clock, 0.1, tool="young"))
        assert journal.flush()
        assert journal.purged == 0
        assert sum(s.calls for s in journal.stats(30 * 86400)) == 11
        clock.advance(1.5 * 86400)  # the first ten are now 14.5 days old; the young one 1.5 days
        assert journal.flush()
        assert journal.purged == 10
        assert [(s.tool, s.calls) for s in journal.stats(30 * 86400)] == [("young", 1)]
        assert rollup_rows(journal.store) == 1  # the old minute's rollup went with its rows
    finally:
        journal.close()


def test_learned_timeout_from_a_seeded_lognormal(make_store: StoreFactory) -> None:
    """The testserver's own lognormal(0.2, 0.5): the learned timeout is p99.9 × headroom, and the
    analytical false-timeout rate at that timeout is far below 0.1 %."""
    clock = FakeClock()
    policy = JournalPolicy(learn_floor_s=0.01, learn_ceiling_s=60.0)
    journal = Journal(make_store(), clock=clock, policy=policy)
    latency, rng = Latency.parse("lognormal(0.2,0.5)"), random.Random(1234)
    durations = [latency.draw(rng) for _ in range(2000)]
    for i, d in enumerate(durations[:49]):
        journal.record(rec(clock, d, call_id=f"c{i}"))
    journal.flush()
    journal.refresh_learned()
    assert journal.learned_timeout("s", "t") is None  # 49 completed calls: below the 50 minimum
    for i, d in enumerate(durations[49:], start=49):
        journal.record(rec(clock, d, call_id=f"c{i}"))
    journal.record(rec(clock, 0.1, outcome="circuit_open", call_id="refused"))  # not a latency sample
    journal.flush()
    journal.refresh_learned()
    expected = percentile(sorted(durations), 0.999)
    assert expected is not None
    learned = journal.learned_timeout("s", "t")
    # Learned from the rollups' histogram: within its accuracy of the exact quantile.
    assert learned is not None and learned == pytest.approx(expected * 2.0, rel=HISTOGRAM_ACCURACY)
    assert journal.stats(3600)[0].learned_timeout_s == learned
    assert _lognormal_tail(learned, median=0.2, sigma=0.5) <= 0.001
    # A few attempts cut far beyond every answer are hangs, not the tool's latency: the timeout stays (counted, a short
    # slow spell doubled it, and the next one doubled it again).
    for _ in range(10):
        journal.record(rec(clock, 5.0, outcome="timeout"))
    journal.flush()
    journal.refresh_learned()
    assert journal.learned_timeout("s", "t") == pytest.approx(learned, rel=2 * HISTOGRAM_ACCURACY)
    # A timed-out attempt counts at the time it was cut: when many are (the tool turned slower), the timeout grows, to
    # at most HANG_FACTOR times the answers' own quantile (not to 2 x 5 s: the breaker's business, that tool's state).
    for _ in range(300):
        journal.record(rec(clock, 5.0, outcome="timeout"))
    journal.flush()
    journal.refresh_learned()
    assert journal.learned_timeout("s", "t") == pytest.approx(learned * HANG_FACTOR, rel=2 * HISTOGRAM_ACCURACY)
    # Outside the window, nothing is learned (and it never was for other tools).
    clock.advance(policy.learn_window_s + 1)
    journal.refresh_learned()
    assert journal.learned_timeout("s", "t") is None
    assert journal.learned_timeout("s", "other") is None
    journal.close()


def _lognormal_tail(x: float, *, median: float, sigma: float) -> float:
    """P(X > x) for a lognormal with this median and sigma."""
    return 0.5 * math.erfc((math.log(x) - math.log(median)) / (sigma * math.sqrt(2)))


def test_learned_value_clamps_and_needs_samples() -> None:
    policy = JournalPolicy(learn_min_samples=50, learn_headroom=2.0, learn_floor_s=1.0, learn_ceiling_s=30.0)
    assert learned_value(LearnInput(server="s", tool="t", completed=49, quantile_s=2.0), policy) is None
    assert learned_value(LearnInput(server="s", tool="t", completed=50, quantile_s=2.0), policy) == 4.0
    assert learned_value(LearnInput(server="s", tool="t", completed=50, quantile_s=0.1), policy) == 1.0
    assert learned_value(LearnInput(server="s", tool="t", completed=50, quantile_s=100.0), policy) == 30.0
    assert learned_value(LearnInput(server="s", tool="t", completed=50, quantile_s=None), policy) is None


def test_a_short_slow_spell_does_not_double_the_learned_timeout() -> None:
    """A 0.11 s tool, its learned timeout 1 s, hangs twice: counted at 1 s, the two cuts made the p99.9 1 s and the
    timeout 2 s; the next spell made it 4 s, then 8 s. Cuts near the answers (a heavy tail) or many of them (a tool
    turned slower) still move it up."""
    policy = JournalPolicy(learn_min_samples=20, learn_headroom=2.0, learn_floor_s=0.1, learn_ceiling_s=120.0)

    def learned(answered: list[float], cuts: list[float]) -> float | None:
        q = policy.learn_quantile
        inp = LearnInput(
            server="s",
            tool="t",
            completed=len(answered),
            quantile_s=percentile(sorted(answered + cuts), q),
            answered_quantile_s=percentile(sorted(answered), q),
            cut=len(cuts),
            attempts=len(answered) + len(cuts),
        )
        return learned_value(inp, policy)

    healthy = [0.1 + i / 1000 for i in range(74)]  # 0.100 to 0.173 s
    assert learned(healthy, [1.0, 1.0]) == pytest.approx(0.346)  # the answers' own p99.9, doubled: not 2 s
    assert learned(healthy, [1.0] * 6 + [2.0] * 2) == pytest.approx(0.346)  # a third spell: not 8 s
    assert learned(healthy, [0.5] * 30) == 1.0  # 29 % of attempts cut: the tool turned slower, the timeout follows
    # ...up to HANG_FACTOR times the answers' own p99.9: a tool stuck far beyond that is the breaker's (each refresh
    # doubled its timeout, to 16.5 s for a 0.2 s tool, for the whole window).
    assert learned(healthy, [1.0] * 30) == pytest.approx(0.173 * HANG_FACTOR * 2)
    heavy_tail = [*healthy, 0.6, 0.7, 0.8, 0.9]
    assert learned(heavy_tail, [1.0, 1.0]) == 2.0  # cut near the slowest answers: the tail, not a hang


# ---------------------------------------------------------------------------- never blocking


class StalledStore:
    """A store whose writes hang until released: a dead disk, a locked database."""

    location = "stalled"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.rows = 0

    def open(self) -> None:
        pass

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def insert(self, records: Any) -> None:
        self.entered.set()
        self.release.wait(30)
        self.rows += len(records)

    def purge(self, before: float) -> int:
        return 0

    def tool_stats(self, since: float, *, server: str | None = None, tool: str | None = None, exact: bool = False) -> list[Any]:
        return []

    def learn_inputs(self, since: float, quantile: float) -> list[LearnInput]:
        return []

    def recent(self, limit: int, **kw: Any) -> list[AttemptRecord]:
        return []

    def in_flight(self, limit: int) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def test_full_queue_drops_and_counts_without_blocking() -> None:
    store = StalledStore()
    journal = Journal(store, policy=JournalPolicy(queue_size=1000, flush_interval_s=0.01))
    journal.start()
    clock = FakeClock()
    try:
        journal.record(rec(clock, 0.1))
        assert store.entered.wait(5), "the writer never started writing"
        # The writer is now stuck inside insert(): everything from here on waits in the queue or is dropped.
        records = [rec(clock, 0.1) for _ in range(20_000)]
        costs = []
        for r in records:
            t0 = time.perf_counter()
            journal.record(r)
            costs.append(time.perf_counter() - t0)
        assert journal.queued == 1000
        assert journal.dropped == 19_000
        mean_us = statistics.fmean(costs) * 1e6
        worst_ms = max(costs) * 1e3
        # A few hundred ns on this machine; generous bounds because other work shares the CPUs.
        assert mean_us < 20, f"record() took {mean_us:.1f} us on average with the writer stalled"
        assert worst_ms < 50, f"one record() took {worst_ms:.1f} ms"
        store.release.set()
        assert journal.flush(10)
        assert store.rows == 1001
        assert journal.counters() | {"location": None} == {
            "location": None,
            "recorded": 1001,
            "dropped": 19_000,
            "written": 1001,
            "failed": 0,
            "purged": 0,
            "queued": 0,
            "last_error": None,
        }
    finally:
        store.release.set()
        journal.close()


def test_a_locked_sqlite_file_costs_rows_not_latency(tmp_path: Path) -> None:
    """A real SQLite journal whose file another process holds locked: calls go on at full speed."""
    db = tmp_path / "journal.sqlite3"
    store = SQLiteJournalStore(db)
    store.open()
    store.close()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    journal = Journal(SQLiteJournalStore(db), policy=JournalPolicy(queue_size=500, flush_interval_s=0.01))
    journal.start()
    clock = FakeClock()
    try:
        t0 = time.perf_counter()
        for _ in range(5000):
            journal.record(rec(clock, 0.1))
        elapsed = time.perf_counter() - t0
        assert elapsed < 0.2, f"5000 record() calls took {elapsed * 1000:.0f} ms against a locked file"
        assert journal.dropped >= 4000
        blocker.execute("ROLLBACK")
        blocker.close()
        assert journal.flush(40)
        written = journal.counters()["written"]
        assert written + journal.dropped == 5000
        assert sum(s.calls for s in journal.stats(3600)) == written
    finally:
        journal.close()


def test_an_unreachable_store_is_counted_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    journal = Journal(SQLiteJournalStore(blocked / "journal.sqlite3"))
    assert journal.record(rec(FakeClock(), 0.1))
    journal.flush()
    assert journal.last_error is not None and journal.last_error.startswith("open:")
    # Said once, as breakwater's, with what to do (it read "journal open: OSError ..." with neither).
    said = [r.getMessage() for r in caplog.records if "call journal" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("breakwater: the call journal open:") and "fix:" in said[0]
    journal.close()
    assert journal.counters()["failed"] == 1
    assert journal.learned_timeout("s", "t") is None


@pytest.mark.parametrize("kind", ["a user's file", "a directory"])
def test_a_journal_path_that_names_no_journal_is_left_alone_and_another_path_is_the_fix(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """`BREAKWATER_JOURNAL=~/notes.txt` (a slip): SQLite calls it "not a database", as it does a damaged journal, and the
    fix said was `mv ~/notes.txt ~/notes.txt.damaged`. It names another path now, and the file is left as it was; a
    damaged journal (SQLite's header, then garbage) is still told to be moved aside."""
    if kind == "a directory":
        named = tmp_path / "logs"
        named.mkdir()
        (named / "keep.txt").write_text("mine")
    else:
        named = tmp_path / "notes.txt"
        named.write_text("my notes\n" * 100)
    before = sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
    store = open_journal_store(str(named))
    assert store is not None
    journal = Journal(store)
    assert journal.record(rec(FakeClock(), 0.1))
    journal.flush()
    journal.close()
    trouble = [r.getMessage() for r in caplog.records if "call journal" in r.getMessage()]
    assert len(trouble) == 1, trouble
    assert "is not an SQLite database" in trouble[0] or "is a directory" in trouble[0], trouble
    assert "mv " not in trouble[0] and "BREAKWATER_JOURNAL) to a file of the journal's own" in trouble[0], trouble
    assert cli_main(["stats", "--journal", str(named)]) == 1
    said = capsys.readouterr().err
    assert f"cannot read the journal at {named}: NotSQLiteError" in said and "mv " not in said, said
    # Nothing written, moved or added (no -wal or -shm beside it).
    assert sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before

    damaged = tmp_path / "old.sqlite3"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    assert cli_main(["stats", "--journal", str(damaged)]) == 1
    assert f"mv {damaged} {damaged}.damaged" in capsys.readouterr().err


def test_a_postgresql_url_libpq_cannot_read_names_its_fix_as_the_journal_opens() -> None:
    """`?foo=1`: "set [journal] url or BREAKWATER_JOURNAL to a writable path, or off" said nothing of the URL's option."""
    store = open_journal_store("postgresql://u:Pw9xQ@127.0.0.1:9/db?foo=1")
    assert store is not None
    journal = Journal(store)
    assert journal.record(rec(FakeClock(), 0.1))
    journal.flush()
    journal.close()
    trouble = journal.trouble() or ""
    assert 'invalid URI query parameter: "foo"' in trouble and "keep only the options libpq reads" in trouble, trouble
    assert "Pw9xQ" not in trouble


def test_config_check_notes_a_journal_path_that_names_no_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config is valid (calls would go on, unrecorded), so `config check` passes, and says so in a note."""
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.delenv("BREAKWATER_JOURNAL", raising=False)  # the suite's own "off" would stand over the file's
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    config = tmp_path / "breakwater.toml"
    config.write_text(f'[journal]\nurl = "{notes}"\n\n[servers.a]\ncommand = "true"\n')
    assert cli_main(["config", "check", "--config", str(config)]) == 0
    said = " ".join(capsys.readouterr().out.split())  # as read, whatever the terminal's width wrapped
    assert f"note: the call journal: {notes} is not an SQLite database" in said, said
    config.write_text(f'[journal]\nurl = "{tmp_path / "journal.sqlite3"}"\n\n[servers.a]\ncommand = "true"\n')
    assert cli_main(["config", "check", "--config", str(config)]) == 0
    assert "note:" not in capsys.readouterr().out


# ---------------------------------------------------------------------------- adaptation, measured


def simulate(
    journal: Journal, clock: FakeClock, latency: Latency, rng: random.Random, calls: int, default_s: float
) -> tuple[int, int]:
    """Closed loop: each call waits at most the timeout in force (learned, else `default_s`); a call
    longer than that is recorded as a timeout at that time. Returns (false timeouts, calls decided by
    a learned timeout)."""
    false = judged = 0
    for i in range(calls):
        learned = journal.learned_timeout("s", "t")
        timeout = learned if learned is not None else default_s
        d = latency.draw(rng)
        if d > timeout:
            journal.record(rec(clock, timeout, outcome="timeout"))
        else:
            journal.record(rec(clock, d))
        if learned is not None:
            judged += 1
            false += d > timeout
        clock.advance(1.0)
        if i % 100 == 99:
            journal.flush()  # runs the writer's maintenance: a refresh every learn_refresh_s
    return false, judged


def test_learned_timeouts_converge_and_adapt_with_few_false_timeouts(tmp_path: Path) -> None:
    clock = FakeClock()
    policy = JournalPolicy(learn_floor_s=0.01, learn_refresh_s=100)
    journal = Journal(SQLiteJournalStore(tmp_path / "j.sqlite3"), clock=clock, policy=policy)
    rng = random.Random(99)
    false, judged = simulate(journal, clock, Latency.parse("lognormal(0.2,0.5)"), rng, 4000, default_s=5.0)
    assert judged >= 3800
    assert false / judged <= 0.001
    before = journal.learned_timeout("s", "t")
    assert before is not None and 0.5 < before < 2.5
    # The tool turns 5x slower: the old timeout cuts calls, which raises the quantile, until it fits again.
    slow = Latency.parse("lognormal(1.0,0.5)")
    simulate(journal, clock, slow, rng, 1500, default_s=5.0)
    after = journal.learned_timeout("s", "t")
    assert after is not None and after > 3 * before
    false, judged = simulate(journal, clock, slow, rng, 4000, default_s=5.0)
    assert false / judged <= 0.001, f"{false} false timeouts in {judged} calls"
    journal.close()


# ---------------------------------------------------------------------------- a thin real path


class JournaledClient:
    """Records each `call_tool` of a real `mcp.Client` as the gate will: one attempt per call."""

    def __init__(self, client: Client, journal: Journal, server: str) -> None:
        self.client, self.journal, self.server = client, journal, server

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        started, t0 = time.time(), time.monotonic()
        result, code = None, None
        try:
            with anyio.fail_after(timeout):
                result = await self.client.call_tool(tool, arguments)
            code = ErrorCode.TOOL_ERROR if result.is_error else None
        except TimeoutError:
            code = ErrorCode.TIMEOUT
        self.journal.record(
            AttemptRecord(
                server=self.server,
                tool=tool,
                call_id=new_call_id(),
                attempt=1,
                started_at=started,
                duration_s=time.monotonic() - t0,
                outcome=outcome_of(code),
                error_code=None if code is None else code.value,
                client="pytest",
            )
        )
        return result


@pytest.mark.anyio
async def test_real_calls_against_the_testserver_land_in_stats(tmp_path: Path) -> None:
    journal = Journal(SQLiteJournalStore(tmp_path / "j.sqlite3"), policy=JournalPolicy(flush_interval_s=0.05))
    journal.start()
    flags = ("--tool", "work:latency=lognormal(0.03,0.4),readonly", "--tool", "bad:error=1", "--tool", "slow:latency=3")
    server_latencies = []
    try:
        async with Client(stdio_params(*flags), mode="legacy", read_timeout_seconds=10) as client:
            jc = JournaledClient(client, journal, "ts")
            for _ in range(40):
                result = await jc.call("work", {}, timeout=5)
                server_latencies.append(result.structured_content["latency_s"])
            for _ in range(3):
                await jc.call("bad", {}, timeout=5)
            await jc.call("slow", {}, timeout=0.3)
        assert await anyio.to_thread.run_sync(journal.flush)
        stats = {s.tool: s for s in journal.stats(600)}
    finally:
        journal.close()
    work = stats["work"]
    assert (work.calls, work.succeeded, work.timeouts) == (40, 40, 0)
    # The journal times the whole round trip: never shorter than the server's own latency, and close to it.
    server_p50 = percentile(sorted(server_latencies), 0.5)
    assert server_p50 is not None and work.p50_s is not None and work.p99_s is not None
    # Each call's round trip is at least its server-side latency, so every order statistic is too.
    assert server_p50 <= work.p50_s <= server_p50 + 0.1
    assert work.p99_s >= (percentile(sorted(server_latencies), 0.99) or 0)
    assert (stats["bad"].calls, stats["bad"].succeeded, stats["bad"].attempts) == (3, 0, 3)
    assert (stats["slow"].timeouts, stats["slow"].timeout_rate) == (1, 1.0)
    failures = journal.store.recent(10, failures_only=True)
    assert sorted(r.outcome for r in failures) == ["timeout", "tool_error", "tool_error", "tool_error"]
    assert {r.client for r in failures} == {"pytest"}
    journal.store.close()


# ---------------------------------------------------------------------------- config, construction, CLI


def test_journal_section_in_toml_and_environment(tmp_path: Path) -> None:
    toml = tmp_path / "breakwater.toml"
    toml.write_text(
        '[journal]\nurl = "postgresql://bw@db.internal/journal"\nretention_days = 3\nlearn_min_samples = 200\n'
        '[servers.a]\ncommand = "true"\n'
    )
    config = load_config(toml, environ={"BREAKWATER_JOURNAL_LEARN_HEADROOM": "3"})
    assert config.journal.url.startswith("postgresql://")
    assert (config.journal.retention_days, config.journal.learn_min_samples, config.journal.learn_headroom) == (3, 200, 3)
    assert isinstance(open_journal_store(config.journal.url), PostgresJournalStore)
    toml.write_text('[journal]\nretention_dayz = 3\n[servers.a]\ncommand = "true"\n')
    with pytest.raises(ConfigError, match="retention_days"):
        load_config(toml)
    json_file = tmp_path / ".mcp.json"
    json_file.write_text('{"mcpServers": {}}')
    assert load_config(json_file, environ={"BREAKWATER_JOURNAL": "off"}).journal.url == "off"


def test_urls_name_stores() -> None:
    assert open_journal_store("off") is None
    default = open_journal_store("")
    assert isinstance(default, SQLiteJournalStore) and default.path.name == "journal.sqlite3"
    assert isinstance(open_journal_store("sqlite:////tmp/x.db"), SQLiteJournalStore)
    assert str(open_journal_store("sqlite:////tmp/x.db").path) == "/tmp/x.db"  # type: ignore[union-attr]
    assert str(open_journal_store("~/j.db").path).startswith(str(Path.home()))  # type: ignore[union-attr]
    pg = open_journal_store("postgresql://bw:s3cret@db.internal:5433/journal?sslmode=require")
    assert isinstance(pg, PostgresJournalStore) and "s3cret" not in pg.location and "db.internal" in pg.location
    with pytest.raises(JournalError, match="unknown journal URL scheme") as raised:
        open_journal_store("mysql://x")
    assert isinstance(raised.value, BreakwaterError)  # one `except BreakwaterError` catches it too
    assert [parse_duration(x) for x in ("90", "90s", "15m", "1h", "2d", "250ms")] == [90, 90, 900, 3600, 172800, 0.25]
    with pytest.raises(ValueError):
        parse_duration("-1h")


@pytest.mark.anyio
async def test_breakwater_builds_the_configured_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BREAKWATER_JOURNAL")  # conftest turns journals off; this one comes from the config file
    db = tmp_path / "bw-journal.sqlite3"
    toml = tmp_path / "breakwater.toml"
    toml.write_text(f'[journal]\nurl = "{db}"\n[servers.a]\ncommand = "true"\nenabled = false\n')
    bw = Breakwater(load_config(toml), admission_dir=tmp_path / "adm")
    assert bw.journal is not None and bw.journal.store.location == str(db)
    # The gate consults the journal's cache between per-server config and the default.
    assert bw.gate._learned == bw.journal.learned_timeout
    async with bw:
        assert bw.journal.record(rec(FakeClock(), 0.1))
    assert db.exists() and bw.journal.counters()["written"] == 1
    off = Breakwater(load_config(toml), admission_dir=tmp_path / "adm", journal=None)
    assert off.journal is None


def test_stats_cli_reads_a_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no config here: stats needs none
    monkeypatch.setenv("COLUMNS", "160")
    db = tmp_path / "j.sqlite3"
    journal = Journal(SQLiteJournalStore(db))
    now = time.time()
    for i in range(1, 101):
        journal.record(
            AttemptRecord(
                server="a", tool="q", call_id=f"c{i}", attempt=1, started_at=now, duration_s=i / 100, outcome="completed"
            )
        )
    journal.record(AttemptRecord(server="a", tool="q", call_id="x", attempt=1, started_at=now, duration_s=3.0, outcome="timeout"))
    journal.record(
        AttemptRecord(server="b", tool="w", call_id="y", attempt=1, started_at=now - 7200, duration_s=1, outcome="completed")
    )
    journal.close()
    assert cli_main(["stats", "--journal", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(t["server"], t["tool"]) for t in out["tools"]] == [("a", "q")]
    q = out["tools"][0]
    assert (q["calls"], q["timeouts"]) == (101, 1)
    assert [q["p50_s"], q["p95_s"], q["p99_s"]] == pytest.approx([0.5, 0.95, 0.99], rel=HISTOGRAM_ACCURACY)
    p50 = q["p50_s"]
    # p99.9 is the 3 s timeout (within reach of the 1 s answers: not a hang), times 2
    assert q["learned_timeout_s"] == pytest.approx(6.0, rel=HISTOGRAM_ACCURACY)
    assert (q["timeout_s"], q["timeout_source"]) == (q["learned_timeout_s"], "learned")
    assert cli_main(["stats", "--journal", str(db), "--json", "--exact"]) == 0
    q = json.loads(capsys.readouterr().out)["tools"][0]
    assert (q["calls"], q["p50_s"], q["p95_s"], q["p99_s"]) == (101, 0.5, 0.95, 0.99)
    assert cli_main(["stats", "--journal", str(db), "--since", "3h", "--server", "b", "--json"]) == 0
    assert [t["tool"] for t in json.loads(capsys.readouterr().out)["tools"]] == ["w"]
    assert cli_main(["stats", "--journal", str(db), "--since", "3h"]) == 0
    table = capsys.readouterr().out
    assert "q" in table and "w" in table
    p50_row = next(line for line in table.splitlines() if " q " in line)
    assert f"{p50 * 1000:.0f} ms" in p50_row and "learned" in p50_row  # the timeout in force, and where it came from
    # A journal named and not there is a mistyped path, not a quiet system (it read "no calls recorded", exit 0).
    assert cli_main(["stats", "--journal", str(tmp_path / "none.sqlite3")]) == 1
    assert "no journal at" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()
    assert cli_main(["stats", "--journal", "off"]) == 2
    with pytest.raises(SystemExit):
        cli_main(["stats", "--since", "soon"])


def test_stats_before_the_first_call_reads_as_no_calls_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no config here: the default journal
    monkeypatch.setenv("BREAKWATER_JOURNAL_DB", str(tmp_path / "data" / "journal.sqlite3"))
    monkeypatch.delenv("BREAKWATER_JOURNAL", raising=False)
    assert cli_main(["stats"]) == 0
    assert "no calls recorded" in capsys.readouterr().out
    assert not (tmp_path / "data").exists()


def test_stats_cli_reads_postgresql(pg_conninfo: str, pg_schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    journal = Journal(PostgresJournalStore(pg_conninfo, schema=pg_schema))
    now = time.time()
    for i in range(1, 21):
        journal.record(
            AttemptRecord(
                server="a", tool="q", call_id=f"c{i}", attempt=1, started_at=now, duration_s=i / 10, outcome="completed"
            )
        )
    journal.close()
    assert cli_main(["stats", "--journal", f"{pg_conninfo} options=-csearch_path={pg_schema}", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["tools"][0]
    assert q["calls"] == 20
    assert [q["p50_s"], q["p95_s"]] == pytest.approx([1.0, 1.9], rel=HISTOGRAM_ACCURACY)
    assert cli_main(["stats", "--journal", f"{pg_conninfo} options=-csearch_path={pg_schema}", "--json", "--exact"]) == 0
    q = json.loads(capsys.readouterr().out)["tools"][0]
    assert (q["calls"], q["p50_s"], q["p95_s"]) == (20, 1.0, 1.9)


class _Forwarder:
    """TCP from a port of its own to PostgreSQL's, until `cut()`: the network between the journal and its database."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.target))
            self.pairs.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        self.open = False
        for a, b in self.pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        self.pairs.clear()


def test_rows_wait_for_a_database_that_went_away_after_it_was_open(pg_conninfo: str, pg_schema: str) -> None:
    """PostgreSQL unreachable after the journal had connected: the rows written meanwhile were dropped for good (only a
    store that was away at start kept them), and `last_error` stayed set after it came back."""
    port = int(re.search(r"port=(\d+)", pg_conninfo).group(1))  # type: ignore[union-attr]
    forwarder = _Forwarder(port)
    journal = Journal(PostgresJournalStore(pg_conninfo.replace(f"port={port}", f"port={forwarder.port}"), schema=pg_schema))
    clock = FakeClock()
    try:
        journal.record(rec(clock, 0.1))
        assert journal.flush(20) and journal.counters()["written"] == 1
        forwarder.cut()
        for _ in range(3):
            journal.record(rec(clock, 0.2))
        journal.flush(20)
        assert journal.counters()["written"] == 1 and journal.counters()["failed"] == 0 and journal.last_error
        forwarder.open = True  # the database is back: the next writes reconnect
        deadline = time.monotonic() + 20
        while journal.counters()["written"] < 4 and time.monotonic() < deadline:
            journal.flush(5)
        assert journal.counters()["written"] == 4 and journal.last_error is None, journal.counters()
    finally:
        journal.close()
        forwarder.listener.close()
