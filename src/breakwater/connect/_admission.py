"""Admission: caps on connects in flight, shared by every breakwater process on the machine.

A discrete-event simulation of the connect storm found that jitter alone barely helps when
14 sessions start 17 servers at once; a small cap on handshakes in flight is what reaches the
capacity bound with one attempt per connect. Fourteen agent sessions are fourteen processes, so the
caps live in a directory of lock files: a slot is an `flock` on one file, released by the kernel
if its holder dies, so a crashed session can never leak a slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from breakwater import _paths
from breakwater._clock import Clock

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
    _fds: list[int] = field(default_factory=list)
    _local: list[str] = field(default_factory=list)

    def release(self) -> None:
        """Unlock and close every held slot file, and return the in-process slots."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
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
            except OSError:
                # An unwritable cache dir must not stop breakwater: the caps then hold per process.
                self._dir = None

    @staticmethod
    def key_for(*parts: str) -> str:
        """A file-system-safe key for an arbitrary identity (a command line, an origin)."""
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]

    def _open_slots(self, slot: Slot) -> list[int]:
        assert self._dir is not None
        folder = self._dir / slot.key
        folder.mkdir(exist_ok=True)
        return [os.open(folder / f"{i}.lock", os.O_RDWR | os.O_CREAT, 0o600) for i in range(slot.limit)]

    def _try_all(self, slots: list[Slot], fds: dict[str, list[int]]) -> Ticket | None:
        """Take every slot now, or none of them."""
        locked: list[tuple[str, int]] = []
        local: list[str] = []
        for slot in slots:
            if slot.key in fds:
                # Random order, so waiters do not all hammer slot 0.
                for fd in self._rng.sample(fds[slot.key], len(fds[slot.key])):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    locked.append((slot.key, fd))
                    break
                else:
                    break
            elif self._local.get(slot.key, 0) < slot.limit:
                self._local[slot.key] = self._local.get(slot.key, 0) + 1
                local.append(slot.key)
            else:
                break
        else:
            for key, fd in locked:
                fds[key].remove(fd)
            return Ticket(self, [fd for _, fd in locked], local)
        for _, fd in locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        for key in local:
            self._local[key] -= 1
        return None

    async def acquire(self, slots: list[Slot]) -> Ticket:
        """Wait until every slot has room, then hold them all (all or nothing, so no deadlock)."""
        ordered = sorted(slots, key=lambda s: s.key)
        # Each waiter opens its own descriptors once: flock belongs to an open file description, so
        # two waiters in one process must not share one, and re-opening on every poll costs syscalls.
        fds = {s.key: self._open_slots(s) for s in ordered if s.shared and self._dir is not None}
        interval = POLL_MIN_S
        try:
            while (ticket := self._try_all(ordered, fds)) is None:
                await self._clock.sleep(interval * self._rng.uniform(0.5, 1.5))
                # Back off while the caps stay full: hundreds of waiters polling at a fast fixed rate
                # would burn the CPU that the handshakes they wait for need.
                interval = min(POLL_MAX_S, interval * POLL_GROWTH)
            return ticket
        finally:
            for remaining in fds.values():
                for fd in remaining:
                    os.close(fd)
