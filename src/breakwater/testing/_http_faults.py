"""The test server's streamable-HTTP transport and its injected faults (`--refuse-first`, `--reset-first`, `--status-first`).

Described in `breakwater.testing.server`'s docstring. May import the core leaves and the gateway's listener.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from mcp.server.mcpserver import MCPServer

from breakwater.gateway._drain import replay_body
from breakwater.gateway._listen import tcp_listener
from breakwater.testing._ledger import write_atomic

if TYPE_CHECKING:
    import asyncio

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HttpFaults", "serve_streamable_http"]


@dataclass(kw_only=True)
class HttpFaults:
    """The faults still to inject in this process (counters run down), and the open connections to reset."""

    refuse_left: int = 0
    reset_left: int = 0
    status_left: int = 0
    status: int = 503
    retry_after: str | None = None
    #: Only `tools/call` requests of this tool count toward `status_left` (and get the status); None: every request.
    status_tool: str | None = None
    transports: dict[tuple[str, int], asyncio.Transport] = dataclasses.field(default_factory=dict)


def _rst(transport: asyncio.Transport) -> None:
    """Close with a TCP RST instead of a FIN: SO_LINGER on with a zero timeout, then abort."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _faulty_protocol(faults: HttpFaults) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class FaultyH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if faults.refuse_left > 0:
                faults.refuse_left -= 1
                # Before the first data_received: the peer's request bytes are never read.
                _rst(transport)
                return
            if self.client is not None:
                faults.transports[self.client] = transport

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client is not None:
                faults.transports.pop(self.client, None)
            super().connection_lost(exc)

    return FaultyH11Protocol


def _faulty_app(app: ASGIApp, faults: HttpFaults) -> ASGIApp:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (faults.reset_left <= 0 and faults.status_left <= 0):
            await app(scope, receive, send)
            return
        # Drain the body first: closing a socket with unread input would turn every close into an RST.
        message: Message = {"more_body": True}
        body = b""
        while message.get("more_body", False):
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
        if faults.reset_left <= 0 and faults.status_tool is not None and not _calls(body, faults.status_tool):
            await app(scope, replay_body(body, receive), send)
            return
        if faults.reset_left > 0:
            faults.reset_left -= 1
            client = scope.get("client")
            transport = faults.transports.get((client[0], client[1])) if client else None
            if transport is None:
                # Not ours to reset (never expected); uvicorn answers 500 rather than leaving the caller hanging.
                return
            _rst(transport)
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        faults.status_left -= 1
        body = json.dumps({"error": f"injected HTTP {faults.status}"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if faults.retry_after is not None:
            headers.append((b"retry-after", faults.retry_after.encode()))
        await send({"type": "http.response.start", "status": faults.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return wrapped


def _calls(body: bytes, tool: str) -> bool:
    """Whether `body` is a `tools/call` of `tool`."""
    try:
        message = json.loads(body)
    except ValueError:
        return False
    params = message.get("params") if isinstance(message, dict) and message.get("method") == "tools/call" else None
    return isinstance(params, dict) and params.get("name") == tool


async def serve_streamable_http(
    mcp: MCPServer,
    *,
    port: int,
    port_file: Path | None,
    json_response: bool,
    stateless: bool,
    faults: HttpFaults,
    log_level: str,
) -> None:
    """Serve `mcp` over streamable HTTP on 127.0.0.1:`port` (0 = a free one) with `faults` injected, until cancelled."""
    import uvicorn

    app = mcp.streamable_http_app(json_response=json_response, stateless_http=stateless, host="127.0.0.1")
    config = uvicorn.Config(
        _faulty_app(app, faults),
        http=_faulty_protocol(faults),
        log_level=log_level.lower(),
        lifespan="on",
        # A hung tool holds its SSE stream open forever; do not let it block a SIGTERM.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    sock = tcp_listener("127.0.0.1", port)
    actual = int(sock.getsockname()[1])

    async def announce() -> None:
        while not server.started:
            await anyio.sleep(0.01)
        if port_file is not None:
            write_atomic(port_file, f"{actual}\n")
        print(f"listening on http://127.0.0.1:{actual}/mcp", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()
