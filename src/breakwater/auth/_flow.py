"""The SDK's OAuth client (`mcp.client.auth`), with what breakwater needs and the SDK lacks.

`_StoredFlow` is mixed over the SDK's providers (`_provider.py`: authorization code; `_machine.py`:
client credentials).

`OAuthClientProvider` is an `httpx2.Auth`: it puts the bearer token on every request, refreshes an
expired one, and on a 401 (or a 403 `insufficient_scope`) runs discovery, registration and the
authorization-code flow with PKCE. breakwater uses it as it is for sign-in (`auth login`) and for
client credentials, and changes five things, all here:

1. Stored tokens keep their expiry across restarts (the SDK forgets it: a token loaded from storage
   counts as valid until a 401), and are refreshed a little *before* they expire, on the injected
   clock.
2. A 401 on a signed-in server first tries the refresh token and retries once (the SDK starts the
   whole sign-in again), and a token written by a later `auth login` is picked up by a running
   gateway at the next 401 instead of after a restart. The refresh is a request of its own
   (`_refresh_within`), bounded on the injected clock by `refresh_timeout_s`: the SDK sent it
   through the connection, unbounded, so a token endpoint that hung held a call whose 401 said
   "nothing ran" until the call's deadline cut it as "it may have run". Once the connection is in
   service, a refresh that fails in any way leaves the request refused (its 401 is the answer). A call cut while
   its request waits for a refresh (before it is sent, or after its 401) is told it was not sent, and it is not
   sent after that (`_unsent`).
3. Without a person (`serve`, `Breakwater`): no browser, no dynamic registration from a background
   gateway. When the tokens are missing or cannot be refreshed, or the server wants more scope,
   the provider calls `on_auth_required` with a message naming `breakwater auth login NAME` and
   lets the 401 through to the transport, whose failure the connect classifier reports as
   `auth_required`.
4. Discovery's results (authorization-server and protected-resource metadata) are stored with the
   tokens, so a later process refreshes against the right token endpoint without discovering.
5. The entry's `authServerMetadataUrl` replaces the authorization-server discovery request, and its
   `scopes` pin what the authorization request asks for.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, fields
from typing import Any

import anyio
import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import extract_field_from_www_auth, extract_scope_from_www_auth, union_scopes
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER

from breakwater._clock import Clock, SystemClock
from breakwater.auth._store import ServerTokens
from breakwater.auth._unsent import NOT_SENT, Refusal, held, may_send, noted, waiting_for, watched
from breakwater.config import ServerSpec
from breakwater.config._redact import display_url

__all__ = ["AuthNote", "AuthRequiredNote", "login_command", "refresh_timeout_s"]

#: Refresh when this share of a token's lifetime is left (at most `_MAX_MARGIN_S`).
_MARGIN_SHARE = 0.1
_MAX_MARGIN_S = 60.0
#: The most a refresh waits for the token endpoint; less when the entry's calls have less time (`refresh_timeout_s`).
_REFRESH_MAX_S = 10.0
_REFRESH_MIN_S = 1.0
_ASM_PATHS = ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration")

#: Told why a server cannot be used until someone signs in (the message names the command).
AuthRequiredNote = Callable[[str], None]


class AuthNote(str):
    """An `AuthRequiredNote` message, with what a server's status needs besides its words.

    `http_status` is the answer that stopped the server (a step-up's 403, the token endpoint's 500), where the last
    status the connection saw was a later, beside-the-point 401. `server_trouble` says the authorization server failed
    for its own reasons (a 5xx, a 429): the connect classifier reports it as an HTTP status to wait out, as it reports
    an unreachable token endpoint, not as `auth_required`, which tells scripts and `/readyz` a person must act.
    """

    http_status: int | None
    server_trouble: bool

    def __new__(cls, message: str, *, http_status: int | None = None, server_trouble: bool = False) -> AuthNote:
        note = super().__new__(cls, message)
        note.http_status = http_status
        note.server_trouble = server_trouble
        return note


def login_command(name: str) -> str:
    """The command that fixes it, as every message prints it."""
    return f"breakwater auth login {name}"


def refresh_timeout_s(spec: ServerSpec) -> float:
    """How long a refresh may wait for the token endpoint: half the shortest call timeout the entry sets (1 to 10 s).

    A call refused 401 waits for the refresh, then for the answer the server gives the refreshed token (or for the
    reconnect that says what to run): the refresh must end well inside the call's own deadline, or that deadline cuts a
    call that never ran and the model is told it may have."""
    shortest = min([spec.call.timeout_s, *(tool.call.timeout_s for tool in spec.tools.values())])
    return max(_REFRESH_MIN_S, min(_REFRESH_MAX_S, shortest / 2))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process for the refresh requests (building one costs ~30 ms of CPU)."""
    return httpx2.create_ssl_context()


