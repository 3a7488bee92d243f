"""`learned_at` says when a tool's learned timeout came into force, or nothing: never the reporting process's start.

A user's `breakwater status --json` showed, for a timeout the journal had learned hours before, the status command's
own start time. A process knows when a learned timeout came into force only when its own calls were enough to learn
from; for a value the journal had before that (after a restart, in a `breakwater status` run) `learned_at` is left out.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from breakwater.config import BreakerPolicy, ConnectPolicy, JournalPolicy, ServerSpec
from breakwater.gate._gate import CallGate
from breakwater.journal import AttemptRecord, Journal, SQLiteJournalStore
from breakwater.testing import FakeClock, Progress, ScriptedCall, ScriptedServer
from breakwater.testing.server import launch_command
from helpers import connected_upstream

BREAKWATER = [sys.executable, "-m", "breakwater"]
LEARNING = JournalPolicy(learn_min_samples=5)


@asynccontextmanager
async def _gate(clock: FakeClock, journal_says: dict[str, float]) -> AsyncIterator[CallGate]:
    """A gate over a real upstream (in-process SDK server, 10 ms tool `t`) that learns from its own calls
    (`LEARNING`) and reads the journal's learned value from `journal_says["t"]`, when it has one."""

    async def answer(_call: ScriptedCall, _n: int, _progress: Progress) -> CallToolResult:
        await clock.sleep(0.01)
        return CallToolResult(content=[TextContent(type="text", text="ok")])

    listed = [Tool(name="t", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))]
    spec = ServerSpec(
        name="s",
        transport="stdio",
        command="unused",
        connect=ConnectPolicy(startup_jitter_s=0, health_interval_s=0),
        breaker=BreakerPolicy(consecutive_failures=1000, failure_rate=1.0),
    )
    rng = random.Random(1)
    async with connected_upstream(spec, ScriptedServer(listed, answer), clock=clock, rng=rng) as upstream:
        yield CallGate(
            {"s": upstream}, clock=clock, rng=rng, learned_timeout=lambda _s, tool: journal_says.get(tool), learning=LEARNING
        )


@pytest.mark.anyio
async def test_a_timeout_the_journal_learned_before_this_process_has_no_learned_at() -> None:
    clock = FakeClock()
    async with _gate(clock, {"t": 2.5}) as gate:
        assert gate.timeout_in_force("s", "t") == (2.5, "learned")
        assert gate.learned_at("s", "t") is None  # not "now": it was in force before this process started


@pytest.mark.anyio
async def test_learned_at_is_when_this_processs_own_calls_were_enough_and_stays_so() -> None:
    """Learned at the 5th call (`learn_min_samples`); a later call, and then the journal's refresh taking over with
    its own value, leave `learned_at` where it was."""
    clock = FakeClock()
    journal_says: dict[str, float] = {}
    async with _gate(clock, journal_says) as gate:

        async def calls() -> float:
            for _ in range(LEARNING.learn_min_samples):
                assert gate.timeout_in_force("s", "t") == (5.0, "default")
                await gate.call("s", "t")
                await clock.sleep(1.0)
            at = clock.time()
            assert gate.timeout_in_force("s", "t") == (1.0, "learned")  # the floor, for a 10 ms tool
            await clock.sleep(60.0)
            await gate.call("s", "t")
            journal_says["t"] = 1.2
            assert gate.timeout_in_force("s", "t") == (1.2, "learned")
            return at

        learned_at = await clock.run(calls)
        assert gate.learned_at("s", "t") == learned_at


def test_status_json_leaves_out_learned_at_for_a_timeout_learned_before_it_ran(tmp_path: Path) -> None:
    """`breakwater status --json` against a real testserver, with a journal a previous gateway left 20 minutes ago: the
    learned timeout and its source are shown, with no `learned_at` (it printed the status command's own start)."""
    journal = tmp_path / "journal.sqlite3"
    seed = Journal(SQLiteJournalStore(journal))
    earlier = time.time() - 1200
    for i in range(60):
        record = AttemptRecord(
            server="ts",
            tool="work",
            call_id=f"c{i}",
            attempt=1,
            started_at=earlier,
            duration_s=0.8,
            outcome="completed",
        )
        seed.record(record)
    seed.close()
    cmd = launch_command("--tool", "work:latency=0,readonly")
    config = tmp_path / "breakwater.toml"
    config.write_text(f"[servers.ts]\ncommand = {json.dumps(cmd[0])}\nargs = {json.dumps(cmd[1:])}\n")
    env = {
        **os.environ,
        "BREAKWATER_JOURNAL": str(journal),
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
    }
    out = subprocess.run(
        [*BREAKWATER, "status", "--json", "--config", str(config), "--wait", "30"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    work = next(t for t in json.loads(out.stdout)["timeouts"] if t["tool"] == "work")
    assert work == {"server": "ts", "tool": "work", "timeout_s": pytest.approx(1.6, rel=0.01), "source": "learned"}
