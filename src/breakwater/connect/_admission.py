"""Admission: caps on connects in flight, shared by every breakwater process on the machine.

A discrete-event simulation of the connect storm found that jitter alone barely helps when
14 sessions start 17 servers at once; a small cap on handshakes in flight is what reaches the
capacity bound with one attempt per connect. Fourteen agent sessions are fourteen processes, so the
caps live in a directory of lock files: a slot is an OS lock on one file (`filelock`: `flock` on
POSIX, `LockFileEx` on Windows), released by the kernel if its holder dies, so a crashed session can
never leak a slot.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from breakwater import _paths
from breakwater._clock import Clock

logger = logging.getLogger("breakwater.connect")

__all__ = ["Admission", "Slot", "default_admission_dir"]

# Waiting for a slot is a cheap non-blocking try, repeated with a jittered, growing interval.
POLL_MIN_S = 0.01
POLL_MAX_S = 0.25
POLL_GROWTH = 1.5


def default_admission_dir() -> Path:
    """Where the lock files live when no directory is configured."""
    return _paths.runtime_dir() / "admission"


@dataclass(frozen=True)
class Slot:
    """One cap: `key` names what is shared, `limit` how many may hold it, `shared` whether other processes count."""

    key: str
    limit: int
    shared: bool = True


@dataclass
class Ticket:
    """Held slots; `release()` gives them back (idempotent)."""

    _owner: Admission
    _locks: list[FileLock] = field(default_factory=list)
    _local: list[str] = field(default_factory=list)

    def release(self) -> None:
        """Unlock every held slot file, and return the in-process slots."""
        for lock in self._locks:
            with contextlib.suppress(OSError):
                lock.release()
        self._locks.clear()
        for key in self._local:
            self._owner._local[key] -= 1
        self._local.clear()


class Admission:
    """Grants tickets for connect attempts under per-key caps."""

    def __init__(self, *, clock: Clock, rng: random.Random, directory: Path | None) -> None:
        self._clock = clock
        self._rng = rng
        self._dir = directory
        self._local: dict[str, int] = {}
        if directory is not None:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                # An unwritable directory must not stop breakwater: the caps then hold per process, and it says so.
                self._give_up_directory(exc)

    @staticmethod
    def key_for(*parts: str) -> str:
        """A file-system-safe key for an arbitrary identity (a command line, an origin)."""
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]

    def _slot_locks(self, slot: Slot) -> list[FileLock]:
        assert self._dir is not None
        folder = self._dir / slot.key
        folder.mkdir(parents=True, exist_ok=True)  # parents: the directory may have gone since start (a cleaned /tmp)
        # One lock object per file per waiter: an OS file lock belongs to one open file, so two waiters
        # in one process exclude each other as two processes do (and `blocking=False` never sleeps).
        return [FileLock(folder / f"{i}.lock", mode=0o600, blocking=False) for i in range(slot.limit)]

    def _locks(self, slots: list[Slot]) -> dict[str, list[FileLock]]:
        """The lock files of the slots shared across processes; none once the directory cannot hold them."""
        if self._dir is None:
            return {}
        try:
            return {s.key: self._slot_locks(s) for s in slots if s.shared}
        except OSError as exc:
            self._give_up_directory(exc)
            return {}

    def _give_up_directory(self, exc: OSError) -> None:
        # A directory that went away or turned unusable after start (removed, replaced by a file, a full disk)
        # must not stop breakwater, or crash a gateway's connect loop as it did: the caps then hold per
        # process, as when the directory could not be made at start.
        if self._dir is not None:
            costs = "the connect caps hold per process, not across this user's processes"
            _paths.say_unusable(
                logger,
                "the connect admission locks",
                self._dir,
                exc,
                "[connect] admission_dir (BREAKWATER_ADMISSION_DIR) to a writable directory",
                costs,
            )
            self._dir = None

    def _try_all(self, slots: list[Slot], locks: dict[str, list[FileLock]]) -> Ticket | None:
        """Take every slot now, or none of them (a lock file that cannot be made releases what was taken)."""
        locked: list[tuple[str, FileLock]] = []
        local: list[str] = []
        try:
            for slot in slots:
                if slot.key in locks:
                    # Random order, so waiters do not all hammer slot 0.
                    for lock in self._rng.sample(locks[slot.key], len(locks[slot.key])):
                        try:
                            lock.acquire()
                        except Timeout:
                            continue
                        locked.append((slot.key, lock))
                        break
                    else:
                        break
                elif self._local.get(slot.key, 0) < slot.limit:
                    self._local[slot.key] = self._local.get(slot.key, 0) + 1
                    local.append(slot.key)
                else:
                    break
            else:
                for key, lock in locked:
                    locks[key].remove(lock)
                return Ticket(self, [lock for _, lock in locked], local)
        except OSError:
            self._undo(locked, local)
            raise
        self._undo(locked, local)
        return None

    def _undo(self, locked: list[tuple[str, FileLock]], local: list[str]) -> None:
        for _, lock in locked:
            lock.release()
        for key in local:
            self._local[key] -= 1

    async def acquire(self, slots: list[Slot]) -> Ticket:
        """Wait until every slot has room, then hold them all (all or nothing, so no deadlock)."""
        ordered = sorted(slots, key=lambda s: s.key)
        locks = self._locks(ordered)
        interval = POLL_MIN_S
        while True:
            try:
                ticket = self._try_all(ordered, locks)
            except OSError as exc:  # a lock file that cannot be made now: its directory went away meanwhile
                self._give_up_directory(exc)
                locks = {}
                continue
            if ticket is not None:
                return ticket
            await self._clock.sleep(interval * self._rng.uniform(0.5, 1.5))
            # Back off while the caps stay full: hundreds of waiters polling at a fast fixed rate
            # would burn the CPU that the handshakes they wait for need.
            interval = min(POLL_MAX_S, interval * POLL_GROWTH)
