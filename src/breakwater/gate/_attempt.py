"""Steps 3 and 4 of a call: one attempt under its deadline, and what its outcome means.

The attempt runs inside one deadline scope on the injected clock: `timeout_s`, pushed out by each progress notification
(`idle_timeout_s`) but never past the hard cap `max_s`, and never past the turn budget. When the scope fires, the SDK
sees its awaiting scope cancelled and sends `notifications/cancelled` upstream (on 2026-07-28 HTTP the POST is aborted
instead), so the server stops working and the slot is free again. `classify()` then decides what the breakers learn, the
code the model sees, and whether another attempt is allowed.

The caller's own cancellation is re-raised (the SDK has already told the server) and teaches nothing; a cancellation
that did not come from the caller is reported as CANCELLED.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError

from breakwater._clock import Clock, DeadlineScope
from breakwater._wire import CONNECTION_CLOSED as _CONNECTION_CLOSED
from breakwater.config._redact import redact_error
from breakwater.connect._http_cut import cut_info
from breakwater.connect._not_json import finite_result
from breakwater.connect._raw_call import ServerReplyError, sdk_spans_recorded
from breakwater.connect._raw_call import call_tool as raw_call_tool
from breakwater.connect._readiness import connecting_note
from breakwater.connect._upstream import Upstream
from breakwater.errors import (
    CODE_TO_ERROR,
    CallCancelledError,
    CallError,
    CallTimeoutError,
    ClientCannotAnswerError,
    ErrorCode,
    InvalidArgumentsError,
    OutcomeUnknownError,
    ServerConnectingError,
    ServerUnavailableError,
    ToolError,
    UpstreamError,
)
from breakwater.gate._admit import Permits
from breakwater.gate._breaker_types import FAILURE, IGNORED, OPEN, Outcome
from breakwater.gate._call import Call, GateContext, ServerRecord, mark_sent, observe, pass_progress, seconds_text
from breakwater.gate._classify import SUCCESS, RetryClass, Verdict, answer_of, classify
from breakwater.gate._step_one import waited_note
from breakwater.gate._task_required import call_as_task, requires_task
from breakwater.gate._tasks import TASK_CALL, TaskCall
from breakwater.gate._unsent import claim, cut_unsent, unwatch, watch
from breakwater.status import ServerState, iso

__all__ = ["ATTEMPT_WATCHER", "Answer", "AttemptDeadline", "not_ready_error", "run_attempt"]

#: What one attempt comes to: the result to pass on, or the verdict and the error it stands for.
Answer = types.CallToolResult | tuple[Verdict, CallError]

# Failures that say something about the server as a whole (a tool's own error says nothing about it).
_SERVER_FAILURE_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.UPSTREAM_ERROR, ErrorCode.OUTCOME_UNKNOWN})
_MAX_UPSTREAM_TEXT = 500
_DEFAULT_CONNECT_ESTIMATE_S = 2.0
_tuple_new = tuple.__new__
# Enum members read per call, as globals: a class attribute read of an enum is slow on Python 3.11 (see `_breaker_types`).
READY, SAFE = ServerState.READY, RetryClass.SAFE


class AttemptDeadline:
    """One attempt's deadline, as what happens during the attempt may move it.

    Progress from the server pushes it out by the idle timeout (`nudge`). While the caller itself is
    being asked something on the upstream's behalf (a relayed elicitation or sampling request, often
    answered by a person), the attempt's own timeout stops running (`waiting_on_caller`): only the
    hard cap (`max_s`, or the turn budget) bounds the wait, and the timeout restarts from the answer.
    """

    __slots__ = (
        "_clock",
        "_scope",
        "_slot",
        "_waiting",
        "budget_hard",
        "by_budget",
        "call",
        "extended",
        "finished",
        "hard",
        "idle_s",
        "short",
        "started",
        "task_at",
        "task_id",
        "timeout_s",
    )

    def __init__(
        self,
        clock: Clock,
        scope: DeadlineScope,
        started: float,
        hard: float,
        idle_s: float,
        timeout_s: float,
        by_budget: bool,
        short: bool,
        budget_hard: bool = False,
    ) -> None:
        # Every field by position: one is made per attempt, and keywords are matched by name.
        self._clock = clock
        self._scope = scope
        self.hard = hard
        self.idle_s = idle_s
        self.finished = False
        #: Progress (or a wait on the caller) moved the deadline past the attempt's timeout.
        self.extended = False
        self._waiting = 0
        #: When the attempt started (monotonic).
        self.started = started
        #: The turn budget, not the attempt's own timeout, set the deadline in force (the first one, or the hard cap
        #: progress pushed it to: `_push`).
        self.by_budget = by_budget
        #: The turn budget, not `max_s`, is the hard cap.
        self.budget_hard = budget_hard
        #: The attempt's own timeout (the call's, or a half-open probe's shorter one).
        self.timeout_s = timeout_s
        #: A half-open probe with a deadline shorter than the call's timeout (see `_health`).
        self.short = short
        #: When the server answered with a task handle (monotonic), if it did.
        self.task_at: float | None = None
        #: The server whose bulkhead slot the attempt holds, until it is given back (`release_slot`).
        self._slot: ServerRecord | None = None
        #: The call whose attempt this is: its caller's progress callback is handed what `on_progress` passes on.
        self.call: Call | None = None

    @classmethod
    def for_call(cls, clock: Clock, call: Call, probe: bool = False) -> AttemptDeadline:
        """The deadline of `call`'s next attempt: its timeout (a `probe`'s may be shorter), under the hard cap and budget."""
        info = call.info
        policy, timeout_s = info.call, call.timeout_s
        if info.health.sends_progress and call.timeout_source != "caller":  # not cut before its first report (`_health`)
            timeout_s = max(timeout_s, policy.idle_s)
        if probe:
            breaker = info.breaker.policy
            timeout_s = info.health.probe_timeout(timeout_s, breaker.probe_timeout_factor, breaker.probe_timeout_floor_s)
        started = clock.monotonic()
        hard = started + max(info.hard_s, timeout_s)
        deadline = started + timeout_s
        by_budget = budget_hard = False
        if call.budget is not None:
            budget_hard = call.budget.deadline <= hard
            hard = min(hard, call.budget.deadline)
            if call.budget.deadline < deadline:
                deadline, by_budget = call.budget.deadline, True
        # Without its own idle timeout a tool's gap between progress notifications is its timeout.
        idle_s = policy.idle_timeout_s if policy.idle_timeout_s is not None else timeout_s
        scope = clock.deadline_scope(deadline)
        return cls(clock, scope, started, hard, idle_s, timeout_s, by_budget, timeout_s < call.timeout_s, budget_hard)

    @property
    def scope(self) -> DeadlineScope:
        """The cancel scope the attempt's request runs in."""
        return self._scope

    def became_task(self, task_id: str) -> None:
        """The call is now the task `task_id` (breakwater.gate._tasks): its polling is bounded by the budget or `task_max_s`.

        A task being polled holds no request open upstream: its bulkhead slot goes back at once. The id
        (unset until then: it is not written on every attempt) ties the questions a 2025-11-25 task asks
        to this call (`gateway._relay`)."""
        self.task_id = task_id
        self.task_at = self._clock.monotonic()
        self._scope.deadline = math.inf
        self.release_slot()

    def release_slot(self) -> None:
        """Give the attempt's bulkhead slot back, if it still holds it."""
        srv = self._slot
        if srv is not None:
            self._slot = None
            srv.in_flight -= 1

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        """The attempt's progress callback (a bound method, not a closure per attempt, with its cells)."""
        self.nudge()  # whatever it says, the server is alive and working on the call
        call = self.call
        if call is not None:
            call.info.health.progressed()  # its next calls wait for a first report (`for_call`)
        if call is not None:
            await pass_progress(call, progress, total, message)

    def nudge(self) -> None:
        """The server showed signs of life: give it `idle_s` more, up to the hard cap."""
        if not self.finished:
            pushed = min(self.hard, self._clock.monotonic() + self.idle_s)
            if pushed > self._scope.deadline:
                self._push(pushed)
                self.extended = True

    def _push(self, deadline: float) -> None:
        # At the hard cap, what set it says what cut the call: a progressing tool cut by the caller's budget was told
        # "the cap of 2 s ([call] max_s)", retryable, raise timeout_s (with max_s at 60 s).
        self._scope.deadline = deadline
        self.by_budget = self.budget_hard and deadline >= self.hard

    @contextlib.contextmanager
    def waiting_on_caller(self) -> Iterator[None]:
        """While the body runs, only the hard cap bounds the attempt."""
        self._waiting += 1
        if not self.finished:
            self._push(max(self._scope.deadline, self.hard))
            self.extended = True
        try:
            yield
        finally:
            self._waiting -= 1
            if not self._waiting and not self.finished and self.task_at is None:
                self._push(min(self.hard, self._clock.monotonic() + self.idle_s))


