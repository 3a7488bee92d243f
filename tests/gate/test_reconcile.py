"""Reconciliation after a lost answer: the gate asks `get_operation` before it re-sends anything.

The decision table runs on the fake clock against a scripted client (waits and windows checked
exactly); the end-to-end cases run `examples/orders_server.py` as a real process, with its order
book and payment-request log as the count of side effects.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater.config import BreakerPolicy, CallPolicy, RetryPolicy, ToolSettings
from breakwater.connect._admission import Admission
from breakwater.connect._upstream import Upstream
from breakwater.gate._gate import GET_OPERATION_TOOL, OPERATION_ID_META_KEY, CallGate
from breakwater.gate._turn_budget import turn_budget
from breakwater.testing import FakeClock, ScriptedCall, ScriptedServer, in_memory

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_server.py"
ORDER = {"customer": "ann", "item": "espresso", "quantity": 2}

# ---------------------------------------------------------------------------- scripted server

Script = Callable[[str, dict[str, Any], Any], Awaitable[CallToolResult]]


def receipt(order_id: str = "ord_1") -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=order_id)], structured_content={"order_id": order_id})


def status(state: str, **extra: Any) -> CallToolResult:
    body = {"operation_id": "x", "state": state, **extra}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))], structured_content=body)


def server_error(code: str, *, retryable: bool, retry_after_s: float | None = None) -> CallToolResult:
    body = {"ok": False, "code": code, "retryable": retryable, "retry_after_s": retry_after_s, "message": code}
    return CallToolResult(content=[TextContent(type="text", text=code)], structured_content=body, is_error=True)


def tools(*, get_operation: bool = True, never: bool = False) -> list[Tool]:
    hints = ToolAnnotations(destructive_hint=True) if never else ToolAnnotations(idempotent_hint=True)
    listed = [Tool(name="place_order", input_schema={"type": "object"}, annotations=hints)]
    if get_operation:
        listed.append(
            Tool(name=GET_OPERATION_TOOL, input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))
        )
    return listed


#: Re-sending after a lost answer is tested with timeouts standing for the loss, so they are retried here.
RESEND_TIMEOUTS = RetryPolicy(backoff_base_s=0.1, backoff_cap_s=0.4, retry_timeouts=True)


#: The upstreams `make_gate` built on each clock: `drive` connects them for the time of its call.
_UPSTREAMS: weakref.WeakKeyDictionary[FakeClock, list[Upstream]] = weakref.WeakKeyDictionary()
#: Set when an upstream's connection is up (its state changed to ready with a client).
_CONNECTED: weakref.WeakKeyDictionary[Upstream, anyio.Event] = weakref.WeakKeyDictionary()


def _on_change(upstream: Upstream) -> None:
    if upstream.state is ServerState.READY and upstream.client is not None and upstream in _CONNECTED:
        _CONNECTED[upstream].set()


def make_gate(clock: FakeClock, script: Script, listed: list[Tool], **spec_kw: Any) -> tuple[CallGate, ScriptedServer]:
    """A real gate and supervisor in front of an in-process server that lists `listed` and answers with `script`."""
    spec_kw.setdefault("breaker", BreakerPolicy(consecutive_failures=1000, failure_rate=1.0))
    spec_kw.setdefault("retry", RetryPolicy(backoff_base_s=0.1, backoff_cap_s=0.4))
    spec_kw.setdefault("call", CallPolicy(timeout_s=1.0, max_s=30.0))
    spec_kw.setdefault("connect", ConnectPolicy(startup_jitter_s=0, health_interval_s=0))
    spec = ServerSpec(name="s", transport="stdio", command="unused", **spec_kw)

    async def answer(call: ScriptedCall, _n: int, _progress: Any) -> CallToolResult:
        return await script(call.name, call.arguments, call.meta)

    server = ScriptedServer(listed, answer)
    # The supervisor draws from its own generator, so the gate's jitter draws are the ones they always were.
    connect_rng = random.Random(0)
    upstream = Upstream(
        spec,
        clock=clock,
        rng=connect_rng,
        admission=Admission(clock=clock, rng=connect_rng, directory=None),
        transports=in_memory(server.server),
        on_change=_on_change,
    )
    _UPSTREAMS.setdefault(clock, []).append(upstream)
    return CallGate({"s": upstream}, clock=clock, rng=random.Random(7)), server


async def drive(clock: FakeClock, fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run `fn` on the fake clock with the servers connected, jumping time whenever every task is blocked."""

    async def connected() -> Any:
        async with anyio.create_task_group() as tg:
            for upstream in _UPSTREAMS.get(clock, []):
                # Not `ready_event`: it is still set from the connection the previous drive closed.
                _CONNECTED[upstream] = anyio.Event()
                tg.start_soon(upstream.run)
                await _CONNECTED[upstream].wait()
            result = await fn()
            tg.cancel_scope.cancel()
        return result

    return await clock.run(connected)


