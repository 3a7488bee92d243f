"""Admission caps hold across processes, and a dead holder never leaks a slot."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from breakwater import SystemClock
from breakwater.connect._admission import Admission, Slot
from breakwater.testing import FakeClock

pytestmark = pytest.mark.anyio


def admission(tmp_path: Path, clock: FakeClock | SystemClock) -> Admission:
    return Admission(clock=clock, rng=random.Random(1), directory=tmp_path)


async def test_cap_is_shared_between_independent_holders(tmp_path: Path) -> None:
    """Two slots: a third acquirer (another Admission, as another process would be) waits until one is released."""
    clock = FakeClock()
    first, second, third = (admission(tmp_path, clock) for _ in range(3))
    slot = [Slot("server-x", 2)]
    t1 = await first.acquire(slot)
    t2 = await second.acquire(slot)  # held, not dropped: a ticket nobody holds gives its slot back
    got: list[str] = []

    async def wait_third() -> None:
        ticket = await third.acquire(slot)
        got.append("third")
        ticket.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_third)
        await clock.wait_for_sleepers(1)  # it is polling: the cap is full
        assert got == []
        t1.release()
        while not got:
            await clock.step()
    assert got == ["third"]
    t2.release()


async def test_all_or_nothing_across_slots(tmp_path: Path) -> None:
    """A ticket holds every slot it needs, or none: a full second slot does not leave the first held."""
    clock = FakeClock()
    a, b = admission(tmp_path, clock), admission(tmp_path, clock)
    held = await a.acquire([Slot("stdio", 1)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(b.acquire, [Slot("server-y", 1), Slot("stdio", 1)])
        await clock.wait_for_sleepers(1)
        # server-y must be free while b waits for stdio.
        probe = admission(tmp_path, clock)
        # The fake clock stands still, so a held slot would block this forever: a real bound fails it instead.
        with anyio.fail_after(5):
            ticket = await probe.acquire([Slot("server-y", 1)])
        assert ticket is not None
        ticket.release()
        tg.cancel_scope.cancel()
    held.release()


async def test_local_slots_do_not_touch_the_lock_directory(tmp_path: Path) -> None:
    """A per-process cap (shared=False) counts in memory only."""
    clock = FakeClock()
    a = admission(tmp_path, clock)
    t = await a.acquire([Slot("http", 1, shared=False)])
    assert not (tmp_path / "http").exists()
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.acquire, [Slot("http", 1, shared=False)])
        await clock.wait_for_sleepers(1)
        t.release()
        await clock.step()
        tg.cancel_scope.cancel()


async def test_a_ticket_nobody_holds_gives_its_slot_back(tmp_path: Path) -> None:
    """A dropped ticket's lock file is unlocked when the ticket goes (it used to stay locked until exit)."""
    clock = FakeClock()
    slot = [Slot("server-d", 1)]
    ticket = await admission(tmp_path, clock).acquire(slot)
    del ticket
    gc.collect()
    with anyio.fail_after(5):  # the fake clock stands still: a slot still held would block forever
        again = await admission(tmp_path, clock).acquire(slot)
    again.release()


async def test_slot_held_by_another_process_is_respected_and_freed_when_it_dies(tmp_path: Path) -> None:
    """A real second process holds the only slot; when it is killed the kernel frees the lock and we get it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import anyio, random, sys, time
                from pathlib import Path
                from breakwater.connect._admission import Admission, Slot
                from breakwater import SystemClock
                async def main():
                    a = Admission(clock=SystemClock(), rng=random.Random(), directory=Path({str(tmp_path)!r}))
                    ticket = await a.acquire([Slot("server-z", 1)])
                    print("held", flush=True)
                    time.sleep(60)
                anyio.run(main)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        ours = admission(tmp_path, SystemClock())
        with anyio.move_on_after(0.3) as scope:
            await ours.acquire([Slot("server-z", 1)])
        assert scope.cancelled_caught, "the slot held by the other process must not be granted"
        holder.kill()
        holder.wait()
        with anyio.fail_after(5):
            ticket = await ours.acquire([Slot("server-z", 1)])
        ticket.release()
    finally:
        holder.kill()
        holder.wait()


async def test_a_directory_removed_after_start_is_made_again(tmp_path: Path) -> None:
    """A cleaned /tmp took a shared gateway down (the demo's admission directory, removed when it ended): the next
    connect makes the directory again, and the caps still hold across holders."""
    import shutil

    clock = FakeClock()
    directory = tmp_path / "admission"
    first, second = Admission(clock=clock, rng=random.Random(1), directory=directory), admission(directory, clock)
    shutil.rmtree(directory)
    held = await first.acquire([Slot("server-x", 1)])
    assert (directory / "server-x").is_dir()
    async with anyio.create_task_group() as tg:
        tg.start_soon(second.acquire, [Slot("server-x", 1)])
        await clock.wait_for_sleepers(1)  # the cap is shared again: the second holder waits
        held.release()
        while clock.sleepers:
            await clock.step()


async def test_a_directory_that_became_unusable_leaves_the_caps_per_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Replaced by a file (or unwritable, or on a full disk): no error reaches the connect loop; the caps hold in
    this process, and a warning says why."""
    import shutil

    clock = FakeClock()
    directory = tmp_path / "admission"
    gate = Admission(clock=clock, rng=random.Random(1), directory=directory)
    shutil.rmtree(directory)
    directory.write_text("not a directory")
    held = await gate.acquire([Slot("server-x", 1)])
    assert f"cannot keep the connect admission locks in {directory} (a file is where a directory should be)" in caplog.text
    assert "the connect caps hold per process" in caplog.text and "[connect] admission_dir" in caplog.text
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.acquire, [Slot("server-x", 1)])
        await clock.wait_for_sleepers(1)  # the cap of 1 still holds, in this process
        held.release()
        while clock.sleepers:
            await clock.step()


def test_a_directory_that_cannot_be_made_at_start_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """At start it was silent: the caps fell back to per process, and nobody knew why a storm of sessions was not
    capped across them."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    for _ in range(2):
        Admission(clock=FakeClock(), rng=random.Random(1), directory=blocker / "admission")
    said = [r.getMessage() for r in caplog.records if "admission locks" in r.getMessage()]
    assert len(said) == 1 and "(fix: set [connect] admission_dir (BREAKWATER_ADMISSION_DIR) to a writable directory)" in said[0]
