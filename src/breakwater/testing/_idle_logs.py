"""`breakwater testserver --idle-logs N`: log messages sent while no call is in flight, as a background job's are.

After each tool call has answered (`IDLE_LOGS_AFTER_S` later), the server sends N `notifications/message`
on the connection's own channel, related to no request: "NAME: idle log message K of N", at `IDLE_LEVELS[K % 2]`
(info, then warning, in turn), with logger NAME. A handshake-era connection only: 2026-07-28 has no channel for
log messages outside a request, and the SDK sends none there.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import TYPE_CHECKING, Any

import mcp.types as types
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

__all__ = ["IDLE_LEVELS", "IDLE_LOGS_AFTER_S", "add_idle_logs"]

#: How long after a call the idle messages start: its answer is on the wire by then.
IDLE_LOGS_AFTER_S = 0.3
#: The levels of the messages in turn: the first of each pair below a client's `warning`, the second at it.
IDLE_LEVELS: tuple[types.LoggingLevel, ...] = ("info", "warning")

#: The senders under way (a task nothing refers to may be collected before it runs).
_SENDING: set[asyncio.Task[None]] = set()


def add_idle_logs(mcp: MCPServer, count: int) -> None:
    """Make `mcp` send `count` log messages outside any call after each tool call (none when `count` is 0)."""
    if count <= 0:
        return
    name = mcp.name or "testserver"
    # Logging is deprecated at 2026-07-28; its 2025 path, a message outside any request, is the point here.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

    async def after_calls(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method == "tools/call":
            task = asyncio.get_running_loop().create_task(_send(ctx.session, name, count))
            _SENDING.add(task)
            task.add_done_callback(_SENDING.discard)
        return result

    mcp.middleware.append(after_calls)


async def _send(session: Any, name: str, count: int) -> None:
    await asyncio.sleep(IDLE_LOGS_AFTER_S)
    for n in range(count):
        level = IDLE_LEVELS[n % len(IDLE_LEVELS)]
        await session.send_log_message(level=level, data=f"{name}: idle log message {n + 1} of {count}", logger=name)
