"""The proxy benchmark's HTTP floor row (`bench/peers/http_relay.py`) is a faithful relay: a real HTTP session passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from breakwater.testing.server import launch_command

RELAY = Path(__file__).resolve().parents[2] / "bench" / "peers" / "http_relay.py"

pytestmark = pytest.mark.anyio


async def test_a_real_http_session_passes_through(tmp_path: Path) -> None:
    """The SDK HTTP client's handshake, a list and concurrent calls reach the test server; each call gets its own answer."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, str(RELAY), str(port_file), "--", *launch_command("--tool", "echo")])
    try:
        with anyio.fail_after(60):
            while not (port_file.exists() and port_file.read_text()):
                assert proc.poll() is None, "the relay exited before it listened"
                await anyio.sleep(0.05)
            answers: dict[int, object] = {}
            async with Client(streamable_http_client(f"http://127.0.0.1:{port_file.read_text()}/mcp"), mode="legacy") as client:
                names = [tool.name for tool in (await client.list_tools()).tools]

                async def call(i: int) -> None:
                    answer = await client.call_tool("echo", {"text": f"hello {i}"})
                    assert not answer.is_error
                    answers[i] = answer.structured_content

                async with anyio.create_task_group() as tg:
                    for i in range(10):
                        tg.start_soon(call, i)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "echo" in names
    assert {i: a["arguments"] for i, a in answers.items() if isinstance(a, dict)} == {
        i: {"text": f"hello {i}"} for i in range(10)
    }


def test_without_an_upstream_command_it_says_how_to_run_it() -> None:
    done = subprocess.run([sys.executable, str(RELAY)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "usage: http_relay.py PORT_FILE -- <upstream command...>" in done.stderr
