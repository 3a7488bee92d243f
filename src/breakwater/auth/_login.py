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

import contextlib
import sys
import threading
import webbrowser
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TextIO
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import httpx2
from anyio.streams.memory import MemoryObjectSendStream
from anyio.streams.stapled import MultiListener
from mcp import Client
from mcp.client.auth import OAuthFlowError
from mcp.client.auth.utils import union_scopes
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull

from breakwater._clock import Clock, SystemClock
from breakwater.auth._provider import LoginHandlers, build_provider, redirect_uri
from breakwater.auth._store import ServerTokens, TokenStore
from breakwater.config import ServerSpec
from breakwater.config._model import OAuthSettings
from breakwater.config._redact import display_url

__all__ = ["Browser", "SignIn", "open_browser", "sign_in"]

#: How long a sign-in waits for the person (the redirect, or a pasted URL).
SIGN_IN_TIMEOUT_S = 300.0
_CONNECT_TIMEOUT_S = 30.0
_PAGE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"<!doctype html><title>breakwater</title><p>Signed in. You can close this tab.</p>"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

#: Shows the person the authorization URL (opens it in a browser, or anything standing in for one).
Browser = Callable[[str], Awaitable[None]]

_Outcome = AuthorizationCodeResult | Exception


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


def _parse_redirect(target: str) -> _Outcome:
    query = parse_qs(urlsplit(target).query)

    def one(key: str) -> str | None:
        values = query.get(key)
        return values[0] if values else None

    error = one("error")
    if error is not None:
        detail = one("error_description")
        return OAuthFlowError(f"the authorization server refused: {error}" + (f" ({detail})" if detail else ""))
    code = one("code")
    if code is None:
        return OAuthFlowError("the redirect carried no authorization code")
    return AuthorizationCodeResult(code=code, state=one("state"), iss=one("iss"))


async def _answer(stream: anyio.abc.SocketStream, send: MemoryObjectSendStream[_Outcome]) -> None:
    """One HTTP request on the loopback listener: the redirect (answered with a page), or anything else (404)."""
    async with stream:
        data = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while b"\r\n\r\n" not in data and len(data) < 65536:
                data += await stream.receive()
        parts = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        target = parts[1] if len(parts) >= 2 else ""
        if urlsplit(target).path != "/callback":
            with contextlib.suppress(anyio.BrokenResourceError):
                await stream.send(_NOT_FOUND)
            return
        with contextlib.suppress(anyio.BrokenResourceError):
            await stream.send(_PAGE)
        await send.send(_parse_redirect(target))


async def _listen(port: int) -> tuple[anyio.abc.Listener[anyio.abc.SocketStream], int]:
    """Listen on 127.0.0.1 (and ::1 at the same port when the machine has it): `localhost` is either."""
    v4 = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    bound = int(v4.extra(anyio.abc.SocketAttribute.local_port))
    listeners: list[anyio.abc.Listener[anyio.abc.SocketStream]] = [v4]
    with contextlib.suppress(OSError):
        listeners.append(await anyio.create_tcp_listener(local_host="::1", local_port=bound))
    return MultiListener(listeners), bound


def _read_pasted(stdin: TextIO, send: MemoryObjectSendStream[_Outcome]) -> None:
    """A final redirect URL pasted on standard input (a machine whose browser is elsewhere).

    A daemon thread, not a worker thread: when the loopback wins, a read still blocked on the
    terminal must not keep the finished command from exiting.
    """
    token = anyio.lowlevel.current_token()

    def read() -> None:
        for line in iter(stdin.readline, ""):
            if "code=" in line or "error=" in line:
                with contextlib.suppress(Exception):  # the sign-in already ended: nothing to hand it to
                    anyio.from_thread.run_sync(send.send_nowait, _parse_redirect(line.strip()), token=token)
                return

    threading.Thread(target=read, name="breakwater-paste", daemon=True).start()