def lost_first(after: Callable[[str, int], CallToolResult]) -> Script:
    """The first place_order hangs past its timeout; everything after is answered by `after(name, n)`."""
    seen: dict[str, int] = {}

    async def script(name: str, _args: dict[str, Any], _meta: Any) -> CallToolResult:
        seen[name] = seen.get(name, 0) + 1
        if name == "place_order" and seen[name] == 1:
            await anyio.sleep_forever()
        return after(name, seen[name])

    return script


def envelope(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error and isinstance(result.structured_content, dict), result
    return result.structured_content


# ---------------------------------------------------------------------------- decision table (fake clock)


async def test_first_attempt_success_costs_one_round_trip() -> None:
    """The hot path: no get_operation, one call, the id in _meta."""
    clock = FakeClock()

    async def ok(_n: str, _a: dict[str, Any], _m: Any) -> CallToolResult:
        return receipt()

    gate, client = make_gate(clock, ok, tools())
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    assert not result.is_error
    assert client.names() == ["place_order"]
    assert OPERATION_ID_META_KEY in client.calls[0][2]


async def test_completed_operation_returns_the_stored_result_without_resending() -> None:
    """Timeout → get_operation says completed → its stored result is the answer; place_order is not re-sent."""
    clock = FakeClock()
    stored = receipt("ord_stored").model_dump(mode="json", by_alias=True, exclude_none=True)
    gate, client = make_gate(clock, lost_first(lambda _n, _i: status("completed", result=stored)), tools())
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    assert not result.is_error and result.structured_content == {"order_id": "ord_stored"}
    assert client.names() == ["place_order", GET_OPERATION_TOOL]
    op = client.calls[0][2][OPERATION_ID_META_KEY]
    assert client.calls[1][1] == {"operation_id": op}


async def test_running_operation_is_polled_at_its_hint_until_it_completes() -> None:
    """executing → wait (the hint is a floor) → ask again → completed."""
    clock = FakeClock()
    stored = receipt().model_dump(mode="json", by_alias=True, exclude_none=True)
    asked_at: list[float] = []

    def after(name: str, n: int) -> CallToolResult:
        asked_at.append(clock.monotonic())
        return status("executing", retry_after_s=1.5) if n < 3 else status("completed", result=stored)

    gate, client = make_gate(clock, lost_first(after), tools())
    t0 = clock.monotonic()
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    assert not result.is_error
    assert client.names() == ["place_order"] + [GET_OPERATION_TOOL] * 3
    assert asked_at[0] - t0 == pytest.approx(1.0)  # right after the 1 s timeout
    assert all(b - a >= 1.5 for a, b in itertools.pairwise(asked_at))


async def test_not_found_reissues_with_the_same_operation_id() -> None:
    """Nothing under the id (the request never arrived): send it again, same id."""
    clock = FakeClock()
    gate, client = make_gate(
        clock,
        lost_first(lambda n, _i: status("not_found") if n == GET_OPERATION_TOOL else receipt()),
        tools(),
        retry=RESEND_TIMEOUTS,
    )
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    assert not result.is_error
    assert client.names() == ["place_order", GET_OPERATION_TOOL, "place_order"]
    assert client.calls[0][2] == client.calls[2][2]


async def test_timed_out_operation_not_found_is_not_resent_by_default() -> None:
    """A timeout is asked about (it may have run) but not sent again to the slow tool unless retry_timeouts says so."""
    clock = FakeClock()
    gate, client = make_gate(
        clock, lost_first(lambda n, _i: status("not_found") if n == GET_OPERATION_TOOL else receipt()), tools()
    )
    body = envelope(await drive(clock, lambda: gate.call("s", "place_order", ORDER)))
    assert body["code"] == "TIMEOUT" and body["operation_state"] == "not_found"
    assert "not retried" in body["retry_stopped"]
    assert client.names() == ["place_order", GET_OPERATION_TOOL]


async def test_failed_operation_returns_its_stored_error_not_retried() -> None:
    clock = FakeClock()
    failure = {"kind": "tool_error", "message": "card declined"}
    gate, client = make_gate(clock, lost_first(lambda _n, _i: status("failed", error=failure)), tools())
    body = envelope(await drive(clock, lambda: gate.call("s", "place_order", ORDER)))
    assert body["code"] == "TOOL_ERROR" and body["retryable"] is False
    assert body["operation_state"] == "failed" and body["operation_id"] == client.calls[0][2][OPERATION_ID_META_KEY]
    assert client.names() == ["place_order", GET_OPERATION_TOOL]


async def test_unknown_operation_is_outcome_unknown_with_the_id() -> None:
    clock = FakeClock()
    gate, client = make_gate(clock, lost_first(lambda _n, _i: status("unknown", reason="lease_expired")), tools())
    body = envelope(await drive(clock, lambda: gate.call("s", "place_order", ORDER)))
    assert body["code"] == "OUTCOME_UNKNOWN" and body["retryable"] is False
    assert body["operation_id"] == client.calls[0][2][OPERATION_ID_META_KEY]
    assert body["reason"] == "lease_expired"
    assert client.names() == ["place_order", GET_OPERATION_TOOL]


async def test_operation_still_running_when_the_budget_ends_reports_the_timeout() -> None:
    """The turn budget bounds the waiting; the answer says why it stopped and what state was last seen."""
    clock = FakeClock()
    gate, client = make_gate(clock, lost_first(lambda _n, _i: status("executing", retry_after_s=1.0)), tools())

    async def in_budget() -> CallToolResult:
        with turn_budget(5.0, clock=clock):
            result = await gate.call("s", "place_order", ORDER)
        return result

    t0 = clock.monotonic()
    body = envelope(await drive(clock, in_budget))
    assert body["code"] == "TIMEOUT" and body["operation_state"] == "executing"
    assert "still running" in body["retry_stopped"]
    assert clock.monotonic() - t0 <= 5.0
    assert client.names().count("place_order") == 1


async def test_unanswered_question_falls_back_to_reissuing_the_same_id() -> None:
    """get_operation itself failing proves nothing: re-send the same id (the server deduplicates)."""
    clock = FakeClock()

    def after(name: str, _n: int) -> CallToolResult:
        if name == GET_OPERATION_TOOL:
            raise MCPError(-32603, "store down")
        return receipt()

    gate, client = make_gate(clock, lost_first(after), tools(), retry=RESEND_TIMEOUTS)
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    assert not result.is_error
    assert client.names() == ["place_order", GET_OPERATION_TOOL, "place_order"]


async def test_question_that_outlasts_its_deadline_falls_back_to_reissuing_the_same_id() -> None:
    """get_operation hanging past its share of the time is an unanswered question, not a crash of the call."""
    clock = FakeClock()

    async def script(name: str, _args: dict[str, Any], _meta: Any) -> CallToolResult:
        calls = [n for n, *_ in client.calls]
        if calls.count(name) == 1:  # the first place_order and the first question both hang
            await anyio.sleep_forever()
        return receipt()

    gate, client = make_gate(clock, script, tools(), retry=RESEND_TIMEOUTS)
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    assert not result.is_error, result
    assert client.names()[:3] == ["place_order", GET_OPERATION_TOOL, "place_order"]


async def test_in_progress_reply_is_waited_on_not_counted_as_a_failure() -> None:
    """Without get_operation, OPERATION_IN_PROGRESS is re-sent with the same id after its hint, not as a failure."""
    clock = FakeClock()
    sent_at: list[float] = []

    async def script(_n: str, _a: dict[str, Any], _m: Any) -> CallToolResult:
        sent_at.append(clock.monotonic())
        if len(sent_at) <= 4:
            return server_error("OPERATION_IN_PROGRESS", retryable=True, retry_after_s=2.0)
        return receipt()

    gate, client = make_gate(clock, script, tools(get_operation=False), retry=RetryPolicy(max_attempts=2, backoff_base_s=0.1))
    result = await drive(clock, lambda: gate.call("s", "place_order", ORDER))
    # Four "in progress" replies did not use up max_attempts=2.
    assert not result.is_error and len(client.calls) == 5
    assert len({str(c[2]) for c in client.calls}) == 1
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(sent_at))
    assert all(b.failures_in_window == 0 for b in gate.breaker_snapshots())


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        # The server refused the id: nothing ran, as the fleet record's refusal says (it read TOOL_ERROR, a tool's failure).
        ("OPERATION_MISMATCH", "INVALID_ARGUMENTS"),
        ("INVALID_OPERATION_ID", "INVALID_ARGUMENTS"),
        ("OPERATION_OUTCOME_UNKNOWN", "OUTCOME_UNKNOWN"),
    ],
)
async def test_final_idempotency_replies_are_not_retried(reply: str, code: str) -> None:
    clock = FakeClock()

    async def script(_n: str, _a: dict[str, Any], _m: Any) -> CallToolResult:
        return server_error(reply, retryable=False)

    gate, client = make_gate(clock, script, tools())
    body = envelope(await drive(clock, lambda: gate.call("s", "place_order", ORDER)))
    assert body["code"] == code and body["retryable"] is False and body["operation_id"]
    assert client.names() == ["place_order"]
    if code == "INVALID_ARGUMENTS":
        assert body.get("reason") == reply.lower(), body
        assert all(b.failures_in_window == 0 for b in gate.breaker_snapshots())


