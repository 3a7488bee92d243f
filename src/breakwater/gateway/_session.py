"""One attached session's view of the shared gateway: the shared servers, plus stdio servers of its own.

A stdio server often keeps per-connection state (a thought history, an open repository, a working
directory), so in a shared gateway each session gets its own process of every stdio server that
`[gateway] share_stdio` does not name and whose entry does not say `"shared": true`, while HTTP
servers (and the shared stdio ones) are the gateway's, one connection for everyone. A session's
own processes start as a `serve` of its own would start them: in the session's working directory
(unless the entry names one) and with the session's inherited variables under the entry's `env`
(`SessionContext`, sent in the attach handshake), not the gateway's, which are those of whichever
session happened to start it.
`session_gateway` opens such a session: a `Breakwater` of the session's own servers (its attempts go
to the shared journal) and a `Gateway` over both, seen through `SessionServers`, which routes each
server to the `Breakwater` that holds it. The catalog of last-known tools and the relay of sampling,
elicitation and logs are the shared gateway's; the session's own servers get its client's roots
(`breakwater.gateway._roots`), the shared ones none.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, cast

import anyio
import mcp.types as types

from breakwater._breakwater import Breakwater
from breakwater._clock import Clock
from breakwater.config import Config, ServerSpec
from breakwater.connect._transports import OpenedTransport, TransportFactory, default_transports, stdio_transport
from breakwater.connect._upstream import Upstream
from breakwater.gate._gate import ProgressCallback
from breakwater.gate._turn_budget import TurnBudgetScope
from breakwater.gateway._roots import ClientRoots
from breakwater.gateway._server import Gateway
from breakwater.gateway._share import SessionContext, per_session
from breakwater.gateway._waits import first_of
from breakwater.status import StatusReport

__all__ = ["SessionServers", "per_session", "session_gateway", "session_transports"]


def session_transports(context: SessionContext) -> TransportFactory:
    """Connect attempts of one session's own servers: its stdio processes started where the session runs."""

    async def transports(spec: ServerSpec, stack: AsyncExitStack, *, report_lost: Callable[[], None]) -> OpenedTransport:
        if spec.transport != "stdio":
            return await default_transports(spec, stack, report_lost=report_lost)
        return stdio_transport(spec, inherit=context.env, cwd=context.cwd)

    return transports


class SessionGate:
    """The retry class of a tool of a session's own servers or of the shared ones, for a drain's cut."""

    def __init__(self, servers: SessionServers) -> None:
        self._servers = servers

    def retry_class(self, server: str, tool: str) -> Any:
        return self._servers._of(server).gate.retry_class(server, tool)


