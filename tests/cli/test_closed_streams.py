"""A command whose stdout or stderr is closed (`>&-`, `2>&-`), or whose reader goes away (`| head`): no traceback.

Real processes over real descriptors: a closed stdout is a pipe closed from the start, so output that
cannot be written is lost as with `| head` and the exit code is 141 when there was output to lose; a
closed stderr only loses diagnostics. `serve` follows the same rule, and a call still in flight when
its input ends (its server still starting) is answered, not cut with a bare CONNECTION_CLOSED.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BREAKWATER = [sys.executable, "-m", "breakwater"]


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return dict(
        os.environ,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "cfg"),
        XDG_STATE_HOME=str(home / "state"),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_DATA_HOME=str(home / "data"),
        BREAKWATER_SHARE="off",
        BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )


def _closed(redirect: str, argv: list[str], env: dict[str, str], stdin: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` with `redirect` (e.g. `>&-`) applied by a shell, stderr captured unless it is the one closed."""
    script = f'exec "$@" {redirect}'
    with open(stdin or os.devnull, "rb") as given:
        return subprocess.run(["sh", "-c", script, "sh", *argv], stdin=given, capture_output=True, env=env, timeout=120)


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "ts.json"
    config.write_text(
        json.dumps(
            {"mcpServers": {"ts": {"command": sys.executable, "args": ["-m", "breakwater", "testserver", "--name", "ts"]}}}
        )
    )
    return config


