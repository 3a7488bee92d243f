"""SIGTERM drains `breakwater serve --http`: a real gateway process, a real slow upstream, seen from raw HTTP and the SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from breakwater.testing.server import read_ledger, read_state, serve_http
from helpers import called_once_up, code_of, eventually, isolated_env, lingering_server, share_dir

pytestmark = pytest.mark.anyio

BREAKWATER = [sys.executable, "-m", "breakwater"]
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
DRAIN_S = 1.5


def modern_call(tool: str, arguments: dict[str, Any], request_id: int = 1) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of a 2026-07-28 tools/call (no session: any replica may serve it)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": tool}
    params = {"name": tool, "arguments": arguments, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return headers, body


async def start_gateway(tmp_path: Path, upstream_url: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    config = tmp_path / "breakwater.toml"
    config.write_text(f'[servers.shop]\nurl = "{upstream_url}"\n')
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--config", str(config), "--http", "127.0.0.1:0", "--port-file", str(port_file)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    with anyio.fail_after(60):
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None
            await anyio.sleep(0.05)
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


# "At once" is the process's own: a fork server's launcher passes the signal on a moment later, and a request sent in
# that moment was answered as before the signal (1 CI run, `/readyz` 200).
@pytest.mark.plain_gateway
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
async def test_sigterm_lets_calls_in_flight_finish_refuses_new_ones_and_cuts_what_outlives_the_window(
    tmp_path: Path, signum: str
) -> None:
    """The issue's drain: /readyz 503 at once, new requests 503, a short call finishes (kept alive by
    SSE comments), a call longer than the window is cancelled upstream and answered OUTCOME_UNKNOWN with
    the operation id the ledger recorded, and the process exits 0 soon after the window (130 after Ctrl-C,
    which stopped at once, and a call in flight got a stream that ended with no answer)."""
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    flags = ("--tool", "order:latency=30,mutating", "--tool", "quick:latency=1,readonly")
    env = dict(
        os.environ,
        BREAKWATER_DRAIN_S=str(DRAIN_S),
        BREAKWATER_SSE_KEEPALIVE_S="0.2",
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )
    async with serve_http(*flags, "--ledger", str(ledger), "--state-file", str(state)) as upstream:
        proc, base = await start_gateway(tmp_path, upstream.url, env)
        try:
            async with Client(f"{base}/mcp", mode="legacy") as legacy, httpx2.AsyncClient(timeout=30) as http:
                while "shop__order" not in {t.name for t in (await legacy.list_tools()).tools}:
                    await anyio.sleep(0.1)
                assert (await http.get(f"{base}/readyz")).status_code == 200
                answers: dict[str, Any] = {}

                async def order() -> None:
                    answers["order"] = await legacy.call_tool("shop__order", {"item": "ship"})

                async def quick() -> None:
                    headers, body = modern_call("shop__quick", {})
                    async with http.stream("POST", f"{base}/mcp", headers=headers, json=body) as response:
                        answers["quick_status"] = response.status_code
                        answers["quick"] = [line async for line in response.aiter_lines()]

                async with anyio.create_task_group() as tg:
                    tg.start_soon(order)
                    tg.start_soon(quick)
                    await eventually(lambda: state.exists() and sum(read_state(state)["in_flight"].values()) == 2, 20)
                    sent_at = time.monotonic()
                    proc.send_signal(getattr(signal, signum))
                    ready = await http.get(f"{base}/readyz")
                    assert ready.status_code == 503 and ready.json()["draining"] is True
                    headers, body = modern_call("shop__quick", {}, request_id=7)
                    refused = await http.post(f"{base}/mcp", headers=headers, json=body)
                    assert refused.status_code == 503 and refused.headers["connection"] == "close"
                    assert refused.json()["id"] == 7
                # The short call ran to its end through the drain, with keep-alive comments while it was silent.
                assert answers["quick_status"] == 200
                assert sum(line.startswith(":") for line in answers["quick"]) >= 2
                data = [json.loads(line[5:]) for line in answers["quick"] if line.startswith("data:") and line[5:].strip()]
                assert data[-1]["result"]["structuredContent"]["ok"] is True
                # The long one was cut at the end of the window, upstream too, and says what it may have done.
                cut = answers["order"]
                assert time.monotonic() - sent_at < DRAIN_S + 3
                assert code_of(cut) == "OUTCOME_UNKNOWN"
                envelope = cut.structured_content or {}
                assert envelope["reason"] == "gateway_drain" and envelope["sent"] is True
                assert [r["operation_id"] for r in read_ledger(ledger)] == [envelope["operation_id"]]
                await eventually(lambda: read_state(state)["cancelled"]["order"] == 1, 10)
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
            elapsed = time.monotonic() - sent_at
            assert code == (130 if signum == "SIGINT" else 0)
            # The window, plus a second of shutdown (and slack for a loaded CI machine).
            assert elapsed < DRAIN_S + 1 + 1.5, elapsed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize(
    ("how", "shared"),
    [("stdin closed", False), ("SIGTERM", False), ("stdin closed", True), ("SIGTERM", True)],
    ids=["stdin closed", "SIGTERM", "stdin closed, shared", "SIGTERM, shared"],
)
async def test_stdio_serve_lets_calls_finish_when_its_client_goes_away_then_cuts_the_rest(
    tmp_path: Path, how: str, shared: bool
) -> None:
    """Stdio ends like HTTP: when the client closes stdin (or on SIGTERM) a call shorter than the window finishes
    and is answered, a longer one is cancelled upstream and answered OUTCOME_UNKNOWN, and `serve` exits 0 within
    the window plus a second. Through the shared gateway (the default) both were answered a bare -32000
    "Connection closed" the moment stdin closed or `serve` got the signal."""
    with share_dir("bw-dr-") as share:
        await _client_goes_away(tmp_path, how, share if shared else None)


async def _client_goes_away(tmp_path: Path, how: str, share: Path | None) -> None:
    state = tmp_path / "state"
    flags = ("--tool", "order:latency=30,mutating", "--tool", "quick:latency=1,readonly", "--state-file", str(state))
    env = dict(
        os.environ,
        BREAKWATER_DRAIN_S=str(DRAIN_S),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_JOURNAL="off",
    )
    if share is not None:
        env.update(BREAKWATER_SHARE="on", BREAKWATER_SHARE_DIR=str(share), BREAKWATER_SHARE_IDLE_S="1")
    async with serve_http(*flags) as upstream:
        config = tmp_path / "breakwater.toml"
        config.write_text(f'[servers.shop]\nurl = "{upstream.url}"\n')
        mode = [] if share is not None else ["--no-share"]
        proc = subprocess.Popen(
            [*BREAKWATER, "serve", *mode, "--config", str(config)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        try:

            def send(message: dict[str, Any]) -> None:
                stdin.write(json.dumps(message).encode() + b"\n")
                stdin.flush()

            params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
            send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
            assert json.loads(await anyio.to_thread.run_sync(stdout.readline))["id"] == 1
            send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            for request_id, tool in ((3, "shop__order"), (4, "shop__quick")):
                send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
            await eventually(lambda: state.exists() and sum(read_state(state)["in_flight"].values()) == 2, 30)
            gone_at = time.monotonic()
            if how == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
            else:
                stdin.close()
            out = await anyio.to_thread.run_sync(stdout.read)
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
            elapsed = time.monotonic() - gone_at
            answers = {m["id"]: m for m in map(json.loads, out.decode().splitlines()) if "id" in m}
            assert answers[4]["result"]["structuredContent"]["ok"] is True
            cut = answers[3]["result"]["structuredContent"]
            assert (cut["code"], cut["reason"], cut["sent"]) == ("OUTCOME_UNKNOWN", "gateway_drain", True)
            assert cut["operation_id"]
            assert code == 0
            # The window, plus a second of shutdown (and slack for a loaded CI machine).
            assert elapsed < DRAIN_S + 1 + 1.5, elapsed
            await eventually(lambda: read_state(state)["cancelled"]["order"] == 1, 10)
            assert read_state(state)["completed"]["quick"] == 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_a_session_whose_upstream_ignores_the_end_of_input_ends_before_its_client_signals(tmp_path: Path) -> None:
    """The client closes stdin, and both SDKs' clients signal the server they launched 2 s later. An upstream
    that ignores the end of its input (a TypeScript server with a task's timer pending, here a wrapper that
    sleeps on) is stopped within `PROMPT_STOP_S`, so `serve` exits on its own with 0 before that, and leaves
    no process behind. With the SDK's 2 s + 2 s it took 3.5 s, and its client stopped it mid-shutdown."""
    from breakwater.connect._stdio import PROMPT_STOP_S

    lingering = tmp_path / "lingering.pid"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"slow": lingering_server(lingering)}}))
    env = isolated_env(tmp_path, BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"))
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--no-share", "--config", str(config)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None
    try:
        answer = await anyio.to_thread.run_sync(called_once_up, proc, "slow__ping")
        assert answer["result"]["isError"] is False, answer  # the upstream is up and answering
        gone_at = time.monotonic()
        proc.stdin.close()
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
        elapsed = time.monotonic() - gone_at
        assert code == 0
        assert elapsed < 2.0, elapsed  # the clients' patience; stopping takes PROMPT_STOP_S and a moment
        assert elapsed > PROMPT_STOP_S[0], elapsed  # the upstream did get its grace
        pid = int(lingering.read_text())
        await eventually(lambda: not os.path.exists(f"/proc/{pid}"), 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_call_answered_as_the_drain_ends_keeps_its_result_through_the_clients_follow_up_list(
    tmp_path: Path, mode: str
) -> None:
    """The SDK's client lists the tools after a successful call to a tool it has not listed (to check the result
    against the tool's output schema). When that call was the last one a draining gateway waited for, the list came
    a moment after the answer, the gateway had stopped, and `call_tool` raised: a call that ran, and the caller told
    it failed. The gateway now serves a little longer after its last POST; the call returns its result, the gateway
    still exits 0 soon after."""
    state = tmp_path / "state"
    env = dict(
        os.environ,
        BREAKWATER_DRAIN_S="20",
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_JOURNAL="off",
    )
    async with serve_http("--tool", "quick:latency=1,readonly", "--state-file", str(state)) as upstream:
        proc, base = await start_gateway(tmp_path, upstream.url, env)
        try:
            async with Client(f"{base}/mcp", mode="legacy") as probe:  # another client: the one below never lists
                while "shop__quick" not in {t.name for t in (await probe.list_tools()).tools}:
                    await anyio.sleep(0.1)
            async with Client(f"{base}/mcp", mode=mode) as client:
                answers: dict[str, Any] = {}

                async def quick() -> None:
                    answers["quick"] = await client.call_tool("shop__quick", {})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(quick)
                    await eventually(lambda: state.exists() and sum(read_state(state)["in_flight"].values()) == 1, 20)
                    sent_at = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                result = answers["quick"]
                assert not result.is_error and (result.structured_content or {})["ok"] is True
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
            assert code == 0
            # The call's second, and the short linger after it (and slack for a loaded CI machine).
            assert time.monotonic() - sent_at < 1 + 1 + 2.5
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
