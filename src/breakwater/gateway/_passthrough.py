"""Prompts, resources and completions of the upstreams, passed through the gateway.

Prompts are namespaced like tools (`server__prompt`); resource URIs pass unchanged (they already
name their origin), and a read goes to the server that listed the URI — or, for a URI made from a
template, to the servers that offer templates. Each upstream request is bounded by the call
timeout. A server that is not ready contributes nothing to a listing, and a request aimed at it
fails with a message that says why instead of "not found". Resource subscriptions are relayed by
`breakwater.gateway._subscriptions`, which asks this module who owns a URI.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import mcp.types as types
from mcp import Client, MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import SubscriptionBus
from mcp_types import SERVER_INFO_META_KEY

from breakwater._breakwater import Breakwater
from breakwater._wire import ERROR_META_KEY
from breakwater.catalog._validate import fits_schema
from breakwater.config import GatewayPolicy
from breakwater.config._checks import downstream_names, route_by_shape
from breakwater.connect._readiness import ON_ITS_WAY
from breakwater.gateway._drain import Drain
from breakwater.gateway._subscriptions import Subscriptions
from breakwater.gateway._waits import first_of
from breakwater.status import ServerState

__all__ = ["Passthrough", "first_list_wait_s", "without_upstream_identity"]

logger = logging.getLogger("breakwater.gateway")

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
T = TypeVar("T")
R = TypeVar("R", bound=types.Result)

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


def fitted(result: types.CallToolResult, output_schema: Mapping[str, Any] | None) -> types.CallToolResult:
    """An error `result` of a tool that declares an output schema, with its envelope in `_meta`, not `structuredContent`.

    The spec says a tool with an output schema returns structured content that conforms to it, and
    the TypeScript SDK's client (Claude Code, Cursor, the Inspector) checks `structuredContent`
    against the schema even on an `isError` result: breakwater's envelope there made every error of
    such a tool a client-side "Structured content does not match the tool's output schema", and the
    model lost the envelope's advice. So where the schema rejects it, the envelope moves to
    `_meta["io.breakwater/error"]` (without the upstream's own structured content, which goes back
    where the tool put it); the note in the content, which is what the model reads, is unchanged. A
    schema the envelope fits (an open object, as the SDK's servers declare for a dict) keeps it.
    """
    structured = result.structured_content
    if output_schema is None or not result.is_error or not isinstance(structured, dict) or structured.get("ok") is not False:
        return result
    if fits_schema(output_schema, structured):
        return result
    envelope = {key: value for key, value in structured.items() if key != "upstream"}
    meta = {**(result.meta or {}), ERROR_META_KEY: envelope}
    return result.model_copy(update={"structured_content": structured.get("upstream"), "meta": meta})


@contextlib.asynccontextmanager
async def _no_relay(ctx: ServerRequestContext[Any], server: str) -> AsyncIterator[None]:
    yield


#: Agents that give up on their first tools/list sooner than `[gateway] list_wait_s`, and after how long. OpenCode
#: waits `timeout` (default 5000 ms) for the list of a server it has just connected to, then closes that server and
#: marks it failed, every tool lost for the session (packages/opencode/src/mcp/index.ts,
#: `withTimeout(mcpClient.listTools(), mcp.timeout ?? 5000)`): a first list held the full 5 s came 4 ms too late.
#: Claude Code's `claude mcp list`, the check users run after `claude mcp add`, gives its list 5 s too
#: (`client.listTools(void 0, {timeout: 5000})` in 2.1.197), and printed "! Connected · tools fetch failed"
#: while a server was still starting; its sessions follow list_changed.
CLIENT_LIST_DEADLINES_S: dict[str, float] = {"opencode": 5.0, "claude-code": 5.0}
#: How long before such a client's deadline the first list is answered (the answer's way back, a slow host).
LIST_DEADLINE_MARGIN_S = 1.0


def first_list_wait_s(list_wait_s: float, client: str | None) -> float:
    """How long a first tools/list may wait for servers on their way: `list_wait_s`, or less for `client` when it
    gives up sooner (what the list leaves out follows in list_changed, which those clients follow)."""
    deadline = CLIENT_LIST_DEADLINES_S.get(client or "")
    return list_wait_s if deadline is None else max(0.0, min(list_wait_s, deadline - LIST_DEADLINE_MARGIN_S))


class Passthrough:
    """The gateway's handlers for prompts/*, resources/* and completion/complete."""

    def __init__(
        self,
        bw: Breakwater,
        *,
        policy: GatewayPolicy,
        bus: SubscriptionBus | None = None,
        calling: Calling = _no_relay,
        drain: Drain | None = None,
    ) -> None:
        self.bw = bw
        #: The session's drain: a list waiting for servers answers with what it has once the session starts to end.
        self._drain = drain if drain is not None else Drain(bw.clock)
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
        while self._on_its_way() and clock.monotonic() < deadline and not self._drain.draining:
            with clock.deadline_scope(deadline):
                await first_of(self.bw.wait_changed, self._drain.started)

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

    async def bounded(self, server: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """`call(*args, **kwargs)` to `server`, bounded by its call timeout (an MCP error when it runs out)."""
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

    def unanswered(self, uri: str, last: MCPError | None) -> MCPError:
        """Why no server answered for the resource `uri`: its server's own refusal if one listed it, else who may hold it."""
        if last is not None and uri in self._resources:
            return last
        return self._nobody_offers(f"the resource {uri!r}", last)

    def client(self, server: str) -> Client:
        """`server`'s client if it is ready, else an MCP error that says its state and why."""
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
            page = await self.bounded(server, fetch, cursor=cursor, cache_mode="bypass")
            items.extend(getattr(page, field))
            cursor = page.next_cursor
            if not cursor:
                return items

    # ---- prompts -------------------------------------------------------------------------------

    async def list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        await self._settled()
        listed = [
            (server, prompt)
            for server, client in self._ready("prompts")
            for prompt in await self._paginate(server, client.list_prompts, "prompts")
        ]
        names = downstream_names(self.template, [(server, prompt.name) for server, prompt in listed], self.name_max)
        prompts: list[types.Prompt] = []
        routes: dict[str, tuple[str, str]] = {}
        for (server, prompt), name in zip(listed, names, strict=True):
            if name not in routes:  # else the server listed this prompt twice
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
        # A prompt of a server not listed yet: route by the name's shape.
        route = route_by_shape(self.template, (spec.name for spec in self.bw.config.servers), name)
        if route is not None:
            return route
        raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}")

    async def get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        server, name = await self._prompt_route(ctx, params.name)
        client = self.client(server)
        async with self._calling(ctx, server):
            return await self.bounded(server, client.get_prompt, name, params.arguments)

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
        if self._on_its_way():
            # A client may read a URI it knows without listing first, as its session starts.
            await self.learn_owner(ctx, uri)
        last: MCPError | None = None
        for candidate in self.owners(uri):
            try:
                client = self.client(candidate)
                async with self._calling(ctx, candidate):
                    return await self.bounded(candidate, client.read_resource, uri, cache_mode="bypass")
            except MCPError as exc:
                last = exc
        raise self.unanswered(uri, last)

    async def learn_owner(self, ctx: ServerRequestContext[Any], uri: str) -> None:
        """List resources, then resource templates, to learn which server offers `uri` (each list waits for
        the servers on their way: `_settled`); a server that cannot list now is left to `owners`."""
        if uri in self._resources:
            return
        with contextlib.suppress(MCPError):
            await self.list_resources(ctx, None)
        if uri not in self._resources:
            with contextlib.suppress(MCPError):
                await self.list_resource_templates(ctx, None)

    def owners(self, uri: str) -> list[str]:
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
        client = self.client(server)
        argument = {"name": params.argument.name, "value": params.argument.value}
        context = params.context.arguments if params.context is not None else None
        return await self.bounded(server, client.complete, upstream_ref, argument, context)

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
