"""2025-11-25 sessions any replica serves: the SDK's session manager, with the session records in Redis.

The SDK keeps a session (its transport and server loop) in one process's memory, so behind a
round-robin balancer a session's second request meets a replica that answers 404 and the client
re-initializes mid-task. With `[state] url = "redis://..."`, `serve --http` uses `RoamingSessionManager`:

* `initialize` writes the session's record to Redis (`breakwater.state._sessions.SessionStore`)
  before its response leaves (`SessionRecorder`, a server middleware); `logging/setLevel` and
  `resources/subscribe`/`unsubscribe` update it;
* a request carrying a session id this replica does not hold, whose record is in Redis, *adopts*
  the session: a transport with that id and a server loop whose connection starts out initialized
  with the recorded revision, client capabilities and log level (the SDK's session-roaming
  pattern, with the connection state that pattern leaves behind), and the session's resource
  subscriptions made again on this replica's own upstream connections (an upstream subscription
  belongs to the connection that made it), so an update reaches the session on whichever replica
  holds its GET stream;
* every request of a session renews its TTL; a renewal that finds the record ended (a `DELETE` on another
  replica leaves a mark) ends the local copy too, and one that finds it merely gone (Redis restarted, a save
  failed while it was away) writes it again from this replica's copy; `DELETE` removes the record;
* beside the requests (`SessionStore.watch`): a `DELETE` on another replica is published, and the replicas
  holding the session drop it at once (it counted toward their cap until it idled out, and could be
  written back after a Redis restart); and when Redis answers again, or comes back empty, each replica
  writes back the records of the sessions it holds that Redis lacks (not the ended ones), without
  waiting for a request of each to reach it;
* a request of a session this replica does not hold, while Redis cannot be asked, gets a retryable 503
  (`Retry-After: 1`), not the 404 that tells a client its session is gone.

What stays per replica: a server-to-client request (sampling, elicitation) must be answered on the
replica that asked, and a session's GET stream carries the notifications of the replica it is open on.
2026-07-28 clients have no session and need none of this.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import Response

from breakwater.gateway._connection import connection_of
from breakwater.gateway._relay import LOG_LEVEL_STATE
from breakwater.gateway._subscriptions import Subscriptions

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from starlette.types import Receive, Scope, Send

    from breakwater.state._sessions import SessionStore

__all__ = ["FULL_RETRY_AFTER_S", "RoamingSessionManager", "SessionRecorder", "bound_sessions", "roaming_app"]

log = logging.getLogger("breakwater.sessions")


class SessionRecorder:
    """Server middleware: the session's record goes to Redis when `initialize` and `logging/setLevel` succeed."""

    #: A `tools/call` is none of `_RECORDED`: the lanes' kernel skips it (`_fast_call.PASSIVE_FOR_CALLS`).
    breakwater_for_calls = True

    def __init__(self, store: SessionStore, subscriptions: Subscriptions | None = None) -> None:
        self.store = store
        self.subscriptions = subscriptions

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method not in _RECORDED:
            return result
        session_id = getattr(connection_of(ctx), "session_id", None)
        if not isinstance(session_id, str) or not isinstance(ctx.params, Mapping):
            return result
        if ctx.method.startswith("resources/"):
            await self._record_subscriptions(ctx, session_id, str(ctx.params.get("uri")))
            return result
        params = dict(ctx.params)
        if ctx.method == "logging/setLevel":
            await self.store.update(session_id, level=params.get("level"))
            return result
        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

        requested = params.get("protocolVersion")
        version = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
        await self.store.save(session_id, {"version": version, "params": params, "level": None})
        return result

    async def _record_subscriptions(self, ctx: ServerRequestContext[Any, Any], session_id: str, uri: str) -> None:
        # Merged with the record, not replaced by this replica's view: the session may have subscribed
        # elsewhere after this replica adopted it.
        record = await self.store.load(session_id)
        if record is None or self.subscriptions is None:
            return
        kept = [p for p in record.get("subscriptions") or [] if isinstance(p, list) and len(p) == 2 and p[1] != uri]
        if ctx.method == "resources/subscribe":
            kept += [p for p in self.subscriptions.held(connection_of(ctx)) if p[1] == uri]
        await self.store.update(session_id, subscriptions=sorted(kept))


