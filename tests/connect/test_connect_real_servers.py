"""Every connect state and reason, with real server processes and real sockets.

These are wall-clock tests on purpose: a process that hangs, exits or is killed, and a socket that
is refused or reset, must be seen for real. Bounds are generous.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from breakwater import Breakwater, Config, ConnectPolicy, Reason, ServerSpec, ServerState
from breakwater.testing.server import launch_command, serve_http

pytestmark = [pytest.mark.long_module(81), pytest.mark.anyio]

FAST = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.2, backoff_cap_s=1, budget_s=30, attempt_timeout_s=10)


def stdio(name: str, *flags: str, policy: ConnectPolicy = FAST, **kw: object) -> ServerSpec:
    cmd = launch_command("--name", name, *flags)
    return ServerSpec(name=name, transport="stdio", command=cmd[0], args=tuple(cmd[1:]), connect=policy, **kw)  # type: ignore[arg-type]


def http(name: str, url: str, policy: ConnectPolicy = FAST, **kw: object) -> ServerSpec:
    return ServerSpec(name=name, transport="http", url=url, connect=policy, **kw)  # type: ignore[arg-type]


def breakwater(tmp_path: Path, *specs: ServerSpec) -> Breakwater:
    return Breakwater(Config(servers=specs), admission_dir=tmp_path / "admission")


async def until(bw: Breakwater, name: str, *states: ServerState, timeout: float = 30, min_attempts: int = 0) -> None:
    with anyio.fail_after(timeout):
        while True:
            snap = bw.upstream(name).snapshot()
            if snap.state in states and snap.attempts >= min_attempts:
                return
            await bw.wait_changed()


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line contains `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                status = (entry / "status").read_text()
            except OSError:
                continue
            if marker in cmdline and "State:\tZ" not in status:
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def free_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    yield port


async def test_healthy_stdio_server_becomes_ready(tmp_path: Path) -> None:
    """A healthy stdio server: `ready` after one attempt, with its protocol revision and tool count."""
    async with breakwater(tmp_path, stdio("ok")) as bw:
        assert bw.status().servers[0].state in (ServerState.PENDING, ServerState.CONNECTING)
        report = await bw.wait_ready(timeout=30)
    (s,) = report.servers
    assert (s.state, s.attempts, s.protocol, s.error) == (ServerState.READY, 1, "2026-07-28", None)
    assert s.tools is not None and s.tools >= 5
    assert s.connect_ms is not None and 0 < s.connect_ms < 30_000


async def test_a_command_line_written_into_command_starts_as_cursor_starts_it(tmp_path: Path) -> None:
    """Cursor's install links write `"command": "npx -y pkg --flag"` with no `args`, and Cursor starts it: here too,
    split as a shell splits words (quotes included), with `args` after them. A program whose own path holds a space
    is started as it is, and a first word that is no program is still `spawn_failed`."""
    cmd = launch_command("--tool", "add")
    spaced = tmp_path / "my tools" / "server"
    spaced.parent.mkdir()
    spaced.write_text(f"#!/bin/sh\nexec {shlex.join(cmd)} --name spaced-path\n")
    spaced.chmod(0o755)
    specs = [
        ServerSpec(name="joined", transport="stdio", command=shlex.join([*cmd, "--name", "joined"]), connect=FAST),
        ServerSpec(name="quoted", transport="stdio", command=f"sh -c {shlex.quote(shlex.join(cmd))}", connect=FAST),
        ServerSpec(name="head", transport="stdio", command=shlex.join(cmd[:3]), args=tuple(cmd[3:]), connect=FAST),
        ServerSpec(name="spaced", transport="stdio", command=str(spaced), connect=FAST),
        ServerSpec(name="nothing", transport="stdio", command="breakwater-no-such-program --flag", connect=FAST),
    ]
    async with breakwater(tmp_path, *specs) as bw:
        report = await bw.wait_ready(timeout=30)
        by_name = {s.name: s for s in report.servers}
        assert {n: by_name[n].state for n in ("joined", "quoted", "head", "spaced")} == dict.fromkeys(
            ("joined", "quoted", "head", "spaced"), ServerState.READY
        )
        assert by_name["nothing"].error is not None and by_name["nothing"].error.code is Reason.SPAWN_FAILED
        answers = {name: await bw.call_tool(name, "add", {"a": 1, "b": 2}) for name in ("joined", "spaced")}
    assert {name: (a.structured_content or {}).get("server") for name, a in answers.items()} == {
        "joined": "joined",
        "spaced": "spaced-path",
    }


async def test_entering_never_blocks_on_a_slow_server(tmp_path: Path) -> None:
    """The library is usable at once: entering returns while a server is still connecting."""
    started = time.monotonic()
    async with breakwater(tmp_path, stdio("slowstart", "--startup-delay", "30")) as bw:
        assert time.monotonic() - started < 2
        await until(bw, "slowstart", ServerState.CONNECTING)
        assert bw.status().summary == {"connecting": 1}


async def test_pinned_legacy_protocol(tmp_path: Path) -> None:
    """`protocol = "2025-11-25"` connects with the initialize handshake."""
    async with breakwater(tmp_path, stdio("legacy", policy=replace(FAST, protocol="2025-11-25"))) as bw:
        report = await bw.wait_ready(timeout=30)
    assert report.servers[0].protocol == "2025-11-25"


async def test_process_that_exits_reports_code_and_stderr(tmp_path: Path) -> None:
    """A server that exits at start is `exited`, with its exit code and its last stderr line."""
    spec = stdio("dies", "--exit-at-start", "3", "--exit-message", "ModuleNotFoundError: no module named 'tax'")
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "dies", ServerState.RETRYING, ServerState.FAILED)
        snap = bw.status().servers[0]
    assert snap.error is not None
    assert (snap.error.code, snap.error.exit_code) == (Reason.EXITED, 3)
    assert "no module named 'tax'" in snap.error.message
    assert snap.error.stderr_tail[-1] == "ModuleNotFoundError: no module named 'tax'"
    assert snap.next_retry_at is not None


@pytest.mark.parametrize(
    ("flags", "code", "exit_code"),
    [
        (("--exit-at-start", "1"), Reason.EXITED, 1),
        # A second after each handshake: it was restarted at once, every time, forever, and read as ready. A drop so
        # soon after ready, exiting as the last one did, is a failed attempt (backed off), and three are a crash loop.
        (("--exit-after", "1"), Reason.CONNECTION_LOST, 9),
    ],
)
async def test_crash_loop_is_failed_before_the_budget_is_spent(
    tmp_path: Path, flags: tuple[str, ...], code: Reason, exit_code: int
) -> None:
    """A process that exits the same way three times in a row is a crash loop: `failed`, not `retrying` for minutes."""
    spec = stdio("crashloop", *flags, "--exit-message", "Fatal: config file missing")
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "crashloop", ServerState.FAILED)
        snap = bw.status().servers[0]
    assert snap.attempts == 3
    assert snap.error is not None and snap.error.code is code
    assert snap.error.exit_code == exit_code and "Fatal: config file missing" in snap.error.message


async def test_an_npm_launch_that_fails_says_npms_reason_and_is_a_crash_loop(tmp_path: Path) -> None:
    """A misspelt package: npm's last line is the path of its log, a new one every run. That path was the reason told
    to status and the model, and no two exits read alike, so the documented crash-loop rule never fired (retrying)."""
    script = tmp_path / "npx.py"
    script.write_text(
        "import sys, time\n"
        "print('npm error 404 Not Found - GET https://registry.npmjs.org/@x%2fserver-githubb - Not found', file=sys.stderr)\n"
        "print(f'npm error A complete log of this run can be found in: /root/.npm/_logs/{time.time_ns()}-debug-0.log',"
        " file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    spec = ServerSpec(name="npx", transport="stdio", command=sys.executable, args=(str(script),), connect=FAST)
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "npx", ServerState.FAILED)
        snap = bw.status().servers[0]
    assert snap.attempts == 3 and snap.error is not None
    assert snap.error.message.startswith("the process exited with code 1: npm error 404 Not Found"), snap.error.message


async def test_a_server_that_says_why_on_stderr_and_hangs_times_out_with_what_it_said(tmp_path: Path) -> None:
    """Its stderr was shown for an exit only: a server waiting on a refused token said only "no answer within 1 s"."""
    script = "import sys, time; print('Error: GITHUB_TOKEN is invalid (401); waiting', file=sys.stderr); time.sleep(60)"
    policy = replace(FAST, attempt_timeout_s=1.0)
    spec = ServerSpec(name="waits", transport="stdio", command=sys.executable, args=("-c", script), connect=policy)
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "waits", ServerState.RETRYING)
        snap = bw.status().servers[0]
    assert snap.error is not None and snap.error.code is Reason.TIMEOUT
    assert "GITHUB_TOKEN is invalid (401)" in snap.error.message, snap.error.message
    assert "attempt_timeout_s" in snap.error.message  # the fix, for a server that is only slow


async def test_silent_server_times_out_and_is_not_left_running(tmp_path: Path) -> None:
    """A server that never answers the handshake: `timeout` after attempt_timeout_s, and its process is gone."""
    marker = f"silent-{os.getpid()}-{time.monotonic_ns()}"
    spec = stdio(marker, "--startup-delay", "300", policy=replace(FAST, attempt_timeout_s=1.0))
    started = time.monotonic()
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, marker, ServerState.RETRYING)
        elapsed = time.monotonic() - started
        snap = bw.status().servers[0]
        assert snap.error is not None and snap.error.code is Reason.TIMEOUT
        assert 0.9 <= elapsed < 10
        with anyio.fail_after(10):
            while processes_with(marker) and bw.upstream(marker).state is ServerState.RETRYING:
                await anyio.sleep(0.05)
        if bw.upstream(marker).state is ServerState.RETRYING:
            assert processes_with(marker) == [], "the timed-out attempt's process must be stopped"
    with anyio.fail_after(10):
        while processes_with(marker):
            await anyio.sleep(0.05)


async def test_http_server_refusing_first_connections_becomes_ready(tmp_path: Path) -> None:
    """An HTTP server that drops its first 3 connections is retried with backoff until it is `ready`."""
    async with serve_http("--refuse-first", "3") as server, breakwater(tmp_path, http("flaky", server.url)) as bw:
        report = await bw.wait_ready(timeout=30)
    (s,) = report.servers
    assert s.state is ServerState.READY
    assert s.attempts >= 2


async def test_nothing_listening_is_refused(tmp_path: Path, free_port: int) -> None:
    """An HTTP URL with nothing listening: `refused`, retrying with a next_retry_at."""
    async with breakwater(tmp_path, http("nothing", f"http://127.0.0.1:{free_port}/mcp")) as bw:
        await until(bw, "nothing", ServerState.RETRYING)
        snap = bw.status().servers[0]
    assert snap.error is not None and snap.error.code is Reason.REFUSED
    assert snap.next_retry_at is not None and snap.next_retry_at > time.time() - 1


async def test_http_status_503_then_ready(tmp_path: Path) -> None:
    """HTTP 503 on the first requests is `http_status` with the code; the server is picked up once it answers."""
    async with (
        serve_http("--status-first", "2", "--status", "503") as server,
        breakwater(tmp_path, http("busy", server.url)) as bw,
    ):
        await until(bw, "busy", ServerState.RETRYING)
        snap = bw.status().servers[0]
        assert snap.error is not None and (snap.error.code, snap.error.http_status) == (Reason.HTTP_STATUS, 503)
        await until(bw, "busy", ServerState.READY)


async def test_http_401_is_auth_required_and_fails_at_once(tmp_path: Path) -> None:
    """HTTP 401 is `auth_required`: retrying within seconds cannot fix credentials, so it is `failed` at once."""
    async with (
        serve_http("--status-first", "1000", "--status", "401") as server,
        breakwater(tmp_path, http("locked", server.url)) as bw,
    ):
        await until(bw, "locked", ServerState.FAILED)
        snap = bw.status().servers[0]
    assert snap.error is not None and (snap.error.code, snap.error.http_status) == (Reason.AUTH_REQUIRED, 401)
    assert snap.attempts == 1


async def test_reset_connection_is_reset(tmp_path: Path) -> None:
    """A server that reads the request and resets the connection: `reset`, then `ready` once it behaves."""
    async with serve_http("--reset-first", "1") as server, breakwater(tmp_path, http("rst", server.url)) as bw:
        await until(bw, "rst", ServerState.RETRYING)
        snap = bw.status().servers[0]
        assert snap.error is not None and snap.error.code is Reason.RESET, snap.error
        await until(bw, "rst", ServerState.READY)


async def test_stdio_server_that_dies_is_reconnected(tmp_path: Path) -> None:
    """A ready stdio server whose process is killed goes back through the policy and is ready again."""
    state_file = tmp_path / "state.json"
    async with breakwater(tmp_path, stdio("phoenix", "--state-file", str(state_file))) as bw:
        await until(bw, "phoenix", ServerState.READY)
        first_pid = json.loads(state_file.read_text())["pid"]
        os.kill(first_pid, signal.SIGKILL)
        await until(bw, "phoenix", ServerState.READY, min_attempts=2)
        snap = bw.status().servers[0]
        assert snap.attempts == 2 and snap.error is None
        assert json.loads(state_file.read_text())["pid"] != first_pid


async def test_http_server_that_comes_back_is_picked_up_without_restart(tmp_path: Path, free_port: int) -> None:
    """An HTTP server that goes away is noticed by the health check; when it returns on the same port it is ready again."""
    policy = replace(FAST, health_interval_s=0.3)
    async with breakwater(tmp_path, http("comeback", f"http://127.0.0.1:{free_port}/mcp", policy=policy)) as bw:
        cmd = launch_command("--http", "--port", str(free_port))
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await until(bw, "comeback", ServerState.READY)
            proc.terminate()
            proc.wait()
            await until(bw, "comeback", ServerState.RETRYING, ServerState.FAILED, ServerState.CONNECTING)
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await until(bw, "comeback", ServerState.READY, min_attempts=2)
        finally:
            proc.terminate()
            proc.wait()


async def test_wait_ready_returns_once_everything_is_settled(tmp_path: Path) -> None:
    """wait_ready does not sit out its timeout for a server that has already failed."""
    specs = (stdio("ok"), ServerSpec(name="ghost", transport="stdio", command="breakwater-no-such-cmd", connect=FAST))
    started = time.monotonic()
    async with breakwater(tmp_path, *specs) as bw:
        report = await bw.wait_ready(timeout=60)
    assert time.monotonic() - started < 30
    assert {s.name: s.state for s in report.servers} == {"ok": ServerState.READY, "ghost": ServerState.FAILED}


async def test_secrets_never_appear_in_status(tmp_path: Path, free_port: int) -> None:
    """Planted secrets in env, headers and a URL's query never reach the status, as JSON or as a table."""
    secret = "sk-planted-9c1f2e"
    specs = (
        stdio("env", "--exit-at-start", "1", "--exit-message", f"bad key {secret}", env={"API_KEY": secret}),
        http(
            "hdr",
            f"http://127.0.0.1:{free_port}/mcp?token={secret}",
            headers={"Authorization": f"Bearer {secret}"},
        ),
    )
    async with breakwater(tmp_path, *specs) as bw:
        await until(bw, "env", ServerState.RETRYING, ServerState.FAILED)
        await until(bw, "hdr", ServerState.RETRYING, ServerState.FAILED)
        report = bw.status()
    text = json.dumps(report.to_json())
    assert "bad key <redacted>" in text, json.dumps(report.to_json()["servers"][0])
    assert secret not in text


