"""The journal writer: the bounded queue the call path appends to, and the thread that drains it.

The call gate hands each attempt (and each refusal: open breaker, full bulkhead, spent budget) to
`Journal.record()` as an `AttemptRecord`. `record()` only appends to a bounded in-memory queue: no
lock, no I/O, no await, so it costs a few hundred nanoseconds whatever the disk or the database is
doing. A background thread drains the queue in batches into a store (`open_journal_store`).

When the queue is full the attempt is dropped and counted (`Journal.dropped`): a slow or full disk
costs history, never latency. The same thread deletes attempts older than the retention and, every
`learn_refresh_s`, recomputes the learned timeouts (`Journal.learned_timeout`), so the gate's
lookup is one dictionary read. Learned values come from the stored attempts, so they survive a
restart as soon as the writer's first refresh has run.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from breakwater._clock import Clock, SystemClock
from breakwater.config import Config, JournalPolicy
from breakwater.config._checks import OFF_WORDS
from breakwater.journal._in_flight import InFlight
from breakwater.journal._postgres import PostgresJournalStore
from breakwater.journal._records import AttemptRecord, JournalError
from breakwater.journal._sql import JournalStore, journal_fix
from breakwater.journal._sqlite import SQLiteJournalStore
from breakwater.journal._stats import ToolStats, learned_value, timeout_in_force

__all__ = ["Journal", "open_journal_store"]

log = logging.getLogger("breakwater.journal")

_PURGE_INTERVAL_S = 300.0
_BATCH = 512
_REOPEN_S = 5.0


def _store_away(exc: Exception) -> bool:
    """Whether a failed write says the store is away (a connection lost or refused, a database locked or restarting),
    not that it refuses these rows: DB-API's OperationalError and InterfaceError, and the OS's own errors."""
    return isinstance(exc, OSError) or any(c.__name__ in ("OperationalError", "InterfaceError") for c in type(exc).__mro__)


def open_journal_store(url: str) -> JournalStore | None:
    """The store a `[journal] url` (or `--journal`) names; None when the journal is off.

    Empty: SQLite at `default_journal_path()`. `postgresql://…` / `postgres://…`: PostgreSQL.
    `sqlite:///PATH` (SQLAlchemy's spelling: four slashes for an absolute path) or any other text:
    an SQLite file at that path. `off`: no journal.
    Nothing is opened yet.
    """
    url = url.strip()
    if url.lower() in OFF_WORDS:
        return None
    if not url:
        return SQLiteJournalStore()
    if url.startswith(("postgresql://", "postgres://")) or (url.startswith(("host=", "dbname=")) and "=" in url):
        return PostgresJournalStore(url)
    if url.startswith("sqlite:///"):
        # SQLAlchemy's spelling: sqlite:///relative.db, sqlite:////absolute/path.db.
        return SQLiteJournalStore(Path(url[len("sqlite:///") :]).expanduser())
    if "://" in url:
        raise JournalError(f"unknown journal URL scheme in {url.split('://')[0]!r}: use a path, sqlite:///PATH or postgresql://")
    return SQLiteJournalStore(Path(url).expanduser())


@dataclass(eq=False)
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


class Journal:
    """The bounded queue, its writer thread, retention and the learned-timeout cache.

    ```python
    journal = Journal(open_journal_store(config.journal.url), policy=config.journal)
    journal.start()
    journal.record(AttemptRecord(...))      # from the call path: never blocks
    journal.learned_timeout("search", "q")  # from the call path: one dict lookup
    journal.close()                         # flushes what is queued (bounded), stops the thread
    ```

    Without `start()` nothing is written until `flush()` drains the queue in the calling thread
    (what `breakwater stats` and tests use). Counters: `recorded`, `dropped` (queue full),
    `written`, `failed` (a batch the store refused; `last_error` says why).
    """

    def __init__(
        self,
        store: JournalStore,
        *,
        policy: JournalPolicy | None = None,
        clock: Clock | None = None,
        batch_size: int = _BATCH,
    ) -> None:
        self.store = store
        self.policy = policy or JournalPolicy()
        #: `[journal] record_sizes`: the gate fills in sizes and the argument hash only when set. An attribute,
        #: not a property reading the policy: the gate asks on every call (~900 instructions against ~300).
        self.record_sizes = self.policy.record_sizes
        self._clock: Clock = clock or SystemClock()
        self._queue: deque[AttemptRecord] = deque()
        self._capacity = self.policy.queue_size
        # Wake the writer early once this much is queued; below it the flush interval decides.
        self._batch = max(1, min(batch_size, self._capacity))
        self.recorded = 0
        self.dropped = 0
        self.written = 0
        self.failed = 0
        self.purged = 0
        self.last_error: str | None = None
        self._trouble: str | None = None
        self._learned: dict[tuple[str, str], float] = {}
        self._wake = threading.Event()
        self._flushes: list[_Flush] = []
        self._flushes_lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._opened = False
        self._next_open_at = 0.0
        self._next_purge_at = -math.inf
        self._next_learn_at = -math.inf
        # The writer thread and a caller's flush() must not drain at the same time.
        self._drain_lock = threading.Lock()

    @classmethod
    def from_policy(cls, policy: JournalPolicy, *, url: str | None = None, clock: Clock | None = None) -> Journal | None:
        """The journal `policy` configures (`url` overrides `policy.url`); None when it is off."""
        store = open_journal_store(policy.url if url is None else url)
        return None if store is None else cls(store, policy=policy, clock=clock)

    def __repr__(self) -> str:
        return f"Journal({self.store!r}, queued={len(self._queue)}, dropped={self.dropped})"

    # ---- the call path ----------------------------------------------------------------------

    def record(self, record: AttemptRecord) -> bool:
        """Queue one attempt for writing; False (and `dropped` + 1) when the queue is full. Never blocks.

        deque.append is atomic under the GIL, so callers need no lock; the length check may let a
        concurrent caller overshoot the capacity by a row, which is harmless.
        """
        queue = self._queue
        if len(queue) >= self._capacity:
            self.dropped += 1
            return False
        queue.append(record)
        self.recorded += 1
        if len(queue) == self._batch:
            self._wake.set()
        return True

    def record_sent(self, record: AttemptRecord) -> bool:
        """Queue the mark of an attempt of a mutating tool as it is sent (outcome `SENT`); never blocks.

        It is written at the writer's next cycle (within `flush_interval_s`), not at once: a call
        that ends before then costs no write at all (its mark and its row cancel out in the batch),
        and a crash loses only the marks of calls sent in its last flush interval.
        """
        return self.record(record)

    def in_flight(self, limit: int = 100) -> list[InFlight]:
        """Attempts sent and not finished, oldest first: in flight now, or of unknown outcome (their process died)."""
        return self.store.in_flight(limit)

    def learned_timeout(self, server: str, tool: str) -> float | None:
        """The tool's learned timeout in seconds, or None (too few samples, learning off, nothing read yet).

        Suitable for `Breakwater(learned_timeout=journal.learned_timeout)`: a dictionary read of
        the cache the writer thread refreshes every `learn_refresh_s`.
        """
        return self._learned.get((server, tool))

    def learned_timeouts(self) -> dict[tuple[str, str], float]:
        """Every learned timeout in force, by (server, tool)."""
        return dict(self._learned)

    @property
    def queued(self) -> int:
        """Attempts waiting to be written."""
        return len(self._queue)

    def counters(self) -> dict[str, Any]:
        """The journal's own health, JSON-ready (for status and metrics)."""
        return {
            "location": self.store.location,
            "recorded": self.recorded,
            "dropped": self.dropped,
            "written": self.written,
            "failed": self.failed,
            "purged": self.purged,
            "queued": len(self._queue),
            "last_error": self.last_error,
        }

    # ---- the writer -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (a daemon: a journal never keeps a process alive)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="breakwater-journal", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most `timeout` seconds), stop the writer and close the store."""
        thread = self._thread
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join(timeout)
            if thread.is_alive():
                # The store is wedged (a dead database, a hung disk): leave the daemon thread behind.
                log.warning("journal writer did not stop within %.1f s; %d attempts not written", timeout, len(self._queue))
                return
            self._thread = None
        else:
            self._cycle(final=True)
        self.store.close()
        self._opened = False

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything queued so far and run due maintenance; True when done within `timeout`."""
        if self._thread is None:
            self._cycle()
            return True
        request = _Flush()
        with self._flushes_lock:
            self._flushes.append(request)
        self._wake.set()
        return request.done.wait(timeout)

    def refresh_learned(self) -> None:
        """Recompute learned timeouts from the store now (the writer does this every `learn_refresh_s`)."""
        p = self.policy
        if not p.learn_timeouts:
            self._learned = {}
            return
        inputs = self.store.learn_inputs(self._clock.time() - p.learn_window_s, p.learn_quantile)
        learned = {}
        for inp in inputs:
            value = learned_value(inp, p)
            if value is not None:
                learned[(inp.server, inp.tool)] = value
        self._learned = learned  # one assignment: readers see the old map or the new one

    def purge(self) -> int:
        """Delete attempts older than the retention now (the writer does this every few minutes)."""
        removed = self.store.purge(self._clock.time() - self.policy.retention_days * 86400.0)
        self.purged += removed
        return removed

    def stats(
        self,
        since_s: float,
        *,
        server: str | None = None,
        tool: str | None = None,
        exact: bool = False,
        config: Config | None = None,
    ) -> list[ToolStats]:
        """Per-tool statistics over the last `since_s` seconds, with each tool's learned timeout and
        the timeout in force (resolved against `config`'s per-server and per-tool settings).

        From the per-minute rollups (percentiles within `HISTOGRAM_ACCURACY` of the exact ones);
        `exact` scans every raw row of the window instead.
        """
        since = max(0.0, self._clock.time() - since_s)  # a window longer than the epoch's age is all of it
        rows = self.store.tool_stats(since, server=server, tool=tool, exact=exact)
        learned = self._learned
        specs = {s.name: s for s in config.servers} if config is not None else {}
        out = []
        for r in rows:
            value = learned.get((r.server, r.tool))
            timeout, source = timeout_in_force(specs.get(r.server), r.tool, value)
            out.append(replace(r, learned_timeout_s=value, timeout_s=timeout, timeout_source=source))
        return out

    def _run(self) -> None:
        # A first cycle at once: the store opens and the learned timeouts are read before the first
        # calls (after a restart they would otherwise wait a flush interval on the defaults).
        self._cycle()
        while True:
            self._wake.wait(self.policy.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            self._cycle(final=stopping)
            if stopping:
                return

    def _cycle(self, *, final: bool = False) -> None:
        with self._flushes_lock:
            flushes, self._flushes = self._flushes, []
        with self._drain_lock:
            if self._ensure_open():
                self._drain()
                if not final:
                    self._maintain()
                else:  # what the store would not take by the end can only be counted
                    self.failed += len(self._queue)
                    self._queue.clear()
            elif final:
                # Closing with a store that never opened: what is queued can only be counted.
                self.failed += len(self._queue)
                self._queue.clear()
        for request in flushes:
            request.done.set()

    def _ensure_open(self) -> bool:
        if self._opened:
            return True
        now = self._clock.monotonic()
        if now < self._next_open_at:
            return False
        try:
            self.store.open()
        except Exception as exc:
            self._next_open_at = now + _REOPEN_S
            self._note_error("open", exc)
            # Nothing can be written: keep the queue bounded by what record() admits and retry later.
            return False
        self._opened = True
        return True

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            batch = []
            try:
                for _ in range(_BATCH):
                    batch.append(queue.popleft())
            except IndexError:
                pass
            try:
                self.store.insert(batch)
            except Exception as exc:
                self._note_error("write", exc)
                if _store_away(exc):
                    # The store went away (a database restarted, a network cut): the rows wait for it, as they wait for
                    # a store not there at start (the queue stays bounded by `record`). They were dropped for good.
                    queue.extendleft(reversed(batch))
                else:  # the rows themselves are refused: another try would be refused too
                    self.failed += len(batch)
                return
            if self.last_error is not None:
                log.warning("breakwater: the call journal writes again (%s)", self.store.location)
                self.last_error = self._trouble = None
            self.written += len(batch)

    def _maintain(self) -> None:
        now = self._clock.time()
        try:
            if now >= self._next_purge_at:
                self._next_purge_at = now + _PURGE_INTERVAL_S
                self.purge()
            if now >= self._next_learn_at:
                self._next_learn_at = now + self.policy.learn_refresh_s
                self.refresh_learned()
        except Exception as exc:
            self._note_error("maintenance", exc)

    def trouble(self) -> str | None:
        """What is wrong with the journal now, its fix included (None while it writes): the line its log has too."""
        return self._trouble

    def _note_error(self, what: str, exc: Exception) -> None:
        message = f"{what}: {type(exc).__name__}: {exc}".strip()
        if message != self.last_error:
            # Calls go on without it; what to do is the store's to say (a damaged file, a lock), else to point it
            # elsewhere, or turn it off.
            fix = journal_fix(self.store, exc) or "set [journal] url or BREAKWATER_JOURNAL to a writable path, or off"
            self._trouble = (
                f"the call journal {message} ({self.store.location}); calls go on unrecorded until it works (fix: {fix})"
            )
            log.warning("breakwater: %s", self._trouble)
        self.last_error = message
