"""breakwater: the isolation layer between an AI agent and its MCP tool servers.

The public API is what this module and the public submodules (`breakwater.config`, `breakwater.errors`,
`breakwater.status`, `breakwater.tasks`, `breakwater.idempotency`, `breakwater.testing`) export;
everything in a module whose name starts with an underscore is private. `tests/test_public_api.py`
pins each `__all__`, so a change to the surface is a deliberate one.

What is here, by what a user does with it:

* run it: `Breakwater` (the library), `Gateway` (breakwater as one MCP server), `Config`, `ServerSpec`,
  the eight policies and `load_config`;
* read its state: `StatusReport`, `ServerStatus`, `ServerState`, `ErrorInfo`, `Reason`, `ToolTimeout`;
* catch its errors: `BreakwaterError`, `ConfigError`, `CallError`, its phase groups `CallRefused` (the tool
  did not run) and `CallFailed` (sent, did not succeed), their leaves and `ErrorCode`;
* plug into it: `Clock`/`SystemClock`, `Journal`, `AttemptObserver`/`AttemptRecord`, `StateStore`/`MemoryStore`,
  `Telemetry` (the `otel` extra; imported only when asked for), `Classifier` with `Verdict`, `Outcome`,
  `AttemptContext` and `RetryClass`, `TaskStore`/`PendingTask`, and `TurnBudgetScope` (what `budget()` returns).

`FakeClock` and `DeadlineScope` are test kit; they are exported here until `breakwater.testing` takes them.
"""

from __future__ import annotations

import importlib
import typing

# The public names and the modules that define them. They are bound on first access (PEP 562), so
# importing one leaf such as `breakwater.errors` or the fleet lab (`breakwater lab run`) does not pay
# for the gateway and the MCP SDK (about 0.6 s). Type checkers read the imports below instead.
_HOMES: dict[str, tuple[str, ...]] = {
    "breakwater._breakwater": ("Breakwater",),
    "breakwater._clock": (
        "Clock",
        "DeadlineScope",
        "FakeClock",
        "SystemClock",
    ),
    "breakwater.config": (
        "BreakerPolicy",
        "CallPolicy",
        "Config",
        "ConnectPolicy",
        "GatewayPolicy",
        "JournalPolicy",
        "RetryPolicy",
        "ServerSpec",
        "StatePolicy",
        "TelemetryPolicy",
        "load_config",
    ),
    "breakwater.errors": (
        "BreakwaterError",
        "BudgetExhaustedError",
        "CallCancelledError",
        "CallError",
        "CallFailed",
        "CallRefused",
        "CallTimeoutError",
        "CircuitOpenError",
        "ConfigError",
        "ErrorCode",
        "InvalidArgumentsError",
        "OutcomeUnknownError",
        "OverloadedError",
        "ServerCircuitOpenError",
        "ServerConnectingError",
        "ServerUnavailableError",
        "ToolChangedError",
        "ToolError",
        "UnknownToolError",
        "UpstreamError",
    ),
    "breakwater.gate._breaker": ("Outcome",),
    "breakwater.gate._classify": (
        "AttemptContext",
        "Classifier",
        "RetryClass",
        "Verdict",
    ),
    "breakwater.gate._turn_budget": ("TurnBudgetScope",),
    "breakwater.gateway._server": ("Gateway",),
    "breakwater.journal": (
        "AttemptObserver",
        "AttemptRecord",
        "Journal",
    ),
    "breakwater.state": (
        "MemoryStore",
        "StateStore",
    ),
    "breakwater.status": (
        "ErrorInfo",
        "Reason",
        "ServerState",
        "ServerStatus",
        "StatusReport",
        "ToolTimeout",
    ),
    "breakwater.tasks._store": (
        "PendingTask",
        "TaskStore",
    ),
}

