"""The embedded journal: one SQLite file in the user's data directory, in WAL mode.

WAL lets `breakwater stats` read while a gateway writes: readers and the writer do not block each
other. Each batch takes SQLite's write lock (`BEGIN IMMEDIATE`) before it reads and rewrites the
rollups it touches, so several processes sharing the file never lose each other's counts.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time as _time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

from breakwater import _paths
from breakwater._sqlite import NotSQLiteError, check_sqlite_path
from breakwater.journal._records import _COLUMNS, AttemptRecord, _as_row
from breakwater.journal._rollups import _Rollup, _RollupKey
from breakwater.journal._sql import _ROLLUP_TABLE, _TABLE, Dialect, SQLJournalStore

__all__ = ["JOURNAL_DB_ENV", "SQLiteJournalStore", "default_journal_path"]

#: Overrides where the embedded SQLite journal lives (when `[journal] url` is empty).
JOURNAL_DB_ENV = "BREAKWATER_JOURNAL_DB"

_SQLITE = Dialect(
    mark="?",
    real="REAL",
    boolean="INTEGER",
    serial="INTEGER PRIMARY KEY",
    big="INTEGER",
    json_type="TEXT",
    applied_at="REAL NOT NULL",
    exists_sql="SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
    # The time index, not the (server, tool) one the GROUP BY tempts the planner into: a window is a
    # range of recent rows, and rowids follow time, so this reads them nearly in order.
    time_index_hint=" INDEXED BY {index}",
)


def default_journal_path() -> Path:
    """Where the embedded journal lives: `$BREAKWATER_JOURNAL_DB`, else `journal.sqlite3` in the user's data directory."""
    override = os.environ.get(JOURNAL_DB_ENV)
    return Path(override).expanduser() if override else _paths.data_dir() / "journal.sqlite3"


#: How long a read waits for a lock another process holds (WAL readers wait only on an exclusive one, or recovery):
#: `stats` said nothing for 30 s, the writer's bound, before saying the journal was locked.
_READ_BUSY_S = 5.0

_VALUES = f"({', '.join('?' for _ in _COLUMNS)})"
_INSERT_ONE = f"INSERT INTO {_TABLE} ({', '.join(_COLUMNS)}) VALUES {_VALUES}"
# Rows go in by INSERTs of many rows each (the rest of a batch by `executemany`): SQLite's per-statement work was a
# quarter of a row's insert (300 calls' rows: 5.1 µs a row by `executemany` alone, 3.8 µs so). 48 rows of 18 values
# stay under 999, the most variables a statement may have in SQLite before 3.32.
_ROWS_PER_INSERT = 48
_INSERT_MANY = f"INSERT INTO {_TABLE} ({', '.join(_COLUMNS)}) VALUES {', '.join(_VALUES for _ in range(_ROWS_PER_INSERT))}"

_KEY = "server = ? AND tool = ? AND minute = ?"
_SELECT_ROLLUP = f"SELECT {', '.join(_Rollup.FIELDS)}, latency, cut FROM {_ROLLUP_TABLE} WHERE {_KEY}"
_INSERT_ROLLUP = (
    f"INSERT INTO {_ROLLUP_TABLE} (server, tool, minute, {', '.join(_Rollup.FIELDS)}, latency, cut) "
    f"VALUES ({', '.join('?' for _ in range(len(_Rollup.FIELDS) + 5))})"
)
_UPDATE_ROLLUP = f"UPDATE {_ROLLUP_TABLE} SET {', '.join(f'{c} = ?' for c in (*_Rollup.FIELDS, 'latency', 'cut'))} WHERE {_KEY}"

#: What SQLite says of a file that is not a sound database.
_DAMAGED = ("malformed", "not a database", "disk I/O error")