def test_status_cli_acceptance(tmp_path: Path, free_port: int) -> None:
    """The issue's acceptance run: healthy stdio, stdio needing 20 s, HTTP refusing its first 3 connections,
    a missing command and a URL with nothing listening -> the first three ready, the last two not, exit 1."""
    port_file = tmp_path / "port"
    http_proc = subprocess.Popen(
        launch_command("--http", "--port", "0", "--port-file", str(port_file), "--refuse-first", "3"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        healthy, slow = launch_command(), launch_command("--startup-delay", "20")
        config = tmp_path / "mcp.json"
        config.write_text(
            json.dumps(
                {
                    "mcpServers": {
                        "healthy": {"command": healthy[0], "args": healthy[1:]},
                        "slow": {"command": slow[0], "args": slow[1:]},
                        "flaky-http": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"},
                        "missing": {"command": "breakwater-does-not-exist"},
                        "nothing": {"type": "http", "url": f"http://127.0.0.1:{free_port}/mcp"},
                    }
                }
            )
        )
        result = subprocess.run(
            [sys.executable, "-m", "breakwater", "status", "--config", str(config), "--json", "--wait", "35"],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission")),
            check=False,
        )
    finally:
        http_proc.terminate()
        http_proc.wait()
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    by_name = {s["name"]: s for s in report["servers"]}
    assert {n: by_name[n]["state"] for n in ("healthy", "slow", "flaky-http")} == dict.fromkeys(
        ("healthy", "slow", "flaky-http"), "ready"
    )
    assert by_name["missing"]["state"] in ("failed", "retrying")
    assert by_name["missing"]["error"]["code"] == "spawn_failed"
    assert by_name["nothing"]["state"] in ("failed", "retrying")
    assert by_name["nothing"]["error"]["code"] == "refused"
    assert by_name["nothing"]["next_retry_at"] is not None
    assert report["summary"]["ready"] == 3
    assert set(by_name["healthy"]) >= {
        "name",
        "transport",
        "state",
        "protocol",
        "tools",
        "attempts",
        "connect_ms",
        "next_retry_at",
        "error",
    }


async def test_pinned_modern_protocol_learns_the_servers_real_capabilities(tmp_path: Path) -> None:
    """A `protocol = "2026-07-28"` pin still asks `server/discover`: the gateway needs the real capabilities."""
    spec = stdio("pinned", "--tool", "ping:latency=0", policy=replace(FAST, protocol="2026-07-28"))
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "pinned", ServerState.READY)
        client = bw.upstream("pinned").client
        assert client is not None and client.protocol_version == "2026-07-28"
        discovered = client.session.discover_result
        assert discovered is not None
        assert discovered.capabilities.tools is not None and discovered.capabilities.resources is not None


@pytest.mark.parametrize("inherit", ["all", "minimal"])
async def test_a_stdio_server_inherits_the_environment_as_the_agent_would_start_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inherit: str
) -> None:
    """A token exported in the shell reached the server when Claude Code started it, and not behind breakwater (it
    gave the SDK's six variables): the server exited "MY_SERVICE_TOKEN is not set". What it prints of an inherited
    credential is redacted, as the entry's own env is."""
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-inherited-7Hq2Lm9X")
    script = tmp_path / "svc.py"
    script.write_text(
        "import os, sys\n"
        "print('MY_SERVICE_TOKEN is', os.environ.get('MY_SERVICE_TOKEN', 'not set'), file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    spec = ServerSpec(
        name="svc", transport="stdio", command=sys.executable, args=(str(script),), connect=replace(FAST, inherit_env=inherit)
    )
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "svc", ServerState.RETRYING, ServerState.FAILED)
        said = bw.status().servers[0].error
    assert said is not None
    if inherit == "all":
        assert said.message.endswith("MY_SERVICE_TOKEN is <redacted>"), said.message
    else:
        assert said.message.endswith("MY_SERVICE_TOKEN is not set"), said.message


