"""The connect loop's backoff, budget and background cadence, on the injected clock.

The connect attempts are real (a port with nothing listening, a command that does not exist);
only time is fake, so a two-minute retry schedule runs in milliseconds.
"""

from __future__ import annotations

import random
import socket
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from breakwater.config import ConnectPolicy, ServerSpec
from breakwater.connect._admission import Admission
from breakwater.connect._upstream import BACKGROUND_JITTER, Upstream
from breakwater.status import Reason, ServerState
from breakwater.testing import FakeClock

pytestmark = pytest.mark.anyio


def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_upstream(spec: ServerSpec, clock: FakeClock, tmp_path: Path, seed: int = 7) -> tuple[Upstream, list[ServerState]]:
    rng = random.Random(seed)
    seen: list[ServerState] = []
    upstream = Upstream(
        spec,
        clock=clock,
        rng=rng,
        admission=Admission(clock=clock, rng=rng, directory=tmp_path / "admission"),
        on_change=lambda u: seen.append(u.state),
    )
    return upstream, seen


async def wait_for_state(upstream: Upstream, *states: ServerState, attempts: int = 0) -> None:
    """Wait (real time, briefly) until the upstream is in one of `states` after at least `attempts` attempts."""
    with anyio.fail_after(10):
        while upstream.state not in states or upstream.attempts < attempts:
            await anyio.sleep(0.002)


POLICY = ConnectPolicy(startup_jitter_s=0, budget_s=20, backoff_base_s=1, backoff_cap_s=8, background_retry_s=60)


async def test_refused_server_backs_off_with_full_jitter_then_fails_and_keeps_trying(tmp_path: Path) -> None:
    """Each retry waits U(0, min(cap, base*2^n)); once the budget cannot cover the next wait the server is
    `failed`, and background attempts continue at the slow jittered cadence."""
    clock = FakeClock()
    spec = ServerSpec(name="down", transport="http", url=f"http://127.0.0.1:{closed_port()}/mcp", connect=POLICY)
    upstream, _ = make_upstream(spec, clock, tmp_path)
    start = clock.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        retries = 0
        await wait_for_state(upstream, ServerState.RETRYING, ServerState.FAILED)
        while True:
            assert upstream.error is not None and upstream.error.code is Reason.REFUSED
            assert upstream.next_retry_at is not None
            delay = upstream.next_retry_at - clock.time()
            if upstream.state is ServerState.FAILED:
                break
            assert 0 <= delay <= min(8, 2**retries), (retries, delay)
            # The decision to keep retrying was made because the budget covers the wait.
            assert clock.monotonic() + delay - start <= POLICY.budget_s
            retries += 1
            clock.advance(delay)
            await wait_for_state(upstream, ServerState.RETRYING, ServerState.FAILED, attempts=retries + 1)
        # Failed only because the next wait would have crossed the budget.
        assert retries >= 3
        assert 60 * (1 - BACKGROUND_JITTER) <= delay <= 60 * (1 + BACKGROUND_JITTER)
        attempts = upstream.attempts
        for i in range(3):
            clock.advance(upstream.next_retry_at - clock.time())
            await wait_for_state(upstream, ServerState.FAILED, attempts=attempts + i + 1)
        assert upstream.attempts == attempts + 3, "background attempts continue after the budget is spent"
        tg.cancel_scope.cancel()


async def test_retry_schedule_is_reproducible_with_the_same_seed(tmp_path: Path) -> None:
    """Same seed, same schedule: the jitter comes only from the injected random source."""

    async def schedule(seed: int) -> list[float]:
        clock = FakeClock()
        spec = ServerSpec(name="down", transport="http", url=f"http://127.0.0.1:{closed_port()}/mcp", connect=POLICY)
        upstream, _ = make_upstream(spec, clock, tmp_path, seed=seed)
        delays = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(upstream.run)
            for i in range(4):
                await wait_for_state(upstream, ServerState.RETRYING, ServerState.FAILED, attempts=i + 1)
                delays.append(upstream.next_retry_at - clock.time())  # type: ignore[operator]
                clock.advance(delays[-1])
            tg.cancel_scope.cancel()
        return delays

    assert await schedule(1) == await schedule(1)
    assert await schedule(1) != await schedule(2)


async def test_missing_command_fails_at_once_without_burning_the_budget(tmp_path: Path) -> None:
    """A command that does not exist is `spawn_failed`: reported `failed` after one attempt, retried slowly."""
    clock = FakeClock()
    spec = ServerSpec(name="ghost", transport="stdio", command="breakwater-no-such-command", connect=POLICY)
    upstream, seen = make_upstream(spec, clock, tmp_path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        await wait_for_state(upstream, ServerState.FAILED)
        snap = upstream.snapshot()
        assert snap.attempts == 1
        assert snap.error is not None and snap.error.code is Reason.SPAWN_FAILED
        assert "breakwater-no-such-command" in snap.error.message
        assert seen[:3] == [ServerState.CONNECTING, ServerState.CONNECTING, ServerState.FAILED]
        tg.cancel_scope.cancel()


async def test_not_executable_is_spawn_failed(tmp_path: Path) -> None:
    """A file that exists but cannot be executed is `spawn_failed` too, with a message that says so."""
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")
    clock = FakeClock()
    spec = ServerSpec(name="noexec", transport="stdio", command=str(script), connect=POLICY)
    upstream, _ = make_upstream(spec, clock, tmp_path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        await wait_for_state(upstream, ServerState.FAILED)
        assert upstream.error is not None
        assert (upstream.error.code, upstream.error.message) == (Reason.SPAWN_FAILED, f"not executable: {script}")
        tg.cancel_scope.cancel()


async def test_disabled_server_is_never_tried(tmp_path: Path) -> None:
    """`enabled = false` means no attempt, state `disabled`."""
    clock = FakeClock()
    spec = ServerSpec(name="off", transport="stdio", command="whatever", enabled=False, connect=POLICY)
    upstream, _ = make_upstream(spec, clock, tmp_path)
    await upstream.run()
    assert (upstream.state, upstream.attempts) == (ServerState.DISABLED, 0)


async def test_startup_jitter_spreads_first_attempts(tmp_path: Path) -> None:
    """With a jitter window, the first attempt waits a uniform draw inside it, in state `pending`."""
    clock = FakeClock()
    policy = replace(POLICY, startup_jitter_s=5)
    spec = ServerSpec(name="down", transport="http", url=f"http://127.0.0.1:{closed_port()}/mcp", connect=policy)
    upstream, _ = make_upstream(spec, clock, tmp_path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)
        await clock.wait_for_sleepers(1)
        (wake,) = clock.sleepers
        assert clock.monotonic() <= wake <= clock.monotonic() + 5
        assert upstream.state is ServerState.PENDING and upstream.attempts == 0
        clock.advance_to(wake)
        await wait_for_state(upstream, ServerState.RETRYING)
        assert upstream.attempts == 1
        tg.cancel_scope.cancel()
