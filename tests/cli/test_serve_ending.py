"""How `breakwater serve` ends when its upstreams misbehave or its terminal goes: at once, and with nothing left behind.

Real `serve` processes over real upstream processes (small Python scripts written here); the bounds
are wall-clock ones, generous, since what is measured is a real process exiting.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from helpers import INITIALIZE, INITIALIZED, alive

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGHUP and process groups are POSIX's")

#: A tiny MCP server: answers initialize, tools/list (one tool, t0) and tools/call; writes its pid to argv[1].
#: argv[2]: "sticky" runs on after the end of its input; "flood" sends log messages without pause once initialized;
#: "mute" never answers, and runs on after the end of its input.
UPSTREAM = """
import json, os, sys, threading, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()}\\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
mode = sys.argv[2]
if mode == "mute":  # reads its input, never answers (a server stuck starting), and outlives its input
    for line in sys.stdin.buffer:
        pass
    time.sleep(600)
out = sys.stdout.buffer
lock = threading.Lock()
def send(message):
    with lock:
        out.write(json.dumps(message).encode() + b"\\n")
        out.flush()
def flood():
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x" * 200}}
    while True:
        send(note)
for line in sys.stdin.buffer:
    message = json.loads(line)
    method, mid = message.get("method"), message.get("id")
    if mid is None:
        continue
    if method == "initialize":
        version = message["params"].get("protocolVersion", "2025-11-25")
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": version, "capabilities": {"tools": {}},
                                                     "serverInfo": {"name": "up", "version": "1"}}})
        if mode == "flood":
            threading.Thread(target=flood, daemon=True).start()
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": [{"name": "t0", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "ok"}]}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}})
if mode == "sticky":
    time.sleep(600)
"""

CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "up__t0", "arguments": {}}}


def _config(tmp_path: Path, mode: str) -> Path:
    script = tmp_path / "up.py"
    script.write_text(UPSTREAM)
    path = tmp_path / "mcp.json"
    entry = {"command": sys.executable, "args": [str(script), str(tmp_path / "up.pid"), mode]}
    path.write_text(json.dumps({"mcpServers": {"up": entry}}))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "adm"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()):
            return text
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def _serve(tmp_path: Path, mode: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "breakwater", "serve", "--config", str(_config(tmp_path, mode)), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
    )


def _send(proc: subprocess.Popen[bytes], *messages: Mapping[str, object]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    proc.stdin.flush()


def _answer(proc: subprocess.Popen[bytes], request_id: int, timeout: float = 30.0) -> dict[str, object]:
    """The answer to `request_id`, read past the log messages relayed before it."""
    assert proc.stdout is not None
    found: list[dict[str, object]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if message.get("id") == request_id:
                found.append(message)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert found, f"no answer to request {request_id}"
    return found[0]


def _drain_stdout(proc: subprocess.Popen[bytes]) -> None:
    """Keep reading what `serve` writes (relayed log messages), so its output pipe never fills."""

    def read() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            pass

    threading.Thread(target=read, daemon=True).start()


@pytest.mark.parametrize(("mode", "signum"), [("stdio", "SIGHUP"), ("http", "SIGHUP"), ("stdio", "SIGQUIT"), ("http", "SIGQUIT")])
def test_sighup_ends_serve_as_sigterm_does_with_its_upstreams_stopped(tmp_path: Path, mode: str, signum: str) -> None:
    """The terminal closes (SIGHUP), or Ctrl-\\ (SIGQUIT): `serve` stops its upstreams (one that outlives its input
    too) and exits 128 + the signal's number.

    It used to die at once (their default action), leaving the upstream running with no parent.
    """
    extra = ("--http", "127.0.0.1:0", "--port-file", str(tmp_path / "port")) if mode == "http" else ()
    proc = _serve(tmp_path, "sticky", *extra)
    try:
        if mode == "http":
            _wait_for(tmp_path / "port")
        else:
            _send(proc, INITIALIZE)
            assert _answer(proc, 1)["id"] == 1
        upstream = int(_wait_for(tmp_path / "up.pid"))
        proc.send_signal(getattr(signal, signum))
        assert proc.wait(timeout=60) == 128 + getattr(signal, signum)
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
        assert _gone(upstream, 15), "the upstream outlived serve"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("command", ["status", "call"])
@pytest.mark.parametrize("signum", ["SIGHUP", "SIGQUIT"])
def test_a_hang_up_ends_every_command_that_starts_upstreams_with_them_stopped(tmp_path: Path, command: str, signum: str) -> None:
    """A terminal closed while `status` waits (SIGHUP), or Ctrl-\\: the command died at once, and an upstream that
    outlives its input ran on with no parent. Now it stops them as on SIGTERM and exits 128 + the signal's number."""
    config = str(_config(tmp_path, "mute"))  # never ready: the command is still waiting when the signal comes
    argv = {"status": ["status", "--wait", "30", "--config", config], "call": ["call", "--config", config, "up", "nothing"]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", *argv[command]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
    )
    try:
        upstream = int(_wait_for(tmp_path / "up.pid"))
        proc.send_signal(getattr(signal, signum))
        assert proc.wait(timeout=60) == 128 + getattr(signal, signum)
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
        assert _gone(upstream, 15), f"the upstream outlived {command}"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(("signum", "code"), [("SIGTERM", 130), ("SIGHUP", 129)])
def test_a_stop_signal_with_ctrl_c_ignored_ends_a_command_without_a_traceback(tmp_path: Path, signum: str, code: int) -> None:
    """A script's `breakwater status &` (or nohup) runs with SIGINT ignored, and asyncio then installs no handler of
    its own: the stop came as a KeyboardInterrupt raised in the event loop's callbacks, four tracebacks on stderr."""
    config = str(_config(tmp_path, "mute"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "status", "--wait", "30", "--config", config],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # what a shell does for `cmd &`
    )
    try:
        upstream = int(_wait_for(tmp_path / "up.pid"))
        proc.send_signal(getattr(signal, signum))
        assert proc.wait(timeout=60) == code
        assert proc.stderr is not None and b"Traceback" not in (stderr := proc.stderr.read()), stderr.decode()
        assert _gone(upstream, 15), "the upstream outlived status"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("ending", ["eof", "sigterm"])
def test_a_flooding_upstream_does_not_hold_serve_after_its_session_ends(tmp_path: Path, ending: str) -> None:
    """An upstream that sends log messages without pause: the end of input, or one SIGTERM, ends `serve` in seconds.

    The session's reader of that upstream never waited while its pipe had data, so no cancellation
    reached it: `serve` spun for a minute and more after its input ended, and ignored a first SIGTERM.
    """
    proc = _serve(tmp_path, "flood")
    try:
        _send(proc, INITIALIZE, INITIALIZED)
        assert _answer(proc, 1)["id"] == 1
        upstream = int(_wait_for(tmp_path / "up.pid"))
        _send(proc, CALL)
        assert "result" in _answer(proc, 2)
        _drain_stdout(proc)
        time.sleep(1)  # the flood is well under way
        started = time.monotonic()
        if ending == "eof":
            assert proc.stdin is not None
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - started
        assert code == 0 and took < 8, f"serve exited with {code} after {took:.1f} s"
        assert _gone(upstream, 10), "the upstream outlived serve"
    finally:
        if proc.poll() is None:
            proc.kill()
