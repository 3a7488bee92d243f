"""A breaker's sliding window: calls, failures and slow calls over the last `window_s`, in a few buckets."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["BUCKETS", "Window"]

# The window is kept as a few time buckets instead of one entry per call: memory stays bounded for
# hot tools and old buckets fall off whole. 12 buckets put the window's edge within 1/12 of exact.
BUCKETS = 12


@dataclass(slots=True)
class Bucket:
    index: int
    calls: int = 0
    failures: int = 0
    slow: int = 0


@dataclass(slots=True)
class Window:
    """Counts per time bucket; buckets older than the window fall off whole.

    The totals are kept as buckets come and go, so reading them (every recorded call, to see
    whether the breaker trips) does not sum the buckets.
    """

    width_s: float
    buckets: deque[Bucket] = field(default_factory=deque)
    calls: int = 0
    failures: int = 0
    slow: int = 0

    def _expire(self, now: float) -> int:
        current = math.floor(now / self.width_s)
        buckets = self.buckets
        while buckets and buckets[0].index <= current - BUCKETS:
            old = buckets.popleft()
            self.calls -= old.calls
            self.failures -= old.failures
            self.slow -= old.slow
        return current

    def add(self, now: float, failed: bool, slow: bool) -> None:
        # Positional flags: CPython matches keywords by name, on every breaker report.
        # `_expire` inlined up to its usual answer (nothing to drop): every breaker report comes here.
        current = math.floor(now / self.width_s)
        buckets = self.buckets
        if buckets and buckets[0].index <= current - BUCKETS:
            self._expire(now)
        if not buckets or buckets[-1].index != current:
            buckets.append(Bucket(current))
        b = buckets[-1]
        b.calls += 1
        self.calls += 1
        if failed:  # most reports are neither failed nor slow: no additions of zero
            b.failures += 1
            self.failures += 1
        if slow:
            b.slow += 1
            self.slow += 1

    def totals(self, now: float) -> tuple[int, int, int]:
        self._expire(now)
        return self.calls, self.failures, self.slow

    def clear(self) -> None:
        self.buckets.clear()
        self.calls = self.failures = self.slow = 0
