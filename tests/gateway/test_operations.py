"""What a replica answers for a call whose client-chosen operation id the fleet has seen: records in the machine's Redis.

`answer_once` is given the call to run as a function (ours); the records, the leases and the races are real Redis.
The fleet test (`test_fleet.py`) shows the same end to end with `kill -9`.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp.types as types
import pytest

from breakwater._clock import SystemClock
from breakwater._wire import REPLAYED_META_KEY
from breakwater.config import StatePolicy
from breakwater.errors import ServerConnectingError
from breakwater.gate._envelope import error_result
from breakwater.gateway._operations import answer_once
from breakwater.state._operations import OperationRecords
from helpers import REDIS_URL

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_available")]


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[OperationRecords, OperationRecords]]:
    """Two replicas' records over one fresh namespace; each renews its lease while the test runs."""
    policy = StatePolicy(url=REDIS_URL, namespace=f"bwtest-{uuid.uuid4().hex[:10]}", timeout_s=0.5)
    import redis

    # Redis has the namespace's records already: no claim waits for replicas to write theirs back (a fresh namespace
    # looks like a Redis that lost them; test_operations_redis_restart.py is about that).
    redis.Redis.from_url(REDIS_URL).set(f"{policy.namespace}:ops-live", "1", px=60_000)
    a = OperationRecords(policy, ttl_s=60, clock=SystemClock())
    b = OperationRecords(policy, ttl_s=60, clock=SystemClock())
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.keep_alive)
        tg.start_soon(b.keep_alive)
        try:
            yield a, b
        finally:
            tg.cancel_scope.cancel()
            client = redis.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(f"{policy.namespace}:*"))
            if keys:
                client.delete(*keys)
            await a.aclose()
            await b.aclose()


class Tool:
    """The call behind the gateway: counts its runs, optionally waits to be let go."""

    def __init__(self, result: types.CallToolResult | None = None) -> None:
        self.runs = 0
        self.release = anyio.Event()
        self.started = anyio.Event()
        self.wait = False
        self.result = result or types.CallToolResult(content=[types.TextContent(type="text", text="placed")])

    async def __call__(self) -> types.CallToolResult:
        self.runs += 1
        self.started.set()
        if self.wait:
            await self.release.wait()
        return self.result


async def ask(
    records: OperationRecords, tool: Tool, op: str, *, args: Any = None, dedup: bool = False, window: float = 10
) -> Any:
    return await answer_once(
        records,
        op_id=op,
        server="shop",
        tool="order",
        arguments=args if args is not None else {"item": "tea"},
        server_deduplicates=dedup,
        window_s=window,
        run=tool,
    )


def code(result: types.CallToolResult) -> tuple[str | None, str | None]:
    data = result.structured_content or {}
    return data.get("code"), data.get("reason")


async def test_a_finished_call_is_replayed_on_any_replica_and_never_run_again(
    fleet: tuple[OperationRecords, OperationRecords],
) -> None:
    a, b = fleet
    tool, op = Tool(), uuid.uuid4().hex
    first = await ask(a, tool, op)
    again = await ask(b, tool, op)
    assert tool.runs == 1
    assert again.content == first.content and (again.meta or {})[REPLAYED_META_KEY] is True
    # The same id for another call is refused, and runs nothing.
    assert code(await ask(b, tool, op, args={"item": "coffee"})) == ("INVALID_ARGUMENTS", "operation_mismatch")
    assert tool.runs == 1


