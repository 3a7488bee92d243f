"""Where Windows and POSIX (Linux, macOS) differ: every platform branch of breakwater, behind a small function.

One decision, `IS_WINDOWS`, is taken once, at import; nothing else in `src/` tests `sys.platform` or
`os.name` to choose behaviour, and nothing imports a POSIX-only module (`fcntl`, `termios`,
`resource`, `pwd`, `grp`). A test can therefore simulate Windows on Linux by making that one decision
come out the other way (tests/test_platform_simulation.py), and `strategy()` says which branch each
difference took. The differences:

- starting an upstream: POSIX gives it a new session (its own process group, the group id is its
  pid); Windows gives it a new process group (`CREATE_NEW_PROCESS_GROUP`), the unit Ctrl-Break reaches;
- stopping it, after the MCP shutdown's stdin close and grace: the polite signal to the whole group
  (SIGTERM; Windows: CTRL_BREAK_EVENT), then, after another grace, killing the whole tree (SIGKILL to
  the group; Windows: `taskkill /T /F`, which walks the tree from the process). What left the group
  (a browser Puppeteer or Playwright starts in a session of its own) is found on Linux by its parent
  links, read from /proc before the stop begins (`descendants`), and gets the same signals; other
  POSIX systems reach the group only;
- the command: POSIX `exec` searches PATH itself; Windows' CreateProcess finds only `.exe` files, so
  `npx` (really `npx.cmd`) is looked up through PATHEXT here, and a command that is not found gets a
  message that says what to write instead;
- the downstream stdio transport: asyncio's non-blocking pipe transports on POSIX; on Windows the
  standard handles an agent hands a process are not overlapped, which the proactor loop's pipes need
  (the selector loop has none), so stdin and stdout are served from threads;
- the signals that stop a command: SIGTERM and SIGINT; on Windows Ctrl-Break (SIGBREAK) and Ctrl-C;
- the event loop of the long-running commands (`serve`, the shared gateway): uvloop where it is
  installed (a dependency on POSIX; it has no Windows build), else asyncio's own (`event_loop`);
- their memory: with glibc, large freed blocks go back to the system (`return_large_frees`).

Stdlib only: a core leaf, importable by every stage.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

__all__ = [
    "ENDED_BY",
    "ENDING_SIGNALS",
    "FAST_STDIO",
    "FILE_MODES",
    "INTERRUPT_SIGNAL",
    "IS_WINDOWS",
    "SHARED_SOCKETS",
    "STOP_SIGNALS",
    "TERMINATE_SIGNAL",
    "UNIX_SOCKET_PATH_MAX",
    "Member",
    "ask_each_to_stop",
    "ask_to_stop",
    "bind_error",
    "descendants",
    "event_loop",
    "group_alive",
    "kill_each",
    "kill_tree",
    "loop_options",
    "not_found_advice",
    "on_stop_signals",
    "pid_alive",
    "resolve_command",
    "running_loop",
    "spawn_options",
    "still_running",
    "stopped",
    "strategy",
    "terminate_as_interrupt",
]

#: The one platform decision; everything below branches on it.
IS_WINDOWS: Final[bool] = sys.platform == "win32"

# The Windows values, spelled out: the names exist only in Windows builds of `subprocess` and `signal`.
_CREATE_NEW_PROCESS_GROUP: Final = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x00000200)
_CTRL_BREAK_EVENT: Final = getattr(signal, "CTRL_BREAK_EVENT", 1)
_SIGBREAK: Final = getattr(signal, "SIGBREAK", 21)
# What cmd.exe falls back to when PATHEXT is unset.
_DEFAULT_PATHEXT: Final = ".COM;.EXE;.BAT;.CMD"

#: Whether the downstream stdio transport may use asyncio's pipe transports (see the module docstring).
FAST_STDIO: Final[bool] = not IS_WINDOWS

#: Whether file modes (0600, 0700) protect a file: POSIX permissions; on Windows the ACLs decide.
FILE_MODES: Final[bool] = not IS_WINDOWS
#: Whether a local gateway can be shared over a Unix socket guarded by file modes (not on Windows, for now:
#: that needs a named pipe with an ACL).
SHARED_SOCKETS: Final[bool] = not IS_WINDOWS
#: The longest path a Unix socket can be bound to, in bytes: `sun_path` holds 108 on Linux, 104 on macOS and the
#: BSDs, the terminating NUL included. A longer one fails the bind (`OSError: AF_UNIX path too long`).
UNIX_SOCKET_PATH_MAX: Final[int] = 107 if sys.platform.startswith("linux") else 103

#: Ctrl-C, on every platform.
INTERRUPT_SIGNAL: Final[int] = signal.SIGINT
#: The polite "stop now" a supervisor or a person sends: SIGTERM; Ctrl-Break on Windows (a console has no SIGTERM).
TERMINATE_SIGNAL: Final[int] = _SIGBREAK if IS_WINDOWS else signal.SIGTERM
#: The signals that end `serve` as the end of input does.
STOP_SIGNALS: Final[tuple[int, ...]] = (TERMINATE_SIGNAL, INTERRUPT_SIGNAL)
#: The other signals whose default action ends a process at once (POSIX): a terminal closed (SIGHUP), Ctrl-\
#: (SIGQUIT). The commands that start upstreams end on them as on SIGTERM, in order, leaving no upstream behind.
ENDING_SIGNALS: Final[tuple[int, ...]] = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGQUIT") if hasattr(signal, name))


def strategy() -> dict[str, str]:
    """Which branch each platform difference takes here, by name (for tests and bug reports)."""
    if IS_WINDOWS:
        return {
            "platform": "windows",
            "process_group": "CREATE_NEW_PROCESS_GROUP",
            "polite_stop": "CTRL_BREAK_EVENT",
            "kill_tree": "taskkill /T /F",
            "command_lookup": "PATHEXT",
            "stdio": "threads",
            "stop_signals": "SIGBREAK SIGINT",
            "shared_gateway": "off",
            "event_loop": "asyncio",
        }
    return {
        "platform": "posix",
        "process_group": "start_new_session",
        "polite_stop": "SIGTERM to the group",
        "kill_tree": "SIGKILL to the group and to what left it (Linux)",
        "command_lookup": "exec",
        "stdio": "asyncio pipes",
        "stop_signals": "SIGTERM SIGINT",
        "shared_gateway": "unix socket",
        "event_loop": event_loop(),
    }


# ---- the event loop ------------------------------------------------------------------------------


def event_loop(choice: str = "auto") -> str:
    """The loop a long-running command runs on for `[gateway] event_loop = choice`: "uvloop" or "asyncio".

    Why uvloop: its loop and transports are C, and a proxied call is mostly the loop's work (wake-ups,
    callbacks, pipe and socket writes). Measured (`bench/proxy_instructions.py`, issue 16): 8-12 % fewer
    instructions per call over stdio and HTTP. `auto` takes it where it is installed; it has no Windows build.
    """
    if choice == "asyncio" or IS_WINDOWS:
        return "asyncio"
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def loop_options(choice: str = "auto") -> dict[str, Any]:
    """`anyio.run`'s `backend_options` for `[gateway] event_loop = choice`."""
    return {"use_uvloop": event_loop(choice) == "uvloop"}


