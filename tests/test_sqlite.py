"""Opening one of breakwater's SQLite files from several processes at once (operation records, followed tasks)."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

from breakwater._sqlite import open_sqlite

SCHEMA = ("CREATE TABLE IF NOT EXISTS t (x INTEGER)",)
PROCESSES = 3
FILES = 400


def _open_each(directory: str, barrier: Any, errors: Any) -> None:
    seen = []
    for i in range(FILES):
        barrier.wait()
        try:
            conn = open_sqlite(Path(directory) / f"store-{i}.sqlite3", schema=SCHEMA)
            conn.execute("SELECT count(*) FROM t").fetchall()
            conn.close()
        except sqlite3.OperationalError as exc:
            seen.append(str(exc))
    errors.put(seen)


def test_processes_creating_one_store_at_once_all_open_it(tmp_path: Path) -> None:
    """Three processes open each of 400 new stores at the same moment: SQLite answers some of them "database is
    locked" at once (one switching the new file to WAL holds it), without waiting; every open still succeeds."""
    context = multiprocessing.get_context("spawn")
    barrier, errors = context.Barrier(PROCESSES), context.Queue()
    processes = [context.Process(target=_open_each, args=(str(tmp_path), barrier, errors)) for _ in range(PROCESSES)]
    for process in processes:
        process.start()
    seen = [errors.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    assert seen == [[]] * PROCESSES
