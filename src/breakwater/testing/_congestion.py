"""The test server's congestion model: handshakes share a processor across processes (connect storms).

Described in `breakwater.testing.server`'s docstring (`--congestion-dir`). The test server is a
separate process that models real time, so it sleeps on the real clock. Imports only the core
`_platform` of breakwater (whether a marker's process still runs).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import time
from pathlib import Path

import anyio

from breakwater import _platform

__all__ = ["Congestion"]

_CONGESTION_TICK_S = 0.025
_LIVENESS_TTL_S = 0.5


class Congestion:
    """Processor sharing across every process that uses the same marker directory."""

    def __init__(self, directory: Path, work_s: float, cores: float, sigma: float) -> None:
        self._dir = directory
        self._work_s = work_s
        self._cores = cores
        self._sigma = sigma
        self._seq = itertools.count()
        self._liveness: dict[int, tuple[bool, float]] = {}
        self._count = 0
        self._counted_at = -math.inf
        directory.mkdir(parents=True, exist_ok=True)

    def _alive(self, pid: int) -> bool:
        if pid == os.getpid():
            return True
        now = time.monotonic()
        cached = self._liveness.get(pid)
        if cached is not None and now - cached[1] < _LIVENESS_TTL_S:
            return cached[0]
        alive = _platform.pid_alive(pid)
        self._liveness[pid] = (alive, now)
        return alive

    def in_flight(self) -> int:
        """Handshakes in flight machine-wide (live markers in the directory), re-counted at most once a tick.

        Every in-flight handshake asks each tick; listing the directory once per process and tick keeps
        the model's own CPU cost from becoming the congestion it models.
        """
        now = time.monotonic()
        if now - self._counted_at < _CONGESTION_TICK_S / 2:
            return self._count
        self._count = self._list_in_flight()
        self._counted_at = now
        return self._count

    def _list_in_flight(self) -> int:
        n = 0
        for entry in os.listdir(self._dir):
            pid_text = entry.partition("-")[0]
            if not pid_text.isdigit():
                continue
            if self._alive(int(pid_text)):
                n += 1
            else:
                # The owner died without cleaning up; drop its marker so it stops counting for everyone.
                with contextlib.suppress(OSError):
                    (self._dir / entry).unlink()
        return n

    async def serve(self, rng: random.Random) -> float:
        """Hold one handshake until it has received its share of service; returns the work drawn."""
        # --congestion-work is the mean, so S*M*work/cores is the capacity bound a benchmark quotes.
        mu = math.log(self._work_s) - self._sigma**2 / 2
        work = self._work_s if self._sigma <= 0 else rng.lognormvariate(mu, self._sigma)
        marker = self._dir / f"{os.getpid()}-{next(self._seq)}.handshake"
        marker.touch()
        try:
            done = 0.0
            last = time.monotonic()
            while done < work:
                rate = min(1.0, self._cores / max(1, self.in_flight()))
                await anyio.sleep(min(_CONGESTION_TICK_S, (work - done) / rate))
                now = time.monotonic()
                done += (now - last) * rate
                last = now
        finally:
            with contextlib.suppress(OSError):
                marker.unlink()
        return work
