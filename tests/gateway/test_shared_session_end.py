"""Several agent sessions on one shared gateway: how one session's end (its input closed, Ctrl-C) meets the others.

Real processes throughout: `breakwater serve` sessions on pipes of the test's own, the detached shared gateway
they attach to, and `breakwater testserver` over stdio behind it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PipeAgent, isolated_env, share_dir

pytestmark = pytest.mark.long_module(25)

BREAKWATER = [sys.executable, "-m", "breakwater"]
DRAIN_S = 1.5
#: Longer than the drain window: cut by a drain, it would come back OUTCOME_UNKNOWN.
SLOW_S = 4.0


@pytest.fixture
def share() -> Iterator[Path]:
    """A socket directory of the test's own; its gateways die after."""
    with share_dir("bw-sx-") as directory:
        yield directory


def setup(tmp_path: Path, share: Path, *, shared: bool, drain_s: float = DRAIN_S) -> tuple[Path, dict[str, str]]:
    """A config of one stdio testserver with a slow mutating tool: the gateway's own (`shared`) or each session's."""
    command = [*BREAKWATER, "testserver", "--name", "ts", "--tool", "echo", "--tool", f"mslow:latency={SLOW_S},mutating"]
    entry: dict[str, Any] = {"command": command[0], "args": command[1:], "shared": shared}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"ts": entry}}))
    env = isolated_env(
        tmp_path,
        BREAKWATER_SHARE="on",
        BREAKWATER_SHARE_DIR=str(share),
        BREAKWATER_SHARE_IDLE_S="20",
        BREAKWATER_DRAIN_S=str(drain_s),
    )
    return config, env


def ran(answer: dict[str, Any]) -> int:
    """The pid of the testserver that answered the call (it ran to its end)."""
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    assert not result.get("isError"), result
    return int(result["structuredContent"]["pid"])


@pytest.mark.parametrize("how", ["input closed", "SIGINT"])
def test_one_sessions_end_neither_cuts_nor_spoils_another_sessions_calls(tmp_path: Path, share: Path, how: str) -> None:
    """With no per-session server (every server the gateway's own), all sessions were served by the shared gateway's
    one `Gateway`, and a session's end drained its `Drain`: the other session's long call was cut OUTCOME_UNKNOWN
    at the window's end, and every later call of every session was refused as cut, never sent."""
    config, env = setup(tmp_path, share, shared=True)
    a, b = PipeAgent(config, env, tmp_path / "a.err"), PipeAgent(config, env, tmp_path / "b.err")
    try:
        for agent in (a, b):
            agent.call("warm", "ts__echo")
        server = ran(a.wait("warm", 60))
        assert ran(b.wait("warm", 60)) == server  # one shared process of the server
        b.call("slow", "ts__mslow")
        time.sleep(0.5)  # running in the server
        if how == "SIGINT":
            a.proc.send_signal(signal.SIGINT)
        else:
            assert a.proc.stdin is not None
            a.proc.stdin.close()
        assert a.proc.wait(30) in ({130, -signal.SIGINT} if how == "SIGINT" else {0})
        assert ran(b.wait("slow", SLOW_S + 10)) == server  # it ran to its end, answered as it finished
        b.call("after", "ts__echo")
        assert ran(b.wait("after", 10)) == server
        c = PipeAgent(config, env, tmp_path / "c.err")  # a new session on the same gateway
        c.call("new", "ts__echo")
        assert ran(c.wait("new", 30)) == server
        c.end()
    finally:
        for agent in (a, b):
            agent.end()
        subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=True)


def test_a_request_after_ctrl_c_is_refused_at_once_as_without_sharing(tmp_path: Path, share: Path) -> None:
    """After a first stop signal to `serve`, its calls in flight drain; a request the agent sends meanwhile was never
    read (the input was paused for a next gateway that never comes) and the session ended with it unanswered.
    `serve --no-share` refuses it at once, saying nothing ran."""
    config, env = setup(tmp_path, share, shared=False, drain_s=SLOW_S + 10)
    a = PipeAgent(config, env, tmp_path / "a.err")
    try:
        a.call("warm", "ts__echo")
        server = ran(a.wait("warm", 60))
        a.call("slow", "ts__mslow")
        time.sleep(0.3)
        a.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        a.call("late", "ts__echo")
        late = a.wait("late", 5)
        assert late["error"]["code"] == -32603 and "nothing was run" in late["error"]["message"], late
        assert ran(a.wait("slow", SLOW_S + 10)) == server  # the call in flight finished within the drain
        assert a.proc.wait(30) in {130, -signal.SIGINT}
    finally:
        a.end()
        subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=True)


@pytest.mark.parametrize("shared", [False, True], ids=["own server", "shared server"])
def test_a_second_ctrl_c_answers_the_call_in_flight_with_the_gates_envelope(tmp_path: Path, share: Path, shared: bool) -> None:
    """A second stop signal exits `serve` at once; a mutating call still running was answered a bare -32000 "Connection
    closed" where `serve --no-share` answers OUTCOME_UNKNOWN naming its operation. The gateway still holds the agent's
    pipe: it cuts the call through the drain and writes the envelope there before the pipe ends."""
    config, env = setup(tmp_path, share, shared=shared, drain_s=SLOW_S + 10)
    a = PipeAgent(config, env, tmp_path / "a.err")
    try:
        a.call("warm", "ts__echo")
        ran(a.wait("warm", 60))
        a.call("slow", "ts__mslow")
        time.sleep(0.5)  # running in the server
        a.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        a.proc.send_signal(signal.SIGINT)
        assert a.proc.wait(30) in {130, -signal.SIGINT}
        cut = a.wait("slow", 10)
        assert "result" in cut, cut
        body = cut["result"]["structuredContent"]
        assert cut["result"]["isError"] and body["code"] == "OUTCOME_UNKNOWN" and body["operation_id"], body
    finally:
        a.end()
        subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=True)
