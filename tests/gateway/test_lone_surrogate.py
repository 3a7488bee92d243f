"""A request holding a lone surrogate escape (`"\\ud800"`) is answered at once, over stdio and over HTTP.

The fast lanes read it with the stdlib's parser, which takes it, and sent it on to a server whose parser dropped it:
the call waited for its timeout and came back TIMEOUT, retryable (an agent would send it again). The SDK's own path
refuses the line at once; the lanes now read only what the SDK's parser reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers import INITIALIZE, INITIALIZED, isolated_env

CALL = '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "ts__echo", "arguments": {"s": "\\ud800"}}}'


def test_a_lone_surrogate_in_a_calls_arguments_is_answered_at_once_over_stdio(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    entry = {"command": sys.executable, "args": ["-m", "breakwater", "testserver", "--name", "ts"]}
    config.write_text(json.dumps({"mcpServers": {"ts": entry}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=isolated_env(tmp_path, BREAKWATER_CALL_TIMEOUT_S="20", XDG_CACHE_HOME=str(tmp_path / "cache")),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        warm = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ts__echo", "arguments": {}}}
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in (INITIALIZE, INITIALIZED, warm)))
        proc.stdin.flush()
        answers: dict[object, dict[str, object]] = {}
        while 2 not in answers:
            line = json.loads(proc.stdout.readline())
            answers[line.get("id")] = line
        started = time.monotonic()
        proc.stdin.write(CALL.encode() + b"\n")
        proc.stdin.flush()
        while 3 not in answers:
            line = json.loads(proc.stdout.readline())
            answers[line.get("id")] = line
        took = time.monotonic() - started
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert "error" in answers[3], answers[3]  # the SDK's refusal: no valid message, not a call that timed out
    assert took < 10, took  # far below the call's 20 s timeout it waited for before
