"""Windows, simulated: breakwater imports and runs where POSIX-only modules do not exist and `_platform` decides "Windows".

There is no Windows machine here. A child Python gets a `sitecustomize` that (1) refuses `fcntl`, `termios`,
`resource`, `pwd` and `grp` to every import written in breakwater's code (the SDK and filelock branch on
the real `sys.platform` themselves, and take their Linux branch here), and (2) executes
`breakwater._platform`, the one module that asks which platform this is, while `sys.platform` and
`os.name` say "win32" and "nt". The child imports every module of `src/`, runs `breakwater --help`,
`config check` and `status --json`, and reports what `_platform` chose. What this cannot show: that the
Windows calls themselves (CTRL_BREAK_EVENT, taskkill, thread-served console handles) behave on Windows.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "breakwater"
POSIX_ONLY = ("fcntl", "termios", "resource", "pwd", "grp")

SITECUSTOMIZE = textwrap.dedent(
    """
    import builtins, importlib.machinery, os, sys

    POSIX_ONLY = {posix_only!r}
    REFUSED = []
    _import = builtins.__import__

    def _guarded(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {{}}).get("__name__") or ""
        if level == 0 and name.partition(".")[0] in POSIX_ONLY and importer.partition(".")[0] == "breakwater":
            REFUSED.append(f"{{importer}} imports {{name}}")
            raise ImportError(f"simulated Windows: no module named {{name!r}}", name=name)
        return _import(name, globals, locals, fromlist, level)

    builtins.__import__ = _guarded

    class WindowsDecision:
        # Runs breakwater._platform's module code while the platform reads as Windows, and only that.
        def find_spec(self, name, path, target=None):
            if name != "breakwater._platform":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                # What it imports is imported for real first: their own module code must see Linux.
                import collections.abc, contextlib, shutil, signal, subprocess, threading, typing
                saved = sys.platform, os.name
                sys.platform, os.name = "win32", "nt"
                try:
                    run(module)
                finally:
                    sys.platform, os.name = saved

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, WindowsDecision())
    """
).format(posix_only=set(POSIX_ONLY))

DRIVER = textwrap.dedent(
    """
    import contextlib, importlib, io, json, pathlib, sys
    import sitecustomize

    src, config, shim_dir = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    names = []
    for path in sorted(src.rglob("*.py")):
        parts = ["breakwater", *path.relative_to(src).with_suffix("").parts]
        if parts[-1] == "__main__":
            continue  # running it is the CLI, below
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"

    from breakwater import _platform
    from breakwater.cli import main

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code
        return {"code": code, "out": out.getvalue(), "err": err.getvalue()}

    report = {
        "imported": len(names) - len(failed),
        "failed": failed,
        "refused": sitecustomize.REFUSED,
        "strategy": _platform.strategy(),
        "spawn": {k: v for k, v in _platform.spawn_options().items()},
        "stop_signals": list(_platform.STOP_SIGNALS),
        "npx": _platform.resolve_command("npx", {"PATH": shim_dir, "PATHEXT": ".COM;.EXE;.BAT;.CMD"}),
        "help": run("--help"),
        "check": run("config", "check", "--config", config),
        "status": run("status", "--json", "--wait", "5", "--config", config),
    }
    print(json.dumps(report))
    """
)


def _simulate(tmp_path: Path) -> dict[str, object]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    # npm's shim as Windows has it; the name is upper-cased as PATHEXT spells it (Linux matches case, Windows does not).
    shims = tmp_path / "node dir"
    shims.mkdir()
    (shims / "npx.CMD").write_text("@echo off\n")
    (shims / "npx.CMD").chmod(0o755)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"files": {"command": "breakwater-no-such-npx", "args": ["-y", "pkg"]}}}))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, str(driver), str(SRC), str(config), str(shims)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_simulated_windows_imports_everything_and_takes_the_windows_branches(tmp_path: Path) -> None:
    report = _simulate(tmp_path)
    assert report["failed"] == {}, report["failed"]
    assert report["refused"] == [], "breakwater imported a POSIX-only module"
    assert isinstance(report["imported"], int) and report["imported"] > 100
    strategy = report["strategy"]
    assert isinstance(strategy, dict)
    assert strategy["platform"] == "windows"
    assert strategy["process_group"] == "CREATE_NEW_PROCESS_GROUP" and strategy["stdio"] == "threads"
    assert strategy["shared_gateway"] == "off"
    assert strategy["event_loop"] == "asyncio"  # uvloop has no Windows build
    assert report["spawn"] == {"creationflags": 0x200}  # CREATE_NEW_PROCESS_GROUP, not a new session
    assert report["stop_signals"] == [21, 2]  # SIGBREAK (Ctrl-Break), SIGINT (Ctrl-C)
    assert report["npx"] == str(tmp_path / "node dir" / "npx.CMD")

    help_run, check, status = report["help"], report["check"], report["status"]
    assert isinstance(help_run, dict) and isinstance(check, dict) and isinstance(status, dict)
    assert help_run["code"] == 0 and "commands:" in help_run["out"]
    assert check["code"] == 0 and "breakwater-no-such-npx" in check["out"], check
    # Not found through PATHEXT: the error says what to write, as Claude Code documents it for Windows.
    assert status["code"] == 1, status
    (server,) = json.loads(status["out"])["servers"]
    assert server["state"] == "failed" and server["error"]["code"] == "spawn_failed"
    message = server["error"]["message"]
    assert "breakwater-no-such-npx{.com,.exe,.bat,.cmd}" in message
    assert '"command": "cmd", "args": ["/c", "breakwater-no-such-npx", ...]' in message


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name.partition(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module.partition(".")[0])
    return names


def test_platform_branches_live_in_one_place() -> None:
    """No POSIX-only import anywhere in src/; only `_platform` (and `_paths`, which must agree with
    platformdirs' own reading) looks at the platform; `_platform` is a stdlib-only core leaf."""
    posix_imports: list[str] = []
    asks: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        posix_imports += [f"{rel}: {name}" for name in _imports(path) if name in POSIX_ONLY]
        text = path.read_text(encoding="utf-8")
        if ("sys.platform" in text or "os.name" in text) and rel not in ("_platform.py", "_paths.py"):
            asks.append(rel)
    assert posix_imports == []
    assert asks == [], "decide platform behaviour in breakwater/_platform.py"
    outside = set(_imports(SRC / "_platform.py")) - set(sys.stdlib_module_names) - {"__future__"}
    assert outside == set()
