"""The stream log of resumable SSE streams, unit-sized: bounds and TTL (the fake clock), replay and follow, a lost owner.

`SessionStreams` is the `EventStore` the gateway gives each 2025-11-25 session's transport
(`breakwater.gateway._resume`); here it is driven as the SDK's router and the lazy POST path drive it.
The Redis log runs against the machine's Redis under a namespace of its own. The HTTP end to end
(a cut stream resumed on the same replica, and on another one) is in tests/gateway/test_resume_fleet.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
from mcp.server.streamable_http import EventMessage
from mcp_types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

from breakwater.config import StatePolicy
from breakwater.gateway._resume import ResumableStreams, SessionStreams, parse_event_id
from breakwater.state._streams import MemoryStreamLog, RedisStreamLog, StreamLog
from breakwater.testing import FakeClock
from helpers import REDIS_URL

pytestmark = pytest.mark.anyio

OP = "op-7f3a"


def _request(request_id: int = 7, tool: str = "shop__order") -> JSONRPCRequest:
    params = {"name": tool, "arguments": {}, "_meta": {"io.breakwater/operationId": OP}}
    return JSONRPCRequest(jsonrpc="2.0", id=request_id, method="tools/call", params=params)


def _progress(n: int) -> JSONRPCNotification:
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params={"progressToken": "p", "progress": n})


def _answer(request_id: int = 7) -> JSONRPCResponse:
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result={"content": [], "structuredContent": {"ok": True}})


def _spawn_nothing(task: Callable[[], Awaitable[None]]) -> None:
    return None


class Owner:
    """One session's streams on one replica, and whether the replica still runs its calls."""

    def __init__(self, log: StreamLog, clock: FakeClock, *, session: str = "s1", spawn: Any = _spawn_nothing) -> None:
        self.alive = True
        self.streams = ResumableStreams(log, clock=clock, ttl_s=60)
        self.view = SessionStreams(self.streams, session, alive=lambda: self.alive, spawn=spawn)


async def _replay(view: SessionStreams, last_event_id: str, got: list[EventMessage] | None = None) -> list[EventMessage]:
    """What a reconnect with `last_event_id` is sent (into `got` as it comes, when given)."""
    got = [] if got is None else got

    async def send(event: EventMessage) -> None:
        got.append(event)

    assert await view.replay_events_after(last_event_id, send) is None
    return got


def _progress_of(events: list[EventMessage]) -> list[Any]:
    return [e.message.params["progress"] for e in events if isinstance(e.message, JSONRPCNotification) and e.message.params]


