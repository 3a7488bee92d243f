"""The gateway: one MCP server in front of all the others.

`breakwater serve` exposes every upstream tool under a namespaced name, through the call gate,
over stdio (what Claude Code, Cursor, Claude Desktop and VS Code launch) or streamable HTTP on
127.0.0.1 (one shared gateway for many agent sessions). It answers "where is tool X?" three ways:
the tool does not exist, its server is still connecting, or its server failed (with the reason and
the next retry) — never "no such tool" for a server that is merely down.

What an upstream sends back while it works on a call is relayed to the client that made the call
(`Relay`): sampling and elicitation requests (as server-to-client requests to 2025-11-25 clients,
as `InputRequiredResult` rounds to 2026-07-28 ones) and log messages (at the caller's level).
Resource subscriptions are relayed by `breakwater.gateway._subscriptions.Subscriptions`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import mcp.types as types
from anyio.abc import TaskGroup
from mcp import MCPError
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, PromptsListChanged, ResourcesListChanged, ToolsListChanged
from mcp.shared.inbound import X_MCP_HEADER_KEY, _walk_schema_positions
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater._breakwater import Breakwater
from breakwater._wire import DEADLINE_META_KEY, OPERATION_ID_META_KEY, operation_id_problem
from breakwater.catalog._approval import ChangedTools
from breakwater.catalog._catalog import Catalog, Entry
from breakwater.config import GatewayPolicy
from breakwater.config._checks import route_by_shape
from breakwater.connect._readiness import ON_ITS_WAY
from breakwater.errors import CallCancelledError, UnknownToolError
from breakwater.gate._call import OPERATION_ID_ARGUMENT, invalid_operation_id
from breakwater.gate._envelope import error_result
from breakwater.gateway._builtins import BuiltinTools, SearchAnswer
from breakwater.gateway._connection import connection_of
from breakwater.gateway._drain import Drain
from breakwater.gateway._frames import deadline_seconds, explain_params_errors, invalid_deadline
from breakwater.gateway._operations import forwarded_once
from breakwater.gateway._passthrough import Passthrough, first_list_wait_s, fitted, without_upstream_identity
from breakwater.gateway._relay import (
    EXCHANGE_KEEP_S,
    EXCHANGE_STATE_PREFIX,
    LOG_LEVEL_STATE,
    Relay,
    _Caller,
    _can_answer,
    _Exchange,
    explain_refusal,
)
from breakwater.gateway._spans import spans_only_when_traced
from breakwater.gateway._subscriptions import RelayedListen
from breakwater.gateway._tasks import GatewayTasks
from breakwater.gateway._waits import first_of
from breakwater.journal import DOWNSTREAM_CLIENT
from breakwater.state._operations import OperationRecords
from breakwater.status import ServerState
from breakwater.tasks._server import current_task_id

__all__ = ["DEADLINE_META_KEY", "Gateway", "GatewayPolicy", "SearchAnswer"]

logger = logging.getLogger("breakwater.gateway")

CALLED_STATE = "breakwater.calledTool"  # in the downstream connection's `state`: it has called a tool


#: The other lists the gateway says have changed: their listen-stream event and handshake-era notification.
_LISTS: dict[str, tuple[Any, str]] = {
    "prompts": (PromptsListChanged(), "notifications/prompts/list_changed"),
    "resources": (ResourcesListChanged(), "notifications/resources/list_changed"),
}


class _GatewayServer(Server[Any]):
    """The SDK's low-level server, announcing `listChanged` for tools, prompts and resources to handshake-era clients."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        # The HTTP session manager calls this with no arguments; the gateway does send list_changed.
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True),
            experimental_capabilities,
            extensions,
        )


#: A call without a turn budget enters this; a budget is entered by a plain `with` too: no coroutines (issue 16).
_NO_BUDGET = contextlib.nullcontext()