async def test_no_stdio_server_inherits_breakwater_s_own_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's bearer token (`BREAKWATER_TOKEN`) reached every stdio server, an npm package among them, which could
    then call every server's tools through a gateway on the network. The entry's own `env` still gives one on purpose."""
    monkeypatch.setenv("BREAKWATER_TOKEN", "gw-token-9Xq2Lm7Hb4Tz")
    monkeypatch.setenv("BREAKWATER_JOURNAL_URL_LIKE", "postgresql://u:pw@db/x")
    monkeypatch.setenv("MY_PLAIN_SETTING", "kept")
    script = tmp_path / "svc.py"
    script.write_text(
        "import os, sys\n"
        "names = sorted(k for k in os.environ if k.startswith(('BREAKWATER_', 'MY_PLAIN')))\n"
        "print('inherited:', ' '.join(names), file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    env = {"BREAKWATER_GIVEN": "on purpose"}
    spec = ServerSpec(name="svc", transport="stdio", command=sys.executable, args=(str(script),), env=env, connect=FAST)
    async with breakwater(tmp_path, spec) as bw:
        await until(bw, "svc", ServerState.RETRYING, ServerState.FAILED)
        said = bw.status().servers[0].error
    assert said is not None
    assert said.message.endswith("inherited: BREAKWATER_GIVEN MY_PLAIN_SETTING"), said.message
