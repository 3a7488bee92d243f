"""Opening the SQLite files breakwater keeps (operation records, followed tasks), one way for all.

A core leaf: imports nothing of breakwater.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

__all__ = ["open_sqlite"]

#: How long a statement waits for another process's write lock before it fails.
BUSY_TIMEOUT_S = 30.0
#: How often opening looks again while another process holds a lock SQLite does not wait for (below).
_OPEN_RETRY_S = 0.01


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
