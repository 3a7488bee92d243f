"""The testserver, exercised as real processes through the SDK client (stdio and HTTP) and raw sockets."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.types import RequestParamsMeta

from breakwater.testing.server import (
    Latency,
    count_ledger,
    launch_command,
    parse_tool_spec,
    read_ledger,
    read_state,
    serve_http,
    stdio_params,
)

pytestmark = pytest.mark.anyio

OP_KEY = "io.breakwater/operationId"


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


def op_meta(operation_id: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {OP_KEY: operation_id})


def state_settled(path: Path, tool: str, cancelled: int = 1) -> Callable[[], bool]:
    """True once `tool` has nothing in flight and at least `cancelled` cancelled calls."""

    def check() -> bool:
        s = read_state(path)
        return bool(s["in_flight"][tool] == 0 and s["cancelled"][tool] >= cancelled)

    return check


# ---------------------------------------------------------------------------- pure


def test_tool_spec_language() -> None:
    spec = parse_tool_spec("search:latency=lognormal(0.2,0.5),retryable_error=0.1,progress=0.25,readonly,mutating")
    assert spec.name == "search"
    assert spec.latency == Latency("lognormal", 0.2, 0.5)
    assert spec.retryable_error == 0.1
    assert spec.progress == 0.25
    assert spec.mutating and spec.commit == "start"
    ann = spec.annotations()
    assert ann is not None and ann.read_only_hint is True and ann.destructive_hint is None
    assert parse_tool_spec("plain").annotations() is None
    assert parse_tool_spec("u:latency=uniform(1,2),destructive=false").latency == Latency("uniform", 1, 2)
    for bad in ("x:speed=3", "x:fail=0.7,error=0.5", "bad name", "x:fail=2", "x:latency=lognormal(0,1)", "x:commit=late"):
        with pytest.raises(ValueError):
            parse_tool_spec(bad)
    draws = [Latency.parse("uniform(0,1)").draw(random.Random(3)) for _ in range(2)]
    assert draws[0] == draws[1]


def test_exit_at_start() -> None:
    proc = subprocess.run(
        launch_command("--exit-at-start", "7", "--exit-message", "config is broken"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 7
    assert "config is broken" in proc.stderr
    assert proc.stdout == ""


# ---------------------------------------------------------------------------- stdio


async def test_stdio_tool_behaviours(tmp_path: Path) -> None:
    state, control = tmp_path / "state.json", tmp_path / "control.json"
    params = stdio_params(
        "--seed",
        "7",
        "--default-tools",
        "--tool",
        "quick_slow:latency=0.6,progress=0.15",
        "--tool",
        "biz:business=1",
        "--tool",
        "retry:retryable_error=1",
        "--tool",
        "err:error=1",
        "--tool",
        "knob:readonly",
        "--state-file",
        str(state),
        "--control-file",
        str(control),
    )
    async with Client(params, mode="legacy", read_timeout_seconds=10) as client:
        assert client.protocol_version == "2025-11-25"
        # With fixed latencies each call consumes exactly one draw, so the seed fixes the outcomes.
        rng = random.Random(7)
        expected = [rng.random() < 0.5 for _ in range(6)]
        got = [(await client.call_tool("flaky", {})).is_error for _ in range(6)]
        assert got == expected

        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"echo", "add", "slow", "hang", "flaky", "create_order", "testserver_state", "knob"} <= set(tools)
        assert tools["echo"].annotations is not None and tools["echo"].annotations.read_only_hint is True
        assert tools["create_order"].annotations is not None
        assert tools["create_order"].annotations.destructive_hint is True

        echoed = await client.call_tool("echo", {"payload": "hi", "extra": [1, 2]}, meta=op_meta("op-9"))
        assert not echoed.is_error
        assert echoed.structured_content is not None
        assert echoed.structured_content["arguments"] == {"payload": "hi", "extra": [1, 2]}
        assert echoed.structured_content["operation_id"] == "op-9"
        added = await client.call_tool("add", {"a": 2, "b": 3.5})
        assert added.structured_content is not None and added.structured_content["sum"] == 5.5

        ticks: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            ticks.append(progress)

        started = time.monotonic()
        slow = await client.call_tool("quick_slow", {}, progress_callback=on_progress)
        assert time.monotonic() - started >= 0.55
        assert not slow.is_error
        assert len(ticks) >= 2 and ticks == sorted(ticks)

        biz = await client.call_tool("biz", {})
        assert biz.is_error and biz.structured_content is not None
        assert biz.structured_content["retryable"] is False and biz.structured_content["code"] == "NOT_FOUND"
        retry = await client.call_tool("retry", {})
        assert retry.is_error and retry.structured_content is not None
        assert retry.structured_content["retryable"] is True
        err = await client.call_tool("err", {})
        assert err.is_error and err.structured_content is None

        # The control file changes a tool's behaviour without a restart.
        assert not (await client.call_tool("knob", {})).is_error
        control.write_text(json.dumps({"tools": {"knob": {"latency": 0.4, "error": 1}}}))
        started = time.monotonic()
        assert (await client.call_tool("knob", {})).is_error
        assert time.monotonic() - started >= 0.35

        served = await client.call_tool("testserver_state", {})
        assert served.structured_content is not None
        assert served.structured_content["completed"]["flaky"] == 6
        assert served.structured_content["errors"]["biz"] == 1
        assert served.structured_content["pid"] == read_state(state)["pid"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_stdio_timeout_cancels_server_work(tmp_path: Path, mode: Any) -> None:
    state = tmp_path / "state.json"
    async with Client(stdio_params("--state-file", str(state)), mode=mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        with pytest.raises(MCPError):
            await client.call_tool("hang", {}, read_timeout_seconds=0.3)
        await wait_for(state_settled(state, "hang"))
        s = read_state(state)
        assert s["started"]["hang"] == 1 and s["completed"]["hang"] == 0
        # The connection survives the cancel.
        assert not (await client.call_tool("echo", {})).is_error


async def test_ledger_shared_by_two_processes(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    flags = ("--tool", "create_order:mutating", "--tool", "late:mutating,commit=end", "--ledger", str(ledger))
    async with (
        Client(stdio_params(*flags, "--name", "a"), mode="legacy") as a,
        Client(stdio_params(*flags, "--name", "b"), mode="legacy") as b,
    ):

        async def order(client: Client, i: int) -> None:
            assert not (await client.call_tool("create_order", {"n": i}, meta=op_meta(f"op-{i % 3}"))).is_error

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(order, a, i)
                tg.start_soon(order, b, i)
        await a.call_tool("late", {"operationId": "from-args"})

    records = read_ledger(ledger)
    assert len(records) == 21
    assert {r["server"] for r in records} == {"a", "b"}
    assert len({r["pid"] for r in records}) == 2
    assert count_ledger(ledger, tool="create_order") == 20
    assert count_ledger(ledger, operation_id="op-0") == 8  # i in {0, 3, 6, 9} on both servers
    assert count_ledger(ledger, tool="late", operation_id="from-args") == 1
    same_args = [r["args_sha256"] for r in records if r["tool"] == "create_order"]
    assert len(set(same_args)) == 10


# ---------------------------------------------------------------------------- HTTP


async def test_http_both_eras_and_cancel(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    async with serve_http("--state-file", str(state)) as srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}/mcp"
        for mode, version, cancelled in (("legacy", "2025-11-25", 1), ("auto", "2026-07-28", 2)):
            async with Client(srv.url, mode=mode) as client:
                assert client.protocol_version == version
                result = await client.call_tool("add", {"a": 1, "b": 2})
                assert result.structured_content is not None and result.structured_content["sum"] == 3
                with pytest.raises(MCPError):
                    await client.call_tool("hang", {}, read_timeout_seconds=0.3)
                await wait_for(state_settled(state, "hang", cancelled))

    async with serve_http("--json-response", "--stateless") as srv, Client(srv.url, mode="legacy") as client:
        assert not (await client.call_tool("echo", {"payload": "x"})).is_error


async def test_http_startup_delay(tmp_path: Path) -> None:
    async with serve_http("--startup-delay", "2.5") as srv:
        # Listening (TCP accepts) but the handshake is held.
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        headers = {"accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=0.4) as http:
            with pytest.raises(httpx2.ReadTimeout):
                await http.post(srv.url, json=init, headers=headers)
        started = time.monotonic()
        async with Client(srv.url, mode="legacy") as client:
            waited = time.monotonic() - started
            assert not (await client.call_tool("echo", {})).is_error
        assert waited < 3.0


def _raw_exchange(port: int, request: bytes | None) -> tuple[bytes, OSError | None]:
    """Send `request` (or nothing) on a fresh connection; return what came back and how it ended."""
    data = b""
    try:
        # Python's connect with a timeout polls for completion, so an RST sent right at accept
        # can surface from connect() itself: that is still "reset before any byte".
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            if request is not None:
                s.sendall(request)
            while chunk := s.recv(65536):
                data += chunk
    except OSError as exc:
        return data, exc
    return data, None


async def test_http_refuse_reset_status(tmp_path: Path) -> None:
    flags = ("--refuse-first", "1", "--reset-first", "1", "--status-first", "2", "--status", "503")
    async with serve_http(*flags, "--retry-after", "3") as srv:
        # Refused: reset at accept without us sending a byte.
        data, exc = await anyio.to_thread.run_sync(_raw_exchange, srv.port, None)
        assert data == b"" and isinstance(exc, ConnectionResetError)
        # Reset: the whole request is read, then the connection is reset with no response.
        body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        request = (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        data, exc = await anyio.to_thread.run_sync(_raw_exchange, srv.port, request)
        assert data == b"" and isinstance(exc, ConnectionResetError)
        async with httpx2.AsyncClient() as http:
            for _ in range(2):
                r = await http.post(srv.url, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 503 and r.headers["retry-after"] == "3"
        # The faults are used up: a real client now connects.
        async with Client(srv.url, mode="auto") as client:
            assert not (await client.call_tool("echo", {})).is_error

    async with serve_http("--status-first", "1", "--status", "401") as srv, httpx2.AsyncClient() as http:
        assert (await http.post(srv.url, content=b"{}")).status_code == 401
        assert (await http.post(srv.url, content=b"{}")).status_code != 401


async def test_http_crash_exits_3() -> None:
    async with serve_http("--tool", "boom:crash=1,latency=0.2") as srv:
        with pytest.raises((MCPError, ExceptionGroup)):
            async with Client(srv.url, mode="legacy") as client:
                await client.call_tool("boom", {}, read_timeout_seconds=5)
        assert await anyio.to_thread.run_sync(srv.process.wait) == 3


async def test_congestion_shared_across_processes(tmp_path: Path) -> None:
    congestion = tmp_path / "congestion"
    congestion.mkdir()
    # A marker left by a process that no longer exists must not slow anyone down.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (congestion / f"{dead.pid}-0.handshake").touch()
    flags = ("--congestion-dir", str(congestion), "--congestion-work", "0.5", "--congestion-cores", "1")

    async def handshake(url: str) -> float:
        started = time.monotonic()
        async with Client(url, mode="legacy"):
            return time.monotonic() - started

    async with serve_http(*flags) as a, serve_http(*flags) as b:
        alone = await handshake(a.url)
        # Lower bounds are the model; upper bounds only catch gross errors (CI machines are noisy).
        assert 0.45 < alone < 1.3
        times: list[float] = []

        async def run(url: str) -> None:
            times.append(await handshake(url))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, a.url)
            tg.start_soon(run, b.url)
        # One core shared: the pair needs 1.0 s of service in all, so if the second handshake starts
        # d seconds after the first, both take about 1.0 - d. Alone each would take 0.5 s.
        assert len(times) == 2 and sum(times) > 1.6 and all(0.5 < t < 2.0 for t in times), times
    assert not any(p.name.startswith(f"{os.getpid()}-") for p in congestion.iterdir())
    assert not (congestion / f"{dead.pid}-0.handshake").exists()