def _callback_port(spec: ServerSpec, tokens: ServerTokens) -> int:
    """`callbackPort`, else the port the stored registration was made with, else 0 (any)."""
    if spec.oauth is not None and spec.oauth.callback_port is not None:
        return spec.oauth.callback_port
    uris = (tokens.record().get("client") or {}).get("redirect_uris") or []
    return urlsplit(str(uris[0])).port or 0 if uris else 0


async def _bind(spec: ServerSpec, tokens: ServerTokens) -> tuple[anyio.abc.Listener[anyio.abc.SocketStream], int]:
    port = _callback_port(spec, tokens)
    try:
        return await _listen(port)
    except OSError:
        if spec.oauth is not None and spec.oauth.callback_port is not None:
            raise OAuthFlowError(f"the callback port {port} is in use (callbackPort in the config)") from None
    # The registration's port is taken: register again with a free one.
    tokens.store.update(tokens.url, lambda rec: {k: v for k, v in rec.items() if k != "client"} or None)
    return await _listen(0)


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
    tokens = ServerTokens(store, spec.url or "", name=spec.name, clock=clock)
    before = tokens.record()
    tokens.forget_tokens()  # a sign-in is a fresh one, even when the old tokens still work
    try:
        return await _sign_in(_pinned(spec, tokens), tokens, browser, print_url, stdin, client_secret, clock, timeout_s)
    except BaseException:
        if before.get("tokens") and not tokens.record().get("tokens"):
            kept: dict[str, Any] = {k: before[k] for k in ("tokens", "expires_at", "updated_at") if k in before}
            store.update(tokens.url, lambda rec: {**rec, **kept})  # a failed sign-in keeps the old one
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
    send, receive = anyio.create_memory_object_stream[_Outcome](4)
    async with listener, send, receive, anyio.create_task_group() as tg:

        async def serve_callback() -> None:
            await listener.serve(lambda stream: _answer(stream, send))

        tg.start_soon(serve_callback)

        async def redirect(url: str) -> None:
            if print_url:
                print(url, flush=True)
                if stdin is not None:
                    _read_pasted(stdin, send)
            else:
                await browser(url)

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
        provider = build_provider(spec, tokens, clock=clock, login=handlers)
        tools = await _connect(spec, provider)
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
    statuses: list[int] = []

    async def record(response: httpx2.Response) -> None:
        statuses.append(response.status_code)

    timeout = httpx2.Timeout(_CONNECT_TIMEOUT_S)
    try:
        async with (
            httpx2.AsyncClient(auth=auth, timeout=timeout, event_hooks={"response": [record]}) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
        ):
            return len((await client.list_tools()).tools)
    except Exception as exc:
        if not (statuses and spec.legacy_sse_answer(statuses[-1])):
            raise OAuthFlowError(_why(exc, statuses[-1] if statuses else None, display_url(url))) from exc
    return await _connect(replace(spec, transport="sse"), auth)


def _why(exc: BaseException, status: int | None, url: str) -> str:
    """What stopped a sign-in, in the user's terms: the SDK's words were a traceback, "Server returned an error
    response" for a 403, an empty ReadTimeout, and "All connection attempts failed" without the address."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
        return f"nothing answers at {url} ({type(exc).__name__}); check the URL and that the server runs"
    if isinstance(exc, httpx2.TimeoutException):
        return f"{url} did not answer within {_CONNECT_TIMEOUT_S:g} s ({type(exc).__name__})"
    if status == 401:
        return (
            f"{url} refused the request (HTTP 401) and offers no OAuth sign-in that works ({exc}): if it takes a key "
            "or token of its own, put it in the entry's headers (Authorization) instead"
        )
    if status == 403:
        return f"{url} refused the request (HTTP 403): the credentials it got (if any) lack permission for it"
    if status is not None and status >= 400:
        return f"{url} answered HTTP {status} ({type(exc).__name__}: {exc})"
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