#: Set by a caller that may be asked something mid-call on an upstream's behalf (the gateway's
#: relay): handed each attempt's `AttemptDeadline` as the attempt starts, and None as it ends.
ATTEMPT_WATCHER: contextvars.ContextVar[Callable[[AttemptDeadline | None], None] | None] = contextvars.ContextVar(
    "breakwater_attempt_watcher", default=None
)


async def run_attempt(ctx: GateContext, call: Call, permits: Permits) -> Answer:
    """Send one attempt of `call` (holding a bulkhead slot) and judge it: the breakers learn, the journal gets its row."""
    srv, info, clock = call.srv, call.info, ctx.clock
    client = srv.upstream.client
    if client is None or srv.upstream.state is not READY:
        # Lost between attempts: nothing was sent, so nothing is learned.
        permits.release()
        raise not_ready_error(clock, srv.upstream, info.name)
    deadline = AttemptDeadline.for_call(clock, call, permits.tool.is_probe)
    watcher = ATTEMPT_WATCHER.get()
    if watcher is not None:
        watcher(deadline)
    deadline.call = call
    on_progress = deadline.on_progress
    srv.in_flight += 1  # the attempt's bulkhead slot, given back once by `deadline.release_slot()`
    deadline._slot = srv
    result: types.CallToolResult | None = None
    failure: BaseException | None = None
    # If the server answers with a task handle, the tasks resolver takes the call from here (see _tasks).
    task_token = None
    task_call: TaskCall | None = None
    tasks = ctx.tasks
    if tasks is not None:
        # `tasks.attempt(...)`'s tuple made here, without the named tuple's `__new__`: two frames less per attempt.
        fields = (tasks, srv.upstream, info.name, call.meta, info.retry_class, call.timeout_s, info.call.task_max_s, deadline)
        task_call = _tuple_new(TaskCall, fields)
        task_token = TASK_CALL.set(task_call)
    if ctx.record_sent is not None and info.retry_class is not SAFE:
        mark_sent(ctx, call)
    scope = deadline._scope
    upstream = srv.upstream
    refusal = None if upstream.spec.transport == "stdio" else watch()  # the OAuth flow's word on the request (`_unsent`)
    try:
        with scope:
            # The `tools/call` (stdio: without the SDK session's plumbing, `connect/_raw_call.py`), inline: one frame less.
            process, name = upstream.process, info.name
            raw = process.raw_calls if process is not None else None
            if info.definition.execution is not None and task_call is not None and requires_task(client, info.definition):
                result = await call_as_task(task_call, client, name, call.arguments, meta=call.meta, progress=on_progress)
            elif raw is not None and not sdk_spans_recorded():
                result = await raw_call_tool(client, raw, name, call.arguments, progress_callback=on_progress, meta=call.meta)
            if result is None:
                result = await client.call_tool(name, call.arguments, progress_callback=on_progress, meta=call.meta)
                assert isinstance(result, types.CallToolResult)
    except anyio.get_cancelled_exc_class():
        task = _current_task()
        if task is None or task.cancelling() > 0:
            # The caller cancelled: the SDK already told the server; stay cancelled, learn nothing.
            permits.release()
            if call.journal is not None:
                call.journal.sent += 1
                duration_s = clock.monotonic() - deadline.started
                # A tool that changes things, cancelled once sent, may have acted (as the drain tells its caller; journaled
                # cancelled, `stats` counted none unknown), unless it waited for a token and was never sent (`claim`).
                code = ErrorCode.CANCELLED if info.retry_class is SAFE or claim(refusal) else ErrorCode.OUTCOME_UNKNOWN
                observe(ctx, call, code, attempt=call.journal.sent, duration_s=duration_s)
            raise
        failure = CallCancelledError("The call was cancelled from outside breakwater before it finished.")
    except (Exception, BaseExceptionGroup) as exc:
        failure = exc
    finally:
        # The SDK may run a progress callback after the call returned (it does not drain them first): it moves nothing now.
        deadline.finished = True
        if watcher is not None:
            watcher(None)
        deadline.release_slot()
        unwatch(refusal)
        if task_token is not None:
            TASK_CALL.reset(task_token)
    if scope.cancelled_caught:
        failure = TimeoutError()
    if refusal is not None:  # a cut of a request that waited for its token (refused, or not sent yet): not run
        failure = cut_unsent(refusal, failure, srv.name, info.name, deadline.timeout_s, deadline.by_budget)
    if result is not None:  # NaN or Infinity from the server: null, as on the gateway's wire (connect/_not_json.py)
        result = finite_result(result, server=srv.name, tool=info.name)
    return _judge(ctx, call, permits, deadline, result, failure, client)


