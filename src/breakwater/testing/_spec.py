"""Tool specs of the test server: `--tool NAME:key=value,...` parsed into a `ToolSpec`.

The grammar and every key are described in `breakwater.testing.server`'s docstring (the
`--help` text). Imports nothing of breakwater.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mcp.types import ToolAnnotations

__all__ = ["DEFAULT_TOOLS", "OUTCOMES", "STATE_TOOL", "Latency", "ToolSpec", "describe", "parse_tool_spec"]

#: The built-in tool that reports the process's counters.
STATE_TOOL = "testserver_state"

#: The tools a server without `--tool` (or with `--default-tools`) offers.
DEFAULT_TOOLS: tuple[str, ...] = (
    "echo:readonly,idempotent",
    "add:readonly,idempotent",
    "slow:latency=2,progress=0.5,readonly",
    "hang:hang=1,readonly",
    "flaky:fail=0.5,readonly",
    "create_order:mutating,destructive",
)

#: The injected outcomes, in the order one uniform draw tests them (success is what is left).
OUTCOMES = ("crash", "hang", "fail", "error", "business", "retryable_error", "rpc_error")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_ANNOTATION_KEYS = frozenset({"readonly", "idempotent", "destructive", "openworld"})


@dataclass(frozen=True)
class Latency:
    """A latency distribution: fixed seconds, lognormal(median, sigma) or uniform(low, high)."""

    kind: Literal["fixed", "lognormal", "uniform"] = "fixed"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Latency:
        """Parse `0.2`, `lognormal(0.2,0.5)` or `uniform(0.1,0.3)`."""
        text = text.strip()
        m = re.fullmatch(r"(lognormal|uniform)\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)", text)
        if m is not None:
            kind: Literal["lognormal", "uniform"] = "lognormal" if m.group(1) == "lognormal" else "uniform"
            a, b = _number(m.group(2)), _number(m.group(3))
            if kind == "lognormal" and (a <= 0 or b < 0):
                raise ValueError(f"lognormal needs median > 0 and sigma >= 0, got {text!r}")
            if kind == "uniform" and not 0 <= a <= b:
                raise ValueError(f"uniform needs 0 <= low <= high, got {text!r}")
            return cls(kind, a, b)
        seconds = _number(text)
        if seconds < 0:
            raise ValueError(f"latency must be >= 0, got {text!r}")
        return cls("fixed", seconds)

    def draw(self, rng: random.Random) -> float:
        """One latency in seconds; a fixed latency consumes no random draw."""
        if self.kind == "lognormal":
            return rng.lognormvariate(math.log(self.a), self.b)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return self.a


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """One tool's behaviour, as parsed from a `--tool` spec (see the module docstring)."""

    name: str
    latency: Latency = Latency()
    progress: float | None = None
    logs: int = 0
    fail: float = 0.0
    error: float = 0.0
    business: float = 0.0
    retryable_error: float = 0.0
    rpc_error: float = 0.0
    hang: float = 0.0
    crash: float = 0.0
    mutating: bool = False
    commit: Literal["start", "end"] = "start"
    readonly: bool | None = None
    idempotent: bool | None = None
    destructive: bool | None = None
    openworld: bool | None = None

    def with_items(self, items: Mapping[str, str], *, runtime: bool = False) -> ToolSpec:
        """A copy with `items` (key -> raw value text) applied; raises ValueError on a bad key or value."""
        changes: dict[str, Any] = {}
        for raw_key, raw_value in items.items():
            key = raw_key.strip().replace("-", "_")
            if runtime and key in _ANNOTATION_KEYS:
                raise ValueError(f"{key!r} is an annotation and cannot change at run time")
            changes[key] = _parse_value(key, raw_value)
        spec = dataclasses.replace(self, **changes)
        spec._validate()
        return spec

    def annotations(self) -> ToolAnnotations | None:
        """The MCP annotations this spec asks for (None when no hint was given)."""
        hints = (self.readonly, self.destructive, self.idempotent, self.openworld)
        if all(h is None for h in hints):
            return None
        return ToolAnnotations(
            read_only_hint=self.readonly,
            destructive_hint=self.destructive,
            idempotent_hint=self.idempotent,
            open_world_hint=self.openworld,
        )

    def _validate(self) -> None:
        total = sum(getattr(self, o) for o in OUTCOMES)
        if total > 1 + 1e-9:
            raise ValueError(f"tool {self.name!r}: outcome probabilities sum to {total:g} > 1")
        if self.progress is not None and self.progress <= 0:
            raise ValueError(f"tool {self.name!r}: progress interval must be > 0")


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("", "1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _parse_value(key: str, raw: str) -> Any:
    if key == "latency":
        return Latency.parse(raw)
    if key == "progress":
        return None if raw.strip().lower() in ("none", "off", "0") else _number(raw)
    if key == "logs":
        count = _number(raw)
        if count < 0 or count != int(count):
            raise ValueError(f"logs is a count of messages (0 or more), got {raw!r}")
        return int(count)
    if key in OUTCOMES:
        p = _number(raw)
        if not 0 <= p <= 1:
            raise ValueError(f"{key} is a probability in [0, 1], got {raw!r}")
        return p
    if key in ("mutating", *_ANNOTATION_KEYS):
        return _parse_bool(raw)
    if key == "commit":
        if raw not in ("start", "end"):
            raise ValueError(f"commit must be start or end, got {raw!r}")
        return raw
    known = ", ".join(["latency", "progress", "logs", *OUTCOMES, "mutating", "commit", *sorted(_ANNOTATION_KEYS)])
    raise ValueError(f"unknown tool key {key!r} (known: {known})")


def _split_items(text: str) -> list[str]:
    """Split on commas outside parentheses, so `latency=uniform(1,2),fail=0.1` stays two items."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def parse_tool_spec(text: str) -> ToolSpec:
    """Parse `NAME[:key=value[,key=value...]]` (see the module docstring); raises ValueError."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid tool name {name!r} (letters, digits, '_', '.', '-')")
    if name == STATE_TOOL:
        raise ValueError(f"{STATE_TOOL!r} is built in")
    items: dict[str, str] = {}
    for item in _split_items(rest):
        key, _, value = item.partition("=")
        items[key] = value
    return ToolSpec(name=name).with_items(items)


def describe(spec: ToolSpec) -> str:
    """A one-line summary of `spec` for the tool's description."""
    parts = [f"latency={spec.latency.kind}({spec.latency.a:g},{spec.latency.b:g})"]
    parts += [f"{o}={getattr(spec, o):g}" for o in OUTCOMES if getattr(spec, o)]
    if spec.progress is not None:
        parts.append(f"progress={spec.progress:g}")
    if spec.mutating:
        parts.append(f"mutating(commit={spec.commit})")
    return ", ".join(parts)
