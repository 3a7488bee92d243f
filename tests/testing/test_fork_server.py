"""The testserver fork server (`breakwater.testing._fork_server`) keeps a process's contract for whoever launched it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client

from breakwater.testing import _launcher
from breakwater.testing.server import launch_command, stdio_params
from helpers import FORKED_SCRIPT, alive, called_once_up, eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux only (tests/conftest.py)"),
]


def test_the_suite_runs_its_testservers_through_the_fork_server() -> None:
    """`tests/conftest.py` starts one per worker: `launch_command` gives the launcher, not a fresh import."""
    command = launch_command("--tool", "echo")
    assert command[:4] == [sys.executable, "-S", "-E", _launcher.__file__]
    assert command[4:] == [os.environ[_launcher.ENV], "--tool", "echo"]


async def test_a_forked_testserver_serves_its_launchers_pipes_from_its_directory(tmp_path: Path) -> None:
    """Same answers as a plain testserver, from the launcher's working directory, with a pid of its own."""
    params = stdio_params("--tool", "echo:latency=0", "--state-file", "state.json")
    params.cwd = str(tmp_path)
    async with Client(params) as client:
        result = await client.call_tool("echo", {"text": "hi"})
    assert not result.is_error
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert answer["arguments"] == {"text": "hi"} and answer["ok"] is True
    assert answer["pid"] != os.getpid()
    assert json.loads((tmp_path / "state.json").read_text())  # written where the launcher ran


def test_exit_codes_and_signals_pass_through_and_a_killed_launcher_takes_its_server_along() -> None:
    """The launcher exits as its server did; a signal to it reaches the server; SIGKILL to its group ends both."""
    done = subprocess.run(
        launch_command("--exit-at-start", "3", "--exit-message", "bye"), capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stderr) == (3, "bye\n")

    for stop, code in ((lambda p: p.terminate(), -signal.SIGTERM), (lambda p: os.killpg(p.pid, signal.SIGKILL), -signal.SIGKILL)):
        launched = subprocess.Popen(
            launch_command("--tool", "echo:latency=0"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )
        server = _server_pid(launched)
        assert server != launched.pid
        stop(launched)
        assert launched.wait(10) == code
        deadline = time.monotonic() + 10
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(server)


def _server_pid(launched: subprocess.Popen[bytes]) -> int:
    """Initialize the launched server over its pipes and call `echo`: the pid the server reports."""
    answer = called_once_up(launched, "echo")
    return int(json.loads(answer["result"]["content"][0]["text"])["pid"])


async def test_with_no_fork_server_the_launcher_is_the_plain_testserver(tmp_path: Path) -> None:
    """A launcher whose fork server is gone (the suite ended) execs `python -m breakwater testserver` itself."""
    command = _launcher.launcher_command(str(tmp_path / "nobody-listens"), ("--tool", "echo"))
    launched = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def argv() -> list[bytes]:  # empty for a moment while the exec replaces it
        return Path(f"/proc/{launched.pid}/cmdline").read_bytes().split(b"\0")

    try:
        await eventually(lambda: argv()[1:4] == [b"-m", b"breakwater", b"testserver"], 30)
        assert launched.poll() is None
    finally:
        launched.kill()
        launched.wait()


def test_the_suites_gateways_are_forks_unless_a_fork_would_differ(tmp_path: Path) -> None:
    """`python -m breakwater serve` under the suite is a fork: the process the test started imports nothing heavy (its
    CPU is the launcher's) and exits as the gateway did. With a standard stream closed, an interpreter set up otherwise
    (`PYTHONIOENCODING`), or no fork server listening, it is the gateway itself, as for a user."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    serve = [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(config)]

    def run(env: dict[str, str], *, shell: str = '"$@"') -> tuple[int, float]:
        """Exit code and CPU seconds of `serve` with stdin at its end, started through `sh -c` with `shell`."""
        before = os.times()
        done = subprocess.run(
            ["sh", "-c", f"exec {shell}", "sh", *serve], stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=60
        )
        after = os.times()
        return done.returncode, (after.children_user + after.children_system) - (before.children_user + before.children_system)

    forked_code, forked_cpu = run(dict(os.environ))
    plain_code, plain_cpu = run({k: v for k, v in os.environ.items() if k != _launcher.SERVE_ENV})
    gone_code, gone_cpu = run(dict(os.environ, **{_launcher.SERVE_ENV: str(tmp_path / "nobody-listens")}))
    closed_code, closed_cpu = run(dict(os.environ), shell='"$@" 2>&-')
    ascii_code, ascii_cpu = run(dict(os.environ, PYTHONIOENCODING="ascii"))
    assert forked_code == plain_code == gone_code == closed_code == ascii_code == 0
    # The SDK's import alone is most of a second of CPU; the launcher's start is a few hundredths.
    assert forked_cpu < plain_cpu / 3, (forked_cpu, plain_cpu)
    assert min(gone_cpu, closed_cpu, ascii_cpu) > plain_cpu / 2, (gone_cpu, closed_cpu, ascii_cpu, plain_cpu)


_SCRIPT = """
import json, os, sys
from pathlib import Path

import mcp.server.mcpserver  # what the fork server imported already

print(json.dumps({"name": __name__, "argv": sys.argv, "pid": os.getpid(), "cwd": os.getcwd(), "path0": sys.path[0],
                  "env": os.environ.get("MARK"), "sibling": Path(__file__).with_name("data.txt").read_text()}))
sys.exit(sys.argv[1] if sys.argv[1:] and not sys.argv[1].isdigit() else int(sys.argv[1]) if sys.argv[1:] else None)
"""


@pytest.mark.parametrize("forked", [True, False], ids=["fork server", "no fork server"])
def test_a_test_server_script_is_run_as_a_program_would_be_whoever_runs_it(tmp_path: Path, forked: bool) -> None:
    """`python script.py ARGS` of a script that starts with `FORKED_SCRIPT`: through the fork server (another pid), or
    plain when none listens, it runs as `__main__` with its argv, directory, working directory and environment, and
    exits as it asked: a code, a message (printed, 1), or its end (0)."""
    script = tmp_path / "srv.py"
    script.write_text(FORKED_SCRIPT + _SCRIPT)
    (tmp_path / "data.txt").write_text("beside it")
    env = dict(os.environ, MARK="m")
    if not forked:
        del env[_launcher.ENV]
    runs = {}
    for args in (["3"], ["bye"], []):
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, cwd="/", env=env)
        runs[tuple(args)] = done
        seen = json.loads(done.stdout)
        assert seen["name"] == "__main__" and seen["argv"] == [str(script), *args]
        assert (seen["cwd"], seen["path0"], seen["env"], seen["sibling"]) == ("/", str(tmp_path), "m", "beside it")
    assert [(d.returncode, d.stderr) for d in runs.values()] == [(3, ""), (1, "bye\n"), (0, "")]
    stub = subprocess.Popen([sys.executable, str(script), "0"], stdout=subprocess.PIPE, env=env)
    out, _ = stub.communicate(timeout=60)
    assert (json.loads(out)["pid"] != stub.pid) is forked
