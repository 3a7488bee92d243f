"""The call gate: every tool call passes through one place that bounds it, isolates it and explains it.

One logical call, in order:

1. the server must be ready (else SERVER_CONNECTING / SERVER_UNAVAILABLE), and have the tool (else
   UNKNOWN_TOOL — only asked of a ready server, whose list is known);
2. per attempt: the turn budget must cover at least a minimal attempt (BUDGET_EXHAUSTED), the
   server breaker and the tool breaker must admit it (SERVER_CIRCUIT_OPEN, CIRCUIT_OPEN), and the
   server's bulkhead must have a free slot (OVERLOADED). These refusals send nothing and teach
   the breakers nothing: local overload protection never feeds back into upstream health;
3. the attempt runs inside one deadline scope on the injected clock: `timeout_s`, pushed out by
   each progress notification (`idle_timeout_s`) but never past the hard cap `max_s`, and never
   past the turn budget. When the scope fires, the SDK sees its awaiting scope cancelled and sends
   `notifications/cancelled` upstream (or, on 2026-07-28 HTTP, aborts the POST), so the server stops working and the
   slot is free again;
4. `classify()` decides what the breakers learn, the code the model sees, and whether another
   attempt is allowed; retries wait a full-jitter backoff (a server's retry-after hint is a floor),
   need a token from the server's retry budget and must fit the turn budget;
5. a mutating tool (`idempotent` or `never`) gets one operation id per logical call, sent on every
   attempt in `_meta["io.breakwater/operationId"]` (and as the `operationId` argument when its
   input schema has one), so a server can deduplicate the retries, and named in every error
   envelope, so the agent (or a person) can check what became of it;
6. reconciliation: after a timeout or cut stream on an `idempotent` tool (the call may have run),
   the gate waits for the server to be back (within the call's window), and if the server offers
   `get_operation` (as `breakwater.idempotency.add_operation_tool` registers it) asks it first:
   `completed` → the stored result, `failed` → the stored error, `unknown` → OUTCOME_UNKNOWN,
   `pending`/`executing` → wait and ask again, `not_found` (or no answer) → re-issue with the same
   id. A server's OPERATION_IN_PROGRESS reply is waited on the same way, never counted as a failure;
   OPERATION_MISMATCH and OPERATION_OUTCOME_UNKNOWN are final. A `never` tool is not retried: a
   cut call is OUTCOME_UNKNOWN with its operation id. The call's window is the turn budget, else
   the tool's hard cap (`max_s`) from the first lost answer.

The caller's own cancellation is never retried and never turned into a result: it is re-raised,
so a cancelled caller stays cancelled (the SDK has already told the server). A cancellation that
did not come from the caller is reported as CANCELLED, also without a retry.

No task is spawned per call and nothing touches disk or the network besides the call itself: the
overhead is a few dictionary lookups, two breaker admissions and one cancel scope. Reconciliation
costs nothing until an answer is lost.

With an `observer` (the call journal), every attempt sent, every local refusal above and every call
settled by reconciliation is handed to it as one `AttemptRecord` (`observer.record()` only queues
it); without one, the journal costs one `is not None` test per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import anyio
import mcp.types as types
from mcp import MCPError

from breakwater._clock import Clock, DeadlineScope
from breakwater._wire import CONNECTION_CLOSED as _CONNECTION_CLOSED
from breakwater._wire import OPERATION_ID_META_KEY
from breakwater.config import CallPolicy, RetryPolicy
from breakwater.config._redact import redact_error
from breakwater.connect._http_cut import cut_info
from breakwater.connect._upstream import Upstream
from breakwater.errors import (
    CODE_TO_ERROR,
    BudgetExhaustedError,
    CallCancelledError,
    CallError,
    CallTimeoutError,
    CircuitOpenError,
    ErrorCode,
    OutcomeUnknownError,
    OverloadedError,
    ServerCircuitOpenError,
    ServerConnectingError,
    ServerUnavailableError,
    ToolError,
    UnknownToolError,
    UpstreamError,
)
from breakwater.gate._breaker import BreakerRegistry, BreakerSnapshot, BreakerState, CircuitBreaker, Outcome, Permit, Rejection
from breakwater.gate._classify import IN_PROGRESS_REASON, Classifier, RetryClass, Verdict, classify, retry_class_for
from breakwater.gate._envelope import error_result
from breakwater.gate._retry_budget import RetryBudget, RetryBudgetSnapshot
from breakwater.gate._tasks import TASK_CALL, TaskRuntime
from breakwater.gate._turn_budget import TurnBudget, current_budget
from breakwater.journal import (
    DOWNSTREAM_CLIENT,
    RECONCILED,
    TRACE_ID,
    AttemptObserver,
    AttemptRecord,
    CallTracer,
    arguments_digest,
    new_call_id,
    outcome_of,
)
from breakwater.status import ServerState, iso

__all__ = [
    "GET_OPERATION_TOOL",
    "OPERATION_ID_ARGUMENT",
    "OPERATION_ID_META_KEY",
    "CallGate",
    "LearnedTimeout",
    "ProgressCallback",
]

#: Where the operation id rides in `params._meta` (a vendor-prefixed key: the spec has no idempotency field).
#: The argument that also carries it when a tool's input schema declares it.
OPERATION_ID_ARGUMENT = "operationId"
#: A tool by this name on the same server reports an operation's record (`add_operation_tool`).
GET_OPERATION_TOOL = "get_operation"

#: `(server, tool) -> seconds or None`: a timeout learned from observed latencies (None: nothing learned).
LearnedTimeout = Callable[[str, str], float | None]
#: The SDK's progress callback shape.
ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None]]

# Failures that say something about the server as a whole (a tool's own error says nothing about it).
_SERVER_FAILURE_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.UPSTREAM_ERROR, ErrorCode.OUTCOME_UNKNOWN})
# A probe's lease must outlive its call, or a second probe would be let in while the first still runs.
_PROBE_LEASE_MARGIN_S = 5.0
_DEFAULT_CONNECT_ESTIMATE_S = 2.0
_MAX_LISTED_TOOLS = 50
_MAX_UPSTREAM_TEXT = 500
# Longest wait between two questions about a running operation when the server gives no hint:
# the owner may finish any moment (the idempotency module caps its own hint at 2 s too).
_MAX_POLL_S = 2.0
_RUNNING_STATES = frozenset({"pending", "executing"})


def _nothing_learned(_server: str, _tool: str) -> float | None:
    return None


@dataclass(slots=True)
class _Tool:
    """Everything about one tool the gate needs per call, resolved once per tool list."""

    name: str
    retry_class: RetryClass
    call: CallPolicy
    retry: RetryPolicy
    #: The timeout set in config (tool or server table); None lets a learned value decide.
    configured_timeout_s: float | None
    operation_id_argument: bool
    breaker: CircuitBreaker


@dataclass(slots=True)
class _Journaled:
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


class _Server:
    """The gate's per-server state: breaker, retry budget, bulkhead count and the resolved tools."""

    __slots__ = ("breaker", "in_flight", "name", "retry_budget", "tools", "tools_source", "upstream")

    def __init__(self, upstream: Upstream, breakers: BreakerRegistry, clock: Clock) -> None:
        self.name = upstream.spec.name
        self.upstream = upstream
        self.breaker = breakers.server(self.name)
        self.retry_budget = RetryBudget(upstream.spec.retry, clock=clock)
        self.in_flight = 0
        self.tools: dict[str, _Tool] = {}
        self.tools_source: list[types.Tool] | None = None


