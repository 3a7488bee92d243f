"""The gateway over HTTP: the MCP endpoint with bearer auth and Host/Origin checks, beside the web routes."""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from mcp_types import UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import MODERN_PROTOCOL_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS

from breakwater.config._checks import LOOPBACK_HOSTS as LOOPBACK_HOSTS  # importable from here as before
from breakwater.config._redact import register_secrets
from breakwater.gateway._drain import DrainGuard, end_get_streams, set_sse_keepalive
from breakwater.gateway._fast_call import install as install_fast_calls
from breakwater.gateway._fast_http import answer_fast
from breakwater.gateway._lazy_sse import answer_lazily
from breakwater.gateway._metrics import CallCounter, Metrics
from breakwater.gateway._modern_http import serve_modern_calls
from breakwater.gateway._one_write import whole_responses
from breakwater.gateway._resume import ResumableStreams
from breakwater.gateway._server import Gateway
from breakwater.gateway._sessions import roaming_app

if TYPE_CHECKING:
    from breakwater.state._sessions import SessionStore
    from breakwater.state._streams import StreamLog

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


class BearerAuth:
    """ASGI middleware: every request must carry `Authorization: Bearer <token>`."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import hmac

        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if not hmac.compare_digest(headers.get(b"authorization", b""), self._expected):
                body = b'{"error": "missing or wrong bearer token"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _normalise_authorization(value: bytes) -> bytes:
    # RFC 7235: the auth scheme is case-insensitive, and one or more spaces may follow it.
    scheme, _, credentials = value.strip().partition(b" ")
    if scheme.lower() == b"bearer" and credentials.strip():
        return b"Bearer " + credentials.strip()
    return value


#: Headers whose values the SDK's server compares as written, though they are case-insensitive (RFC 9110 §4.2.3,
#: §8.3.1): `Host: LOCALHOST:8080` was refused 421 and `Content-Type: Application/JSON` 415.
_CASELESS = (b"host", b"origin", b"content-type", b"accept")


def _cased(headers: dict[bytes, bytes]) -> bool:
    """Whether a header of `_CASELESS` holds capitals."""
    return any((value := headers.get(name)) is not None and value != value.lower() for name in _CASELESS)


def _normalise(name: bytes, value: bytes) -> bytes:
    if name in _CASELESS:
        return value.lower()
    return _normalise_authorization(value) if name == b"authorization" else value


def _split_host(value: str) -> tuple[str, str | None]:
    """(host, port or None) of a Host header or an Origin's authority, loopback names folded into one."""
    host, port = value, None
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif value.count(":") == 1:
        host, port = value.split(":")
    host = host.lower()
    return ("loopback" if host in LOOPBACK_HOSTS else host), port


class RequestGuard:
    """ASGI middleware in front of every route: a lower-case `bearer` scheme is accepted, a cross-port Origin is not.

    The SDK's Origin check allows any port of an allowed host, so a page served by another program
    on this machine (`http://127.0.0.1:1`) could drive the gateway from a browser. An Origin naming
    the same host as the request's `Host` must also name its port, unless it is in `allowed_origins`.
    """

    def __init__(self, app: Any, allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self._allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)

    def _cross_port(self, headers: dict[bytes, bytes]) -> bool:
        origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/")
        host = headers.get(b"host", b"").decode("latin-1")
        if not origin or origin == "null" or origin in self._allowed or "://" not in origin:
            return False
        o_host, o_port = _split_host(origin.split("://", 1)[1])
        h_host, h_port = _split_host(host)
        # A Host without a port (a proxy in front) cannot be compared; a different host is the SDK's to judge.
        return o_host == h_host and h_port is not None and o_port != h_port

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw = list(scope.get("headers") or [])
            headers = dict(raw)
            if self._cross_port(headers):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error": "Origin names another port of this host"}'})
                return
            version = headers.get(b"mcp-protocol-version")
            if version is not None and version not in _SUPPORTED and b"mcp-session-id" in headers:
                # The SDK took the session's request for a 2026-07-28 one and answered that `_meta` lacked its envelope.
                await _unsupported_version(version, send)
                return
            if b"authorization" in headers or _cased(headers):
                raw = [(k, _normalise(k, v)) for k, v in raw]
                scope = {**scope, "headers": raw}
            send = whole_responses(send)
            if b"mcp-session-id" not in headers and version not in _MODERN:  # (2026-07-28 requests have no session)
                send = _no_session_on_refusals(send)
        await self.app(scope, receive, send)


