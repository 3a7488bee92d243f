"""Opening the SQLite files breakwater keeps (operation records, followed tasks), one way for all.

A core leaf: imports nothing of breakwater.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

__all__ = ["NotSQLiteError", "check_sqlite_path", "open_sqlite"]

#: How long a statement waits for another process's write lock before it fails.
BUSY_TIMEOUT_S = 30.0
#: How often opening looks again while another process holds a lock SQLite does not wait for (below).
_OPEN_RETRY_S = 0.01

#: The first 16 bytes of every SQLite 3 database (sqlite.org/fileformat.html, "The Database Header").
_HEADER = b"SQLite format 3\x00"


class NotSQLiteError(sqlite3.DatabaseError):
    """The path holds something that is not an SQLite database (a directory, another program's file): breakwater
    neither reads nor writes it, so nothing of the user's is lost or moved, and the message says to choose another path."""


def check_sqlite_path(path: Path) -> None:
    """Raise `NotSQLiteError` when `path` is a directory or a non-empty file without SQLite's header.

    SQLite itself says "file is not a database" of such a file, as of a damaged journal, and the fix of a damaged one
    (move it aside) is the wrong one for a user's own file that a setting names by mistake (`BREAKWATER_JOURNAL=~/.bashrc`).
    A missing or empty file is a new database.
    """
    if path.is_dir():
        raise NotSQLiteError(f"{path} is a directory, not an SQLite database file")
    try:
        with path.open("rb") as file:
            head = file.read(len(_HEADER))
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError:
        return  # unreadable: SQLite says why, in its own words
    if head and head != _HEADER:
        raise NotSQLiteError(f"{path} is not an SQLite database (it holds something else: nothing was written to it)")


def open_sqlite(
    path: Path,
    *,
    schema: Sequence[str] = (),
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] | None = None,
) -> sqlite3.Connection:
    """A connection to `path` (its directory created), shared by this process's threads and by other processes.

    In autocommit mode (`isolation_level=None`): callers write BEGIN/COMMIT themselves, so a
    transaction is exactly the statements they mean and not whatever the sqlite3 module would
    group. Usable from any thread (callers serialise its use with a lock). In WAL mode, so readers
    never block the writer; `synchronous` is set when given; then each `schema` statement runs
    (`CREATE ... IF NOT EXISTS`, so opening an existing file changes nothing).
    """
    check_sqlite_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # "When the last connection to a database closes, it takes an exclusive lock for a short time while it
    # cleans up the WAL and shared-memory files", and a connection opened meanwhile gets "database is locked"
    # at once, without the busy handler (sqlite.org/wal.html, seen: a store polled while its writer opened it).
    # Opening is tried again as the busy handler waits for a write lock: in real time (a lock on a file), for
    # as long at most.
    for attempt in range(round(BUSY_TIMEOUT_S / _OPEN_RETRY_S), -1, -1):
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            if synchronous is not None:
                conn.execute(f"PRAGMA synchronous={synchronous}")
            for statement in schema:
                conn.execute(statement)
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" not in str(exc) or attempt == 0:
                raise
            time.sleep(_OPEN_RETRY_S)  # noqa: TID251 - a file lock held by another process, as SQLite's own busy wait
        else:
            return conn
    raise AssertionError("unreachable: the last attempt returns or raises")
