"""The real clock's deadline scope as each gate attempt makes it: built without anyio's constructor, cancelled early."""

from __future__ import annotations

import math

import anyio
import pytest

from breakwater import _clock
from breakwater._clock import SystemClock

pytestmark = pytest.mark.anyio


def _slots(cls: type) -> list[str]:
    return [name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())]


async def test_a_cancel_scope_built_by_hand_is_the_one_its_class_builds() -> None:
    """The attempt's anyio scope is `object.__new__(cls)` and `cls.__init__`, not `cls()` (a fifth cheaper):
    every slot the same as `cls()` sets, and it works as a scope."""
    SystemClock().deadline_scope(math.inf)  # the backend's class, found once
    cls, init = _clock._asyncio_scope_class, _clock._asyncio_scope_init
    assert cls is not None and init is not None and cls is type(anyio.CancelScope())
    by_hand = object.__new__(cls)
    init(by_hand)
    built = cls()
    names = _slots(cls)
    assert names
    for name in names:
        assert hasattr(by_hand, name) == hasattr(built, name), name
        if hasattr(built, name):
            assert getattr(by_hand, name) == getattr(built, name), name
    with by_hand:
        by_hand.cancel()
        await anyio.sleep(1)
    assert by_hand.cancelled_caught


async def test_a_deadline_scope_cancelled_before_it_is_entered_cancels_its_body() -> None:
    clock = SystemClock()
    scope = clock.deadline_scope(clock.monotonic() + 60)
    scope.cancel()
    with scope:
        await anyio.sleep(1)
    assert scope.cancelled_caught


async def test_a_deadline_scope_fires_at_its_deadline_and_not_before() -> None:
    clock = SystemClock()
    fired = clock.deadline_scope(clock.monotonic() + 0.05)
    with fired:
        await anyio.sleep(5)
    assert fired.cancelled_caught
    kept = clock.deadline_scope(clock.monotonic() + 5)
    with kept:
        await anyio.sleep(0.01)
    assert not kept.cancelled_caught