_SUPPORTED = frozenset(v.encode() for v in SUPPORTED_PROTOCOL_VERSIONS)
_MODERN = frozenset(v.encode() for v in MODERN_PROTOCOL_VERSIONS)


async def _unsupported_version(version: bytes, send: Any) -> None:
    """400, the SDK's UNSUPPORTED_PROTOCOL_VERSION error with its `data` (what is supported, what was asked)."""
    requested = version.decode("latin-1")
    message = f"Unsupported protocol version {requested!r} in MCP-Protocol-Version; send the one this session negotiated"
    error = {"code": UNSUPPORTED_PROTOCOL_VERSION, "message": message}
    error["data"] = {"supported": list(SUPPORTED_PROTOCOL_VERSIONS), "requested": requested}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _no_session_on_refusals(send: Any) -> Any:
    """`send`, dropping the `Mcp-Session-Id` of an error answer to a request that carried none.

    The SDK's transport names the session it made for the request in every answer, its refusals too: a POST without a
    session was refused 400 "Missing session ID" with a new id that no session has (404 when used).
    """

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            kept = [(k, v) for k, v in message.get("headers") or () if k.lower() != b"mcp-session-id"]
            message = {**message, "headers": kept}
        await send(message)

    return sending


def http_app(
    gateway: Gateway,
    *,
    host: str,
    token: str | None,
    allowed_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    metrics: Metrics | None = None,
    json_response: bool = False,
    sessions: SessionStore | None = None,
    streams: StreamLog | None = None,
) -> Any:
    """The gateway's streamable-HTTP ASGI app, with Host/Origin checks and, when given, a bearer token.

    Beside `/mcp` it serves `/healthz`, `/readyz`, `/metrics` and the status page (`breakwater.gateway._web`).
    Pass the `Metrics` the gateway's `Breakwater` observes (`observers=[metrics]`) for attempt
    counts; whole calls are counted here either way. With `sessions` (Redis), any replica serves a
    2025-11-25 session another one created; with `streams` (Redis), any replica resumes a call's
    cut SSE stream (else only this one: `breakwater.gateway._resume`).
    """
    from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE

    from breakwater.gateway._http_frames import FrameErrors
    from breakwater.gateway._web import WebApp, gateway_resolver

    security = _security(host, allowed_hosts, allowed_origins)
    # json_response: a 2025-11-25 POST is answered with one JSON body, not an SSE stream (what
    # mcp-proxy does; measurably faster), and nothing can reach that client mid-call.
    idle_s = gateway.policy.session_ttl_s
    if sessions is not None:
        # 2025-11-25 sessions in Redis, so any replica serves them (breakwater.gateway._sessions).
        sdk_app = roaming_app(
            gateway.server,
            store=sessions,
            security=security,
            json_response=json_response,
            idle_timeout_s=idle_s,
            subscriptions=gateway.passthrough.subscriptions,
        )
    else:
        sdk_app = gateway.server.streamable_http_app(
            host=host, transport_security=security, json_response=json_response, session_idle_timeout=idle_s
        )
    app = FrameErrors(sdk_app, max_body_bytes=DEFAULT_MAX_REQUEST_BODY_SIZE)  # malformed requests: the spec's errors
    policy = gateway.policy
    # A call POST whose head the stack accepted before skips it (_known_heads), except for roaming
    # sessions: their manager renews the session's record in Redis on every request.
    route_drain = gateway.drain if sessions is None else None
    resumable: ResumableStreams | None = None
    if not json_response:
        resumable = _resumable(gateway, streams)
        # A POST with nothing to stream before its answer gets one JSON body, not an SSE stream (_lazy_sse);
        # one that streams can be resumed with Last-Event-ID (_resume).
        answer_lazily(
            gateway.server.session_manager,
            gateway.bw.clock,
            keepalive_s=policy.sse_keepalive_s,
            streams=resumable,
            drain=route_drain,
        )
        install_fast_calls(gateway.server)  # a session's plain tools/call runs in its POST's task (_lazy_call)
    else:
        # A plain tools/call POST runs in its own task, without the session's memory streams (_fast_http).
        answer_fast(gateway.server.session_manager, gateway.server, drain=route_drain)
    # A 2026-07-28 tools/call POST runs its handler in its own task, with one watcher beside (_modern_http).
    serve_modern_calls(gateway.server.session_manager, gateway.bw.clock, drain=route_drain)
    metrics = metrics if metrics is not None else Metrics()
    metrics.streams = resumable
    metrics.sessions = partial(len, gateway.server.session_manager._server_instances)
    # One call counter per server: a second app over the same gateway replaces it, never counts twice.
    gateway.server.middleware[:] = [m for m in gateway.server.middleware if not isinstance(m, CallCounter)]
    gateway.server.middleware.append(metrics.middleware(gateway_resolver(gateway)))
    register_secrets([token] if token else [])  # the gateway's own token is redacted like any configured secret
    set_sse_keepalive(policy.sse_keepalive_s)
    gateway.drain.on_done.append(lambda: end_get_streams(gateway.server.session_manager))
    guarded = DrainGuard(app, gateway.drain)
    mcp_app = BearerAuth(guarded, token) if token else guarded
    return RequestGuard(WebApp(gateway, mcp_app, security=security, token=token, metrics=metrics), allowed_origins)


