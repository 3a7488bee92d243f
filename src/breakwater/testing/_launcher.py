"""The launcher of a forked testserver: a stdlib-only program run by path (`-S -E`), 20 ms to start.

It hands its own stdin, stdout and stderr to the fork server (`breakwater.testing._fork_server`, which
says why it exists), which forks a testserver onto them; then it stands for that server towards
whoever started it:
- signals sent to it (TERM, INT, HUP, QUIT, USR1, USR2) are passed to the server, and it exits as the
  server did: with its code, or killed by the same signal;
- if it is killed outright (SIGKILL, a killed process group), the server is killed too: the server
  watches a pipe only the launcher holds open;
- with no fork server listening it becomes the plain testserver (`exec`), so a command outlives its
  suite safely.

It imports nothing of breakwater's: it runs without the site packages.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import NoReturn

__all__ = ["ENV", "launcher_command"]

#: The environment variable naming the fork server's socket (unset: testservers start as plain processes).
ENV = "BREAKWATER_TEST_FORK_SERVER"
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def launcher_command(path: str, flags: tuple[str, ...]) -> list[str]:
    """The argv of a launcher that runs `breakwater testserver FLAGS` through the fork server at `path`."""
    return [sys.executable, "-S", "-E", os.path.abspath(__file__), path, *flags]


def _launch(path: str, flags: list[str]) -> NoReturn:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:  # no fork server: be the testserver itself
        sock.close()
        os.execv(sys.executable, [sys.executable, "-m", "breakwater", "testserver", *flags])
    # The server's end of this pipe reads EOF when this process is gone (the write end is never closed here).
    watch_read, _watch_write = os.pipe()
    payload = json.dumps({"flags": flags, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(sock, [payload], [0, 1, 2, watch_read])
    os.close(watch_read)
    pid = int(sock.recv(64))
    # The pipes are the server's now: its exit alone ends them for the reader.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for sig in _FORWARDED:
        signal.signal(sig, lambda number, _frame: _pass_on(pid, number))
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


if __name__ == "__main__":
    _launch(sys.argv[1], sys.argv[2:])
