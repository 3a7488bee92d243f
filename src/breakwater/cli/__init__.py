"""The `breakwater` command line.

Each sub-command lives in the module of its concept; this file only routes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from breakwater._startup import sdk_imports


def _status(argv: list[str]) -> int:
    with sdk_imports():  # the module loads the SDK
        from breakwater.cli._status import status_main

    return status_main(argv)


def _config(argv: list[str]) -> int:
    from breakwater.cli._config import config_main

    return config_main(argv)


def _serve(argv: list[str]) -> int:
    from breakwater import _platform

    try:
        from breakwater.cli._serve import serve_main
    except KeyboardInterrupt:
        # A supervisor's SIGTERM while the module loads, before `serve_main` notes it as a clean stop: one too (exit 0),
        # as a moment later; seen on a loaded CI host, where the load outlasted the signal's 0.3 s.
        ended = _platform.ENDED_BY
        if _platform.TERMINATE_SIGNAL in ended and not any(signum in _platform.ENDING_SIGNALS for signum in ended):
            return 0
        raise
    return serve_main(argv)


def _gateway(argv: list[str]) -> int:
    from breakwater.cli._gateway import gateway_main

    return gateway_main(argv)


def _tools(argv: list[str]) -> int:
    from breakwater.cli._tools import tools_main

    return tools_main(argv)


def _stats(argv: list[str]) -> int:
    from breakwater.cli._stats import stats_main

    return stats_main(argv)


def _call(argv: list[str]) -> int:
    with sdk_imports():  # the module loads the SDK
        from breakwater.cli._call import call_main

    return call_main(argv)


def _auth(argv: list[str]) -> int:
    with sdk_imports():  # the module loads the SDK
        from breakwater.cli._auth import auth_main

    return auth_main(argv)


def _demo(argv: list[str]) -> int:
    with sdk_imports():  # the module loads the SDK
        from breakwater.cli._demo import demo_main

    return demo_main(argv)


def _testserver(argv: list[str]) -> int:
    with sdk_imports():
        from breakwater.testing.server import main

    return main(argv)


def _lab(argv: list[str]) -> int:
    from breakwater.lab.cli import main

    return main(argv)


#: The name breakwater is installed under (`pip install mcp-breakwater`).
DISTRIBUTION = "mcp-breakwater"

_COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "serve": ("serve every server's tools as one MCP server (stdio or --http)", _serve),
    "gateway": ("list or stop the shared local gateways stdio sessions attach to", _gateway),
    "tools": ("list or search every server's tools", _tools),
    "call": ("call one tool through the call gate and print its answer or its error", _call),
    "status": ("connect to every server and report each one's state", _status),
    "stats": ("per-tool calls, latency percentiles and timeouts from the call journal", _stats),
    "config": ("check the config, list every knob", _config),
    "auth": ("sign in to remote HTTP servers with OAuth (login, status, logout)", _auth),
    "demo": ("the whole story on built-in local servers, in under a minute", _demo),
    "testserver": ("run the misbehaving MCP test server", _testserver),
    "lab": ("the fleet lab: a deterministic simulator of an MCP server fleet", _lab),
}


def _usage() -> str:
    from breakwater.cli._common import exit_codes_epilog

    lines = ["usage: breakwater COMMAND [ARGS...]   (breakwater COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<12} {doc}" for name, (doc, _) in _COMMANDS.items()]
    lines += ["", "options:", "  -h, --help     this list", "  -V, --version  print the version", ""]
    return "\n".join([*lines, exit_codes_epilog()])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _unknown(command: str) -> int:
    from breakwater.cli._common import EXIT_CONFIG, did_you_mean, fail

    if command.startswith("-"):
        # A command's flag before the command (`breakwater --config x.toml status`): not a command that is misspelt.
        return fail(f"{command} goes after the command: breakwater COMMAND {command} ... (see breakwater --help)", EXIT_CONFIG)
    hint = did_you_mean(command, _COMMANDS)
    return fail(f"unknown command {command!r}{hint}; commands: {', '.join(_COMMANDS)} (see breakwater --help)", EXIT_CONFIG)


def _interrupted() -> int:
    from breakwater.cli._common import EXIT_INTERRUPTED, fail

    return fail("interrupted", EXIT_INTERRUPTED)


#: Commands that hold upstreams open: SIGTERM (Ctrl-Break on Windows) stops them as Ctrl-C does, in order,
#: instead of killing the process under its upstreams (`serve` then tells the two apart itself).
_STOPPABLE = frozenset({"serve", "tools", "call", "status"})


def _run(command: Callable[[list[str]], int], argv: list[str], *, stoppable: bool = False) -> int:
    """Run one command; Ctrl-C and a closed output pipe end it with one line and their exit code, not a traceback."""
    from breakwater import _platform
    from breakwater.errors import ConfigError

    try:
        with _platform.terminate_as_interrupt() if stoppable else contextlib.nullcontext():
            return command(argv)
    except KeyboardInterrupt:
        ended_by = [signum for signum in _platform.ENDED_BY if signum in _platform.ENDING_SIGNALS]
        if ended_by:  # a hang-up or SIGQUIT: stopped as cleanly, and the shell's code for it (128 + its number)
            from breakwater.cli._common import fail

            return fail(f"stopped by {signal.Signals(ended_by[0]).name}", 128 + ended_by[0])
        return _interrupted()
    except BaseExceptionGroup as group:
        interrupts, rest = group.split(KeyboardInterrupt)
        if interrupts is None:
            pipes, rest = group.split(BrokenPipeError)
            if pipes is not None and rest is None:
                return _reader_gone()
            raise
        if rest is not None:
            raise
        return _interrupted()
    except BrokenPipeError:
        return _reader_gone()
    except OutputLost as exc:
        return _output_lost(exc)
    except ConfigError as exc:
        # Found as something opened (a store URL its client refuses), after the config was read: said as a config error
        # is, with its key and fix, and its exit code, not a traceback.
        from breakwater.cli._common import EXIT_CONFIG, fail

        return fail(f"config error: {exc}", EXIT_CONFIG)
    except Exception as exc:
        # Ctrl-C in the middle of an import that wraps what it meets: a dataclass being defined raises
        # RuntimeError("Error calling __set_name__ ...") from the KeyboardInterrupt (an attached `serve`
        # interrupted while it loads its relay). Still an interruption, not a traceback and exit code 1.
        if _interrupt_behind(exc):
            return _interrupted()
        raise


def _reader_gone() -> int:
    """The reader of stdout went away (`| head`, or stdout closed): nothing more to say to it, nothing to flush at exit."""

    from breakwater.cli._common import EXIT_PIPE

    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return EXIT_PIPE


class OutputLost(OSError):
    """Standard output refused a write for another reason than a reader gone (a full disk: `> /dev/full`)."""


class _Stdout(io.TextIOWrapper):
    """The program's stdout: a failed write or flush (but a reader gone) is an `OutputLost`, which `_run` tells in one
    line, where it was a traceback from whichever print met it first (or exit code 120 at the final flush)."""

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputLost(exc.errno, exc.strerror) from None

    def flush(self) -> None:
        try:
            super().flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputLost(exc.errno, exc.strerror) from None


def _output_lost(exc: OSError | ValueError) -> int:
    from breakwater.cli._common import EXIT_FAILED, fail

    with contextlib.suppress(OSError, ValueError):  # what is still buffered cannot be written either: dropped
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the process's stdout from here on
    return fail(f"cannot write the output: {getattr(exc, 'strerror', None) or exc}", EXIT_FAILED)


def _interrupt_behind(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is what `exc` was raised from (its chain of causes)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"breakwater {_version()}")
        return 0
    command = _COMMANDS.get(args[0])
    if command is None:
        return _unknown(args[0])
    try:
        os.getcwd()
    except FileNotFoundError:
        from breakwater.cli._common import EXIT_CONFIG, fail

        # Started in a folder that was removed (a deleted checkout, a temporary directory): every command reads
        # relative paths and the folder's Claude Code settings there, and `config check` ended in a traceback.
        return fail("the current directory no longer exists; cd to one that does and run again", EXIT_CONFIG)
    return _run(command[1], args[1:], stoppable=args[0] in _STOPPABLE)


def _standard_streams() -> None:
    """Give a process started with fd 0, 1 or 2 closed (`<&-`, `>&-`, `2>&-`) standard streams that behave.

    Python sets the stream of a closed descriptor to None, so every command's first print was an
    AttributeError traceback, and the next file opened took the number (a database opened as fd 2
    would have received stderr's lines, and every child process's). Closed stdout is a pipe closed
    from the start: fd 1 is the write end of a pipe nobody reads, so output is lost exactly as with
    `| head` (`serve` included: its session ends as for a reader gone) and the command exits 141
    (EXIT_PIPE) when it had output to lose, its own code when it had none. Closed stderr is the null
    device: diagnostics are dropped and the exit code stays the command's. Closed stdin is the null
    device too: an empty input, as `serve` already reads it. Call before anything opens a file.
    """

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        if fd == 1:
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)  # when the pipe took fd 1 as its read end, this closes that end
            for extra in {read_end, write_end} - {fd}:
                os.close(extra)
        else:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            stream = open(fd, "r" if fd == 0 else "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115 - the process's own stream, kept open
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
    out = sys.stdout
    if type(out) is io.TextIOWrapper:
        # A stream of our own on fd 1, as the interpreter's (which never closes fd 1: closefd is off) was opened; not
        # the interpreter's buffer taken over, which may be another file's (a forked process's, fd 1 moved since).
        out.flush()
        buffer = open(1, "wb", buffering=0 if out.write_through else -1, closefd=False)  # noqa: SIM115 - the process's stdout
        ours = _Stdout(buffer, out.encoding, out.errors, line_buffering=out.line_buffering, write_through=out.write_through)
        sys.stdout = ours
        sys.__stdout__ = ours  # type: ignore[misc]  # what the interpreter flushes at its end
    # An output encoding that cannot write every character (PYTHONIOENCODING=ascii, a Latin-1 terminal) wrote a
    # traceback for a server named "sérveur": what it cannot write is shown escaped instead (JSON is ASCII already).
    for out in (sys.stdout, sys.stderr):
        reconfigure = getattr(out, "reconfigure", None)
        if reconfigure is not None and (getattr(out, "encoding", "") or "").lower().replace("-", "") != "utf8":
            reconfigure(errors="backslashreplace")


def run() -> NoReturn:
    """The `breakwater` program: `main()`, then the process ends without tearing the interpreter down.

    Why. A process that has loaded the SDK holds thousands of pydantic classes and their schemas, and
    the interpreter frees every one of them on its way out: 0.3 s of CPU on an idle 2-core host, and
    up to 2 s of wall time on a busy one, measured from a `serve` session's end of input to its exit
    (py-spy showed the main thread busy with no Python frame: the finalisation). A client that closed
    `serve`'s input signals it 2 s later (both SDKs), so that was a `serve` killed mid-exit. What the
    interpreter does before that teardown is done here, in its order: the threads that are not
    daemons are waited for (with the pools that hook into that), the `atexit` functions run
    (logging's flush among them), the standard streams are flushed; then `os._exit`. `main()` itself
    returns, for callers in the same process.
    """
    import threading

    _standard_streams()  # first: a closed fd 0, 1 or 2 must not be the next file opened
    try:
        code = main()
    except OutputLost as exc:  # `--help` and `--version`, printed before a command's `_run`
        code = _output_lost(exc)
    getattr(threading, "_shutdown", lambda: None)()  # what `Py_FinalizeEx` does first
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError) as exc:  # a reader gone or a stream closed: as the interpreter, say nothing more
            if stream is sys.stdout and code == 0:
                # A reader gone is the documented 141, as when it goes earlier; a full disk, as when it fills earlier.
                code = 141 if isinstance(exc, BrokenPipeError) else _output_lost(exc)  # 141: _common.EXIT_PIPE
    os._exit(code)


if __name__ == "__main__":
    run()