_RECORDED = frozenset({"initialize", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})


class RoamingSessionManager(StreamableHTTPSessionManager):
    """The SDK's stateful session manager, also serving the sessions other replicas created (records in Redis)."""

    def __init__(self, app: Any, *, store: SessionStore, subscriptions: Subscriptions | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.store = store
        self.subscriptions = subscriptions
        #: Sessions this replica took over from another one (for status and tests).
        self.adopted = 0

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The SDK's lifecycle, with the store's `watch` beside: sessions other replicas end are dropped here at once,
        and the records Redis lost are written back."""
        async with super().run(), anyio.create_task_group() as tg:
            tg.start_soon(self.store.watch, self._ended_elsewhere)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    async def _ended_elsewhere(self, session_id: str) -> None:
        """Another replica ended the session (`DELETE`): held here, it stops at once (it counted toward the cap)."""
        self.store.forget(session_id)
        held = self._server_instances.get(session_id)
        if held is not None:
            await self._discard_session(session_id, held)

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = _session_id(scope)
        if session_id is not None:
            method = scope.get("method")
            held = self._server_instances.get(session_id)
            if method == "DELETE":
                existed = await self.store.delete(session_id)
                if held is None and existed:
                    # Ended everywhere: the replicas holding it are told (`watch`), and check at their next request.
                    await Response(status_code=200)(scope, receive, send)
                    return
                if held is None and existed is None:
                    await _unavailable()(scope, receive, send)  # the replica holding it may be asked (a retry)
                    return
            elif held is not None:
                if not await self.store.renew(session_id):
                    await self._discard_session(session_id, held)
            else:
                try:
                    record = await self.store.find(session_id)
                except Exception as exc:
                    # Redis cannot say whether the session lives: a 404 would end it for the client (it re-initializes),
                    # a 503 is retried (by the balancer, on the replica holding it, or by the client).
                    log.info("session %s unknown here and Redis cannot be asked (%s): 503", session_id[:8], exc)
                    await _unavailable()(scope, receive, send)
                    return
                if record is not None:
                    await self._adopt(session_id, record)
                    await self.store.renew(session_id)
        await super()._handle_stateful_request(scope, receive, send)

    async def _discard_session(self, session_id: str, transport: Any) -> None:
        self.store.forget(session_id)  # no copy to write again for a session this replica no longer serves
        await super()._discard_session(session_id, transport)

    async def _adopt(self, session_id: str, record: dict[str, Any]) -> None:
        async with self._session_creation_lock:
            if session_id in self._server_instances:
                return
            transport = self._adopted_transport(session_id)
            self._server_instances[session_id] = transport
        self.adopted += 1
        assert self._task_group is not None
        try:
            await self._task_group.start(partial(self._serve_adopted, transport, record))
        except BaseException:
            await self._discard_session(session_id, transport)
            raise

    def _adopted_transport(self, session_id: str) -> StreamableHTTPServerTransport:
        """The transport of a session taken over from another replica (the lazy path wraps it, as `_admit_session`)."""
        return StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )

    async def _serve_adopted(
        self, transport: StreamableHTTPServerTransport, record: dict[str, Any], *, task_status: TaskStatus[None]
    ) -> None:
        """The adopted session's server loop: the SDK's, over a connection that starts out initialized."""
        from mcp.server.connection import Connection
        from mcp.server.runner import serve_connection
        from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
        from mcp.types import InitializeRequestParams

        session_id = transport.mcp_session_id
        assert session_id is not None
        async with transport.connect() as (read_stream, write_stream):
            task_status.started()
            try:
                idle_scope = transport.idle_scope if transport.idle_scope is not None else anyio.CancelScope()
                with idle_scope:
                    dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(
                        read_stream, write_stream, inline_methods=frozenset({"initialize"})
                    )
                    connection = Connection.for_loop(dispatcher, session_id=session_id)
                    connection.client_params = InitializeRequestParams.model_validate(record.get("params") or {}, by_name=False)
                    connection.protocol_version = str(record.get("version") or connection.protocol_version)
                    if record.get("level"):
                        connection.state[LOG_LEVEL_STATE] = record["level"]
                    connection.initialized.set()
                    if self.subscriptions is not None and isinstance(record.get("subscriptions"), list):
                        self.subscriptions.restore(connection, record["subscriptions"])
                    await serve_connection(self.app, dispatcher, connection=connection, lifespan_state=self._lifespan_state)
            except Exception:
                log.exception("adopted session %s crashed", session_id[:8])
            finally:
                await self._discard_session(session_id, transport)


def _unavailable() -> Response:
    """503 with a JSON-RPC error: the session store cannot be asked; nothing ran, try again shortly."""
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32603, "message": "Session store unreachable: whether this session lives is unknown; retry"},
    }
    return Response(json.dumps(body), status_code=503, media_type="application/json", headers={"Retry-After": "1"})


def _session_id(scope: Scope) -> str | None:
    header = MCP_SESSION_ID_HEADER.lower().encode()
    for key, value in scope.get("headers") or ():
        if key == header:
            return bytes(value).decode("latin-1")
    return None


def roaming_app(
    server: Any,
    *,
    store: SessionStore,
    security: Any,
    json_response: bool,
    idle_timeout_s: float,
    subscriptions: Subscriptions | None = None,
) -> Any:
    """The streamable-HTTP Starlette app `server.streamable_http_app()` builds, over a `RoamingSessionManager`."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = RoamingSessionManager(
        server,
        store=store,
        subscriptions=subscriptions,
        json_response=json_response,
        security_settings=security,
        session_idle_timeout=idle_timeout_s,
    )
    # Where the SDK keeps its own manager, so `server.session_manager` finds this one.
    server._session_manager = manager
    server.middleware.append(SessionRecorder(store, subscriptions))
    return Starlette(routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))], lifespan=lambda app: manager.run())


