"""The gateway over HTTP: the MCP endpoint with bearer auth and Host/Origin checks, beside the web routes."""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Sequence
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from mcp_types import HEADER_MISMATCH, INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import MODERN_PROTOCOL_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS

from breakwater.config._checks import LOOPBACK_HOSTS as LOOPBACK_HOSTS  # importable from here as before
from breakwater.config._redact import register_secrets
from breakwater.gateway._drain import DrainGuard, end_get_streams, set_sse_keepalive
from breakwater.gateway._fast_call import install as install_fast_calls
from breakwater.gateway._fast_http import answer_fast
from breakwater.gateway._frames import limit_repeats
from breakwater.gateway._lazy_sse import answer_lazily
from breakwater.gateway._metrics import CallCounter, Metrics
from breakwater.gateway._modern_http import serve_modern_calls
from breakwater.gateway._one_write import whole_responses
from breakwater.gateway._resume import ResumableStreams
from breakwater.gateway._server import Gateway
from breakwater.gateway._sessions import bound_sessions, roaming_app

if TYPE_CHECKING:
    from breakwater.state._sessions import SessionStore
    from breakwater.state._streams import StreamLog

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})

log = logging.getLogger("breakwater.gateway.http")
limit_repeats(log, by_message=True)  # one line per Host refused, then at the 10th, 100th...


