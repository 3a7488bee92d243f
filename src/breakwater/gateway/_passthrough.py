"""Prompts, resources and completions of the upstreams, passed through the gateway.

Prompts are namespaced like tools (`server__prompt`); resource URIs pass unchanged (they already
name their origin), and a read goes to the server that listed the URI — or, for a URI made from a
template, to the servers that offer templates. Each upstream request is bounded by the call
timeout. A server that is not ready contributes nothing to a listing, and a request aimed at it
fails with a message that says why instead of "not found".

Resource subscriptions are relayed too: `resources/subscribe` (handshake-era clients) and the
resource URIs of a `subscriptions/listen` stream (2026-07-28 clients) are routed to the server that
owns the URI, which is subscribed once however many downstream sessions want the URI (on a
2026-07-28 upstream through a listen stream of its own). Its `notifications/resources/updated`
reach exactly the sessions subscribed to that URI. The upstream subscription ends when the last
downstream session unsubscribes or goes away, and is renewed when its server reconnects.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio
import mcp.types as types
from anyio.abc import TaskGroup
from mcp import Client, MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, SubscriptionBus
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater._breakwater import Breakwater
from breakwater.catalog._catalog import namespaced
from breakwater.config import GatewayPolicy
from breakwater.connect._readiness import ON_ITS_WAY
from breakwater.status import ServerState

__all__ = ["Passthrough", "Subscriptions", "connection_of", "without_upstream_identity"]

logger = logging.getLogger("breakwater.gateway")

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
T = TypeVar("T")
R = TypeVar("R", bound=types.Result)
#: Bound on the upstream `resources/unsubscribe` sent when the last subscriber leaves (it is shielded).
UNSUBSCRIBE_TIMEOUT_S = 2.0
#: Pause before re-opening an upstream subscription whose stream ended while its server stayed up.
RELINK_PAUSE_S = 1.0

#: Opens the relay scope of a downstream request aimed at `server` (sampling, elicitation and log
#: messages the server sends meanwhile are relayed to that request). See `Gateway`.
Calling = Callable[[ServerRequestContext[Any], str], AbstractAsyncContextManager[Any]]


def without_upstream_identity(result: R) -> R:
    """`result` as the gateway answers it: without the upstream's own `serverInfo` stamp in its `_meta`.

    On 2026-07-28 every result names the server that answered it (`_meta["io.modelcontextprotocol/serverInfo"]`),
    and the SDK's server keeps a stamp the handler wrote rather than its own. Relayed as it came, a result
    told a 2026-07-28 client that it talked to the upstream, not to breakwater, and gave a 2025-era client
    a stamp its revision does not have. Dropped here, the SDK stamps breakwater's own on 2026-07-28 results
    and none on earlier ones, as for any result of breakwater's; every other `_meta` key is the tool's and stays.
    """
    meta = result.meta
    if not meta or SERVER_INFO_META_KEY not in meta:
        return result
    rest = {key: value for key, value in meta.items() if key != SERVER_INFO_META_KEY}
    return result.model_copy(update={"meta": rest or None})


def connection_of(ctx: ServerRequestContext[Any]) -> object:
    """The downstream connection a request came in on (what outlives the per-request `ServerSession`).

    The SDK keeps it on the session without a public accessor (pinned minor version).
    """
    return getattr(ctx.session, "_connection", ctx.session)


@contextlib.asynccontextmanager
async def _no_relay(ctx: ServerRequestContext[Any], server: str) -> AsyncIterator[None]:
    yield


class Passthrough:
    """The gateway's handlers for prompts/*, resources/* and completion/complete."""

    def __init__(
        self,
        bw: Breakwater,
        *,
        policy: GatewayPolicy,
        bus: SubscriptionBus | None = None,
        calling: Calling = _no_relay,
    ) -> None:
        self.bw = bw
        self.template = policy.tool_name_template
        self.name_max = policy.tool_name_max
        self.list_wait_s = policy.list_wait_s
        self._calling = calling
        self._prompts: dict[str, tuple[str, str]] = {}  # downstream name -> (server, upstream name)
        self._resources: dict[str, str] = {}  # uri -> server
        self._templates: dict[str, str] = {}  # uri template -> server
        #: The relayed resource subscriptions (2026-07-28 listeners hear updates through `bus`).
        self.subscriptions = Subscriptions(self, bus)

    async def _settled(self) -> None:
        """Wait, up to `[gateway] list_wait_s`, while a server is still on its way (pending or connecting).

        Prompts and resources are listed live from the ready servers, and what a server still connecting
        offers is not known yet. Many clients list them once, at start-up, as they list tools
        (`Gateway._listable_entries`): a list answered at once in a session's first second left out every
        server half a second from ready. A server that is retrying or failed is not waited for.
        """
        clock = self.bw.clock
        deadline = clock.monotonic() + self.list_wait_s
        while self._on_its_way() and clock.monotonic() < deadline:
            with clock.deadline_scope(deadline):
                await self.bw.wait_changed()

    def _on_its_way(self) -> bool:
        return any(spec.enabled and self.bw.upstream(spec.name).state in ON_ITS_WAY for spec in self.bw.config.servers)

    def _ready(self, capability: str) -> list[tuple[str, Client]]:
        out = []
        for spec in self.bw.config.servers:
            upstream = self.bw.upstream(spec.name)
            client = upstream.client
            if upstream.state is ServerState.READY and client is not None:
                caps = client.server_capabilities
                if getattr(caps, capability, None) is not None:
                    out.append((spec.name, client))
        return out

    async def _bounded(self, server: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        clock = self.bw.clock
        timeout = self.bw.config.server(server).call.timeout_s
        with clock.deadline_scope(clock.monotonic() + timeout) as scope:
            answer = await call(*args, **kwargs)
            return without_upstream_identity(answer) if isinstance(answer, types.Result) else answer
        if scope.cancelled_caught:
            raise MCPError(INTERNAL_ERROR, f"server {server!r} did not answer within {timeout:g} s")
        raise AssertionError("unreachable")  # pragma: no cover

    def _nobody_offers(self, what: str, tried: MCPError | None = None) -> MCPError:
        """No ready server offers `what` (`tried`: the last one's refusal): name the servers that are not ready,
        since one of them may (a resource is no tool: no catalog remembers whose it was), so that "not found" is
        never said of a server still on its way."""
        waiting = [
            f"{s.name} ({s.state.value})"
            for s in self.bw.status().servers
            if s.state not in (ServerState.READY, ServerState.DISABLED)
        ]
        if not waiting:
            return tried or MCPError(INVALID_PARAMS, f"no server offers {what}")
        answered = f" ({tried.error.message})" if tried is not None else ""
        return MCPError(
            INVALID_PARAMS,
            f"no ready server offers {what}{answered}; these are not ready and may: {', '.join(waiting)} "
            "(try again once they are)",
        )

    def _unanswered(self, uri: str, last: MCPError | None) -> MCPError:
        """Why no server answered for the resource `uri`: its server's own refusal if one listed it, else who may hold it."""
        if last is not None and uri in self._resources:
            return last
        return self._nobody_offers(f"the resource {uri!r}", last)

    def _client(self, server: str) -> Client:
        upstream = self.bw.upstream(server)
        if upstream.state is not ServerState.READY or upstream.client is None:
            snap = upstream.snapshot()
            why = f" ({snap.error.code.value}: {snap.error.message})" if snap.error else ""
            raise MCPError(INTERNAL_ERROR, f"server {server!r} is {snap.state.value}{why}; try again later")
        return upstream.client

    async def _paginate(self, server: str, fetch: Callable[..., Awaitable[Any]], field: str) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        while True:
            page = await self._bounded(server, fetch, cursor=cursor, cache_mode="bypass")
            items.extend(getattr(page, field))
            cursor = page.next_cursor
            if not cursor:
                return items

    # ---- prompts -------------------------------------------------------------------------------

    async def list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        prompts: list[types.Prompt] = []
        routes: dict[str, tuple[str, str]] = {}
        await self._settled()
        for server, client in self._ready("prompts"):
            for prompt in await self._paginate(server, client.list_prompts, "prompts"):
                name = namespaced(self.template, server, prompt.name, self.name_max)
                if name not in routes:
                    routes[name] = (server, prompt.name)
                    prompts.append(prompt.model_copy(update={"name": name}))
        self._prompts = routes
        return types.ListPromptsResult(prompts=prompts)

    async def _prompt_route(self, ctx: ServerRequestContext[Any], name: str) -> tuple[str, str]:
        route = self._prompts.get(name)
        if route is None:
            # A client may ask for a prompt it never listed (it knows the name): list once, then route.
            await self.list_prompts(ctx, None)
            route = self._prompts.get(name)
        if route is not None:
            return route
        for spec in self.bw.config.servers:  # a prompt of a server not listed yet: route by its prefix
            prefix = namespaced(self.template, spec.name, "")
            if prefix and name.startswith(prefix) and len(name) > len(prefix):
                return spec.name, name[len(prefix) :]
        raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}")

    async def get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        server, name = await self._prompt_route(ctx, params.name)
        client = self._client(server)
        async with self._calling(ctx, server):
            return await self._bounded(server, client.get_prompt, name, params.arguments)

    # ---- resources -----------------------------------------------------------------------------

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        resources: list[types.Resource] = []
        routes: dict[str, str] = {}
        await self._settled()
        for server, client in self._ready("resources"):
            for resource in await self._paginate(server, client.list_resources, "resources"):
                if str(resource.uri) not in routes:
                    routes[str(resource.uri)] = server
                    resources.append(resource)
        self._resources = routes
        return types.ListResourcesResult(resources=resources)

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates: list[types.ResourceTemplate] = []
        routes: dict[str, str] = {}
        await self._settled()
        for server, client in self._ready("resources"):
            for template in await self._paginate(server, client.list_resource_templates, "resource_templates"):
                if template.uri_template not in routes:
                    routes[template.uri_template] = server
                    templates.append(template)
        self._templates = routes
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri not in self._resources and self._on_its_way():
            # A client may read a URI it knows without listing first, as its session starts.
            await self.learn_owner(ctx, uri)
        last: MCPError | None = None
        for candidate in self._owners(uri):
            try:
                client = self._client(candidate)
                async with self._calling(ctx, candidate):
                    return await self._bounded(candidate, client.read_resource, uri, cache_mode="bypass")
            except MCPError as exc:
                last = exc
        raise self._unanswered(uri, last)

    async def learn_owner(self, ctx: ServerRequestContext[Any], uri: str) -> None:
        """List resources, then resource templates, to learn which server offers `uri` (each list waits for
        the servers on their way: `_settled`); a server that cannot list now is left to `_owners`."""
        with contextlib.suppress(MCPError):
            await self.list_resources(ctx, None)
        if uri not in self._resources:
            with contextlib.suppress(MCPError):
                await self.list_resource_templates(ctx, None)

    def _owners(self, uri: str) -> list[str]:
        """The servers to ask about `uri`: the one that listed it, else (a URI made from a template) the
        servers that offer templates, then every server with resources; the first that answers wins."""
        server = self._resources.get(uri)
        if server is not None:
            return [server]
        return list(dict.fromkeys([*self._templates.values(), *(s for s, _ in self._ready("resources"))]))

    # ---- completions ---------------------------------------------------------------------------

    async def complete(self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> types.CompleteResult:
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            server, name = await self._prompt_route(ctx, ref.name)
            upstream_ref: types.PromptReference | types.ResourceTemplateReference = ref.model_copy(update={"name": name})
        else:
            found = self._templates.get(ref.uri)
            if found is None:
                await self.list_resource_templates(ctx, None)
                found = self._templates.get(ref.uri)
            if found is None:
                raise self._nobody_offers(f"the resource template {ref.uri!r}")
            server, upstream_ref = found, ref
        client = self._client(server)
        argument = {"name": params.argument.name, "value": params.argument.value}
        context = params.context.arguments if params.context is not None else None
        return await self._bounded(server, client.complete, upstream_ref, argument, context)

    def handlers(self) -> dict[str, Any]:
        """Keyword arguments for the SDK's low-level `Server`."""
        return {
            "on_list_prompts": self.list_prompts,
            "on_get_prompt": self.get_prompt,
            "on_list_resources": self.list_resources,
            "on_list_resource_templates": self.list_resource_templates,
            "on_read_resource": self.read_resource,
            "on_subscribe_resource": self.subscriptions.subscribe,
            "on_unsubscribe_resource": self.subscriptions.unsubscribe,
            "on_completion": self.complete,
        }


# ---- resource subscriptions ---------------------------------------------------------------------


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

    def __init__(self, passthrough: Passthrough, bus: SubscriptionBus | None) -> None:
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
        if uri not in self._pt._resources:
            # A client may subscribe to a URI it never listed: learn who owns it first.
            await self._pt.learn_owner(ctx, uri)
        target: ServerSession | _Listeners | None = session if session is not None else self._listeners
        if target is None:
            raise MCPError(INTERNAL_ERROR, "a listen stream needs the gateway's subscription bus")
        last: MCPError | None = None
        for server in self._pt._owners(uri):
            shared = self._shared
            holds = shared[0] if shared is not None and server in shared[1] else self
            try:
                await holds._hold_for(holder, server, uri, target)
                return
            except MCPError as exc:
                last = exc
        raise self._pt._unanswered(uri, last)

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
                            self._pt._client(link.server)
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
        await self._pt._bounded(link.server, client.session.send_request, request, types.EmptyResult)
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
