"""The fleet records' Redis client when Redis hangs: one command waits its timeout, the next ones fail at once.

A real redis-server of the test's own, stopped with SIGSTOP (its port still accepts connections, as a
stopped process or a black-holed route does); the machine's Redis is never touched. The cool-off runs
on a `FakeClock`; only the one command that must see the hang waits in real time.
"""

from __future__ import annotations

import logging
import time

import pytest

from breakwater.config import StatePolicy
from breakwater.state._record_client import Reach, RecordStoreAway
from breakwater.state._sessions import SessionStore
from breakwater.testing import FakeClock
from helpers import OwnRedis

pytestmark = pytest.mark.anyio


async def _timed(coro: object) -> float:
    started = time.monotonic()
    await coro  # type: ignore[misc]
    return time.monotonic() - started


async def test_a_hung_redis_costs_two_timeouts_then_commands_fail_at_once_until_a_probe_gets_an_answer(
    own_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Every session command waited its whole timeout while Redis hung: +0.5 s on each request of a session. Two in a
    row make it away (one slow answer of a loaded Redis does not)."""
    clock = FakeClock()
    reach = Reach(clock=clock, away_s=5.0)
    store = SessionStore(StatePolicy(url=own_redis.url, timeout_s=0.5), ttl_s=60, reach=reach)
    try:
        await store.save("s1", {"version": "2025-11-25"})
        own_redis.pause()
        caplog.set_level(logging.WARNING)
        first = await _timed(store.save("s2", {"version": "2025-11-25"}))
        assert first >= 0.4 and not reach.away  # one timeout: maybe only a slow answer
        second = await _timed(store.save("s3", {"version": "2025-11-25"}))
        assert second >= 0.4 and reach.away  # the two commands that saw the hang waited for it
        later = [await _timed(store.load("s1")) for _ in range(5)]
        assert max(later) < 0.2, later  # refused at once: 0.5 s each before
        assert reach.refused == 5
        assert await store.load("s1") is None  # as when Redis cannot say: a session only this replica serves
        own_redis.resume()
        clock.advance(4.9)
        assert await store.load("s1") is None  # still away: no command reaches for Redis yet
        clock.advance(0.2)
        assert await store.load("s1") == {"version": "2025-11-25"}  # the probe, answered
        assert not reach.away and reach.refused == 0
    finally:
        own_redis.resume()
        await store.aclose()
    said = [r.getMessage() for r in caplog.records]
    # Entering and leaving are said once each; the refused commands' own warnings are not (one a request).
    assert sum("Redis did not answer" in m for m in said) == 1, said
    assert sum("7 record commands were refused at once" in m for m in said) == 1, said
    assert sum("cannot store session s" in m for m in said) == 2 and not any("RecordStoreAway" in m for m in said), said


def test_while_away_one_command_is_the_probe_and_the_others_still_fail_at_once() -> None:
    clock = FakeClock()
    reach = Reach(clock=clock, away_s=2.0)
    reach.check()  # nothing known against Redis
    reach.failed(ConnectionError("refused"), timed_out=False)  # fast already: changes nothing
    reach.failed(TimeoutError("Timeout reading from 127.0.0.1:6391"))
    reach.check()  # one timeout: not yet away
    reach.failed(TimeoutError("Timeout reading from 127.0.0.1:6391"))
    with pytest.raises(RecordStoreAway, match=r"Timeout reading from 127\.0\.0\.1:6391\); tried again in 2\.0 s"):
        reach.check()
    clock.advance(2.0)
    reach.check()  # the probe goes through...
    with pytest.raises(RecordStoreAway):
        reach.check()  # ...and the others wait for its verdict, failing at once
    reach.failed(TimeoutError("again"))  # the probe timed out too: another cool-off from now
    clock.advance(1.9)
    with pytest.raises(RecordStoreAway, match="again"):
        reach.check()
    clock.advance(0.1)
    reach.check()
    reach.answered()
    reach.check()
    reach.check()
    assert not reach.away and reach.refused == 0
