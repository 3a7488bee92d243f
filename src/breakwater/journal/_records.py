"""What the journal records: one `AttemptRecord` per attempt, the outcome vocabulary, and the
observer bus the call gate hands records to (`AttemptObserver`, `CallTracer`, `fan_out`).

Arguments and results are never stored: they may hold personal data. `record_sizes` opts in to
their sizes and a hash of the arguments (`arguments_digest`, computed by the caller).

Times are wall-clock seconds (`Clock.time()`): attempts from several processes and hosts land in
one table, and people read them as dates.
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import json
import operator
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from breakwater.errors import BreakwaterError, ErrorCode

__all__ = [
    "ANSWERED_OUTCOMES",
    "CALLERS_OWN_OUTCOMES",
    "DOWNSTREAM_CLIENT",
    "OUTCOMES",
    "RECONCILED",
    "REFUSAL_OUTCOMES",
    "SENT",
    "TRACE_ID",
    "AttemptObserver",
    "AttemptRecord",
    "CallTracer",
    "JournalError",
    "arguments_digest",
    "attempt_record",
    "fan_out",
    "new_call_id",
    "outcome_of",
    "sent_recorder",
]


class JournalError(BreakwaterError):
    """The journal's store cannot be used (unknown URL, a schema newer than this code, no driver)."""


#: The downstream client (the agent's MCP client name) of the call running in this context; the gateway sets it.
DOWNSTREAM_CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("breakwater_downstream_client", default=None)
#: The trace the call running in this context belongs to (OpenTelemetry will set it); None = the call id.
TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("breakwater_trace_id", default=None)

#: Outcomes of attempts that got an answer: their durations are the tool's latency.
ANSWERED_OUTCOMES = ("completed", "tool_error")
#: Outcomes of calls refused before anything was sent upstream.
REFUSAL_OUTCOMES = (
    "circuit_open",
    "overloaded",
    "budget_exhausted",
    "server_connecting",
    "server_unavailable",
    "unknown_tool",
    "tool_changed",
    "invalid_arguments",
)
#: A call settled by asking the server what became of its operation (`get_operation` answered
#: `completed`): a success, but not an attempt of the tool.
RECONCILED = "reconciled"
#: Refusals of the caller's own request (arguments the schema refuses, a tool no server lists): no call of the tool, so
#: `stats` counts none (a healthy tool read 50 % for an agent's one bad argument, and a typo got a row at 0 %).
CALLERS_OWN_OUTCOMES = ("invalid_arguments", "unknown_tool")
#: The outcome of a mark queued when an attempt of a tool that is not read-only is sent
#: (`Journal.record_sent`): never an attempt row, only a trace a crash leaves (see `_in_flight.py`).
SENT = "sent"
# What a learned timeout is computed from: answers, plus timeouts at the time they were cut (a
# censored sample is at least that long; leaving it out would teach the gate ever shorter timeouts).
_LEARN_OUTCOMES = (*ANSWERED_OUTCOMES, "timeout")


@dataclass(slots=True, kw_only=True)
class AttemptRecord:
    """One attempt of one logical call, or one refusal (then `duration_s` is 0).

    Not frozen on purpose: a frozen dataclass's `__init__` goes through `object.__setattr__` per
    field, which would triple the cost of building one on the call path.
    """

    server: str
    tool: str
    #: The logical call: every attempt (and reconciliation) of one call shares it.
    call_id: str
    #: 1 for the first attempt, counting every send (a re-send of the same attempt counts too); a
    #: refusal carries the number the refused attempt would have had. Each call has exactly one row
    #: with attempt 1: `stats` counts calls that way.
    attempt: int
    #: Wall-clock seconds (`Clock.time()`) when the attempt started.
    started_at: float
    duration_s: float
    #: `completed`, `tool_error`, `timeout`, `cancelled`, `upstream_error`, `outcome_unknown`,
    #: `circuit_open`, `budget_exhausted`, `overloaded`, … (`outcome_of(code)`).
    outcome: str
    #: The error code the caller saw for this attempt (None when it completed).
    error_code: str | None = None
    #: Retries made in this call before this attempt.
    retries: int = 0
    trace_id: str | None = None
    operation_id: str | None = None
    #: Breaker states just after the attempt was recorded by the breakers.
    server_breaker: str | None = None
    tool_breaker: str | None = None
    #: This attempt's failure opened a breaker (tool or server).
    breaker_opened: bool = False
    #: The downstream client's name (the agent's MCP client), when known.
    client: str | None = None
    #: Opt-in (`record_sizes`): JSON sizes in bytes and a short hash of the arguments.
    arguments_size: int | None = None
    result_size: int | None = None
    arguments_hash: str | None = None


def attempt_record(
    server: str,
    tool: str,
    call_id: str,
    attempt: int,
    started_at: float,
    duration_s: float,
    outcome: str,
    error_code: str | None,
    retries: int,
    trace_id: str | None,
    operation_id: str | None,
    server_breaker: str | None,
    tool_breaker: str | None,
    breaker_opened: bool,
    client: str | None,
    arguments_size: int | None,
    result_size: int | None,
    arguments_hash: str | None,
) -> AttemptRecord:
    """`AttemptRecord(...)` with every field given, by position in field order, for the call path.

    The keyword constructor costs three times as much (~13 000 instructions against ~4 000: CPython
    matches each of the 18 keywords by name), and the gate makes one record per attempt and per
    refusal. tests/journal/test_journal.py holds the parameters to the fields.
    """
    record = new_record(AttemptRecord)
    record.server = server
    record.tool = tool
    record.call_id = call_id
    record.attempt = attempt
    record.started_at = started_at
    record.duration_s = duration_s
    record.outcome = outcome
    record.error_code = error_code
    record.retries = retries
    record.trace_id = trace_id
    record.operation_id = operation_id
    record.server_breaker = server_breaker
    record.tool_breaker = tool_breaker
    record.breaker_opened = breaker_opened
    record.client = client
    record.arguments_size = arguments_size
    record.result_size = result_size
    record.arguments_hash = arguments_hash
    return record


