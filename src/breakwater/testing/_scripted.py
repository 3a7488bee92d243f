"""`ScriptedServer`: an in-process MCP server whose tool calls are answered by one function of the test's.

For tests that need exact control of what a server does on each call (hang on the first, fail on
the second, answer with a given `CallToolResult`) and of what its tools declare (the exact `Tool`
objects, annotations included), and that want to see exactly what reached the server: the tool,
the arguments and the `_meta` breakwater sent (`calls`). Run it with `in_memory(server.server)`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import mcp.types as types
from mcp.server import Server, ServerRequestContext

__all__ = ["Progress", "ScriptedCall", "ScriptedServer"]

#: `_meta` keys the SDK itself stamps on requests (protocol revision, client info, progress token):
#: left out of `ScriptedCall.meta`, which shows what the caller chose to send.
_SDK_META_PREFIX = "io.modelcontextprotocol/"
_PROGRESS_TOKEN = ("progress_token", "progressToken")  # as the SDK parses it, and as it travels


class Progress(Protocol):
    """Reports progress on the call being answered (a no-op when the caller asked for none)."""

    def __call__(self, progress: float, total: float | None, message: str | None, /) -> Awaitable[None]: ...


class ScriptedCall(NamedTuple):
    """One `tools/call` as the server received it: `(name, arguments, meta)`."""

    name: str
    arguments: dict[str, Any]
    #: The request's `_meta` without the SDK's own keys (empty when the caller sent nothing else).
    meta: dict[str, Any]


#: Answers one call: (the call, its number among all calls so far starting at 1, progress) -> result.
#: Raising `mcp.MCPError` answers with that JSON-RPC error.
Handler = Callable[[ScriptedCall, int, Progress], Awaitable[types.CallToolResult]]


class ScriptedServer:
    """An SDK `Server` listing `tools` and answering every call with `handler` (see the module docstring)."""

    def __init__(self, tools: Sequence[types.Tool], handler: Handler, *, name: str = "scripted") -> None:
        self.tools = list(tools)
        self.handler = handler
        #: Every call received, in order.
        self.calls: list[ScriptedCall] = []
        #: The SDK server to connect to (`in_memory(scripted.server)`).
        self.server: Server[Any] = Server(name, on_list_tools=self._list_tools, on_call_tool=self._call_tool)

    async def _list_tools(
        self, _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        call = ScriptedCall(name=params.name, arguments=dict(params.arguments or {}), meta=_callers_meta(params.meta))
        self.calls.append(call)

        async def progress(value: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(value, total, message)

        return await self.handler(call, len(self.calls), progress)

    def names(self) -> list[str]:
        """The tools called so far, in order."""
        return [call.name for call in self.calls]


def _callers_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in dict(meta or {}).items() if not k.startswith(_SDK_META_PREFIX) and k not in _PROGRESS_TOKEN}
