"""Sign-in: the authorization-code flow with PKCE for one HTTP (or legacy SSE) server, from `breakwater auth login`.

The SDK's provider does the protocol (discovery from the server's 401, authorization-server
metadata, client ID metadata document or dynamic registration or the entry's `clientId`, scopes,
the resource indicator, PKCE, the token exchange); this module gives it a person: the
authorization URL goes to the browser (or, with `--no-browser`, to standard output as the only
line), and the redirect comes back to a loopback listener at `http://localhost:PORT/callback`
(`callbackPort`, else a free port), or as the final redirect URL pasted on standard input. The
sign-in then connects to the server with the new tokens and lists its tools, so a success means
the server accepts them.
"""

from __future__ import annotations

import sys
import webbrowser
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TextIO
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import httpx2
from mcp import Client
from mcp.client.auth import OAuthFlowError
from mcp.client.auth.utils import union_scopes
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull

from breakwater._clock import Clock, SystemClock
from breakwater.auth._callback import Outcome, Redirects, listen
from breakwater.auth._provider import LoginHandlers, build_provider, redirect_uri
from breakwater.auth._store import ServerTokens, TokenStore
from breakwater.config import ServerSpec
from breakwater.config._model import OAuthSettings
from breakwater.config._redact import display_url

__all__ = ["Browser", "SignIn", "open_browser", "sign_in"]

#: How long a sign-in waits for the person (the redirect, or a pasted URL).
SIGN_IN_TIMEOUT_S = 300.0
_CONNECT_TIMEOUT_S = 30.0
#: Shows the person the authorization URL (opens it in a browser, or anything standing in for one).
Browser = Callable[[str], Awaitable[None]]


async def open_browser(url: str) -> None:
    """The system browser, and the URL on stderr for when none opens."""
    print(f"Opening the browser to sign in; if it does not open, visit:\n{url}", file=sys.stderr, flush=True)
    await anyio.to_thread.run_sync(webbrowser.open, url)


@dataclass(frozen=True)
class SignIn:
    """What a finished sign-in got (no token values: those stay in the store)."""

    name: str
    url: str
    scopes: str | None
    expires_at: float | None
    refreshable: bool
    tools: int


def _callback_port(spec: ServerSpec, tokens: ServerTokens) -> int:
    """`callbackPort`, else the port the stored registration was made with, else 0 (any)."""
    if spec.oauth is not None and spec.oauth.callback_port is not None:
        return spec.oauth.callback_port
    uris = (tokens.record().get("client") or {}).get("redirect_uris") or []
    return urlsplit(str(uris[0])).port or 0 if uris else 0


async def _bind(spec: ServerSpec, tokens: ServerTokens) -> tuple[anyio.abc.Listener[anyio.abc.SocketStream], int]:
    port = _callback_port(spec, tokens)
    try:
        return await listen(port)
    except OSError:
        if spec.oauth is not None and spec.oauth.callback_port is not None:
            raise OAuthFlowError(f"the callback port {port} is in use (callbackPort in the config)") from None
    # The registration's port is taken: register again with a free one.
    tokens.store.update(tokens.key, lambda rec: {k: v for k, v in rec.items() if k != "client"} or None)
    return await listen(0)


def _pinned(spec: ServerSpec, tokens: ServerTokens) -> ServerSpec:
    """Ask for what a step-up found missing too (`insufficient_scope` seen by a running gateway)."""
    needed = tokens.needed_scope()
    if needed is None:
        return spec
    oauth = spec.oauth or OAuthSettings()
    return replace(spec, oauth=replace(oauth, scopes=union_scopes(oauth.scopes, needed)))


async def sign_in(
    spec: ServerSpec,
    store: TokenStore,
    *,
    browser: Browser = open_browser,
    print_url: bool = False,
    stdin: TextIO | None = None,
    client_secret: str | None = None,
    clock: Clock | None = None,
    timeout_s: float = SIGN_IN_TIMEOUT_S,
) -> SignIn:
    """Sign in to `spec` (an HTTP server) and store the tokens; raises `OAuthFlowError` (and the SDK's
    other OAuth errors) when it cannot.

    `print_url` prints the authorization URL as the only line on standard output instead of calling
    `browser`, and reads a pasted redirect URL from `stdin` meanwhile. `client_secret` (from
    `MCP_CLIENT_SECRET`) goes with the entry's `clientId` into the store.
    """
    clock = clock or SystemClock()
    tokens = ServerTokens.for_server(store, spec, clock=clock)
    before = tokens.record()
    tokens.forget_tokens()  # a sign-in is a fresh one, even when the old tokens still work
    try:
        return await _sign_in(_pinned(spec, tokens), tokens, browser, print_url, stdin, client_secret, clock, timeout_s)
    except BaseException:
        if before.get("tokens") and not tokens.record().get("tokens"):
            kept: dict[str, Any] = {k: before[k] for k in ("tokens", "expires_at", "updated_at") if k in before}
            store.update(tokens.key, lambda rec: {**rec, **kept})  # a failed sign-in keeps the old one
        raise


