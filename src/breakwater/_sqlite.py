"""Opening the SQLite files breakwater keeps (operation records, followed tasks), one way for all.

A core leaf: imports nothing of breakwater.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

__all__ = ["open_sqlite"]

#: How long a statement waits for another process's write lock before it fails.
BUSY_TIMEOUT_S = 30.0


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
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    if synchronous is not None:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    for statement in schema:
        conn.execute(statement)
    return conn
