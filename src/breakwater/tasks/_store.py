"""Task ids that outlive a process: a small SQLite table of the upstream tasks being followed."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from breakwater import _paths
from breakwater._sqlite import open_sqlite

__all__ = ["STALE_AFTER_S", "TASKS_DB_ENV", "PendingTask", "TaskStore", "default_tasks_path"]

#: Where the task table lives unless a `TaskStore` path is given (like `BREAKWATER_JOURNAL_DB`).
TASKS_DB_ENV = "BREAKWATER_TASKS_DB"
#: Records whose deadline passed more than this long ago are dropped when the store opens.
STALE_AFTER_S = 86_400.0


@dataclass(frozen=True, kw_only=True)
class PendingTask:
    """A task breakwater started and has not seen end: enough to resume polling it after a restart."""

    server: str
    tool: str
    task_id: str
    #: The call's operation id (mutating tools), so whoever resumes can name the operation.
    operation_id: str | None
    #: The tool's retry class when it started: decides whether a lost task is OUTCOME_UNKNOWN.
    retry_class: str
    #: Wall-clock seconds (epoch) when the task started and when breakwater stops waiting for it.
    started_at: float
    deadline_at: float
    #: Who waits for the result besides the caller (the gateway's own task id), if anyone.
    owner: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (the table's columns)."""
        return {
            "server": self.server,
            "tool": self.tool,
            "task_id": self.task_id,
            "operation_id": self.operation_id,
            "retry_class": self.retry_class,
            "started_at": self.started_at,
            "deadline_at": self.deadline_at,
            "owner": self.owner,
        }


def default_tasks_path() -> Path:
    """`$BREAKWATER_TASKS_DB`, else `tasks.sqlite3` in the user's data directory (beside the journal)."""
    override = os.environ.get(TASKS_DB_ENV)
    return Path(override).expanduser() if override else _paths.data_dir() / "tasks.sqlite3"


_COLUMNS = ("server", "tool", "task_id", "operation_id", "retry_class", "started_at", "deadline_at", "owner")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pending_tasks (server TEXT NOT NULL, tool TEXT NOT NULL, task_id TEXT NOT NULL, "
    "operation_id TEXT, retry_class TEXT NOT NULL, started_at REAL NOT NULL, deadline_at REAL NOT NULL, "
    "owner TEXT, PRIMARY KEY (server, task_id))",
    "CREATE INDEX IF NOT EXISTS pending_tasks_owner ON pending_tasks (owner)",
)


class TaskStore:
    """The tasks breakwater is polling, one SQLite row each, so a restart can pick them up.

    The file is opened on first use: an instance that never meets a task never touches the disk.
    Several processes may share one file (WAL); a row is keyed by server and task id.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_tasks_path()
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TaskStore({str(self.path)!r})"

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = open_sqlite(self.path, schema=_SCHEMA)
            conn.execute("DELETE FROM pending_tasks WHERE deadline_at < ?", (time.time() - STALE_AFTER_S,))
            self._conn = conn
        return self._conn

    def add(self, task: PendingTask) -> None:
        """Remember `task` (replacing a row for the same server and task id)."""
        with self._lock:
            marks = ", ".join("?" for _ in _COLUMNS)
            self._db().execute(
                f"INSERT OR REPLACE INTO pending_tasks ({', '.join(_COLUMNS)}) VALUES ({marks})",
                tuple(task.to_json()[c] for c in _COLUMNS),
            )

    def remove(self, server: str, task_id: str) -> None:
        """Forget a task (it ended, or was given up)."""
        with self._lock:
            self._db().execute("DELETE FROM pending_tasks WHERE server = ? AND task_id = ?", (server, task_id))

    def _select(self, where: str, params: tuple[Any, ...]) -> list[PendingTask]:
        with self._lock:
            rows = (
                self._db()
                .execute(f"SELECT {', '.join(_COLUMNS)} FROM pending_tasks {where} ORDER BY started_at", params)
                .fetchall()
            )
        return [PendingTask(**dict(zip(_COLUMNS, row, strict=True))) for row in rows]

    def all(self) -> list[PendingTask]:
        """Every remembered task, oldest first."""
        return self._select("", ())

    def get(self, task_id: str, server: str | None = None) -> PendingTask | None:
        """The task with this id (on `server`, when ids may repeat across servers)."""
        if server is None:
            found = self._select("WHERE task_id = ?", (task_id,))
        else:
            found = self._select("WHERE task_id = ? AND server = ?", (task_id, server))
        return found[0] if found else None

    def by_owner(self, owner: str) -> PendingTask | None:
        """The task a given owner (e.g. a gateway task) waits on."""
        found = self._select("WHERE owner = ?", (owner,))
        return found[0] if found else None

    def close(self) -> None:
        """Close the file (it reopens on next use)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
