"""The gate's records: what it keeps per server and per tool, and the one record of a call in progress.

`CallGate` builds a `ServerRecord` per configured server and resolves each listed tool into a
`ToolRecord` once per tool list. Every logical call gets a `Call`: the steps of the gate (admit,
attempt, reconcile, retry; see `breakwater.gate._gate`) read and advance it instead of passing a
dozen values to each other. `GateContext` holds what every step shares: the clock, the random
source and the collaborators given to the gate at construction.
"""

from __future__ import annotations

import math
import random
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp.types as types

from breakwater._clock import Clock
from breakwater._wire import STDIN_CLOSED, STDOUT_CLOSED
from breakwater.catalog._validate import ArgumentCheck
from breakwater.config import CallPolicy, RetryPolicy
from breakwater.connect._upstream import Upstream
from breakwater.errors import CallError, ErrorCode, InvalidArgumentsError
from breakwater.gate._breaker import BreakerRegistry, BreakerState, CircuitBreaker, Rejection
from breakwater.gate._classify import Classifier, RetryClass, Verdict, retry_class_for
from breakwater.gate._health import ToolHealth
from breakwater.gate._retry_budget import RetryBudget
from breakwater.gate._tasks import TaskRuntime
from breakwater.gate._turn_budget import TurnBudget
from breakwater.journal import OUTCOMES, SENT, AttemptObserver, AttemptRecord, attempt_record, new_record

__all__ = [
    "OPERATION_ID_ARGUMENT",
    "Call",
    "CallerProgressCallback",
    "GateContext",
    "Journaled",
    "ProgressCallback",
    "ServerRecord",
    "ToolRecord",
    "invalid_operation_id",
    "mark_sent",
    "observe",
    "stopped",
]

#: The argument that also carries the operation id when a tool's input schema declares it.
OPERATION_ID_ARGUMENT = "operationId"

