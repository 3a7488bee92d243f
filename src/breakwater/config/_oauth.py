"""An entry's `oauth` object, as Claude Code writes it, into `OAuthSettings`.

Claude Code's keys: `clientId` (a client registered ahead of time, for servers without dynamic
registration), `callbackPort` (the redirect is `http://localhost:PORT/callback`),
`authServerMetadataUrl` (skips discovery) and `scopes` (one space-separated string that pins what is
asked for). Gemini CLI's object is read too: `enabled` (false: no sign-in), `scopes` as a list, and
the endpoints it may name (`authorizationUrl`, `tokenUrl`, ...) are left to discovery, with a note.
Claude Code keeps the client secret in the keychain; breakwater takes it from
`clientSecret` (write `"${VAR}"` to keep it out of the file) or from `MCP_CLIENT_SECRET` at sign-in,
which stores it with the tokens.

breakwater's own keys: `clientMetadataUrl` (a client ID metadata document to use as the client ID
where the authorization server supports them), and for machine-to-machine servers
`"grantType": "client_credentials"` with `clientId` and either `clientSecret` or a private key
(`privateKey` PEM text or `privateKeyFile`, `signingAlgorithm`, default RS256) for
`private_key_jwt`, and `issuer`, the authorization server those credentials belong to.
May import the core leaves and the rest of `config` only.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from breakwater._paths import MAX_SECRET_FILE_BYTES, read_user_file
from breakwater.config._dialect import GEMINI_OAUTH_KEYS
from breakwater.config._expand import Expander
from breakwater.config._model import OAuthSettings
from breakwater.errors import ConfigError

__all__ = ["OAUTH_KEYS", "parse_oauth"]

_STRING_KEYS = {
    "clientId": "client_id",
    "clientSecret": "client_secret",
    "authServerMetadataUrl": "auth_server_metadata_url",
    "scopes": "scopes",
    "clientMetadataUrl": "client_metadata_url",
    "privateKey": "private_key",
    "signingAlgorithm": "signing_algorithm",
    "issuer": "issuer",
}
OAUTH_KEYS = frozenset({*_STRING_KEYS, "callbackPort", "grantType", "privateKeyFile", "enabled"})
_GRANTS = ("authorization_code", "client_credentials")


def _fail(message: str, path: str, key: str, fix: str) -> ConfigError:
    return ConfigError(message, path=path, key=key, fix=fix)


def parse_oauth(value: Any, *, path: str, where: str, expand: Expander | None = None) -> OAuthSettings | None:
    """Validate `where.oauth`; every error names the key and the fix. None: Gemini CLI's `"enabled": false`, or null.

    With `expand` (the file's), its string values are expanded as the entry's others are: `"clientSecret": "${SECRET}"`.
    """
    key = f"{where}.oauth"
    if value is None:  # `"oauth": null`: none, as a null env is
        return None
    if not isinstance(value, dict):
        raise _fail("expected an object", path, key, 'write "oauth": {"clientId": "...", "callbackPort": 8080}')
    fields: dict[str, Any] = {}
    for name, raw in value.items():
        if name in GEMINI_OAUTH_KEYS:
            continue  # noted by `entry_notes`: endpoints breakwater discovers
        if name == "enabled":
            if not isinstance(raw, bool):
                raise _fail("expected true or false", path, f"{key}.{name}", '"enabled": true')
            if not raw:
                return None
            continue
        if name == "scopes" and isinstance(raw, list) and raw and all(isinstance(s, str) and s.strip() for s in raw):
            fields["scopes"] = " ".join(raw)  # Gemini CLI writes a list
            continue
        if name not in OAUTH_KEYS:
            close = difflib.get_close_matches(name, sorted(OAUTH_KEYS), n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(OAUTH_KEYS))}"
            raise _fail("unknown key", path, f"{key}.{name}", fix)
        if name == "callbackPort":
            if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
                raise _fail("expected a port number (1-65535)", path, f"{key}.{name}", '"callbackPort": 8080')
            fields["callback_port"] = raw
        elif name == "grantType":
            if raw not in _GRANTS:
                raise _fail(f"unknown grant type {raw!r}", path, f"{key}.{name}", f"use one of: {', '.join(_GRANTS)}")
            fields["grant_type"] = raw
        elif name == "privateKeyFile":
            fields["private_key"] = _read_key(raw, path, f"{key}.{name}")
        else:
            if not isinstance(raw, str) or not raw.strip():
                raise _fail("expected a non-empty string", path, f"{key}.{name}", "quote the value")
            if expand is not None:
                raw = expand(raw, where=where, key=f"{key}.{name}", secret=name in ("clientSecret", "privateKey"))
            fields[_STRING_KEYS[name]] = raw
    for url_key in ("authServerMetadataUrl", "clientMetadataUrl", "issuer"):
        url = value.get(url_key)
        if isinstance(url, str) and not url.startswith(("https://", "http://")):
            raise _fail("expected an http(s) URL", path, f"{key}.{url_key}", "write the full URL, https://...")
    settings = OAuthSettings(**fields)
    if settings.grant_type == "client_credentials":
        if not settings.client_id:
            raise _fail("client credentials need a client ID", path, f"{key}.clientId", 'add "clientId": "..."')
        if not settings.client_secret and not settings.private_key:
            raise _fail(
                "client credentials need a secret or a private key",
                path,
                key,
                'add "clientSecret": "${SECRET_VAR}" or "privateKeyFile": "key.pem"',
            )
    return settings


def _read_key(raw: Any, path: str, key: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _fail("expected a file path", path, key, '"privateKeyFile": "client-key.pem"')
    base = Path(path).parent if path else Path.cwd()
    file = base / os.path.expanduser(raw)
    try:
        return read_user_file(file, MAX_SECRET_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(
            f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}", path, key, "point it at a PEM private key"
        ) from None
