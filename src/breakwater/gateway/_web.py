"""The HTTP face of `breakwater serve --http` beside MCP: health, readiness, metrics and the status page.

`WebApp` is an ASGI router in front of the SDK's streamable-HTTP app:

* `GET /healthz`: 200 while the process serves requests (its event loop answers). No token needed.
* `GET /readyz`: 200 when every enabled server is ready, else 503 with a JSON body naming each
  server that is not (state and reason code, never the message); 503 `{"draining": true}` from
  the moment a SIGTERM starts the drain (`breakwater.gateway._drain`). `?server=NAME` (repeatable)
  narrows the rule to the named servers, so a deployment can gate traffic on the servers it
  cannot do without while an optional one is down. No token needed.
* `GET /metrics`: Prometheus text format (`breakwater.gateway._metrics`).
* `GET /`: the live status page; `GET /api/status`: the JSON it polls every two seconds.
* everything else: the MCP app (`/mcp`).

Every route but `/healthz` gets the MCP endpoint's Host/Origin checks (DNS rebinding). When a
token is set, `/metrics`, `/` and `/api/status` need it like `/mcp` does: `Authorization: Bearer`
for scripts and scrapers, or, for a browser, the cookie `POST /login` sets after the page's token
form. The cookie holds a keyed hash of the token, not the token, is HttpOnly and SameSite=Strict,
and grants these read-only routes only, never `/mcp`.

Nothing here reads upstream `env` or `headers`; server errors come from `Upstream.snapshot()`,
which has already redacted them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response

from breakwater._clock import Clock
from breakwater.catalog._catalog import Entry
from breakwater.gateway._metrics import BUILTIN_SERVER, CONTENT_TYPE, UNLISTED, Metrics, Resolver
from breakwater.journal import timeout_in_force
from breakwater.status import ServerState, ServerStatus, StatusReport, iso

if TYPE_CHECKING:
    from mcp.server.transport_security import TransportSecuritySettings

    from breakwater._breakwater import Breakwater
    from breakwater.gateway._server import Gateway
    from breakwater.journal import ToolStats

__all__ = ["COOKIE_NAME", "STATS_WINDOW_S", "WebApp", "gateway_resolver", "status_json"]

log = logging.getLogger("breakwater.web")

#: The window of the page's per-tool p95 and timeout rate.
STATS_WINDOW_S = 3600.0
#: How long one journal query's answer serves every poller (each open page polls every 2 s).
STATS_TTL_S = 5.0
#: Failures the page lists.
PAGE_FAILURES = 20
COOKIE_NAME = "breakwater_session"
_LOGIN_BODY_LIMIT = 4096
_COOKIE_CONTEXT = b"breakwater status page session v1"
_READ_METHODS = frozenset({"GET", "HEAD"})

Handler = Callable[[Request], Awaitable[Response]]


def _page(name: str) -> str:
    return resources.files("breakwater.gateway").joinpath("web", name).read_text(encoding="utf-8")


def _csp(html: str) -> str:
    """A Content-Security-Policy allowing exactly the page's own inline script and style blocks."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag in hashes:
        for body in re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL):
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            hashes[tag].append(f"'sha256-{digest}'")
    scripts = " ".join(hashes["script"]) or "'none'"
    styles = " ".join(hashes["style"]) or "'none'"
    return (
        "default-src 'none'; "
        f"script-src {scripts}; "
        f"style-src {styles}; "
        "connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


def _not_ready_reason(server: ServerStatus) -> str | None:
    """A reason code for `/readyz` (never a message: those may say more than a balancer's log should keep)."""
    if server.error is not None:
        return server.error.code.value
    return "value_missing" if server.off_here else None


@dataclass(frozen=True)
class _Route:
    handler: Handler
    methods: frozenset[str] = _READ_METHODS
    #: Needs the token (when one is set), like /mcp.
    guarded: bool = True
    #: The MCP endpoint's Host/Origin checks (DNS rebinding).
    checks_host: bool = True
    #: Answers 401 with the token form instead of JSON (what a person opening the page needs).
    asks_for_token: bool = False


_PAGE_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff", "referrer-policy": "same-origin"}


class WebApp:
    """The ASGI app `breakwater serve --http` runs: the routes above, then the MCP app."""

    def __init__(
        self,
        gateway: Gateway,
        mcp_app: Any,
        *,
        security: TransportSecuritySettings,
        token: str | None,
        metrics: Metrics,
    ) -> None:
        from mcp.server.transport_security import TransportSecurityMiddleware

        self.gateway = gateway
        self.metrics = metrics
        self._mcp = mcp_app
        # The SDK's own checks, so the page and /mcp accept exactly the same Host and Origin values.
        self._security = TransportSecurityMiddleware(security)
        self._bearer = f"Bearer {token}".encode() if token else None
        self._session = hmac.new(token.encode(), _COOKIE_CONTEXT, hashlib.sha256).hexdigest() if token else None
        self._status_html = _page("status.html")
        self._login_html = _page("login.html")
        self._status_csp = _csp(self._status_html)
        self._login_csp = _csp(self._login_html)
        self._stats: _StatsCache | None = None
        journal = gateway.bw.journal
        if journal is not None:
            self._stats = _StatsCache(journal.stats, gateway.bw.clock)
        login_methods = frozenset({"GET", "HEAD", "POST"})
        self._routes: dict[str, _Route] = {
            "/healthz": _Route(self._healthz, guarded=False, checks_host=False),
            "/readyz": _Route(self._readyz, guarded=False),
            "/metrics": _Route(self._metrics),
            "/": _Route(self._index, asks_for_token=True),
            "/api/status": _Route(self._api_status),
            "/login": _Route(self._login, methods=login_methods, guarded=False),
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = self._routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            await self._mcp(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await self._respond(request, route)
        await response(scope, receive, send)

    async def _respond(self, request: Request, route: _Route) -> Response:
        if request.method not in route.methods:
            return PlainTextResponse("method not allowed", status_code=405, headers={"allow": ", ".join(sorted(route.methods))})
        if route.checks_host:
            refused = await self._security.validate_request(request)
            if refused is not None:
                return refused
        if route.guarded and not self._authorized(request):
            if route.asks_for_token:
                return self._login_page(status_code=401)
            return JSONResponse(
                {"error": "missing or wrong bearer token"}, status_code=401, headers={"www-authenticate": "Bearer"}
            )
        try:
            return await route.handler(request)
        except Exception:
            # A broken view must never take the gateway down; the MCP side keeps serving.
            log.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse({"error": "internal error; see the gateway's log"}, status_code=500)

    def _authorized(self, request: Request) -> bool:
        if self._bearer is None:
            return True
        if hmac.compare_digest(request.headers.get("authorization", "").encode(), self._bearer):
            return True
        cookie = request.cookies.get(COOKIE_NAME, "")
        return self._session is not None and hmac.compare_digest(cookie.encode(), self._session.encode())

    # ---- routes -------------------------------------------------------------------------------

    async def _healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n", headers={"cache-control": "no-store"})

    async def _readyz(self, request: Request) -> Response:
        if self.gateway.drain.draining:
            # SIGTERM: out of the balancer at once, whatever the servers' states (breakwater.gateway._drain).
            draining = {"ready": False, "draining": True, "in_flight": self.gateway.drain.requests}
            return JSONResponse(draining, status_code=503, headers={"cache-control": "no-store"})
        report = self.gateway.bw.status()
        names = {s.name for s in report.servers}
        wanted = request.query_params.getlist("server")
        unknown = sorted(set(wanted) - names)
        if unknown:
            return JSONResponse({"error": "no such server", "servers": unknown}, status_code=400)
        if wanted:
            considered = [s for s in report.servers if s.name in wanted]
        else:
            # Off by the config's choice, not counted; off because a value it names is not set here (a replica deployed
            # without its secret), counted: it passed the balancer's check and served an empty list under a green page.
            considered = [s for s in report.servers if s.state is not ServerState.DISABLED or s.off_here]
        not_ready = [
            {"server": s.name, "state": s.state.value, "reason": _not_ready_reason(s)}
            for s in considered
            if s.state is not ServerState.READY
        ]
        body = {"ready": not not_ready, "servers": {s.name: s.state.value for s in considered}, "not_ready": not_ready}
        return JSONResponse(body, status_code=503 if not_ready else 200, headers={"cache-control": "no-store"})

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(self.gateway.bw), media_type=CONTENT_TYPE, headers={"cache-control": "no-store"})

    async def _index(self, request: Request) -> Response:
        headers = {**_PAGE_HEADERS, "content-security-policy": self._status_csp}
        return HTMLResponse(self._status_html, headers=headers)

    def _login_page(self, *, status_code: int, wrong: bool = False) -> Response:
        html = self._login_html.replace("<!--message-->", "<p class=wrong>That token is not the gateway's.</p>" if wrong else "")
        headers = {**_PAGE_HEADERS, "content-security-policy": self._login_csp}
        if status_code == 401:
            headers["www-authenticate"] = "Bearer"
        return HTMLResponse(html, status_code=status_code, headers=headers)

    async def _login(self, request: Request) -> Response:
        if self._bearer is None or self._session is None:
            return RedirectResponse("/", status_code=303)
        if request.method != "POST":
            return self._login_page(status_code=200)
        if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return PlainTextResponse("expected a form", status_code=415)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _LOGIN_BODY_LIMIT:
                return PlainTextResponse("request body too large", status_code=413)
        from urllib.parse import parse_qs

        token = parse_qs(body.decode("utf-8", errors="replace")).get("token", [""])[0].strip()
        if not hmac.compare_digest(f"Bearer {token}".encode(), self._bearer):
            return self._login_page(status_code=401, wrong=True)
        response = RedirectResponse("/", status_code=303, headers={"cache-control": "no-store"})
        response.set_cookie(COOKIE_NAME, self._session, httponly=True, samesite="strict", path="/")
        return response

    async def _api_status(self, request: Request) -> Response:
        stats = await self._stats.get(STATS_WINDOW_S) if self._stats is not None else None
        error = self._stats.error if self._stats is not None else None
        body = status_json(self.gateway, self.metrics, stats, stats_error=error)
        return JSONResponse(body, headers={"cache-control": "no-store"})


class _StatsCache:
    """The journal's per-tool statistics, queried off the event loop at most once per `STATS_TTL_S`."""

    def __init__(self, query: Callable[[float], list[ToolStats]], clock: Clock) -> None:
        self._query = query
        self._clock = clock
        self._lock = anyio.Lock()
        self._at = -math.inf
        self._value: dict[tuple[str, str], ToolStats] = {}
        self.error: str | None = None

    async def get(self, window_s: float) -> dict[tuple[str, str], ToolStats]:
        async with self._lock:
            # Pollers that queued behind a running query take its answer instead of asking again.
            if self._clock.monotonic() - self._at < STATS_TTL_S:
                return self._value
            try:
                rows = await anyio.to_thread.run_sync(self._query, window_s)
            except Exception as exc:
                # A journal that cannot be read costs the page its statistics, nothing more.
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("status page: cannot read the journal's statistics (%s)", self.error)
            else:
                self._value = {(r.server, r.tool): r for r in rows}
                self.error = None
            self._at = self._clock.monotonic()
            return self._value


def gateway_resolver(gateway: Gateway) -> Resolver:
    """(server, tool) for a downstream tool name the gateway lists (built-in tools included).

    A name it does not list is (server, `UNLISTED`) when the error envelope names a configured
    server (a tool of a server that failed before its tools were ever seen), else None.
    """
    cache: dict[str, tuple[str, str]] = {}
    source: list[Any] = [None]
    builtins = {name for name in (gateway.policy.search_tool, gateway.policy.status_tool) if name}
    servers = {spec.name for spec in gateway.bw.config.servers}

    def resolve(name: str, server: str | None) -> tuple[str, str] | None:
        if name in builtins:
            return BUILTIN_SERVER, name
        entries = gateway.entries()
        # The gateway hands back the same list object until a server's state or tools change.
        if entries is not source[0]:
            cache.clear()
            cache.update({e.name: (e.server, e.tool.name) for e in entries})
            source[0] = entries
        found = cache.get(name)
        if found is None and server in servers:
            return server, UNLISTED
        return found

    return resolve


# ---- the page's data --------------------------------------------------------------------------------


def _timeout_in_force(bw: Breakwater, server: str, tool: str) -> tuple[float, str]:
    """The per-attempt timeout a call of `tool` gets and where it comes from: configured, learned or default.

    The gate's own answer whenever it knows the tool (a ready server); otherwise the same rules
    applied to the config and the journal's learned value, so a down server's last-known tools
    still show what their calls will get.
    """
    if bw.upstream(server).state is ServerState.READY:
        found = bw.gate.timeout_in_force(server, tool)
        if found is not None:
            return found
    journal = bw.journal
    learned = journal.learned_timeout(server, tool) if journal is not None and journal.policy.learn_timeouts else None
    return timeout_in_force(bw.upstream(server).spec, tool, learned)


#: A tool no call has reached yet, of a server that has been ready: its breaker would be closed.
_NO_CALLS_YET: dict[str, Any] = {"state": "closed", "failure_rate": 0.0, "calls_in_window": 0, "retry_after_s": 0.0, "reason": ""}


def _breaker_json(snapshot: Any) -> dict[str, Any]:
    return {
        "state": snapshot.state.value,
        "failure_rate": round(snapshot.failure_rate, 4),
        "calls_in_window": snapshot.calls_in_window,
        "retry_after_s": round(snapshot.retry_after_s, 3),
        "reason": snapshot.reason,
    }


def status_json(
    gateway: Gateway,
    metrics: Metrics,
    stats: dict[tuple[str, str], ToolStats] | None,
    *,
    stats_error: str | None = None,
) -> dict[str, Any]:
    """What `GET /api/status` answers: servers, tools, recent failures (see the README's status page section).

    `stats` are the journal's per-tool statistics over `STATS_WINDOW_S` (None when the journal is
    off); `stats_error` says why the last query failed, if it did.
    """
    bw = gateway.bw
    report = bw.status()
    breakers = {(b.key.server, b.key.tool or ""): b.snapshot() for b in bw.gate.breakers}
    from importlib.metadata import version

    return {
        "version": version("mcp-breakwater"),
        "now": time.time(),
        "generated_at": iso(time.time()),
        "started_at": metrics.started_at,
        # Which replica answered: behind a balancer each refresh of the page may come from another.
        "replica": {"host": socket.gethostname(), "pid": os.getpid()},
        "ready": report.all_ready,
        "summary": report.summary,
        "servers": _servers_json(bw, report, breakers),
        "tools": [_tool_json(bw, metrics, entry, breakers, stats) for entry in gateway.entries()],
        "failures": _failures_json(metrics),
        "window_s": STATS_WINDOW_S,
        # Where the per-tool hour figures come from: the journal, or nowhere when it is off.
        "hour_source": "off" if stats is None else "journal",
        "hour_error": stats_error,
        "journal": _journal_json(bw),
        "drift": {server: list(changed) for server, changed in gateway.drift.items()},
        "state_store": bw.state_store_status(),
    }


def _servers_json(bw: Breakwater, report: StatusReport, breakers: Mapping[tuple[str, str], Any]) -> list[dict[str, Any]]:
    budgets = bw.gate.retry_budget_snapshots()
    in_flight = bw.gate.in_flight()
    servers = []
    for s in report.servers:
        row = s.to_json()
        own = breakers.get((s.name, ""))
        budget = budgets.get(s.name)
        # No breaker state where no call has been possible (never ready: no connect time).
        row["breaker"] = None if own is None or s.connect_ms is None else _breaker_json(own)
        row["in_flight"] = in_flight.get(s.name, 0)
        row["retry_budget_tokens"] = None if budget is None else round(budget.tokens, 3)
        servers.append(row)
    return servers


def _tool_json(
    bw: Breakwater,
    metrics: Metrics,
    entry: Entry,
    breakers: Mapping[tuple[str, str], Any],
    stats: dict[tuple[str, str], ToolStats] | None,
) -> dict[str, Any]:
    server, tool = entry.server, entry.tool.name
    timeout_s, source = _timeout_in_force(bw, server, tool)
    breaker = breakers.get((server, tool))
    # No breaker state where no call has been possible (its server never became ready): None.
    never_ready = bw.upstream(server).connect_ms is None
    breaker_json = None if never_ready else _NO_CALLS_YET if breaker is None else _breaker_json(breaker)
    hour = None if stats is None else stats.get((server, tool))
    return {
        "name": entry.name,
        "server": server,
        "tool": tool,
        "live": entry.live,
        "breaker": breaker_json,
        "timeout_s": timeout_s,
        "timeout_source": source,
        "hour": None
        if hour is None
        else {
            "calls": hour.calls,
            "attempts": hour.attempts,
            "timeouts": hour.timeouts,
            "timeout_rate": hour.timeout_rate,
            "success_rate": hour.success_rate,
            "p95_s": hour.p95_s,
        },
        "attempts": metrics.attempt_counts(server, tool),
        "points": [[round(t, 3), round(d, 4), o] for t, d, o in metrics.recent_points(server, tool)],
    }


def _failures_json(metrics: Metrics) -> list[dict[str, Any]]:
    return [
        {
            "at": r.started_at,
            "server": r.server,
            "tool": r.tool,
            "outcome": r.outcome,
            "error_code": r.error_code,
            "attempt": r.attempt,
            "duration_s": round(r.duration_s, 4),
            "client": r.client,
        }
        for r in metrics.recent_failures(PAGE_FAILURES)
    ]


def _journal_json(bw: Breakwater) -> dict[str, Any] | None:
    journal = bw.journal
    if journal is None:
        return None
    return {
        "location": journal.store.location,
        "dropped": journal.dropped,
        "queued": journal.queued,
        "failed": journal.failed,
        "last_error": journal.last_error,
    }
