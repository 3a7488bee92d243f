"""A request whose id a request in flight already uses is refused, not run: over stdio and over HTTP, both modes.

A request id is unique within a session (JSON-RPC, MCP). The SDK's dispatcher ran a second request with an id in
flight beside the first and answered both under the one id: a client resending a `tools/call` under its id (on a
timeout of its own) had a charge made twice. Real `breakwater serve` processes in front of a real testserver whose
mutating tool writes a ledger line per run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from breakwater.testing.server import read_ledger
from helpers import INITIALIZE, INITIALIZED, isolated_env

pytestmark = pytest.mark.anyio

REFUSED = "is already used by a request in flight in this session"


def _config(tmp_path: Path) -> Path:
    ledger = tmp_path / "ledger"
    tools = ["--tool", "charge:mutating,destructive,latency=1.5,progress=0.2", "--tool", "echo:readonly"]
    args = ["-m", "breakwater", "testserver", "--name", "ts", *tools, "--ledger", str(ledger)]
    entry = {"command": sys.executable, "args": args}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"ts": entry}}))
    return config


def _call(request_id: int | str, tool: str = "ts__charge", *, progress: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": {}}
    if progress:  # the tool then reports progress, and a default-mode answer becomes an SSE stream
        params["_meta"] = {"progressToken": f"p{request_id}"}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


class _StdioGateway:
    """`serve --no-share` on pipes, past its handshake and a first call: lines in, every answer kept in `seen`."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(_config(tmp_path))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=isolated_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache")),
        )
        self.seen: list[dict[str, Any]] = []
        self.send(INITIALIZE, INITIALIZED, _call(2, "ts__echo"))
        self.until(lambda: any(m.get("id") == 2 for m in self.seen))

    def send(self, *messages: dict[str, Any]) -> None:
        """Write `messages` in one write, as a client resending a request does."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(_line(m) for m in messages))
        self.proc.stdin.flush()

    def until(self, done: Callable[[], bool]) -> None:
        """Read answers until `done()`."""
        assert self.proc.stdout is not None
        while not done():
            line = self.proc.stdout.readline()
            assert line, self.seen
            self.seen.append(json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def test_over_stdio_an_id_in_flight_is_refused_and_the_tool_runs_once(tmp_path: Path) -> None:
    gateway = _StdioGateway(tmp_path)
    seen, until = gateway.seen, gateway.until
    try:
        # The same request twice in one write (a client resending it), then once more after it was answered.
        gateway.send(_call(7), _call(7))
        until(lambda: sum(m.get("id") == 7 for m in seen) == 2)
        gateway.send(_call(7))
        until(lambda: sum(m.get("id") == 7 for m in seen) == 3)
    finally:
        gateway.close()
    first, second, again = [m for m in seen if m.get("id") == 7]
    assert first["error"]["code"] == -32600 and REFUSED in first["error"]["message"], first  # at once, not run
    assert second["result"]["isError"] is False, second  # the first request, answered once
    assert again["result"]["isError"] is False, again  # an id no longer in flight is free again
    assert len(read_ledger(tmp_path / "ledger")) == 2  # two runs: the refused request never ran


@pytest.mark.parametrize("first", ["plain", "with-progress"])
@pytest.mark.parametrize("mode", ["json-response", "default"])
async def test_over_http_an_id_in_flight_is_refused_and_the_tool_runs_once(tmp_path: Path, mode: str, first: str) -> None:
    """With progress, the first call's answer is an SSE stream (default mode): the refusal must not take its place."""
    flags = ["--json-response"] if mode == "json-response" else []
    async with _http_session(tmp_path, *flags) as (http, url, head):
        answers: dict[str, dict[str, Any]] = {}

        async def post(which: str) -> None:
            call = _call(7, progress=which == "first" and first == "with-progress")
            answers[which] = _answer(await http.post(url, json=call, headers=head))

        async with anyio.create_task_group() as tg:
            tg.start_soon(post, "first")
            await anyio.sleep(0.5)  # the first is running upstream (1.5 s)
            await post("resent")
        again = _answer(await http.post(url, json=_call(7), headers=head))
    assert answers["resent"]["error"]["code"] == -32600 and REFUSED in answers["resent"]["error"]["message"], answers
    assert answers["first"]["result"]["isError"] is False, answers
    assert again["result"]["isError"] is False, again
    assert len(read_ledger(tmp_path / "ledger")) == 2


