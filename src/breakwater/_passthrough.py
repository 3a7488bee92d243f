"""Prompts, resources and completions of the upstreams, passed through the gateway.

Prompts are namespaced like tools (`server__prompt`); resource URIs pass unchanged (they already
name their origin), and a read goes to the server that listed the URI — or, for a URI made from a
template, to the servers that offer templates. Each upstream request is bounded by the call
timeout. A server that is not ready contributes nothing to a listing, and a request aimed at it
fails with a message that says why instead of "not found".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp.types as types
from mcp import Client, MCPError
from mcp.server.context import ServerRequestContext

from breakwater._breakwater import Breakwater
from breakwater._catalog import namespaced
from breakwater.status import ServerState

__all__ = ["Passthrough"]

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
T = TypeVar("T")


class Passthrough:
    """The gateway's handlers for prompts/*, resources/* and completion/complete."""

    def __init__(self, bw: Breakwater, *, template: str) -> None:
        self.bw = bw
        self.template = template
        self._prompts: dict[str, tuple[str, str]] = {}  # downstream name -> (server, upstream name)
        self._resources: dict[str, str] = {}  # uri -> server
        self._templates: dict[str, str] = {}  # uri template -> server

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
            return await call(*args, **kwargs)
        if scope.cancelled_caught:
            raise MCPError(INTERNAL_ERROR, f"server {server!r} did not answer within {timeout:g} s")
        raise AssertionError("unreachable")  # pragma: no cover

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
        for server, client in self._ready("prompts"):
            for prompt in await self._paginate(server, client.list_prompts, "prompts"):
                name = namespaced(self.template, server, prompt.name)
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
        return await self._bounded(server, client.get_prompt, name, params.arguments)

    # ---- resources -----------------------------------------------------------------------------

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        resources: list[types.Resource] = []
        routes: dict[str, str] = {}
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
        server = self._resources.get(uri)
        if server is not None:
            client = self._client(server)
            return await self._bounded(server, client.read_resource, uri, cache_mode="bypass")
        # Not a listed resource: a URI made from a template. Ask the servers that offer templates
        # (then every server with resources), first answer wins.
        candidates = list(dict.fromkeys([*self._templates.values(), *(s for s, _ in self._ready("resources"))]))
        last: MCPError | None = None
        for candidate in candidates:
            try:
                client = self._client(candidate)
                return await self._bounded(candidate, client.read_resource, uri, cache_mode="bypass")
            except MCPError as exc:
                last = exc
        raise last or MCPError(INVALID_PARAMS, f"no server offers the resource {uri!r}")

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
                raise MCPError(INVALID_PARAMS, f"no server offers the resource template {ref.uri!r}")
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
            "on_completion": self.complete,
        }