class AttemptClock:
    """One attempt's deadline, as what happens during the attempt may move it.

    Progress from the server pushes it out by the idle timeout (`nudge`). While the caller itself is
    being asked something on the upstream's behalf (a relayed elicitation or sampling request, often
    answered by a person), the attempt's own timeout stops running (`waiting_on_caller`): only the
    hard cap (`max_s`, or the turn budget) bounds the wait, and the timeout restarts from the answer.
    """

    __slots__ = ("_clock", "_scope", "_waiting", "finished", "hard", "idle_s", "on_task", "task_at")

    def __init__(self, clock: Clock, scope: DeadlineScope, *, hard: float, idle_s: float) -> None:
        self._clock = clock
        self._scope = scope
        self.hard = hard
        self.idle_s = idle_s
        self.finished = False
        self._waiting = 0
        #: When the server answered with a task handle (monotonic), if it did.
        self.task_at: float | None = None
        #: Called once if the call becomes a task (the gate gives back the attempt's bulkhead slot).
        self.on_task: Callable[[], None] | None = None

    def became_task(self) -> None:
        """The call is now a task (breakwater.gate._tasks): its polling is bounded by the budget or `task_max_s`."""
        self.task_at = self._clock.monotonic()
        self._scope.deadline = math.inf
        if self.on_task is not None:
            self.on_task()

    def nudge(self) -> None:
        """The server showed signs of life: give it `idle_s` more, up to the hard cap."""
        if not self.finished:
            pushed = min(self.hard, self._clock.monotonic() + self.idle_s)
            if pushed > self._scope.deadline:
                self._scope.deadline = pushed

    @contextlib.contextmanager
    def waiting_on_caller(self) -> Iterator[None]:
        """While the body runs, only the hard cap bounds the attempt."""
        self._waiting += 1
        if not self.finished:
            self._scope.deadline = max(self._scope.deadline, self.hard)
        try:
            yield
        finally:
            self._waiting -= 1
            if not self._waiting and not self.finished and self.task_at is None:
                self._scope.deadline = min(self.hard, self._clock.monotonic() + self.idle_s)


#: Set by a caller that may be asked something mid-call on an upstream's behalf (the gateway's
#: relay): handed each attempt's `AttemptClock` as the attempt starts, and None as it ends.
ATTEMPT_WATCHER: contextvars.ContextVar[Callable[[AttemptClock | None], None] | None] = contextvars.ContextVar(
    "breakwater_attempt_watcher", default=None
)