def _resumable(gateway: Gateway, streams: StreamLog | None) -> ResumableStreams | None:
    """Resumable SSE streams on `streams` (Redis) or on a log of this replica's own; None when turned off."""
    policy = gateway.policy
    if policy.resume_events <= 0:
        return None
    from breakwater.state._streams import memory_stream_log

    # Without `streams` (a library caller's app) nothing sweeps this log: it is purged at each write, within its bounds.
    log = streams or memory_stream_log(policy, gateway.bw.clock)
    resumable = ResumableStreams(log, clock=gateway.bw.clock, ttl_s=policy.resume_ttl_s, resolve=gateway.resolve)
    # Replayed streams end with the drain, so their clients reconnect to a replica still serving.
    gateway.drain.on_done.append(resumable.end_followers)
    return resumable


def _security(host: str, allowed_hosts: Sequence[str], allowed_origins: Sequence[str]) -> Any:
    """The SDK's DNS-rebinding settings: loopback names always, the listen address's names and --allowed-host beside."""
    from mcp.server.transport_security import TransportSecuritySettings

    # With a port and without: a local reverse proxy that passes `Host $host` sends none, and was refused 421.
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"]
    origins = [
        "http://127.0.0.1:*",
        "http://localhost:*",
        "http://[::1]:*",
        "http://127.0.0.1",
        "http://localhost",
        "http://[::1]",
    ]
    if host not in LOOPBACK_HOSTS:
        names = [name.lower() for name in (host, *allowed_hosts)]
        if host in WILDCARD_HOSTS:
            # Nobody sends `Host: 0.0.0.0`: clients name the machine. More names (a load balancer's,
            # a pod IP) come from --allowed-host.
            names += [socket.gethostname(), socket.getfqdn()]
        for name in dict.fromkeys(names):
            bracketed = f"[{name}]" if ":" in name else name
            hosts += [bracketed, f"{bracketed}:*"]
            origins += [f"http://{bracketed}", f"http://{bracketed}:*", f"https://{bracketed}", f"https://{bracketed}:*"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[*origins, *(o.lower() for o in allowed_origins)],
    )