def running_loop() -> str:
    """Which loop runs this coroutine: "uvloop" or "asyncio" (what `breakwater gateway list` shows)."""
    import asyncio  # here: a stdio session decides whether to attach before it loads any event loop

    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


# ---- memory --------------------------------------------------------------------------------------

#: Allocations at least this large get a mapping of their own, given back to the system when freed (glibc).
OWN_MAPPING_BYTES: Final[int] = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's `mallopt` parameter number


def return_large_frees() -> bool:
    """Have this process give large freed blocks back to the system (glibc's malloc); whether it could.

    Why. glibc serves a block of 128 KiB or more from a mapping of its own, which it unmaps when freed, but
    the first such free raises that threshold (up to 32 MiB), so later large blocks come from the heap,
    which glibc keeps when they are freed. A gateway that once passed a burst of large messages kept the
    memory for good: with the rest of what held it fixed, four rounds of ten 3 MB calls from clients that
    went away left `serve --http` at 567 MB, and with the threshold held at `OWN_MAPPING_BYTES` at 198 MB
    (`bench/http_memory.py`, docs/benchmarks.md). A message that large costs one mmap and one munmap more;
    smaller ones nothing.
    Other C libraries and Windows: nothing to do (False).
    """
    if IS_WINDOWS:
        return False
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, OWN_MAPPING_BYTES))
    except (OSError, AttributeError):
        return False


# ---- upstream processes --------------------------------------------------------------------------


