"""The proxy benchmark's floor row (`bench/peers/byte_relay.py`) is a faithful relay: a real session passes through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from breakwater.testing.server import launch_command

RELAY = Path(__file__).resolve().parents[2] / "bench" / "peers" / "byte_relay.py"

pytestmark = pytest.mark.anyio


async def test_a_real_session_passes_through() -> None:
    """The SDK client's handshake, a list and three calls reach the test server and its answers come back unchanged."""
    upstream = launch_command("--tool", "echo")
    params = StdioServerParameters(command=sys.executable, args=[str(RELAY), "--", *upstream])
    with anyio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            answers = [await client.call_tool("echo", {"text": f"hello {i}"}) for i in range(3)]
    assert "echo" in names
    for i, answer in enumerate(answers):
        assert not answer.is_error
        assert isinstance(answer.structured_content, dict) and answer.structured_content["arguments"] == {"text": f"hello {i}"}


def test_without_an_upstream_command_it_says_how_to_run_it() -> None:
    done = subprocess.run([sys.executable, str(RELAY)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "usage: byte_relay.py -- <upstream command...>" in done.stderr
