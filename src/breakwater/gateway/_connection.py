"""The downstream connection behind a request: what outlives the SDK's per-request `ServerSession`."""

from __future__ import annotations

from typing import Any

from mcp.server.context import ServerRequestContext

__all__ = ["connection_of"]


def connection_of(ctx: ServerRequestContext[Any]) -> object:
    """The downstream connection a request came in on (what outlives the per-request `ServerSession`).

    The SDK keeps it on the session without a public accessor (pinned minor version).
    """
    return getattr(ctx.session, "_connection", ctx.session)
