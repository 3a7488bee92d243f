"""Admission: caps on connects in flight, shared by every breakwater process on the machine.

The connect-storm research (resilience-numbers.md §3.2) found that jitter alone barely helps when
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

from breakwater._clock import Clock

__all__ = ["Admission", "Slot", "default_admission_dir"]

POLL_INTERVAL_S = 0.025  # a cheap non-blocking try; jittered so waiters do not poll in lock-step


def default_admission_dir() -> Path:
    """Where the lock files live when no directory is configured."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "breakwater" / "admission"


@dataclass(frozen=True)
class Slot:
    """One cap: `key` names what is shared, `limit` how many may hold it, `shared` whether other processes count."""

    key: str
    limit: int
    shared: bool = True


@dataclass
class Ticket:
    """Held slots; `release()` gives them back (idempotent)."""

    _fds: list[int] = field(default_factory=list)
    _local: list[str] = field(default_factory=list)
    _owner: Admission | None = None

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self._owner is not None:
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

    def _try_file(self, slot: Slot) -> int | None:
        assert self._dir is not None
        folder = self._dir / slot.key
        folder.mkdir(exist_ok=True)
        # Try slots in random order so waiters do not all hammer slot 0.
        for i in self._rng.sample(range(slot.limit), slot.limit):
            fd = os.open(folder / f"{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    def _try_all(self, slots: list[Slot], ticket: Ticket) -> bool:
        for slot in slots:
            if slot.shared and self._dir is not None:
                fd = self._try_file(slot)
                if fd is None:
                    return False
                ticket._fds.append(fd)
            else:
                if self._local.get(slot.key, 0) >= slot.limit:
                    return False
                self._local[slot.key] = self._local.get(slot.key, 0) + 1
                ticket._local.append(slot.key)
        return True

    async def acquire(self, slots: list[Slot]) -> Ticket:
        """Wait until every slot has room, then hold them all (all or nothing, so no deadlock)."""
        ordered = sorted(slots, key=lambda s: s.key)
        while True:
            ticket = Ticket(_owner=self)
            if self._try_all(ordered, ticket):
                return ticket
            ticket.release()
            await self._clock.sleep(POLL_INTERVAL_S * self._rng.uniform(0.5, 1.5))
