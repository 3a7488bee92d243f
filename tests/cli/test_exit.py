"""`breakwater`'s way out (`breakwater.cli.run`): what the interpreter would do before its teardown is done, then `os._exit`."""

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points, version
from pathlib import Path

import breakwater


def _program(body: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `body`, then `breakwater.cli.run()` with `argv`, in a fresh interpreter."""
    code = (
        textwrap.dedent(body)
        + f"\nimport sys\nsys.argv = ['breakwater', *{list(argv)!r}]\nfrom breakwater.cli import run\nrun()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_exit_code_output_atexit_functions_and_threads_are_kept() -> None:
    """The command's code, its buffered output, `atexit` functions (logging's flush is one) and a thread that
    is not a daemon all survive the fast exit, as they survive the interpreter's own."""
    done = _program(
        """
        import atexit, threading, time
        atexit.register(lambda: print("atexit ran", flush=True))
        def late():
            time.sleep(0.3)
            print("thread finished")
        threading.Thread(target=late).start()
        """,
        "--version",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()  # the thread may finish before or after the command prints
    assert sorted(lines[:2]) == sorted([f"breakwater {version('mcp-breakwater')}", "thread finished"])
    assert lines[2:] == ["atexit ran"]  # after the thread: the interpreter's order

    refused = _program("", "no-such-command")
    assert refused.returncode == 2
    assert "unknown command 'no-such-command'" in refused.stderr


def test_the_installed_command_and_python_m_both_end_through_run() -> None:
    """The script pip installs and `python -m breakwater` both take this way out, not `main()` and the teardown."""
    (script,) = entry_points(group="console_scripts", name="breakwater")
    assert script.value == "breakwater.cli:run"
    main_module = Path(breakwater.__file__).with_name("__main__.py").read_text()
    assert "run()" in main_module
