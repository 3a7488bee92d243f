"""The relay of resource subscriptions: one upstream subscription per (server, URI), however many sessions want it.

`resources/subscribe` (handshake-era clients) and the resource URIs of a `subscriptions/listen`
stream (2026-07-28 clients) are routed to the server that owns the URI (the passthrough knows which:
`breakwater.gateway._passthrough`), which is subscribed once however many downstream sessions want
the URI (on a 2026-07-28 upstream through a listen stream of its own). Its
`notifications/resources/updated` reach exactly the sessions subscribed to that URI. The upstream
subscription ends when the last downstream session unsubscribes or goes away, and is renewed when
its server reconnects.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import anyio
import mcp.types as types
from anyio.abc import TaskGroup
from mcp import Client, MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, SubscriptionBus
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater._breakwater import Breakwater
from breakwater.gateway._connection import connection_of
from breakwater.status import ServerState

__all__ = ["RELINK_PAUSE_S", "UNSUBSCRIBE_TIMEOUT_S", "RelayedListen", "ResourceOwners", "Subscriptions"]

logger = logging.getLogger("breakwater.gateway")

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
T = TypeVar("T")
#: Bound on the upstream `resources/unsubscribe` sent when the last subscriber leaves (it is shielded).
UNSUBSCRIBE_TIMEOUT_S = 2.0
#: Pause before re-opening an upstream subscription whose stream ended while its server stayed up.
RELINK_PAUSE_S = 1.0


class ResourceOwners(Protocol):
    """What the relay needs of the passthrough: who owns a URI, and a bounded request to that server."""

    bw: Breakwater

    async def learn_owner(self, ctx: ServerRequestContext[Any], uri: str) -> None: ...

    def owners(self, uri: str) -> list[str]: ...

    def unanswered(self, uri: str, last: MCPError | None) -> MCPError: ...

    def client(self, server: str) -> Client: ...

    async def bounded(self, server: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T: ...


@dataclass(eq=False)
class _Link:
    """The upstream end of one (server, uri) subscription, held by a task of its own."""

    server: str
    uri: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ready: anyio.Event = field(default_factory=anyio.Event)  # set once the first upstream subscribe answered
    error: MCPError | None = None


@dataclass(frozen=True, eq=False)
class _Listeners:
    """The 2026-07-28 listen streams of one gateway view: an update is published once on their bus."""

    bus: SubscriptionBus


class Subscriptions:
    """Downstream resource subscriptions, each routed to the upstream that owns the URI.

    A holder is a downstream connection (handshake era: `resources/subscribe`) or one 2026-07-28
    `subscriptions/listen` stream. Each (server, uri) any holder wants has one `_Link` task that
    keeps the upstream subscribed: `resources/subscribe` on a handshake-era upstream, a
    `subscriptions/listen` stream on a 2026-07-28 one, renewed after a reconnect. The links run
    in the gateway's task group (`attach`); without one, subscribing fails with a clear error.
    """

    def __init__(self, passthrough: ResourceOwners, bus: SubscriptionBus | None) -> None:
        self._pt = passthrough
        self._listeners = _Listeners(bus) if bus is not None else None
        # (server, uri) -> holder -> where its updates go: its session, or the bus of its listen stream.
        self._holders: dict[tuple[str, str], dict[object, ServerSession | _Listeners]] = {}
        self._by_holder: dict[object, set[tuple[str, str]]] = {}
        self._links: dict[tuple[str, str], _Link] = {}
        self._tg: TaskGroup | None = None
        #: An attached session's view sends its subscriptions to these servers to the shared gateway's
        #: `Subscriptions`, which holds them for every session (one upstream subscription) and hears their updates.
        self._shared: tuple[Subscriptions, frozenset[str]] | None = None

    def share(self, shared: Subscriptions, servers: frozenset[str]) -> None:
        """Hold subscriptions to `servers`' resources in `shared` (the shared gateway's), not here."""
        self._shared = (shared, servers)

    def attach(self, tg: TaskGroup | None) -> None:
        """Run the upstream subscriptions in `tg` (the gateway's), or stop taking new ones (None)."""
        self._tg = tg

    def subscribed(self, holder: object) -> set[str]:
        """The URIs `holder` is subscribed to (here, and in the shared gateway's for its servers)."""
        held = {uri for _, uri in self._by_holder.get(holder, ())}
        return held | self._shared[0].subscribed(holder) if self._shared is not None else held

    def upstream(self) -> set[tuple[str, str]]:
        """The (server, uri) pairs subscribed upstream right now."""
        return set(self._links)

    def held(self, holder: object) -> list[list[str]]:
        """`holder`'s subscriptions as sorted [server, uri] pairs (what a roaming session's record keeps)."""
        return sorted([server, uri] for server, uri in self._by_holder.get(holder, ()))

    def restore(self, holder: object, pairs: list[list[str]]) -> None:
        """Subscribe `holder` (a 2025-11-25 connection this replica adopted) to what it subscribed on another replica.

        Each replica has its own upstream connections, so the subscription is made again here, on this
        replica's: the updates then reach the session on whichever replica its GET stream is open.
        Nothing is awaited: the upstream subscription is made in the background, as a link is.
        """
        tg = self._tg
        if tg is None:
            return
        fresh = holder not in self._by_holder
        known = {spec.name for spec in self._pt.bw.config.servers}
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and pair[0] in known and isinstance(pair[1], str)):
                continue  # a record written by a replica with other servers
            key = (pair[0], pair[1])
            if key not in self._links:
                self._links[key] = link = _Link(*key)
                tg.start_soon(self._hold, link, name=f"breakwater subscription {key[0]} {key[1]}")
            self._holders.setdefault(key, {})[holder] = cast(ServerSession, holder)  # a Connection sends updates alike
            self._by_holder.setdefault(holder, set()).add(key)
        exit_stack = getattr(holder, "exit_stack", None)
        if fresh and holder in self._by_holder and isinstance(exit_stack, contextlib.AsyncExitStack):
            exit_stack.callback(self.release, holder)

    # ---- downstream requests -------------------------------------------------------------------

    async def subscribe(self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        """`resources/subscribe` from a handshake-era session."""
        holder = connection_of(ctx)
        uri = str(params.uri)
        if uri in self.subscribed(holder):
            return types.EmptyResult()
        fresh = holder not in self._by_holder
        await self._subscribe(ctx, holder, uri, ctx.session)
        exit_stack = getattr(holder, "exit_stack", None)
        if fresh and isinstance(exit_stack, contextlib.AsyncExitStack):
            # The SDK unwinds this when the session ends (closed, deleted, idle): its subscriptions go with it.
            exit_stack.callback(self.release, holder)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        """`resources/unsubscribe`: the upstream is unsubscribed when no session wants the URI any more."""
        self.release(connection_of(ctx), str(params.uri))
        return types.EmptyResult()

    async def listen_uris(self, ctx: ServerRequestContext[Any], holder: object, uris: list[str]) -> None:
        """Subscribe upstream for a 2026-07-28 listen stream; a URI no server can subscribe is skipped
        (the stream honors it and it never fires, as the SDK does for unknown URIs)."""
        for uri in dict.fromkeys(uris):
            try:
                await self._subscribe(ctx, holder, uri, None)
            except MCPError as exc:
                logger.info("listen stream: cannot subscribe upstream to %s: %s", uri, exc.message)

    def release(self, holder: object, uri: str | None = None) -> None:
        """Drop `holder`'s subscription to `uri` (all of them when None); unlink what nobody wants."""
        if self._shared is not None:
            self._shared[0].release(holder, uri)
        keys = self._by_holder.get(holder, set())
        for key in [k for k in keys if uri is None or k[1] == uri]:
            keys.discard(key)
            holders = self._holders.get(key, {})
            holders.pop(holder, None)
            if not holders:
                self._holders.pop(key, None)
                link = self._links.pop(key, None)
                if link is not None:
                    link.scope.cancel()
        if not keys:
            self._by_holder.pop(holder, None)

    async def _subscribe(self, ctx: ServerRequestContext[Any], holder: object, uri: str, session: ServerSession | None) -> None:
        if self._tg is None:
            raise MCPError(INTERNAL_ERROR, "resource subscriptions need a running gateway (breakwater serve)")
        await self._pt.learn_owner(ctx, uri)  # a client may subscribe to a URI it never listed
        target: ServerSession | _Listeners | None = session if session is not None else self._listeners
        if target is None:
            raise MCPError(INTERNAL_ERROR, "a listen stream needs the gateway's subscription bus")
        last: MCPError | None = None
        for server in self._pt.owners(uri):
            shared = self._shared
            holds = shared[0] if shared is not None and server in shared[1] else self
            try:
                await holds._hold_for(holder, server, uri, target)
                return
            except MCPError as exc:
                last = exc
        raise self._pt.unanswered(uri, last)

    async def _hold_for(self, holder: object, server: str, uri: str, target: ServerSession | _Listeners) -> None:
        """Subscribe `holder` to `uri` on `server` (its updates go to `target`), linking upstream if nobody had."""
        if self._tg is None:
            raise MCPError(INTERNAL_ERROR, "resource subscriptions need a running gateway (breakwater serve)")
        key = (server, uri)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = _Link(server, uri)
            self._tg.start_soon(self._hold, link, name=f"breakwater subscription {server} {uri}")
        timeout = self._pt.bw.config.server(server).call.timeout_s
        clock = self._pt.bw.clock
        with clock.deadline_scope(clock.monotonic() + timeout):
            await link.ready.wait()
        if link.ready.is_set() and link.error is None:
            self._holders.setdefault(key, {})[holder] = target
            self._by_holder.setdefault(holder, set()).add(key)
            return
        if self._links.get(key) is link and not self._holders.get(key):
            self._links.pop(key, None)
            link.scope.cancel()
        raise link.error or MCPError(INTERNAL_ERROR, f"server {server!r} did not answer resources/subscribe within {timeout:g} s")

    # ---- upstream side -------------------------------------------------------------------------

    async def deliver(self, server: str, uri: str) -> None:
        """`notifications/resources/updated` from `server`: to every holder of that subscription."""
        holders = self._holders.get((server, uri), {})
        if not holders:
            return
        for listeners in {t for t in holders.values() if isinstance(t, _Listeners)}:
            await listeners.bus.publish(ResourceUpdated(uri=uri))  # once per bus: its streams filter by their own URIs
        for holder, session in list(holders.items()):
            if isinstance(session, _Listeners):
                continue
            try:
                await session.send_resource_updated(uri)
            except Exception:  # a session that went away must not stop the others from hearing
                logger.debug("dropping the subscriptions of a downstream session that cannot take notifications", exc_info=True)
                self.release(holder)

    async def _hold(self, link: _Link) -> None:
        """Keep `link` subscribed upstream until it is cancelled (nobody wants it any more)."""
        try:
            await self._keep(link)
        except Exception as exc:  # one subscription's failure must not take the gateway's task group down
            logger.exception("upstream subscription to %s on %s failed", link.uri, link.server)
            self._fail(link, MCPError(INTERNAL_ERROR, f"subscription failed: {type(exc).__name__}"))

    async def _keep(self, link: _Link) -> None:
        bw = self._pt.bw
        upstream = bw.upstream(link.server)
        with link.scope:
            while True:
                client = upstream.client
                if upstream.state is not ServerState.READY or client is None:
                    if not link.ready.is_set():
                        try:
                            self._pt.client(link.server)
                        except MCPError as exc:
                            self._fail(link, exc)
                            return
                    await bw.wait_changed()
                    continue
                try:
                    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                        await self._listen(link, client)
                    else:
                        await self._subscribe_upstream(link, client, upstream)
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as exc:
                    if not link.ready.is_set():
                        self._fail(link, exc if isinstance(exc, MCPError) else MCPError(INTERNAL_ERROR, str(exc)))
                        return
                    logger.debug("upstream subscription to %s on %s dropped", link.uri, link.server, exc_info=True)
                # The stream ended or the connection dropped: renew on the same or the next connection.
                with bw.clock.deadline_scope(bw.clock.monotonic() + RELINK_PAUSE_S):
                    while upstream.client is client:
                        await bw.wait_changed()

    def _fail(self, link: _Link, exc: MCPError) -> None:
        established = link.ready.is_set()
        link.error = exc
        link.ready.set()
        key = (link.server, link.uri)
        # A link that held and then broke is dropped too: the next subscriber to the URI starts a new one.
        if self._links.get(key) is link and (established or not self._holders.get(key)):
            self._links.pop(key, None)

    async def _listen(self, link: _Link, client: Client) -> None:
        # A 2026-07-28 server delivers resource updates only on a listen stream. Its frames also reach
        # the client's message handler, which delivers them (see `deliver`): this only holds it open.
        async with client.listen(resource_subscriptions=[link.uri]):
            link.ready.set()
            await anyio.sleep_forever()

    async def _subscribe_upstream(self, link: _Link, client: Client, upstream: Any) -> None:
        caps = client.server_capabilities.resources
        if caps is None or not caps.subscribe:
            raise MCPError(INVALID_PARAMS, f"server {link.server!r} does not offer resource subscriptions")
        request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=link.uri))
        await self._pt.bounded(link.server, client.session.send_request, request, types.EmptyResult)
        link.ready.set()
        try:
            while upstream.client is client:  # until this connection is lost (then renew on the next)
                await self._pt.bw.wait_changed()
        except anyio.get_cancelled_exc_class():
            if upstream.client is client:
                # Real time: cleanup while being cancelled must end even when no one moves a fake clock.
                with anyio.CancelScope(shield=True), anyio.move_on_after(UNSUBSCRIBE_TIMEOUT_S):  # noqa: TID251 - cleanup bound
                    done = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=link.uri))
                    with contextlib.suppress(Exception):
                        await client.session.send_request(done, types.EmptyResult)
            raise


class RelayedListen(ListenHandler):
    """`subscriptions/listen` for 2026-07-28 clients, with their resource URIs subscribed upstream."""

    def __init__(self, bus: SubscriptionBus, subscriptions: Subscriptions) -> None:
        super().__init__(bus)
        self._subscriptions = subscriptions

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        holder = object()
        try:
            await self._subscriptions.listen_uris(ctx, holder, list(params.notifications.resource_subscriptions or ()))
            return await super().__call__(ctx, params)
        finally:
            self._subscriptions.release(holder)
