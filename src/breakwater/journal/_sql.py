"""The journal's stores: the `JournalStore` protocol, and the one SQL store both databases share.

`SQLJournalStore` holds everything the SQLite and PostgreSQL stores have in common: the schema and
its migrations, the write transaction around a batch and its rollups, purging whole minutes, and
every read (`tool_stats` from the rollups or the raw rows, `learn_inputs`, `recent`). What differs
is a `Dialect` (placeholder, column types, how to ask whether a table exists, whether the database
ranks percentiles itself) plus a handful of hooks a subclass writes: connecting, a transaction,
bulk insert, merging rollups and recording a schema version.

Writes come from one thread at a time (the journal's writer); reads may come from any thread:
one connection writes, another reads, each behind its own lock, so a long `stats` query never
holds up the writer.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from breakwater.journal._in_flight import IN_FLIGHT_TABLE, InFlight, InFlightMarks, in_flight_ddl
from breakwater.journal._records import (
    _COLUMNS,
    _LEARN_OUTCOMES,
    ANSWERED_OUTCOMES,
    CALLERS_OWN_OUTCOMES,
    RECONCILED,
    REFUSAL_OUTCOMES,
    AttemptRecord,
    JournalError,
    _record_from,
)
from breakwater.journal._rollups import (
    _ROLLUP_SOURCE,
    ROLLUP_BUCKET_S,
    _backfill_pages,
    _bucket_of,
    _first_whole_bucket,
    _fold_raw,
    _fold_rollups,
    _Rollup,
    _RollupKey,
    _rollups_of,
)
from breakwater.journal._stats import LearnInput, ToolStats, percentile

__all__ = ["SCHEMA_VERSION", "Dialect", "JournalStore", "SQLJournalStore", "journal_fix"]

#: The schema this code writes; stores migrate older schemas up to it and refuse newer ones.
SCHEMA_VERSION = 3

_TABLE = "breakwater_attempts"
_ROLLUP_TABLE = "breakwater_rollups"
_VERSION_TABLE = "breakwater_journal_schema_version"


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

    def in_flight(self, limit: int) -> list[InFlight]:
        """The oldest `limit` attempts that were sent and have no row yet: in flight, or of unknown outcome."""
        ...

    def close(self) -> None:
        """Close every connection."""
        ...


def journal_fix(store: JournalStore, exc: BaseException) -> str | None:
    """What to do about `exc` from `store`, when the store knows (`SQLJournalStore.fix_for`; a store of another kind
    says nothing more)."""
    return store.fix_for(exc) if isinstance(store, SQLJournalStore) else None


@dataclass(frozen=True, kw_only=True)
class Dialect:
    """What one SQL database spells differently, as data."""

    #: The parameter placeholder: `?` (sqlite3) or `%s` (psycopg).
    mark: str
    #: Column types: a float, a boolean, the attempts' auto-increment key, a 64-bit integer, a histogram.
    real: str
    boolean: str
    serial: str
    big: str
    json_type: str
    #: The schema version table's `applied_at` column.
    applied_at: str
    #: A query whose one row has a non-NULL first column when the table named by its one parameter exists.
    exists_sql: str
    #: Appended to the attempts table in time-range scans (`{index}`: the start-time index's name).
    time_index_hint: str = ""
    #: The database has `percentile_disc`: rank there; else fetch the durations and rank in Python.
    percentile_disc: bool = False
    #: Connections are network connections: one that failed is closed and replaced on the next use.
    reconnects: bool = False


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


def _migrations(dialect: Dialect, table: str, rollups: str, in_flight: str) -> list[tuple[int, str, tuple[Step, ...]]]:
    """Every schema change, in order: (version, what it does, steps). Append; never edit a shipped one."""
    d = dialect
    return [
        (1, "attempts table", _ddl(d.real, d.boolean, d.serial, table)),
        (2, "per-minute rollups for stats and learning", (*_rollup_ddl(d.big, d.json_type, rollups), _BACKFILL)),
        (3, "attempts of mutating tools marked when sent", in_flight_ddl(d.real, in_flight)),
    ]


#: The columns of the PostgreSQL learning query, in `LearnInput`'s words.
_LEARN_COLUMNS = ("server", "tool", "completed", "quantile_s", "answered_quantile_s", "cut", "attempts")


def _stats_sql(table: str, where: str, percentiles: str) -> str:
    # Calls are counted as first attempts (every call has exactly one row with attempt = 1, sent or
    # refused) and successes as completed rows (a call completes at most once): COUNT(DISTINCT
    # call_id) would cost a temporary B-tree per group, several times the whole scan.
    refusals = ", ".join(f"'{o}'" for o in REFUSAL_OUTCOMES)
    unsent = ", ".join(f"'{o}'" for o in (*REFUSAL_OUTCOMES, RECONCILED))
    uncounted = ", ".join(f"'{o}'" for o in (RECONCILED, *CALLERS_OWN_OUTCOMES))
    return f"""SELECT server, tool,
            SUM(CASE WHEN attempt = 1 AND outcome NOT IN ({uncounted}) THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome IN ('completed', '{RECONCILED}') THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome NOT IN ({unsent}) THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome IN ({refusals}) THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome = 'timeout' THEN 1 ELSE 0 END),
            SUM(CASE WHEN outcome = 'outcome_unknown' OR error_code = 'OUTCOME_UNKNOWN' THEN 1 ELSE 0 END),
            SUM(CASE WHEN breaker_opened THEN 1 ELSE 0 END),
            SUM(CASE WHEN attempt > 1 AND outcome NOT IN ({unsent}) THEN 1 ELSE 0 END){percentiles}
        FROM {table} WHERE {where} GROUP BY server, tool ORDER BY server, tool"""


def _filters(column: str, bound: float, server: str | None, tool: str | None, mark: str) -> tuple[str, list[Any]]:
    """`column >= bound`, and the server and tool when given: a WHERE clause and its parameters."""
    where, params = [f"{column} >= {mark}"], list[Any]([bound])
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
    where, params = _filters("started_at", -math.inf, server, tool, mark)
    if failures_only:
        where += " AND outcome <> 'completed'"
    sql = f"SELECT {', '.join(_COLUMNS)} FROM {table} WHERE {where} ORDER BY started_at DESC, id DESC LIMIT {mark}"
    return sql, params


def _listed(outcomes: Sequence[str]) -> str:
    return ", ".join(f"'{o}'" for o in outcomes)


# Where the database ranks (`Dialect.percentile_disc`): the three percentiles of answered attempts,
# as one array column after the counts.
_PERCENTILES_SQL = f""",
            percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY duration_s)
                FILTER (WHERE outcome IN ({_listed(ANSWERED_OUTCOMES)}))"""


class _Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> Sequence[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class _Connection(Protocol):
    """What the shared code uses of a DB-API connection (sqlite3's and psycopg's alike)."""

    def execute(self, sql: str, params: Any = ..., /) -> _Cursor: ...
    def close(self) -> None: ...


C = TypeVar("C", bound=_Connection)


class SQLJournalStore(ABC, Generic[C]):
    """A `JournalStore` in SQL: everything but the `dialect` and the hooks a database writes its own way.

    Every batch updates the per-minute rollups in the same transaction as its rows, so several
    processes sharing one journal never lose each other's counts.
    """

    dialect: ClassVar[Dialect]

    def __init__(self, location: str, qualify: Callable[[str], str] = lambda name: name) -> None:
        #: Where the store is, safe to show (no password).
        self.location = location
        self._table = qualify(_TABLE)
        self._rollups = qualify(_ROLLUP_TABLE)
        self._versions = qualify(_VERSION_TABLE)
        self._in_flight = qualify(IN_FLIGHT_TABLE)
        self._marks = InFlightMarks(self._in_flight, self.dialect.mark)
        # Time-range scans of the attempts (index names are never qualified).
        self._scan = self._table + self.dialect.time_index_hint.format(index=f"{_TABLE}_started_at")
        self._write: C | None = None
        self._read: C | None = None
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._version = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    # ---- what each database does its own way --------------------------------------------------

    @abstractmethod
    def _connect(self) -> C:
        """A new connection."""

    def _connect_reader(self) -> C:
        """A new connection for reads only (`_connect`, unless the database has a cheaper or safer one)."""
        return self._connect()

    def _alive(self, conn: C) -> bool:
        """False for a connection that was closed under us (it is replaced)."""
        return True

    def fix_for(self, exc: BaseException) -> str | None:
        """What the user can do about `exc`, raised by this store, when the database says more than "point the journal
        elsewhere" (a damaged file, a lock held, tables of another layout); None otherwise."""
        return None

    @abstractmethod
    def _transaction(self, conn: C) -> AbstractContextManager[object]:
        """One write transaction on `conn`: committed when the block ends, rolled back if it raises."""

    def _prepare_migration(self, conn: C) -> None:
        """Runs first in the migration's transaction (to keep other migrators out, create a schema…)."""

    @abstractmethod
    def _record_version(self, conn: C, version: int, description: str) -> None:
        """Note in the version table that `version` is applied."""

    @abstractmethod
    def _insert_rows(self, conn: C, records: Sequence[AttemptRecord]) -> None:
        """Append `records` to the attempts table (inside the caller's transaction)."""

    @abstractmethod
    def _merge(self, conn: C, deltas: Mapping[_RollupKey, _Rollup]) -> None:
        """Add `deltas` to the stored rollups, in key order (inside the caller's transaction)."""

    # ---- writes -------------------------------------------------------------------------------

    def open(self) -> None:
        with self._write_lock:
            with self._writing(connect=True) as conn:
                version = self._migrate(conn)
            self._version = version

    def schema_version(self) -> int:
        return self._version

    def insert(self, records: Sequence[AttemptRecord]) -> None:
        done, marks, finished = self._marks.split(records)
        deltas = _rollups_of(done)
        with self._write_lock, self._writing() as conn:
            if done:
                self._insert_rows(conn, done)
                self._merge(conn, deltas)
            if marks or finished:
                self._marks.write(conn, marks, finished)
        self._marks.committed(marks, finished)

    def purge(self, before: float) -> int:
        # Whole minutes only, so the raw rows and the rollups always cover the same attempts.
        bucket, m = _bucket_of(before), self.dialect.mark
        with self._write_lock, self._writing() as conn:
            removed = conn.execute(
                f"DELETE FROM {self._table} WHERE started_at < {m}", (bucket * float(ROLLUP_BUCKET_S),)
            ).rowcount
            conn.execute(f"DELETE FROM {self._rollups} WHERE minute < {m}", (bucket,))
            conn.execute(f"DELETE FROM {self._in_flight} WHERE started_at < {m}", (bucket * float(ROLLUP_BUCKET_S),))
        return int(removed)

    @contextmanager
    def _writing(self, *, connect: bool = False) -> Iterator[C]:
        """The writer connection, inside a write transaction (the caller holds the write lock).

        Only `open` connects an embedded store; a networked one (`Dialect.reconnects`) connects
        whenever it has no live connection, and drops the one a write failed on.
        """
        try:
            conn = self._write
            if conn is None or not self._alive(conn):
                if not (connect or self.dialect.reconnects):
                    raise JournalError("the store is not open")
                conn = self._write = self._connect()
            with self._transaction(conn):
                yield conn
        except Exception:
            if self.dialect.reconnects:
                self._drop_writer()
            raise

    def _drop_writer(self) -> None:
        # A broken connection is replaced on the next write rather than retried here.
        if self._write is not None:
            self._write.close()
            self._write = None

    def _migrate(self, conn: C) -> int:
        self._prepare_migration(conn)
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self._versions} (version INTEGER PRIMARY KEY, "
            f"applied_at {self.dialect.applied_at}, description TEXT NOT NULL)"
        )
        row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {self._versions}").fetchone()
        current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise JournalError(
                f"{self.location}: the journal's schema is version {current}, newer than this breakwater knows "
                f"({SCHEMA_VERSION}); upgrade breakwater or point [journal] url elsewhere"
            )
        for version, description, steps in _migrations(self.dialect, self._table, self._rollups, self._in_flight):
            if version <= current:
                continue
            for step in steps:
                if isinstance(step, _Backfill):
                    self._backfill(conn)
                else:
                    conn.execute(step)
            self._record_version(conn, version, description)
            current = version
        return current

    def _backfill(self, conn: C) -> None:
        m = self.dialect.mark
        sql = f"SELECT id, {_ROLLUP_SOURCE} FROM {self._table} WHERE id > {m} ORDER BY id LIMIT {m}"
        _backfill_pages(lambda after, limit: conn.execute(sql, (after, limit)).fetchall(), lambda acc: self._merge(conn, acc))

    # ---- reads --------------------------------------------------------------------------------

    @contextmanager
    def _reader(self) -> Iterator[C]:
        with self._read_lock:
            conn = self._read
            if conn is None or not self._alive(conn):
                conn = self._read = self._connect_reader()
            try:
                yield conn
            except Exception:
                if self.dialect.reconnects:
                    conn.close()
                    self._read = None
                raise

    def _exists(self, conn: C, table: str) -> bool:
        row = conn.execute(self.dialect.exists_sql, (table,)).fetchone()
        return row is not None and row[0] is not None

    def _rolled_up(self, since: float, server: str | None, tool: str | None) -> dict[tuple[str, str], _Rollup] | None:
        """Per tool since `since`: stored rollups for whole minutes, raw rows for the partial first one.

        None when the store predates rollups (schema 1: a reader never migrates).
        """
        first, m = _first_whole_bucket(since), self.dialect.mark
        acc: dict[tuple[str, str], _Rollup] = {}
        with self._reader() as conn:
            if not self._exists(conn, self._rollups):
                return None
            where, params = _filters("minute", first, server, tool, m)
            counts = ", ".join(_Rollup.FIELDS)
            sql = f"SELECT server, tool, {counts}, latency, cut FROM {self._rollups} WHERE {where}"
            _fold_rollups(acc, conn.execute(sql, params))
            where, params = _filters("started_at", since, server, tool, m)
            edge = conn.execute(
                f"SELECT {_ROLLUP_SOURCE} FROM {self._scan} WHERE {where} AND started_at < {m}",
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
        where, params = _filters("started_at", since, server, tool, self.dialect.mark)
        with self._reader() as conn:
            if not self._exists(conn, self._table):
                return []
            if self.dialect.percentile_disc:
                rows = conn.execute(_stats_sql(self._scan, where, _PERCENTILES_SQL), params).fetchall()
                return [_stats_row(row, *(row[10] or (None, None, None))) for row in rows]
            rows = conn.execute(_stats_sql(self._scan, where, ""), params).fetchall()
            # No percentile aggregate: fetch the one column and rank in Python.
            durations: dict[tuple[str, str], list[float]] = {}
            for srv, tl, d in conn.execute(
                f"SELECT server, tool, duration_s FROM {self._scan} WHERE {where} AND outcome IN ({_listed(ANSWERED_OUTCOMES)})",
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
        return self._raw_learn_inputs(since, quantile)

    def _raw_learn_inputs(self, since: float, quantile: float) -> list[LearnInput]:
        """`learn_inputs` from every raw row of the window (a store before rollups)."""
        m, outcomes = self.dialect.mark, _listed(_LEARN_OUTCOMES)
        samples: dict[tuple[str, str], list[float]] = {}
        answered: dict[tuple[str, str], list[float]] = {}
        completed: dict[tuple[str, str], int] = {}
        with self._reader() as conn:
            if not self._exists(conn, self._table):
                return []
            if self.dialect.percentile_disc:
                rows = conn.execute(
                    f"""SELECT server, tool, COUNT(*) FILTER (WHERE outcome = 'completed'),
                        percentile_disc({m}) WITHIN GROUP (ORDER BY duration_s),
                        percentile_disc({m}) WITHIN GROUP (ORDER BY duration_s) FILTER (WHERE outcome <> 'timeout'),
                        COUNT(*) FILTER (WHERE outcome = 'timeout'), COUNT(*)
                    FROM {self._table} WHERE started_at >= {m} AND outcome IN ({outcomes})
                    GROUP BY server, tool ORDER BY server, tool""",
                    (quantile, quantile, since),
                ).fetchall()
                return [LearnInput(**dict(zip(_LEARN_COLUMNS, row, strict=True))) for row in rows]
            where = f"started_at >= {m} AND outcome IN ({outcomes})"
            sql = f"SELECT server, tool, duration_s, outcome FROM {self._table} WHERE {where}"
            for srv, tl, d, outcome in conn.execute(sql, (since,)):
                samples.setdefault((srv, tl), []).append(d)
                if outcome != "timeout":
                    answered.setdefault((srv, tl), []).append(d)
                if outcome == "completed":
                    completed[(srv, tl)] = completed.get((srv, tl), 0) + 1
        return [
            LearnInput.of(s, t, completed.get((s, t), 0), v, answered.get((s, t), []), quantile)
            for (s, t), v in sorted(samples.items())
        ]

    def recent(
        self, limit: int, *, server: str | None = None, tool: str | None = None, failures_only: bool = False
    ) -> list[AttemptRecord]:
        sql, params = _recent_sql(self._table, server, tool, failures_only, self.dialect.mark)
        with self._reader() as conn:
            if not self._exists(conn, self._table):
                return []
            return [_record_from(r) for r in conn.execute(sql, [*params, limit]).fetchall()]

    def in_flight(self, limit: int) -> list[InFlight]:
        with self._reader() as conn:
            if not self._exists(conn, self._in_flight):
                return []
            return self._marks.read(conn, limit)

    def close(self) -> None:
        for lock, name in ((self._write_lock, "_write"), (self._read_lock, "_read")):
            with lock:
                conn = getattr(self, name)
                if conn is not None:
                    conn.close()
                    setattr(self, name, None)
