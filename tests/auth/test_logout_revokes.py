"""`breakwater auth logout NAME` revokes the sign-in at the authorization server (RFC 7009) before forgetting it, against
the real OAuth test server (`oauth_server.py`, the SDK's `/revoke`): the tokens it forgot here stayed valid there.

A revocation endpoint that fails is a warning naming it and why; the local tokens go all the same; no token is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import pytest

from auth.oauth_server import follow
from breakwater.auth import TokenStore
from breakwater.auth._login import sign_in
from breakwater.cli import main
from breakwater.config import ServerSpec


def _signed_in(base: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A config naming the server `remote`, signed in; and the tokens the sign-in stored."""
    spec = ServerSpec(name="remote", transport="http", url=f"{base}/mcp")
    store = TokenStore()
    anyio.run(lambda: sign_in(spec, store, browser=follow))
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"remote": {"type": "http", "url": spec.url}}}))
    return config, {k: v for k, v in store.records()[spec.url or ""]["tokens"].items() if isinstance(v, str)}


def _accepted(base: str, access_token: str) -> bool:
    """Whether the MCP endpoint takes the access token (a 401 says it does not)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Authorization": f"Bearer {access_token}", "Accept": "application/json, text/event-stream"}
    return httpx2.post(f"{base}/mcp", json=body, headers=headers, timeout=10).status_code != 401


def test_logout_revokes_the_refresh_and_access_tokens_at_the_authorization_server(
    oauth_server: str, config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, tokens = _signed_in(oauth_server, tmp_path)
    assert _accepted(oauth_server, tokens["access_token"])
    assert main(["auth", "logout", "remote", "--config", str(config)]) == 0
    said = capsys.readouterr().err
    assert httpx2.get(f"{oauth_server}/admin/revoked").json() == ["refresh_token", "access_token"]
    assert not _accepted(oauth_server, tokens["access_token"])  # dead there too, not only forgotten here
    assert f"revoked at {oauth_server}/revoke" in said and "signed out of remote" in said, said
    assert TokenStore().records() == {}
    assert not any(token in said for token in tokens.values() if isinstance(token, str) and len(token) > 8)


@pytest.mark.parametrize("mode", ["503", "hang"])
def test_a_revocation_that_fails_is_a_warning_and_the_tokens_are_forgotten_all_the_same(
    mode: str,
    oauth_server: str,
    config_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("breakwater.auth._revoke.REVOKE_TIMEOUT_S", 1.0)
    config, tokens = _signed_in(oauth_server, tmp_path)
    httpx2.post(f"{oauth_server}/admin/revoke-mode", params={"m": mode})
    assert main(["auth", "logout", "remote", "--config", str(config)]) == 0
    said = capsys.readouterr().err
    why = "answered HTTP 503: temporarily_unavailable" if mode == "503" else "did not answer within 1 s"
    assert f"warning: could not revoke remote's tokens at {oauth_server}/revoke: it {why}" in said, said
    assert "stay valid at the authorization server" in said and "signed out of remote" in said, said
    assert "revoked at" not in said, said
    assert TokenStore().records() == {}
    assert not any(token in said for token in tokens.values() if isinstance(token, str) and len(token) > 8)


@pytest.mark.parametrize("endpoint", ["http://[::1/revoke", "http://127.0.0.1:99999/revoke", "https://auth.example/\x00"])
def test_a_revocation_endpoint_no_request_can_go_to_is_a_warning_and_the_tokens_are_forgotten(
    endpoint: str, oauth_server: str, config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stored metadata's address is the server's text (or a file edited by hand): one the HTTP client cannot even
    send to (a bad port, a broken bracket) failed `auth logout` with a traceback and left the tokens on disk."""
    config, tokens = _signed_in(oauth_server, tmp_path)
    url = f"{oauth_server}/mcp"
    TokenStore().update(url, lambda rec: {**rec, "metadata": {**rec["metadata"], "revocation_endpoint": endpoint}})
    assert main(["auth", "logout", "remote", "--config", str(config)]) == 0
    said = capsys.readouterr().err
    assert "warning: could not revoke remote's tokens at " in said and "stay valid at the authorization server" in said
    assert "signed out of remote" in said and "Traceback" not in said, said
    assert "\x00" not in said, said
    assert TokenStore().records() == {}
    assert not any(token in said for token in tokens.values() if isinstance(token, str) and len(token) > 8)
