"""`breakwater serve` over stdio answers every request during its drain, and a stop before the session is a clean stop.

Real processes: `serve` in front of the built-in `breakwater testserver`. After a first SIGTERM stdin is still
read: new requests are refused at once (the HTTP drain's refusal), lists and pings still answered, cancellations still
reach the calls in flight;
a second SIGTERM cuts what runs with the drain's envelopes (never a bare CONNECTION_CLOSED); SIGTERM before the
first request exits 0, as it does once the session is up.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from helpers import INITIALIZE, INITIALIZED, isolated_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: The drain's window: far longer than any of these tests may take, so only the refusal or the cut can answer.
DRAIN_S = "60"


class Session:
    """A `serve --no-share` process and every line it wrote, read on a thread."""

    def __init__(self, tmp_path: Path, *upstream_args: str) -> None:
        config = tmp_path / "mcp.json"
        entry = {"command": sys.executable, "args": ["-m", "breakwater", "testserver", "--name", "ts", *upstream_args]}
        config.write_text(json.dumps({"mcpServers": {"ts": entry}}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=isolated_env(tmp_path, BREAKWATER_DRAIN_S=DRAIN_S, XDG_CACHE_HOME=str(tmp_path / "cache")),
        )
        self.messages: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.messages.append(json.loads(line))

    def send(self, *messages: Mapping[str, object]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        self.proc.stdin.flush()

    def answer(self, request_id: int, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in list(self.messages):
                if message.get("id") == request_id and ("result" in message or "error" in message):
                    return message
            time.sleep(0.02)
        raise AssertionError(f"no answer to request {request_id}: {self.messages}")

    def start(self) -> None:
        self.send(INITIALIZE)
        self.answer(1)
        self.send(INITIALIZED)
        # A first call once the upstream is ready, so the calls below are in flight as soon as they are sent.
        self.send(_call(2, "ts__echo"))
        assert "result" in self.answer(2)

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        code = self.proc.wait(timeout)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read().decode()


def _call(request_id: int, tool: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def test_requests_after_sigterm_are_refused_at_once_and_cancellations_still_go_through(tmp_path: Path) -> None:
    session = Session(tmp_path, "--tool", "slow:latency=2", "--tool", "hang:hang=1", "--tool", "echo")
    session.start()
    session.send(_call(5, "ts__slow"), _call(6, "ts__hang"))
    time.sleep(0.5)
    session.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    sent = time.monotonic()
    session.send(
        _call(7, "ts__echo"), {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 9, "method": "ping"}
    )
    error = session.answer(7, timeout=5)["error"]
    assert error["code"] == -32603
    assert "shutting down" in error["message"] and "nothing was run" in error["message"]
    # A list and a ping run nothing, and a client finishing a call may need one (the SDK's client lists the tools to
    # check a result's structured content): answered.
    assert "result" in session.answer(8, timeout=5) and "result" in session.answer(9, timeout=5)
    assert time.monotonic() - sent < 1.5  # at once, not at the end of the drain
    # The hanging call is cancelled by its client: the drain no longer waits for it.
    session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 6}})
    assert "result" in session.answer(5)  # the slow call finished within the window
    code, stderr = session.finish(timeout=15)  # long before the 60 s window
    assert code == 0, stderr
    assert not [m for m in session.messages if m.get("id") == 6]  # a cancelled request is never answered


@pytest.mark.parametrize("first", ["SIGTERM", "SIGHUP"])
def test_a_second_stop_signal_cuts_the_calls_in_flight_with_the_drain_envelope(tmp_path: Path, first: str) -> None:
    session = Session(tmp_path, "--tool", "hang:hang=1", "--tool", "echo")
    session.start()
    session.send(_call(5, "ts__hang"))
    time.sleep(0.5)
    session.proc.send_signal(getattr(signal, first))
    time.sleep(0.3)
    cut = time.monotonic()
    session.proc.send_signal(signal.SIGTERM)
    answer = session.answer(5, timeout=10)
    assert time.monotonic() - cut < 3  # the cut, not the call timeout
    assert "error" not in answer, answer  # never the bare -32000 "Connection closed"
    result = answer["result"]
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert "shutting down" in text, text
    assert result["structuredContent"]["code"] in ("OUTCOME_UNKNOWN", "UPSTREAM_ERROR"), result
    code, stderr = session.finish()
    assert code == (129 if first == "SIGHUP" else 0), stderr


@pytest.mark.plain_gateway  # a signal during the process's own start: a fork would have started before it
@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
@pytest.mark.parametrize("delay", [0.3, 0.8])
def test_a_stop_before_the_first_request_is_a_clean_stop(tmp_path: Path, signum: int, expected: int, delay: float) -> None:
    session = Session(tmp_path, "--startup-delay", "100")
    # Past its own start (a process killed while Python starts is no `serve` yet): it has started its server. A fixed
    # 0.3 s was not always that on a loaded host.
    children = Path(f"/proc/{session.proc.pid}/task/{session.proc.pid}/children")
    deadline = time.monotonic() + 30
    while not children.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    session.proc.send_signal(signum)
    code, stderr = session.finish()
    assert code == expected, stderr
    assert ("interrupted" in stderr) == (expected == 130), stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_a_first_list_waiting_for_a_server_is_answered_when_the_session_ends(tmp_path: Path, how: str) -> None:
    """tools/list and prompts/list wait up to `list_wait_s` for a server still starting; the session ended under them
    (its input closed, a SIGTERM) and they were answered a bare -32000 Connection closed: now with what is known."""
    session = Session(tmp_path, "--startup-delay", "100")
    session.send(INITIALIZE)
    session.answer(1)
    session.send(
        INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 3, "method": "prompts/list"}
    )
    time.sleep(1.0)  # both are waiting now
    assert session.proc.stdin is not None
    if how == "eof":
        session.proc.stdin.close()
    else:
        session.proc.send_signal(signal.SIGTERM)
    tools, prompts = session.answer(2, timeout=20), session.answer(3, timeout=20)
    assert "result" in tools and "result" in prompts, (tools, prompts)
    assert "breakwater_status" in {tool["name"] for tool in tools["result"]["tools"]}
    if how == "sigterm":
        session.proc.stdin.close()
    code, stderr = session.finish()
    assert code == 0 and "Traceback" not in stderr, stderr
