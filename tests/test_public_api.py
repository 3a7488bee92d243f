"""The public surface is complete and pinned: changing it is a deliberate act that edits this file.

What a user may import is each public module's `__all__`; everything in a `_`-module is private. These
tests pin those lists, import every name, check that `Breakwater`'s own signatures only name types a
user can import from a public module, and check the error tree's phase groups.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import subprocess
import sys
import types
import typing
from typing import Any

import pytest

import breakwater
from breakwater.errors import CODE_TO_ERROR, CallError, CallFailed, CallRefused, CallTimeoutError, ErrorCode

PUBLIC: dict[str, list[str]] = {
    "breakwater": [
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
        "Outcome",
        "OpenedTransport",
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
    ],
    "breakwater.config": [
        "BreakerPolicy",
        "CallPolicy",
        "Config",
        "ConnectPolicy",
        "GatewayPolicy",
        "JournalPolicy",
        "OAuthSettings",
        "RetryPolicy",
        "ServerSpec",
        "StatePolicy",
        "TelemetryPolicy",
        "ToolFilter",
        "ToolSettings",
        "all_knobs",
        "find_config",
        "load_config",
    ],
    "breakwater.errors": [
        "BreakwaterError",
        "BudgetExhaustedError",
        "CODE_TO_ERROR",
        "CallCancelledError",
        "CallError",
        "CallFailed",
        "CallRefused",
        "CallTimeoutError",
        "CircuitOpenError",
        "ClientCannotAnswerError",
        "ConfigError",
        "ErrorCode",
        "InvalidArgumentsError",
        "OutcomeUnknownError",
        "OverloadedError",
        "ResultTooLargeError",
        "ServerCircuitOpenError",
        "ServerConnectingError",
        "ServerUnavailableError",
        "ToolChangedError",
        "ToolError",
        "UnknownToolError",
        "UpstreamError",
    ],
    "breakwater.status": [
        "ErrorInfo",
        "PERSISTENT_REASONS",
        "Reason",
        "RejectedTool",
        "ServerState",
        "ServerStatus",
        "StatusReport",
        "ToolTimeout",
        "from_iso",
        "iso",
    ],
    "breakwater.tasks": [
        "EXTENSION_ID",
        "TERMINAL_STATUSES",
        "TaskInfo",
        "TaskStatus",
        "TaskSupport",
        "current_task_id",
        "declared_tasks",
        "missing_tasks_capability",
    ],
    "breakwater.testing": ["FakeClock", "InProcessServer", "Progress", "ScriptedCall", "ScriptedServer", "in_memory"],
    "breakwater.idempotency": [
        "ClaimResult",
        "DB_PATH_ENV",
        "DEFAULT_LEASE_S",
        "DEFAULT_PURGE_INTERVAL_S",
        "DEFAULT_RETENTION_S",
        "OPERATION_ID_ARG",
        "OPERATION_ID_META_KEY",
        "OperationRecord",
        "OperationState",
        "OperationStatus",
        "OperationStore",
        "PostgresStore",
        "SQLiteStore",
        "add_operation_tool",
        "current_operation_id",
        "default_db_path",
        "default_store",
        "fingerprint",
        "idempotent",
    ],
}

#: `Breakwater` members whose annotations may name a private type, each with its reason.
INTERNAL_HANDLES: dict[str, str] = {
    "upstream": "returns the supervisor itself (`connect.Upstream`), for the gateway and for tests",
    "gate": "returns the call gate itself (`gate.CallGate`), for the gateway, the CLI and tests",
}


def is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_each_public_module_exports_exactly_the_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = list(module.__all__)
    assert len(set(exported)) == len(exported), "a name is listed twice in __all__"
    assert sorted(exported) == sorted(PUBLIC[module_name]), (
        "the public surface changed: if that is deliberate, update PUBLIC in tests/test_public_api.py "
        f"(added {sorted(set(exported) - set(PUBLIC[module_name]))}, removed {sorted(set(PUBLIC[module_name]) - set(exported))})"
    )


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_every_public_name_imports_and_says_what_it_is(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{module_name}.{name} has no docstring"
        if inspect.isclass(obj):  # its own public methods and properties too (FakeClock's had none)
            for attr, value in vars(obj).items():
                member = value.fget if isinstance(value, property) else value
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(value, property)):
                    assert member.__doc__, f"{module_name}.{name}.{attr} has no docstring"


def test_the_public_door_re_exports_the_same_objects_as_the_public_modules() -> None:
    for module_name in ("breakwater.config", "breakwater.errors", "breakwater.status"):
        module = importlib.import_module(module_name)
        for name in set(module.__all__) & set(breakwater.__all__):
            assert getattr(breakwater, name) is getattr(module, name), name


def test_classes_of_the_door_name_a_public_home_that_holds_them() -> None:
    """Reprs, pickles and help() show an import path users can write (httpx rewrites `__module__` the same way)."""
    for name in breakwater.__all__:
        obj = getattr(breakwater, name)
        if not inspect.isclass(obj):
            continue
        assert not is_private(obj.__module__), f"breakwater.{name}.__module__ is {obj.__module__}"
        assert getattr(importlib.import_module(obj.__module__), obj.__qualname__) is obj, name
        typing.get_type_hints(obj)  # a re-homed class still resolves its own annotations


def test_importing_breakwater_leaves_opentelemetry_s_module_unloaded_until_telemetry_is_named() -> None:
    code = (
        "import sys, breakwater\n"
        "assert 'breakwater.observe._telemetry' not in sys.modules\n"
        "from breakwater import Telemetry\n"
        "assert Telemetry.__module__ == 'breakwater', Telemetry.__module__\n"
        "assert breakwater.Telemetry is sys.modules['breakwater.observe._telemetry'].Telemetry\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def named_classes(hint: Any) -> typing.Iterator[type]:
    """Every class an annotation names, through unions, generics, Callable and Literal."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return
    if isinstance(hint, type) and origin is None:
        yield hint
        return
    if origin is not None and origin not in (typing.Union, types.UnionType, collections.abc.Callable):
        yield from named_classes(origin)
    for arg in typing.get_args(hint):
        if isinstance(arg, list):  # Callable's parameter list
            for item in arg:
                yield from named_classes(item)
        else:
            yield from named_classes(arg)


