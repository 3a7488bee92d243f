"""A fork server for the suite's testservers and gateways: the test suite's start-up CPU, not different processes.

Why it exists. Every testserver and every `breakwater serve` (`status`, `call`, `tools`) imports the
SDK: 1.0-1.2 s of CPU on the 2-core CI host, and the suite starts about 300 of each, on a host where
the suite is CPU-bound (docs/benchmarks.md, "The test suite's own time"). With
`BREAKWATER_TEST_FORK_SERVER` set to this server's socket (the suite's `tests/conftest.py` starts one
per test worker), `launch_command()` gives a launcher instead (`breakwater.testing._launcher`), and a
test's own server script that calls `fork_script` first hands itself over the same way; with
`BREAKWATER_TEST_FORK_SERVE` set too, `python -m breakwater serve` (`status`, `call`, `tools`) is one.
The launcher hands its stdin, stdout and stderr over; this server forks a copy of itself, with the
SDK and the gateway already imported, to run `breakwater ARGS` on them, in the launcher's environment
and working directory. The process a test talks to is the same code on the same pipes, with its own
pid and its own exit, which the launcher passes on.

What differs, and is why this is for tests only: the process is this server's child, not in the
launcher's process group, so a group signal reaches it through the launcher (and not its children);
its interpreter started before the test did (its hash seed); and a signal sent while it starts
reaches it before its command's handlers are in place. The tests of those things start their
gateways as plain processes (`@pytest.mark.plain_gateway`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import Any, NoReturn

__all__ = ["serve"]

_MAX_MESSAGE = 1 << 22


def serve(path: str) -> NoReturn:
    """Listen at `path` and fork a testserver for each launcher, until the process that started this one ends."""
    import gc
    import select

    from breakwater._startup import sdk_imports

    with sdk_imports():
        import breakwater.cli
        import breakwater.cli._call
        import breakwater.cli._serve
        import breakwater.cli._status
        import breakwater.cli._tools
        import breakwater.gateway._open
        import breakwater.gateway._start
        import breakwater.testing.server  # noqa: F401 - loaded once here, shared by every fork
    gc.freeze()
    started_with = _interpreter_settings(dict(os.environ))
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([listener.fileno(), wake_read], [], [], 1.0)
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(waiting)
        if listener.fileno() in ready:
            conn, _ = listener.accept()
            payload, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 4)
            request = json.loads(payload)
            if _interpreter_settings(request["env"]) != started_with:
                for fd in fds:
                    os.close(fd)
                conn.send(b"-")  # this interpreter is not the one that command would get: the launcher starts its own
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, fds, [listener.fileno(), wake_read, wake_write, *(c.fileno() for c in waiting.values())])
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            waiting[pid] = conn
    os._exit(0)


def _interpreter_settings(env: dict[str, str]) -> dict[str, str]:
    """What of `env` the interpreter reads as it starts (its streams' encoding, its locale, its flags): a fork keeps this
    process's, so a command started with others (`PYTHONIOENCODING=ascii`, a Latin-1 locale) is not forked."""
    return {name: value for name, value in env.items() if name.startswith("PYTHON") or name in _LOCALE}


_LOCALE = frozenset({"LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE"})


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the launcher is gone: nobody to tell
                conn.send(str(status).encode())
            conn.close()


def _child(request: dict[str, Any], fds: list[int], inherited: list[int]) -> NoReturn:
    import random
    import threading

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in inherited:
        os.close(fd)
    stdin, stdout, stderr, watch = fds
    for source, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(source, target)
        os.close(source)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fork shares its parent's generator state

    def watch_launcher() -> None:
        while os.read(watch, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch_launcher, daemon=True).start()
    script = request.get("script")
    try:
        if script is None:
            sys.argv = ["breakwater", *request["argv"]]
            from breakwater.cli import run

            run()
        else:
            _run_script(script, request["argv"])
    except SystemExit as exc:
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)  # as the interpreter says `sys.exit("why")`
        _flush()
        os._exit(0 if code is None else code if isinstance(code, int) else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        _flush()
        os._exit(1)
    _flush()
    os._exit(0)


def _run_script(script: str, argv: list[str]) -> None:
    """`python SCRIPT ARGV` in this fork, as the interpreter would run it: its own `__main__`, its directory first on
    the path, and at its end what an interpreter does before it exits (its non-daemon threads, its `atexit` hooks)."""
    import atexit
    import runpy
    import threading

    from breakwater.testing import _launcher

    _launcher.IN_FORK = True  # the script's own `fork_script` runs it here, not in another fork
    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a stream the reader closed: nothing more to say
            stream.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