#: What a request without the gateway's token is answered (HTTP 401): a JSON-RPC error, which MCP clients show as they
#: show a server's error (the SDK's relays its message; it read `{"error": ...}` as "Server returned an error
#: response"). Its id is null: the request's body is not read before the token is checked.
_UNAUTHORIZED = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32001,
            "message": "missing or wrong bearer token: this breakwater gateway wants the token it was started with "
            "(its --token or BREAKWATER_TOKEN) as Authorization: Bearer TOKEN",
        },
    }
).encode()


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
                body = _UNAUTHORIZED
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
    """ASGI middleware in front of every route: the checks of a request's head that the SDK's leave out or word badly.

    * Host. One `Host` header (RFC 9112 §3.2: two are a 400; this guard read the last, the SDK the first), naming
      this gateway (the SDK's list, `_security`): else a 421 that says which `--allowed-host` to add. On `0.0.0.0`
      or `::` an address of this machine's own is accepted too (`_own_address`).
    * Origin. The SDK's Origin check allows any port of an allowed host, so a page served by another program
      on this machine (`http://127.0.0.1:1`) could drive the gateway from a browser. An Origin naming
      the same host as the request's `Host` must also name its port, unless it is in `allowed_origins`.
    * `MCP-Protocol-Version` naming a version no one supports: -32022 with what is supported (the SDK took it for a
      2026-07-28 request and answered that its `_meta` lacked the envelope).
    * A lower-case `bearer` scheme and capitals in case-insensitive headers are accepted.

    Every refusal on `/mcp` is a JSON-RPC error (id null), as the SDK's own are there.
    """

    def __init__(self, app: Any, allowed_origins: Sequence[str] = (), *, security: Any = None, wildcard: bool = False) -> None:
        self.app = app
        self._allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        #: The SDK's `TransportSecuritySettings` the routes check Host and Origin against (None: no Host check here).
        self._security = security
        self._wildcard = wildcard
        #: This machine's addresses clients used as Host (on a wildcard bind), learnt into `_security`.
        self._own: set[str] = set()

    def _cross_port(self, headers: dict[bytes, bytes]) -> bool:
        origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/")
        host = headers.get(b"host", b"").decode("latin-1")
        if not origin or origin == "null" or origin in self._allowed or "://" not in origin:
            return False
        o_host, o_port = _split_host(origin.split("://", 1)[1])
        h_host, h_port = _split_host(host)
        # A Host without a port (a proxy in front) cannot be compared; a different host is the SDK's to judge.
        return o_host == h_host and h_port is not None and o_port != h_port

    def _refused(self, scope: Any, raw: list[tuple[bytes, bytes]], headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        """(status, message) of a request this guard refuses by its head; None to pass it on."""
        hosts = [value for name, value in raw if name == b"host"]
        if len(hosts) > 1:
            return 400, "Bad Request: more than one Host header (RFC 9112 section 3.2); send one"
        if hosts and scope.get("path") != "/healthz" and not self._host_allowed(hosts[0].decode("latin-1").lower()):
            return 421, self._misdirected(hosts[0].decode("latin-1"))
        if self._cross_port(headers):
            return 403, "Forbidden: the Origin names another port of this host: a page served there may not drive this gateway"
        return None

    def _host_allowed(self, host: str) -> bool:
        """Whether the routes' Host check (the SDK's rules) passes `host`; a wildcard bind also learns its own addresses."""
        security = self._security
        if security is None or _listed(host, security.allowed_hosts):
            return True
        if not self._wildcard or len(self._own) >= _OWN_ADDRESSES_MAX or (address := _own_address(host)) is None:
            return False
        # An address, not a name: DNS rebinding needs a name the attacker controls, so an address of this machine
        # is as safe to answer as its host name. Learnt into the SDK's lists, which the routes check next.
        self._own.add(address)
        security.allowed_hosts += [address, f"{address}:*"]
        security.allowed_origins += [f"{scheme}://{address}{port}" for scheme in ("http", "https") for port in ("", ":*")]
        return True

    def _misdirected(self, host: str) -> str:
        name, _ = _split_host(host)
        name = name.strip("[]")[:100]
        shown = f"[{name}]" if ":" in name else name
        message = (
            f"Misdirected Request: this gateway does not answer to the Host {host[:100]!r} (DNS-rebinding protection); "
            f"if clients reach it by that name, start it with --allowed-host {shown}"
        )
        log.warning(
            "refused a request for Host %r (421); if clients reach the gateway by that name, start it with --allowed-host %s",
            host[:100],
            shown,
        )
        return message

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw = list(scope.get("headers") or [])
            headers = dict(raw)
            mcp = scope.get("path") == "/mcp"
            refused = self._refused(scope, raw, headers)
            if refused is not None:
                await _refuse(send, *refused, mcp=mcp)
                return
            version = headers.get(b"mcp-protocol-version")
            if version is not None and version not in _SUPPORTED:
                # Without a session the SDK took the request for a 2026-07-28 one and answered that `_meta` lacked its
                # envelope; with one, the same.
                await _unsupported_version(version, send, session=headers.get(b"mcp-session-id"))
                return
            if b"authorization" in headers or _cased(headers):
                raw = [(k, _normalise(k, v)) for k, v in raw]
                scope = {**scope, "headers": raw}
            send = whole_responses(send)
            if b"mcp-session-id" not in headers and version not in _MODERN:  # (2026-07-28 requests have no session)
                send = _no_session_on_refusals(send)
            if mcp:
                send = _json_rpc_refusals(send)
                if version in _MODERN:
                    send = _missing_headers(send, headers)
        await self.app(scope, receive, send)


_SUPPORTED = frozenset(v.encode() for v in SUPPORTED_PROTOCOL_VERSIONS)
_MODERN = frozenset(v.encode() for v in MODERN_PROTOCOL_VERSIONS)
#: At most this many addresses of its own a wildcard listener learns (a host with `ip_nonlocal_bind` binds any).
_OWN_ADDRESSES_MAX = 64


def _listed(host: str, allowed: Sequence[str]) -> bool:
    """The SDK's Host rule (`TransportSecurityMiddleware._validate_host`), without its log line: listed, or `name:*`."""
    return host in allowed or any(entry.endswith(":*") and host.startswith(entry[:-1]) for entry in allowed)


def _own_address(host: str) -> str | None:
    """`host`'s address as a Host header writes it (`192.0.2.2`, `[fd00::2]`) if it is an address of this machine."""
    import ipaddress

    name, _ = _split_host(host)
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None  # a name: only the listed ones are answered
    if address.is_unspecified or address.is_multicast:
        return None
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))  # only an address of one of this machine's interfaces binds
    except OSError:
        return None
    return f"[{address}]" if address.version == 6 else str(address)


