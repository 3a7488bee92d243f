"""Attempts of mutating tools recorded when they are sent, so a crash leaves a trace.

An attempt's row is written when it finishes; a process killed mid-call (`kill -9`, an OOM kill, a
power cut) leaves nothing of the calls it had in flight, though their side effects may have
happened. So the gate also queues a `sent` mark for every attempt of a tool that is not read-only
(`Journal.record_sent`), through the same bounded queue: no I/O on the call path. The writer puts
marks in their own small table (`breakwater_in_flight`, never read by `stats` or learning), and
deletes each one when its attempt's row is written; a mark and its row in the same batch cancel out
without touching the table, so a quick call costs one queue append and nothing on disk. Marks are
written at the writer's pace (`flush_interval_s`), so a crash loses only those of its last interval.

What is left in the table after its process is gone is an attempt whose outcome is unknown:
`breakwater stats` lists them (server, tool, operation id, when), and a mark whose process is
still running is a call in flight. Each mark names its process as `host:pid`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from breakwater.journal._records import SENT, AttemptRecord

__all__ = ["IN_FLIGHT_TABLE", "InFlight", "InFlightMarks", "in_flight_ddl", "this_process"]

IN_FLIGHT_TABLE = "breakwater_in_flight"
_COLUMNS = ("call_id", "attempt", "server", "tool", "operation_id", "started_at", "client", "writer")

Key = tuple[str, int]


def in_flight_ddl(real: str, table: str) -> tuple[str, ...]:
    """The marks' table (schema version 3)."""
    return (
        f"""CREATE TABLE {table} (
            call_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            operation_id TEXT,
            started_at {real} NOT NULL,
            client TEXT,
            writer TEXT NOT NULL,
            PRIMARY KEY (call_id, attempt)
        )""",
    )


def this_process() -> str:
    """`host:pid` of this process, as its marks name it (read each time: a forked child is another process)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, kw_only=True)
class InFlight:
    """An attempt that was sent and has no finished row: in flight, or (its process gone) of unknown outcome."""

    server: str
    tool: str
    call_id: str
    attempt: int
    operation_id: str | None
    started_at: float
    client: str | None
    #: `host:pid` of the process that sent it.
    writer: str

    @property
    def outcome_unknown(self) -> bool:
        """The process that sent it is gone (judged on this host only; another host's is assumed alive)."""
        host, _, pid = self.writer.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # someone else's live process
            return False
        return False

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, with `state`: `outcome_unknown` or `in_flight`."""
        return {
            "server": self.server,
            "tool": self.tool,
            "operation_id": self.operation_id,
            "call_id": self.call_id,
            "attempt": self.attempt,
            "started_at": self.started_at,
            "client": self.client,
            "process": self.writer,
            "state": "outcome_unknown" if self.outcome_unknown else "in_flight",
        }


class InFlightMarks:
    """One store's marks: which rows to add and delete with each batch (the writer's thread only)."""

    def __init__(self, table: str, mark: str) -> None:
        self._table = table
        self._mark = mark
        self._stored: set[Key] = set()  # marks this process has in the table

    def split(self, records: Sequence[AttemptRecord]) -> tuple[Sequence[AttemptRecord], list[AttemptRecord], list[Key]]:
        """(finished rows, marks to add, marks to delete) of one batch."""
        if not self._stored and not any(r.outcome == SENT for r in records):
            return records, [], []
        done: list[AttemptRecord] = []
        sent: dict[Key, AttemptRecord] = {}
        for r in records:
            if r.outcome == SENT:
                sent[(r.call_id, r.attempt)] = r
            else:
                done.append(r)
        finished: list[Key] = []
        for r in done:
            key = (r.call_id, r.attempt)
            if sent.pop(key, None) is None and key in self._stored:
                finished.append(key)
        return done, list(sent.values()), finished

    def write(self, conn: Any, marks: Sequence[AttemptRecord], finished: Sequence[Key]) -> None:
        """Add and delete marks, inside the batch's transaction."""
        m = self._mark
        writer = this_process()
        insert = (
            f"INSERT INTO {self._table} ({', '.join(_COLUMNS)}) VALUES ({', '.join(m for _ in _COLUMNS)}) "
            "ON CONFLICT (call_id, attempt) DO NOTHING"
        )
        for r in marks:
            conn.execute(insert, (r.call_id, r.attempt, r.server, r.tool, r.operation_id, r.started_at, r.client, writer))
        delete = f"DELETE FROM {self._table} WHERE call_id = {m} AND attempt = {m}"
        for key in finished:
            conn.execute(delete, key)

    def committed(self, marks: Sequence[AttemptRecord], finished: Sequence[Key]) -> None:
        """The batch's transaction committed: remember what the table now holds."""
        self._stored.update((r.call_id, r.attempt) for r in marks)
        self._stored.difference_update(finished)

    def read(self, conn: Any, limit: int) -> list[InFlight]:
        """The oldest `limit` marks in the table (any process's)."""
        sql = f"SELECT {', '.join(_COLUMNS)} FROM {self._table} ORDER BY started_at LIMIT {self._mark}"
        return [
            InFlight(
                call_id=row[0],
                attempt=int(row[1]),
                server=row[2],
                tool=row[3],
                operation_id=row[4],
                started_at=float(row[5]),
                client=row[6],
                writer=row[7],
            )
            for row in conn.execute(sql, (limit,)).fetchall()
        ]