@dataclass
class _Context(OAuthContext):
    """The SDK's context with expiry on breakwater's clock and a refresh margin."""

    clock: Clock = field(default_factory=SystemClock)

    def update_token_expiry(self, token: Any) -> None:
        lifetime = getattr(token, "expires_in", None)
        if lifetime is None:
            self.token_expiry_time = None
            return
        self.token_expiry_time = self.clock.time() + int(lifetime) - min(_MAX_MARGIN_S, int(lifetime) * _MARGIN_SHARE)

    def is_token_valid(self) -> bool:
        return bool(
            self.current_tokens
            and self.current_tokens.access_token
            and (not self.token_expiry_time or self.clock.time() <= self.token_expiry_time)
        )


class _NoSdkTraceback(logging.Filter):
    """The SDK logs a failed sign-in as "OAuth flow error" with its traceback, before raising it: every command
    (`call`, `status`, `serve`) printed that traceback. The failure itself reaches the user as one line (a server's
    error, naming what failed, or `auth login`'s message), so the record is dropped; "Invalid refresh response"
    keeps one line, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "OAuth flow error":
            return False
        if record.msg == "Invalid refresh response" and record.exc_info and record.exc_info[1] is not None:
            record.msg = f"Invalid refresh response: {str(record.exc_info[1]).splitlines()[0][:200]}"
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_sdk_tracebacks() -> None:
    """Install `_NoSdkTraceback` on the SDK's OAuth logger, once per process."""
    sdk = logging.getLogger("mcp.client.auth.oauth2")
    if not any(isinstance(f, _NoSdkTraceback) for f in sdk.filters):
        sdk.addFilter(_NoSdkTraceback())


def _needs_auth(response: httpx2.Response) -> bool:
    return response.status_code == 401 or (
        response.status_code == 403 and extract_field_from_www_auth(response, "error") == "insufficient_scope"
    )


