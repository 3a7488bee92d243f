"""A shared gateway that goes away under calls in flight: stopped (`breakwater gateway stop`), or killed.

Real processes throughout: `breakwater serve` sessions on pipes of the test's own, the detached
shared gateway they attach to, and `breakwater testserver` over stdio as each session's own server.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PipeAgent, gateway_pids, isolated_env, share_dir

pytestmark = pytest.mark.long_module(50)

BREAKWATER = [sys.executable, "-m", "breakwater"]
TOOLS = ["rslow:latency=2,readonly", "mslow:latency=2,mutating", "mhang:hang=1,mutating"]
DRAIN_S = 4.0


@pytest.fixture
def share() -> Iterator[Path]:
    """A socket directory of the test's own; its gateways die after."""
    with share_dir("bw-st-") as directory:
        yield directory


def setup(tmp_path: Path, share: Path) -> tuple[Path, dict[str, str]]:
    command = [*BREAKWATER, "testserver", "--name", "ts", "--default-tools"]
    for tool in TOOLS:
        command += ["--tool", tool]
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"ts": {"command": command[0], "args": command[1:]}}}))
    env = isolated_env(
        tmp_path,
        BREAKWATER_SHARE="on",
        BREAKWATER_SHARE_DIR=str(share),
        BREAKWATER_SHARE_IDLE_S="20",
        BREAKWATER_DRAIN_S=str(DRAIN_S),
    )
    return config, env


def _logged(share: Path, text: str, timeout: float) -> None:
    """Wait until a gateway's log in `share` holds `text`."""
    deadline = time.monotonic() + timeout
    while not any(text in log.read_text(errors="replace") for log in share.glob("*.log")):
        assert time.monotonic() < deadline, f"no gateway logged {text!r}"
        time.sleep(0.02)


def result_of(answer: dict[str, Any]) -> dict[str, Any]:
    assert "result" in answer, answer  # never a bare JSON-RPC error (the SDK's -32000 "Connection closed")
    result: dict[str, Any] = answer["result"]
    return result


def ran(answer: dict[str, Any]) -> int:
    """The pid of the testserver that answered the call (it ran to its end)."""
    result = result_of(answer)
    assert not result.get("isError"), result
    return int(result["structuredContent"]["pid"])


def code(answer: dict[str, Any]) -> str:
    result = result_of(answer)
    assert result.get("isError"), result
    return str(result["structuredContent"]["code"])


def test_gateway_stop_drains_the_calls_in_flight_and_the_sessions_go_on(tmp_path: Path, share: Path) -> None:
    """`gateway stop` under calls in flight: they finish (the one past the window is cut with the gate's envelope, never
    a bare error), a request the agent sends during the drain waits for the next gateway, and both sessions go on."""
    config, env = setup(tmp_path, share)
    a, b = PipeAgent(config, env, tmp_path / "a.err"), PipeAgent(config, env, tmp_path / "b.err")
    try:
        for agent in (a, b):
            agent.call("warm", "ts__echo")
        first = {ran(a.wait("warm", 60)), ran(b.wait("warm", 60))}
        [gateway] = gateway_pids(share)
        a.call("r", "ts__rslow")
        a.call("m", "ts__mslow")
        b.call("h", "ts__mhang")
        time.sleep(0.7)  # all three are running in their testservers
        started = time.monotonic()
        stop = subprocess.Popen([*BREAKWATER, "gateway", "stop"], env=env, stdout=subprocess.PIPE, text=True)
        # Once the gateway drains: a fixed wait was not always enough for `gateway stop` to start on a loaded host,
        # and the old gateway ran the request.
        _logged(share, "asked to stop (breakwater gateway stop): draining", 30)
        time.sleep(0.2)
        a.call("during", "ts__echo")  # read by nobody until the next gateway
        out, _ = stop.communicate(timeout=DRAIN_S + 20)
        took = time.monotonic() - started
        assert stop.returncode == 0 and f"stopped the shared gateway pid {gateway} (2 sessions, drained in" in out, out
        assert DRAIN_S - 0.5 < took < DRAIN_S + 5  # it waited for the drain: the hanging call held it to the window
        # The calls finished where they ran; the one past the window was cut, as a drain cuts a mutating call.
        assert ran(a.wait("r", 5)) in first and ran(a.wait("m", 5)) in first
        # Cut with the drain's envelope, or, when the cut's answer is not written within its grace (CUT_GRACE_S, a
        # loaded host), by the session's `serve` as after a kill -9: OUTCOME_UNKNOWN either way, never a bare error.
        answer = b.wait("h", 5)
        assert code(answer) == "OUTCOME_UNKNOWN", answer
        assert ran(a.wait("during", 30)) not in first  # answered by the next gateway's process of the server
        for agent in (a, b):
            agent.call("after", "ts__echo")
            assert ran(agent.wait("after", 30)) not in first
        assert gateway not in gateway_pids(share)
    finally:
        for agent in (a, b):
            agent.end()
        subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=True)
    assert not gateway_pids(share)