class CallGate:
    """The orchestration of every tool call: see the module docstring."""

    def __init__(
        self,
        upstreams: Mapping[str, Upstream],
        *,
        clock: Clock,
        rng: random.Random,
        learned_timeout: LearnedTimeout | None = None,
        classifier: Classifier | None = None,
        observer: AttemptObserver | None = None,
    ) -> None:
        self._clock = clock
        self._rng = rng
        self._learned = learned_timeout or _nothing_learned
        self._classifier = classifier
        #: Where every attempt and refusal is recorded (the call journal), or None.
        self._observer = observer
        #: Told when each logical call starts and ends (OpenTelemetry's call span; set by `Breakwater`), or None.
        self.tracer: CallTracer | None = None
        #: Follows calls a server turns into tasks (set by `Breakwater`); None leaves them to the SDK session.
        self.tasks: TaskRuntime | None = None
        specs = {name: u.spec for name, u in upstreams.items()}
        self.breakers = BreakerRegistry(clock=clock, rng=rng, policy_for=lambda server, _tool: specs[server].breaker)
        self._servers = {name: _Server(u, self.breakers, clock) for name, u in upstreams.items()}

    # ---- public -------------------------------------------------------------------------------

    async def call(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        progress_callback: ProgressCallback | None = None,
        operation_id: str | None = None,
    ) -> types.CallToolResult:
        """One logical call; every failure comes back as an `isError` envelope."""
        try:
            return await self.call_or_raise(
                server, tool, arguments, timeout=timeout, progress_callback=progress_callback, operation_id=operation_id
            )
        except CallError as err:
            return error_result(err)

    async def call_or_raise(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        progress_callback: ProgressCallback | None = None,
        operation_id: str | None = None,
    ) -> types.CallToolResult:
        """One logical call; every failure is raised as its `CallError` subclass.

        `operation_id` is the caller's own id for this logical call (a downstream agent re-sending a
        call passes the same one); without it the gate makes one.
        """
        srv = self._servers.get(server)
        if srv is None:
            raise UnknownToolError(
                f"There is no server named '{server}'.",
                server=server,
                tool=tool,
                detail={"reason": "unknown_server", "servers": sorted(self._servers)[:_MAX_LISTED_TOOLS]},
            )
        upstream = srv.upstream
        if upstream.state is not ServerState.READY or upstream.client is None:
            raise self._refused_early(srv, tool, self._not_ready(srv, tool))
        info = self._tool(srv, tool)
        if info is None:
            raise self._refused_early(
                srv, tool, UnknownToolError(server=server, tool=tool, detail={"tools": sorted(srv.tools)[:_MAX_LISTED_TOOLS]})
            )
        return await self._run(srv, info, dict(arguments or {}), timeout, progress_callback, operation_id)

    def _refused_early(self, srv: _Server, tool: str, err: CallError) -> CallError:
        """A call refused before it reached a known tool (its server is not ready, or has no such tool): journaled.

        These are the answers an on-call engineer most needs to count ("how long was the agent told
        the ERP server is connecting?"), so they get a row like any other refusal.
        """
        if self._observer is not None:
            call_id = new_call_id()
            self._observer.record(
                AttemptRecord(
                    server=srv.name,
                    tool=tool,
                    call_id=call_id,
                    attempt=1,
                    started_at=self._clock.time(),
                    duration_s=0.0,
                    outcome=outcome_of(err.code),
                    error_code=err.code.value,
                    trace_id=TRACE_ID.get() or call_id,
                    server_breaker=srv.breaker.state.value,
                    client=DOWNSTREAM_CLIENT.get(),
                )
            )
        return err

    def breaker_snapshots(self) -> list[BreakerSnapshot]:
        """Every breaker created so far (servers and tools), by name."""
        return self.breakers.snapshots()

    def retry_budget_snapshots(self) -> dict[str, RetryBudgetSnapshot]:
        """Each server's retry budget."""
        return {name: srv.retry_budget.snapshot() for name, srv in self._servers.items()}

    def in_flight(self) -> dict[str, int]:
        """Calls in flight per server (what the bulkhead counts)."""
        return {name: srv.in_flight for name, srv in self._servers.items()}

    def resolved_timeout(self, server: str, tool: str) -> float | None:
        """The per-attempt timeout a call of `tool` would get now (None if the tool is not known yet)."""
        srv = self._servers[server]
        info = self._tool(srv, tool)
        return None if info is None else self._timeout(srv, info)

    def timeout_in_force(self, server: str, tool: str) -> tuple[float, str] | None:
        """`resolved_timeout` and its source: `configured`, `learned` or `default` (None if the tool is not known yet)."""
        srv = self._servers[server]
        info = self._tool(srv, tool)
        if info is None:
            return None
        if info.configured_timeout_s is None:
            learned = self._learned(srv.name, info.name)
            if learned is not None and learned > 0:
                return learned, "learned"
            return info.call.timeout_s, "default"
        return info.configured_timeout_s, "configured"

    # ---- resolution ---------------------------------------------------------------------------

    def _tool(self, srv: _Server, name: str) -> _Tool | None:
        listed = srv.upstream.tools
        if listed is not srv.tools_source:
            # The upstream replaces its list object on every (re)list, so identity is the cheap change test.
            srv.tools = {t.name: self._resolve(srv, t) for t in listed}
            srv.tools_source = listed
        return srv.tools.get(name)

    def _resolve(self, srv: _Server, tool: types.Tool) -> _Tool:
        spec = srv.upstream.spec
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
        return _Tool(
            name=tool.name,
            retry_class=retry_class_for(tool.annotations, None if call.retry == "auto" else call.retry),
            call=call,
            retry=retry,
            configured_timeout_s=configured,
            operation_id_argument=isinstance(properties, dict) and OPERATION_ID_ARGUMENT in properties,
            breaker=self.breakers.tool(srv.name, tool.name),
        )

    def _timeout(self, srv: _Server, info: _Tool) -> float:
        # Per-tool config, per-server config, learned value, default: the most specific word wins.
        if info.configured_timeout_s is not None:
            return info.configured_timeout_s
        learned = self._learned(srv.name, info.name)
        if learned is not None and learned > 0:
            return learned
        return info.call.timeout_s

    def _not_ready(self, srv: _Server, tool: str) -> CallError:
        snap = srv.upstream.snapshot()
        retry_after = None if snap.next_retry_at is None else max(0.0, snap.next_retry_at - self._clock.time())
        common: dict[str, Any] = {"server": srv.name, "tool": tool}
        if snap.state is ServerState.DISABLED:
            return ServerUnavailableError(
                "The server is disabled in the configuration; the call was not sent.",
                retryable=False,
                detail={"state": snap.state.value, "reason": "disabled"},
                **common,
            )
        if snap.state is ServerState.FAILED:
            detail: dict[str, Any] = {"state": snap.state.value, "next_retry_at": iso(snap.next_retry_at)}
            if snap.error is not None:
                detail["reason"] = snap.error.code.value
                detail["reason_message"] = snap.error.message
            message = "The server is not available right now; the call was not sent."
            if snap.error is not None:
                message = f"The server is not available ({snap.error.message}); the call was not sent."
            return ServerUnavailableError(message, retry_after_s=retry_after, detail=detail, **common)
        # pending, connecting, retrying (or ready without a client for an instant): it is on its way.
        estimate = retry_after
        if estimate is None:
            estimate = snap.connect_ms / 1000 if snap.connect_ms else _DEFAULT_CONNECT_ESTIMATE_S
        detail = {"state": snap.state.value, "connect_attempt": snap.attempt}
        if snap.phase:
            detail["phase"] = snap.phase
        if snap.error is not None:
            detail["last_error"] = snap.error.message
        return ServerConnectingError(retry_after_s=estimate, detail=detail, **common)

    # ---- the attempt loop ---------------------------------------------------------------------

    async def _run(
        self,
        srv: _Server,
        info: _Tool,
        arguments: dict[str, Any],
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        operation_id: str | None = None,
    ) -> types.CallToolResult:
        op_id: str | None = None
        meta: types.RequestParamsMeta | None = None
        if info.retry_class is not RetryClass.SAFE:
            given = operation_id or arguments.get(OPERATION_ID_ARGUMENT)
            # A caller's own idempotency key is the operation; otherwise one id for every attempt.
            op_id = given if isinstance(given, str) and given else uuid.uuid4().hex
            # An open TypedDict (extra_items=Any): vendor keys are allowed, mypy cannot see that.
            meta = cast(types.RequestParamsMeta, {OPERATION_ID_META_KEY: op_id})
            if info.operation_id_argument:
                arguments.setdefault(OPERATION_ID_ARGUMENT, op_id)
        call: _Journaled | None = None
        tracer = self.tracer
        # First, so the trace it opens is the one the journal's rows carry (TRACE_ID).
        handle = None if tracer is None else tracer.call_started(srv.name, info.name, op_id)
        if self._observer is not None:
            call_id = new_call_id()
            size, digest = arguments_digest(arguments) if self._observer.record_sizes else (None, None)
            call = _Journaled(call_id, TRACE_ID.get() or call_id, DOWNSTREAM_CLIENT.get(), op_id, size, digest)
        try:
            result = await self._attempts(srv, info, arguments, op_id, meta, timeout, progress_callback, call)
        except BaseException as err:
            # Every envelope names the operation, whichever refusal or failure ended it.
            if isinstance(err, CallError) and err.operation_id is None:
                err.operation_id = op_id
            if tracer is not None:
                tracer.call_finished(handle, err)
            raise
        if tracer is not None:
            tracer.call_finished(handle, None)
        return result

    async def _attempts(
        self,
        srv: _Server,
        info: _Tool,
        arguments: dict[str, Any],
        op_id: str | None,
        meta: types.RequestParamsMeta | None,
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        call: _Journaled | None,
    ) -> types.CallToolResult:
        timeout_s = timeout if timeout is not None else self._timeout(srv, info)
        policy, retry = info.call, info.retry
        max_attempts = retry.max_attempts
        reconciles = info.retry_class is RetryClass.IDEMPOTENT and op_id is not None
        budget = current_budget()
        needed = min(policy.min_attempt_s, timeout_s)
        attempt = 0
        last: CallError | None = None
        # Set when an answer is first lost: how long reconciliation may wait for the server or the operation.
        window: float | None = None
        while True:
            if budget is not None and not budget.can_start(needed):
                if last is not None:
                    raise _stopped(last, "the turn budget cannot cover another attempt")
                refusal: CallError = BudgetExhaustedError(
                    server=srv.name,
                    tool=info.name,
                    max_attempts=max_attempts,
                    operation_id=op_id,
                    detail={"budget_left_s": round(budget.remaining(), 3), "needed_s": needed},
                )
                if call is not None:
                    self._observe(call, srv, info, refusal.code, attempt=call.sent + 1)
                raise refusal
            if last is not None and window is not None and not await self._wait_ready(srv, window):
                # The answer was lost with the connection; re-sending needs the server back first.
                raise _stopped(last, "the server did not come back within the call's window")
            server_permit = srv.breaker.acquire(lease_s=policy.hard_s + _PROBE_LEASE_MARGIN_S)
            if isinstance(server_permit, Rejection):
                refusal = ServerCircuitOpenError(
                    server=srv.name,
                    tool=info.name,
                    retry_after_s=server_permit.retry_after_s,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    operation_id=op_id,
                    detail={"breaker": server_permit.state.value, "reason": server_permit.reason},
                )
                if call is not None:
                    self._observe(call, srv, info, refusal.code, attempt=call.sent + 1)
                raise refusal
            tool_permit = info.breaker.acquire(slow_threshold_s=policy.slow_call_s, lease_s=policy.hard_s + _PROBE_LEASE_MARGIN_S)
            if isinstance(tool_permit, Rejection):
                server_permit.release()
                refusal = CircuitOpenError(
                    server=srv.name,
                    tool=info.name,
                    retry_after_s=tool_permit.retry_after_s,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    operation_id=op_id,
                    detail={"breaker": tool_permit.state.value, "reason": tool_permit.reason},
                )
                if call is not None:
                    self._observe(call, srv, info, refusal.code, attempt=call.sent + 1)
                raise refusal
            if srv.in_flight >= srv.upstream.spec.call.max_in_flight:
                server_permit.release()
                tool_permit.release()
                refusal = OverloadedError(
                    server=srv.name,
                    tool=info.name,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    operation_id=op_id,
                    detail={"in_flight": srv.in_flight, "max_in_flight": srv.upstream.spec.call.max_in_flight},
                )
                if call is not None:
                    self._observe(call, srv, info, refusal.code, attempt=call.sent + 1)
                raise refusal
            attempt += 1
            try:
                outcome = await self._attempt(
                    srv, info, arguments, meta, timeout_s, budget, progress_callback, server_permit, tool_permit, call
                )
            except CallError as refused:
                # The server went away between attempts, so nothing more was sent. After a lost answer
                # that answer is the truth to report (the call may have run); "connecting" would
                # invite a fresh call, which is how duplicates are made.
                if last is not None:
                    raise _stopped(last, "the server was not ready for another attempt") from refused
                raise
            if isinstance(outcome, types.CallToolResult):
                srv.retry_budget.record_success(was_retry=attempt > 1)
                return outcome
            verdict, err = outcome
            err.attempt, err.max_attempts, err.operation_id = attempt, max_attempts, op_id
            if verdict.outcome is Outcome.SUCCESS:
                srv.retry_budget.record_success(was_retry=attempt > 1)
            in_progress = verdict.reason == IN_PROGRESS_REASON
            if verdict.outcome_unknown and info.retry_class is RetryClass.NEVER and self._offers_get_operation(srv):
                err.detail.setdefault("check_with", f"{GET_OPERATION_TOOL}(operation_id) on server '{srv.name}'")
            if reconciles and verdict.retryable and (verdict.outcome_unknown or in_progress):
                assert op_id is not None
                if window is None:
                    window = self._clock.monotonic() + policy.hard_s
                    if budget is not None:
                        window = min(window, budget.deadline)
                if self._offers_get_operation(srv):
                    asked = self._clock.monotonic()
                    settled = await self._reconcile(srv, info, op_id, err, timeout_s, window, verdict.retry_after_s)
                    if settled is not None:
                        srv.retry_budget.record_success(was_retry=True)
                        if call is not None:
                            spent = self._clock.monotonic() - asked
                            self._observe(call, srv, info, None, attempt=call.sent, duration_s=spent, outcome=RECONCILED)
                        return settled
                    # Not found (or the server could not say): re-issue with the same id, which the
                    # server deduplicates, as an ordinary retry (attempts, backoff, retry budget).
                elif in_progress:
                    # No way to ask: send the same id again after the server's hint, without spending
                    # an attempt or a retry token on an operation that is merely still running.
                    attempt -= 1
                    delay = retry.delay(0, self._rng, verdict.retry_after_s)
                    if delay is None or self._clock.monotonic() + delay + needed > window:
                        raise _stopped(err, "the operation was still running when the call's window closed")
                    last = err
                    await self._clock.sleep(delay)
                    continue
            if not verdict.retryable or attempt >= max_attempts:
                raise err
            delay = retry.delay(attempt - 1, self._rng, verdict.retry_after_s)
            if delay is None:
                raise _stopped(err, "the server asked for a longer wait than breakwater retries after")
            if budget is not None and not budget.can_start(delay + needed):
                raise _stopped(err, "the turn budget cannot cover another attempt")
            if not srv.retry_budget.try_acquire():
                raise _stopped(err, "the server's retry budget is spent (too many recent failures)")
            last = err
            await self._clock.sleep(delay)

    # ---- reconciliation -----------------------------------------------------------------------

    def _offers_get_operation(self, srv: _Server) -> bool:
        return self._tool(srv, GET_OPERATION_TOOL) is not None

    async def _wait_ready(self, srv: _Server, deadline: float) -> bool:
        """Wait (until `deadline`) for the server to be ready again; False if it is not."""
        upstream = srv.upstream
        if upstream.state is ServerState.READY and upstream.client is not None:
            return True
        if upstream.state in (ServerState.FAILED, ServerState.DISABLED):
            # Given up on for now: its background retry is far longer than a call may wait.
            return False
        with self._clock.deadline_scope(deadline):
            await upstream.ready_event.wait()
        return upstream.state is ServerState.READY and upstream.client is not None

    async def _reconcile(
        self,
        srv: _Server,
        info: _Tool,
        op_id: str,
        err: CallError,
        timeout_s: float,
        window: float,
        hint: float | None,
    ) -> types.CallToolResult | None:
        """Ask the server what became of `op_id` until it knows or the window closes.

        Returns the stored result of a completed operation, or None when the operation is not
        there (it never arrived, or was released before it started) and the same id should be
        sent again. Raises the stored error of a failed one, OUTCOME_UNKNOWN for an unknown one,
        and `err` (noting why) when the window closes first.
        """
        polls = 0
        clock = self._clock
        while True:
            # An operation reported running is waited on; before the first question, the hint of
            # an OPERATION_IN_PROGRESS reply (if that is what brought us here) is honoured too.
            if polls or hint is not None:
                delay = min(info.retry.backoff.delay(polls, self._rng), _MAX_POLL_S)
                if hint is not None:
                    delay = max(delay, hint)
                if clock.monotonic() + delay >= window:
                    raise _stopped(err, "the operation was still running when the call's window closed")
                await clock.sleep(delay)
            if not await self._wait_ready(srv, window):
                raise _stopped(err, "the server did not come back within the call's window")
            status = await self._ask(srv, op_id, min(timeout_s, window - clock.monotonic()))
            if status is None:
                return None
            state = status.get("state")
            err.detail["operation_state"] = state
            if state == "completed":
                try:
                    return types.CallToolResult.model_validate(status.get("result"))
                except ValueError:
                    # A record we cannot read back: the same id replays it exactly, so ask for that.
                    return None
            if state == "failed":
                raise self._stored_failure(srv, info, op_id, status)
            if state == "unknown":
                raise OutcomeUnknownError(
                    "The server recorded that this operation stopped mid-run (its process died or the call was "
                    "cancelled), so whether it took effect is unknown; it was not run again.",
                    server=srv.name,
                    tool=info.name,
                    attempt=err.attempt,
                    max_attempts=err.max_attempts,
                    operation_id=op_id,
                    detail={"operation_state": "unknown", "reason": status.get("reason") or "unknown"},
                )
            if state not in _RUNNING_STATES:
                return None  # not_found: nothing ran under this id
            polls += 1
            hint = _retry_after_hint(status)

    async def _ask(self, srv: _Server, op_id: str, timeout_s: float) -> dict[str, Any] | None:
        """`get_operation(op_id)`'s structured answer, or None if the server could not say in time."""
        client = srv.upstream.client
        if client is None or timeout_s <= 0:
            return None
        srv.in_flight += 1
        result: types.CallToolResult | None = None
        try:
            # The deadline scope swallows its own expiry: `result` then stays None.
            with self._clock.deadline_scope(self._clock.monotonic() + timeout_s):
                result = await client.call_tool(GET_OPERATION_TOOL, {"operation_id": op_id})
        except (Exception, BaseExceptionGroup):
            # A lost or refused question proves nothing; the caller re-sends the same id instead,
            # which the server deduplicates anyway. Breakers learn from real attempts only.
            return None
        else:
            if result is None:
                return None
            data = result.structured_content
            if result.is_error or not isinstance(data, dict) or not isinstance(data.get("state"), str):
                return None
            return data
        finally:
            srv.in_flight -= 1

    def _stored_failure(self, srv: _Server, info: _Tool, op_id: str, status: Mapping[str, Any]) -> CallError:
        """The error a failed operation recorded, as the call's answer (never retried: it would fail alike)."""
        error = status.get("error") if isinstance(status.get("error"), dict) else {}
        assert isinstance(error, dict)
        kind = error.get("kind")
        message = error.get("message")
        if kind == "crash" or not isinstance(message, str) or not message:
            # MCPServer shows only this for a crash; the exception text stays in the server's log.
            message = f"Error executing tool {info.name}"
        return ToolError(
            server=srv.name,
            tool=info.name,
            content=[types.TextContent(type="text", text=message)],
            retryable=False,
            operation_id=op_id,
            detail={"operation_state": "failed", "error_kind": kind},
        )

    async def _attempt(
        self,
        srv: _Server,
        info: _Tool,
        arguments: dict[str, Any],
        meta: types.RequestParamsMeta | None,
        timeout_s: float,
        budget: TurnBudget | None,
        progress_callback: ProgressCallback | None,
        server_permit: Permit,
        tool_permit: Permit,
        call: _Journaled | None = None,
    ) -> types.CallToolResult | tuple[Verdict, CallError]:
        """One upstream attempt; returns the result to pass on, or the verdict and the error it stands for."""
        client = srv.upstream.client
        if client is None or srv.upstream.state is not ServerState.READY:
            # Lost between attempts: nothing was sent, so nothing is learned.
            server_permit.release()
            tool_permit.release()
            raise self._not_ready(srv, info.name)
        clock = self._clock
        policy = info.call
        started = clock.monotonic()
        hard = started + max(policy.hard_s, timeout_s)
        deadline = started + timeout_s
        by_budget = False
        if budget is not None:
            hard = min(hard, budget.deadline)
            if budget.deadline < deadline:
                deadline, by_budget = budget.deadline, True
        # Without its own idle timeout a tool's gap between progress notifications is its timeout.
        idle_s = policy.idle_timeout_s if policy.idle_timeout_s is not None else timeout_s
        scope = clock.deadline_scope(deadline)
        attempt_clock = AttemptClock(clock, scope, hard=hard, idle_s=idle_s)
        watcher = ATTEMPT_WATCHER.get()
        if watcher is not None:
            watcher(attempt_clock)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            attempt_clock.nudge()
            if progress_callback is not None:
                await progress_callback(progress, total, message)

        srv.in_flight += 1
        holding = True

        def release_slot() -> None:
            nonlocal holding
            if holding:
                holding = False
                srv.in_flight -= 1

        # A task being polled holds no request open upstream: its bulkhead slot goes back at once.
        attempt_clock.on_task = release_slot
        result: types.CallToolResult | None = None
        failure: BaseException | None = None
        # If the server answers with a task handle, the tasks resolver takes the call from here (see _tasks).
        tasks = self.tasks
        task_token = None
        if tasks is not None:
            task_call = tasks.attempt(
                srv.upstream, info.name, meta, info.retry_class, timeout_s, policy.task_max_s, attempt_clock
            )
            task_token = TASK_CALL.set(task_call)
        try:
            with scope:
                result = await client.call_tool(info.name, arguments, progress_callback=on_progress, meta=meta)
        except anyio.get_cancelled_exc_class():
            task = asyncio.current_task()
            if task is not None and task.cancelling() > 0:
                # The caller cancelled: the SDK already told the server; stay cancelled, learn nothing.
                server_permit.release()
                tool_permit.release()
                if call is not None:
                    call.sent += 1
                    self._observe(call, srv, info, ErrorCode.CANCELLED, attempt=call.sent, duration_s=clock.monotonic() - started)
                raise
            failure = CallCancelledError("The call was cancelled from outside breakwater before it finished.")
        except (Exception, BaseExceptionGroup) as exc:
            failure = exc
        finally:
            # The SDK may run a progress callback after the call returned: it moves nothing now.
            attempt_clock.finished = True
            if watcher is not None:
                watcher(None)
            release_slot()
            if task_token is not None:
                TASK_CALL.reset(task_token)
        elapsed = clock.monotonic() - started
        if scope.cancelled_caught:
            failure = TimeoutError()
        if result is not None and failure is None:
            attempt_result: types.CallToolResult | BaseException = result
        else:
            assert failure is not None
            attempt_result = failure
            if _connection_closed(failure):
                srv.upstream.report_lost()
        verdict = classify(
            attempt_result,
            retry_class=info.retry_class,
            server=srv.name,
            tool=info.name,
            classifier=self._classifier,
        )
        if isinstance(failure, CallCancelledError):
            verdict = Verdict(outcome=Outcome.IGNORED, code=ErrorCode.CANCELLED, retryable=False, outcome_unknown=True)
        # Read before recording: was this tool already failing before this attempt?
        tool_streak = info.breaker.snapshot().consecutive_failures if verdict.outcome is Outcome.FAILURE else 0
        # The journal's breaker_opened: which breakers were open before this attempt's report.
        open_before = None if call is None else (srv.breaker.state is BreakerState.OPEN, info.breaker.state is BreakerState.OPEN)
        # A call that became a task is judged by how long the handle took, not by the task's own length:
        # a healthy tool whose tasks run for minutes must not read as a slow call to the breakers.
        judged_s = elapsed if attempt_clock.task_at is None else attempt_clock.task_at - started
        tool_permit.record(verdict.outcome, judged_s)
        server_permit.record(_server_outcome(verdict, tool_streak), judged_s)
        answer: types.CallToolResult | tuple[Verdict, CallError]
        if verdict.ok and result is not None:
            answer = result
        else:
            answer = (
                verdict,
                redact_error(
                    self._error(srv, info, verdict, attempt_result, timeout_s, elapsed, by_budget), srv.upstream.spec.secrets
                ),
            )
        if call is not None:
            call.sent += 1
            code = None if isinstance(answer, types.CallToolResult) else answer[1].code
            self._observe(call, srv, info, code, attempt=call.sent, duration_s=elapsed, open_before=open_before, result=result)
        return answer

    def _observe(
        self,
        call: _Journaled,
        srv: _Server,
        info: _Tool,
        code: ErrorCode | None,
        *,
        attempt: int,
        duration_s: float = 0.0,
        outcome: str | None = None,
        open_before: tuple[bool, bool] | None = None,
        result: types.CallToolResult | None = None,
    ) -> None:
        """Hand one journal row to the observer: an attempt sent (with `open_before`), a refusal or a reconciliation."""
        observer = self._observer
        assert observer is not None
        server_state, tool_state = srv.breaker.state, info.breaker.state
        opened = open_before is not None and (
            (server_state is BreakerState.OPEN and not open_before[0]) or (tool_state is BreakerState.OPEN and not open_before[1])
        )
        result_size = None
        if result is not None and observer.record_sizes:
            result_size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode())
        observer.record(
            AttemptRecord(
                server=srv.name,
                tool=info.name,
                call_id=call.call_id,
                attempt=attempt,
                # The attempt's start on the wall clock, from its duration on the monotonic one.
                started_at=self._clock.time() - duration_s,
                duration_s=duration_s,
                outcome=outcome or outcome_of(code),
                error_code=None if code is None else code.value,
                retries=attempt - 1,
                trace_id=call.trace_id,
                operation_id=call.operation_id,
                server_breaker=server_state.value,
                tool_breaker=tool_state.value,
                breaker_opened=opened,
                client=call.client,
                arguments_size=call.arguments_size,
                result_size=result_size,
                arguments_hash=call.arguments_hash,
            )
        )

    def _error(
        self,
        srv: _Server,
        info: _Tool,
        verdict: Verdict,
        attempt: types.CallToolResult | BaseException,
        timeout_s: float,
        elapsed: float,
        by_budget: bool,
    ) -> CallError:
        code = verdict.code or ErrorCode.UPSTREAM_ERROR
        common: dict[str, Any] = {"server": srv.name, "tool": info.name, "retry_after_s": verdict.retry_after_s}
        if isinstance(attempt, types.CallToolResult):
            text = next((b.text for b in attempt.content if isinstance(b, types.TextContent)), "")
            if code is ErrorCode.TOOL_ERROR:
                return ToolError(
                    content=attempt.content,
                    upstream_structured_content=attempt.structured_content,
                    retryable=verdict.retryable,
                    detail={"reason": verdict.reason} if verdict.reason else None,
                    **common,
                )
            return CODE_TO_ERROR[code](detail={"upstream_message": text[:_MAX_UPSTREAM_TEXT]}, **common)
        if isinstance(attempt, CallError):
            attempt.server, attempt.tool = srv.name, info.name
            return attempt
        detail: dict[str, Any] = {"elapsed_s": round(elapsed, 3)}
        if verdict.reason:
            detail["reason"] = verdict.reason
        if isinstance(attempt, TimeoutError):
            detail["timeout_s"] = round(timeout_s, 3)
            if by_budget:
                detail["cut_by"] = "turn budget"
        if code is ErrorCode.OUTCOME_UNKNOWN:
            return OutcomeUnknownError(detail=detail, **common)
        if code is ErrorCode.TIMEOUT:
            what = "the turn budget ran out" if by_budget else f"no answer within {_seconds(timeout_s)}"
            return CallTimeoutError(
                f"The tool did not answer in time ({what}) and the call was cancelled.", detail=detail, **common
            )
        if code is ErrorCode.UPSTREAM_ERROR:
            return UpstreamError(retryable=verdict.retryable, detail=detail, **common)
        return CODE_TO_ERROR[code](retryable=verdict.retryable, detail=detail, **common)


