"""The OAuth test server (`oauth_server.py`) in a subprocess, and a config directory of the test's own."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from auth.oauth_server import SHORT_LIFETIME_S

SERVER = Path(__file__).with_name("oauth_server.py")


@pytest.fixture
def oauth_server(tmp_path: Path) -> Iterator[str]:
    """The server's base URL; its MCP endpoint is `/mcp` (streamable HTTP)."""
    yield from _serve(tmp_path)


@pytest.fixture
def oauth_server_short_lived(tmp_path: Path) -> Iterator[str]:
    """The server, its access tokens living `SHORT_LIFETIME_S` (the client refreshes them before it sends)."""
    yield from _serve(tmp_path, "--lifetime", str(SHORT_LIFETIME_S))


@pytest.fixture
def oauth_sse_server(tmp_path: Path) -> Iterator[str]:
    """The same server over the legacy HTTP+SSE transport: its MCP endpoint is `/sse`."""
    yield from _serve(tmp_path, "--sse")


def _serve(tmp_path: Path, *flags: str) -> Iterator[str]:
    port_file = tmp_path / "oauth.port"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port-file", str(port_file), *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
            assert time.monotonic() < deadline, "the OAuth test server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's config directory (where the token store lives), here."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "breakwater"
