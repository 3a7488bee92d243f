"""`in_memory`: run breakwater's real supervisor, gate and gateway against in-process SDK servers.

The SDK's `InMemoryTransport` runs a `Server` or `MCPServer` in a task of the caller's event loop,
speaking JSON-RPC over memory streams: the same messages a stdio or HTTP server would exchange, in
either protocol revision, without a subprocess or a socket. Because nothing waits on real I/O, a
whole connect, call and timeout can run on a `FakeClock`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, TypeAlias

from mcp.client._memory import InMemoryTransport
from mcp.server import Server
from mcp.server.mcpserver import MCPServer

from breakwater.config import ServerSpec
from breakwater.connect._transports import OpenedTransport, TransportFactory

__all__ = ["InProcessServer", "in_memory"]

#: An SDK server that can run in-process: the low-level `Server` or the high-level `MCPServer`.
InProcessServer: TypeAlias = Server[Any] | MCPServer[Any]


def in_memory(servers: InProcessServer | Mapping[str, InProcessServer], *, raise_exceptions: bool = False) -> TransportFactory:
    """A transport factory that connects each configured server to an in-process SDK server.

    `servers` is one server for every spec, or a mapping from a spec's name to its server. Each
    connect attempt runs the server afresh on new memory streams (the spec's `transport`, command
    and URL are not used). `raise_exceptions` lets a handler's exception escape the server instead
    of becoming an error result (useful to see a test server's bug).

    ```python
    server = MCPServer("shop")
    ...
    async with Breakwater(config, transports=in_memory(server), clock=FakeClock()) as bw:
        ...
    ```
    """

    def server_for(spec: ServerSpec) -> InProcessServer:
        if not isinstance(servers, Mapping):
            return servers
        if spec.name not in servers:
            raise LookupError(f"in_memory() was given no server named {spec.name!r} (it has: {', '.join(servers)})")
        return servers[spec.name]

    async def factory(spec: ServerSpec, stack: AsyncExitStack, *, report_lost: Callable[[], None]) -> OpenedTransport:
        return OpenedTransport(InMemoryTransport(server_for(spec), raise_exceptions=raise_exceptions))

    return factory