def _client_name(ctx: ServerRequestContext[Any], meta: Mapping[str, Any]) -> str | None:
    """The downstream client's name: from `initialize` on handshake-era connections, else the 2026-07-28 `_meta` envelope."""
    params = ctx.session.client_params
    if params is not None:
        return params.client_info.name
    info = meta.get(types.CLIENT_INFO_META_KEY)
    name = info.get("name") if isinstance(info, Mapping) else None
    return name if isinstance(name, str) else None


#: Whether a listed tool's input schema declares `x-mcp-header` arguments, by the tool definition (kept alive
#: here, so an id is never reused while it is a key); cleared when it grows past a bound (definitions change
#: rarely; the built-ins' are made afresh for each list, so they are not remembered).
_DECLARES_HEADERS: dict[int, tuple[types.Tool, bool]] = {}
_DECLARES_HEADERS_MAX = 4096


def _declares_headers(tool: types.Tool, *, remember: bool = True) -> bool:
    known = _DECLARES_HEADERS.get(id(tool))
    if known is not None and known[0] is tool:
        return known[1]
    declares = any(X_MCP_HEADER_KEY in position for _, position in _walk_schema_positions(tool.input_schema))
    if not remember:
        return declares
    if len(_DECLARES_HEADERS) >= _DECLARES_HEADERS_MAX:
        _DECLARES_HEADERS.clear()
    _DECLARES_HEADERS[id(tool)] = (tool, declares)
    return declares


