"""A stdio upstream's process, at the edges of its life: what it forked, a stdout it closed while it runs.

Real processes on both event loops `serve` may run (uvloop spawns through libuv, asyncio through the
stdlib); wall-clock bounds are generous, since what is measured is a real process exiting.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
import pytest

from breakwater.connect._stdio import EXIT_CODE_GRACE_S, StdioProcess
from helpers import alive

LOOPS = ["asyncio", "uvloop"]


def _run(loop: str, main: object) -> None:
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": loop == "uvloop"})  # type: ignore[arg-type]


def _wait_for_file(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return text
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


FORKS = """
import os, sys, time
if os.fork() == 0:  # a worker that outlives its parent, holding the pipes it inherited
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\\n")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
    os._exit(0)
sys.stdin.buffer.read()  # the leader itself ends politely, at the end of its input
"""


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX's")
@pytest.mark.parametrize("loop", LOOPS)
def test_what_an_upstream_forked_is_stopped_with_it(tmp_path: Path, loop: str) -> None:
    """The leader exits within the stdin grace, its forked child does not: the child is stopped too, not orphaned."""
    script, pid_file = tmp_path / "forks.py", tmp_path / "child.pid"
    script.write_text(FORKS)

    async def main() -> None:
        process = StdioProcess(sys.executable, (str(script), str(pid_file)))
        process.prompt_stop = True
        async with process.open():
            await anyio.to_thread.run_sync(_wait_for_file, pid_file)

    _run(loop, main)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    outlived = alive(child)
    if outlived:
        os.kill(child, 9)
    assert not outlived, "the upstream's forked child outlived the session"


CLOSES_STDOUT = """
import os, sys, time
sys.stdout.write('{"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}}\\n')
sys.stdout.flush()
os.close(1)  # no more answers, ever; the process runs on
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop and os.close(1) semantics are POSIX's")
@pytest.mark.parametrize("loop", LOOPS)
def test_a_stdout_closed_while_the_upstream_runs_ends_the_reads_at_once(tmp_path: Path, loop: str) -> None:
    """EOF on the upstream's stdout is the end of the connection, whatever the loop.

    Under uvloop the child kept a second copy of its stdout (libuv has no close_fds), so the end never
    came: the server stayed `ready` and each call waited for its whole timeout.
    """
    script = tmp_path / "closes.py"
    script.write_text(CLOSES_STDOUT)
    seen: list[float] = []

    async def main() -> None:
        process = StdioProcess(sys.executable, (str(script),))
        process.prompt_stop = True
        async with process.open() as (read, _write):
            started = time.monotonic()
            with anyio.move_on_after(10):
                async for _message in read:
                    pass
                seen.append(time.monotonic() - started)

    _run(loop, main)
    assert seen, "the reads never ended after the upstream closed its stdout"
    assert seen[0] < 5


EXITS_LATER = """
import os, sys, time
time.sleep(float(sys.argv[1]))
sys.exit(3)
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_an_upstream_that_exits_after_a_while_is_known_by_its_exit_code(tmp_path: Path, loop: str) -> None:
    """The exit of a server that has run a while is looked for less often, and at once when it closes its stdout.

    Its exit code must still be known within the reaping grace, as for one that fails at start: it is what
    the supervisor tells the user ("exited with code 3").
    """
    script = tmp_path / "later.py"
    script.write_text(EXITS_LATER)
    codes: list[int | None] = []
    waits: list[float] = []

    async def main() -> None:
        process = StdioProcess(sys.executable, (str(script), "3.2"))
        async with process.open() as (read, _write):
            with anyio.move_on_after(30):
                async for _message in read:
                    pass
            ended = time.monotonic()  # its stdout reached EOF: it is exiting
        waits.append(time.monotonic() - ended)
        codes.append(process.exit_code_before_close)

    _run(loop, main)
    assert codes == [3]
    # Not the whole grace: by then the look at the process had slowed to 2 s, and only the EOF woke it.
    assert waits[0] < 0.8 * EXIT_CODE_GRACE_S


LEAVES_A_CHILD = """
import os, sys, time
if os.fork() == 0:  # holds the pipes it inherited: the leader's stdout never reaches EOF
    time.sleep(float(sys.argv[1]) + 30)
    os._exit(0)
time.sleep(float(sys.argv[1]))
os._exit(0)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX's")
@pytest.mark.parametrize("loop", LOOPS)
def test_an_upstream_whose_child_holds_its_stdout_is_still_seen_to_exit(tmp_path: Path, loop: str) -> None:
    """No EOF comes (the child holds the pipe), so only the slowed look at the process sees the leader exit."""
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES_A_CHILD)
    seen: list[float] = []

    async def main() -> None:
        process = StdioProcess(sys.executable, (str(script), "3.2"))
        process.prompt_stop = True
        async with process.open():
            started = time.monotonic()
            with anyio.move_on_after(30):
                await process.exited.wait()
                seen.append(time.monotonic() - started)

    _run(loop, main)
    assert seen, "the leader's exit was never seen"
    # Its exit at ~3.2 s is seen within the slowest look (2 s) and a generous margin for a busy machine.
    assert seen[0] < 3.2 + 2.0 + 5


EXITS_AT_ONCE = """
import sys
print("MY_SERVICE_TOKEN is not set", file=sys.stderr)
sys.exit(1)
"""


def _exited(pid: int) -> bool:
    """Whether `pid` is a zombie (exited, not reaped yet): its state in /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's state in /proc")
@pytest.mark.parametrize("loop", LOOPS)
def test_an_upstream_gone_before_its_first_write_is_known_by_its_exit_code(tmp_path: Path, loop: str) -> None:
    """A server that exits at once (a token it needs is not set) breaks the handshake's first write before its stdout's
    end is read: its exit code is still known, so the failure is "exited with code 1" and its stderr, not a bare
    "connection closed" (seen in CI on a loaded host)."""
    script = tmp_path / "gone.py"
    script.write_text(EXITS_AT_ONCE)
    codes: list[int | None] = []

    async def main() -> None:
        process = StdioProcess(sys.executable, (str(script),))
        async with process.open() as (_read, write):
            assert process.process is not None
            pid = process.process.pid
            # Gone before anything was written to it. Waited for without yielding to the event loop, so that the loop
            # has not reaped it yet when the write fails: the order a loaded host produced.
            deadline = time.monotonic() + 30
            while not _exited(pid):
                assert time.monotonic() < deadline, "the test server did not exit"
                time.sleep(0.005)
            # The handshake's first line meets the broken pipe, which asyncio says only at the next line (or at the first,
            # when the loop saw the pipe's end while the test started the process).
            with pytest.raises(anyio.BrokenResourceError):
                await write.write_line(b'{"jsonrpc":"2.0","id":1,"method":"server/discover"}\n')
                await write.write_line(b'{"jsonrpc":"2.0","id":2,"method":"initialize"}\n')
        codes.append(process.exit_code_before_close)

    _run(loop, main)
    assert codes == [1]
