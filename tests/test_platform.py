"""The platform branches, for real on this POSIX machine: a stopped upstream takes its whole tree with it;
paths with spaces, `~` and backslashes in a config reach the process as written.

The Windows branches are proved by simulation in tests/test_platform_simulation.py.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from breakwater import _platform
from breakwater.connect._stdio import StdioProcess
from breakwater.testing.server import launch_command

# A stdio "server" that ignores the end of its input and SIGTERM, and whose child does too: only the
# last step of the shutdown, killing the whole group, can stop them.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", deaf])
    print(f"child {child.pid}", file=sys.stderr, flush=True)
    sys.stdin.read()
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; its new parent just has not reaped it
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.anyio
async def test_stop_kills_the_whole_tree_when_nothing_listens(tmp_path: Path) -> None:
    """stdin closed, then SIGTERM to the group, both ignored: the group is killed, the grandchild with it."""
    process = StdioProcess(sys.executable, ("-c", STUBBORN))
    child = 0
    started = time.monotonic()
    async with process.open():
        with anyio.fail_after(20):
            while not (lines := [line for line in process.stderr_tail if line.startswith("child ")]):
                await anyio.sleep(0.02)
        child = int(lines[0].split()[1])
        assert process.process is not None and _platform.group_alive(process.process.pid, None)
    took = time.monotonic() - started
    leader = process.process.pid
    deadline = time.monotonic() + 10
    while (_alive(child) or _alive(leader)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(leader) and not _alive(child), "the upstream's tree outlived its stop"
    assert took < 15  # stdin grace (2 s) + polite grace (2 s) + the kill, not a hang


# A stdio "server" whose child leaves its process group (a session of its own, as Puppeteer and Playwright start a
# browser); the child's own child stays in the child's group. `stubborn`: all of them ignore SIGTERM, and the
# server ignores the end of its input; else the server exits at the end of its input and leaves the child running.
LEAVER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    stubborn = sys.argv[1] == "stubborn"
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if stubborn else ""
    grandchild = ignore + "import time; time.sleep(60)"
    child = ignore + (
        "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', %r]); "
        "print(f'grandchild {g.pid}', file=sys.stderr, flush=True); time.sleep(60)"
    ) % grandchild
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    c = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
    print(f"child {c.pid}", file=sys.stderr, flush=True)
    sys.stdin.read()
    if stubborn:
        time.sleep(60)
    """
)


@pytest.mark.anyio
@pytest.mark.parametrize("leader", ["stubborn", "exits"])
async def test_stop_takes_what_left_the_group_with_it(leader: str) -> None:
    """A child in a session of its own (and its child) is stopped with the upstream, whether the upstream exits at
    the end of its input or has to be killed."""
    process = StdioProcess(sys.executable, ("-c", LEAVER, leader))
    async with process.open():
        with anyio.fail_after(20):
            while (
                len(pids := [int(line.split()[1]) for line in process.stderr_tail if line.split()[0] in ("child", "grandchild")])
                < 2
            ):
                await anyio.sleep(0.02)
        assert process.process is not None
        assert all(os.getpgid(pid) != process.process.pid for pid in pids), "the test's premise: they left the group"
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids), "what the upstream started outlived its stop"


def test_a_process_tree_is_read_by_parent_links_and_known_by_start_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        tree = _platform.descendants(os.getpid())
        assert child.pid in [pid for pid, _ in tree]
        mine = tuple(member for member in tree if member[0] == child.pid)
        assert _platform.still_running(mine) == [child.pid]
        assert _platform.still_running(((child.pid, mine[0][1] + 1),)) == [], "another start time: another process"
        _platform.kill_each(mine)
        child.wait(timeout=10)
        assert _platform.still_running(mine) == []
    finally:
        child.kill()
        child.wait()