#: The SDK's progress callback shape (what the gate calls, and awaits).
ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None]]
#: What a library caller may pass as `Breakwater.call_tool`'s `progress_callback`: an async function or a plain one
#: (`_breakwater._guarded` awaits what it returns when that is awaitable). mypy refused the plain one, documented.
CallerProgressCallback = Callable[[float, float | None, str | None], Awaitable[None] | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class GateContext:
    """What every step of a call shares: time, randomness and the gate's collaborators."""

    clock: Clock
    rng: random.Random
    classifier: Classifier | None
    #: Where every attempt and refusal is recorded (the call journal), or None.
    observer: AttemptObserver | None
    #: Follows calls a server turns into tasks; None leaves them to the SDK session.
    tasks: TaskRuntime | None
    #: Takes the mark of an attempt of a tool that is not read-only as it is sent (the journal's
    #: `record_sent`, so a crash leaves a trace), or None.
    record_sent: Callable[[AttemptRecord], bool] | None = None


@dataclass(slots=True)
class ToolRecord:
    """Everything about one tool the gate needs per call, resolved once per tool list."""

    name: str
    retry_class: RetryClass
    call: CallPolicy
    retry: RetryPolicy
    #: The timeout set in config (tool or server table); None lets a learned value decide.
    configured_timeout_s: float | None
    operation_id_argument: bool
    breaker: CircuitBreaker
    #: What the gate has seen of this tool's latency (kept across tool lists, see `ServerRecord.health`).
    health: ToolHealth
    #: The definition the server listed: the input schema a call's arguments are checked against.
    definition: types.Tool
    #: `call.hard_s`, read on every attempt (a property of the policy).
    hard_s: float = 0.0
    #: The check of a call's arguments against `definition`, made on the tool's first call (compiling
    #: a schema costs far more than checking against it, and most listed tools are never called).
    check_arguments: ArgumentCheck | None = None

    def __post_init__(self) -> None:
        self.hard_s = self.call.hard_s


class ServerRecord:
    """The gate's per-server state: breaker, retry budget, bulkhead count and the resolved tools."""

    __slots__ = (
        "_breakers",
        "breaker",
        "health",
        "in_flight",
        "lost_connection",
        "name",
        "retry_budget",
        "tools",
        "tools_source",
        "upstream",
    )

    def __init__(self, upstream: Upstream, breakers: BreakerRegistry, clock: Clock) -> None:
        self.name = upstream.spec.name
        self.upstream = upstream
        self._breakers = breakers
        self.breaker = breakers.server(self.name)
        self.retry_budget = RetryBudget(upstream.spec.retry, clock=clock)
        self.in_flight = 0
        self.tools: dict[str, ToolRecord] = {}
        self.tools_source: list[types.Tool] | None = None
        #: Per tool name, outliving re-lists: a tool's latency history is not reset by a tools/list_changed.
        self.health: dict[str, ToolHealth] = {}
        #: The last connection (its client) whose loss the breakers counted: weakly, so a dead connection is not kept.
        self.lost_connection: weakref.ref[Any] | None = None

    def first_to_see_lost(self, client: object) -> bool:
        """Whether an attempt on `client`'s connection is the first to report it lost (and from now on, not)."""
        lost = self.lost_connection
        if lost is not None and lost() is client:
            return False
        self.lost_connection = weakref.ref(client)
        return True

    def tool(self, name: str) -> ToolRecord | None:
        """The resolved tool `name`, or None if the server does not list it."""
        listed = self.upstream.tools
        if listed is not self.tools_source:
            # The upstream replaces its list object on every (re)list, so identity is the cheap change test.
            self.tools = {t.name: self._resolve(t) for t in listed}
            self.tools_source = listed
        return self.tools.get(name)

    def _resolve(self, tool: types.Tool) -> ToolRecord:
        spec = self.upstream.spec
        own = spec.tools.get(tool.name)
        call = own.call if own is not None else spec.call
        retry = own.retry if own is not None else spec.retry
        if own is not None and "timeout_s" in own.explicit:
            configured: float | None = own.call.timeout_s
        elif "timeout_s" in spec.call_explicit:
            configured = spec.call.timeout_s
        else:
            configured = None
        properties = tool.input_schema.get("properties") if isinstance(tool.input_schema, dict) else None
        health = self.health.get(tool.name)
        if health is None:
            health = self.health[tool.name] = ToolHealth()
        return ToolRecord(
            name=tool.name,
            retry_class=retry_class_for(tool.annotations, None if call.retry == "auto" else call.retry),
            call=call,
            retry=retry,
            configured_timeout_s=configured,
            operation_id_argument=isinstance(properties, dict) and OPERATION_ID_ARGUMENT in properties,
            breaker=self._breakers.tool(self.name, tool.name),
            health=health,
            definition=tool,
        )


@dataclass(slots=True)
class Journaled:
    """One logical call as the journal records it; made only when the gate has an observer."""

    call_id: str
    trace_id: str
    client: str | None
    operation_id: str | None
    #: Opt-in (`observer.record_sizes`): the arguments' JSON size and hash, once per call.
    arguments_size: int | None
    arguments_hash: str | None
    #: Attempts sent so far, re-sends included (the number of the latest one).
    sent: int = 0


@dataclass(slots=True)
class Call:
    """One logical call in progress: what it is, and how far it has got.

    Not keyword-only, unlike the gate's other records: one is made per call, and CPython's matching
    of ten keywords cost twice the construction itself (`CallGate._prepare` passes them by position).
    """

    srv: ServerRecord
    info: ToolRecord
    arguments: dict[str, Any]
    #: The operation id of a mutating tool's call (one for every attempt), else None.
    op_id: str | None
    meta: types.RequestParamsMeta | None
    #: The per-attempt timeout (the caller's, else the tool's in force); NaN until the first attempt
    #: is admitted when no turn budget needs it earlier (see `CallGate._prepare`).
    timeout_s: float
    #: Where `timeout_s` came from (`CallGate._resolve_timeout`'s source, or "caller"): a `learned` one is the tool's tail
    #: times the headroom, so cuts at it are slowness even while this process knows no p99 of its own (after a restart).
    timeout_source: str
    budget: TurnBudget | None
    progress_callback: ProgressCallback | None
    #: The journal's view of the call, or None without an observer.
    journal: Journaled | None
    #: Attempts counted against `max_attempts` (an in-progress re-send is not counted).
    attempt: int = 0
    #: The error of the latest attempt, once there was one.
    last: CallError | None = None
    #: The error of the latest attempt that may have run (not `Verdict.not_run`): the answer when no further attempt can
    #: be made. Until there is one, the server's state is: "the call was not sent" is never said of one that may have run.
    ran: CallError | None = None
    #: Set when an answer is first lost: how long reconciliation may wait for the server or the operation.
    window: float | None = None
    #: The breakers' refusal of the first attempt, decided before the arguments were checked (see
    #: `_admit.breaker_refusal`): whether the server's breaker gave it, and the rejection.
    refusal: tuple[bool, Rejection] | None = None
    #: The last progress passed on: a call sent again (its server crashed mid-call) starts its progress over, and the
    #: caller saw 1, 2, 1, 2, 3; the spec's progress MUST increase. An equal value passes (it may carry a new total).
    progress_sent: float = -math.inf
    #: Held while one report is passed on (`pass_progress`); made at the call's first report.
    progress_lock: anyio.Lock | None = None
    #: How long the call waited for its server before the current attempt (a start, a reconnect), 0 if it did not: that
    #: attempt's `timeout_s` is what the wait left of `full_timeout_s` (`_step_one.spend_wait`), and its error says so.
    waited_s: float = 0.0
    #: The per-attempt timeout that wait was taken from: a later attempt starts from it again (NaN until a wait).
    full_timeout_s: float = math.nan

    @property
    def max_attempts(self) -> int:
        """Attempts the tool's retry policy allows."""
        return self.info.retry.max_attempts

    @property
    def needed_s(self) -> float:
        """The least time an attempt may start with (its minimum, or the whole timeout if shorter)."""
        return min(self.info.call.min_attempt_s, self.timeout_s)


def observe(
    ctx: GateContext,
    call: Call,
    code: ErrorCode | None,
    attempt: int,
    duration_s: float = 0.0,
    outcome: str | None = None,
    open_before: tuple[bool, bool] | None = None,
    opened: bool | None = None,
    states: tuple[BreakerState, BreakerState] | None = None,
    result: types.CallToolResult | None = None,
) -> None:
    """Hand one journal row to the observer: an attempt sent, a refusal or a reconciliation.

    Every parameter may be passed by position: the call path does (keywords are matched by name, per row).

    An attempt sent says whether its reports opened a breaker: `opened` (in-process breakers tell),
    or `open_before`, which breakers were open before them (a shared store's). `states` are the
    server's and the tool's breaker states when the caller already knows them (a refusal does).
    """
    observer, journaled = ctx.observer, call.journal
    assert observer is not None and journaled is not None
    srv, info = call.srv, call.info
    server_state, tool_state = states if states is not None else (srv.breaker.state, info.breaker.state)
    if opened is None:
        opened = open_before is not None and (
            (server_state is BreakerState.OPEN and not open_before[0]) or (tool_state is BreakerState.OPEN and not open_before[1])
        )
    result_size = None
    # The sizes are recorded when the call's arguments were measured (`record_sizes`, read once per call).
    if result is not None and journaled.arguments_size is not None:
        result_size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode())
    # `attempt_record(...)`'s body, inline: its call (18 arguments) cost ~900 instructions a row.
    # tests/gate/test_gate_fake_clock.py reads every field of the rows this builds.
    record = new_record(AttemptRecord)
    record.server = srv.name
    record.tool = info.name
    record.call_id = journaled.call_id
    record.attempt = attempt
    # The attempt's start on the wall clock, from its duration on the monotonic one.
    record.started_at = ctx.clock.time() - duration_s
    record.duration_s = duration_s
    record.outcome = outcome or ("completed" if code is None else OUTCOMES[code])
    # `_value_`, not `.value`: a plain attribute read where `.value` is a descriptor call (3x the cost).
    record.error_code = None if code is None else code._value_
    record.retries = attempt - 1
    record.trace_id = journaled.trace_id
    record.operation_id = journaled.operation_id
    record.server_breaker = server_state._value_
    record.tool_breaker = tool_state._value_
    record.breaker_opened = opened
    record.client = journaled.client
    record.arguments_size = journaled.arguments_size
    record.result_size = result_size
    record.arguments_hash = journaled.arguments_hash
    observer.record(record)


