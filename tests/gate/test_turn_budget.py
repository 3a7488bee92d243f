"""The whole-turn budget on asyncio with a FakeClock."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from breakwater.gate._turn_budget import (
    TurnBudget,
    can_start,
    current_budget,
    effective_deadline,
    turn_budget,
)
from breakwater.testing import FakeClock


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


pytestmark = pytest.mark.anyio


async def test_remaining_runs_down_with_the_clock() -> None:
    clock = FakeClock()
    assert current_budget() is None
    async with turn_budget(60, clock=clock) as budget:
        assert current_budget() is budget
        assert budget.remaining() == 60
        clock.advance(45)
        assert budget.remaining() == 15
        clock.advance(20)
        assert budget.remaining() == 0
        assert budget.expired
    assert current_budget() is None


async def test_nesting_keeps_the_earlier_deadline() -> None:
    clock = FakeClock()
    async with turn_budget(60, clock=clock) as outer:
        async with turn_budget(100, clock=clock) as longer:
            assert longer.deadline == outer.deadline  # an inner scope cannot extend the turn
        async with turn_budget(10, clock=clock) as shorter:
            assert shorter.deadline == clock.monotonic() + 10
            assert current_budget() is shorter
        assert current_budget() is outer


async def test_the_budget_follows_into_spawned_tasks() -> None:
    clock = FakeClock()
    seen: dict[str, TurnBudget | None] = {}

    async def child(name: str) -> None:
        seen[name] = current_budget()

    outside = asyncio.create_task(child("spawned before"))
    async with turn_budget(30, clock=clock) as budget:
        await asyncio.create_task(child("asyncio task"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(child, "anyio task")
        await asyncio.gather(child("gathered"))
    await outside
    assert seen["asyncio task"] is budget
    assert seen["anyio task"] is budget
    assert seen["gathered"] is budget
    assert seen["spawned before"] is None


async def test_concurrent_turns_do_not_share_budgets() -> None:
    clock = FakeClock()
    seen: dict[int, float] = {}

    async def turn(seconds: int) -> None:
        async with turn_budget(seconds, clock=clock):
            await anyio.sleep(0)  # interleave with the other turns
            budget = current_budget()
            assert budget is not None
            seen[seconds] = budget.remaining()

    async with anyio.create_task_group() as tg:
        for s in (5, 50, 500):
            tg.start_soon(turn, s)
    assert seen == {5: 5, 50: 50, 500: 500}


async def test_a_call_deadline_is_the_earlier_of_its_own_and_the_budget() -> None:
    clock = FakeClock()
    now = clock.monotonic()
    assert effective_deadline(None) is None
    assert effective_deadline(now + 5) == now + 5
    async with turn_budget(20, clock=clock):
        assert effective_deadline(now + 5) == now + 5  # the tool's own timeout is tighter
        assert effective_deadline(now + 60) == now + 20  # the budget is tighter
        assert effective_deadline(None) == now + 20
        clock.advance(18)
        assert effective_deadline(clock.monotonic() + 5) == now + 20


async def test_no_attempt_starts_without_enough_budget() -> None:
    clock = FakeClock()
    assert can_start(1e9)  # no budget, no limit
    async with turn_budget(10, clock=clock):
        assert can_start(10)
        clock.advance(7)
        assert can_start(3)
        assert not can_start(3.5)
        clock.advance(3)
        assert not can_start(0)  # spent: not even an attempt that claims to need nothing


async def test_enforce_cancels_the_body_at_the_deadline() -> None:
    clock = FakeClock()

    async def body() -> None:
        scope = turn_budget(5, clock=clock, enforce=True)
        async with scope:
            await clock.sleep(60)
            pytest.fail("the body outlived its budget")
        assert scope.cancelled_caught

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await clock.wait_for_sleepers(1)
        clock.advance(5)


async def test_by_default_the_body_is_not_cancelled() -> None:
    clock = FakeClock()
    async with turn_budget(1, clock=clock) as budget:
        clock.advance(10)
        await anyio.sleep(0)
        assert budget.expired


async def test_an_absolute_deadline_can_be_given() -> None:
    # The gateway will turn a remote agent's deadline from `_meta` into one of these.
    clock = FakeClock()
    async with turn_budget(clock=clock, deadline=clock.monotonic() + 3) as budget:
        assert budget.remaining() == 3
    with pytest.raises(ValueError):
        turn_budget(clock=clock)
    with pytest.raises(ValueError):
        turn_budget(1, clock=clock, deadline=5.0)
    with pytest.raises(ValueError):
        turn_budget(-1, clock=clock)
