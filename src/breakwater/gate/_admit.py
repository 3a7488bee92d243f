"""Step 2 of a call: may another attempt start? The turn budget, both breakers and the bulkhead decide.

In this order, each check only once the one before passed: the turn budget must cover at least a
minimal attempt (BUDGET_EXHAUSTED); after a lost answer the server must be back within the call's
window; the server breaker and the tool breaker must admit it (SERVER_CIRCUIT_OPEN, CIRCUIT_OPEN);
the server's bulkhead must have a free slot (OVERLOADED). These refusals send nothing and teach the
breakers nothing: a permit taken before a later check refuses is released without a verdict (a
half-open probe slot is freed at once), and local overload protection never feeds back into
upstream health.

The breakers are asked about a call's first attempt before its arguments are checked
(`breaker_refusal`, which takes nothing): a call an open breaker refuses is refused as such, without
paying for the check, and that refusal stands when the attempt comes to be admitted.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from breakwater.errors import (
    BudgetExhaustedError,
    CallError,
    CircuitOpenError,
    OverloadedError,
    ServerCircuitOpenError,
    refusal_error,
)
from breakwater.gate._breaker import BreakerState, Permit, Rejection
from breakwater.gate._breaker_types import CLOSED
from breakwater.gate._call import Call, GateContext, ServerRecord, ToolRecord, observe, stopped
from breakwater.gate._step_one import wait_for_server

__all__ = ["PROBE_LEASE_MARGIN_S", "Permits", "admit", "admit_after_loss", "breaker_refusal", "first_refusal", "take_permits"]

# A probe's lease must outlive its call, or a second probe would be let in while the first still runs.
PROBE_LEASE_MARGIN_S = 5.0
_tuple_new = tuple.__new__


class Permits(NamedTuple):
    """Leave from both breakers for one attempt (the bulkhead slot is taken as the attempt starts)."""

    server: Permit
    tool: Permit

    def release(self) -> None:
        """Give both back unused (nothing was sent): the server's first, then the tool's."""
        self.server.release()
        self.tool.release()


def admit(ctx: GateContext, call: Call) -> Permits:
    """Both permits for the next attempt; raises the refusal (journaled) or, after a failed attempt, why it stopped."""
    if call.budget is not None:  # most calls have no turn budget: no call to check one
        _check_budget(ctx, call)
    return take_permits(ctx, call)


async def admit_after_loss(ctx: GateContext, call: Call) -> Permits:
    """`admit`, after an answer was lost: the server must also be back within the call's window."""
    _check_budget(ctx, call)
    assert call.last is not None and call.window is not None
    # Its wait is the attempt's time: the attempt gets what the wait left of the call's timeout (`_step_one`).
    if not await wait_for_server(ctx.clock, call, call.window):
        # The answer was lost with the connection; re-sending needs the server back first.
        raise stopped(call.last, "the server did not come back within the call's window")
    return take_permits(ctx, call)


def _check_budget(ctx: GateContext, call: Call) -> None:
    budget = call.budget
    if budget is not None and not budget.can_start(call.needed_s):
        if call.last is not None:
            raise stopped(call.last, "the turn budget cannot cover another attempt")
        detail = {"budget_left_s": round(budget.remaining(), 3), "needed_s": call.needed_s}
        raise _refusal(ctx, call, BudgetExhaustedError, detail, 0)


def breaker_refusal(srv: ServerRecord, info: ToolRecord) -> tuple[bool, Rejection] | None:
    """How the breakers would refuse a call's first attempt now, taking nothing: (the server's breaker?, its rejection), or None.

    The server's breaker is asked first: its refusal is the one admission would give.
    """
    rejection = srv.breaker.rejection()
    if rejection is not None:
        return True, rejection
    rejection = info.breaker.rejection()
    return None if rejection is None else (False, rejection)


