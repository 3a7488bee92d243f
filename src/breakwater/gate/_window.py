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
    """Counts per time bucket; buckets older than the window fall off whole."""

    width_s: float
    buckets: deque[Bucket] = field(default_factory=deque)

    def _expire(self, now: float) -> int:
        current = math.floor(now / self.width_s)
        while self.buckets and self.buckets[0].index <= current - BUCKETS:
            self.buckets.popleft()
        return current

    def add(self, now: float, *, failed: bool, slow: bool) -> None:
        current = self._expire(now)
        if not self.buckets or self.buckets[-1].index != current:
            self.buckets.append(Bucket(current))
        b = self.buckets[-1]
        b.calls += 1
        b.failures += failed
        b.slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        self._expire(now)
        calls = failures = slow = 0
        for b in self.buckets:
            calls += b.calls
            failures += b.failures
            slow += b.slow
        return calls, failures, slow

    def clear(self) -> None:
        self.buckets.clear()