def _current_task() -> asyncio.Task[Any] | None:
    """The asyncio task running, or None on trio (HTTP servers only): there every cancellation that reaches
    `run_attempt`'s handler is a scope's around the caller, to stay cancelled (`asyncio.current_task` raised)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _judge(
    ctx: GateContext,
    call: Call,
    permits: Permits,
    deadline: AttemptDeadline,
    result: types.CallToolResult | None,
    failure: BaseException | None,
    client: object,
) -> Answer:
    """Classify the attempt, teach both breakers, journal it; the answer to pass on."""
    srv, info = call.srv, call.info
    lost_before = False
    now = ctx.clock.monotonic()
    elapsed = now - deadline.started
    attempt_result: types.CallToolResult | BaseException
    verdict: Verdict | None = None
    if result is not None and failure is None:
        attempt_result = result
        if ctx.classifier is None and not result.is_error:
            verdict = SUCCESS  # `classify`'s answer to a plain result, without its call (and its keywords)
    else:
        assert failure is not None
        # The server's error answer relayed by the SDK with a code of a local failure's (see `server_answer`).
        attempt_result = failure = answer_of(failure, srv.upstream)
        if _connection_closed(failure):
            srv.upstream.report_lost()
            lost_before = not srv.first_to_see_lost(client)
    if verdict is None:
        verdict = classify(
            attempt_result, retry_class=info.retry_class, server=srv.name, tool=info.name, classifier=ctx.classifier
        )
    if lost_before and verdict.outcome is FAILURE:
        # One lost connection is one failure, whatever the number of calls in flight on it: five calls cut by one crash
        # opened the server's breaker (and their tool's) for every session of a shared gateway.
        verdict = replace(verdict, outcome=IGNORED)
    if isinstance(failure, CallCancelledError):
        verdict = Verdict(outcome=IGNORED, code=ErrorCode.CANCELLED, retryable=False, outcome_unknown=True)
    elif deadline.by_budget and isinstance(attempt_result, TimeoutError):
        # The caller's turn budget ended it, not the server: no breaker hears of it (a client's tight budgets opened the
        # server's breaker for every session of a shared gateway), and no retry can fit in the spent budget.
        verdict = replace(verdict, outcome=IGNORED, retryable=False)
    # Read before recording: was this tool already failing before this attempt?
    tool_streak = info.breaker.snapshot().consecutive_failures if verdict.outcome is FAILURE else 0
    # The journal's breaker_opened: in-process breakers tell; a shared store's, by which were open before the reports.
    open_before = None
    journal = call.journal
    if journal is not None and not (srv.breaker.in_process and info.breaker.in_process):
        open_before = (srv.breaker.state is OPEN, info.breaker.state is OPEN)
    # A task is judged by how long its handle took: a healthy tool whose tasks run for minutes is no slow call.
    judged_s = elapsed if deadline.task_at is None else deadline.task_at - deadline.started
    opened = bool(permits.tool.record(verdict.outcome, judged_s))
    outcome = verdict.outcome
    server_outcome = outcome if outcome is not FAILURE else _server_outcome(verdict, tool_streak)  # its first line, inline
    opened = bool(permits.server.record(server_outcome, judged_s)) or opened
    timed_out = isinstance(attempt_result, TimeoutError) and not deadline.by_budget
    if result is not None and failure is None:
        call.info.health.answered(now, judged_s)
    elif timed_out:
        opened = _timed_out(call, deadline, now, judged_s) or opened
    answer: Answer
    code = verdict.code
    if code is None and result is not None:
        answer = result
    else:
        err = redact_error(_error(call, verdict, attempt_result, elapsed, deadline), srv.upstream.spec.secrets)
        if timed_out:
            slow_now(call, err)
        answer = verdict, err
        code = err.code
    if journal is not None:
        journal.sent += 1
        # By position (keywords are matched by name). A deadline that expired is a timeout in the journal whatever the agent
        # was told (OUTCOME_UNKNOWN if not read-only): `stats` read 0 timeouts for it, its learned timeout missed the cut.
        # A turn budget's cut is the caller's (`cancelled`), not a timeout of the tool nor a sample of its latency.
        row = "timeout" if timed_out else "cancelled" if deadline.by_budget and isinstance(attempt_result, TimeoutError) else None
        observe(ctx, call, code, journal.sent, elapsed, row, open_before, opened if open_before is None else None, None, result)
    return answer


#: How near its cap an attempt must end to have been cut by it (a timer may fire a moment late, never early).
_CUT_SLACK_S = 0.05


def _timed_out(call: Call, deadline: AttemptDeadline, now: float, duration_s: float) -> bool:
    """Count the timeout; trip the tool's breaker if a tool that answers fast keeps timing out (True if it did)."""
    health = call.info.health
    health.timed_out(now, duration_s, short=deadline.short)
    need = call.info.breaker.policy.timeouts_to_trip
    # Judged against the tool's own timeout, not a probe's short one: far below *that* is the guard. Before this process
    # has seen the tool's p99 (after a restart) a learned timeout is the guard (its tail times the headroom): the slow
    # tool was waited for to its timeout call after call. Not once the p99 is known: a tool turned 5x slower, tripped
    # at its learned timeout, met probes cut at 3x its old p99 for good, where cuts let the learned timeout catch up.
    learned_guard = call.timeout_source == "learned" and health.p99() is None
    if need and health.timeouts_in_a_row >= need and (learned_guard or health.far_below(call.timeout_s)):
        p99 = health.p99()
        usual = f"it usually answers within {seconds_text(p99)}" if p99 is not None else "its timeout is learned from its history"
        why = f"{health.timeouts_in_a_row} timeouts in a row; {usual}"
        return call.info.breaker.trip(why)
    return False