def _requests(tmp_path: Path) -> Path:
    lines = [
        {
            "jsonrpc": "2.0",
            "id": "init",
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ts__echo", "arguments": {}}},
    ]
    path = tmp_path / "requests"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_closed_stdout_is_a_reader_gone_and_a_closed_stderr_loses_only_diagnostics(tmp_path: Path) -> None:
    env = _env(tmp_path)
    config = _config(tmp_path)
    # `config check` prints through Rich, whose own answer to a reader gone is exit code 1, silently.
    for argv in (["--version"], ["stats", "--config", str(config)], ["config", "check", "--config", str(config)]):
        done = _closed(">&-", [*BREAKWATER, *argv], env)
        assert done.returncode == 141, (argv, done.stderr)
        assert b"Traceback" not in done.stderr, done.stderr
    quiet = _closed("2>&-", [*BREAKWATER, "--version"], env)
    assert quiet.returncode == 0
    assert quiet.stdout.startswith(b"breakwater ")
    both = _closed(">&- 2>&-", [*BREAKWATER, "--version"], env)
    assert both.returncode == 141
    refused = _closed("2>&-", [*BREAKWATER, "no-such-command"], env)
    assert refused.returncode == 2  # the usage error's code, its line lost with stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device whose every write fails ENOSPC")
@pytest.mark.parametrize("buffered", [True, False])
def test_an_output_that_cannot_be_written_is_one_line_and_exit_1(tmp_path: Path, buffered: bool) -> None:
    env = _env(tmp_path)
    # Unbuffered, the first print fails; buffered, the flush at exit does (where the code was 120, silently).
    if buffered:
        env.pop("PYTHONUNBUFFERED", None)
    else:
        env["PYTHONUNBUFFERED"] = "1"
    for argv in (["--version"], ["config", "knobs"], ["lab", "missions"]):
        done = _closed("> /dev/full", [*BREAKWATER, *argv], env)
        assert done.returncode == 1, (argv, done.stderr)
        assert done.stderr == b"breakwater: cannot write the output: No space left on device\n", (argv, done.stderr)


def test_serve_with_stdout_closed_ends_as_for_a_reader_gone(tmp_path: Path) -> None:
    env = _env(tmp_path)
    argv = [*BREAKWATER, "serve", "--config", str(_config(tmp_path)), "--no-share"]
    done = _closed(">&-", argv, env, stdin=_requests(tmp_path))
    assert done.returncode == 141, done.stderr
    assert b"Traceback" not in done.stderr, done.stderr
    answered = _closed("2>&-", argv, env, stdin=_requests(tmp_path))
    assert answered.returncode == 0
    assert b'"id":2,"result"' in answered.stdout


@pytest.mark.parametrize("share", ["off", "on"])
def test_serve_whose_reader_goes_away_mid_session_exits_141_without_a_traceback(tmp_path: Path, share: str) -> None:
    """`serve | head -c 100`: the call's answer is written after the reader went away. Attached to the shared gateway
    (which writes to the agent's pipe itself), the gateway logged a traceback and `serve` went on to a new gateway."""
    argv = [*BREAKWATER, "serve", "--config", str(_config(tmp_path)), *(["--no-share"] if share == "off" else [])]
    env = _env(tmp_path) | {"BREAKWATER_SHARE": share, "BREAKWATER_SHARE_DIR": str(tmp_path / "share")}
    try:
        with open(_requests(tmp_path), "rb") as requests:
            proc = subprocess.Popen(argv, stdin=requests, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.read(100)  # the initialize answer's start; the call's answer comes once `ts` started
            proc.stdout.close()
            stderr = proc.stderr.read()
            assert proc.wait(timeout=120) == 141, stderr
        assert b"Traceback" not in stderr and b"raised" not in stderr and b"went away" not in stderr, stderr
        logs = b"".join(p.read_bytes() for p in (tmp_path / "share").rglob("*.log"))
        assert b"Traceback" not in logs, logs[-2000:]
    finally:
        subprocess.run([*BREAKWATER, "gateway", "stop"], env=env, capture_output=True, timeout=60, check=False)


def test_a_call_in_flight_when_the_input_ends_is_answered_not_cut(tmp_path: Path) -> None:
    """The input ends right after the call, while `ts` still starts: the call gets its drain window and its answer."""
    argv = [*BREAKWATER, "serve", "--config", str(_config(tmp_path)), "--no-share"]
    with open(_requests(tmp_path), "rb") as requests:
        done = subprocess.run(argv, stdin=requests, capture_output=True, env=_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    answers = {line["id"]: line for line in map(json.loads, done.stdout.splitlines()) if "id" in line}
    assert "result" in answers[2], answers[2]
    assert answers[2]["result"]["isError"] is False


def test_a_requests_file_that_starts_with_a_bom_is_answered_from_its_first_line(tmp_path: Path) -> None:
    """PowerShell and Notepad start a file with a BOM: the handshake's line was a parse error and its id never answered."""
    requests = _requests(tmp_path)
    requests.write_bytes(b"\xef\xbb\xbf" + requests.read_bytes())
    argv = [*BREAKWATER, "serve", "--config", str(_config(tmp_path)), "--no-share"]
    with open(requests, "rb") as given:
        done = subprocess.run(argv, stdin=given, capture_output=True, env=_env(tmp_path), timeout=120)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    answers = {line["id"]: line for line in lines if "id" in line}
    assert "result" in answers["init"] and "result" in answers[2], done.stdout
    assert not [line for line in lines if "error" in line]  # no parse error for the first line


def test_stdin_read_on_a_thread_pauses_when_the_reader_is_full(tmp_path: Path) -> None:
    """`serve < /dev/zero` (a file: read on a thread) grew past a gigabyte: each chunk was queued on the event loop
    before the reader could ask the thread to pause, so the pause came after everything was read. Here a reader
    that nobody drains, over a 16 MiB file: it must hold about its high-water mark, not the file."""
    import asyncio

    from breakwater.gateway._stdio_server import _ThreadFeed

    zeros = tmp_path / "zeros"
    zeros.write_bytes(bytes(16 * 1024 * 1024))
    limit = 64 * 1024

    async def main() -> int:
        reader = asyncio.StreamReader(limit=limit)
        fd = os.open(zeros, os.O_RDONLY)
        feed = _ThreadFeed(fd, reader, asyncio.get_running_loop())
        try:
            for _ in range(50):  # the thread has all the time it needs to read ahead
                await asyncio.sleep(0.02)
            return len(reader._buffer)  # type: ignore[attr-defined]
        finally:
            feed.close()
            os.close(fd)

    held = asyncio.run(main())
    assert held <= 2 * limit + 64 * 1024, held  # StreamReader pauses past twice its limit; one chunk may be in flight
