"""Two entries at the same server URL: a person's sign-in and a machine's client credentials keep apart.

The token store was keyed by URL alone: a client-credentials entry (`bot`) sharing its URL with a
person's entry (`me`) called with the person's tokens, `auth status` showed the person's sign-in on
both, and `auth logout bot` said "no login needed". Against the real OAuth test server
(`oauth_server.py`, which also grants client credentials).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from auth.oauth_server import M2M_ID, M2M_SECRET, admin_stats
from breakwater import Breakwater
from breakwater.auth import TokenStore
from breakwater.auth._login import sign_in
from breakwater.cli import main
from breakwater.config import load_config

pytestmark = pytest.mark.anyio


async def follow(url: str) -> None:
    """The browser: follow the authorization URL to the redirect (the server approves at once)."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=10) as http:
        await http.get(url)


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "mcp.json"
    bot = {"grantType": "client_credentials", "clientId": M2M_ID, "clientSecret": "${BW_TEST_M2M_SECRET}"}
    servers = {
        "me": {"type": "http", "url": url},
        "me-too": {"type": "http", "url": url},
        "bot": {"type": "http", "url": url, "oauth": bot},
    }
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


async def test_a_machine_entry_at_a_persons_url_uses_its_own_credentials(
    oauth_server: str, config_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BW_TEST_M2M_SECRET", M2M_SECRET)
    path = _config(tmp_path, f"{oauth_server}/mcp")
    config = load_config(path)
    await sign_in(config.server("me"), TokenStore(), browser=follow)

    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        await bw.wait_ready(timeout=20)
        answer = await bw.call_tool("bot", "whoami", {})
    assert answer.structured_content == {"result": "signed in"}
    assert admin_stats(oauth_server)["client_credentials"] >= 1  # not the person's tokens

    assert main(["auth", "status", "--json", "--config", str(path)]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["servers"]}
    assert rows["me"]["refreshable"] and rows["me-too"]["refreshable"]  # the same URL and grant: one sign-in
    assert not rows["bot"]["refreshable"]  # a client-credentials token, not the person's refreshable one

    assert main(["auth", "logout", "bot", "--config", str(path)]) == 0
    assert "forgot bot's access token" in capsys.readouterr().err
    assert main(["auth", "status", "--json", "--config", str(path)]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["servers"]}
    assert rows["me"]["signed_in"] and not rows["bot"]["signed_in"]  # the person is still signed in

    assert main(["auth", "logout", "me", "--config", str(path)]) == 0
    assert "signed out of me" in (err := capsys.readouterr().err) and "me-too too" in err
