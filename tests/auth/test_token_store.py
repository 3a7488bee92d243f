"""The token store file: only the user can read it, it survives damage and concurrent writers, and its
tokens are secrets for every redactor of the process."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import anyio
import pytest
from mcp.shared.auth import OAuthToken

from breakwater.auth import ServerTokens, TokenStore
from breakwater.config._redact import Redactor
from breakwater.testing import FakeClock

pytestmark = pytest.mark.anyio


async def test_the_file_is_the_users_alone_and_keeps_the_expiry(tmp_path: Path) -> None:
    directory = tmp_path / "config"
    directory.mkdir(mode=0o755)
    clock = FakeClock()
    tokens = ServerTokens(TokenStore(directory / "oauth-tokens.json"), "https://a.example/mcp", name="a", clock=clock)
    await tokens.set_tokens(OAuthToken(access_token="access-token-one", refresh_token="refresh-token-one", expires_in=600))
    assert stat.S_IMODE((directory / "oauth-tokens.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700  # a looser directory is tightened
    assert tokens.expires_at() == clock.time() + 600


async def test_a_damaged_file_reads_as_signed_out_and_the_next_write_repairs_it(tmp_path: Path) -> None:
    path = tmp_path / "oauth-tokens.json"
    path.write_text("{not json")
    store = TokenStore(path)
    tokens = ServerTokens(store, "https://a.example/mcp")
    assert await tokens.get_tokens() is None
    await tokens.set_tokens(OAuthToken(access_token="access-token-two"))
    assert json.loads(path.read_text())["servers"]["https://a.example/mcp"]["tokens"]["access_token"] == "access-token-two"


async def test_writers_of_different_servers_lose_nothing(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "oauth-tokens.json")
    urls = [f"https://s{i}.example/mcp" for i in range(8)]

    async def write(url: str) -> None:
        await anyio.to_thread.run_sync(
            lambda: store.update(url, lambda rec: {**rec, "tokens": {"access_token": f"token-for-{url}"}})
        )

    async with anyio.create_task_group() as tg:
        for url in urls:
            tg.start_soon(write, url)
    assert sorted(store.records()) == sorted(urls)


async def test_stored_tokens_are_redacted_everywhere_once_read(tmp_path: Path) -> None:
    path = tmp_path / "oauth-tokens.json"
    secret = "zq8-stored-access-token-xk2"
    path.write_text(json.dumps({"servers": {"https://a.example/mcp": {"tokens": {"access_token": secret}}}}))
    TokenStore(path).records()
    assert secret[3:15] not in Redactor([])(f"upstream said: {secret}")