# ---- the session cap (the SDK's `max_sessions`, 10,000), for both managers ----

#: The Retry-After of a 503 "Too many open sessions": every session then has a request in flight or a GET stream
#: open (an idle one would have been ended for the new one), so a slot frees when one of those ends: soon, unknown.
FULL_RETRY_AFTER_S = 10
#: How much of an opening request's answer is held to learn whether `initialize` succeeded (it is a few hundred bytes).
_OPENING_HELD_MAX = 1 << 20


def bound_sessions(manager: StreamableHTTPSessionManager) -> None:
    """The SDK's session cap, kept by sessions that exist, never refused while one is idle, and refused with a retry.

    * An `initialize` that fails (invalid params: `{"protocolVersion": 5}`) is answered 200 with its JSON-RPC error, so the
      SDK kept the session it opened for it, with an `Mcp-Session-Id` no handshake ever completed: 10,000 such requests
      filled the cap. Its session is dropped now, and its answer carries no session id (`_opening`).
    * At the cap, the least recently used idle session (no request in flight, no GET stream open) is ended for the new
      one, as its idle timeout would have ended it (`_end_least_recent`); its client's next request gets 404 and it
      initializes again, as the spec has it. Refusing instead left every new client out until sessions idled out
      (`session_ttl_s`, 30 min), while abandoned sessions (clients that never `DELETE`) held the slots.
    * When every session is busy, the SDK's 503 "Too many open sessions" says when to try again (`FULL_RETRY_AFTER_S`).
    """
    admit = manager._admit_session
    serve_opening = manager._serve_opening_request
    handle = manager._handle_stateful_request

    def admit_or_end_one(requestor: Any) -> StreamableHTTPServerTransport | None:
        cap = manager.max_sessions
        if cap is not None and len(manager._server_instances) >= cap:
            _end_least_recent(manager)
        return admit(requestor)

    async def serve_opening_request(
        http_transport: StreamableHTTPServerTransport, scope: Scope, receive: Receive, send: Send
    ) -> None:
        transport = http_transport
        failed: list[bool] = []
        await serve_opening(transport, scope, receive, _opening(send, failed))
        session_id = transport.mcp_session_id
        if failed and session_id is not None and manager._server_instances.get(session_id) is transport:
            log.info("initialize failed: session %s dropped", session_id[:8])
            await manager._discard_session(session_id, transport)

    async def handle_stateful_request(scope: Scope, receive: Receive, send: Send) -> None:
        if _session_id(scope) is None:
            send = _retry_when_full(send)
        await handle(scope, receive, send)

    manager._admit_session = admit_or_end_one  # type: ignore[method-assign]
    manager._serve_opening_request = serve_opening_request  # type: ignore[method-assign]
    manager._handle_stateful_request = handle_stateful_request  # type: ignore[method-assign]