def slow_now(call: Call, err: CallError) -> None:
    """Tell the model how slow the tool is against its usual latency, and when breakwater tries it again."""
    usual = call.info.health.median()
    if usual is not None:
        err.detail["usual_s"] = round(usual, 3)
    snap = call.info.breaker.snapshot()
    if snap.state is OPEN:
        err.detail["breaker"] = snap.state.value
        err.retry_after_s = snap.retry_after_s


def _error(
    call: Call, verdict: Verdict, attempt: types.CallToolResult | BaseException, elapsed: float, deadline: AttemptDeadline
) -> CallError:
    """The error an attempt's verdict stands for."""
    by_budget, timeout_s = deadline.by_budget, deadline.timeout_s
    code = verdict.code or ErrorCode.UPSTREAM_ERROR
    common: dict[str, Any] = {"server": call.srv.name, "tool": call.info.name, "retry_after_s": verdict.retry_after_s}
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
        said = {"upstream_message": text[:_MAX_UPSTREAM_TEXT]} | ({"reason": verdict.reason} if verdict.reason else {})
        if code is ErrorCode.INVALID_ARGUMENTS and text:
            # The server's own words (a mismatched operation id is no schema problem): the summary alone said "do not fit
            # the tool's input schema" of every refusal.
            return InvalidArgumentsError(
                f"The server refused the call, so nothing ran: {text[:_MAX_UPSTREAM_TEXT]}", detail=said, **common
            )
        return CODE_TO_ERROR[code](detail=said, **common)
    if isinstance(attempt, CallError):
        attempt.server, attempt.tool = call.srv.name, call.info.name
        return attempt
    detail: dict[str, Any] = {"elapsed_s": round(elapsed, 3)}
    if verdict.reason:
        detail["reason"] = verdict.reason
    what = f"no answer within {seconds_text(timeout_s)}"
    if isinstance(attempt, TimeoutError):
        detail["timeout_s"] = round(timeout_s, 3)
        what += waited_note(call, detail)  # "no answer within 2.91 s" of a 6 s timeout said nothing of why
        cap = deadline.hard - deadline.started
        if by_budget:
            detail["cut_by"], what = "turn budget", "the turn budget ran out"
        elif deadline.short:
            detail["cut_by"] = "probe deadline"
        elif deadline.extended and elapsed >= cap - _CUT_SLACK_S:
            # Progress kept it going past its timeout, to the cap: "no answer within 1 s" said of a tool at work for 3 s.
            detail["cut_by"], what = "max_s", f"still working at the cap of {seconds_text(cap)} ([call] max_s)"
        elif deadline.extended:
            detail["cut_by"], what = "idle", f"no progress for {seconds_text(deadline.idle_s)} ([call] idle_timeout_s)"
    if code is ErrorCode.OUTCOME_UNKNOWN:
        # Why the result is unknown, in the sentence the model reads: it said nothing of a timeout (only `reason`).
        cause = f"The tool did not answer in time ({what}) and the call was cancelled" if "timeout_s" in detail else None
        message = None if cause is None else f"{cause}; the action may or may not have happened."
        return OutcomeUnknownError(message, detail=detail, **common)
    if code is ErrorCode.TIMEOUT:
        message = f"The tool did not answer in time ({what}) and the call was cancelled."
        return CallTimeoutError(message, retryable=verdict.retryable, detail=detail, **common)
    if code is ErrorCode.UPSTREAM_ERROR:
        return UpstreamError(_server_answer(verdict.reason), retryable=verdict.retryable, detail=detail, **common)
    if code is ErrorCode.CLIENT_CANNOT_ANSWER and verdict.reason:
        # What the user must do (a page's address) goes in the sentence the model reads, not only in the detail;
        # the pages as the server sent them go in the detail, for a client that opens them itself.
        message = verdict.reason[:1].upper() + verdict.reason[1:]
        if verdict.elicitations:
            detail["elicitations"] = [dict(page) for page in verdict.elicitations]
        return ClientCannotAnswerError(message, retryable=verdict.retryable, detail=detail, **common)
    return CODE_TO_ERROR[code](retryable=verdict.retryable, detail=detail, **common)


