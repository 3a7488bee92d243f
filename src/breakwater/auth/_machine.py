"""The client-credentials extension (machine-to-machine, no person): the SDK's two providers under
breakwater's changes (`_flow._StoredFlow`). Its own module because the SDK's pulls in PyJWT,
which only such servers need.
"""

from __future__ import annotations

import warnings

from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.shared.exceptions import MCPDeprecationWarning

from breakwater.auth._flow import _StoredFlow
from breakwater.auth._store import ServerTokens
from breakwater.config import OAuthSettings, ServerSpec

__all__ = ["client_credentials_provider"]


class _ClientSecret(_StoredFlow, ClientCredentialsOAuthProvider):
    """client_credentials with a client secret (HTTP Basic at the token endpoint)."""


class _PrivateKeyJWT(_StoredFlow, PrivateKeyJWTOAuthProvider):
    """client_credentials with a `private_key_jwt` assertion signed by the entry's key."""


def client_credentials_provider(spec: ServerSpec, tokens: ServerTokens) -> _StoredFlow:
    """A secret (HTTP Basic at the token endpoint) or a private key signing `private_key_jwt` assertions."""
    oauth = spec.oauth or OAuthSettings()
    url = spec.url or ""
    client_id = oauth.client_id or ""
    # Without `issuer` the SDK warns on every construction (every connect attempt); the README says to set it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        if oauth.private_key:
            signer = SignedJWTParameters(
                issuer=client_id, subject=client_id, signing_key=oauth.private_key, signing_algorithm=oauth.signing_algorithm
            )
            return _PrivateKeyJWT(
                url, tokens, client_id, signer.create_assertion_provider(), scope=oauth.scopes, issuer=oauth.issuer
            )
        return _ClientSecret(url, tokens, client_id, oauth.client_secret or "", scope=oauth.scopes, issuer=oauth.issuer)
