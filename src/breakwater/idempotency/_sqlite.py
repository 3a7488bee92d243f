"""The embedded operation store: one SQLite file, WAL, the owner decided inside one transaction.

Made for one server process, but correct for several processes on one host too: every claim runs
under `BEGIN IMMEDIATE`, which takes SQLite's write lock before reading, so two claimers of one id
are serialized by the database rather than by this process. Queries run on a worker thread so a
slow disk never stalls the event loop.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from breakwater._clock import Clock, SystemClock
from breakwater._sqlite import open_sqlite
from breakwater.idempotency._store import (
    DEFAULT_PURGE_INTERVAL_S,
    DEFAULT_RETENTION_S,
    RECORD_COLUMNS,
    ClaimResult,
    OperationRecord,
    OperationState,
    checked_durations,
    default_db_path,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_COLUMNS = ", ".join(RECORD_COLUMNS)
_LIVE = ("pending", "executing")


class SQLiteStore:
    """Operation records in a local SQLite file (the default store of `@idempotent`).

    `path` defaults to `default_db_path()` (the user's data directory, or `$BREAKWATER_IDEMPOTENCY_DB`);
    its directory is created. `clock` supplies every stored timestamp, so lease and retention tests
    run on a `FakeClock`. Records older than `retention_s` are purged at most every
    `purge_interval_s`, checked on each claim.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
        retention_s: float = DEFAULT_RETENTION_S,
        purge_interval_s: float = DEFAULT_PURGE_INTERVAL_S,
        table: str = "breakwater_operations",
    ) -> None:
        if not table.isidentifier():
            raise ValueError(f"table must be a plain identifier, got {table!r}")
        self.path = Path(path) if path is not None else default_db_path()
        self.clock: Clock = clock or SystemClock()
        checked_durations(retention_s, purge_interval_s)
        self.retention_s = retention_s
        self.purge_interval_s = purge_interval_s
        self._table = table
        self._conn: sqlite3.Connection | None = None
        # One connection shared by worker threads; sqlite3 objects are not safe to use concurrently.
        self._lock = threading.Lock()
        self._next_purge_at: float | None = None

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # ------------------------------------------------------------------ plumbing

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            # synchronous=FULL: a claim must be on disk before the tool's side effect starts, even
            # across a power cut; NORMAL in WAL mode would only survive a process crash.
            self._conn = open_sqlite(self.path, synchronous="FULL", schema=self._schema())
        return self._conn

    def _schema(self) -> tuple[str, ...]:
        return (
            f"""CREATE TABLE IF NOT EXISTS {self._table} (
                operation_id TEXT PRIMARY KEY,
                tool TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                state TEXT NOT NULL,
                owner TEXT NOT NULL,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL,
                lease_until REAL,
                outcome TEXT
            )""",
            f"CREATE INDEX IF NOT EXISTS {self._table}_updated_at ON {self._table} (updated_at)",
        )

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def work() -> T:
            with self._lock:
                return fn(self._connect())

        return await anyio.to_thread.run_sync(work)

    def _row(self, conn: sqlite3.Connection, operation_id: str) -> OperationRecord | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM {self._table} WHERE operation_id = ?", (operation_id,)).fetchone()
        if row is None:
            return None
        return OperationRecord.from_row(row, outcome=json.loads(row[8]) if row[8] is not None else None)

    def _purge(self, conn: sqlite3.Connection, now: float) -> int:
        cutoff = now - self.retention_s
        cur = conn.execute(
            f"""DELETE FROM {self._table}
                WHERE (state NOT IN (?, ?) AND updated_at < ?) OR (state IN (?, ?) AND lease_until < ?)""",
            (*_LIVE, cutoff, *_LIVE, cutoff),
        )
        return cur.rowcount

    def _expire(self, conn: sqlite3.Connection, operation_id: str, now: float) -> None:
        conn.execute(
            f"""UPDATE {self._table} SET state = 'unknown', outcome = ?, updated_at = ?, lease_until = NULL
                WHERE operation_id = ? AND state = 'executing' AND lease_until <= ?""",
            (json.dumps({"reason": "lease_expired"}), now, operation_id, now),
        )

    def _update(self, sql: str, params: tuple[Any, ...]) -> Callable[[sqlite3.Connection], bool]:
        def go(conn: sqlite3.Connection) -> bool:
            return conn.execute(sql, params).rowcount == 1

        return go

    # ------------------------------------------------------------------ the protocol

    async def claim(self, operation_id: str, *, tool: str, fingerprint: str, owner: str, lease_s: float) -> ClaimResult:
        """See `OperationStore.claim`; the whole decision is one `BEGIN IMMEDIATE` transaction."""
        now = self.clock.time()

        def go(conn: sqlite3.Connection) -> ClaimResult:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self._next_purge_at is None or now >= self._next_purge_at:
                    self._purge(conn, now)
                    self._next_purge_at = now + self.purge_interval_s
                cur = conn.execute(
                    f"""INSERT INTO {self._table} ({_COLUMNS}) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, NULL)
                        ON CONFLICT (operation_id) DO NOTHING""",
                    (operation_id, tool, fingerprint, owner, now, now, now + lease_s),
                )
                owned = cur.rowcount == 1
                if not owned:
                    self._expire(conn, operation_id, now)
                    cur = conn.execute(
                        f"""UPDATE {self._table} SET owner = ?, lease_until = ?, updated_at = ?
                            WHERE operation_id = ? AND state = 'pending' AND lease_until <= ? AND fingerprint = ?""",
                        (owner, now + lease_s, now, operation_id, now, fingerprint),
                    )
                    owned = cur.rowcount == 1
                record = self._row(conn, operation_id)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            assert record is not None  # inserted or found inside the same write transaction
            return ClaimResult(owned=owned, record=record)

        return await self._run(go)

    async def mark_executing(self, operation_id: str, *, owner: str, lease_s: float) -> bool:
        """See `OperationStore.mark_executing`."""
        now = self.clock.time()
        return await self._run(
            self._update(
                f"""UPDATE {self._table} SET state = 'executing', lease_until = ?, updated_at = ?
                    WHERE operation_id = ? AND owner = ? AND state = 'pending'""",
                (now + lease_s, now, operation_id, owner),
            )
        )

    async def renew(self, operation_id: str, *, owner: str, lease_s: float) -> bool:
        """See `OperationStore.renew`."""
        now = self.clock.time()
        return await self._run(
            self._update(
                f"""UPDATE {self._table} SET lease_until = ?
                    WHERE operation_id = ? AND owner = ? AND state IN (?, ?)""",
                (now + lease_s, operation_id, owner, *_LIVE),
            )
        )

    async def finish(self, operation_id: str, *, owner: str, state: OperationState, outcome: dict[str, Any] | None) -> bool:
        """See `OperationStore.finish`."""
        now = self.clock.time()
        return await self._run(
            self._update(
                f"""UPDATE {self._table} SET state = ?, outcome = ?, updated_at = ?, lease_until = NULL
                    WHERE operation_id = ? AND owner = ? AND state IN ('pending', 'executing', 'unknown')""",
                (state.value, json.dumps(outcome) if outcome is not None else None, now, operation_id, owner),
            )
        )

    async def release(self, operation_id: str, *, owner: str) -> bool:
        """See `OperationStore.release`."""
        return await self._run(
            self._update(
                f"DELETE FROM {self._table} WHERE operation_id = ? AND owner = ? AND state IN (?, ?)",
                (operation_id, owner, *_LIVE),
            )
        )

    async def get(self, operation_id: str) -> OperationRecord | None:
        """See `OperationStore.get`."""
        now = self.clock.time()

        def go(conn: sqlite3.Connection) -> OperationRecord | None:
            self._expire(conn, operation_id, now)
            return self._row(conn, operation_id)

        return await self._run(go)

    async def purge(self) -> int:
        """See `OperationStore.purge`."""
        now = self.clock.time()
        return await self._run(lambda conn: self._purge(conn, now))

    async def aclose(self) -> None:
        """Close the database file."""

        def go() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await anyio.to_thread.run_sync(go)