class Gateway:
    """The MCP server face of a `Breakwater`."""

    def __init__(
        self,
        bw: Breakwater,
        policy: GatewayPolicy,
        *,
        catalog: Catalog,
        relay: Relay | None = None,
        view_of: Gateway | None = None,
    ) -> None:
        """`relay` is the one whose callbacks `bw`'s connections were built with (`Breakwater(client_hooks=
        relay.client_kwargs)`, as `open_gateway` does); without one the gateway makes its own and hands it to
        `bw`'s servers before their first connect. `view_of` makes this one attached session's view of a shared
        gateway (`gateway._session`): subscriptions to the resources of `view_of`'s servers are held by `view_of`,
        which hears their updates for every session, and the relay's deliveries stay `view_of`'s."""
        self.bw = bw
        self.policy = policy
        self.catalog = catalog
        self.bus = InMemorySubscriptionBus()
        #: Handshake-era client connections, told of list changes on their own channel (`_track`).
        self._legacy_connections: dict[int, Connection] = {}
        self._signature: tuple[Any, ...] = ()
        self._entries: list[Entry] = []
        self._index: dict[str, Entry] = {}
        self._generation = -1  # the Breakwater generation `_entries` was built from
        self._catalog_version = -1  # and the catalog's version
        self.drift: dict[str, list[str]] = {}  # server -> tools whose definition changed since approved
        self._tg: TaskGroup | None = None  # the gateway's background work (`watch`)
        if relay is None:
            relay = Relay(clock=bw.clock)
            for spec in bw.config.servers:
                # Read at each connect: servers connect in the background and this runs before the first one.
                bw.upstream(spec.name).client_hooks = relay.client_kwargs
        self.relay = relay
        relay.logs.attend(self, self._legacy_connections)  # its sessions hear its servers' log messages outside calls
        #: With Redis, the fleet's records of forwarded operations (`breakwater.gateway._operations`); set by serve --http.
        self.operations: OperationRecords | None = None
        #: SIGTERM's graceful drain over HTTP (`breakwater.gateway._drain`).
        self.drain = Drain(bw.clock)
        self.passthrough = Passthrough(bw, policy=policy, bus=self.bus, calling=self.relay.calling, drain=self.drain)
        if view_of is None:
            relay.deliver_to(self.passthrough.subscriptions.deliver)
        else:
            shared = frozenset(spec.name for spec in view_of.bw.config.servers)
            self.passthrough.subscriptions.share(view_of.passthrough.subscriptions, shared)
        from importlib.metadata import version

        self.server = _GatewayServer(
            "breakwater",
            version=version("mcp-breakwater"),
            instructions=(
                "breakwater is a gateway in front of several MCP servers. Tool names are "
                f"{policy.tool_name_template.format(server='server', tool='tool')}. "  # the names it lists, as configured
                "If a tool you expect is missing or its server is down, call "
                f"{policy.search_tool or 'the search tool'} before concluding it does not exist."
            ),
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
            get_tool_input_schema=self.header_schema,
            on_subscriptions_listen=RelayedListen(self.bus, self.passthrough.subscriptions),
            **self.passthrough.handlers(),
        )
        spans_only_when_traced(self.server)
        self.server.middleware.append(explain_params_errors)  # a bare -32602 says what was wrong
        # Not `on_set_logging_level=`: that warns (deprecated at 2026-07-28) on every start.
        self.server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._on_set_level)
        self.builtins = BuiltinTools(bw, policy, entries=self.entries, drift=lambda: self.drift)
        # The 2026-07-28 tasks extension for downstream clients that declare it (breakwater.gateway._tasks).
        self.tasks = GatewayTasks(self.server, bw=bw, builtin_tools=self.builtins.names)
        if policy.drift == "block":
            # At the gate, where the server is ready and its tools known: the check here below passed a call made
            # while the server was connecting, and `breakwater call` skipped it (both ran the changed tool).
            bw.gate.approve = ChangedTools(self.catalog, bw.upstream)

    # ---- the catalog as the gateway shows it ----------------------------------------------------

    def refresh(self) -> list[Entry]:
        """Recompute the listed tools from the servers' states (and remember ready servers' tools on disk)."""
        # Only a change of this gateway's own servers teaches the catalog. A build because the catalog moved
        # must not: two sessions whose processes of one server list different tools would teach it in turn forever.
        learn = self._generation != self.bw.generation
        triples = []
        drift: dict[str, list[str]] = {}
        for spec in self.bw.config.servers:
            if not spec.enabled:
                continue
            upstream = self.bw.upstream(spec.name)
            fingerprint = spec.fingerprint()
            if upstream.state is ServerState.READY:
                tools = list(upstream.tools)
                if learn:
                    self.catalog.remember(spec.name, fingerprint, tools)
                changed = self.catalog.drifted(spec.name, fingerprint, tools)
                if changed and self.policy.drift == "accept":
                    logger.warning("server %s changed tools %s; accepted (drift = accept)", spec.name, changed)
                    self.catalog.accept(spec.name, fingerprint, tools, changed)
                elif changed:
                    drift[spec.name] = changed
                    if self.policy.drift == "block":
                        tools = [t for t in tools if t.name not in changed]
                triples.append((spec.name, True, tools))
            elif self.policy.list_unready_tools:
                triples.append((spec.name, False, self.catalog.load(spec.name, fingerprint)))
        self.drift = drift
        self._entries = self.catalog.entries(triples, reserved=self.builtins.names)
        self._index = {e.name: e for e in self._entries}
        # After `remember`: what this build taught the catalog is in it already.
        self._generation, self._catalog_version = self.bw.generation, self.catalog.version
        return self._entries

    def entries(self) -> list[Entry]:
        """Every tool the gateway lists: live tools of ready servers, last-known tools of the others.

        Rebuilt only when a server's state or tools changed since the last build, or the catalog learned
        a server's tools (from another session of a shared gateway), so a call reads a cached index, and
        never a stale one.
        """
        if self._generation == self.bw.generation and self._catalog_version == self.catalog.version:
            return self._entries
        return self.refresh()

    def header_schema(self, name: str) -> Mapping[str, Any] | None:
        """The input schema `tools/list` shows for the tool `name` if it declares `x-mcp-header` arguments, else None.

        The SDK's `get_tool_input_schema`, for its check of a 2026-07-28 call's `Mcp-Param-*` headers:
        without it the SDK runs the whole `tools/list` handler (a fresh connection, the middleware, the
        catalog's serialisation) on every call to find one schema, about a fifth of that entry's cost
        per call (docs/benchmarks.md, issue 16). A schema that declares no header can refuse nothing
        (`validate_mcp_param_headers` walks it and finds no position to check), so for it, as for a tool
        that is not listed, the answer is None and the walk is skipped.
        """
        if name in self.builtins.handlers:
            tool = next((t for t in self.builtins.tools() if t.name == name), None)
            return tool.input_schema if tool is not None and _declares_headers(tool, remember=False) else None
        self.entries()
        entry = self._index.get(name)
        return entry.tool.input_schema if entry is not None and _declares_headers(entry.tool) else None

    def resolve(self, name: str) -> tuple[str, str] | None:
        """The (server, tool) behind a downstream name: from the catalog, else from the name's shape."""
        self.entries()
        entry = self._index.get(name)
        if entry is not None:
            return entry.server, entry.tool.name
        # A server that was never seen has no catalog yet: still route its tools by their names' shape,
        # so the caller hears "connecting" or "failed" instead of "no such tool".
        return route_by_shape(self.catalog.template, (spec.name for spec in self.bw.config.servers), name)

    # ---- change notifications ------------------------------------------------------------------

    def _current_signature(self) -> tuple[Any, ...]:
        states = tuple((s.name, s.state is ServerState.READY) for s in self.bw.status().servers)
        names = tuple(e.name for e in self.refresh())
        return states, names

    def _lists_signature(self, kind: str) -> tuple[Any, ...]:
        """What the prompts (or resources) list is made of: the ready servers that offer them, and how often
        each said its list changed."""
        offering = []
        for spec in self.bw.config.servers:
            upstream = self.bw.upstream(spec.name)
            client = upstream.client
            if upstream.state is ServerState.READY and client is not None and getattr(client.server_capabilities, kind, None):
                offering.append((spec.name, upstream.lists_version))
        return tuple(offering)

    async def watch(self) -> None:
        """Run the gateway's background work until cancelled.

        Tells downstream clients when the tool list changes (a server becomes ready, changes its
        tools or fails), and hosts the relayed resource subscriptions and the upstream calls of
        2026-07-28 clients waiting between rounds.
        """
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.passthrough.subscriptions.attach(tg)
            try:
                await self._watch_lists()
            finally:
                self._tg = None
                self.passthrough.subscriptions.attach(None)
                tg.cancel_scope.cancel()

    async def _watch_lists(self) -> None:
        # Prompts and resources are listed live from the ready servers, so their lists change when a server
        # that offers them comes or goes, or says they changed: a client that listed them in the first
        # minute (Claude Code's slash commands) hears of the servers that were still on their way.
        self._signature = self._current_signature()
        lists = {kind: self._lists_signature(kind) for kind in _LISTS}
        while True:
            await self._wait_changed()
            signature = self._current_signature()
            if signature != self._signature:
                self._signature = signature
                await self.notify_tools_changed()
            for kind, (event, method) in _LISTS.items():
                now = self._lists_signature(kind)
                if now != lists[kind]:
                    lists[kind] = now
                    await self._notify(event, method)

    async def notify_tools_changed(self) -> None:
        """`notifications/tools/list_changed` to every downstream client that can receive it."""
        await self._notify(ToolsListChanged(), "notifications/tools/list_changed")

    async def _notify(self, event: Any, method: str) -> None:
        """A list-changed `event` to 2026-07-28 listeners, and `method` to every handshake-era client connection."""
        await self.bus.publish(event)
        for connection in list(self._legacy_connections.values()):
            await connection.notify(method, None)  # best effort: a client that went away is skipped, never raises

    def _track(self, ctx: ServerRequestContext[Any]) -> None:
        # Handshake-era clients get list_changed on the connection's own channel; 2026-07-28 clients listen. The
        # connection is what is kept, not the request's ServerSession: that pinned the request it came with (its
        # context, its body, its parsed params) for the connection's life, 3 MB per session for a 3 MB call.
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        connection = connection_of(ctx)
        key = id(connection)
        if isinstance(connection, Connection) and key not in self._legacy_connections:
            # Forgotten when the connection ends (a session deleted or expired, stdio's end of input): kept until a
            # notification failed, each one held ~25 KB, 1,000 sessions 26 MB, and its id could name a new one.
            connection.exit_stack.callback(self._legacy_connections.pop, key, None)
            self._legacy_connections[key] = connection

    # ---- request handlers -----------------------------------------------------------------------

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._track(ctx)
        # A client that already called a tool knows what it wants: its list (the SDK client lists after a
        # call, for the output schema) must not hold the answer it is waiting for.
        state = getattr(connection_of(ctx), "state", None)
        called = isinstance(state, dict) and state.get(CALLED_STATE, False)
        if called:
            entries = self.entries()
        else:
            meta = ctx.meta if isinstance(ctx.meta, Mapping) else {}
            entries = await self._listable_entries(first_list_wait_s(self.policy.list_wait_s, _client_name(ctx, meta)))
        return types.ListToolsResult(tools=self.builtins.tools() + [e.downstream() for e in entries])

    async def _listable_entries(self, wait_s: float) -> list[Entry]:
        """The entries, once connecting servers with nothing listed yet are ready (or `list_wait_s` passed).

        Many clients read the tool list once, at start-up, and ignore list_changed: a first-ever
        `serve` must not answer with the built-ins alone for servers half a second from ready.
        """
        clock = self.bw.clock
        deadline = clock.monotonic() + wait_s
        # Nor past the session's end (its input closed, a SIGTERM): the list answered a bare -32000 then.
        while self._unlisted_on_its_way() and clock.monotonic() < deadline and not self.drain.draining:
            with clock.deadline_scope(deadline):
                await first_of(self.bw.wait_changed, self.catalog.wait_changed, self.drain.started)
        return self.entries()

    async def _wait_changed(self) -> None:
        """Return at the next change of a server or of the catalog (another session of a shared gateway taught it)."""
        await first_of(self.bw.wait_changed, self.catalog.wait_changed)

    def _unlisted_on_its_way(self) -> bool:
        listed = {e.server for e in self.entries()}
        names = [spec.name for spec in self.bw.config.servers if spec.enabled and spec.name not in listed]
        return any(self.bw.upstream(name).state in ON_ITS_WAY for name in names)

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        self._track(ctx)
        state = getattr(connection_of(ctx), "state", None)
        if isinstance(state, dict):
            state[CALLED_STATE] = True
        if params.request_state is not None:  # only ever one of the gateway's own (`_Exchange`)
            return await self._resume(ctx, params)
        arguments = dict(params.arguments or {})
        builtin = self.builtins.handlers.get(params.name)
        if builtin is not None:
            return await builtin(ctx, arguments)
        target = self.resolve(params.name)
        if target is None:
            message = f"There is no tool named {params.name!r}."
            if self.policy.search_tool:
                message += f" Call {self.policy.search_tool} to find the right one."
            return error_result(UnknownToolError(message, tool=params.name))
        server, tool = target
        # Arguments that do not fit the tool's input schema are refused by the gate (INVALID_ARGUMENTS), as for a library caller.
        arguments_for = (server, tool, arguments)
        # Inside a gateway task (breakwater.gateway._tasks) there is no next round to carry questions in.
        in_task = current_task_id() is not None
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and self._tg is not None and _can_answer(ctx) and not in_task:
            answer = await self._exchange_round(ctx, self._start_exchange(ctx, params.name, *arguments_for))
            return self._fitted(params.name, answer) if isinstance(answer, types.CallToolResult) else answer
        async with self.relay.calling(ctx, server) as caller:
            result = await self._call(caller, ctx, *arguments_for)
        return self._fitted(params.name, result) if result.is_error else result

    def _fitted(self, name: str, result: types.CallToolResult) -> types.CallToolResult:
        """`result` as a client that checks `name`'s output schema can take it (`_passthrough.fitted`)."""
        entry = self._index.get(name)
        return fitted(result, entry.tool.output_schema if entry is not None else None)

    async def _call(
        self, caller: _Caller, first: ServerRequestContext[Any], server: str, tool: str, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        """Call through the gate, relaying progress (and, through `caller`, what the server asks) downstream."""

        async def relay_progress(progress: float, total: float | None, message: str | None) -> None:
            # The SDK may deliver the last progress after the call returned; the request is gone by then.
            ctx = caller.ctx
            if ctx is not None and not caller.finished:
                await ctx.session.report_progress(progress, total, message)

        meta = first.meta if isinstance(first.meta, Mapping) else {}
        deadline_ms = meta.get(DEADLINE_META_KEY)
        # An agent that re-sends a call with its own operation id gets the same operation upstream.
        given = meta.get(OPERATION_ID_META_KEY)
        if given is not None and (problem := operation_id_problem(given)) is not None:
            return error_result(invalid_operation_id(problem, server, tool))
        operation_id = given if isinstance(given, str) else None
        own = arguments.get(OPERATION_ID_ARGUMENT)
        if operation_id is None and not (isinstance(own, str) and own):
            # Made here rather than by the gate, so a call the drain cuts can name its operation. As random
            # as `uuid4().hex` (128 bits, 32 hex digits), at a sixth of its cost on every call (issue 16).
            operation_id = os.urandom(16).hex()
        budget: Any = _NO_BUDGET
        if (refused := invalid_deadline(deadline_ms, server=server, tool=tool)) is not None:
            return error_result(refused)
        if deadline_ms is not None:
            budget = self.bw.budget(seconds=deadline_seconds(deadline_ms))
        # A stdio upstream counts what it sends on its own: if that count did not move during the call,
        # no progress or log message can be on its way to the caller, and the answer need not wait for one.
        process = self.bw.upstream(server).process
        parser = process.parser if process is not None else None
        notices = parser.notices if parser is not None else None
        # The journal names the agent behind each call.
        client = DOWNSTREAM_CLIENT.set(_client_name(first, meta))

        async def run() -> types.CallToolResult:
            with self.drain.call(lambda: caller.attempt is not None) as in_flight, budget:
                result = await self.bw.gate_call(
                    server, tool, arguments, progress_callback=relay_progress, operation_id=operation_id
                )
            if in_flight.scope.cancelled_caught:
                cut = self.drain.cut_error(self.bw, in_flight, server, tool, operation_id or own)
                return error_result(cut)
            # Progress and log messages that arrived before the result reach the caller before it does.
            if parser is None or parser.notices != notices:
                await caller.drain()
            return explain_refusal(without_upstream_identity(result), caller)

        try:
            if self.operations is None:
                result = await run()
            else:
                # A client's own id may be a retry of a call another replica ran (breakwater.gateway._operations).
                chosen = operation_id if given is not None else own if isinstance(own, str) and own else None
                deadline_s = deadline_seconds(deadline_ms) if deadline_ms is not None else None
                result = await forwarded_once(self.operations, self.bw, chosen, server, tool, arguments, deadline_s, run)
        finally:
            DOWNSTREAM_CLIENT.reset(client)
        if (native := self.relay.url_elicitation_required(result, caller)) is not None:
            raise native
        return result

    # ---- 2026-07-28 clients asked for input (multi round-trip) ------------------------------------

    def _start_exchange(
        self, ctx: ServerRequestContext[Any], name: str, server: str, tool: str, arguments: dict[str, Any]
    ) -> _Exchange:
        """Run the call in the gateway's task group, so it can wait across the client's rounds."""
        assert self._tg is not None
        exchange = _Exchange(token=EXCHANGE_STATE_PREFIX + secrets.token_urlsafe(18), tool=name)
        self.relay.exchanges[exchange.token] = exchange

        async def run() -> None:
            try:
                with exchange.scope:
                    async with self.relay.calling(ctx, server, exchange=exchange) as caller:
                        exchange.result = await self._call(caller, ctx, server, tool, arguments)
            except Exception:  # one call's failure must not take the gateway's task group down
                logger.exception("call of %s failed inside the gateway", name)
            finally:
                if exchange.result is None:
                    exchange.result = error_result(CallCancelledError("The call was cancelled before it finished."))
                exchange.done = True
                exchange.poke()
            # Kept until the client's next round collects it, or for a while.
            clock = self.bw.clock
            with clock.deadline_scope(clock.monotonic() + EXCHANGE_KEEP_S):
                await exchange.collected.wait()
            self.relay.exchanges.pop(exchange.token, None)

        self._tg.start_soon(run, name=f"breakwater call {name}")
        return exchange

    async def _exchange_round(
        self, ctx: ServerRequestContext[Any], exchange: _Exchange
    ) -> types.CallToolResult | types.InputRequiredResult:
        """One round: the call's result, or the questions it is waiting on (`InputRequiredResult`)."""
        async with exchange.lock:
            exchange.ctx = ctx
            try:
                await exchange.settle()
            except anyio.get_cancelled_exc_class():
                # The client gave up on this round (cancelled, disconnected): the call goes too.
                exchange.scope.cancel()
                raise
            finally:
                exchange.ctx = None
            if exchange.done:
                assert exchange.result is not None  # set before `done`
                exchange.collected.set()
                self.relay.exchanges.pop(exchange.token, None)
                return exchange.result
            questions: types.InputRequests = {key: q.request for key, q in exchange.open_questions().items()}
            return types.InputRequiredResult(input_requests=questions, request_state=exchange.token)

    async def _resume(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        exchange = self.relay.exchanges.get(params.request_state or "")
        if exchange is None or exchange.tool != params.name:
            raise MCPError(types.INVALID_PARAMS, "unknown or expired requestState: call the tool again")
        exchange.answer(params.input_responses)
        answer = await self._exchange_round(ctx, exchange)
        return self._fitted(params.name, answer) if isinstance(answer, types.CallToolResult) else answer

    async def _on_set_level(self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        """`logging/setLevel`: the least severe level this connection wants relayed from upstream log messages."""
        state = getattr(connection_of(ctx), "state", None)
        if isinstance(state, dict):
            state[LOG_LEVEL_STATE] = params.level
        return types.EmptyResult()

    # ---- built-in tools and drift -------------------------------------------------------------

    async def search(self, query: str, *, wait_s: float | None = None) -> SearchAnswer:
        """The search tool's answer for `query` (see `BuiltinTools.search`)."""
        return await self.builtins.search(query, wait_s=wait_s)

    def live_entries(self) -> list[Entry]:
        """Every ready server's tools as the gateway names them, those changed since approved (and blocked) included."""
        ready = [spec for spec in self.bw.config.servers if self.bw.upstream(spec.name).state is ServerState.READY]
        # All servers at once: a tool renamed for a clash is named as listed.
        return self.catalog.entries([(spec.name, True, self.bw.upstream(spec.name).tools) for spec in ready], self.builtins.names)

    def accept(self, names: Sequence[str] = ()) -> list[str]:
        """Approve the current definitions of the named (downstream) tools, or of every changed tool."""
        self.refresh()
        wanted = set(names)
        accepted: list[str] = []
        ready = [spec for spec in self.bw.config.servers if self.bw.upstream(spec.name).state is ServerState.READY]
        live = self.live_entries()
        for spec in ready:
            tools = self.bw.upstream(spec.name).tools
            own = [e for e in live if e.server == spec.name]
            todo = [e.tool.name for e in own if e.name in wanted] if wanted else self.drift.get(spec.name, [])
            done = set(self.catalog.accept(spec.name, spec.fingerprint(), tools, todo))
            accepted += [e.name for e in own if e.tool.name in done]
        self.refresh()
        return accepted
