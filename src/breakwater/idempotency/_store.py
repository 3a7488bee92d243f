"""The operation record, its states, and the protocol every operation store implements.

A record is keyed by the operation id alone: one logical call, one id, whatever tool it names.
The same id sent to a different tool is a fingerprint mismatch, not a second operation.

Times in a record are wall-clock seconds (`Clock.time()`), because a lease has to mean the same
thing to every replica that shares a store; monotonic clocks are per process. Replicas therefore
need clocks that agree to well within a lease (NTP does that by orders of magnitude).
"""

from __future__ import annotations

import enum
import math
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from breakwater import _paths
from breakwater._clock import Clock

__all__ = [
    "DB_PATH_ENV",
    "DEFAULT_LEASE_S",
    "DEFAULT_PURGE_INTERVAL_S",
    "DEFAULT_RETENTION_S",
    "RECORD_COLUMNS",
    "ClaimResult",
    "OperationRecord",
    "OperationState",
    "OperationStore",
    "checked_durations",
    "default_db_path",
    "new_owner_id",
]

#: How long a claim stays valid without a heartbeat. The owner renews it every third of this, so two
#: missed renewals are tolerated before a running tool could be mistaken for a dead one; a crashed
#: owner is detected at most this long after it died. Brandur's idempotency-key design locks for 90 s: stay below.
DEFAULT_LEASE_S = 30.0

#: How long finished records are kept (and replayed). Stripe prunes keys at >= 24 h; so does this.
DEFAULT_RETENTION_S = 24 * 3600.0

#: How often a store deletes records older than its retention (checked on each claim).
DEFAULT_PURGE_INTERVAL_S = 600.0

#: Environment variable that overrides where the embedded SQLite store lives.
DB_PATH_ENV = "BREAKWATER_IDEMPOTENCY_DB"


class OperationState(enum.StrEnum):
    """Where one operation is in its life.

    `pending` (claimed, tool not started) → `executing` (the tool may have caused side effects) →
    `completed` (result stored) / `failed` (error stored) / `unknown` (the owner died or was cancelled
    mid-execution; nobody can say whether the side effect happened, so it is never re-run).
    """

    PENDING = "pending"
    EXECUTING = "executing"
    COMPLETED = "completed"
    FAILED = "failed"
    UNKNOWN = "unknown"

    @property
    def is_final(self) -> bool:
        """True for the states a repeated call replays instead of waiting on."""
        return self in (OperationState.COMPLETED, OperationState.FAILED, OperationState.UNKNOWN)


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One operation as a store holds it.

    `outcome` is JSON: `{"result": <CallToolResult as wire JSON>}` when completed,
    `{"error": {"kind", "message", ...}}` when failed, `{"reason": ...}` when unknown, else None.
    `lease_until` is None once the record is final.
    """

    operation_id: str
    tool: str
    fingerprint: str
    state: OperationState
    owner: str
    created_at: float
    updated_at: float
    lease_until: float | None
    outcome: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any], *, outcome: dict[str, Any] | None) -> OperationRecord:
        """A record from a table row in `RECORD_COLUMNS` order; `outcome` is the last column decoded
        (each store keeps it in its own JSON type)."""
        return cls(
            operation_id=row[0],
            tool=row[1],
            fingerprint=row[2],
            state=OperationState(row[3]),
            owner=row[4],
            created_at=float(row[5]),
            updated_at=float(row[6]),
            lease_until=float(row[7]) if row[7] is not None else None,
            outcome=outcome,
        )


#: The columns of an operations table, in the order `OperationRecord.from_row` reads them.
RECORD_COLUMNS = ("operation_id", "tool", "fingerprint", "state", "owner", "created_at", "updated_at", "lease_until", "outcome")


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What `OperationStore.claim` decided: `owned` means the caller may run the tool."""

    owned: bool
    record: OperationRecord


class OperationStore(Protocol):
    """Durable operation records with an atomic owner decision.

    Every mutating method except `claim` is fenced by `owner`: it changes the record only while the
    caller still owns it, and says whether it did. That is what keeps a slow owner whose lease lapsed
    from overwriting a record someone else has since taken over.
    """

    clock: Clock
    retention_s: float

    async def claim(self, operation_id: str, *, tool: str, fingerprint: str, owner: str, lease_s: float) -> ClaimResult:
        """Decide atomically who runs `operation_id`.

        - No record: insert one in `pending`, owned by `owner`, leased for `lease_s` → owned.
        - A `pending` record whose lease lapsed and whose fingerprint matches: its owner died before
          starting the tool, so nothing can have happened; `owner` takes it over → owned.
        - An `executing` record whose lease lapsed: the owner died mid-execution; the record becomes
          `unknown` → not owned.
        - Anything else → not owned, with the record as it stands.

        Also purges records past retention when the purge interval has elapsed.
        """
        ...

    async def mark_executing(self, operation_id: str, *, owner: str, lease_s: float) -> bool:
        """`pending` → `executing` with a fresh lease, just before the tool starts."""
        ...

    async def renew(self, operation_id: str, *, owner: str, lease_s: float) -> bool:
        """Extend the lease of a `pending`/`executing` record (the heartbeat)."""
        ...

    async def finish(self, operation_id: str, *, owner: str, state: OperationState, outcome: dict[str, Any] | None) -> bool:
        """Store the final state and outcome.

        Allowed from `pending`, `executing` and `unknown`: an owner whose lease lapsed while it was
        still running (a long pause, a store outage) knows the real outcome better than `unknown`.
        """
        ...

    async def release(self, operation_id: str, *, owner: str) -> bool:
        """Delete a `pending`/`executing` record so the same id may run again (nothing happened)."""
        ...

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The record, after turning an `executing` record with a lapsed lease into `unknown`."""
        ...

    async def purge(self) -> int:
        """Delete records older than `retention_s`; returns how many."""
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...


def checked_durations(retention_s: object, purge_interval_s: object) -> None:
    """Refuse a retention or purge interval that is not a positive number of seconds (ValueError naming it).

    `retention_s=-1` was taken: every record was purged at once, and one operation id ran its side effect three times.
    """
    for name, value in (("retention_s", retention_s), ("purge_interval_s", purge_interval_s)):
        if type(value) not in (int, float) or not 0 < value < math.inf:  # type: ignore[operator]
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def new_owner_id() -> str:
    """A claim owner id: host and pid for people reading the table, a random part for uniqueness."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def default_db_path() -> Path:
    """Where the embedded store lives: `$BREAKWATER_IDEMPOTENCY_DB`, else the user's data directory.

    Linux: `$XDG_DATA_HOME/breakwater/operations.sqlite3` (default `~/.local/share`); macOS:
    `~/Library/Application Support/breakwater/`; Windows: `%LOCALAPPDATA%\\breakwater\\`.
    """
    override = os.environ.get(DB_PATH_ENV)
    if override:
        return Path(override).expanduser()
    return _paths.data_dir() / "operations.sqlite3"