def _server_outcome(verdict: Verdict, tool_streak: int) -> Outcome:
    """What the server breaker learns from one attempt.

    Only failures that may mean the server itself is in trouble (timeouts, transport and protocol
    failures), and of those only a tool's first failure in a row, plus every lost connection. A
    single slow tool then costs the server breaker one failure per streak and its own breaker
    handles the rest, while a wedged server, where every tool fails, still trips it after a few
    calls instead of each tool paying its own timeouts first. A tool's own `isError` answer says
    the server is up, so it counts as a success.
    """
    if verdict.outcome is not Outcome.FAILURE:
        return verdict.outcome
    if verdict.code not in _SERVER_FAILURE_CODES:
        return Outcome.SUCCESS
    if tool_streak == 0 or verdict.reason.startswith("connection"):
        return Outcome.FAILURE
    return Outcome.IGNORED


def _connection_closed(exc: BaseException) -> bool:
    """The connection is gone: closed, or an HTTP session the server no longer knows (it restarted)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_closed(e) for e in exc.exceptions)
    if not isinstance(exc, MCPError):
        return False
    cut = cut_info(exc.data)
    if cut is not None:
        # One HTTP request cut: the connection itself is fine unless the server could not be reached.
        return cut.get("sent") is False
    return exc.code == _CONNECTION_CLOSED or (exc.code == types.INVALID_REQUEST and "session terminated" in exc.message.lower())


def _retry_after_hint(data: Mapping[str, Any]) -> float | None:
    value = data.get("retry_after_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def _stopped(err: CallError, why: str) -> CallError:
    """`err`, noting why no further attempt was made."""
    err.detail.setdefault("retry_stopped", why)
    return err


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if math.isfinite(value) else "ever"