async def test_never_tool_is_not_retried_nor_reconciled() -> None:
    """A cut `never` call: OUTCOME_UNKNOWN naming its operation id and where to check it."""
    clock = FakeClock()
    gate, client = make_gate(clock, lost_first(lambda _n, _i: receipt()), tools(never=True))
    body = envelope(await drive(clock, lambda: gate.call("s", "place_order", ORDER)))
    assert body["code"] == "OUTCOME_UNKNOWN"
    assert body["operation_id"] == client.calls[0][2][OPERATION_ID_META_KEY]
    assert GET_OPERATION_TOOL in body["check_with"]
    assert client.names() == ["place_order"]


# ---------------------------------------------------------------------------- real processes

FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.05, backoff_cap_s=0.3, budget_s=30, attempt_timeout_s=15)


def orders_spec(tmp_path: Path, *flags: str, **tool_settings: ToolSettings) -> ServerSpec:
    args = (str(EXAMPLE), "--data", str(tmp_path / "data"), "--db", str(tmp_path / "ops.sqlite3"), *flags)
    return ServerSpec(
        name="orders",
        transport="stdio",
        command=sys.executable,
        args=args,
        connect=FAST_CONNECT,
        call=CallPolicy(timeout_s=0.5, max_s=20.0),
        retry=RetryPolicy(backoff_base_s=0.05, backoff_cap_s=0.2),
        tools=tool_settings,
    )


