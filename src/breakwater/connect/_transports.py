"""The transport seam: how one connect attempt reaches its server.

`Upstream` asks a `TransportFactory` for each attempt's transport and hands what it gets to
`mcp.Client`; it never needs to know which kind it is. `default_transports` builds what the config
says (a stdio process, SSE, streamable HTTP behind the cut-tolerant wrapper); tests hand the
supervisor an in-process server instead (`breakwater.testing.in_memory`), so the real supervisor,
gate and gateway run without subprocesses.

Besides the transport, an attempt needs to see a few things only the transport knows, to explain a
failure and to finish the handshake: the process (exit code, stderr tail, exit watch), the last HTTP
error status, and when to arm the cut-tolerant wrapper. An `OpenedTransport` carries them.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Protocol, TypeAlias

import httpx2
from mcp.client import Transport
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer

from breakwater._clock import Clock, SystemClock
from breakwater.auth import ServerTokens, TokenStore, build_provider
from breakwater.config import ServerSpec
from breakwater.connect._environment import inherited
from breakwater.connect._headers_helper import HeadersHelperAuth
from breakwater.connect._http_cut import CUT_KEY, CutTolerantTransport
from breakwater.connect._in_flight import InFlightClient
from breakwater.connect._stdio import StdioProcess

__all__ = ["ClientTarget", "OpenedTransport", "TransportFactory", "default_transports", "oauth_for", "stdio_transport"]

# The SDK's own defaults (mcp.shared._httpx_utils): connect/write/pool 30 s, read 300 s for SSE streams.
HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0

#: What `mcp.Client` connects through: a transport (an async context manager of read and write
#: streams), or an SDK server object to run in-process.
ClientTarget: TypeAlias = Transport | Server[Any] | MCPServer[Any]


class OpenedTransport:
    """One attempt's transport, and what the attempt may learn from it."""

    def __init__(
        self,
        target: ClientTarget,
        *,
        process: StdioProcess | None = None,
        on_ready: Callable[[], None] | None = None,
        drained: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`target` is what `mcp.Client` is given. `process` is the stdio process,
        when there is one (its exit ends the connection and explains failures). `on_ready` runs once
        the handshake is done and the attempt deadline lifted. `drained` returns once no request awaits its
        answer: a connection whose sign-in ended waits for it before it closes (`_in_flight`)."""
        self.target = target
        self.drained = drained
        self.process = process
        self._on_ready = on_ready
        #: The last HTTP error status (>= 400) a response carried; the best explanation of a failed handshake.
        self.http_status: int | None = None
        #: Why the server cannot be used until someone signs in (names `breakwater auth login NAME`).
        self.auth_required: str | None = None

    def ready(self) -> None:
        """The handshake is done: the connection is in service from now on."""
        if self._on_ready is not None:
            self._on_ready()

    async def settle(self, clock: Clock, within_s: float) -> None:
        """Before the connection closes: if its sign-in ended, let the requests in flight on it get their answers (a
        refusal for the same token, or the result of a call the server had taken), within `within_s`. Closed under
        them, each was told OUTCOME_UNKNOWN ("it may have run"). Any other loss leaves them nothing to wait for."""
        if self.auth_required is not None and self.drained is not None:
            with clock.deadline_scope(clock.monotonic() + within_s):
                await self.drained()

    async def record_status(self, response: httpx2.Response) -> None:
        """An httpx response hook: remember error statuses (not the ones the cut-tolerant wrapper made up)."""
        if response.status_code >= 400 and CUT_KEY not in response.extensions:
            self.http_status = response.status_code


class TransportFactory(Protocol):
    """Builds one connect attempt's transport for `spec`.

    Resources the transport needs beyond its own context (an httpx client) go on `stack`, which
    the attempt closes when the connection ends. `report_lost` tells the supervisor the connection
    is gone when the transport learns it first (an HTTP server that became unreachable).
    """

    async def __call__(self, spec: ServerSpec, stack: AsyncExitStack, *, report_lost: Callable[[], None]) -> OpenedTransport: ...


def stdio_transport(spec: ServerSpec, *, inherit: Mapping[str, str] | None = None, cwd: str | None = None) -> OpenedTransport:
    """`spec`'s process: its entry's `env` over `inherit` (default: this process's environment) as `[connect]
    inherit_env` keeps it, in its entry's `cwd`, else in `cwd` (default: this process's)."""
    process = StdioProcess(
        spec.command or "",
        spec.args,
        env=dict(spec.env),
        inherit=inherited(spec, inherit),
        cwd=spec.cwd or cwd,
        name=spec.name,
        max_line_bytes=spec.call.max_result_bytes,
    )
    return OpenedTransport(process.open(), process=process)


async def default_transports(spec: ServerSpec, stack: AsyncExitStack, *, report_lost: Callable[[], None]) -> OpenedTransport:
    """What the config asks for: a stdio process, an SSE stream, or streamable HTTP (cut-tolerant)."""
    if spec.transport == "stdio":
        return stdio_transport(spec)
    auth = HeadersHelperAuth(spec, clock=SystemClock()) if spec.headers_helper else None
    if spec.transport == "sse":
        return _sse(spec, auth, report_lost)
    # Unarmed until the handshake is done: connect failures must reach the classifier as they are.
    cut_tolerant = CutTolerantTransport(
        httpx2.AsyncHTTPTransport(verify=_tls_context()), on_unreachable=report_lost, max_body_bytes=spec.call.max_result_bytes
    )

    def arm() -> None:
        cut_tolerant.armed = True

    async def record_status(response: httpx2.Response) -> None:
        await opened.record_status(response)  # bound below, before the first request can answer

    def auth_required(message: str) -> None:
        opened.auth_required = message
        if cut_tolerant.armed:
            report_lost()  # a ready connection whose sign-in ended: reconnect, and fail as auth_required

    http_client = InFlightClient(
        headers=dict(spec.headers),
        timeout=httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S),
        transport=cut_tolerant,
        event_hooks={"response": [record_status]},
        # A headersHelper owns the entry's credentials; OAuth signs in only the servers without one.
        auth=auth if auth is not None else oauth_for(spec, auth_required),
    )
    await stack.enter_async_context(http_client)
    # The SDK's own cap on one SSE event is 1 MiB; the result-size limit is the one that applies
    # (the SDK's overflow error is classified RESULT_TOO_LARGE).
    transport = streamable_http_client(spec.url or "", http_client=http_client, max_sse_event_size=spec.call.max_result_bytes)
    opened = OpenedTransport(transport, on_ready=arm, drained=http_client.drained)
    return opened


def _sse(spec: ServerSpec, helper: httpx2.Auth | None, report_lost: Callable[[], None]) -> OpenedTransport:
    """The legacy HTTP+SSE transport (`"type": "sse"`): the SDK's client, with breakwater's TLS and status record,
    and the same sign-in as streamable HTTP (a headersHelper, else OAuth on the stored tokens)."""
    in_service = False

    async def record_status(response: httpx2.Response) -> None:
        await opened.record_status(response)

    def ready() -> None:
        nonlocal in_service
        in_service = True

    def auth_required(message: str) -> None:
        opened.auth_required = message
        if in_service:
            report_lost()  # a ready connection whose sign-in ended: reconnect, and fail as auth_required

    auth = helper if helper is not None else oauth_for(spec, auth_required)

    def client_factory(
        headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None, auth: httpx2.Auth | None = None
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            headers=headers,
            timeout=timeout if timeout is not None else httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S),
            auth=auth,
            verify=_tls_context(),
            event_hooks={"response": [record_status]},
        )

    target = sse_client(
        spec.url or "",
        headers=dict(spec.headers),
        timeout=HTTP_TIMEOUT_S,
        sse_read_timeout=HTTP_READ_TIMEOUT_S,
        httpx_client_factory=client_factory,
        auth=auth,
    )
    opened = OpenedTransport(target, on_ready=ready)
    return opened


def oauth_for(spec: ServerSpec, on_auth_required: Callable[[str], None]) -> httpx2.Auth | None:
    """The SDK's OAuth client on the stored tokens (never a browser), unless the entry sends its own
    `Authorization` header. A server that never asks for OAuth costs one read of the token file."""
    if any(key.lower() == "authorization" for key in spec.headers):
        return None
    tokens = ServerTokens.for_server(TokenStore(), spec)
    return build_provider(spec, tokens, on_auth_required=on_auth_required)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process: building one (the OS trust store) costs ~30 ms of CPU, which a
    storm of hundreds of connects would pay again and again."""
    return httpx2.create_ssl_context()