class _StoredFlow(OAuthClientProvider):
    """The five changes of the module docstring, over any of the SDK's providers."""

    _spec: ServerSpec
    _tokens: ServerTokens
    _interactive: bool
    _on_auth_required: AuthRequiredNote | None
    _pinned_scope: str | None
    _loaded_at: Any
    _needed_scope: str | None
    _refresh_trouble: str | None
    _refresh_status: int | None
    _refresh_limit_s: float
    _clock: Clock
    _refresh_failed_at: float | None
    _answered: bool

    def _setup(
        self, spec: ServerSpec, tokens: ServerTokens, clock: Clock, *, interactive: bool, note: AuthRequiredNote | None
    ) -> None:
        _quiet_sdk_tracebacks()  # every provider is set up here, whichever command made it
        old = self.context
        self.context = _Context(**{f.name: getattr(old, f.name) for f in fields(old)}, clock=clock)
        self._spec = spec
        self._tokens = tokens
        self._interactive = interactive
        self._on_auth_required = note
        self._pinned_scope = spec.oauth.scopes if spec.oauth is not None else None
        self._loaded_at = None
        self._needed_scope = None
        #: What went wrong at the authorization server when the last refresh failed for its own reasons (a 5xx, a 429).
        self._refresh_trouble: str | None = None
        self._refresh_status: int | None = None
        self._refresh_limit_s = refresh_timeout_s(spec)
        self._clock = clock
        #: When (monotonic) the last refresh failed: calls queued behind it get their 401 at once, not one more wait.
        self._refresh_failed_at: float | None = None
        #: Whether a request on this connection got through: until then a refresh that fails is the connect's failure.
        self._answered = False

    async def _initialize(self) -> None:
        await super()._initialize()
        self._adopt_stored(self._tokens.record())

    def _adopt_stored(self, record: dict[str, Any]) -> None:
        """Expiry, metadata, and which write of `record` (just read) these tokens came from."""
        self._loaded_at = record.get("updated_at")
        self._needed_scope = self._tokens.needed_scope(record)
        expires_at = self._tokens.expires_at(record)
        tokens = self.context.current_tokens
        if expires_at is not None and tokens is not None:
            lifetime = float(tokens.expires_in or 0)
            self.context.token_expiry_time = expires_at - min(_MAX_MARGIN_S, lifetime * _MARGIN_SHARE)
        asm, prm = self._tokens.metadata(record)
        if self.context.oauth_metadata is None and asm is not None:
            self.context.oauth_metadata = asm
        if self.context.protected_resource_metadata is None and prm is not None:
            self.context.protected_resource_metadata = prm
            self.context.auth_server_url = str(prm.authorization_servers[0])

    async def _reload_if_signed_in_again(self) -> bool:
        """Tokens another process stored since these were loaded (a new `auth login`): take them."""
        # One read of the token file: every piece below comes from the same write.
        record = self._tokens.record()
        if record.get("updated_at") == self._loaded_at:
            return False
        self.context.current_tokens = await self._tokens.get_tokens(record)
        self.context.client_info = await self._tokens.get_client_info(record) or self.context.client_info
        self._adopt_stored(record)
        return self.context.current_tokens is not None

    async def _handle_token_response(self, response: httpx2.Response) -> None:
        await super()._handle_token_response(response)
        self._tokens.set_metadata(self.context.oauth_metadata, self.context.protected_resource_metadata)
        self._loaded_at = self._tokens.record().get("updated_at")

    async def _handle_refresh_response(self, response: httpx2.Response) -> bool:
        status = response.status_code
        if status >= 500 or status == 429:
            # The authorization server's trouble, not the grant's: the tokens stay (the SDK drops them on any answer
            # but 200, a still-valid access token too), and the user is not sent to sign in again for nothing.
            where = display_url(str(response.request.url))
            self._refresh_trouble = f"HTTP {status} from {where}"
            self._refresh_status = status
            return False
        self._refresh_trouble, self._refresh_status = None, None
        ok = await super()._handle_refresh_response(response)
        if not ok and 400 <= status < 500:
            self._tokens.set_refresh_refused()
        elif not ok and status == 200:
            # A 200 that is no token response (a proxy's page, a broken server): the server's trouble, not the grant's.
            self._refresh_trouble = f"an answer from {display_url(str(response.request.url))} that is no token response"
        self._loaded_at = self._tokens.record().get("updated_at")
        return ok

    async def _refresh_within(self) -> bool:
        """Refresh at the token endpoint, within `_refresh_limit_s` on the clock; whether it worked.

        A request of its own, not one yielded to the connection's client: a deadline cannot span the generator's
        `yield`, the connection's read timeout is minutes (for SSE streams), and the entry's headers (an API key for
        the MCP server) have no business at the authorization server. Before anything got through on this connection
        an endpoint where nothing listens is raised, as it was, for the connect to classify (`refused`, naming the
        endpoint); after it, or for any other failure (a hang: the connect classifier read the same-origin endpoint's
        timeout as the server's 401, "check the headers"), it is noted (`_give_up` says it) and the request stays
        refused: nothing ran."""
        request = await self._refresh_token()
        clock, limit = self._clock, self._refresh_limit_s
        response: httpx2.Response | None = None
        failure: httpx2.TransportError | None = None
        # Shielded from the request's own cancellation (a cut call aborts its POST): a refresh abandoned mid-way is
        # one the server may still have done, rotating the refresh token this process then never learned, and every
        # later refresh was refused: the sign-in lost for a call cut at the wrong moment. Its own bound still holds.
        with anyio.CancelScope(shield=True), clock.deadline_scope(clock.monotonic() + limit):
            try:
                async with httpx2.AsyncClient(verify=_tls_context(), timeout=limit) as http:
                    response = await http.send(request)
                    await response.aread()
            except httpx2.TransportError as exc:
                failure = exc
        if response is not None and failure is None:
            ok = await self._handle_refresh_response(response)
            self._refresh_failed_at = None if ok else clock.monotonic()
            return ok
        self._refresh_failed_at = clock.monotonic()
        unreachable = isinstance(failure, httpx2.ConnectError | httpx2.ConnectTimeout)
        if isinstance(failure, httpx2.ConnectError | httpx2.ConnectTimeout) and not self._answered:
            raise failure
        where = f"{self._spec.name}'s token endpoint {display_url(str(request.url))}"
        if failure is None:  # the deadline: it took the request and never answered
            self._refresh_trouble = f"{where} did not answer within {limit:g} s"
        elif unreachable:
            self._refresh_trouble = f"nothing answers at {where} ({type(failure).__name__})"
        else:
            self._refresh_trouble = f"{where} failed ({type(failure).__name__}: {failure})"
        self._refresh_status = None
        return False

    def _may_refresh(self) -> bool:
        """A refresh token, and no refresh failed within the last `_refresh_limit_s` (one wait is enough)."""
        failed = self._refresh_failed_at
        recent = failed is not None and self._clock.monotonic() - failed < self._refresh_limit_s
        return not recent and self.context.can_refresh_token()

    async def _perform_authorization(self) -> httpx2.Request:
        if self._pinned_scope:
            self.context.client_metadata.scope = self._pinned_scope
        return await super()._perform_authorization()

    def _access_token(self) -> str | None:
        tokens = self.context.current_tokens
        return tokens.access_token if tokens is not None else None

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        # The gate's attempt, if this is its request: held until it has its token, told when it is refused (`_unsent`).
        # Not over legacy SSE: its writer posts one message at a time (a cut's gate waits behind the refresh) and stops
        # at an error status (the 401 kept).
        mine = watched(request) if self._spec.transport != "sse" else None
        held(mine)
        blocked, sent = await self._sign(request, mine)
        if not may_send(mine):
            request.extensions[NOT_SENT] = True  # its attempt was cut while it waited, and told it was not sent
            yield request  # the transport answers it without sending it
            return
        response = yield request
        noted(mine, response, _needs_auth(response))
        if blocked:
            # A call needed more scope than the sign-in granted, and no one is here to grant it:
            # the whole server waits for `auth login` rather than failing call after call.
            self._give_up(response, step_up=True)
            return
        if not _needs_auth(response):
            self._answered = True
            return
        waiting_for(mine, self._waiting_text(response), self._refresh_limit_s)
        async with self.context.lock:
            if response.status_code == 401:
                # Someone refreshed meanwhile, or signed in again; else the refresh token; then a person.
                newer = self.context.is_token_valid() and self._access_token() != sent
                fresh = (newer or await self._reload_if_signed_in_again()) and self.context.is_token_valid()
                if fresh or (self._may_refresh() and await self._refresh_within()):
                    self._add_auth_header(request)
                    if not may_send(mine):
                        return  # its attempt was cut meanwhile, and told the call was not sent: the 401 stays the answer
                    response = yield request
                    noted(mine, response, _needs_auth(response))
                # Else the 401 is the answer: the server refused the request, so nothing ran, and `_give_up` says why.
            if not _needs_auth(response):
                self._answered = True
                return
            if not self._interactive:
                self._give_up(response)
                return
        # Someone can sign in (auth login), or no one needs to (client credentials): the SDK's flow.
        flow = super()._auth_flow(request)
        pending: httpx2.Response | None = response
        try:
            outgoing = await flow.__anext__()
            while True:
                if outgoing is request and pending is not None:
                    answer, pending = pending, None  # the SDK sends the request first: it was just answered
                elif outgoing is request:
                    if not may_send(mine):
                        return  # as above: its attempt was cut while the sign-in ran, and told the call was not sent
                    answer = yield request
                    noted(mine, answer, _needs_auth(answer))
                else:
                    answer = yield self._rewrite_discovery(outgoing)
                outgoing = await flow.asend(answer)
        except StopAsyncIteration:
            return
        except Exception as exc:
            if self._on_auth_required is None:
                raise
            self._on_auth_required(f"the sign-in failed ({type(exc).__name__}: {exc}); check the entry's oauth settings")
        finally:
            # Closed here, in this task: left to the garbage collector, the SDK's flow (suspended in its lock when a
            # request it yielded failed, e.g. an authorization server that is down) released the lock from another
            # task, and printed "Task exception was never retrieved ... not holding this lock".
            await flow.aclose()

    def _waiting_text(self, response: httpx2.Response) -> str:
        """What a request refused with `response` waits for before it is sent again, for the gate's message."""
        if response.status_code == 403:
            return "breakwater was asking the authorization server for more permission"
        return self._refresh_text()

    def _refresh_text(self) -> str:
        return f"a new token was being obtained from {self._spec.name}'s token endpoint {display_url(self._get_token_endpoint())}"

    async def _sign(self, request: httpx2.Request, mine: Refusal | None) -> tuple[bool, str | None]:
        """Before the first send, under the token lock: `request` signed with a valid token, refreshed if it expired
        (`mine`, the gate's attempt, is told what it waits for); (blocked by a pending step-up?, the token sent)."""
        # The lock guards the token state, never a request in flight: held across `yield request` (as
        # the SDK does), one slow call on a JSON-response server would hold every other call back.
        async with self.context.lock:
            if not self._initialized:
                await self._initialize()
            self.context.protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
            blocked = not self._interactive and self._step_up_pending()
            if not blocked and self.context.current_tokens is not None and not self.context.is_token_valid():
                await self._reload_if_signed_in_again()  # another process may have refreshed already
            if not blocked and not self.context.is_token_valid() and self._may_refresh():
                waiting_for(mine, self._refresh_text(), self._refresh_limit_s)
                await self._refresh_within()
            sent = self._access_token() if self.context.is_token_valid() and not blocked else None
            if sent is not None:
                self._add_auth_header(request)
        return blocked, sent

    def _rewrite_discovery(self, outgoing: httpx2.Request) -> httpx2.Request:
        url = self._spec.oauth.auth_server_metadata_url if self._spec.oauth is not None else None
        if url and outgoing.method == "GET" and any(p in outgoing.url.path for p in _ASM_PATHS):
            return httpx2.Request("GET", url, headers=outgoing.headers)
        return outgoing

    def _step_up_pending(self) -> bool:
        needed = self._needed_scope
        if not needed:
            return False
        granted = self.context.current_tokens.scope if self.context.current_tokens else None
        return not set(needed.split()) <= set((granted or "").split())

    def _give_up(self, response: httpx2.Response, *, step_up: bool = False) -> None:
        """No person to sign in: say what to run, remember a step-up's scope for that sign-in."""
        command = login_command(self._spec.name)
        status: int | None = None
        trouble = False
        if step_up or response.status_code == 403:
            status = 403
            wanted = self._needed_scope
            if not step_up:
                granted = self.context.current_tokens.scope if self.context.current_tokens else None
                wanted = union_scopes(granted, extract_scope_from_www_auth(response))
                if wanted:
                    self._tokens.set_needed_scope(wanted)
                    self._needed_scope = wanted
            message = f"the server needs more permission ({wanted or 'insufficient_scope'}): run `{command}` to grant it"
        elif self._refresh_trouble is not None:
            status, trouble = self._refresh_status, True
            message = (
                f"the authorization server could not refresh the sign-in ({self._refresh_trouble}); breakwater tries "
                f"again, and the sign-in is kept (run `{command}` only if this persists)"
            )
        elif self._tokens.record().get("tokens") is None:
            message = f"not signed in: run `{command}`"
        else:
            message = f"the sign-in expired or was revoked and could not be refreshed: run `{command}`"
        if self._on_auth_required is not None and (step_up or self._looks_oauth(response)):
            self._on_auth_required(AuthNote(message, http_status=status, server_trouble=trouble))

    def _looks_oauth(self, response: httpx2.Response) -> bool:
        challenge = response.headers.get("www-authenticate", "")
        return self._spec.oauth is not None or bool(self._tokens.record()) or challenge.lower().startswith("bearer")