@asynccontextmanager
async def gate(tmp_path: Path, spec: ServerSpec) -> AsyncIterator[Breakwater]:
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission") as bw:
        report = await bw.wait_ready(timeout=30)
        assert all(s.state is ServerState.READY for s in report.servers), report.to_json()
        yield bw


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_real_timeout_reconciles_to_the_one_real_receipt(tmp_path: Path) -> None:
    """The payment API takes 1.5 s, the timeout is 0.5 s: the call still returns the receipt of the one order."""
    spec = orders_spec(tmp_path, "--payment-delay-s", "1.5", "--finish-on-cancel")
    async with gate(tmp_path, spec) as bw:
        result = await bw.call_tool("orders", "place_order", ORDER)
    assert not result.is_error, result
    orders = lines(tmp_path / "data" / "orders.jsonl")
    assert len(orders) == 1 and len(lines(tmp_path / "data" / "payment-requests.jsonl")) == 1
    assert result.structured_content is not None and result.structured_content["order_id"] == orders[0]["order_id"]


async def test_real_cancelled_run_is_outcome_unknown_and_not_rerun(tmp_path: Path) -> None:
    """Without finish_on_cancel the timed-out run is interrupted: the server records `unknown`, the gate says so."""
    async with gate(tmp_path, orders_spec(tmp_path, "--payment-delay-s", "1.5")) as bw:
        body = envelope(await bw.call_tool("orders", "place_order", ORDER))
        assert body["code"] == "OUTCOME_UNKNOWN" and body["operation_id"]
        answer = await bw.call_tool("orders", "get_operation", {"operation_id": body["operation_id"]})
        assert answer.structured_content is not None and answer.structured_content["state"] == "unknown"
    assert lines(tmp_path / "data" / "orders.jsonl") == []