def mark_sent(ctx: GateContext, call: Call) -> None:
    """Queue the mark of the attempt about to be sent, for a tool that is not read-only (see `journal._in_flight`)."""
    record_sent, journaled = ctx.record_sent, call.journal
    if record_sent is None or journaled is None or call.info.retry_class is RetryClass.SAFE:
        return
    record_sent(
        attempt_record(
            call.srv.name,
            call.info.name,
            journaled.call_id,
            journaled.sent + 1,
            ctx.clock.time(),
            0.0,
            SENT,
            None,  # error_code
            journaled.sent,  # retries
            journaled.trace_id,
            journaled.operation_id,
            None,  # server_breaker
            None,  # tool_breaker
            False,  # breaker_opened
            journaled.client,
            None,  # arguments_size
            None,  # result_size
            None,  # arguments_hash
        )
    )


def invalid_operation_id(problem: str, server: str | None, tool: str) -> InvalidArgumentsError:
    """A caller's operation id breakwater cannot keep (`_wire.operation_id_problem`), refused with nothing run: replaced
    by a new one, the caller's retries ran again, each under its own."""
    said = f"Invalid operation id: {problem}; nothing was run. Send a valid one, or none."
    return InvalidArgumentsError(said, server=server, tool=tool, detail={"reason": "invalid_operation_id"})


def stopped(err: CallError, why: str) -> CallError:
    """`err`, noting why no further attempt was made."""
    err.detail.setdefault("retry_stopped", why)
    return err


async def pass_progress(call: Call, progress: float, total: float | None, message: str | None) -> None:
    """Pass one progress report to the call's caller, in order and never going back (`Call.progress_sent`).

    One at a time: the SDK delivers each report of an HTTP upstream in a task of its own, and two sends under way at
    once could reach the caller swapped (the conformance suite's "progress values should be increasing", on a loaded
    host). NaN and Infinity are no progress (not JSON)."""
    callback = call.progress_callback
    if callback is None or not math.isfinite(progress):
        return
    lock = call.progress_lock
    if lock is None:
        lock = call.progress_lock = anyio.Lock()
    async with lock:
        if progress < call.progress_sent:
            return
        call.progress_sent = progress
        await callback(progress, total if total is None or math.isfinite(total) else None, message)


def ended_by_exit(said: Verdict | CallError) -> bool:
    """Whether an attempt ended because its stdio server's process went away while it ran."""
    reason = said.reason if isinstance(said, Verdict) else said.detail.get("reason")
    return isinstance(reason, str) and (STDOUT_CLOSED in reason or STDIN_CLOSED in reason)


def seconds_text(value: float) -> str:
    """`1.5 s`, or `ever` for an unbounded wait."""
    return f"{value:.3g} s" if math.isfinite(value) else "ever"