async def _sign_in(
    spec: ServerSpec,
    tokens: ServerTokens,
    browser: Browser,
    print_url: bool,
    stdin: TextIO | None,
    client_secret: str | None,
    clock: Clock,
    timeout_s: float,
) -> SignIn:
    listener, port = await _bind(spec, tokens)
    send, receive = anyio.create_memory_object_stream[Outcome](4)
    redirects = Redirects(spec.name, send, clock)
    async with listener, send, receive, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, redirects.answer)

        async def redirect(url: str) -> None:
            redirects.shown(url)
            if print_url:
                print(url, flush=True)
                if stdin is not None:
                    redirects.read_pasted(stdin)
            else:
                # Not awaited: the page the browser gets waits for the sign-in's end, which waits for this.
                async def show() -> None:
                    await browser(url)

                tg.start_soon(show)

        async def callback() -> AuthorizationCodeResult:
            with clock.deadline_scope(clock.monotonic() + timeout_s) as scope:
                got = await receive.receive()
            if scope.cancelled_caught:
                raise OAuthFlowError(f"no sign-in within {timeout_s:g} s")
            if isinstance(got, Exception):
                raise got
            return got

        handlers = LoginHandlers(redirect_uri(port), redirect, callback)
        if client_secret and spec.oauth is not None and spec.oauth.client_id:
            await tokens.set_client_info(
                OAuthClientInformationFull(
                    client_id=spec.oauth.client_id,
                    client_secret=client_secret,
                    redirect_uris=[handlers.redirect_uri],  # type: ignore[list-item]  # pydantic parses it
                    token_endpoint_auth_method="client_secret_basic",
                )
            )
        ok = False
        try:
            tools = await _connect(spec, build_provider(spec, tokens, clock=clock, login=handlers))
            ok = True
        finally:
            redirects.finish(ok=ok)
        tg.cancel_scope.cancel()
    return _summary(spec, tokens, tools)


async def _connect(spec: ServerSpec, auth: httpx2.Auth) -> int:
    """Connect with the new sign-in (the first 401 starts it) and count the tools: the tokens work.

    Over the entry's own transport: the legacy SSE one (`"type": "sse"`) signs in the same way, and a
    `url` of no stated type that refuses streamable HTTP's POST (404, 405) is tried over SSE, as connects do."""
    url = spec.url or ""
    if spec.transport == "sse":
        sse = sse_client(url, timeout=_CONNECT_TIMEOUT_S, auth=auth)
        async with Client(sse, mode="legacy", cache=None) as client:
            return len((await client.list_tools()).tools)
    answered: list[tuple[int, str]] = []

    async def record(response: httpx2.Response) -> None:
        answered.append((response.status_code, display_url(str(response.request.url))))

    timeout = httpx2.Timeout(_CONNECT_TIMEOUT_S)
    try:
        async with (
            httpx2.AsyncClient(auth=auth, timeout=timeout, event_hooks={"response": [record]}) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
        ):
            return len((await client.list_tools()).tools)
    except Exception as exc:
        if not (answered and spec.legacy_sse_answer(answered[-1][0])):
            raise OAuthFlowError(_why(exc, answered[-1] if answered else None, display_url(url))) from exc
    return await _connect(replace(spec, transport="sse"), auth)


def _where(exc: BaseException, server: str) -> str:
    """The URL whose request failed (discovery, the token endpoint...), else the server's."""
    request = getattr(exc, "_request", None)  # httpx's `request` property raises when there is none
    return display_url(str(request.url)) if isinstance(request, httpx2.Request) else server


def _why(exc: BaseException, last: tuple[int, str] | None, url: str) -> str:
    """What stopped a sign-in, in the user's terms: the SDK's words were a traceback, "Server returned an error
    response" for a 403, an empty ReadTimeout, and "All connection attempts failed" without the address. A request to
    somewhere else than the server (the authorization server) is named by its URL: the server's was blamed."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.TransportError):
        where = _where(exc, url)
        elsewhere = urlsplit(where).netloc != urlsplit(url).netloc  # the authorization server, down or hung
        if isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
            if elsewhere:
                return f"the authorization server does not answer: nothing answers at {where} ({type(exc).__name__})"
            return f"nothing answers at {where} ({type(exc).__name__}); check the URL and that the server runs"
        if isinstance(exc, httpx2.TimeoutException):
            who = "the authorization server at " if elsewhere else ""
            return f"{who}{where} did not answer within {_CONNECT_TIMEOUT_S:g} s ({type(exc).__name__})"
    status, where = last if last is not None else (None, url)
    if status is not None and status >= 400 and where != url:
        if urlsplit(where).netloc != urlsplit(url).netloc:
            return f"the authorization server at {where} answered HTTP {status} ({type(exc).__name__}: {exc})"
        if status not in (401, 403):  # the server's own refusals have their advice below
            return f"{where} answered HTTP {status} ({type(exc).__name__}: {exc})"
    if status == 401:
        return (
            f"{url} refused the request (HTTP 401) and offers no OAuth sign-in that works ({exc}): if it takes a key "
            "or token of its own, put it in the entry's headers (Authorization) instead"
        )
    if status == 403:
        return f"{url} refused the request (HTTP 403): the credentials it got (if any) lack permission for it"
    if status is not None and status >= 400:
        return f"{url} answered HTTP {status} ({type(exc).__name__}: {exc})"
    if isinstance(exc, OAuthFlowError):  # its words say it ("the authorization server refused: access_denied")
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _summary(spec: ServerSpec, tokens: ServerTokens, tools: int) -> SignIn:
    record: dict[str, Any] = tokens.record()
    stored = record.get("tokens") or {}
    return SignIn(
        name=spec.name,
        url=spec.url or "",
        scopes=stored.get("scope"),
        expires_at=tokens.expires_at(),
        refreshable=bool(stored.get("refresh_token")),
        tools=tools,
    )