async def _refuse(send: Any, status: int, message: str, *, mcp: bool) -> None:
    """A refusal as the route answers: a JSON-RPC error with id null on `/mcp`, `{"error": ...}` on the others."""
    if mcp:
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}).encode()
    else:
        body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _unsupported_version(version: bytes, send: Any, *, session: bytes | None) -> None:
    """400, the SDK's UNSUPPORTED_PROTOCOL_VERSION error with its `data` (what is supported, what was asked)."""
    requested = version.decode("latin-1")[:100]
    fix = "send the one this session negotiated" if session is not None else "send one of data.supported"
    message = f"Unsupported protocol version {requested!r} in MCP-Protocol-Version; {fix}"
    error = {"code": UNSUPPORTED_PROTOCOL_VERSION, "message": message}
    error["data"] = {"supported": list(SUPPORTED_PROTOCOL_VERSIONS), "requested": requested}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if session is not None:
        headers.append((b"mcp-session-id", session))  # as the session's other errors carry it
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


#: The SDK's 2026-07-28 words for a routing header that differs from the body, said of one that is absent too.
_MISMATCH = re.compile(r"(\S+) header does not match the request (?:body|envelope)'s (.+)")


def _missing_headers(send: Any, headers: dict[bytes, bytes]) -> Any:
    """`send`, saying of a 2026-07-28 routing header (`Mcp-Method`, `Mcp-Name`, ...) that was not sent that it is
    missing: the SDK's HEADER_MISMATCH said it "does not match the request body's method"."""
    held: list[Any] = []

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start" and message["status"] == 400:
            held[:] = [message, b""]
            return
        if held and message["type"] == "http.response.body":
            held[1] += message.get("body", b"")
            if message.get("more_body"):
                return
            start, body = held
            held.clear()
            body = _said_missing(body, headers)
            kept = [(k, v) for k, v in start.get("headers") or () if k.lower() != b"content-length"]
            await send({**start, "headers": [*kept, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return sending


def _said_missing(body: bytes, headers: dict[bytes, bytes]) -> bytes:
    try:
        answer = json.loads(body)
        error = answer["error"]
        found = _MISMATCH.fullmatch(error["message"]) if error["code"] == HEADER_MISMATCH else None
    except (ValueError, KeyError, TypeError):
        return body
    if found is None or found.group(1).lower().encode("latin-1") in headers:
        return body
    name, what = found.groups()
    error["message"] = f"{name} header is missing; send it, holding the request's {what}"
    return json.dumps(answer).encode()


def _json_rpc_refusals(send: Any) -> Any:
    """`send`, turning a refusal on `/mcp` that is not JSON (the SDK's plain-text 403 "Invalid Origin header", an empty
    405) into a JSON-RPC error with id null and the same words, as the endpoint's other refusals are."""
    held: list[Any] = []

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            kinds = [v for k, v in message.get("headers") or () if k.lower() == b"content-type"]
            if not kinds or not kinds[0].lower().startswith(b"application/json"):
                held.append(message)
                held.append(b"")
                return
        if held and message["type"] == "http.response.body":
            held[1] += message.get("body", b"")
            if message.get("more_body"):
                return
            start, text = held[0], held[1].decode("utf-8", "replace").strip()[:200]
            words = text or HTTPStatus(start["status"]).phrase
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": words}}).encode()
            kept = [(k, v) for k, v in start.get("headers") or () if k.lower() not in (b"content-type", b"content-length")]
            kept += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({**start, "headers": kept})
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return sending


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
    bound_sessions(gateway.server.session_manager)  # no session for a failed initialize; the cap's room (_sessions)
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
    web = WebApp(gateway, mcp_app, security=security, token=token, metrics=metrics)
    return RequestGuard(web, allowed_origins, security=security, wildcard=host in WILDCARD_HOSTS)


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