def first_refusal(ctx: GateContext, call: Call) -> CallError:
    """The refusal of `call.refusal` (the breakers' answer to the first attempt, decided before the arguments
    were checked), journaled; returned, so a caller that needs no exception raises none."""
    assert call.refusal is not None
    by_server, rejection = call.refusal
    call.refusal = None
    if by_server:
        return _server_refused(ctx, call, rejection)
    return _tool_refused(ctx, call, rejection, call.srv.breaker.admits_freely())


def take_permits(ctx: GateContext, call: Call) -> Permits:
    """Both permits for the next attempt, the turn budget checked already (or none): `admit`'s second step."""
    srv, info = call.srv, call.info
    if call.refusal is not None:
        raise first_refusal(ctx, call)
    lease_s = info.hard_s + PROBE_LEASE_MARGIN_S
    # A closed in-process server breaker would admit the attempt with an ordinary permit whose
    # return changes nothing: ask it after the tool's breaker, so an open tool breaker's refusal
    # (the cheap path it must be) takes no server permit at all. Any other server breaker first.
    server_permit = None if srv.breaker.admits_freely() else _server_permit(ctx, call, lease_s)
    tool_permit = info.breaker.acquire(info.call.slow_call_s, lease_s)
    if isinstance(tool_permit, Rejection):
        if server_permit is not None:
            server_permit.release()
        raise _tool_refused(ctx, call, tool_permit, server_permit is None)
    if server_permit is None:
        # Closed a moment ago (unless another thread moved it): `_server_permit`, inline (a frame per attempt).
        got = srv.breaker.acquire(None, lease_s)
        if isinstance(got, Rejection):
            refused = _server_refused(ctx, call, got)  # journaled before the tool's permit goes back, as it was
            tool_permit.release()
            raise refused
        server_permit = got
    # `Permits(...)` without the named tuple's `__new__`, a Python frame (~500 instructions per attempt).
    permits: Permits = _tuple_new(Permits, (server_permit, tool_permit))
    cap = srv.upstream.spec.call.max_in_flight
    if srv.in_flight >= cap:
        permits.release()
        raise _refusal(ctx, call, OverloadedError, {"in_flight": srv.in_flight, "max_in_flight": cap}, call.attempt)
    return permits


def _tool_refused(ctx: GateContext, call: Call, rejection: Rejection, server_closed: bool) -> CallError:
    # With the server's breaker closed the journal's row names both states without reading them again.
    states = (CLOSED, rejection.state) if server_closed else None
    detail: dict[str, Any] = {"breaker": rejection.state._value_, "reason": rejection.reason}
    usual = call.info.health.median()
    if usual is not None:
        detail["usual_s"] = round(usual, 3)
    return _refusal(ctx, call, CircuitOpenError, detail, call.attempt, rejection.retry_after_s, states)


def _server_permit(ctx: GateContext, call: Call, lease_s: float) -> Permit:
    permit = call.srv.breaker.acquire(None, lease_s)
    if isinstance(permit, Rejection):
        raise _server_refused(ctx, call, permit)
    return permit


def _server_refused(ctx: GateContext, call: Call, rejection: Rejection) -> CallError:
    detail = {"breaker": rejection.state._value_, "reason": rejection.reason}
    return _refusal(ctx, call, ServerCircuitOpenError, detail, call.attempt, rejection.retry_after_s, None)


def _refusal(
    ctx: GateContext,
    call: Call,
    cls: type[CallError],
    detail: dict[str, Any],
    attempt: int,
    retry_after_s: float | None = None,
    states: tuple[BreakerState, BreakerState] | None = None,
) -> CallError:
    """The refusal of the next attempt (nothing was sent), journaled; `attempt` is the attempts made so far
    (0 for a spent budget). `detail` is the error's own (made for it, keys not envelope keys)."""
    info = call.info
    err = refusal_error(cls, call.srv.name, info.name, retry_after_s, attempt, info.retry.max_attempts, call.op_id, detail)
    journal = call.journal
    if journal is not None:
        observe(ctx, call, cls.code, journal.sent + 1, 0.0, None, None, None, states)
    return err