def spawn_options() -> dict[str, Any]:
    """Keyword arguments for `anyio.open_process` that start the upstream in its own process group."""
    if IS_WINDOWS:
        # Not CREATE_NO_WINDOW as well: a process without a console cannot be sent Ctrl-Break, and
        # started from an agent breakwater has a (hidden) console its upstreams share.
        return {"creationflags": _CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def ask_to_stop(pid: int) -> None:
    """The polite signal to the upstream's whole group; one already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        if IS_WINDOWS:
            os.kill(pid, _CTRL_BREAK_EVENT)
        else:
            # The leader's pid is the group id (start_new_session); getpgid() would fail once it is reaped.
            os.killpg(pid, signal.SIGTERM)


def group_alive(pid: int, returncode: int | None) -> bool:
    """Whether anything of the upstream's group may still run. POSIX probes the group (signal 0);
    Windows has no such probe, so there it is whether the process itself still runs."""
    if IS_WINDOWS:
        return returncode is None
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # unsignalable survivors or unreaped zombies: not proof that the group is gone
    return True


def kill_tree(pid: int) -> None:
    """Kill the upstream and everything it started, at once. Blocking on Windows (it runs taskkill)."""
    if IS_WINDOWS:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["taskkill", "/T", "/F", "/PID", str(pid)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


#: A process as `descendants` saw it: its pid and its start time (clock ticks since boot), which tell it from a
#: later process given the same pid.
Member = tuple[int, int]


def descendants(pid: int) -> tuple[Member, ...]:
    """Every process `pid` started, and those started, by parent links: the ones that left its group included.

    Read from /proc (Linux); elsewhere none (Windows' `taskkill /T` walks the tree itself). Taken before a
    stop begins: once a parent exits, its children are the init process's and the link is gone.
    """
    if IS_WINDOWS:
        return ()
    try:
        names = os.listdir("/proc")
    except OSError:
        return ()
    children: dict[int, list[Member]] = {}
    for name in names:
        if name.isdigit() and (seen := _parent_and_start(int(name))) is not None:
            children.setdefault(seen[0], []).append((int(name), seen[1]))
    found: list[Member] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child[0])
    return tuple(found)


def still_running(members: tuple[Member, ...]) -> list[int]:
    """The pids of `members` that run yet: the same process (same start time), not a zombie, not a newcomer."""
    return [pid for pid, start in members if (seen := _parent_and_start(pid)) is not None and seen[1] == start]


def ask_each_to_stop(members: tuple[Member, ...]) -> None:
    """The polite signal to every one of `members` still running (`descendants`: none on Windows)."""
    _signal_each(members, TERMINATE_SIGNAL)


def kill_each(members: tuple[Member, ...]) -> None:
    """Kill every one of `members` still running (`descendants`: none on Windows)."""
    if not IS_WINDOWS:
        _signal_each(members, signal.SIGKILL)


def _signal_each(members: tuple[Member, ...], sig: int) -> None:
    for pid in still_running(members):
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):  # gone meanwhile: no error
            os.kill(pid, sig)


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a debugger): it runs, and can answer nothing. Linux (/proc);
    False elsewhere, or for a process gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] in (b"T", b"t")


def _parent_and_start(pid: int) -> tuple[int, int] | None:
    """From /proc/PID/stat: the parent's pid and the start time; None for a process gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()  # after the command's name, which may hold spaces and parentheses
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[1]), int(fields[19])


# ---- sockets -------------------------------------------------------------------------------------

# A failed bind's errno: the POSIX values, and Winsock's, which Python on Windows reports instead
# (`errno.EADDRINUSE` there is 100, the bind says 10048).
_BIND_ERRORS: Final[dict[int, str]] = {
    errno.EADDRINUSE: "in_use",
    errno.EACCES: "denied",
    errno.EADDRNOTAVAIL: "unavailable",
    10048: "in_use",  # WSAEADDRINUSE
    10013: "denied",  # WSAEACCES
    10049: "unavailable",  # WSAEADDRNOTAVAIL
}


def bind_error(exc: OSError) -> str | None:
    """Why a listening socket could not bind: "in_use", "denied", "unavailable", or None for anything else."""
    return _BIND_ERRORS.get(exc.errno) if exc.errno is not None else None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs. Not `os.kill(pid, 0)` on Windows: there any signal but the
    two console events terminates the process."""
    if not IS_WINDOWS:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's process: it exists
        return True
    import ctypes  # the Win32 calls, only ever reached on Windows

    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined,unused-ignore]
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return bool(kernel32.GetLastError() == 5)  # ERROR_ACCESS_DENIED: it exists
    try:
        code = ctypes.c_ulong()
        return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _pathext(env: dict[str, str] | None) -> list[str]:
    text = (env or {}).get("PATHEXT") or os.environ.get("PATHEXT") or _DEFAULT_PATHEXT
    return [ext for ext in text.split(";") if ext]


def resolve_command(command: str, env: dict[str, str] | None = None) -> str | None:
    """The program to start for `command`, or None when there is none to start.

    POSIX: `command` itself (exec searches the PATH). Windows: the file CreateProcess can start,
    found on `env`'s PATH through PATHEXT, so `npx` becomes `C:\\...\\npx.cmd`, which Python runs
    through cmd.exe as Claude Code's `cmd /c npx` does.
    """
    if not IS_WINDOWS:
        return command
    exts = _pathext(env)
    has_ext = os.path.splitext(command)[1].upper() in {ext.upper() for ext in exts}
    search = (env or {}).get("PATH") or os.environ.get("PATH")
    for candidate in [command] if has_ext else [command + ext for ext in exts]:
        found = shutil.which(candidate, path=search)
        if found:
            return found
    return None


def not_found_advice(command: str) -> str:
    """What to write when `command` cannot be found, for the spawn_failed message (no argument is
    repeated: one may be a secret)."""
    if not IS_WINDOWS:
        return "install it, or write its full path"
    exts = ",".join(_pathext(None)).lower()
    return (
        f"on Windows it is looked up as {command}{{{exts}}} on PATH; install it, write its full path, or run it "
        f'through cmd as Claude Code documents: "command": "cmd", "args": ["/c", "{command}", ...]'
    )


# ---- signals -------------------------------------------------------------------------------------


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[int], None]) -> Iterator[None]:
    """While inside, each of `STOP_SIGNALS` calls `callback(signum)` instead of its usual action.

    A plain `signal.signal` handler on every platform (asyncio's loop signal handlers do not exist on
    Windows); it runs on the main thread, so `callback` may use `loop.call_soon_threadsafe`, as
    asyncio's own Ctrl-C handling does. Outside the main thread nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, lambda s, _f: callback(s)) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, `TERMINATE_SIGNAL` (SIGTERM; Ctrl-Break on Windows) and `ENDING_SIGNALS` do what Ctrl-C does.

    Whatever handles SIGINT at that moment handles it: asyncio's runner cancels the main task, so
    every upstream is stopped in order before the command exits as interrupted, instead of the
    process dying with its upstreams still running.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        ENDED_BY.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
            return
        # SIGINT ignored (a script's `cmd &`, nohup): asyncio's runner installed no handler of its own, so this does
        # what that handler does: the first signal cancels the main task, a second interrupts. A KeyboardInterrupt
        # raised in whatever frame the signal landed broke the event loop's own callbacks (asyncio's tracebacks).
        import asyncio  # here: an attached `serve` hands its session over before it loads asyncio

        loop = asyncio._get_running_loop()
        if loop is None:
            raise KeyboardInterrupt
        loop.call_soon_threadsafe(_cancel_main_task if len(ENDED_BY) == 1 else _interrupt)

    previous = {signum: signal.signal(signum, forward) for signum in (TERMINATE_SIGNAL, *ENDING_SIGNALS)}
    try:
        yield
    except BaseException as exc:
        # The main task, cancelled by `forward`: ended as a Ctrl-C ends it. (By name: asyncio may never have loaded.)
        if type(exc).__name__ != "CancelledError" or not ENDED_BY:
            raise
        raise KeyboardInterrupt from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _cancel_main_task() -> None:
    """Cancel the task the event loop runs to completion (asyncio's and uvloop's), as asyncio's Ctrl-C handler does."""
    import asyncio

    for task in asyncio.all_tasks():
        callbacks = getattr(task, "_callbacks", None) or ()
        if not task.done() and any(_completes_the_run(callback) for callback, _ in callbacks):
            task.cancel()
            return
    raise KeyboardInterrupt  # no such task found: interrupt from this callback


def _completes_the_run(callback: Any) -> bool:
    return getattr(callback, "__name__", "") == "_run_until_complete_cb" or getattr(callback, "__module__", "") == "uvloop.loop"


def _interrupt() -> None:
    raise KeyboardInterrupt


#: The signals `terminate_as_interrupt` turned into an interruption, in order (the exit code says which came first).
ENDED_BY: list[int] = []
