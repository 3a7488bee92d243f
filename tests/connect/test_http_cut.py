"""One cut HTTP request fails one call, not every call on the upstream connection.

Real parts: a testserver on a real HTTP port, reached through a TCP proxy in this test that resets
the connection carrying one chosen tool's request once the request has gone through. Wall clock, with
generous bounds: the cut must be seen on a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater.config import CallPolicy
from breakwater.errors import ErrorCode
from breakwater.testing.server import serve_http

pytestmark = pytest.mark.anyio

FAST = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.2, backoff_cap_s=1, budget_s=30, attempt_timeout_s=10)


class CuttingProxy:
    """Forwards TCP to the server; a connection whose request names `victim` is reset after forwarding it."""

    def __init__(self, target_port: int, victim: bytes) -> None:
        self.target_port = target_port
        self.victim = victim
        self.cuts = 0
        self.port = 0

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        done = asyncio.Event()

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while not done.is_set():
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    writer.write(chunk)
                    await writer.drain()
                    if upstream and self.victim in chunk:
                        # The request reached the server: the cut comes while its answer is awaited.
                        self.cuts += 1
                        await asyncio.sleep(0.2)
                        break
            except OSError:
                pass
            finally:
                done.set()
                for w in (client_w, server_w):
                    with contextlib.suppress(Exception):
                        w.transport.abort()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pump(client_r, server_w, True), pump(server_r, client_w, False))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CuttingProxy]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()


@pytest.mark.parametrize("protocol", ["2025-11-25", "2026-07-28"])
async def test_a_cut_request_fails_only_its_own_call(tmp_path: Path, protocol: str) -> None:
    async with (
        serve_http("--tool", "slow:latency=1.5,readonly", "--tool", "victim:latency=0.5,destructive") as srv,
        CuttingProxy(srv.port, b'"victim"').running() as proxy,
    ):
        spec = ServerSpec(
            name="up",
            transport="http",
            url=f"http://127.0.0.1:{proxy.port}/mcp",
            connect=replace(FAST, protocol=protocol),
            call=CallPolicy(timeout_s=10),
        )
        async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "adm", journal=None) as bw:
            await bw.wait_ready(timeout=30)
            attempts_before = bw.upstream("up").snapshot().attempts
            slow_result = {}

            async def slow() -> None:
                slow_result["r"] = await bw.call_tool("up", "slow", {}, raise_on_error=False)

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(slow)
                    await anyio.sleep(0.3)  # the slow call is in flight on its own connection
                    victim = await bw.call_tool("up", "victim", {}, raise_on_error=False)

            assert proxy.cuts == 1
            # The destructive call may have run: it is reported, never repeated.
            assert victim.is_error
            assert victim.structured_content is not None
            assert victim.structured_content["code"] == ErrorCode.OUTCOME_UNKNOWN.value
            # The call beside it finished normally, and the connection was never torn down.
            assert not slow_result["r"].is_error, slow_result["r"]
            snap = bw.upstream("up").snapshot()
            assert snap.state is ServerState.READY
            assert snap.attempts == attempts_before
            again = await bw.call_tool("up", "slow", {}, raise_on_error=False)
            assert not again.is_error
