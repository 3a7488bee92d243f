"""Full-jitter exponential backoff (Brooker, "Exponential Backoff And Jitter", AWS 2015).

A delay is drawn uniformly from [0, min(cap, base * factor**n)], so clients that failed together
spread out instead of retrying in lock-step. The random source is injected so a schedule can be
replayed exactly in tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """A full-jitter exponential schedule."""

    base_s: float
    cap_s: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s or self.factor < 1:
            raise ValueError(f"invalid backoff: base={self.base_s}, cap={self.cap_s}, factor={self.factor}")

    def ceiling(self, retry: int) -> float:
        """The upper bound of the delay before retry number `retry` (0 for the first retry)."""
        # Compare in log space first: base * factor**retry overflows a float long before retry gets silly.
        if retry >= 64:
            return self.cap_s
        return min(self.cap_s, self.base_s * self.factor**retry)

    def delay(self, retry: int, rng: random.Random) -> float:
        """Draw the delay before retry number `retry`: uniform in [0, ceiling(retry)]."""
        return rng.uniform(0.0, self.ceiling(retry))