def public_members(cls: type) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__aenter__", "__aexit__"):
            continue
        func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(func):
            members[name] = func
    return members


def test_breakwater_s_signatures_name_only_types_users_can_import() -> None:
    namespace = {name: getattr(breakwater, name) for name in breakwater.__all__}
    members = public_members(breakwater.Breakwater)
    assert {"__init__", "call_tool", "status", "wait_ready", "budget", "from_config"} <= set(members)
    leaks = []
    for name, func in members.items():
        for where, hint in typing.get_type_hints(func, localns=namespace).items():
            for cls in named_classes(hint):
                if cls.__module__.split(".")[0] == "breakwater" and is_private(cls.__module__) and name not in INTERNAL_HANDLES:
                    leaks.append(f"Breakwater.{name} ({where}): {cls.__module__}.{cls.__qualname__}")
    assert not leaks, "public signatures name private types (export them from breakwater):\n" + "\n".join(leaks)
    for name in INTERNAL_HANDLES:
        assert name in members, f"INTERNAL_HANDLES lists {name!r}, which Breakwater no longer has"


def test_the_phase_groups_split_the_codes_into_refused_and_sent() -> None:
    refused = {code for code, cls in CODE_TO_ERROR.items() if issubclass(cls, CallRefused)}
    failed = {code for code, cls in CODE_TO_ERROR.items() if issubclass(cls, CallFailed)}
    assert refused == {
        ErrorCode.CIRCUIT_OPEN,
        ErrorCode.SERVER_CIRCUIT_OPEN,
        ErrorCode.OVERLOADED,
        ErrorCode.BUDGET_EXHAUSTED,
        ErrorCode.SERVER_CONNECTING,
        ErrorCode.SERVER_UNAVAILABLE,
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.TOOL_CHANGED,
        ErrorCode.INVALID_ARGUMENTS,
    }
    assert failed == {
        ErrorCode.TIMEOUT,
        ErrorCode.OUTCOME_UNKNOWN,
        ErrorCode.UPSTREAM_ERROR,
        ErrorCode.TOOL_ERROR,
        ErrorCode.CANCELLED,
        ErrorCode.CLIENT_CANNOT_ANSWER,  # the tool ran, asked the client, and got no answer
        ErrorCode.RESULT_TOO_LARGE,  # the tool ran; its answer was dropped unread
    }
    assert refused | failed == set(ErrorCode) and not refused & failed
    # The groups are for `except` clauses: they carry no code of their own.
    for group in (CallRefused, CallFailed):
        assert issubclass(group, CallError) and "code" not in vars(group)


def test_a_call_timeout_is_caught_by_except_timeout_error() -> None:
    err = CallTimeoutError(server="shop", tool="search")
    assert isinstance(err, TimeoutError)
    with pytest.raises(TimeoutError):
        raise err
    assert str(err) == "TIMEOUT: shop/search: The tool did not answer in time and the call was cancelled."