def test_a_gateway_killed_under_a_read_the_agent_never_listed_sends_it_again(tmp_path: Path, share: Path) -> None:
    """The gateway tells the session which tools only read: a read in flight is sent again to the next gateway even
    though the agent never called tools/list; a mutating one is answered OUTCOME_UNKNOWN."""
    config, env = setup(tmp_path, share)
    a = PipeAgent(config, env, tmp_path / "a.err")
    try:
        a.call("warm", "ts__echo")
        first = ran(a.wait("warm", 60))
        [gateway] = gateway_pids(share)
        a.call("r", "ts__rslow")
        a.call("m", "ts__mslow")
        time.sleep(0.7)
        os.kill(gateway, signal.SIGKILL)
        assert code(a.wait("m", 10)) == "OUTCOME_UNKNOWN"
        assert ran(a.wait("r", 30)) != first  # run again, by the next gateway's process of the server
    finally:
        a.end()
        subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=True)
    assert not gateway_pids(share)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a stopped process is read from /proc")
def test_a_stopped_gateway_is_named_and_holds_nobody(tmp_path: Path, share: Path) -> None:
    """A gateway under SIGSTOP (a debugger, a suspended terminal job) held `gateway list`, `gateway stop` and `status`
    for good, and a new session for 16 s, past the start-up limits of agents (Codex: 10 s)."""
    config, env = setup(tmp_path, share)
    a = PipeAgent(config, env, tmp_path / "a.err")
    [gateway] = gateway_pids(share)
    os.kill(gateway, signal.SIGSTOP)
    try:
        commands = {
            "list": [*BREAKWATER, "gateway", "list"],
            "stop": [*BREAKWATER, "gateway", "stop"],
            "status": [*BREAKWATER, "status", "--config", str(config), "--json"],
        }
        said = {n: subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30) for n, argv in commands.items()}
        for name in ("list", "stop"):
            assert f"pid {gateway}) is stopped" in said[name].stdout and f"kill -CONT {gateway}" in said[name].stdout, said[name]
        # status connects from here instead, and says why.
        assert said["status"].returncode == 0 and json.loads(said["status"].stdout)["servers"][0]["state"] == "ready"
        assert f"pid {gateway}) is stopped" in said["status"].stderr
        b = PipeAgent(config, env, tmp_path / "b.err")  # served on its own, at once
        b.call("b", "ts__echo")
        assert ran(b.wait("b", 30)) != gateway
        b.end()
        assert "serving this session on its own" in (tmp_path / "b.err").read_text()
    finally:
        os.kill(gateway, signal.SIGCONT)
    # Resumed, it serves on: its socket was kept.
    a.call("a", "ts__echo")
    ran(a.wait("a", 30))
    listed = subprocess.run([*BREAKWATER, "gateway", "list", "--json"], env=env, capture_output=True, text=True, timeout=30)
    assert [row["pid"] for row in json.loads(listed.stdout)] == [gateway]
    # `--config`, as every command takes it (it was refused here): its share_dir says where to look.
    argv = [*BREAKWATER, "gateway", "list", "--json", "--config", str(config)]
    assert [row["pid"] for row in json.loads(subprocess.check_output(argv, env=env, text=True, timeout=30))] == [gateway]
    a.end()
    subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=True)