@asynccontextmanager
async def _http_session(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[httpx2.AsyncClient, str, dict[str, str]]]:
    """`serve --http` (with `flags`), a 2025-11-25 session on it past a first call: the client, the URL, the headers."""
    port_file = tmp_path / "port"
    argv = [sys.executable, "-m", "breakwater", "serve", "--config", str(_config(tmp_path)), "--http", "127.0.0.1:0"]
    argv += ["--port-file", str(port_file), *flags]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=isolated_env(tmp_path))
    try:
        with anyio.fail_after(60):
            while not port_file.exists() or not port_file.read_text():
                assert proc.poll() is None
                await anyio.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}/mcp"
        head = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        async with httpx2.AsyncClient(timeout=30) as http:
            hello = await http.post(url, json=INITIALIZE, headers=head)
            head |= {"mcp-session-id": hello.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
            assert (await http.post(url, json=INITIALIZED, headers=head)).status_code == 202
            with anyio.fail_after(60):  # the upstream connects in the background
                while "result" not in _answer(await http.post(url, json=_call(2, "ts__echo"), headers=head)):
                    await anyio.sleep(0.1)
            yield http, url, head
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer in a POST's response: a JSON body, or the last data line of an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return json.loads(data[-1])  # type: ignore[no-any-return]
    return response.json()  # type: ignore[no-any-return]


def _cancel(request_id: int | str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}


def test_over_stdio_ids_of_different_types_are_different_requests(tmp_path: Path) -> None:
    """`20` and `"20"` are two requests (JSON-RPC): both run; a cancel naming `"21"` leaves the call with id 21 alone."""
    gateway = _StdioGateway(tmp_path)
    seen, until = gateway.seen, gateway.until
    try:
        gateway.send(_call(20), _call("20"), _call(21), _cancel("21"))
        until(lambda: all(any(m.get("id") == i and "result" in m for m in seen) for i in (20, "20", 21)))
    finally:
        gateway.close()
    for request_id in (20, "20", 21):
        answer = next(m for m in seen if m.get("id") == request_id)
        assert answer["result"]["isError"] is False, seen
    assert len(read_ledger(tmp_path / "ledger")) == 3


async def test_over_http_ids_of_different_types_are_different_requests(tmp_path: Path) -> None:
    """`--json-response`: `30` and `"30"` both run; a cancel naming `"31"` leaves 31 alone, one naming 32 cancels 32.

    In the default SSE mode the SDK's transport keys each POST's response stream by `str(id)`, so there `"30"` is
    refused while 30 runs (`_fast_http.refused_duplicate`): accepted, one of the two answers was lost."""
    answers: dict[Any, dict[str, Any]] = {}
    async with _http_session(tmp_path, "--json-response") as (http, url, head):

        async def post(request_id: int | str) -> None:
            answers[request_id] = _answer(await http.post(url, json=_call(request_id), headers=head))

        async with anyio.create_task_group() as tg:
            for request_id in (30, "30", 31, 32):
                tg.start_soon(post, request_id)
            await anyio.sleep(0.5)  # all four are running upstream (1.5 s)
            for cancel in ("31", 32):
                assert (await http.post(url, json=_cancel(cancel), headers=head)).status_code == 202
    for request_id in (30, "30", 31):
        assert answers[request_id]["result"]["isError"] is False, answers
    assert answers[32]["error"]["code"] == -32800, answers  # REQUEST_CANCELLED: the 2025 wire still answers it