async def test_a_call_answered_as_one_json_body_writes_nothing() -> None:
    clock = FakeClock()
    log = MemoryStreamLog(events=100, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    assert owner.view.open("7")
    first = await owner.view.store_event("7", _answer())
    assert parse_event_id(first) == ("7", 2)
    owner.view.discard("7")
    assert len(log) == 0
    # Events of streams nobody opened (the GET stream, initialize) get no id at all.
    assert await owner.view.store_event("_GET_stream", _progress(1)) == ""
    assert await owner.view.store_event("0", None) == ""


async def test_a_committed_stream_replays_what_was_missed_then_follows_to_the_answer() -> None:
    clock = FakeClock()
    log = MemoryStreamLog(events=100, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    owner.view.open("7")
    lead = await owner.view.store_event("7", _progress(1))  # before the commit: kept in memory only
    priming = await owner.view.commit(_request())
    assert priming == {"id": "1/7", "data": ""} and lead == "2/7"
    await owner.view.store_event("7", _progress(2))
    # A client cut after the lead event reconnects (here: another session view on the same log, as a new GET is).
    reader = Owner(log, clock)
    events: list[EventMessage] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_replay, reader.view, lead, events)
        await anyio.wait_all_tasks_blocked()
        assert _progress_of(events) == [2]  # the missed one, at once; the follower now waits
        await owner.view.store_event("7", _progress(3))
        await owner.view.store_event("7", _answer())
    assert _progress_of(events) == [2, 3]
    assert isinstance(events[-1].message, JSONRPCResponse) and events[-1].event_id == "5/7"
    assert reader.streams.resumed == 1
    # From the priming id: everything, the lead included.
    assert _progress_of(await _replay(reader.view, "1/7")) == [1, 2, 3]


async def test_a_stream_keeps_only_the_newest_events_and_expires_after_its_call() -> None:
    clock = FakeClock()
    log = MemoryStreamLog(events=3, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    owner.view.open("7")
    await owner.view.commit(_request())
    for n in range(1, 7):
        await owner.view.store_event("7", _progress(n))
    await owner.view.store_event("7", _answer())
    replayed = await _replay(owner.view, "1/7")
    assert _progress_of(replayed) == [5, 6] and isinstance(replayed[-1].message, JSONRPCResponse)
    assert await owner.view.known("1/7")
    clock.advance(59)
    assert await owner.view.known("1/7")
    clock.advance(2)
    assert not await owner.view.known("1/7")
    assert await _replay(owner.view, "1/7") == []


async def test_a_running_call_keeps_its_stream_past_the_ttl_and_a_gone_owner_lets_it_expire() -> None:
    clock = FakeClock()
    log = MemoryStreamLog(events=10, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    owner.view.open("7")
    await owner.view.commit(_request())
    clock.advance(600)  # a long silent call
    assert await owner.view.known("1/7")
    owner.alive = False
    clock.advance(61)
    assert not await owner.view.known("1/7")


async def test_the_memory_log_holds_a_bounded_number_of_streams() -> None:
    clock = FakeClock()
    log = MemoryStreamLog(events=10, ttl_s=60, clock=clock, max_streams=2)
    owner = Owner(log, clock)
    for request_id in (1, 2, 3):
        owner.view.open(str(request_id))
        await owner.view.commit(_request(request_id))
    assert len(log) == 2
    assert not await owner.view.known("1/1")
    assert await owner.view.known("1/3")


async def test_an_idle_memory_log_drops_each_stream_when_its_time_is_up() -> None:
    """With nothing written after them, the streams of finished calls went only at the next write: an idle replica held
    its last answers for good (ten abandoned 3 MB answers, 63 MB)."""
    clock = FakeClock()
    log = MemoryStreamLog(events=10, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    for request_id, at in ((1, 0), (2, 30)):
        clock.advance(at)
        owner.view.open(str(request_id))
        await owner.view.commit(_request(request_id))
        await owner.view.store_event(str(request_id), _answer(request_id))
    async with anyio.create_task_group() as tg:
        tg.start_soon(log.sweep)
        await clock.wait_for_sleepers()
        clock.advance(31)  # 61 s after the first answer, 31 s after the second
        await clock.wait_for_sleepers()
        assert (await owner.view.known("1/1"), await owner.view.known("1/2")) == (False, True)
        clock.advance(30)
        await clock.wait_for_sleepers(0)
        await anyio.wait_all_tasks_blocked()
        assert len(log) == 0 and log.size == 0
        owner.view.open("3")  # a new stream wakes the sweeper
        await owner.view.commit(_request(3))
        await owner.view.store_event("3", _answer(3))
        await clock.wait_for_sleepers()
        clock.advance(61)
        await anyio.wait_all_tasks_blocked()
        assert len(log) == 0
        tg.cancel_scope.cancel()


async def test_the_memory_log_holds_a_bounded_number_of_bytes() -> None:
    """A replica's streams hold at most `max_bytes` of JSON text: the least recently written go first."""
    clock = FakeClock()
    log = MemoryStreamLog(events=3, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    sizes = []
    for request_id in (1, 2, 3):
        owner.view.open(str(request_id))
        await owner.view.commit(_request(request_id))
        for n in range(5):  # three are kept: the size follows what the stream's own bound dropped
            await owner.view.store_event(str(request_id), _progress(n))
        sizes.append(log.size)
        log.max_bytes = 2 * sizes[0] + 10  # room for two streams
    assert sizes[1] == 2 * sizes[0] and sizes[2] == sizes[1], sizes
    assert [await owner.view.known(f"1/{n}") for n in (1, 2, 3)] == [False, True, True]


async def test_a_follower_answers_for_a_call_whose_replica_is_gone() -> None:
    """No answer and no owner: the client gets OUTCOME_UNKNOWN with the operation id, not a hang."""
    clock = FakeClock()
    log = MemoryStreamLog(events=10, ttl_s=60, clock=clock)
    owner = Owner(log, clock)
    owner.view.open("7")
    await owner.view.commit(_request())
    await owner.view.store_event("7", _progress(1))
    owner.alive = False
    events = await _replay(owner.view, "1/7")
    assert _progress_of(events) == [1]
    answer = events[-1].message
    assert isinstance(answer, JSONRPCResponse) and answer.id == 7
    envelope = answer.result["structuredContent"]
    assert (envelope["code"], envelope["operation_id"], envelope["tool"]) == ("OUTCOME_UNKNOWN", OP, "shop__order")
    assert answer.result["isError"] is True
    assert owner.streams.orphaned == 1


async def test_a_followers_answer_names_the_server_and_tool_as_the_gates_would() -> None:
    """The follower's OUTCOME_UNKNOWN named the downstream name as the tool and no server; a gate's names both apart."""
    clock = FakeClock()
    owner = Owner(MemoryStreamLog(events=10, ttl_s=60, clock=clock), clock)
    owner.streams.resolve = {"shop__order": ("shop", "order")}.get
    owner.view.open("7")
    await owner.view.commit(_request())
    owner.alive = False
    answer = (await _replay(owner.view, "1/7"))[-1].message
    assert isinstance(answer, JSONRPCResponse)
    envelope = answer.result["structuredContent"]
    assert (envelope["server"], envelope["tool"], envelope["operation_id"]) == ("shop", "order", OP)


async def test_unknown_and_foreign_ids_are_not_known() -> None:
    clock = FakeClock()
    owner = Owner(MemoryStreamLog(events=10, ttl_s=60, clock=clock), clock)
    for value in ("", "7", "x/7", "1/", "3/99"):
        assert not await owner.view.known(value)
    assert not owner.view.open("bad\nid")


async def test_an_id_ahead_of_what_the_stream_sent_is_not_known() -> None:
    """A reconnect naming an event the stream never sent got an empty stream that ended without the answer (the answer
    lay behind the id); it is a 404 now, as for an unknown stream."""
    clock = FakeClock()
    owner = Owner(MemoryStreamLog(events=10, ttl_s=60, clock=clock), clock)
    owner.view.open("7")
    await owner.view.commit(_request())  # the priming event: 1/7
    await owner.view.store_event("7", _progress(1))  # 2/7
    assert [await owner.view.known(f"{seq}/7") for seq in (1, 2, 3, 999)] == [True, True, False, False]
    await owner.view.store_event("7", _answer())  # 3/7
    assert [await owner.view.known(f"{seq}/7") for seq in (2, 3, 4)] == [True, True, False]


async def test_a_drain_ends_the_followers() -> None:
    clock = FakeClock()
    owner = Owner(MemoryStreamLog(events=10, ttl_s=60, clock=clock), clock)
    owner.view.open("7")
    await owner.view.commit(_request())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_replay, owner.view, "1/7")
            await anyio.wait_all_tasks_blocked()
            owner.streams.end_followers()


# ---- Redis: the same log shared by two replicas -----------------------------------------------------


@pytest.fixture
async def redis_logs(redis_available: None) -> AsyncIterator[tuple[RedisStreamLog, RedisStreamLog, str]]:
    namespace = f"bw-test-resume-{uuid.uuid4().hex[:8]}"
    policy = StatePolicy(url=REDIS_URL, namespace=namespace)
    a = RedisStreamLog(policy, events=3, ttl_s=30, owner_lost_s=0.3)
    b = RedisStreamLog(policy, events=3, ttl_s=30, owner_lost_s=0.3)
    try:
        yield a, b, namespace
    finally:
        import redis.asyncio as aredis

        r = aredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in r.scan_iter(f"{namespace}:*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
        await a.aclose()
        await b.aclose()


async def test_another_replica_replays_and_follows_a_stream_in_redis(redis_logs: Any) -> None:
    a, b, namespace = redis_logs
    clock = FakeClock()
    beats: list[Callable[[], Awaitable[None]]] = []
    origin = Owner(a, clock, spawn=beats.append)
    origin.view.open("7")
    await origin.view.store_event("7", _progress(1))
    await origin.view.commit(_request())
    assert len(beats) == 1  # the liveness mark's keeper, run by the session manager
    for n in (2, 3, 4):
        await origin.view.store_event("7", _progress(n))
    other = Owner(b, clock)
    assert await other.view.known("2/7")
    assert not await other.view.known("2/8")
    events: list[EventMessage] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_replay, other.view, "2/7", events)
            await anyio.sleep(0.2)
            await origin.view.store_event("7", _answer())
    assert _progress_of(events) == [2, 3, 4]
    assert isinstance(events[-1].message, JSONRPCResponse)
    # MAXLEN 3: the oldest events are gone, the answer is kept.
    late = await _replay(other.view, "1/7")
    assert _progress_of(late) == [3, 4] and isinstance(late[-1].message, JSONRPCResponse)
    import redis.asyncio as aredis

    r = aredis.Redis.from_url(REDIS_URL, decode_responses=True)
    key = f"{namespace}:sse:s1:7"
    assert await r.xlen(key) == 3
    assert 0 < await r.pttl(key) <= 30_000
    assert await r.get(f"{namespace}:sse-live:s1:7") == "done"
    await r.aclose()


async def test_a_stream_whose_replica_stops_beating_is_answered_by_the_follower(redis_logs: Any) -> None:
    a, b, _ = redis_logs
    clock = FakeClock()
    origin = Owner(a, clock)  # its keeper never runs: as if the replica were killed
    origin.view.open("7")
    await origin.view.commit(_request())
    await origin.view.store_event("7", _progress(1))
    other = Owner(b, clock)
    with anyio.fail_after(10):
        events = await _replay(other.view, "1/7")
    assert _progress_of(events) == [1]
    envelope = events[-1].message.result["structuredContent"]  # type: ignore[union-attr]
    assert (envelope["code"], envelope["operation_id"]) == ("OUTCOME_UNKNOWN", OP)