class SessionServers:
    """The part of `Breakwater` a `Gateway` uses, over the shared servers and one session's own."""

    def __init__(self, config: Config, shared: Breakwater, own: Breakwater) -> None:
        self.config = config
        self.shared = shared
        self.own = own
        self.tasks = shared.tasks
        #: The shared journal, which the session's own servers' attempts go to as well.
        self.journal = shared.journal

    def _of(self, server: str | None) -> Breakwater:
        return self.own if server is not None and server in {s.name for s in self.own.config.servers} else self.shared

    @property
    def clock(self) -> Clock:
        """The shared gateway's clock."""
        return self.shared.clock

    @property
    def gate(self) -> SessionGate:
        """What a drain's cut asks of the gate (`_drain.cut_error`), over both sides' servers."""
        return SessionGate(self)

    @property
    def generation(self) -> int:
        """Moves whenever either side's servers change."""
        return self.shared.generation + self.own.generation

    def upstream(self, server: str) -> Upstream:
        """The connection to `server`, the session's own or the shared one."""
        return self._of(server).upstream(server)

    def status(self) -> StatusReport:
        """Every server the session sees, in config order."""
        shared, own = self.shared.status(), self.own.status()
        by_name = {s.name: s for s in (*shared.servers, *own.servers)}
        servers = tuple(by_name[s.name] for s in self.config.servers if s.name in by_name)
        return StatusReport(servers=servers, timeouts=(*shared.timeouts, *own.timeouts))

    async def wait_changed(self) -> None:
        """Return at the next change of any server, shared or the session's own."""
        await first_of(self.shared.wait_changed, self.own.wait_changed)

    async def call_tool(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        progress_callback: ProgressCallback | None = None,
        raise_on_error: bool = False,
        operation_id: str | None = None,
    ) -> types.CallToolResult:
        """Through the call gate of whichever side holds `server`."""
        return await self._of(server).call_tool(
            server,
            tool,
            arguments,
            timeout=timeout,
            progress_callback=progress_callback,
            raise_on_error=raise_on_error,
            operation_id=operation_id,
        )

    async def gate_call(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None,
        *,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
    ) -> types.CallToolResult:
        """`Breakwater.gate_call` of whichever side holds `server`."""
        return await self._of(server).gate_call(
            server, tool, arguments, progress_callback=progress_callback, operation_id=operation_id
        )

    async def resume_task(self, task_id: str, *, server: str | None = None, raise_on_error: bool = False) -> types.CallToolResult:
        """A remembered task, resumed where its server is."""
        return await self._of(server).resume_task(task_id, server=server, raise_on_error=raise_on_error)

    def budget(self, seconds: float | None = None, *, deadline: float | None = None, enforce: bool = False) -> TurnBudgetScope:
        """A whole-turn budget (one clock, so one budget bounds calls on both sides)."""
        return self.shared.budget(seconds, deadline=deadline, enforce=enforce)

    def gate_status(self) -> dict[str, Any]:
        """Both sides' call gates (`Breakwater.gate_status`): the shared servers' breakers first, then the session's own."""
        shared, own = self.shared.gate_status(), self.own.gate_status()
        return {
            "breakers": [*shared["breakers"], *own["breakers"]],
            "retry_budgets": shared["retry_budgets"] | own["retry_budgets"],
            "in_flight": shared["in_flight"] | own["in_flight"],
            "state_store": shared["state_store"],
        }

    def state_store_status(self) -> dict[str, Any]:
        """The shared gateway's state store."""
        return self.shared.state_store_status()


@contextlib.asynccontextmanager
async def session_gateway(shared: Gateway, config: Config, context: SessionContext | None = None) -> AsyncIterator[Gateway]:
    """A `Gateway` for one attached session: `shared`'s servers plus the session's own stdio servers.

    `config` is the whole config; `shared` was opened on its shared servers only. When there is no
    per-session server, this yields the shared gateway itself (the hub then gives the session a view of its own,
    `_hub.SharedGateway._view`, so that its end drains its calls alone). The session's own servers start
    in `context` (its directory and inherited variables); without one, in the gateway's.
    """
    own_specs = per_session(config)
    if not own_specs:
        yield shared
        return
    bw = shared.bw
    observers = [bw.journal] if bw.journal is not None else []
    transports = default_transports if context is None else session_transports(context)
    roots = ClientRoots(shared.relay)  # the session's own servers serve this session's client alone
    views: list[Gateway] = []  # this session's, once made: its own servers' resource updates are for it alone

    async def own_update(server: str, uri: str) -> None:
        for view in views:
            await view.passthrough.subscriptions.deliver(server, uri)

    own = Breakwater(
        config.with_servers(own_specs),
        journal=None,
        observers=observers,
        client_hooks=roots.hooks(shared.relay.hooks_delivering_to(own_update)),
        transports=transports,
        # The session's own transports start the configured servers: what their revisions are is remembered.
        protocol_memory_dir=config.connect.protocol_memory_dir,
        one_client=True,
    )
    async with own:
        # A `Gateway` reads no more of its `Breakwater` than `SessionServers` has.
        servers = cast(Breakwater, SessionServers(config, bw, own))
        gateway = Gateway(servers, config.gateway, catalog=shared.catalog, relay=shared.relay, view_of=shared)
        views.append(gateway)
        roots.serve(gateway.server, lambda: [own.upstream(spec.name) for spec in own_specs])
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            yield gateway
            tg.cancel_scope.cancel()
