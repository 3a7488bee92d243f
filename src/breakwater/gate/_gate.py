"""The call gate: every tool call passes through one place that bounds it, isolates it and explains it.

One logical call, in order:

1. the server must be ready (else SERVER_CONNECTING / SERVER_UNAVAILABLE), and have the tool (else
   UNKNOWN_TOOL — only asked of a ready server, whose list is known), and the arguments must fit
   the tool's input schema (else INVALID_ARGUMENTS naming the field, `catalog/_validate.py`: for a
   library caller as for the gateway's agents, and nothing is sent). A call that an open breaker
   refuses anyway is not checked: it gets the breaker's refusal of step 2, decided first;
2. per attempt: the turn budget must cover at least a minimal attempt (BUDGET_EXHAUSTED), the
   server breaker and the tool breaker must admit it (SERVER_CIRCUIT_OPEN, CIRCUIT_OPEN), and the
   server's bulkhead must have a free slot (OVERLOADED). These refusals send nothing and teach
   the breakers nothing: local overload protection never feeds back into upstream health;
3. the attempt runs inside one deadline scope on the injected clock: `timeout_s`, pushed out by
   each progress notification (`idle_timeout_s`) but never past the hard cap `max_s`, and never
   past the turn budget. When the scope fires, the SDK sees its awaiting scope cancelled and sends
   `notifications/cancelled` upstream (or, on 2026-07-28 HTTP, aborts the POST), so the server stops working and the
   slot is free again. A half-open probe of a tool whose healthy latency is known gets a shorter
   deadline, a few times its p99 (`breakwater.gate._health`);
4. `classify()` decides what the breakers learn, the code the model sees, and whether another
   attempt is allowed; a fast tool timing out twice in a row trips its breaker. Retried is what a
   second attempt can fix (a request refused or cut before it was sent, a retryable error, a
   retry-after), not a timeout unless `retry_timeouts` says so: a passed deadline is evidence the
   tool is slow now. Retries wait a full-jitter backoff (a server's retry-after hint is a floor),
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
overhead is a few dictionary lookups, two breaker admissions, one cancel scope and one latency
sample. Reconciliation
costs nothing until an answer is lost.

Each step is a function of its own: `_admit.admit` (2), `_attempt.run_attempt` (3 and the
classification of 4), `CallGate._retry_delay` (the retry decision of 4), `_reconcile.after_lost_answer`
(6). They share one `_call.Call` record per logical call.

With an `observer` (the call journal), every attempt sent, every local refusal above and every call
settled by reconciliation is handed to it as one `AttemptRecord` (`observer.record()` only queues
it); without one, the journal costs one `is not None` test per attempt.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import mcp.types as types

from breakwater._clock import Clock
from breakwater._wire import OPERATION_ID_META_KEY, operation_id_problem
from breakwater.catalog._validate import argument_checker
from breakwater.config import JournalPolicy, RetryPolicy
from breakwater.connect._readiness import wait_until_ready
from breakwater.connect._upstream import Upstream
from breakwater.errors import CallCancelledError, CallError, ErrorCode, InvalidArgumentsError, UnknownToolError
from breakwater.gate._admit import Permits, admit, admit_after_loss, breaker_refusal, first_refusal, take_permits
from breakwater.gate._attempt import ATTEMPT_WATCHER, READY, SAFE, AttemptDeadline, not_ready_error, run_attempt
from breakwater.gate._breaker import BreakerRegistry, BreakerSnapshot, BreakerStore, Outcome, Rejection
from breakwater.gate._call import (
    OPERATION_ID_ARGUMENT,
    Call,
    GateContext,
    Journaled,
    ProgressCallback,
    ServerRecord,
    ToolRecord,
    ended_by_exit,
    invalid_operation_id,
    stopped,
)
from breakwater.gate._classify import Classifier, RetryClass, Verdict
from breakwater.gate._envelope import error_result
from breakwater.gate._reconcile import GET_OPERATION_TOOL, Resend, after_lost_answer
from breakwater.gate._retry_budget import RetryBudgetSnapshot, SharedBudget
from breakwater.gate._step_one import MAX_LISTED_TOOLS, spend_wait, unknown_tool, wait_for_server, wait_window
from breakwater.gate._tasks import TaskRuntime
from breakwater.gate._turn_budget import current_budget
from breakwater.journal import (
    DOWNSTREAM_CLIENT,
    TRACE_ID,
    AttemptObserver,
    AttemptRecord,
    CallTracer,
    arguments_digest,
    new_call_id,
    outcome_of,
    sent_recorder,
)

__all__ = [
    "ATTEMPT_WATCHER",
    "GET_OPERATION_TOOL",
    "OPERATION_ID_ARGUMENT",
    "OPERATION_ID_META_KEY",
    "AttemptDeadline",
    "CallGate",
    "LearnedTimeout",
    "ProgressCallback",
    "SharedState",
]

#: `(server, tool) -> seconds or None`: a timeout learned from observed latencies (None: nothing learned).
LearnedTimeout = Callable[[str, str], float | None]


class SharedState(BreakerStore, Protocol):
    """What the gate needs from a state store shared with other replicas (see `breakwater.state`)."""

    def shared_budget(self, server: str, policy: RetryPolicy) -> SharedBudget | None:
        """The shared retry budget of `server`, or None to keep it in the budget itself."""
        ...


def _nothing_learned(_server: str, _tool: str) -> float | None:
    return None


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
        tasks: TaskRuntime | None = None,
        tracer: CallTracer | None = None,
        state: SharedState | None = None,
        learning: JournalPolicy | None = None,
    ) -> None:
        """`tasks` follows calls a server turns into tasks (None leaves them to the SDK session);
        `tracer` is told when each logical call starts and ends (OpenTelemetry's call span); `state`
        shares breakers and retry budgets with other replicas (None: they live in this process).

        `learning` (the journal's policy, when it learns timeouts) lets the gate learn a tool's
        timeout from the latencies it saw itself until `learned_timeout` has one: a tool's learned
        timeout is then in force once it has had the calls learning needs, not at the next refresh."""
        self._clock = clock
        self._rng = rng
        self._learned = learned_timeout or _nothing_learned
        self._learning = learning if learning is not None and learning.learn_timeouts else None
        self._observer = observer
        self._ctx = GateContext(
            clock=clock, rng=rng, classifier=classifier, observer=observer, tasks=tasks, record_sent=sent_recorder(observer)
        )
        #: Told when each logical call starts and ends, or None.
        self.tracer = tracer
        #: Follows calls a server turns into tasks, or None.
        self.tasks = tasks
        #: Asked, once a call's server is ready and its tool known, whether the tool may be called (server, tool): the
        #: refusal, or None. The gateway's `drift = "block"` sets it, so a changed tool is refused wherever the call
        #: comes from, and when the server became ready during the call's wait. None (the default) costs nothing.
        self.approve: Callable[[str, str], CallError | None] | None = None
        specs = {name: u.spec for name, u in upstreams.items()}
        self.breakers = BreakerRegistry(clock=clock, rng=rng, policy_for=lambda server, _tool: specs[server].breaker)
        self._servers = {name: ServerRecord(u, self.breakers, clock) for name, u in upstreams.items()}
        if state is not None:
            self.breakers.attach_store(state)
            for name, srv in self._servers.items():
                srv.retry_budget.attach(state.shared_budget(name, srv.retry_budget.policy))

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
        return await self.answer(server, tool, arguments, timeout, progress_callback, operation_id, False)

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
        return await self.answer(server, tool, arguments, timeout, progress_callback, operation_id, True)

    async def answer(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None,
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
        raise_on_error: bool,
    ) -> types.CallToolResult:
        """`call` (`raise_on_error`: `call_or_raise`) by position in one coroutine, which `Breakwater.call_tool` awaits:
        each coroutine layer and keyword costs per call. Steps 1 to 6 until a result, a final error or a refusal."""
        try:
            call = self._ready_call(server, tool, arguments, timeout, progress_callback, operation_id)
            if call is None:
                call = await self._call_when_ready(server, tool, arguments, timeout, progress_callback, operation_id)
            if call.refusal is not None and call.budget is None:
                # An open breaker's refusal as the loop would give it, not raised through it: the path that must be cheap.
                err = self._refused_at_once(call)
                if raise_on_error:
                    raise err
                return error_result(err)
            tracer = self.tracer
            # First, so the trace it opens is the one the journal's rows carry (TRACE_ID).
            handle = None if tracer is None else tracer.call_started(call.srv.name, call.info.name, call.op_id)
            observer = self._observer
            if observer is not None:
                call_id = new_call_id()
                size, digest = arguments_digest(call.arguments) if observer.record_sizes else (None, None)
                call.journal = Journaled(call_id, TRACE_ID.get() or call_id, DOWNSTREAM_CLIENT.get(), call.op_id, size, digest)
            ctx, srv = self._ctx, call.srv
            token = False  # whether the next attempt, a retry, holds a retry-budget token
            try:
                while True:
                    if call.last is not None:
                        permits = await self._retry_admitted(call, token)
                    else:  # `admit`: without a turn budget (most calls) only the permits, without its frame
                        permits = admit(ctx, call) if call.budget is not None else take_permits(ctx, call)
                    if math.isnan(call.timeout_s):
                        call.timeout_s, call.timeout_source = self._resolve_timeout(srv, call.info)
                    call.attempt += 1
                    try:
                        got = await run_attempt(ctx, call, permits)
                    except CallError as refused:
                        # An attempt that may have run is the answer: "connecting" would invite a duplicate.
                        if call.ran is not None:
                            raise stopped(call.ran, "the server was not ready for another attempt") from refused
                        raise
                    if isinstance(got, types.CallToolResult):
                        srv.retry_budget.record_success(call.attempt > 1)
                        result = got
                        break
                    verdict, err = got
                    err.attempt, err.max_attempts, err.operation_id = call.attempt, call.max_attempts, call.op_id
                    if not verdict.not_run:
                        call.ran = err
                    if verdict.outcome is Outcome.SUCCESS:
                        srv.retry_budget.record_success(was_retry=call.attempt > 1)
                    after = await after_lost_answer(ctx, call, verdict, err)
                    if isinstance(after, types.CallToolResult):
                        result = after
                        break
                    token = not isinstance(after, Resend)
                    delay = after.delay_s if isinstance(after, Resend) else self._retry_delay(call, verdict, err)
                    call.last = err
                    await self._clock.sleep(delay)
            except BaseException as err:
                # Every envelope names the operation, whichever refusal or failure ended it.
                if isinstance(err, CallError) and err.operation_id is None:
                    err.operation_id = call.op_id
                if tracer is not None:
                    tracer.call_finished(handle, err)
                raise
            if tracer is not None:
                tracer.call_finished(handle, None)
            return result
        except CallError as err:
            if raise_on_error:
                raise
            return error_result(err)

    def _server(self, server: str, tool: str) -> ServerRecord:
        srv = self._servers.get(server)
        if srv is None:
            raise UnknownToolError(
                f"There is no server named '{server}'.",
                server=server,
                tool=tool,
                detail={"reason": "unknown_server", "servers": sorted(self._servers)[:MAX_LISTED_TOOLS]},
            )
        return srv

    def _ready_call(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None,
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
    ) -> Call | None:
        """Step 1 for a server that is ready: the call's record (None: the server must be waited for first)."""
        srv = self._servers.get(server)
        if srv is None:  # `_server`'s refusal, its lookup inline
            srv = self._server(server, tool)
        upstream = srv.upstream
        if upstream.state is not READY or upstream.client is None:
            return None
        return self._known_tool(srv, tool, arguments, timeout, progress_callback, operation_id)

    async def _call_when_ready(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None,
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
    ) -> Call:
        """Step 1 for a server on its way up (pending, connecting): waited for within the call's window."""
        srv = self._server(server, tool)
        upstream = srv.upstream
        if upstream.state is READY and upstream.client is not None:
            return self._known_tool(srv, tool, arguments, timeout, progress_callback, operation_id)
        started = self._clock.monotonic()  # the wait is part of the call's timeout (`_step_one`)
        window = wait_window(srv, tool, timeout, self._learned, self._resolve_timeout)
        budget = current_budget()
        until = None if budget is None else budget.deadline
        if not await wait_until_ready(upstream, clock=self._clock, seconds=window, deadline=until):
            raise self._refused_early(srv, tool, not_ready_error(self._clock, upstream, tool))
        call = self._known_tool(srv, tool, arguments, timeout, progress_callback, operation_id)
        spend_wait(call, self._clock.monotonic() - started, self._resolve_timeout)
        return call

    def _known_tool(
        self,
        srv: ServerRecord,
        tool: str,
        arguments: Mapping[str, Any] | None,
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
    ) -> Call:
        # `srv.tool(tool)`'s usual answer (the tool list has not changed) without its frame.
        info = srv.tools.get(tool) if srv.upstream.tools is srv.tools_source else srv.tool(tool)
        if info is None:
            raise self._refused_early(srv, tool, unknown_tool(srv, tool))
        approve = self.approve
        if approve is not None and (refused := approve(srv.name, tool)) is not None:
            raise self._refused_early(srv, tool, refused)
        given = dict(arguments or {})
        if OPERATION_ID_ARGUMENT in given and not info.operation_id_argument:
            # The id an error told the model to reuse: the operation's, sent in `_meta` only (a strict schema refused it).
            own = given.pop(OPERATION_ID_ARGUMENT)
            operation_id = own if operation_id is None and isinstance(own, str) and own else operation_id
        # A call an open breaker refuses is refused as such (at admission, so the refusal is journaled
        # and traced like any other), without its arguments being checked: the model's next step is
        # the same whatever is wrong with them (another tool, or later), and the refusal stays cheap.
        refusal = breaker_refusal(srv, info)
        if refusal is None:
            check = info.check_arguments
            if check is None:
                check = info.check_arguments = argument_checker(info.definition)
            # Arguments that cannot fit the input schema, or that JSON cannot carry, are refused here,
            # naming the field, never sent upstream.
            problem = check(given)
            if problem is not None:
                detail = {"field": problem.field, "problem": problem.problem}
                refused = InvalidArgumentsError(problem.sentence(), server=srv.name, tool=tool, detail=detail)
                raise self._refused_early(srv, tool, refused)
        return self._prepare(srv, info, given, timeout, progress_callback, operation_id, refusal)

    def _refused_early(self, srv: ServerRecord, tool: str, err: CallError) -> CallError:
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

    def retry_class(self, server: str, tool: str) -> RetryClass | None:
        """The retry class a call of `tool` gets now (None if the server or the tool is not known)."""
        srv = self._servers.get(server)
        info = None if srv is None else srv.tool(tool)
        return None if info is None else info.retry_class

    def hard_cap_s(self, server: str, tool: str) -> float | None:
        """The longest a call of `tool` may take (`max_s` in force), or None if the tool is not known."""
        srv = self._servers.get(server)
        info = None if srv is None else srv.tool(tool)
        return None if info is None else info.call.hard_s

    def in_flight(self) -> dict[str, int]:
        """Calls in flight per server (what the bulkhead counts)."""
        return {name: srv.in_flight for name, srv in self._servers.items()}

    # ---- timeouts -----------------------------------------------------------------------------

    def resolved_timeout(self, server: str, tool: str) -> float | None:
        """The per-attempt timeout a call of `tool` would get now (None if the tool is not known yet)."""
        srv = self._servers[server]
        info = srv.tool(tool)
        return None if info is None else self._timeout(srv, info)

    def timeout_in_force(self, server: str, tool: str) -> tuple[float, str] | None:
        """`resolved_timeout` and its source: `configured`, `learned` or `default` (None if the tool is not known yet)."""
        srv = self._servers[server]
        info = srv.tool(tool)
        return None if info is None else self._resolve_timeout(srv, info)

    def learned_at(self, server: str, tool: str) -> float | None:
        """When the tool's learned timeout came into force (wall clock): when this process's own calls of it were enough
        to learn from. None if none is in force, or if it is the journal's from before this process could tell."""
        srv = self._servers[server]
        info = srv.tool(tool)
        if info is None or self._resolve_timeout(srv, info)[1] != "learned":
            return None
        return info.health.learned_at

    def _timeout(self, srv: ServerRecord, info: ToolRecord) -> float:
        return self._resolve_timeout(srv, info)[0]

    def _resolve_timeout(self, srv: ServerRecord, info: ToolRecord) -> tuple[float, str]:
        # Per-tool config, per-server config, learned value (the journal's, else the gate's own), default.
        if info.configured_timeout_s is not None:
            return info.configured_timeout_s, "configured"
        learned = self._learned(srv.name, info.name)
        if (learned is None or learned <= 0) and (learning := self._learning) is not None:
            health = info.health
            learned = health.learned_s
            if health.answered_total >= learning.learn_min_samples:
                learned = health.learn(self._clock.monotonic(), learning)
                # `learned_at` is only what this process saw: its own calls bring the value into force now. A journal's
                # value learned before it started has no known start here (status printed its own start time).
                if health.learned_at is None and learned is not None and learned > 0:
                    health.learned_at = self._clock.time()
        if learned is not None and learned > 0:
            return learned, "learned"
        return info.call.timeout_s, srv.upstream.spec.default_timeout_source

    # ---- one logical call ---------------------------------------------------------------------

    def _prepare(
        self,
        srv: ServerRecord,
        info: ToolRecord,
        arguments: dict[str, Any],
        timeout: float | None,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
        refusal: tuple[bool, Rejection] | None = None,
    ) -> Call:
        """Step 5 and the call's record: a mutating tool's operation id, the timeout, the budget, the journal's view."""
        op_id: str | None = None
        meta: types.RequestParamsMeta | None = None
        if info.retry_class is not SAFE:
            if operation_id is not None and (problem := operation_id_problem(operation_id)) is not None:
                raise self._refused_early(srv, info.name, invalid_operation_id(problem, srv.name, info.name))
            given = operation_id or arguments.get(OPERATION_ID_ARGUMENT)
            # A caller's own idempotency key is the operation; otherwise one id for every attempt.
            op_id = given if isinstance(given, str) and given else uuid.uuid4().hex
            # An open TypedDict (extra_items=Any): vendor keys are allowed, mypy cannot see that.
            meta = cast(types.RequestParamsMeta, {OPERATION_ID_META_KEY: op_id})
            if info.operation_id_argument:
                arguments.setdefault(OPERATION_ID_ARGUMENT, op_id)
        budget = current_budget()
        # Without a turn budget the timeout waits for admission: a call an open breaker refuses does not pay to resolve it.
        resolved = (timeout, "caller") if timeout is not None else (math.nan, "")
        if budget is not None and timeout is None:
            resolved = self._resolve_timeout(srv, info)
        call = Call(srv, info, arguments, op_id, meta, *resolved, budget, progress_callback, None)
        call.refusal = refusal
        return call

    def _refused_at_once(self, call: Call) -> CallError:
        """The attempt loop of `answer` for a call whose first attempt the breakers refuse (and no turn budget is checked first):
        traced and journaled alike, the refusal returned. tests/gate hold the two paths equal."""
        tracer = self.tracer
        handle = None if tracer is None else tracer.call_started(call.srv.name, call.info.name, call.op_id)
        observer = self._observer
        if observer is not None:  # as `answer` does
            call_id = new_call_id()
            size, digest = arguments_digest(call.arguments) if observer.record_sizes else (None, None)
            call.journal = Journaled(call_id, TRACE_ID.get() or call_id, DOWNSTREAM_CLIENT.get(), call.op_id, size, digest)
        err = first_refusal(self._ctx, call)
        if err.operation_id is None:
            err.operation_id = call.op_id
        if tracer is not None:
            tracer.call_finished(handle, err)
        return err

    async def _reconnected(self, call: Call) -> None:
        """Before a retry: a server that is reconnecting (the last attempt lost the connection: a crash, a session the
        server forgot, credentials it refused) is waited for within the call's timeout, as a first attempt waits for a
        start; the retry was refused at once, and a read-only call cut by a crash was never sent again.

        One that does not come back ends the call. After an attempt that never ran, with the server's own state
        (connecting, failed, a sign-in needed): that is what the model needs. After one that may have run, with that
        attempt's answer: "connecting" would invite a fresh call, which is how duplicates are made."""
        if call.window is not None:
            return  # (a lost answer's reconciliation waits for the server itself: `admit_after_loss`)
        upstream, budget = call.srv.upstream, call.budget
        # The wait is the attempt's time, as a first attempt's is (`_step_one`): it waited a timeout, then had another.
        if not await wait_for_server(self._clock, call, None if budget is None else budget.deadline):
            # Its Breakwater closed: no server comes back, and "wait, retry" would mislead.
            cut = "The call was cut: breakwater closed before the server came back."
            refused = (
                CallCancelledError(cut, server=upstream.spec.name, tool=call.info.name)
                if upstream.closing
                else not_ready_error(self._clock, upstream, call.info.name)
            )
            if call.ran is None:  # no attempt may have run: the server's state is the answer
                raise refused
            # One that may have run is (a read-only call cut mid-call, then a retry refused at connect: "not sent").
            raise stopped(call.ran, "the server was not ready for another attempt") from refused

    async def _retry_admitted(self, call: Call, token: bool) -> Permits:
        """A retry's connection and permits; refused, it was never sent, and its retry-budget `token` goes back (a
        retry took one in `_retry_delay`; a re-send of a lost answer's call, `Resend`, took none)."""
        try:
            await self._reconnected(call)
            return await self._retry_permits(call)
        except CallError:
            if token:
                call.srv.retry_budget.refund()
            raise

    async def _retry_permits(self, call: Call) -> Permits:
        """Step 2 for a retry: its permits; a retry refused (a breaker that the last attempt opened, a bulkhead full)
        reports that attempt, which ran: CIRCUIT_OPEN's "nothing was sent" invited a repeat of a call that had run."""
        assert call.last is not None
        ctx = self._ctx
        try:
            if call.window is not None:
                return await admit_after_loss(ctx, call)
            return admit(ctx, call) if call.budget is not None else take_permits(ctx, call)
        except CallError as refused:
            raise stopped(call.last, f"no further attempt: {refused.code.value}") from refused

    def _retry_delay(self, call: Call, verdict: Verdict, err: CallError) -> float:
        """Step 4's decision: the wait before the next attempt, or raise `err` (noting why not)."""
        if not verdict.retryable or call.attempt >= call.max_attempts:
            raise err
        if verdict.code is ErrorCode.TIMEOUT and not call.info.retry.retry_timeouts:
            # A deadline that passed is evidence the tool is slow now: a retry would wait the whole timeout again.
            raise stopped(err, "a timeout is not retried (retry_timeouts is off): the tool is answering slowly now")
        if ended_by_exit(verdict) and call.last is not None and ended_by_exit(call.last):
            # A query of death (a third exit reads as a crash loop); one retry: a bystander call is not the cause.
            err.retryable = False
            raise stopped(err, "the server's process ended during this call twice: the call itself may be what ends it")
        delay = call.info.retry.delay(call.attempt - 1, self._rng, verdict.retry_after_s)
        if delay is None:
            raise stopped(err, "the server asked for a longer wait than breakwater retries after")
        if call.budget is not None and not call.budget.can_start(delay + call.needed_s):
            raise stopped(err, "the turn budget cannot cover another attempt")
        if not call.srv.retry_budget.try_acquire():
            raise stopped(err, "the server's retry budget is spent (too many recent failures)")
        return delay
