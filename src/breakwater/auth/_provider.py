"""The `httpx2.Auth` for an HTTP server signing in with the authorization-code flow, and the choice of provider.

`build_provider` picks the SDK's provider for the entry's grant (authorization code here, client
credentials in `_machine.py`) under breakwater's changes (`_flow.py`); with `LoginHandlers` (only
`auth login` passes them) a person can sign in, without them it never opens a browser.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata
from pydantic import AnyUrl

from breakwater._clock import Clock, SystemClock
from breakwater.auth._flow import AuthRequiredNote, _StoredFlow
from breakwater.auth._store import ServerTokens
from breakwater.config import OAuthSettings, ServerSpec

__all__ = ["LoginHandlers", "build_provider", "redirect_uri"]


def redirect_uri(port: int) -> str:
    """The loopback redirect, as Claude Code registers it (`callbackPort`)."""
    return f"http://localhost:{port}/callback"


@dataclass(frozen=True)
class LoginHandlers:
    """What a sign-in with a person needs: show them the authorization URL, wait for the redirect."""

    redirect_uri: str
    redirect: Callable[[str], Awaitable[None]]
    callback: Callable[[], Awaitable[AuthorizationCodeResult]]


class _AuthorizationCode(_StoredFlow):
    """A person signed in once; a pre-registered `clientId` from the entry replaces registration."""

    async def _initialize(self) -> None:
        await super()._initialize()
        oauth = self._spec.oauth
        if oauth is None or not oauth.client_id:
            return
        stored = self.context.client_info
        if stored is not None and stored.client_id == oauth.client_id and not oauth.client_secret:
            return  # as registered at sign-in (with the secret MCP_CLIENT_SECRET gave then, if any)
        secret = oauth.client_secret or (
            stored.client_secret if stored is not None and stored.client_id == oauth.client_id else None
        )
        self.context.client_info = OAuthClientInformationFull(
            client_id=oauth.client_id,
            client_secret=secret,
            redirect_uris=self.context.client_metadata.redirect_uris,
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
        )


def build_provider(
    spec: ServerSpec,
    tokens: ServerTokens,
    *,
    clock: Clock | None = None,
    login: LoginHandlers | None = None,
    on_auth_required: AuthRequiredNote | None = None,
) -> OAuthClientProvider:
    """The `httpx2.Auth` for one HTTP server: signing in when `login` is given, else stored tokens only."""
    clock = clock or SystemClock()
    oauth = spec.oauth or OAuthSettings()
    url = spec.url or ""
    provider: _StoredFlow
    if oauth.grant_type == "client_credentials":
        # Imported only for such servers: the SDK's module pulls in PyJWT (~0.1 s at every start).
        from breakwater.auth._machine import client_credentials_provider

        machine = client_credentials_provider(spec, tokens)
        machine._setup(spec, tokens, clock, interactive=True, note=on_auth_required)
        return machine
    redirect = login.redirect_uri if login is not None else _stored_redirect(tokens) or redirect_uri(oauth.callback_port or 80)
    metadata = OAuthClientMetadata(
        client_name="breakwater",
        redirect_uris=[AnyUrl(redirect)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        scope=oauth.scopes,
    )
    provider = _AuthorizationCode(
        url,
        metadata,
        tokens,
        redirect_handler=login.redirect if login is not None else None,
        callback_handler=login.callback if login is not None else None,
        client_metadata_url=oauth.client_metadata_url,
    )
    provider._setup(spec, tokens, clock, interactive=login is not None, note=on_auth_required)
    return provider


def _stored_redirect(tokens: ServerTokens) -> str | None:
    """The redirect the stored registration was made with (refreshes must not change the client)."""
    uris = (tokens.record().get("client") or {}).get("redirect_uris") or []
    return str(uris[0]) if uris else None
