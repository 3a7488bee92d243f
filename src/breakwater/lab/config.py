"""The lab's controls and injections, and the fixed model parameters.

`LabConfig` is frozen, keyword-only and validated on construction, so every `LabConfig` that exists
can be simulated. Controls are in the units a person types (seconds); the engine converts to integer
milliseconds.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from breakwater.errors import ConfigError

__all__ = [
    "CLIENTS",
    "DEFAULT_DRAIN_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MODE",
    "DEFAULT_REPLICAS",
    "DEFAULT_ROUTING",
    "DEFAULT_SEED",
    "DEPLOY_START_MS",
    "HARD_STOP_MS",
    "HOT_RATE_PER_S",
    "MAX_REISSUES",
    "MIN_REPLICAS_FOR_STARS",
    "MODES",
    "RATE_PER_S",
    "REBOOT_MS",
    "RECONNECT_DELAY_MS",
    "REISSUE_DELAY_MS",
    "ROUTINGS",
    "SLOTS",
    "WINDOW_MS",
    "LabConfig",
    "LabConfigError",
    "Mode",
    "Routing",
]

Mode = Literal["2025-11-25/memory", "2025-11-25/shared", "2026-07-28"]
Routing = Literal["affinity", "round_robin"]

MODES: Final[tuple[Mode, ...]] = ("2025-11-25/memory", "2025-11-25/shared", "2026-07-28")
ROUTINGS: Final[tuple[Routing, ...]] = ("affinity", "round_robin")

# Fixed model parameters. [lab] values come from the original lab; the rest are [design].
WINDOW_MS: Final = 600_000
"""Arrivals stop at ten minutes."""
RATE_PER_S: Final = 3.0
"""Base Poisson arrival rate."""
CLIENTS: Final = 24
"""Base calls pick one of this many clients uniformly."""
SLOTS: Final = 10
"""Execution slots per replica."""
DURATION_MEDIAN_S: Final = 1.2
DURATION_SIGMA: Final = 1.0
DURATION_CAP_MS: Final = 30_000
MUT_P: Final = 0.40
MUT_FRAC_LOW: Final = 0.2
MUT_FRAC_HIGH: Final = 0.8
SLOW_P: Final = 0.02
SLOW_MIN_MS: Final = 60_000
SLOW_MAX_MS: Final = 240_000
PROGRESS_GAP_MIN_MS: Final = 45_000
PROGRESS_GAP_MAX_MS: Final = 90_000
PROGRESS_GAPS: Final = 6
"""Pre-drawn gaps per call: 6 × 45 s > 240 s, so a slow call never runs out of gaps."""
REBOOT_MS: Final = 15_000
MAX_REISSUES: Final = 3
"""At most 1 + 3 attempts per logical call, in every mode."""
DEPLOY_START_MS: Final = 120_000
RECONNECT_DELAY_MS: Final = 1_000
"""2025-11-25: the resume GET after a cut or kill (stands in for the SSE `retry` value)."""
REISSUE_DELAY_MS: Final = 1_000
"""2026-07-28: the re-issue after a cut or kill."""
HOT_RATE_PER_S: Final = 5.0
"""The hot client's extra Poisson stream (client 0)."""
HARD_STOP_MS: Final = 3_600_000
"""Anything still pending then is `unfinished`."""
MIN_REPLICAS_FOR_STARS: Final = 2
"""A fleet of one is not a fleet: no stars below this."""

# Control ranges and defaults.
DEFAULT_MODE: Final[Mode] = "2025-11-25/memory"
DEFAULT_ROUTING: Final[Routing] = "affinity"
DEFAULT_REPLICAS: Final = 3
DEFAULT_IDLE_TIMEOUT_S: Final = 60
DEFAULT_DRAIN_S: Final = 30
DEFAULT_SEED: Final = 1
REPLICAS_RANGE: Final = (1, 8)
IDLE_TIMEOUT_RANGE_S: Final = (10, 300)
IDLE_TIMEOUT_STEP_S: Final = 5
KEEPALIVE_RANGE_S: Final = (5, 120)
DRAIN_RANGE_S: Final = (0, 300)
SEED_RANGE: Final = (0, 2**63 - 1)


class LabConfigError(ConfigError, ValueError):
    """A lab control or injection with a value the model does not accept; `key` names the control."""


def _check_int(key: str, value: object, low: int, high: int) -> None:
    # bool is an int subclass; `replicas=True` is a bug, not 1 replica.
    if isinstance(value, bool) or not isinstance(value, int):
        raise LabConfigError(f"must be an integer, got {value!r}", key=key)
    if not low <= value <= high:
        raise LabConfigError(f"must be between {low} and {high}, got {value}", key=key)