def _server_answer(reason: str) -> str | None:
    """What the model reads of an UPSTREAM_ERROR that is the server's own error answer (`_classify_mcp_error`'s reasons),
    else None (the summary: a connection lost, a reply that is no answer).

    It read "the connection to the tool's server failed or it sent an invalid reply" for a server that answered
    -32000 "the database is read-only", which was left in `reason`, where a model rarely looks."""
    for prefix, what in (
        ("protocol error ", "error "),
        ("server error: ", "an internal error: "),
        ("unreadable reply: ", "a reply breakwater cannot read: "),
    ):
        if reason.startswith(prefix):
            said = reason[len(prefix) :]
            if len(said) > _MAX_UPSTREAM_TEXT:
                said = said[:_MAX_UPSTREAM_TEXT] + "…"
            return f"The tool's server answered the call with {what}{said.rstrip('.')}."
    return None


def not_ready_error(clock: Clock, upstream: Upstream, tool: str) -> CallError:
    """The refusal for a call to a server that is not ready: disabled, failed (and why), or on its way."""
    snap = upstream.snapshot()
    retry_after = None if snap.next_retry_at is None else max(0.0, snap.next_retry_at - clock.time())
    common: dict[str, Any] = {"server": upstream.spec.name, "tool": tool}
    if snap.state is ServerState.DISABLED:
        # Why: the config's own switch, or a value it names that cannot be had here (a variable not set).
        why = f" ({snap.disabled_by})" if snap.disabled_by else ""
        off = "is not started" if snap.off_here else "is disabled in the configuration"
        return ServerUnavailableError(
            f"The server {off}{why}; the call was not sent.",
            retryable=False,
            detail={"state": snap.state.value, "reason": "disabled"} | ({"disabled_by": snap.disabled_by} if why else {}),
            **common,
        )
    if snap.state is ServerState.FAILED:
        detail: dict[str, Any] = {"state": snap.state.value, "next_retry_at": iso(snap.next_retry_at)}
        message = "The server is not available right now; the call was not sent."
        if snap.error is not None:
            detail["reason"] = snap.error.code.value
            detail["reason_message"] = snap.error.message
            message = f"The server is not available ({snap.error.message}); the call was not sent."
        detail |= connecting_note(snap, clock.time())[1]  # since when, how many attempts
        return ServerUnavailableError(message, retry_after_s=retry_after, detail=detail, **common)
    # pending, connecting, retrying (or ready without a client for an instant): it is on its way.
    estimate = retry_after
    detail = {"state": snap.state.value, "connect_attempt": snap.attempt}
    late = None
    if estimate is None:
        estimate = snap.connect_ms / 1000 if snap.connect_ms else _DEFAULT_CONNECT_ESTIMATE_S
        if snap.attempt_started_at is not None:
            elapsed = max(0.0, clock.time() - snap.attempt_started_at)
            detail["connecting_for_s"] = round(elapsed, 1)
            if elapsed < estimate:
                estimate -= elapsed
            else:
                # Past its usual time, what is known is the attempt's own bound: "about 2 s" was said at 15 s.
                estimate = max(0.0, upstream.spec.connect.attempt_timeout_s - elapsed)
                # "Usual" only when there is a usual: a server's first start has none, and its time is not a delay.
                usual = ", longer than usual" if snap.connect_ms else ""
                late = f"The server has been starting up for {seconds_text(elapsed)}{usual}; the call was not sent."
    if snap.phase:
        detail["phase"] = snap.phase
    if snap.error is not None:
        detail["last_error"] = snap.error.message
    note, known = connecting_note(snap, clock.time())  # a server that keeps failing: since when
    return ServerConnectingError(note or late, retry_after_s=estimate, detail=detail | known, **common)


