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
    # Opened up by hand (or copied from a backup): read, it is the user's alone again, not only at the next sign-in.
    (directory / "oauth-tokens.json").chmod(0o644)
    assert await tokens.get_tokens() is not None
    assert stat.S_IMODE((directory / "oauth-tokens.json").stat().st_mode) == 0o600


async def test_a_damaged_file_reads_as_signed_out_says_why_and_is_kept_aside_by_the_next_write(tmp_path: Path) -> None:
    """A damaged file read as "nobody signed in" without a word, and the next sign-in wrote over it: every other
    server's tokens were gone, with nothing left to recover them from."""
    path = tmp_path / "oauth-tokens.json"
    damaged = '{"version": 1, "servers": {"https://b.example/mcp": {"tokens": {"access_token": "access-token-b"}}}'
    path.write_text(damaged)  # the last brace lost
    store = TokenStore(path)
    tokens = ServerTokens(store, "https://a.example/mcp")
    assert await tokens.get_tokens() is None
    assert store.problem == f"{path} is damaged (invalid JSON at line 1, column {len(damaged) + 1})"
    await tokens.set_tokens(OAuthToken(access_token="access-token-two"))
    assert json.loads(path.read_text())["servers"]["https://a.example/mcp"]["tokens"]["access_token"] == "access-token-two"
    assert (tmp_path / "oauth-tokens.json.damaged").read_text() == damaged  # kept, for the other servers' sign-ins
    store.records()
    assert store.problem is None


async def test_auth_status_names_a_damaged_token_file_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from breakwater.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "mcp.json").write_text('{"mcpServers": {"o": {"type": "http", "url": "https://o.example/mcp"}}}')
    store = TokenStore()
    store.path.parent.mkdir(parents=True)
    store.path.write_text('{"version": 1, "servers": ')
    assert main(["auth", "status", "--config", str(tmp_path / "mcp.json")]) == 1
    err = capsys.readouterr().err
    assert f"the token file is damaged (invalid JSON at line 1, column 27): {store.path}" in err, err
    assert main(["auth", "status", "--json", "--config", str(tmp_path / "mcp.json")]) == 1
    assert "is damaged" in json.loads(capsys.readouterr().out)["token_file_problem"]


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
