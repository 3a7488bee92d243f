"""Parsing and totals for `breakwater stats`: the `--since` duration and the table's caption."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from breakwater.journal import ToolStats

__all__ = ["parse_duration", "summarize"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m`, `1h`, `1h30m`, `2d`, `1w` or `250ms` (ValueError otherwise)."""
    text = text.strip().lower()
    parts = _PART.findall(text) if _DURATION.fullmatch(text) else []
    if not parts or (len(parts) > 1 and not all(unit for _, unit in parts)):  # "1h30": thirty what?
        raise ValueError(f"expected a duration such as 90s, 15m, 1h30m or 2d, got {text!r}")
    seconds = sum(float(number) * _UNITS[unit or "s"] for number, unit in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return seconds


_NUMBER = r"(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?"
_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d|w)?")
_DURATION = re.compile(rf"(?:\s*{_NUMBER}\s*(?:ms|s|m|h|d|w)?)+")


def summarize(stats: Iterable[ToolStats]) -> dict[str, int]:
    """Totals over tools (calls, attempts, timeouts, outcome_unknown), for a caption."""
    totals = {"calls": 0, "attempts": 0, "timeouts": 0, "outcome_unknown": 0}
    for s in stats:
        totals["calls"] += s.calls
        totals["attempts"] += s.attempts
        totals["timeouts"] += s.timeouts
        totals["outcome_unknown"] += s.outcome_unknown
    return totals
