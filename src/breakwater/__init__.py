"""breakwater: the isolation layer between an AI agent and its MCP tool servers.

The public API is what this module and the public submodules (`breakwater.config`, `breakwater.errors`,
`breakwater.status`, `breakwater.tasks`, `breakwater.idempotency`, `breakwater.testing`) export;
everything in a module whose name starts with an underscore is private. `tests/test_public_api.py`
pins each `__all__`, so a change to the surface is a deliberate one.

What is here, by what a user does with it:

* run it: `Breakwater` (the library), `Gateway` (breakwater as one MCP server), `Config`, `ServerSpec`,
  the eight policies and `load_config`;
* read its state: `StatusReport`, `ServerStatus`, `ServerState`, `ErrorInfo`, `Reason`, `RejectedTool`, `ToolTimeout`;
* catch its errors: `BreakwaterError`, `ConfigError`, `CallError`, its phase groups `CallRefused` (the tool
  did not run) and `CallFailed` (sent, did not succeed), their leaves and `ErrorCode`;
* plug into it: `Clock`/`SystemClock` with `DeadlineScope` (what `Clock.deadline_scope()` returns), `Journal`,
  `AttemptObserver`/`AttemptRecord`, `StateStore`/`MemoryStore`, `Telemetry` (the `otel` extra; imported only
  when asked for), `Classifier` with `Verdict`, `Outcome`, `AttemptContext` and `RetryClass`,
  `TaskStore`/`PendingTask`, `TransportFactory`/`OpenedTransport` (how each connect attempt reaches its server),
  and `TurnBudgetScope` (what `budget()` returns).

`FakeClock` lives in `breakwater.testing` (with `in_memory` and `ScriptedServer`); it is re-exported here for
existing imports.

Every name is imported on first use (PEP 562), so `breakwater --version`, `--help` and a Ctrl-C during
start-up never wait for the MCP SDK to load; `Telemetry` in particular never loads OpenTelemetry unless
asked for.
"""

from __future__ import annotations

import importlib
import inspect
import typing

if typing.TYPE_CHECKING:
    from breakwater._breakwater import Breakwater
    from breakwater._clock import Clock, DeadlineScope, SystemClock
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
    from breakwater.connect._transports import OpenedTransport, TransportFactory
    from breakwater.errors import (
        BreakwaterError,
        BudgetExhaustedError,
        CallCancelledError,
        CallError,
        CallFailed,
        CallRefused,
        CallTimeoutError,
        CircuitOpenError,
        ClientCannotAnswerError,
        ConfigError,
        ErrorCode,
        InvalidArgumentsError,
        OutcomeUnknownError,
        OverloadedError,
        ResultTooLargeError,
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
    from breakwater.status import ErrorInfo, Reason, RejectedTool, ServerState, ServerStatus, StatusReport, ToolTimeout
    from breakwater.tasks._store import PendingTask, TaskStore
    from breakwater.testing import FakeClock  # public home: breakwater.testing; kept here for existing imports

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
    "ClientCannotAnswerError",
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
    "OpenedTransport",
    "Outcome",
    "OutcomeUnknownError",
    "OverloadedError",
    "PendingTask",
    "Reason",
    "RejectedTool",
    "ResultTooLargeError",
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
    "TransportFactory",
    "TurnBudgetScope",
    "UnknownToolError",
    "UpstreamError",
    "Verdict",
    "load_config",
]

#: Where each public name is defined (imported from there on first access, then cached here).
_HOMES: dict[str, str] = {
    "AttemptContext": "breakwater.gate._classify",
    "AttemptObserver": "breakwater.journal",
    "AttemptRecord": "breakwater.journal",
    "BreakerPolicy": "breakwater.config",
    "Breakwater": "breakwater._breakwater",
    "BreakwaterError": "breakwater.errors",
    "BudgetExhaustedError": "breakwater.errors",
    "CallCancelledError": "breakwater.errors",
    "CallError": "breakwater.errors",
    "CallFailed": "breakwater.errors",
    "CallPolicy": "breakwater.config",
    "CallRefused": "breakwater.errors",
    "CallTimeoutError": "breakwater.errors",
    "CircuitOpenError": "breakwater.errors",
    "Classifier": "breakwater.gate._classify",
    "ClientCannotAnswerError": "breakwater.errors",
    "Clock": "breakwater._clock",
    "Config": "breakwater.config",
    "ConfigError": "breakwater.errors",
    "ConnectPolicy": "breakwater.config",
    "DeadlineScope": "breakwater._clock",
    "ErrorCode": "breakwater.errors",
    "ErrorInfo": "breakwater.status",
    "FakeClock": "breakwater.testing",
    "Gateway": "breakwater.gateway._server",
    "GatewayPolicy": "breakwater.config",
    "InvalidArgumentsError": "breakwater.errors",
    "Journal": "breakwater.journal",
    "JournalPolicy": "breakwater.config",
    "MemoryStore": "breakwater.state",
    "OpenedTransport": "breakwater.connect._transports",
    "Outcome": "breakwater.gate._breaker",
    "OutcomeUnknownError": "breakwater.errors",
    "OverloadedError": "breakwater.errors",
    "ResultTooLargeError": "breakwater.errors",
    "PendingTask": "breakwater.tasks._store",
    "Reason": "breakwater.status",
    "RejectedTool": "breakwater.status",
    "RetryClass": "breakwater.gate._classify",
    "RetryPolicy": "breakwater.config",
    "ServerCircuitOpenError": "breakwater.errors",
    "ServerConnectingError": "breakwater.errors",
    "ServerSpec": "breakwater.config",
    "ServerState": "breakwater.status",
    "ServerStatus": "breakwater.status",
    "ServerUnavailableError": "breakwater.errors",
    "StatePolicy": "breakwater.config",
    "StateStore": "breakwater.state",
    "StatusReport": "breakwater.status",
    "SystemClock": "breakwater._clock",
    "TaskStore": "breakwater.tasks._store",
    "Telemetry": "breakwater.observe._telemetry",
    "TelemetryPolicy": "breakwater.config",
    "ToolChangedError": "breakwater.errors",
    "ToolError": "breakwater.errors",
    "ToolTimeout": "breakwater.status",
    "TransportFactory": "breakwater.connect._transports",
    "TurnBudgetScope": "breakwater.gate._turn_budget",
    "UnknownToolError": "breakwater.errors",
    "UpstreamError": "breakwater.errors",
    "Verdict": "breakwater.gate._classify",
    "load_config": "breakwater.config",
}


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
    own = inspect.get_annotations(cls)
    if own:
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except NameError:  # a name only its type checker sees: left as written
            pass
        else:
            cls.__annotations__ = {name: hints[name] for name in own}
    cls.__module__ = __name__


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    if isinstance(value, type):
        _rehome(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