def test_paths_with_spaces_and_tilde_in_command_cwd_args_and_servers_file(tmp_path: Path) -> None:
    """`~/with space/run server` as command, `~/work dir` as cwd, a servers_file under `~/my configs`;
    arguments with spaces and backslashes arrive exactly as written."""
    home = tmp_path / "home"
    (home / "with space").mkdir(parents=True)
    (home / "work dir").mkdir()
    (home / "my configs").mkdir()
    script = home / "with space" / "run server"
    launch = " ".join(f"'{part}'" for part in launch_command())
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$PWD" "$@" > "$HOME/argv.txt"\nexec {launch}\n')
    script.chmod(0o755)
    args = ["C:\\Program Files\\data dir", "two words"]
    entry = {"command": "~/with space/run server", "args": args, "cwd": "~/work dir", "env": {"HOME": str(home)}}
    (home / "my configs" / "servers.json").write_text(json.dumps({"mcpServers": {"spaced": entry}}))
    config = tmp_path / "conf dir" / "breakwater.toml"
    config.parent.mkdir()
    config.write_text('servers_file = "~/my configs/servers.json"\n')
    env = {
        **os.environ,
        "HOME": str(home),
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "breakwater", "status", "--json", "--wait", "30", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (server,) = json.loads(done.stdout)["servers"]
    assert server["state"] == "ready"
    assert (home / "argv.txt").read_text().splitlines() == [str(home / "work dir"), *args]


def test_a_busy_port_reads_the_same_in_posix_and_winsock_codes() -> None:
    """Python on Windows reports a failed bind with Winsock's errno (10048), not `errno.EADDRINUSE`:
    `serve --http` must still say the port is in use, and what to do."""
    import errno

    from breakwater import _platform
    from breakwater.cli._serve import _listen_failure

    for code in (errno.EADDRINUSE, 10048):
        assert _platform.bind_error(OSError(code, "bind")) == "in_use"
        assert "the port is in use" in _listen_failure("127.0.0.1", 8000, OSError(code, "bind"))
    assert _platform.bind_error(OSError(10013, "bind")) == "denied"
    assert _platform.bind_error(OSError(errno.ENOENT, "other")) is None


def test_long_running_commands_run_on_uvloop_unless_the_knob_says_asyncio() -> None:
    # uvloop is a dependency on POSIX; `[gateway] event_loop = "asyncio"` keeps asyncio's own loop.
    assert _platform.event_loop("auto") == "uvloop" == _platform.strategy()["event_loop"]
    assert _platform.event_loop("asyncio") == "asyncio"
    assert anyio.run(_running_loop, backend_options=_platform.loop_options("auto")) == "uvloop"
    assert anyio.run(_running_loop, backend_options=_platform.loop_options("asyncio")) == "asyncio"


async def _running_loop() -> str:
    return _platform.running_loop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_RUNTIME_DIR is the Linux convention")
def test_a_missing_runtime_dir_is_made_private_and_found_again(tmp_path: Path) -> None:
    """XDG_RUNTIME_DIR missing: made 0755 on the way to breakwater's directory, it failed platformdirs' check at every
    later look, which answered /tmp/runtime-UID instead (sessions and `gateway list` lost the gateway), with a Python
    warning and its source line on every command's stderr."""
    runtime = tmp_path / "run-user"
    code = "from breakwater._paths import runtime_dir; print(runtime_dir())"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    looks = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True) for _ in range(2)]
    assert [look.stdout.strip() for look in looks] == [str(runtime / "breakwater")] * 2
    assert [look.stderr for look in looks] == ["", ""]
    assert oct(runtime.stat().st_mode & 0o777) == "0o700"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_RUNTIME_DIR is the Linux convention")
def test_without_xdg_runtime_dir_the_users_run_directory_is_still_the_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that dropped XDG_RUNTIME_DIR (the MCP Inspector) started `serve` with the cache as its runtime
    directory: a second shared gateway for one config, and `gateway list` from the terminal found neither."""
    from breakwater import _paths

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(_paths, "RUN_USER", tmp_path)
    own = tmp_path / str(os.getuid())
    own.mkdir(mode=0o700)
    assert _paths.runtime_dir() == own / "breakwater"  # what XDG_RUNTIME_DIR=/run/user/UID gives
    own.chmod(0o755)  # not a private runtime directory: the cache, as before
    assert _paths.runtime_dir() == _paths.cache_dir()


# Large blocks freed between small ones that stay (what a gateway's heap looks like after a burst of large calls).
_LARGE_FREES = textwrap.dedent(
    """
    import gc, json, sys
    from breakwater import _platform

    def rss_mb():
        return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1]) // 1024

    given = _platform.return_large_frees() if sys.argv[1] == "on" else None
    base, kept = rss_mb(), []
    for _ in range(3):
        large = []
        for i in range(20):
            large.append(str(i) * (3 << 20))
            kept.append(bytearray(200))
            kept.append("x" * 50_000)
        del large
        gc.collect()
    print(json.dumps({"given": given, "kept_mb": rss_mb() - base}))
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only: other C libraries have no such threshold")
def test_a_gateway_gives_large_freed_blocks_back_to_the_system() -> None:
    """After a burst of 3 MB messages, glibc kept ~100 MB for good (it raises its own-mapping threshold at the first
    large free); a gateway process holds the threshold at `OWN_MAPPING_BYTES`."""
    runs = {}
    for how in ("off", "on"):
        done = subprocess.run([sys.executable, "-c", _LARGE_FREES, how], capture_output=True, text=True, timeout=60, check=True)
        runs[how] = json.loads(done.stdout)
    assert runs["on"]["given"] is True
    assert runs["off"]["kept_mb"] > 60, runs  # the workload does show the fault
    assert runs["on"]["kept_mb"] < 20, runs
