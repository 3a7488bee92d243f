"""An OAuth-protected MCP server on the SDK's server-side auth support, for the sign-in tests.

The SDK serves the authorization server (metadata, dynamic registration, /authorize, /token,
/revoke) and the protected-resource metadata, and checks the bearer token on /mcp; this file is
only the provider behind it: an in-memory store that approves every authorization request at once
(a person who always says yes), with short-lived access tokens and rotating refresh tokens.

Two admin routes let a test act on the tokens from outside: `POST /admin/expire` drops every access token (as if they
all expired; the refresh tokens stay), `POST /admin/revoke` drops every token.
`POST /admin/token-mode?m=ok|500|429|hang|garbage|slow` makes the token endpoint fail for its own reasons (`garbage`:
a 200 whose body is no token response; `slow`: answer as usual, after `SLOW_TOKEN_S`); every revocation at `/revoke`
is recorded (`GET /admin/revoked`: which kind of token each was, never the token), and
`POST /admin/revoke-mode?m=ok|503|hang` makes `/revoke` fail; `POST /admin/require-scope?s=extra` makes `/mcp` ask for
one more scope (403 `insufficient_scope`). `GET /admin/stats` counts the grants, the runs of the tool `whoami`, and
the calls of `wait` begun.
The token endpoint also grants `client_credentials` (which the SDK's server lacks) to the one machine client `M2M_ID`
/ `M2M_SECRET` (HTTP Basic). `GET /custom/metadata` serves the authorization-server metadata at a URL discovery would
not find (for `authServerMetadataUrl`).

    python tests/auth/oauth_server.py --port-file F [--lifetime 3600] [--sse]

`--sse` serves the legacy HTTP+SSE transport (`GET /sse`, `POST /messages/`) behind the same
sign-in, in place of streamable HTTP at `/mcp`.
"""

from __future__ import annotations

if __name__ == "__main__":  # the suite runs it as a fork of a process that imported the SDK already (`fork_script`)
    from breakwater.testing._launcher import fork_script

    fork_script(__file__)

import argparse
import base64
import secrets
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx2
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    IdentityAssertionParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import AnyHttpUrl
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

SCOPE = "mcp:tools"
M2M_ID = "m2m-client"
M2M_SECRET = "m2m-secret-value-4711"
#: How long the token endpoint takes in the `slow` mode.
SLOW_TOKEN_S = 2.0
#: An access-token lifetime short enough for a test to outlive (`--lifetime`; the `oauth_server_short_lived` fixture).
SHORT_LIFETIME_S = 3


class Provider:
    """Approves everyone; remembers everything in memory."""

    def __init__(self, lifetime: int) -> None:
        self.lifetime = lifetime
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.stats = {"authorization_code": 0, "refresh_token": 0, "rejected": 0, "custom_metadata": 0, "client_credentials": 0}
        #: Runs of `whoami`, and calls of `wait` begun (the server took them), for tests that act while one runs.
        self.stats["whoami"] = 0
        self.stats["waits_begun"] = 0
        #: What the token endpoint does: "ok", "slow", or fail for its own reasons ("500", "429", "hang", "garbage").
        self.token_mode = "ok"
        #: A scope `/mcp` wants besides `SCOPE` (a step-up), or None.
        self.extra_scope: str | None = None
        #: The kind of each token revoked at `/revoke` (RFC 7009), in order.
        self.revoked: list[str] = []
        #: What the revocation endpoint does: "ok", or fail ("503", "hang").
        self.revoke_mode = "ok"

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = AuthorizationCode(
            code=secrets.token_urlsafe(24),
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        self.codes[code.code] = code
        return construct_redirect_uri(str(params.redirect_uri), code=code.code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        expires = int(time.time()) + self.lifetime
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=access, expires_in=self.lifetime, scope=" ".join(scopes), refresh_token=refresh)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        self.stats["authorization_code"] += 1
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        token = self.refresh.get(refresh_token)
        if token is None:
            self.stats["rejected"] += 1
        return token

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)  # rotate
        self.stats["refresh_token"] += 1
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is not None and found.expires_at is not None and found.expires_at < time.time():
            return None
        return found

    async def exchange_identity_assertion(
        self, client: OAuthClientInformationFull, params: IdentityAssertionParams
    ) -> OAuthToken:
        raise NotImplementedError("no enterprise identity provider here")

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.revoked.append("refresh_token" if isinstance(token, RefreshToken) else "access_token")
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