def test_a_gateway_that_listens_and_never_answers_is_named_within_seconds(tmp_path: Path, share: Path) -> None:
    """One that has listened a while is given `ANSWER_WAIT_S`, not the 15 s of one still starting; its socket is kept."""
    import socket

    from breakwater.gateway._share import ANSWER_WAIT_S

    env = isolated_env(tmp_path, BREAKWATER_SHARE="on", BREAKWATER_SHARE_DIR=str(share))
    path = share / "gw-stuck.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()  # and never accepts: a gateway stuck in a loop that never yields
    an_hour_ago = time.time() - 3600
    os.utime(path, (an_hour_ago, an_hour_ago))
    try:
        started = time.monotonic()
        listed = subprocess.run([*BREAKWATER, "gateway", "list"], env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
        assert f"did not answer within {ANSWER_WAIT_S:g} s" in listed.stdout, listed
        assert took < ANSWER_WAIT_S + 5, took
        assert path.exists(), "a gateway that may yet answer lost its socket"
    finally:
        listener.close()


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or Path(f"/run/user/{os.getuid()}").is_dir(),
    reason="a Linux host without /run/user/UID, where a process without XDG_RUNTIME_DIR keeps its sockets in the cache",
)
def test_a_gateway_an_agent_started_without_xdg_runtime_dir_is_found_from_a_shell_that_has_it(tmp_path: Path) -> None:
    """An agent that starts `serve` with a minimal environment (the SDKs' default: HOME, no XDG_RUNTIME_DIR nor
    XDG_CACHE_HOME) has its gateway's socket in ~/.cache; `gateway list` and `stop` from the user's shell, those set,
    said no gateway was running, and a session started with them would have started a second gateway for the config."""
    with share_dir("bw-xr-") as home, share_dir("bw-rt-") as run:  # short: a socket's path must fit in ~107 bytes
        config, _ = setup(tmp_path, home)
        base = isolated_env(tmp_path, BREAKWATER_SHARE="on", BREAKWATER_SHARE_IDLE_S="20", HOME=str(home))
        base.pop("BREAKWATER_SHARE_DIR", None)
        agent_env = {name: value for name, value in base.items() if name not in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME")}
        run.chmod(0o700)
        shell_env = {**base, "XDG_RUNTIME_DIR": str(run), "XDG_CACHE_HOME": str(run / "cache")}
        sockets = home / ".cache" / "breakwater" / "gateways"
        agent = PipeAgent(config, agent_env, tmp_path / "a.err")
        second: PipeAgent | None = None
        try:
            agent.call("warm", "ts__echo")
            ran(agent.wait("warm", 60))
            [gateway] = gateway_pids(sockets)
            listing = subprocess.run([*BREAKWATER, "gateway", "list", "--json"], env=shell_env, capture_output=True, text=True)
            assert [row["pid"] for row in json.loads(listing.stdout)] == [gateway], listing
            second = PipeAgent(config, shell_env, tmp_path / "b.err")  # the shell's session joins the agent's gateway
            second.call("warm", "ts__echo")
            ran(second.wait("warm", 60))
            assert gateway_pids(sockets) == [gateway]
            assert not list(run.rglob("*.sock"))
            stop = subprocess.run(
                [*BREAKWATER, "gateway", "stop", "--config", str(config)], env=shell_env, capture_output=True, text=True
            )
            assert f"stopped the shared gateway pid {gateway} (2 sessions" in stop.stdout, stop
        finally:
            for each in (agent, second):
                if each is not None:
                    each.end()
            for pid in gateway_pids(sockets):
                os.kill(pid, signal.SIGKILL)


def test_status_reports_the_servers_the_agents_sessions_run_as_they_see_them(tmp_path: Path, share: Path) -> None:
    """With the default config (every server stdio, so each session runs its own copies), `status` started a copy of
    every server from the terminal and reported it ready, exit 0, while the agent's calls were refused: its copy had
    been killed and could not come back. It reports the sessions' own view now, and starts nothing."""
    from breakwater.testing.server import launch_command, read_state

    state, flag = tmp_path / "state.json", tmp_path / "broken"
    server = launch_command("--name", "ts", "--default-tools", "--state-file", str(state))
    guard = f'[ -e {shlex.quote(str(flag))} ] && exit 3; exec "$@"'
    config, env = setup(tmp_path, share)
    config.write_text(json.dumps({"mcpServers": {"ts": {"command": "sh", "args": ["-c", guard, "sh", *server]}}}))
    agent = PipeAgent(config, env, tmp_path / "a.err")

    def status() -> tuple[int, dict[str, Any]]:
        done = subprocess.run([*BREAKWATER, "status", "--json", "--config", str(config)], env=env, capture_output=True, text=True)
        return done.returncode, {s["name"]: s for s in json.loads(done.stdout)["servers"]}

    try:
        agent.call("warm", "ts__echo")
        pid = ran(agent.wait("warm", 60))
        code, servers = status()
        assert (code, servers["ts"]["state"]) == (0, "ready")
        assert read_state(state)["pid"] == pid  # no copy of its own: the state file is still the session's server's
        flag.touch()  # from here on the server cannot start again, in the session or anywhere
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (seen := status())[1]["ts"]["state"] == "ready":
            assert time.monotonic() < deadline, "status never saw the session's server go"
            time.sleep(0.2)
        assert seen[0] == 1 and seen[1]["ts"]["state"] in ("retrying", "failed", "connecting"), seen
    finally:
        agent.end()


def test_a_gateway_someone_keeps_looking_at_still_idles_out(tmp_path: Path, share: Path) -> None:
    """`gateway list` every second (a status bar, a person watching) kept an idle gateway, and its servers, alive for
    ever: each look restarted the idle count. A look is no session."""
    config, env = setup(tmp_path, share)
    env = {**env, "BREAKWATER_SHARE_IDLE_S": "3"}
    agent = PipeAgent(config, env, tmp_path / "a.err")
    agent.call("warm", "ts__echo")
    ran(agent.wait("warm", 60))
    [gateway] = gateway_pids(share)
    agent.end()
    ended = time.monotonic()
    while gateway in gateway_pids(share):  # each look is a `gateway list`'s: a connection that asks for info
        assert time.monotonic() - ended < 15, "the gateway never idled out while it was looked at"
        time.sleep(0.5)