async def test_a_retry_waits_for_the_call_a_live_replica_runs_and_gets_its_answer(
    fleet: tuple[OperationRecords, OperationRecords],
) -> None:
    a, b = fleet
    tool, op = Tool(), uuid.uuid4().hex
    tool.wait = True
    answers: list[types.CallToolResult] = []
    async with anyio.create_task_group() as tg:

        async def first() -> None:
            answers.append(await ask(a, tool, op))

        tg.start_soon(first)
        await tool.started.wait()
        # Past a short window the retry says the call is still running, retryably, and runs nothing.
        still = await ask(b, tool, op, window=0.3)
        assert code(still) == ("OUTCOME_UNKNOWN", "running_elsewhere") and (still.structured_content or {})["retryable"]

        async def let_go() -> None:
            await anyio.sleep(0.3)
            tool.release.set()

        tg.start_soon(let_go)
        waited = await ask(b, tool, op)
    assert tool.runs == 1
    assert waited.content == answers[0].content and (waited.meta or {})[REPLAYED_META_KEY] is True


async def test_a_dead_replicas_call_is_outcome_unknown_or_taken_over_once_where_the_server_deduplicates(
    fleet: tuple[OperationRecords, OperationRecords],
) -> None:
    a, b = fleet
    policy = StatePolicy(url=REDIS_URL, namespace=a._ops.split(":")[0], timeout_s=0.5)
    dead = OperationRecords(policy, ttl_s=60, clock=SystemClock())  # claims, and never renews a lease
    tool = Tool()
    ops = [uuid.uuid4().hex, uuid.uuid4().hex]
    from breakwater.gateway._operations import fingerprint

    for op in ops:
        claimed, _, _ = await dead.claim(op, fingerprint("shop", "order", {"item": "tea"}))
        assert claimed
    await dead.aclose()
    # A tool the server does not deduplicate: the call may have run, so it is not run again.
    lost = await ask(a, tool, ops[0])
    assert code(lost) == ("OUTCOME_UNKNOWN", "replica_lost") and (lost.structured_content or {})["operation_id"] == ops[0]
    # One the server deduplicates (idempotent): sent again under the same id, by exactly one of two retries.
    results: list[types.CallToolResult] = []
    async with anyio.create_task_group() as tg:
        for records in (a, b):

            async def retry(records: OperationRecords = records) -> None:
                results.append(await ask(records, tool, ops[1], dedup=True))

            tg.start_soon(retry)
    assert tool.runs == 1
    assert sorted(bool((r.meta or {}).get(REPLAYED_META_KEY)) for r in results) == [False, True]


async def test_a_call_refused_before_it_was_sent_leaves_no_record_and_a_cancelled_one_is_unknown(
    fleet: tuple[OperationRecords, OperationRecords],
) -> None:
    a, b = fleet
    op = uuid.uuid4().hex
    refused = Tool(error_result(ServerConnectingError("shop is connecting", server="shop", tool="order")))
    assert code(await ask(a, refused, op)) == ("SERVER_CONNECTING", None)
    ran = Tool()
    assert not (await ask(b, ran, op)).is_error and ran.runs == 1  # nothing had been sent: the retry runs it

    op = uuid.uuid4().hex
    hung = Tool()
    hung.wait = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, a, hung, op)
        await hung.started.wait()
        tg.cancel_scope.cancel()
    retried = await ask(b, Tool(), op)
    assert code(retried) == ("OUTCOME_UNKNOWN", "cancelled") and hung.runs == 1


async def test_a_lease_that_cannot_be_renewed_is_said_at_the_1st_and_the_10th_failure_not_every_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis unreachable: the warning came once a second for as long as it lasted (86,000 lines a day)."""
    from breakwater.testing import FakeClock

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    clock = FakeClock()
    records = OperationRecords(StatePolicy(url=f"redis://127.0.0.1:{closed}", timeout_s=0.5), ttl_s=60, clock=clock)
    caplog.set_level(logging.WARNING, logger="breakwater")
    async with anyio.create_task_group() as tg:
        tg.start_soon(records.keep_alive)
        for _ in range(12):  # twelve renewals, each refused
            await clock.wait_for_sleepers()
            clock.advance(1.0)
        await clock.wait_for_sleepers()
        tg.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "lease" in r.getMessage()]
    assert len(said) == 2 and "1 in a row" in said[0] and "10 in a row" in said[1], said