class TokenEndpoint:
    """ASGI middleware over `/token`: the admin-set failure mode, and the client-credentials grant; over `/mcp`: the
    admin-set step-up scope."""

    def __init__(self, app: Any, provider: Provider) -> None:
        self.app = app
        self.provider = provider

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp" and (refusal := self._step_up(scope)) is not None:
            await refusal(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == "/revoke" and self.provider.revoke_mode != "ok":
            if self.provider.revoke_mode == "hang":
                await anyio.sleep(3600)
            await JSONResponse({"error": "temporarily_unavailable"}, status_code=503)(scope, receive, send)
            return
        if scope["type"] != "http" or scope["path"] != "/token":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        mode = self.provider.token_mode
        if mode == "hang":
            await anyio.sleep(3600)
        if mode == "slow":
            await anyio.sleep(SLOW_TOKEN_S)
        if mode == "garbage":
            await Response("<html>maintenance</html>", media_type="text/html")(scope, receive, send)
            return
        if mode in ("500", "429"):
            await JSONResponse({"error": "temporarily_unavailable"}, status_code=int(mode))(scope, receive, send)
            return
        form = parse_qs(body.decode())
        if form.get("grant_type") == ["client_credentials"]:
            await self._client_credentials(scope, form)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _step_up(self, scope: Any) -> Response | None:
        extra = self.provider.extra_scope
        bearer = dict(scope["headers"]).get(b"authorization", b"").decode().removeprefix("Bearer ")
        token = self.provider.access.get(bearer)
        if extra is None or token is None or extra in token.scopes:
            return None
        challenge = f'Bearer error="insufficient_scope", scope="{SCOPE} {extra}"'
        return JSONResponse({"error": "insufficient_scope"}, status_code=403, headers={"WWW-Authenticate": challenge})

    def _client_credentials(self, scope: Any, form: dict[str, list[str]]) -> Response:
        headers = dict(scope["headers"])
        expected = "Basic " + base64.b64encode(f"{M2M_ID}:{M2M_SECRET}".encode()).decode()
        if headers.get(b"authorization", b"").decode() != expected:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        self.provider.stats["client_credentials"] += 1
        scopes = (form.get("scope") or [SCOPE])[0].split()
        token = self.provider._issue(M2M_ID, scopes, None)
        return JSONResponse(token.model_copy(update={"refresh_token": None}).model_dump(exclude_none=True))


async def follow(url: str) -> None:
    """The browser of a test's sign-in: follows the authorization URL's redirects to the end (this server approves at
    once), for `sign_in(..., browser=follow)`."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=10) as http:
        await http.get(url)


def admin_stats(base: str) -> dict[str, int]:
    """What `GET /admin/stats` counts of the server at `base`."""
    return dict(httpx2.get(f"{base}/admin/stats").json())


def build(port: int, lifetime: int, path: str = "/mcp") -> tuple[MCPServer, Provider]:
    base = f"http://127.0.0.1:{port}"
    provider = Provider(lifetime)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        settings = AuthSettings(
            issuer_url=AnyHttpUrl(base),
            resource_server_url=AnyHttpUrl(f"{base}{path}"),
            client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]),
            revocation_options=RevocationOptions(enabled=True),
            required_scopes=[SCOPE],
            validate_token_resource=False,
        )
    mcp: MCPServer[Any] = MCPServer("oauth-test", auth_server_provider=provider, auth=settings)

    @mcp.tool()
    def whoami() -> str:
        """Says the caller got through."""
        provider.stats["whoami"] += 1
        return "signed in"

    @mcp.tool()
    async def wait(seconds: float) -> str:
        """Answers after `seconds` (JSON responses: the HTTP response comes only then)."""
        provider.stats["waits_begun"] += 1
        await anyio.sleep(seconds)
        return "waited"

    async def expire(request: Request) -> Response:
        provider.access.clear()
        return JSONResponse({"ok": True})

    async def revoke(request: Request) -> Response:
        provider.access.clear()
        provider.refresh.clear()
        return JSONResponse({"ok": True})

    async def stats(request: Request) -> Response:
        return JSONResponse(provider.stats)

    async def revoked(request: Request) -> Response:
        return JSONResponse(provider.revoked)

    async def require_scope(request: Request) -> Response:
        provider.extra_scope = request.query_params.get("s") or None
        return JSONResponse({"ok": True})

    async def token_mode(request: Request) -> Response:
        provider.token_mode = request.query_params.get("m", "ok")
        return JSONResponse({"ok": True})

    async def revoke_mode(request: Request) -> Response:
        provider.revoke_mode = request.query_params.get("m", "ok")
        return JSONResponse({"ok": True})

    async def custom_metadata(request: Request) -> Response:
        """The authorization-server metadata at a URL of its own (for `authServerMetadataUrl`)."""
        provider.stats["custom_metadata"] += 1
        async with httpx2.AsyncClient() as http:
            found = await http.get(f"{base}/.well-known/oauth-authorization-server")
        return JSONResponse(found.json())

    mcp.custom_route("/custom/metadata", methods=["GET"])(custom_metadata)
    # Called, not applied as decorators: the SDK's decorator is untyped.
    mcp.custom_route("/admin/expire", methods=["POST"])(expire)
    mcp.custom_route("/admin/revoke", methods=["POST"])(revoke)
    mcp.custom_route("/admin/stats", methods=["GET"])(stats)
    mcp.custom_route("/admin/revoked", methods=["GET"])(revoked)
    mcp.custom_route("/admin/revoke-mode", methods=["POST"])(revoke_mode)
    mcp.custom_route("/admin/token-mode", methods=["POST"])(token_mode)
    mcp.custom_route("/admin/require-scope", methods=["POST"])(require_scope)

    return mcp, provider


async def serve(port_file: str, lifetime: int, sse: bool = False) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = int(sock.getsockname()[1])
    mcp, provider = build(port, lifetime, "/sse" if sse else "/mcp")
    # JSON responses: a call's HTTP response arrives when the tool ends, so a client that serialized its
    # requests (a lock held across one in flight) would show it.
    app = TokenEndpoint(mcp.sse_app() if sse else mcp.streamable_http_app(json_response=True), provider)
    Path(port_file).write_text(str(port))
    # A hung token request must not hold the test's teardown (`terminate`) for its hour.
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--lifetime", type=int, default=3600, help="access-token lifetime in seconds")
    parser.add_argument("--sse", action="store_true", help="serve the legacy HTTP+SSE transport at /sse")
    args = parser.parse_args(argv)
    anyio.run(serve, args.port_file, args.lifetime, args.sse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
