"""A client's answer that holds NaN or Infinity (JSON has neither) still reaches the server that waits for it.

A request holding one is refused with the parse error (tests/config/test_bad_input.py); an answer to
a server's request (here an elicitation) is passed on with null in their place, as an upstream's
answer is, so the call that waits for it goes on instead of hanging until its timeout. Real parts:
`python -m breakwater serve` over stdio, written to raw (the SDK's client cannot write NaN), in
front of the conformance server (`tests/conformance/server.py`) on 2025-11-25, which asks with a
server-to-client request; and `serve --http` answering a posted response.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

UPSTREAM = Path(__file__).resolve().parents[1] / "conformance" / "server.py"
BREAKWATER = [sys.executable, "-m", "breakwater"]
DEADLINE_S = 60.0


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_TOOL_NAME_TEMPLATE="{tool}",
        BREAKWATER_PROTOCOL="2025-11-25",  # the upstream asks with a server-to-client request
        BREAKWATER_CALL_TIMEOUT_S="30",
    )


def _config(tmp_path: Path, servers: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def _hello(capabilities: dict[str, Any]) -> dict[str, Any]:
    return {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "t", "version": "1"}}


def _read(proc: subprocess.Popen[bytes], until: float) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, until - time.monotonic()))
    assert ready, "no message from the gateway"
    line = proc.stdout.readline()
    assert line, "the session ended"
    message: dict[str, Any] = json.loads(line)
    return message


def test_an_elicitation_answer_holding_nan_reaches_the_server_as_null(tmp_path: Path) -> None:
    config = _config(tmp_path, {"conf": {"command": sys.executable, "args": [str(UPSTREAM)]}})
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
        # Unbuffered: `_read` waits on the pipe with select, and a buffered readline could take the lines
        # after the one it returns (list_changed, then the elicitation) into a buffer select never sees.
        bufsize=0,
    )
    assert proc.stdin is not None and proc.stderr is not None
    until = time.monotonic() + DEADLINE_S

    def send(data: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(data + b"\n")
        proc.stdin.flush()

    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _hello({"elicitation": {}})}).encode())
        assert "result" in _read(proc, until)
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        call = {"name": "test_elicitation_sep1034_defaults", "arguments": {}}
        while True:  # until the upstream is ready behind the gateway and the call reaches it
            send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}).encode())
            message = _read(proc, until)
            while str(message.get("method")).endswith("/list_changed"):  # tools, prompts, resources: ready servers came
                message = _read(proc, until)
            if message.get("method") == "elicitation/create":
                break
            not_yet = ("SERVER_CONNECTING", "UNKNOWN_TOOL")  # the gateway has not listed the upstream's tools yet
            assert message.get("id") == 2 and message["result"]["structuredContent"]["code"] in not_yet, message
            time.sleep(0.2)
        answer = b'{"jsonrpc":"2.0","id":%s,"result":{"action":"accept","content":{"name":"ada","score":NaN,"age":1e999}}}'
        send(answer % json.dumps(message["id"]).encode())
        result = _read(proc, until)
        while "method" in result:
            result = _read(proc, until)
        assert result["id"] == 2 and not result["result"].get("isError"), result
        text = result["result"]["content"][0]["text"]
        assert '"name": "ada"' in text and '"score": null' in text and '"age": null' in text, text
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert b"holds NaN, which is not JSON; passed on with null" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.anyio
async def test_a_posted_answer_holding_nan_is_taken_a_posted_request_is_refused(tmp_path: Path) -> None:
    """Over HTTP the same rule: a response body holding NaN is accepted (202) with null in its place; a request
    body holding NaN gets the parse error with its id (400)."""
    import anyio

    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--config", str(_config(tmp_path, {})), "--http", "127.0.0.1:0", "--port-file", str(port_file)],
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text():
                await anyio.sleep(0.1)
        url = f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
        async with httpx2.AsyncClient() as http:
            initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _hello({})}
            init = await http.post(url, json=initialize, headers=headers)
            session = {**headers, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
            await http.post(url, content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}', headers=session)
            answer = b'{"jsonrpc":"2.0","id":"s-1","result":{"action":"accept","content":{"score":NaN}}}'
            taken = await http.post(url, content=answer, headers=session)
            assert taken.status_code == 202, taken.text
            ping = b'{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":NaN}}'
            refused = await http.post(url, content=ping, headers=session)
            assert refused.status_code == 400 and refused.json()["id"] == 5 and refused.json()["error"]["code"] == -32700
    finally:
        proc.terminate()
        proc.wait(timeout=30)