def _end_least_recent(manager: StreamableHTTPSessionManager) -> None:
    """End the idle session whose last request ended first, as its idle timeout ends it; none if every one is busy."""
    oldest: tuple[float, str, StreamableHTTPServerTransport] | None = None
    for session_id, transport in manager._server_instances.items():
        idle = transport.idle_scope
        # A request in flight or an open GET stream holds the deadline at infinity (`handle_request`, `_known_heads`).
        if idle is None or idle.cancel_called or transport._requests_in_flight or not math.isfinite(idle.deadline):
            continue
        if oldest is None or idle.deadline < oldest[0]:
            oldest = (idle.deadline, session_id, transport)
    if oldest is None:
        return
    _, session_id, transport = oldest
    log.info(
        "%d sessions open: ended session %s, the least recently used idle one, for a new one",
        len(manager._server_instances),
        session_id[:8],
    )
    # Forgotten at once (its id answers 404 from here, its slot is free); its server loop ends as on an idle timeout.
    manager._server_instances.pop(session_id, None)
    manager._session_owners.pop(session_id, None)
    assert transport.idle_scope is not None
    transport.idle_scope.cancel()


def _opening(send: Send, failed: list[bool]) -> Send:
    """`send` for an opening request's answer, held until it shows whether `initialize` succeeded; on an error the
    answer goes without the `Mcp-Session-Id` of the session about to be dropped, and `failed` gets an entry."""
    held: list[Any] = []
    size = 0

    async def sending(message: Any) -> None:
        nonlocal size
        if message["type"] == "http.response.start" and not held and message["status"] < 400:
            held.append(message)
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        held.append(message)
        size += len(message.get("body", b""))
        verdict = _initialize_failed(b"".join(m.get("body", b"") for m in held[1:]))
        if verdict is None and message.get("more_body") and size < _OPENING_HELD_MAX:
            return
        start, *bodies = held
        held.clear()
        held.append(None)  # decided: the rest passes as it comes
        if verdict:
            failed.append(True)
            kept = [(k, v) for k, v in start.get("headers") or () if k.lower() != MCP_SESSION_ID_HEADER.lower().encode()]
            start = {**start, "headers": kept}
        await send(start)
        for body in bodies:
            await send(body)

    async def passing(message: Any) -> None:
        if held and held[0] is None:
            await send(message)
        else:
            await sending(message)

    return passing


def _initialize_failed(body: bytes) -> bool | None:
    """Whether the answer in `body` (JSON, or SSE `data:` lines) is an error; None while it holds no answer yet."""
    texts = (
        [line[5:] for line in body.split(b"\n") if line.startswith(b"data:")] if not body.lstrip().startswith(b"{") else [body]
    )
    for text in texts:
        try:
            message = json.loads(text)
        except ValueError:
            continue
        if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
            return "error" in message
    return None


def _retry_when_full(send: Send) -> Send:
    """`send`, giving the SDK's 503 "Too many open sessions" a Retry-After (`FULL_RETRY_AFTER_S`)."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start" and message["status"] == 503:
            headers = list(message.get("headers") or ())
            if not any(k.lower() == b"retry-after" for k, _ in headers):
                message = {**message, "headers": [*headers, (b"retry-after", str(FULL_RETRY_AFTER_S).encode())]}
        await send(message)

    return sending