def _server_outcome(verdict: Verdict, tool_streak: int) -> Outcome:
    """What the server breaker learns from one attempt.

    Only failures that may mean the server itself is in trouble (timeouts, transport and protocol
    failures), and of those only a tool's first failure in a row, plus every lost connection. A
    single slow tool then costs the server breaker one failure per streak and its own breaker
    handles the rest, while a wedged server, where every tool fails, still trips it after a few
    calls instead of each tool paying its own timeouts first. A tool's own `isError` answer says
    the server is up, so it counts as a success.
    """
    if verdict.outcome is not FAILURE:
        return verdict.outcome
    if verdict.code not in _SERVER_FAILURE_CODES:
        return Outcome.SUCCESS
    if tool_streak == 0 or verdict.reason.startswith("connection"):
        return FAILURE
    return IGNORED


def _connection_closed(exc: BaseException) -> bool:
    """The connection is gone: closed, or an HTTP session the server no longer knows (it restarted)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_closed(e) for e in exc.exceptions)
    if not isinstance(exc, MCPError) or isinstance(exc, ServerReplyError):  # the server's answer: it is there
        return False
    cut = cut_info(exc.data)
    if cut is not None:
        # One HTTP request cut: the connection itself is fine unless the server could not be reached, or refused the
        # connection's credentials (a reconnect signs in again, or says that someone must).
        status = cut.get("status")
        return (status == 401 or cut.get("credentials") is True) if status is not None else cut.get("sent") is False
    return exc.code == _CONNECTION_CLOSED or (exc.code == types.INVALID_REQUEST and "session terminated" in exc.message.lower())
