"""The shared operation store: PostgreSQL, for several server replicas behind one name.

The owner of an operation is decided by the primary key: `INSERT … ON CONFLICT DO NOTHING
RETURNING` returns a row to exactly one of any number of concurrent claimers. A crashed owner is
handled by the `lease_until` column: every later transition is a single conditional `UPDATE`
(`WHERE state = … AND lease_until <= now`), which PostgreSQL re-checks after waiting on the row
lock, so two replicas that notice the same lapsed lease cannot both act on it.

Every statement runs in autocommit and is atomic on its own, so no transaction is held open across
an `await`. Connections come from a small built-in pool (psycopg 3, asyncio).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from breakwater._clock import Clock, SystemClock
from breakwater.idempotency._store import (
    DEFAULT_PURGE_INTERVAL_S,
    DEFAULT_RETENTION_S,
    RECORD_COLUMNS,
    ClaimResult,
    OperationRecord,
    OperationState,
    checked_durations,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["PostgresStore"]


class PostgresStore:
    """Operation records in a PostgreSQL table shared by every replica of a server.

    `conninfo` is a libpq connection string or URL (`"postgresql://user@host:5432/db"`). The table
    (default `breakwater_operations`, optionally in `schema`) is created on first use. Needs the
    `psycopg` 3 driver (`pip install 'psycopg[binary]'`); it is imported on first use, so importing
    `breakwater.idempotency` never requires it.

    Replicas' clocks must agree to well within a lease, since lease times are compared across them.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        clock: Clock | None = None,
        retention_s: float = DEFAULT_RETENTION_S,
        purge_interval_s: float = DEFAULT_PURGE_INTERVAL_S,
        table: str = "breakwater_operations",
        schema: str | None = None,
        pool_size: int = 4,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.conninfo = conninfo
        self.clock: Clock = clock or SystemClock()
        checked_durations(retention_s, purge_interval_s)
        self.retention_s = retention_s
        self.purge_interval_s = purge_interval_s
        self.table = table
        self.schema = schema
        self.pool_size = pool_size
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots: anyio.Semaphore | None = None
        self._ready = False
        self._setup_lock: anyio.Lock | None = None
        self._next_purge_at: float | None = None
        self._closed = False

    def __repr__(self) -> str:
        where = f"{self.schema}.{self.table}" if self.schema else self.table
        return f"PostgresStore(table={where!r})"

    # ------------------------------------------------------------------ plumbing

    def _ident(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(self.schema, self.table) if self.schema else sql.Identifier(self.table)

    def _q(self, template: str) -> sql.Composed:
        from psycopg import sql

        return sql.SQL(template).format(t=self._ident(), cols=sql.SQL(", ").join(map(sql.Identifier, RECORD_COLUMNS)))

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        return await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s))
        )

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        import psycopg

        if self._closed:
            raise RuntimeError("the store is closed")
        if self._slots is None:
            self._slots = anyio.Semaphore(self.pool_size)
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._open()
            reusable = False
            try:
                if not self._ready:
                    await self._setup(conn)
                yield conn
                reusable = True
            finally:
                # A connection that saw an error or a cancellation mid-query may be in any state;
                # drop it rather than hand the next caller a poisoned one.
                idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                if reusable and idle and not conn.closed and not self._closed:
                    self._idle.append(conn)
                else:
                    with anyio.CancelScope(shield=True):
                        await conn.close()

    async def _setup(self, conn: psycopg.AsyncConnection[Any]) -> None:
        from psycopg import sql

        if self._setup_lock is None:
            self._setup_lock = anyio.Lock()
        async with self._setup_lock:
            if self._ready:
                return
            where = f"{self.schema}.{self.table}" if self.schema else self.table
            # Replicas starting together would race on CREATE … IF NOT EXISTS (which is not atomic
            # in the catalog); an advisory lock keyed by the table name serializes them.
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(where.encode()),))
                if self.schema:
                    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
                await conn.execute(
                    self._q(
                        """CREATE TABLE IF NOT EXISTS {t} (
                            operation_id TEXT PRIMARY KEY,
                            tool TEXT NOT NULL,
                            fingerprint TEXT NOT NULL,
                            state TEXT NOT NULL,
                            owner TEXT NOT NULL,
                            created_at DOUBLE PRECISION NOT NULL,
                            updated_at DOUBLE PRECISION NOT NULL,
                            lease_until DOUBLE PRECISION,
                            outcome JSONB
                        )"""
                    )
                )
                await conn.execute(
                    sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (updated_at)").format(
                        sql.Identifier(f"{self.table}_updated_at"), self._ident()
                    )
                )
            self._ready = True

    async def _fetch(self, query: sql.Composed, params: Sequence[Any]) -> OperationRecord | None:
        async with self._conn() as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone() if cur.description is not None else None
        return OperationRecord.from_row(row, outcome=row[8]) if row is not None else None

    async def _rowcount(self, query: sql.Composed, params: Sequence[Any]) -> int:
        async with self._conn() as conn:
            cur = await conn.execute(query, params)
            return cur.rowcount

    # ------------------------------------------------------------------ the protocol

    async def claim(self, operation_id: str, *, tool: str, fingerprint: str, owner: str, lease_s: float) -> ClaimResult:
        """See `OperationStore.claim`; each step is one atomic statement, fenced by its WHERE clause."""
        now = self.clock.time()
        if self._next_purge_at is None or now >= self._next_purge_at:
            self._next_purge_at = now + self.purge_interval_s
            await self.purge()
        # A record can vanish between the failed insert and the read (released or purged), so the
        # decision is retried; three rounds is plenty, since a vanished row means the insert wins next.
        for _ in range(3):
            inserted = await self._fetch(
                self._q(
                    """INSERT INTO {t} ({cols}) VALUES (%s, %s, %s, 'pending', %s, %s, %s, %s, NULL)
                       ON CONFLICT (operation_id) DO NOTHING RETURNING {cols}"""
                ),
                (operation_id, tool, fingerprint, owner, now, now, now + lease_s),
            )
            if inserted is not None:
                return ClaimResult(owned=True, record=inserted)
            expired = await self._expire(operation_id, now)
            if expired is not None:
                return ClaimResult(owned=False, record=expired)
            taken = await self._fetch(
                self._q(
                    """UPDATE {t} SET owner = %s, lease_until = %s, updated_at = %s
                       WHERE operation_id = %s AND state = 'pending' AND lease_until <= %s AND fingerprint = %s
                       RETURNING {cols}"""
                ),
                (owner, now + lease_s, now, operation_id, now, fingerprint),
            )
            if taken is not None:
                return ClaimResult(owned=True, record=taken)
            current = await self._fetch(self._q("SELECT {cols} FROM {t} WHERE operation_id = %s"), (operation_id,))
            if current is not None:
                return ClaimResult(owned=False, record=current)
        raise RuntimeError(f"operation {operation_id!r} kept disappearing while being claimed")

    async def _expire(self, operation_id: str, now: float) -> OperationRecord | None:
        from psycopg.types.json import Jsonb

        return await self._fetch(
            self._q(
                """UPDATE {t} SET state = 'unknown', outcome = %s, updated_at = %s, lease_until = NULL
                   WHERE operation_id = %s AND state = 'executing' AND lease_until <= %s RETURNING {cols}"""
            ),
            (Jsonb({"reason": "lease_expired"}), now, operation_id, now),
        )

    async def mark_executing(self, operation_id: str, *, owner: str, lease_s: float) -> bool:
        """See `OperationStore.mark_executing`."""
        now = self.clock.time()
        n = await self._rowcount(
            self._q(
                """UPDATE {t} SET state = 'executing', lease_until = %s, updated_at = %s
                   WHERE operation_id = %s AND owner = %s AND state = 'pending'"""
            ),
            (now + lease_s, now, operation_id, owner),
        )
        return n == 1

    async def renew(self, operation_id: str, *, owner: str, lease_s: float) -> bool:
        """See `OperationStore.renew`."""
        now = self.clock.time()
        n = await self._rowcount(
            self._q(
                """UPDATE {t} SET lease_until = %s
                   WHERE operation_id = %s AND owner = %s AND state IN ('pending', 'executing')"""
            ),
            (now + lease_s, operation_id, owner),
        )
        return n == 1

    async def finish(self, operation_id: str, *, owner: str, state: OperationState, outcome: dict[str, Any] | None) -> bool:
        """See `OperationStore.finish`."""
        from psycopg.types.json import Jsonb

        now = self.clock.time()
        n = await self._rowcount(
            self._q(
                """UPDATE {t} SET state = %s, outcome = %s, updated_at = %s, lease_until = NULL
                   WHERE operation_id = %s AND owner = %s AND state IN ('pending', 'executing', 'unknown')"""
            ),
            (state.value, Jsonb(outcome) if outcome is not None else None, now, operation_id, owner),
        )
        return n == 1

    async def release(self, operation_id: str, *, owner: str) -> bool:
        """See `OperationStore.release`."""
        n = await self._rowcount(
            self._q("DELETE FROM {t} WHERE operation_id = %s AND owner = %s AND state IN ('pending', 'executing')"),
            (operation_id, owner),
        )
        return n == 1

    async def get(self, operation_id: str) -> OperationRecord | None:
        """See `OperationStore.get`."""
        now = self.clock.time()
        expired = await self._expire(operation_id, now)
        if expired is not None:
            return expired
        return await self._fetch(self._q("SELECT {cols} FROM {t} WHERE operation_id = %s"), (operation_id,))

    async def purge(self) -> int:
        """See `OperationStore.purge`."""
        cutoff = self.clock.time() - self.retention_s
        return await self._rowcount(
            self._q(
                """DELETE FROM {t}
                   WHERE (state NOT IN ('pending', 'executing') AND updated_at < %s)
                      OR (state IN ('pending', 'executing') AND lease_until < %s)"""
            ),
            (cutoff, cutoff),
        )

    async def drop(self) -> None:
        """Drop the table (and nothing else). For tests and teardown scripts."""
        async with self._conn() as conn:
            await conn.execute(self._q("DROP TABLE IF EXISTS {t}"))
        self._ready = False

    async def aclose(self) -> None:
        """Close every pooled connection."""
        self._closed = True
        idle, self._idle = self._idle, []
        with anyio.CancelScope(shield=True):
            for conn in idle:
                await conn.close()
