"""An entry's `oauth` object, as Claude Code writes it (and breakwater's client-credentials keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from breakwater.config import OAuthSettings, load_config
from breakwater.errors import ConfigError


def _load(tmp_path: Path, oauth: Any) -> OAuthSettings | None:
    path = tmp_path / ".mcp.json"
    entry = {"type": "http", "url": "https://mcp.example.com/mcp", "oauth": oauth}
    path.write_text(json.dumps({"mcpServers": {"remote": entry}}))
    return load_config(path, environ={}).server("remote").oauth


def test_claude_codes_keys(tmp_path: Path) -> None:
    oauth = _load(
        tmp_path,
        {
            "clientId": "abc123",
            "callbackPort": 8765,
            "authServerMetadataUrl": "https://auth.example.com/.well-known/openid-configuration",
            "scopes": "read write",
        },
    )
    assert oauth == OAuthSettings(
        client_id="abc123",
        callback_port=8765,
        auth_server_metadata_url="https://auth.example.com/.well-known/openid-configuration",
        scopes="read write",
    )


def test_a_client_secret_is_a_secret(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    entry = {"url": "https://mcp.example.com/mcp", "oauth": {"clientId": "abc123", "clientSecret": "s3cr3t-value-xyz"}}
    path.write_text(json.dumps({"mcpServers": {"remote": entry}}))
    spec = load_config(path, environ={}).server("remote")
    assert "s3cr3t-value-xyz" in spec.secrets
    described = json.dumps(spec.describe())
    assert "s3cr3t-value-xyz" not in described and '"clientSecret": "<redacted>"' in described
    assert "s3cr3t-value-xyz" not in repr(spec)


def test_client_credentials_with_a_key_file(tmp_path: Path) -> None:
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    oauth = _load(
        tmp_path,
        {"grantType": "client_credentials", "clientId": "svc", "privateKeyFile": "key.pem", "signingAlgorithm": "ES256"},
    )
    assert oauth is not None and oauth.grant_type == "client_credentials"
    assert oauth.private_key is not None and oauth.private_key.startswith("-----BEGIN PRIVATE KEY-----")
    assert oauth.signing_algorithm == "ES256"


@pytest.mark.parametrize(
    ("oauth", "key", "fix"),
    [
        ({"callbackPort": "8080"}, "mcpServers.remote.oauth.callbackPort", '"callbackPort": 8080'),
        ({"clientID": "x"}, "mcpServers.remote.oauth.clientID", "did you mean 'clientId'?"),
        ({"grantType": "client_credentials", "clientId": "svc"}, "mcpServers.remote.oauth", "clientSecret"),
        ({"grantType": "password"}, "mcpServers.remote.oauth.grantType", "authorization_code"),
        ({"authServerMetadataUrl": "auth.example.com"}, "mcpServers.remote.oauth.authServerMetadataUrl", "https://"),
        ("yes", "mcpServers.remote.oauth", "clientId"),
    ],
)
def test_mistakes_name_the_key_and_the_fix(tmp_path: Path, oauth: Any, key: str, fix: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, oauth)
    assert caught.value.key == key
    assert fix in (caught.value.fix or "")
