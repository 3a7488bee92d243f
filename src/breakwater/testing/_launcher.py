"""The launcher of a forked `breakwater` process: what the suite starts instead of paying for the SDK's imports.

It hands its own stdin, stdout and stderr to the fork server (`breakwater.testing._fork_server`, which
says why it exists), which forks a `breakwater ARGS` process onto them; then it stands for that process
towards whoever started it:
- signals sent to it (TERM, INT, HUP, QUIT, USR1, USR2) are passed to the process (one that arrives
  before the process exists is passed as soon as it does), and it exits as the process did: with its
  code, or killed by the same signal;
- if it is killed outright (SIGKILL, a killed process group), the process is killed too: it watches
  a pipe only the launcher holds open;
- with no fork server listening, it is the process itself.

Three ways in. A testserver's command (`launcher_command`) runs this file by path (`-S -E`, stdlib only,
20 ms to start). A gateway's (`python -m breakwater serve ...`, as the tests start it; `status`, `call` and
`tools` too) is the real command: `breakwater.__main__` calls `hand_over` before importing anything else when
`BREAKWATER_TEST_FORK_SERVE` names the fork server's socket. A test's own SDK server script (the conformance
upstream, the tasks and OAuth servers, the scripts tests write out: ~150 starts a run, 0.9 s of CPU each) calls
`fork_script` first thing when run as a program, so however a test or a gateway starts it, the fork server runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import NoReturn

__all__ = ["ENV", "SERVE_ENV", "fork_script", "hand_over", "launcher_command"]

#: The environment variable naming the fork server's socket (unset: testservers start as plain processes).
ENV = "BREAKWATER_TEST_FORK_SERVER"
#: The same socket, for `python -m breakwater serve`, `status`, `call` and `tools` (unset: each imports the SDK
#: itself). A test about the process itself (its process group, its descriptors, its pid, a signal while it starts)
#: deletes it.
SERVE_ENV = "BREAKWATER_TEST_FORK_SERVE"
#: Set in a process the fork server made to run a script (`fork_script` there runs the script, not another fork).
IN_FORK = False
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def launcher_command(path: str, flags: tuple[str, ...]) -> list[str]:
    """The argv of a launcher that runs `breakwater testserver FLAGS` through the fork server at `path`."""
    return [sys.executable, "-S", "-E", os.path.abspath(__file__), path, *flags]


def fork_script(file: str) -> None:
    """At the top of a test's server script run as a program: with the suite's fork server listening (`ENV`), have it
    run the script (`python FILE ARGS`) past the SDK's imports, and stand for it; otherwise return, and the script runs."""
    path = os.environ.get(ENV)
    if path and not IN_FORK:
        hand_over(path, sys.argv[1:], script=os.path.abspath(file))


def hand_over(path: str, argv: list[str], *, script: str | None = None) -> None:
    """Have the fork server at `path` run `breakwater ARGV` (with `script`: `python SCRIPT ARGV`) on this process's
    standard streams, and stand for it.

    Returns (having changed nothing) if no fork server listens there, if it refuses (the command's environment
    sets the interpreter up otherwise than the fork server's was), or if a standard stream is closed (a descriptor
    it cannot carry); the caller then runs the command itself. Otherwise the process ends as the forked one did.
    """
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return
    pending: list[int] = []
    pid = 0

    def on_signal(number: int, _frame: object) -> None:
        if pid:
            _pass_on(pid, number)
        else:
            pending.append(number)

    previous = {sig: signal.signal(sig, on_signal) for sig in _FORWARDED}
    # The process's end of this pipe reads EOF when this one is gone (the write end is kept open until this one ends).
    watch_read, watch_write = os.pipe()
    payload = json.dumps({"argv": argv, "script": script, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(sock, [payload], [0, 1, 2, watch_read])
    os.close(watch_read)
    answer = sock.recv(64)
    if answer == b"-":  # refused (another interpreter's settings): this process goes on as the command itself
        sock.close()
        os.close(watch_write)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for number in pending:
            os.kill(os.getpid(), number)
        return
    pid = int(answer)
    # The streams are the process's now: its exit alone ends them for the reader.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for number in pending:
        _pass_on(pid, number)
    status = int(sock.recv(64) or b"-1")  # PEP 475: a forwarded signal does not cut the wait short
    if status < 0:
        os._exit(1)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _pass_on(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


def _launch(path: str, flags: list[str]) -> NoReturn:
    hand_over(path, ["testserver", *flags])
    # No fork server: be the testserver itself.
    os.execv(sys.executable, [sys.executable, "-m", "breakwater", "testserver", *flags])


if __name__ == "__main__":
    _launch(sys.argv[1], sys.argv[2:])