@dataclass(frozen=True, kw_only=True, slots=True)
class LabConfig:
    """One lab set-up: the controls, the injections and the seed. Frozen, hashable, validated.

    Times are whole seconds, as on the lab's sliders. `keepalive_s=None` means keep-alive off.
    """

    mode: Mode = DEFAULT_MODE
    """Protocol revision and state model: one of `MODES`."""
    routing: Routing = DEFAULT_ROUTING
    """`affinity` (sticky per client) or `round_robin` (a uniform random pick per hop)."""
    replicas: int = DEFAULT_REPLICAS
    """Number of replicas, 1–8."""
    idle_timeout_s: int = DEFAULT_IDLE_TIMEOUT_S
    """Proxy idle timeout `T`, 10–300 s in 5 s steps."""
    keepalive_s: int | None = None
    """SSE keep-alive interval `K` (idle-based), 5–120 s, or None for off."""
    drain_s: int = DEFAULT_DRAIN_S
    """Deploy drain window `W`, 0–300 s."""
    idempotency: bool = False
    """Mutating tools recognise a re-executed call and skip the repeated side effect."""
    slow_tools: bool = False
    """Injection: 2 % of calls run 60–240 s and emit progress only every 45–90 s."""
    rolling_deploy: bool = False
    """Injection: replicas are drained, killed and rebooted one at a time from t = 120 s."""
    hot_client: bool = False
    """Injection: client 0 sends an extra 5 calls/s."""
    seed: int = DEFAULT_SEED
    """The traffic seed; traffic depends on nothing else."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise LabConfigError(f"must be one of {', '.join(MODES)}; got {self.mode!r}", key="mode")
        if self.routing not in ROUTINGS:
            raise LabConfigError(f"must be one of {', '.join(ROUTINGS)}; got {self.routing!r}", key="routing")
        _check_int("replicas", self.replicas, *REPLICAS_RANGE)
        _check_int("idle_timeout_s", self.idle_timeout_s, *IDLE_TIMEOUT_RANGE_S)
        if self.idle_timeout_s % IDLE_TIMEOUT_STEP_S:
            raise LabConfigError(
                f"must be a multiple of {IDLE_TIMEOUT_STEP_S} s, got {self.idle_timeout_s}", key="idle_timeout_s"
            )
        if self.keepalive_s is not None:
            _check_int("keepalive_s", self.keepalive_s, *KEEPALIVE_RANGE_S)
        _check_int("drain_s", self.drain_s, *DRAIN_RANGE_S)
        _check_int("seed", self.seed, *SEED_RANGE)
        for name in ("idempotency", "slow_tools", "rolling_deploy", "hot_client"):
            if not isinstance(getattr(self, name), bool):
                raise LabConfigError(f"must be true or false, got {getattr(self, name)!r}", key=name)

    @property
    def keepalive_effective(self) -> bool:
        """True when keep-alive comments arrive before the proxy's idle cut (`0 < K < T`)."""
        return self.keepalive_s is not None and self.keepalive_s < self.idle_timeout_s

    def replace(self, **changes: Any) -> LabConfig:
        """A copy with some fields changed (validated like any construction)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        """The config as plain JSON values; `LabConfig.from_dict(c.to_dict()) == c`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, base: LabConfig | None = None) -> LabConfig:
        """Build a config from JSON or web-form values, starting from `base` (default: the defaults).

        Accepts strings where a form would send them ("60", "off", "true", "on"). Raises
        `LabConfigError` naming the key for unknown keys and bad values.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        changes: dict[str, Any] = {}
        for key, raw in data.items():
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                fix = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
                raise LabConfigError("unknown control", key=key, fix=fix)
            changes[key] = _coerce(key, raw)
        return dataclasses.replace(base if base is not None else cls(), **changes)


_BOOLS: Final = ("idempotency", "slow_tools", "rolling_deploy", "hot_client")
_TRUE: Final = ("true", "on", "yes", "1")
_FALSE: Final = ("false", "off", "no", "0", "")


def _coerce(key: str, raw: object) -> object:
    """Turn a form value into the field's type; leave anything else for `__post_init__` to reject."""
    if key in _BOOLS:
        if isinstance(raw, str):
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise LabConfigError(f"must be true or false, got {raw!r}", key=key)
        return raw
    if key in ("mode", "routing"):
        return raw
    if key == "keepalive_s" and (raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "off"))):
        return None
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            raise LabConfigError(f"must be an integer, got {raw!r}", key=key) from None
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return raw
