"""`breakwater.idempotency`: the store contract (SQLite and PostgreSQL alike) and `@idempotent`
on real `MCPServer`s reached through the SDK's in-process `Client`.

PostgreSQL tests use 127.0.0.1:5432, database `test` (override with `BREAKWATER_TEST_POSTGRES`),
each in a schema of its own that is dropped afterwards. They skip when the server is unreachable,
except under `CI=true`, where an unreachable server is a failure.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, RequestParamsMeta
from pydantic import BaseModel

from breakwater import FakeClock
from breakwater.idempotency import (
    DEFAULT_LEASE_S,
    DEFAULT_RETENTION_S,
    OPERATION_ID_META_KEY,
    OperationState,
    OperationStore,
    PostgresStore,
    SQLiteStore,
    add_operation_tool,
    current_operation_id,
    default_db_path,
    fingerprint,
    idempotent,
)
from helpers import code_of, envelope_of

pytestmark = pytest.mark.anyio

LEASE = 30.0

# PostgreSQL: the `pg_conninfo` and `pg_schema` fixtures are in conftest.py.


StoreFactory = Callable[..., OperationStore]


@pytest.fixture(params=["sqlite", "postgres"])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """Builds stores of the parametrized kind on one database; closes them afterwards."""
    made: list[OperationStore] = []
    if request.param == "sqlite":
        db = tmp_path / "ops.sqlite3"

        def factory(**kw: Any) -> OperationStore:
            made.append(SQLiteStore(db, **kw))
            return made[-1]
    else:
        conninfo = request.getfixturevalue("pg_conninfo")
        schema = request.getfixturevalue("pg_schema")

        def factory(**kw: Any) -> OperationStore:
            made.append(PostgresStore(conninfo, schema=schema, **kw))
            return made[-1]

    yield factory
    for store in made:
        await store.aclose()


def op_meta(operation_id: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {OPERATION_ID_META_KEY: operation_id})


def new_id() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------------- the store contract


async def test_claim_decides_one_owner_among_concurrent_claimers(make_store: StoreFactory) -> None:
    store = make_store(clock=FakeClock())
    op = new_id()
    results = []

    async def claim(i: int) -> None:
        results.append(await store.claim(op, tool="t", fingerprint="f", owner=f"o{i}", lease_s=LEASE))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(claim, i)
    owners = [r for r in results if r.owned]
    assert len(owners) == 1
    winner = owners[0].record.owner
    assert all(r.record.owner == winner and r.record.state is OperationState.PENDING for r in results)


async def test_two_store_instances_on_one_database_agree(make_store: StoreFactory) -> None:
    # Two instances stand for two server processes sharing the database.
    clock = FakeClock()
    a, b = make_store(clock=clock), make_store(clock=clock)
    op = new_id()
    first = await a.claim(op, tool="t", fingerprint="f", owner="a", lease_s=LEASE)
    second = await b.claim(op, tool="t", fingerprint="f", owner="b", lease_s=LEASE)
    assert first.owned and not second.owned
    assert second.record.owner == "a"


async def test_state_machine_and_owner_fencing(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    op = new_id()
    assert (await store.claim(op, tool="t", fingerprint="f", owner="me", lease_s=LEASE)).owned
    assert not await store.mark_executing(op, owner="intruder", lease_s=LEASE)
    assert await store.mark_executing(op, owner="me", lease_s=LEASE)
    assert not await store.mark_executing(op, owner="me", lease_s=LEASE)  # only from pending
    clock.advance(10)
    assert await store.renew(op, owner="me", lease_s=LEASE)
    rec = await store.get(op)
    assert rec is not None and rec.state is OperationState.EXECUTING
    assert rec.lease_until == pytest.approx(clock.time() + LEASE)
    assert not await store.finish(op, owner="intruder", state=OperationState.COMPLETED, outcome={"result": {}})
    assert await store.finish(op, owner="me", state=OperationState.COMPLETED, outcome={"result": {"x": 1}})
    rec = await store.get(op)
    assert rec is not None and rec.state is OperationState.COMPLETED
    assert rec.outcome == {"result": {"x": 1}} and rec.lease_until is None
    assert not await store.renew(op, owner="me", lease_s=LEASE)
    assert not await store.release(op, owner="me")  # a final record is never released
    again = await store.claim(op, tool="t", fingerprint="f", owner="other", lease_s=LEASE)
    assert not again.owned and again.record.state is OperationState.COMPLETED


async def test_lapsed_pending_is_taken_over_but_lapsed_executing_becomes_unknown(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    pending, executing = new_id(), new_id()
    await store.claim(pending, tool="t", fingerprint="f", owner="dead", lease_s=LEASE)
    await store.claim(executing, tool="t", fingerprint="f", owner="dead", lease_s=LEASE)
    await store.mark_executing(executing, owner="dead", lease_s=LEASE)
    clock.advance(LEASE - 1)
    assert not (await store.claim(pending, tool="t", fingerprint="f", owner="new", lease_s=LEASE)).owned
    clock.advance(2)
    # Pending: the dead owner never started the tool, so nothing happened; a new owner may run it,
    # but only for the same arguments.
    assert not (await store.claim(pending, tool="t", fingerprint="other", owner="new", lease_s=LEASE)).owned
    took = await store.claim(pending, tool="t", fingerprint="f", owner="new", lease_s=LEASE)
    assert took.owned and took.record.owner == "new"
    assert not await store.mark_executing(pending, owner="dead", lease_s=LEASE)
    # Executing: the side effect may have happened; never re-run, report unknown.
    seen = await store.claim(executing, tool="t", fingerprint="f", owner="new", lease_s=LEASE)
    assert not seen.owned
    assert seen.record.state is OperationState.UNKNOWN and seen.record.outcome == {"reason": "lease_expired"}
    # The old owner, if it was only slow, may still record the real outcome.
    assert await store.finish(executing, owner="dead", state=OperationState.COMPLETED, outcome={"result": {}})


async def test_get_reports_a_lapsed_lease_as_unknown(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    op = new_id()
    await store.claim(op, tool="t", fingerprint="f", owner="dead", lease_s=LEASE)
    await store.mark_executing(op, owner="dead", lease_s=LEASE)
    assert (rec := await store.get(op)) is not None and rec.state is OperationState.EXECUTING
    clock.advance(LEASE + 0.5)
    assert (rec := await store.get(op)) is not None and rec.state is OperationState.UNKNOWN
    assert await store.get(new_id()) is None


async def test_release_frees_the_id(make_store: StoreFactory) -> None:
    store = make_store(clock=FakeClock())
    op = new_id()
    await store.claim(op, tool="t", fingerprint="f", owner="me", lease_s=LEASE)
    assert not await store.release(op, owner="other")
    assert await store.release(op, owner="me")
    assert await store.get(op) is None
    assert (await store.claim(op, tool="t", fingerprint="g", owner="next", lease_s=LEASE)).owned


async def test_retention_purge_is_enforced(make_store: StoreFactory) -> None:
    assert DEFAULT_RETENTION_S >= 24 * 3600  # resilience-numbers target 20
    clock = FakeClock()
    store = make_store(clock=clock, purge_interval_s=600)
    done, abandoned, fresh = new_id(), new_id(), new_id()
    for op in (done, abandoned):
        await store.claim(op, tool="t", fingerprint="f", owner="me", lease_s=LEASE)
        await store.mark_executing(op, owner="me", lease_s=LEASE)
    await store.finish(done, owner="me", state=OperationState.COMPLETED, outcome={"result": {}})
    clock.advance(DEFAULT_RETENTION_S - 60)
    await store.claim(new_id(), tool="t", fingerprint="f", owner="me", lease_s=LEASE)  # purges: nothing old enough
    assert await store.get(done) is not None
    clock.advance(600)
    # The next claim after the purge interval deletes everything past retention, including an
    # executing record whose lease lapsed a day ago (nobody ever looked at it).
    await store.claim(fresh, tool="t", fingerprint="f", owner="me", lease_s=LEASE)
    assert await store.get(done) is None
    assert await store.get(abandoned) is None
    assert await store.get(fresh) is not None
    clock.advance(DEFAULT_RETENTION_S + LEASE + 1)  # a live record goes a retention after its lease lapsed
    assert await store.purge() >= 1
    assert await store.get(fresh) is None


# ---------------------------------------------------------------------------- servers under test


class Order(BaseModel):
    order_id: str
    item: str
    quantity: int


class Shop:
    """A server whose tools count their executions; `gate` holds a tool until the test opens it."""

    def __init__(self, store: OperationStore, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.runs: list[tuple[str, str | None]] = []
        self.gate: anyio.Event | None = None
        self.started = anyio.Event()
        self.mcp = mcp = MCPServer("shop")

        @mcp.tool()
        @idempotent(store=store, lease_s=lease_s)
        async def place(item: str, quantity: int = 1) -> Order:
            """Place an order."""
            self.runs.append(("place", current_operation_id()))
            self.started.set()
            if self.gate is not None:
                await self.gate.wait()
            else:
                await anyio.sleep(0.05)  # long enough for concurrent duplicates to overlap
            return Order(order_id=f"o{len(self.runs)}", item=item, quantity=quantity)

        @mcp.tool()
        @idempotent(store=store, lease_s=lease_s)
        def refund(order_id: str, ctx: Context) -> str:
            """A sync tool that reads its own Context."""
            assert ctx.request_context is not None
            self.runs.append(("refund", current_operation_id()))
            return f"refunded {order_id}"

        @mcp.tool()
        @idempotent(store=store, lease_s=lease_s)
        async def fail(kind: str) -> str:
            self.runs.append(("fail", current_operation_id()))
            if kind == "tool":
                raise ToolError("card declined")
            raise RuntimeError("secret internals")

        @mcp.tool()
        @idempotent(store=store, lease_s=lease_s, release_on=(ValueError,))
        async def validate(amount: int) -> str:
            self.runs.append(("validate", current_operation_id()))
            if amount < 0:
                raise ValueError("negative")
            return "ok"

        @mcp.tool()
        @idempotent(store=store, lease_s=lease_s)
        async def by_argument(note: str, operationId: str | None = None) -> str:
            self.runs.append(("by_argument", current_operation_id()))
            return f"{note}:{operationId}"

        add_operation_tool(mcp, store)

    def count(self, tool: str) -> int:
        return sum(1 for name, _ in self.runs if name == tool)


@pytest.fixture
def store(make_store: StoreFactory) -> OperationStore:
    return make_store()


async def test_same_id_twice_runs_once_and_replays_the_same_result(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    async with Client(shop.mcp) as client:
        first = await client.call_tool("place", {"item": "tea", "quantity": 2}, meta=op_meta(op))
        second = await client.call_tool("place", {"item": "tea", "quantity": 2}, meta=op_meta(op))
        # Defaults count as given: {} and {"quantity": 1} are the same call.
        other = new_id()
        await client.call_tool("place", {"item": "tea"}, meta=op_meta(other))
        third = await client.call_tool("place", {"item": "tea", "quantity": 1}, meta=op_meta(other))
    assert shop.runs[:1] == [("place", op)]
    assert shop.count("place") == 2
    assert not first.is_error and first.structured_content == {"order_id": "o1", "item": "tea", "quantity": 2}
    assert second.model_dump(exclude={"meta"}) == first.model_dump(exclude={"meta"})
    assert not third.is_error


async def test_concurrent_duplicates_run_once(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    results: list[CallToolResult] = []
    async with Client(shop.mcp) as client:

        async def call() -> None:
            results.append(await client.call_tool("place", {"item": "tea"}, meta=op_meta(op)))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(call)
    assert shop.count("place") == 1
    winners = [r for r in results if not r.is_error]
    busy = [r for r in results if r.is_error]
    assert winners and all(r.structured_content == winners[0].structured_content for r in winners)
    for r in busy:
        # A tool with an output schema: the refusal's envelope is under `_meta`, where it does not break the schema.
        assert r.structured_content is None
        sc = envelope_of(r)
        assert sc["code"] == "OPERATION_IN_PROGRESS" and sc["retryable"] is True and sc["operation_id"] == op
        assert 0 < sc["retry_after_s"] <= 2.0
    assert len(winners) + len(busy) == 20


async def test_same_id_with_different_arguments_or_tool_is_refused(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    async with Client(shop.mcp) as client:
        await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        changed = await client.call_tool("place", {"item": "coffee"}, meta=op_meta(op))
        other_tool = await client.call_tool("refund", {"order_id": "o1"}, meta=op_meta(op))
    assert shop.count("place") == 1 and shop.count("refund") == 0
    for result in (changed, other_tool):
        assert code_of(result) == "OPERATION_MISMATCH"
        assert envelope_of(result)["retryable"] is False
    assert "tool 'place'" in other_tool.content[0].text  # type: ignore[union-attr]


async def test_without_an_operation_id_the_tool_runs_every_time(store: OperationStore) -> None:
    shop = Shop(store)
    async with Client(shop.mcp) as client:
        for _ in range(3):
            result = await client.call_tool("place", {"item": "tea"})
            assert not result.is_error
    assert shop.runs == [("place", None)] * 3


async def test_operation_id_may_come_as_an_argument(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    async with Client(shop.mcp) as client:
        a = await client.call_tool("by_argument", {"note": "n", "operationId": op})
        b = await client.call_tool("by_argument", {"note": "n", "operationId": op})
        clash = await client.call_tool("by_argument", {"note": "n", "operationId": op}, meta=op_meta(new_id()))
        too_long = await client.call_tool("place", {"item": "tea"}, meta=op_meta("x" * 300))
    assert shop.runs == [("by_argument", op)]
    assert a.structured_content == b.structured_content == {"result": f"n:{op}"}
    assert code_of(clash) == "INVALID_OPERATION_ID"
    assert code_of(too_long) == "INVALID_OPERATION_ID"


async def test_sync_tool_with_its_own_context(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    async with Client(shop.mcp) as client:
        a = await client.call_tool("refund", {"order_id": "o9"}, meta=op_meta(op))
        b = await client.call_tool("refund", {"order_id": "o9"}, meta=op_meta(op))
    assert shop.runs == [("refund", op)]  # current_operation_id() reached the worker thread
    assert a.structured_content == b.structured_content == {"result": "refunded o9"}


async def test_failures_are_stored_and_replayed_without_running_again(store: OperationStore) -> None:
    shop = Shop(store)
    declined, crashed = new_id(), new_id()
    async with Client(shop.mcp) as client:
        d1 = await client.call_tool("fail", {"kind": "tool"}, meta=op_meta(declined))
        d2 = await client.call_tool("fail", {"kind": "tool"}, meta=op_meta(declined))
        c1 = await client.call_tool("fail", {"kind": "crash"}, meta=op_meta(crashed))
        c2 = await client.call_tool("fail", {"kind": "crash"}, meta=op_meta(crashed))
        status = await client.call_tool("get_operation", {"operation_id": crashed})
    assert shop.count("fail") == 2
    assert d1.is_error and d2.is_error and d1.content == d2.content
    assert d1.content[0].text == "Error executing tool fail: card declined"  # type: ignore[union-attr]
    assert c1.is_error and c2.is_error and c1.content == c2.content
    assert "secret" not in str(c2.content) and "secret" not in str(status.structured_content)
    assert status.structured_content is not None and status.structured_content["state"] == "failed"


async def test_release_on_lets_the_same_id_run_again(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    async with Client(shop.mcp) as client:
        await client.call_tool("validate", {"amount": -1}, meta=op_meta(op))
        await client.call_tool("validate", {"amount": -1}, meta=op_meta(op))
        status = await client.call_tool("get_operation", {"operation_id": op})
    assert shop.count("validate") == 2
    assert status.structured_content is not None and status.structured_content["state"] == "not_found"


async def test_get_operation_reports_state_and_outcome(store: OperationStore) -> None:
    shop = Shop(store)
    op = new_id()
    async with Client(shop.mcp) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["get_operation"].annotations is not None and tools["get_operation"].annotations.read_only_hint
        placed = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        status = await client.call_tool("get_operation", {"operation_id": op})
        missing = await client.call_tool("get_operation", {"operation_id": new_id()})
    sc = status.structured_content
    assert sc is not None and sc["state"] == "completed" and sc["tool"] == "place"
    assert sc["result"]["structuredContent"] == placed.structured_content
    assert sc["expires_at"] == pytest.approx(sc["updated_at"] + DEFAULT_RETENTION_S)
    assert missing.structured_content is not None and missing.structured_content["state"] == "not_found"


async def test_in_progress_then_completed(store: OperationStore) -> None:
    shop = Shop(store)
    shop.gate = anyio.Event()
    op = new_id()
    async with Client(shop.mcp) as client, anyio.create_task_group() as tg:
        first: list[CallToolResult] = []

        async def call_first() -> None:
            first.append(await client.call_tool("place", {"item": "tea"}, meta=op_meta(op)))

        tg.start_soon(call_first)
        await shop.started.wait()
        busy = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        status = await client.call_tool("get_operation", {"operation_id": op})
        assert code_of(busy) == "OPERATION_IN_PROGRESS"
        assert status.structured_content is not None and status.structured_content["state"] == "executing"
        shop.gate.set()
    async with Client(shop.mcp) as client:
        replay = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
    assert shop.count("place") == 1
    assert replay.structured_content == first[0].structured_content


async def test_decorator_keeps_the_tool_schema() -> None:
    """`tools/list` shows the same tool with and without `@idempotent`."""

    async def place(item: str, quantity: int = 1, note: str | None = None) -> Order:
        """Place an order."""
        return Order(order_id="o", item=item, quantity=quantity)

    def refund(order_id: str, ctx: Context) -> str:
        """Refund an order."""
        return order_id

    plain, wrapped = MCPServer("plain"), MCPServer("wrapped")
    for fn in (place, refund):
        plain.tool()(fn)
        wrapped.tool()(idempotent(fn))
    listed = []
    for server in (plain, wrapped):
        async with Client(server) as client:
            listed.append([t.model_dump(by_alias=True, exclude_none=True) for t in (await client.list_tools()).tools])
    assert listed[0] == listed[1]
    schema = listed[1][0]["inputSchema"]
    assert set(schema["properties"]) == {"item", "quantity", "note"}  # no Context parameter leaked


async def test_bare_decorator_uses_the_embedded_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from breakwater.idempotency import _decorator

    db = tmp_path / "embedded.sqlite3"
    monkeypatch.setenv("BREAKWATER_IDEMPOTENCY_DB", str(db))
    monkeypatch.setattr(_decorator, "_default_store", None)
    assert default_db_path() == db
    runs = []
    mcp = MCPServer("bare")

    @mcp.tool()
    @idempotent
    async def ping(n: int) -> int:
        runs.append(n)
        return n

    add_operation_tool(mcp)
    op = new_id()
    async with Client(mcp) as client:
        await client.call_tool("ping", {"n": 1}, meta=op_meta(op))
        await client.call_tool("ping", {"n": 1}, meta=op_meta(op))
        status = await client.call_tool("get_operation", {"operation_id": op})
    assert runs == [1] and db.exists()
    assert status.structured_content is not None and status.structured_content["state"] == "completed"
    await _decorator.default_store().aclose()


async def test_default_db_path_is_in_the_user_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BREAKWATER_IDEMPOTENCY_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/data/home")
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert default_db_path() == Path("/data/home/breakwater/operations.sqlite3")


def test_fingerprint_is_canonical() -> None:
    assert fingerprint("t", {"a": 1, "b": [1, 2]}) == fingerprint("t", {"b": [1, 2], "a": 1})
    assert fingerprint("t", {"a": 1}) != fingerprint("u", {"a": 1})
    assert fingerprint("t", {"o": Order(order_id="1", item="x", quantity=1)}) == fingerprint(
        "t", {"o": {"order_id": "1", "item": "x", "quantity": 1}}
    )


# ---------------------------------------------------------------------------- leases, crashes, cancellation


async def test_an_expired_lease_is_reported_unknown_and_never_rerun(make_store: StoreFactory) -> None:
    """A dead owner (simulated: claimed and started, then no heartbeat) on a FakeClock."""
    clock = FakeClock()
    store = make_store(clock=clock)
    shop = Shop(store, lease_s=LEASE)
    op = new_id()
    fp = fingerprint("place", {"item": "tea", "quantity": 1})
    assert (await store.claim(op, tool="place", fingerprint=fp, owner="dead-process", lease_s=LEASE)).owned
    assert await store.mark_executing(op, owner="dead-process", lease_s=LEASE)
    async with Client(shop.mcp) as client:
        busy = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        clock.advance(LEASE + 1)
        lost = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        status = await client.call_tool("get_operation", {"operation_id": op})
    assert code_of(busy) == "OPERATION_IN_PROGRESS"
    assert envelope_of(busy)["retry_after_s"] == 2.0
    assert code_of(lost) == "OPERATION_OUTCOME_UNKNOWN"
    assert envelope_of(lost)["retryable"] is False
    assert status.structured_content is not None and status.structured_content["state"] == "unknown"
    assert status.structured_content["reason"] == "lease_expired"
    assert shop.count("place") == 0


async def test_heartbeat_keeps_a_long_tool_alive(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    shop = Shop(store, lease_s=LEASE)
    shop.gate = anyio.Event()
    op = new_id()
    async with Client(shop.mcp) as client, anyio.create_task_group() as tg:
        first: list[CallToolResult] = []

        async def call_first() -> None:
            first.append(await client.call_tool("place", {"item": "tea"}, meta=op_meta(op)))

        tg.start_soon(call_first)
        await shop.started.wait()
        # Ten lease thirds = more than three leases of virtual time, renewed at every step.
        for _ in range(10):
            await clock.wait_for_sleepers(1)
            clock.advance(LEASE / 3)
            await anyio.sleep(0.01)
        await clock.wait_for_sleepers(1)
        busy = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        assert code_of(busy) == "OPERATION_IN_PROGRESS"
        shop.gate.set()
    assert first and not first[0].is_error
    rec = await store.get(op)
    assert rec is not None and rec.state is OperationState.COMPLETED


async def test_cancelled_mid_execution_becomes_unknown(store: OperationStore) -> None:
    shop = Shop(store)
    shop.gate = anyio.Event()  # never set: the tool only ends by cancellation
    op = new_id()
    async with Client(shop.mcp, mode="legacy") as client:
        with anyio.move_on_after(0.5):
            await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
        with anyio.fail_after(5):
            while (rec := await store.get(op)) is None or rec.state is not OperationState.UNKNOWN:
                await anyio.sleep(0.02)
        again = await client.call_tool("place", {"item": "tea"}, meta=op_meta(op))
    assert rec.outcome == {"reason": "cancelled"}
    assert code_of(again) == "OPERATION_OUTCOME_UNKNOWN"
    assert envelope_of(again)["reason"] == "cancelled"
    assert shop.count("place") == 1


async def test_finish_on_cancel_records_the_real_outcome(store: OperationStore) -> None:
    runs = []
    mcp = MCPServer("patient")

    @mcp.tool()
    @idempotent(store=store, finish_on_cancel=True)
    async def slow_charge(amount: int) -> str:
        runs.append(amount)
        await anyio.sleep(0.6)
        return f"charged {amount}"

    op = new_id()
    async with Client(mcp, mode="legacy") as client:
        with anyio.move_on_after(0.2):
            await client.call_tool("slow_charge", {"amount": 5}, meta=op_meta(op))
        with anyio.fail_after(5):
            while (rec := await store.get(op)) is None or not rec.state.is_final:
                await anyio.sleep(0.02)
        again = await client.call_tool("slow_charge", {"amount": 5}, meta=op_meta(op))
    assert rec.state is OperationState.COMPLETED
    assert runs == [5] and again.structured_content == {"result": "charged 5"}


async def test_an_unreachable_store_fails_closed() -> None:
    store = PostgresStore("host=127.0.0.1 port=1 dbname=nothing user=nobody connect_timeout=1", connect_timeout_s=1)
    runs = []
    mcp = MCPServer("no-store")

    @mcp.tool()
    @idempotent(store=store)
    async def charge(amount: int) -> str:
        runs.append(amount)
        return "charged"

    async with Client(mcp) as client:
        result = await client.call_tool("charge", {"amount": 1}, meta=op_meta(new_id()))
    assert code_of(result) == "OPERATION_STORE_UNAVAILABLE"
    assert envelope_of(result)["retryable"] is True
    assert runs == []


@pytest.mark.parametrize("bad", [-1, 0, math.nan, math.inf, "x", True])
def test_a_store_refuses_a_retention_or_purge_interval_that_is_no_positive_duration(tmp_path: Path, bad: object) -> None:
    """`retention_s=-1` was taken: every record was purged at once, and one operation id ran its effect three times."""
    for store in (SQLiteStore, PostgresStore):
        target = tmp_path / "ops.db" if store is SQLiteStore else "postgresql://127.0.0.1/test"
        with pytest.raises(ValueError, match="retention_s must be a positive number of seconds"):
            store(target, retention_s=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="purge_interval_s must be a positive number of seconds"):
            store(target, purge_interval_s=bad)  # type: ignore[arg-type]