class SQLiteJournalStore(SQLJournalStore[sqlite3.Connection]):
    """The embedded journal: one SQLite file, WAL, so `breakwater stats` reads while a gateway writes.

    One connection writes, another reads; each has its own lock, so a long `stats` query never
    holds up the writer (WAL readers and the writer do not block each other). Each batch updates
    the per-minute rollups in the same transaction, under SQLite's write lock, so several
    processes sharing the file never lose each other's counts.
    """

    dialect = _SQLITE

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_journal_path()
        super().__init__(str(self.path))

    def _connect(self) -> sqlite3.Connection:
        check_sqlite_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are the BEGIN/COMMIT written here, nothing implicit.
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: in WAL mode a process crash loses nothing; a power cut may lose the last batch,
        # which a journal can afford, and every commit skips an fsync.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-32768")  # 32 MiB: a stats window's index pages stay cached
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        """Read-only: reading never writes (`stats` turned an empty file into a WAL database), and a journal on a
        read-only mount or in a directory not the reader's own (an archive, another user's) is read as it is.

        WAL is the writer's to set, for good; a reader that cannot make the shared-memory file beside the journal
        (a read-only directory) opens it immutable, without the WAL's last unflushed pages.
        """
        if not self.path.exists():
            return self._connect()
        check_sqlite_path(self.path)
        uri = self.path.absolute().as_uri()
        try:
            conn = sqlite3.connect(
                f"{uri}?mode=ro", uri=True, timeout=_READ_BUSY_S, isolation_level=None, check_same_thread=False
            )
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):  # another process's exclusive lock: immutable would read under its writes
                raise
            conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA cache_size=-32768")
        return conn

    def fix_for(self, exc: BaseException) -> str | None:
        """A damaged file or a lock another process holds: what to do about it (`SQLJournalStore.fix_for`)."""
        text = str(exc)
        if isinstance(exc, NotSQLiteError):
            # The user's own file, named by mistake, is never to be moved: another path is the fix.
            own = self.path / "journal.sqlite3" if self.path.is_dir() else _paths.data_dir() / "journal.sqlite3"
            return f"set [journal] url (or BREAKWATER_JOURNAL) to a file of the journal's own, e.g. {own}"
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            return "another process holds the journal locked: wait for it to let go, or stop it"
        if isinstance(exc, sqlite3.DatabaseError) and any(word in text for word in _DAMAGED):
            return (
                f"the file is damaged: move it away, e.g. mv {self.path} {self.path}.damaged; the next call starts a new journal"
            )
        return None

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        # IMMEDIATE: the write lock first. Rollups are read, then rewritten, and two processes never
        # migrate at once: another process must not slip in between.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _record_version(self, conn: sqlite3.Connection, version: int, description: str) -> None:
        conn.execute(
            f"INSERT INTO {self._versions} (version, applied_at, description) VALUES (?, ?, ?)",
            (version, _time.time(), description),
        )

    def _insert_rows(self, conn: sqlite3.Connection, records: Sequence[AttemptRecord]) -> None:
        rows = list(map(_as_row, records))
        whole = len(rows) - len(rows) % _ROWS_PER_INSERT
        if whole:
            values = list(chain.from_iterable(rows[:whole]))
            width = _ROWS_PER_INSERT * len(_COLUMNS)
            for at in range(0, len(values), width):
                conn.execute(_INSERT_MANY, values[at : at + width])
        if whole < len(rows):
            conn.executemany(_INSERT_ONE, rows[whole:])

    def _merge(self, conn: sqlite3.Connection, deltas: Mapping[_RollupKey, _Rollup]) -> None:
        # SQLite cannot add JSON histograms in SQL: read each row, add in Python, write it back
        # (safe: the caller's transaction holds the write lock).
        n = len(_Rollup.FIELDS)
        for key in sorted(deltas):
            delta = deltas[key]
            row = conn.execute(_SELECT_ROLLUP, key).fetchone()
            if row is not None:
                delta.merge(row[:n], json.loads(row[n]), json.loads(row[n + 1]))
            histograms = json.dumps(delta.latency, separators=(",", ":")), json.dumps(delta.cut, separators=(",", ":"))
            if row is None:
                conn.execute(_INSERT_ROLLUP, (*key, *delta.counts, *histograms))
            else:
                # An UPDATE of the row read, not INSERT OR REPLACE (a delete and an insert, its minute index's entry
                # rewritten too): the same values, ~8 µs (of ~45) less per cycle in the rollup's write.
                conn.execute(_UPDATE_ROLLUP, (*delta.counts, *histograms, *key))
