"""Redis restarts empty (no persistence, a failover) while a replica runs a call under an operation id: its retry on
another replica must wait for that call and get its answer, never run it a second time.

Real Redis of the test's own (killed and started again on the same port, empty), real records on both sides; the
call behind the gateway is ours (`Tool`). Replica A's renewals run on a `FakeClock`, so the test decides when A
renews, and can ask B in the window between the restart and A's next renewal.
"""

from __future__ import annotations

import uuid

import anyio
import mcp.types as types
import pytest
import redis

from breakwater._clock import SystemClock
from breakwater._wire import REPLAYED_META_KEY
from breakwater.config import StatePolicy
from breakwater.gateway._operations import answer_once
from breakwater.state._operations import OperationRecords
from breakwater.testing import FakeClock
from helpers import OwnRedis

pytestmark = pytest.mark.anyio

#: How long claims wait after Redis lost its records (shorter than a lease, so that the test is short).
SETTLE_S = 0.8


class Tool:
    """The call behind the gateway: counts its runs, waits to be let go."""

    def __init__(self) -> None:
        self.runs = 0
        self.release = anyio.Event()
        self.started = anyio.Event()

    async def __call__(self) -> types.CallToolResult:
        self.runs += 1
        self.started.set()
        await self.release.wait()
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"placed {self.runs}")])


async def ask(records: OperationRecords, tool: Tool, op: str) -> types.CallToolResult:
    return await answer_once(
        records,
        op_id=op,
        server="shop",
        tool="order",
        arguments={"item": "tea"},
        server_deduplicates=False,
        window_s=30,
        run=tool,
    )


def replicas(server: OwnRedis, clock: FakeClock) -> tuple[OperationRecords, OperationRecords]:
    """A (renewing on `clock`) and B (real time) over a namespace Redis already knows (no settling at the start)."""
    policy = StatePolicy(url=server.url, namespace=f"bwtest-{uuid.uuid4().hex[:10]}", timeout_s=0.5)
    redis.Redis.from_url(server.url).set(f"{policy.namespace}:ops-live", "1")
    a = OperationRecords(policy, ttl_s=60, clock=clock, settle_s=SETTLE_S)
    return a, OperationRecords(policy, ttl_s=60, clock=SystemClock(), settle_s=SETTLE_S)


async def test_a_retry_right_after_redis_restarted_empty_waits_for_the_running_call_and_replays_it(
    own_redis: OwnRedis,
) -> None:
    """Before: B found no record, claimed the id and ran the call again (two runs). Now A's next renewal writes its
    record back, and B, asking before that renewal, waits (Redis lost its records: `ops-settling`) instead of
    claiming."""
    clock = FakeClock()
    a, b = replicas(own_redis, clock)
    tool, op = Tool(), uuid.uuid4().hex
    answers: list[types.CallToolResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.keep_alive)
        await clock.wait_for_sleepers()

        async def first() -> None:
            answers.append(await ask(a, tool, op))

        tg.start_soon(first)
        await tool.started.wait()
        own_redis.kill()
        own_redis.start()  # empty: the record of A's running call is gone, and A's lease with it

        async def retry() -> None:
            answers.append(await ask(b, tool, op))

        tg.start_soon(retry)
        await anyio.sleep(0.3)  # B asked, before A's next renewal
        assert tool.runs == 1
        clock.advance(0.5)  # A renews: its lease, and the record of the call it runs
        await clock.wait_for_sleepers()
        assert a.running == 1
        await anyio.sleep(SETTLE_S)  # B is past the settling: it finds A's record (without it, it ran the call)
        assert tool.runs == 1
        tool.release.set()
        with anyio.fail_after(10):
            while len(answers) < 2:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert tool.runs == 1
    first_answer, retried = answers
    assert retried.content == first_answer.content and (retried.meta or {})[REPLAYED_META_KEY] is True
    await a.aclose()
    await b.aclose()


async def test_what_a_replica_could_not_write_while_redis_was_down_is_written_when_it_is_back(
    own_redis: OwnRedis,
) -> None:
    """A call claimed while Redis is down, and an answer that could not be stored, are written at the next renewal
    once Redis answers: a retry then waits for the call, or gets its answer (before: it ran the call again)."""
    clock = FakeClock()
    a, b = replicas(own_redis, clock)
    unrecorded, answered = Tool(), Tool()
    ops = [uuid.uuid4().hex, uuid.uuid4().hex]
    answers: dict[str, types.CallToolResult] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.keep_alive)
        await clock.wait_for_sleepers()

        async def on(records: OperationRecords, tool: Tool, op: str, name: str) -> None:
            answers[name] = await ask(records, tool, op)

        tg.start_soon(on, a, answered, ops[1], "answered")
        await answered.started.wait()
        own_redis.kill()
        tg.start_soon(on, a, unrecorded, ops[0], "unrecorded")  # Redis cannot be asked: runs unrecorded
        await unrecorded.started.wait()
        answered.release.set()  # its answer cannot be stored
        with anyio.fail_after(10):
            while "answered" not in answers:
                await anyio.sleep(0.01)
        own_redis.start()
        clock.advance(0.5)
        await clock.wait_for_sleepers()
        replayed = await ask(b, answered, ops[1])
        assert (replayed.meta or {})[REPLAYED_META_KEY] is True and replayed.content == answers["answered"].content
        tg.start_soon(on, b, unrecorded, ops[0], "retried")
        await anyio.sleep(0.3)
        unrecorded.release.set()
        with anyio.fail_after(10):
            while "retried" not in answers:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert unrecorded.runs == 1 and answered.runs == 1
    assert (answers["retried"].meta or {})[REPLAYED_META_KEY] is True
    await a.aclose()
    await b.aclose()