if typing.TYPE_CHECKING:
    from breakwater._breakwater import Breakwater
    from breakwater._clock import Clock, DeadlineScope, FakeClock, SystemClock
    from breakwater.config import (
        BreakerPolicy,
        CallPolicy,
        Config,
        ConnectPolicy,
        GatewayPolicy,
        JournalPolicy,
        RetryPolicy,
        ServerSpec,
        StatePolicy,
        TelemetryPolicy,
        load_config,
    )
    from breakwater.errors import (
        BreakwaterError,
        BudgetExhaustedError,
        CallCancelledError,
        CallError,
        CallFailed,
        CallRefused,
        CallTimeoutError,
        CircuitOpenError,
        ConfigError,
        ErrorCode,
        InvalidArgumentsError,
        OutcomeUnknownError,
        OverloadedError,
        ServerCircuitOpenError,
        ServerConnectingError,
        ServerUnavailableError,
        ToolChangedError,
        ToolError,
        UnknownToolError,
        UpstreamError,
    )
    from breakwater.gate._breaker import Outcome
    from breakwater.gate._classify import AttemptContext, Classifier, RetryClass, Verdict
    from breakwater.gate._turn_budget import TurnBudgetScope
    from breakwater.gateway._server import Gateway
    from breakwater.journal import AttemptObserver, AttemptRecord, Journal
    from breakwater.observe._telemetry import Telemetry
    from breakwater.state import MemoryStore, StateStore
    from breakwater.status import ErrorInfo, Reason, ServerState, ServerStatus, StatusReport, ToolTimeout
    from breakwater.tasks._store import PendingTask, TaskStore

__all__ = [
    "AttemptContext",
    "AttemptObserver",
    "AttemptRecord",
    "BreakerPolicy",
    "Breakwater",
    "BreakwaterError",
    "BudgetExhaustedError",
    "CallCancelledError",
    "CallError",
    "CallFailed",
    "CallPolicy",
    "CallRefused",
    "CallTimeoutError",
    "CircuitOpenError",
    "Classifier",
    "Clock",
    "Config",
    "ConfigError",
    "ConnectPolicy",
    "DeadlineScope",
    "ErrorCode",
    "ErrorInfo",
    "FakeClock",
    "Gateway",
    "GatewayPolicy",
    "InvalidArgumentsError",
    "Journal",
    "JournalPolicy",
    "MemoryStore",
    "Outcome",
    "OutcomeUnknownError",
    "OverloadedError",
    "PendingTask",
    "Reason",
    "RetryClass",
    "RetryPolicy",
    "ServerCircuitOpenError",
    "ServerConnectingError",
    "ServerSpec",
    "ServerState",
    "ServerStatus",
    "ServerUnavailableError",
    "StatePolicy",
    "StateStore",
    "StatusReport",
    "SystemClock",
    "TaskStore",
    "Telemetry",
    "TelemetryPolicy",
    "ToolChangedError",
    "ToolError",
    "ToolTimeout",
    "TurnBudgetScope",
    "UnknownToolError",
    "UpstreamError",
    "Verdict",
    "load_config",
]


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _rehome(cls: type) -> None:
    """Name this module as the home of a class re-exported from a private one, as httpx does.

    Reprs, pickles, `help()` and signatures then show the path users import, not one that moves when
    the code is reorganised. The class's own annotations are resolved first, in the module that wrote
    them, so `typing.get_type_hints()` keeps working once the class claims to live here.
    """
    if not _is_private(cls.__module__):
        return
    import inspect  # here, not at the top: `inspect` alone costs a lazy importer like the lab 30 ms

    own = inspect.get_annotations(cls)
    if own:
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except NameError:  # a name only its type checker sees: left as written
            pass
        else:
            cls.__annotations__ = {name: hints[name] for name in own}
    cls.__module__ = __name__


def _load() -> None:
    """Bind every public name but `Telemetry` here, then re-home the classes from private modules.

    All at once, on the first access to any of them: from then on the module is exactly what an eager
    import made it (every class re-homed, whichever name was asked for first).
    """
    for module, names in _HOMES.items():
        home = importlib.import_module(module)
        for name in names:
            globals()[name] = getattr(home, name)
    for name in _HOMES_NAMES:
        obj = globals()[name]
        if isinstance(obj, type):
            _rehome(obj)


_HOMES_NAMES: frozenset[str] = frozenset(n for names in _HOMES.values() for n in names)


def __getattr__(name: str) -> object:
    # `Telemetry` needs the `otel` extra, and breakwater promises never to import it (nor OpenTelemetry's
    # SDK) unless telemetry is used: it is imported on first access by name.
    if name == "Telemetry":
        from breakwater.observe._telemetry import Telemetry

        _rehome(Telemetry)
        globals()[name] = Telemetry
        return Telemetry
    if name in _HOMES_NAMES:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