async def test_real_never_tool_times_out_to_outcome_unknown_once(tmp_path: Path) -> None:
    never = ToolSettings(call=CallPolicy(timeout_s=0.5, retry="never"), retry=RetryPolicy(), explicit=frozenset({"retry"}))
    spec = orders_spec(tmp_path, "--payment-delay-s", "1.0", "--finish-on-cancel", place_order=never)
    async with gate(tmp_path, spec) as bw:
        body = envelope(await bw.call_tool("orders", "place_order", ORDER))
        assert body["code"] == "OUTCOME_UNKNOWN" and body["attempt"] == 1 and body["operation_id"]
        await anyio.sleep(1.5)  # the shielded run finishes on the server
        answer = await bw.call_tool("orders", "get_operation", {"operation_id": body["operation_id"]})
        assert answer.structured_content is not None and answer.structured_content["state"] == "completed"
    assert len(lines(tmp_path / "data" / "orders.jsonl")) == 1


async def test_a_refused_operation_id_fits_the_tools_output_schema_and_reads_as_a_refusal(tmp_path: Path) -> None:
    """`place_order` declares an output schema (a Receipt): the server's refusal kept its envelope in the structured
    content, which the TypeScript SDK's clients check against the schema even in an error. It is under `_meta` now,
    and the gate still reads it: the same id for another order is INVALID_ARGUMENTS, nothing run."""
    async with gate(tmp_path, orders_spec(tmp_path)) as bw:
        first = await bw.call_tool("orders", "place_order", ORDER, operation_id="op-receipt-1")
        assert not first.is_error, first
        other = await bw.call_tool("orders", "place_order", {**ORDER, "quantity": 9}, operation_id="op-receipt-1")
        body = envelope(other)
        assert (body["code"], body["reason"]) == ("INVALID_ARGUMENTS", "operation_mismatch"), body
    assert len(lines(tmp_path / "data" / "orders.jsonl")) == 1


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and "orders_server.py" in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the server process through /proc")
async def test_real_server_killed_mid_call_is_asked_after_its_restart(tmp_path: Path) -> None:
    """SIGKILL mid-call: breakwater restarts the server and reports the dead owner's call as unknown, not re-run."""
    spec = orders_spec(tmp_path, "--payment-delay-s", "2.0", "--lease-s", "1.0")
    async with gate(tmp_path, spec) as bw:

        async def kill_soon() -> None:
            await anyio.sleep(0.3)
            for pid in _pids_with(str(tmp_path)):
                os.kill(pid, signal.SIGKILL)  # the example server this test started, nothing else

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            body = envelope(await bw.call_tool("orders", "place_order", ORDER, timeout=5.0))
        # Asked (get_operation) or re-sent with the same id: either way the server's record answers,
        # and the dead owner's call is reported, never run again.
        assert body["code"] == "OUTCOME_UNKNOWN" and body["operation_id"]
        answer = await bw.call_tool("orders", "get_operation", {"operation_id": body["operation_id"]})
        assert answer.structured_content is not None and answer.structured_content["state"] == "unknown"
        assert answer.structured_content["reason"] == "lease_expired"
    assert lines(tmp_path / "data" / "orders.jsonl") == []
    assert lines(tmp_path / "data" / "payment-requests.jsonl") == []
