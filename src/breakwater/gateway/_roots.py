"""The roots of the one client a server serves: asked of that client when the server asks breakwater.

A client tells a server which directories it works in with MCP roots: the server asks `roots/list`
(right after its handshake, and again on `notifications/roots/list_changed`), and the client answers
with `file://` URIs. Claude Code answers with the project's directory, VS Code with the open folders;
a filesystem server started without directories (`@modelcontextprotocol/server-filesystem`) works
only in those. Behind a gateway that declared no roots, such a server ran with no allowed directory
at all, and every call failed: a healthy server, broken only by breakwater in front of it.

Roots belong to one client, so only a server that serves one client gets them: every server of a
`serve --no-share` session, and each attached session's own stdio servers (`gateway._session`). A
server shared by several sessions (HTTP servers in a shared gateway, `"shared": true` stdio ones,
every server of `serve --http`) declares no roots, as before: no one client's directories are its.

For a server that serves one client, breakwater declares roots (with `listChanged`) and answers each
`roots/list` by asking its client, once the client's handshake says whether it lists roots (a server
may ask before that: breakwater connects its servers while the client starts). A client that lists
no roots, or has not shaken hands within `ROOTS_WAIT_S`, is answered for as the SDK's client without
roots answers: an error, on which servers keep the directories they were started with (a tool whose
call needed the roots then answers CLIENT_CANNOT_ANSWER, as for sampling). The client's
`notifications/roots/list_changed` is passed on to each of those servers.

`breakwater status` connects as `serve` would (`gateway_client_hooks`): a server may list more tools
to a client that lists roots (`server-everything` adds `get-roots-list`), and its count must be the
gateway's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.client.session import ClientRequestContext
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater.config import Config, ServerSpec
from breakwater.connect._upstream import ClientHooks, Upstream
from breakwater.gateway._relay import Relay
from breakwater.gateway._share import per_session, share_refusal

__all__ = ["ROOTS_ANSWER_S", "ROOTS_WAIT_S", "ClientRoots", "gateway_client_hooks", "one_client_servers"]

logger = logging.getLogger("breakwater.gateway.roots")

#: How long a server's `roots/list` waits for the client's handshake (the gateway connects its servers
#: while the client starts; a client's `initialize` comes within a second of its launch).
ROOTS_WAIT_S = 10.0
#: How long the client has to answer a `roots/list` asked on a server's behalf.
ROOTS_ANSWER_S = 30.0


class ClientRoots:
    """The roots of the one downstream client that a set of upstream connections serves."""

    def __init__(self, relay: Relay) -> None:
        """`relay` is the gateway's: a refusal during a call is remembered as that call's, as for sampling."""
        self._relay = relay
        self._clock = relay.clock
        self._session: ServerSession | None = None
        self._handshaken = anyio.Event()
        self._upstreams: Callable[[], Iterable[Upstream]] = tuple

    def hooks(self, base: ClientHooks, servers: Iterable[str] | None = None) -> ClientHooks:
        """`base`'s client arguments, plus the roots callback (which declares roots) for `servers` (default: all)."""
        only = None if servers is None else frozenset(servers)

        def hooks(spec: ServerSpec) -> Mapping[str, Any]:
            if only is not None and spec.name not in only:
                return base(spec)

            async def list_roots(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
                return await self._list_roots(spec)

            return {**base(spec), "list_roots_callback": list_roots}

        return hooks

    def serve(self, server: Server[Any], upstreams: Callable[[], Iterable[Upstream]]) -> None:
        """Learn the client from `server`'s handshake, and pass its roots changes on to `upstreams()`."""
        self._upstreams = upstreams
        # Registered directly: the SDK's `on_roots_list_changed=` warns (deprecated at 2026-07-28) on every start.
        server.add_notification_handler("notifications/initialized", types.NotificationParams, self._on_initialized)
        server.add_notification_handler("notifications/roots/list_changed", types.NotificationParams, self._on_changed)

    def without_client(self) -> None:
        """There is no client to ask (`breakwater status`): refuse at once, as a client without roots does."""
        self._handshaken.set()

    async def _on_initialized(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:  # 2026-07-28 has no requests to the client outside a call
            self._session = ctx.session
        self._handshaken.set()

    async def _on_changed(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        for upstream in self._upstreams():
            client = upstream.client
            if client is None:
                continue  # not connected: it asks for the roots at its next handshake anyway
            with contextlib.suppress(Exception):  # a server going away must not keep the others from hearing
                await client.session.send_notification(types.RootsListChangedNotification())

    async def _list_roots(self, spec: ServerSpec) -> types.ListRootsResult | types.ErrorData:
        with self._clock.deadline_scope(self._clock.monotonic() + ROOTS_WAIT_S):
            await self._handshaken.wait()
        session = self._session
        caps = session.client_capabilities if session is not None else None
        if session is None or caps is None or caps.roots is None:
            # What a client without roots answers: servers then keep the directories they were started with.
            return self._relay.refused(
                spec.name, spec.transport, "roots", "the client does not list roots (it declared no roots capability)"
            )
        try:
            with self._clock.deadline_scope(self._clock.monotonic() + ROOTS_ANSWER_S):
                return await session.send_request(types.ListRootsRequest(), types.ListRootsResult)
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"breakwater: the client did not list its roots within {ROOTS_ANSWER_S:g} s"
            )
        except MCPError as exc:
            return exc.error
        except Exception as exc:  # a client that went away or answered nonsense must not break the server's session
            logger.debug("asking the client for its roots failed", exc_info=True)
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"breakwater: the client did not list its roots: {type(exc).__name__}"
            )


def one_client_servers(config: Config) -> tuple[str, ...]:
    """The servers a stdio `serve` of `config` connects for its one client: each session's own when sessions
    share a gateway, every server when they do not."""
    servers = per_session(config) if share_refusal(config) is None else config.servers
    return tuple(spec.name for spec in servers)


def gateway_client_hooks(config: Config, relay: Relay | None = None) -> ClientHooks:
    """Client arguments that make connections look as a stdio `serve`'s do: sampling and elicitation declared,
    and roots for the servers that would get a client's (`one_client_servers`).

    Some servers list more tools to a client that can answer those requests, so `breakwater status`,
    `tools` and `call` connect with these to see the tools the gateway lists (`Breakwater(client_hooks=...)`):
    `tools` saved a shorter list to the catalog, which a cold `serve` then gave its first clients, and `call`
    said UNKNOWN_TOOL of a tool `tools` listed. With no downstream client, every request is refused at once.
    """
    relay = relay if relay is not None else Relay()
    roots = ClientRoots(relay)
    roots.without_client()
    return roots.hooks(relay.client_kwargs, one_client_servers(config))
