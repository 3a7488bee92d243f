"""Goal and star conditions as data, so a verdict can say which condition failed and by how much.

A mission's goal (1 star) and its efficiency rule (3 stars) are lists of `Condition`s. Each one reads
one metric or one control, compares it with a limit, and explains itself: the value seen, whether
it holds and, for a number, how far it is from the limit. The page turns the failed ones red.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from breakwater.lab.config import LabConfig
from breakwater.lab.metrics import Metrics

__all__ = ["Condition", "control", "metric", "no_failures"]

Op = Literal["<=", ">=", "=="]
_FAILED: Final = "failed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    """`<key> <op> <limit>` on a metric (`on="metrics"`) or a control (`on="config"`)."""

    key: str
    """A `Metrics` field or a `LabConfig` field: also the page's tile or control to point at."""
    label: str
    """How a person says it: "failed calls", "p95 latency", "drain window"."""
    op: Op
    limit: object
    on: Literal["metrics", "config"] = "metrics"
    unit: Literal["", "ms", "s"] = ""

    def value(self, config: LabConfig, metrics: Metrics) -> object:
        """The value this condition reads. Failed calls include unfinished ones (a goal treats them alike)."""
        if self.on == "config":
            return getattr(config, self.key)
        if self.key == _FAILED:
            return metrics.failed + metrics.unfinished
        return getattr(metrics, self.key)

    def holds(self, config: LabConfig, metrics: Metrics) -> bool:
        """True when the value meets the limit; a missing value (no ok calls, keep-alive off) fails `<=`/`>=`."""
        value = self.value(config, metrics)
        if self.op == "==":
            return value == self.limit
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        assert isinstance(self.limit, int | float)
        return value <= self.limit if self.op == "<=" else value >= self.limit

    def text(self) -> str:
        """The condition in words: "p95 latency ≤ 30 s", "no failed calls"."""
        if self.op == "<=" and self.limit == 0:
            return f"no {self.label}"
        return f"{self.label} {_OPS[self.op]} {_show(self.limit, self.unit)}"

    def explain(self, config: LabConfig, metrics: Metrics) -> dict[str, object]:
        """JSON for the page: the condition, the value seen, whether it holds and by how much it misses."""
        value = self.value(config, metrics)
        holds = self.holds(config, metrics)
        out: dict[str, object] = {
            "key": self.key,
            "on": self.on,
            "label": self.label,
            "op": self.op,
            "limit": self.limit,
            "unit": self.unit,
            "text": self.text(),
            "value": value,
            "shown": _show(value, self.unit),
            "holds": holds,
            "miss": None,
        }
        if not holds:
            out["miss"] = self._miss(value)
        return out

    def _miss(self, value: object) -> str:
        if self.op != "==" and isinstance(value, int | float) and isinstance(self.limit, int | float):
            gap = value - self.limit if self.op == "<=" else self.limit - value
            side = "over" if self.op == "<=" else "under"
            return f"{_show(value, self.unit)}, {_show(gap, self.unit)} {side} the limit of {_show(self.limit, self.unit)}"
        return f"{_show(value, self.unit)}, needs {_show(self.limit, self.unit)}"


_OPS: Final = {"<=": "≤", ">=": "≥", "==": "="}


def _show(value: object, unit: str) -> str:
    if value is None:
        return "off" if unit == "s" else "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if unit == "ms" and isinstance(value, int | float):
        return f"{value // 1000} s" if value % 1000 == 0 else f"{value / 1000:.1f} s"
    if unit == "s" and isinstance(value, int | float):
        return f"{value:g} s"
    return str(value)


def metric(key: str, label: str, op: Op, limit: object, *, unit: Literal["", "ms", "s"] = "") -> Condition:
    """A condition on a metric of the run."""
    return Condition(key=key, label=label, op=op, limit=limit, unit=unit)


def control(key: str, label: str, op: Op, limit: object, *, unit: Literal["", "ms", "s"] = "") -> Condition:
    """A condition on a control of the set-up (3-star rules: "keep round-robin", "at most 3 replicas")."""
    return Condition(key=key, label=label, op=op, limit=limit, on="config", unit=unit)


def no_failures() -> Condition:
    """No failed calls; unfinished calls count as failed."""
    return metric(_FAILED, "failed calls", "<=", 0)
