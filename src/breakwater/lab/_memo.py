"""A memo of run results bounded by what they hold, not by how many there are.

A run's event log ranges from a few thousand records to 1.4 million (about 120 MB), so "the last
128 results" can be 10 MB or 10 GB. This memo weighs each entry (for results, an estimate of their
bytes) and drops the least recently used ones past a budget. An entry heavier than the whole budget
is returned by its caller but never kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["WeightedMemo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WeightedMemo(Generic[K, V]):
    """Least-recently-used memo whose entries' total weight stays within `budget`. Thread-safe."""

    def __init__(self, budget: int, weigh: Callable[[V], int]) -> None:
        self.budget = budget
        self._weigh = weigh
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    @property
    def weight(self) -> int:
        """Total weight of the entries kept."""
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The kept value for `key` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V) -> None:
        """Keep `value` unless it alone is over budget; drop the least recently used to make room."""
        weight = max(1, self._weigh(value))
        if weight > self.budget:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            while self._weight > self.budget:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()
            self._weight = 0