#: `object.__new__`, for building a record field by field (`attempt_record`, and the gate's `observe`).
new_record = object.__new__
_COLUMNS: tuple[str, ...] = tuple(AttemptRecord.__dataclass_fields__)
# One C call per row instead of a generator of getattr calls: the writer's main per-row cost.
_as_row = operator.attrgetter(*_COLUMNS)


def _record_from(row: Sequence[Any]) -> AttemptRecord:
    """The record a stored row (`_COLUMNS`, in order) holds."""
    values = dict(zip(_COLUMNS, row, strict=True))
    values["breaker_opened"] = bool(values["breaker_opened"])
    return AttemptRecord(**values)


def outcome_of(code: ErrorCode | str | None) -> str:
    """The journal outcome for the error code an attempt ended with (None: `completed`).

    Both breakers' refusals are `circuit_open` (the code keeps which one); everything else is the
    code in lower case.
    """
    if code is None:
        return "completed"
    known = OUTCOMES.get(code)
    if known is not None:
        return known
    return "circuit_open" if code == ErrorCode.SERVER_CIRCUIT_OPEN else code.lower()


#: Every code's outcome (`outcome_of`), computed once: the call path reads it per refusal and failed attempt
#: (ErrorCode members and their plain-str values hash and compare alike, so either finds its entry).
OUTCOMES: dict[str, str] = {code: "circuit_open" if code is ErrorCode.SERVER_CIRCUIT_OPEN else code.lower() for code in ErrorCode}


_call_prefix = uuid.uuid4().hex[:12]
_call_counter = itertools.count(1)


def new_call_id() -> str:
    """A call id unique across processes, at a fraction of `uuid4()`'s cost (a per-process prefix and a counter)."""
    return f"{_call_prefix}-{next(_call_counter)}"


def arguments_digest(arguments: Mapping[str, Any] | None) -> tuple[int, str]:
    """The arguments' canonical JSON size in bytes and a 16-hex-digit SHA-256 prefix (for `record_sizes`).

    Equal arguments hash equal whatever their key order, so a retry that changed its arguments
    shows up as a different hash beside the same operation id.
    """
    blob = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), default=str).encode()
    return len(blob), hashlib.sha256(blob).hexdigest()[:16]


class AttemptObserver(Protocol):
    """What the call gate hands every attempt to. `record()` must be cheap and never block or raise."""

    @property
    def record_sizes(self) -> bool:
        """Whether the gate should fill in argument/result sizes and the argument hash (costs a JSON dump)."""
        ...

    def record(self, record: AttemptRecord) -> bool:
        """Take one attempt; False if it was dropped."""
        ...


class CallTracer(Protocol):
    """What the call gate tells about each logical call as a whole (OpenTelemetry's call span).

    `call_started` runs in the caller's task before the call's first attempt (and before the
    journal reads `TRACE_ID`); whatever it returns is handed back to `call_finished` with the
    exception that ended the call (None: it returned a result). Both must be cheap and never raise.
    """

    def call_started(self, server: str, tool: str, operation_id: str | None) -> Any:
        """The call is about to make its first attempt."""
        ...

    def call_finished(self, handle: Any, error: BaseException | None) -> None:
        """The call is over: answered (`error` None), failed with a `CallError`, or cancelled."""
        ...


class _FanOut:
    """Several observers as one: the gate keeps a single observer reference on its hot path."""

    def __init__(self, observers: Sequence[AttemptObserver]) -> None:
        self._observers = tuple(observers)
        self.record_sizes = any(o.record_sizes for o in self._observers)
        marks = [m for m in (sent_recorder(o) for o in self._observers) if m is not None]
        #: Present only when some observer takes `sent` marks (see `sent_recorder`).
        self.record_sent = None if not marks else marks[0] if len(marks) == 1 else _all_of(marks)

    def record(self, record: AttemptRecord) -> bool:
        kept = True
        for o in self._observers:
            kept = o.record(record) and kept
        return kept


def sent_recorder(observer: AttemptObserver | None) -> Callable[[AttemptRecord], bool] | None:
    """The observer's `record_sent(record)`, if it has one: it takes a mark as an attempt of a tool that
    is not read-only is sent (outcome `SENT`), besides the attempt's row when it ends. Optional, so
    observers that count attempts (metrics, telemetry) never see marks."""
    found = getattr(observer, "record_sent", None)
    return found if callable(found) else None


def _all_of(recorders: Sequence[Callable[[AttemptRecord], bool]]) -> Callable[[AttemptRecord], bool]:
    def record_sent(record: AttemptRecord) -> bool:
        kept = True
        for r in recorders:
            kept = r(record) and kept
        return kept

    return record_sent


def fan_out(observers: Sequence[AttemptObserver]) -> AttemptObserver | None:
    """One observer handing each record to all of `observers` (None for none, the observer itself for one)."""
    if not observers:
        return None
    if len(observers) == 1:
        return observers[0]
    return _FanOut(observers)
