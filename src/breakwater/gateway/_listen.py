"""The TCP listening socket every breakwater HTTP server binds (the gateway and the test server)."""

from __future__ import annotations

import socket

__all__ = ["tcp_listener"]


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket on `host:port` (0 picks a free port), with Nagle's algorithm off.

    Servers bind their own socket so the real port is known before uvicorn starts. asyncio turns
    Nagle off on accepted connections only when the socket's `proto` is IPPROTO_TCP, and a plain
    `socket.socket(AF_INET, SOCK_STREAM)` has proto 0: every keep-alive response written in two
    pieces (headers, then body) then waited for the client's delayed ACK, about 40 ms per call.
    Linux copies TCP_NODELAY from the listener to each accepted socket, and the explicit proto lets
    asyncio set it too.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        # Listen before announcing the port: a client that reads it may connect at once.
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock
