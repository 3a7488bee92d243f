"""The gateway's own tools: tool search (`breakwater_search_tools`) and server status (`breakwater_status`).

Both answer from what the gateway knows right now and always name the servers that could not be
searched live, so an agent never mistakes "its server is connecting" for "no such tool". Imports
`Breakwater`, the catalog and the gateway policy; never the gateway server itself (it hands in what
these tools read).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext

from breakwater._breakwater import Breakwater
from breakwater.catalog._catalog import Entry, entry_json
from breakwater.catalog._search import rank
from breakwater.config import GatewayPolicy
from breakwater.config._checks import namespaced
from breakwater.status import RejectedTool, ServerState, ServerStatus, iso

__all__ = ["NOT_READY", "STILL_CONNECTING", "BuiltinTools", "SearchAnswer"]

SEARCH_LIMIT = 10
NOT_READY = (ServerState.PENDING, ServerState.CONNECTING, ServerState.RETRYING, ServerState.FAILED)
STILL_CONNECTING = (ServerState.PENDING, ServerState.CONNECTING, ServerState.RETRYING)

Handler = Callable[[ServerRequestContext[Any], Mapping[str, Any]], Awaitable[types.CallToolResult]]


@dataclass(frozen=True, kw_only=True)
class SearchAnswer:
    """What `breakwater_search_tools` (and `breakwater tools QUERY`) answers."""

    query: str
    matches: list[Entry]
    unsearched: list[ServerStatus]  # servers that could not be searched live
    servers: int
    drift: Mapping[str, Sequence[str]] = field(default_factory=dict)  # server -> tools changed since approved
    left_out: Sequence[tuple[str, RejectedTool]] = ()  # (server, tool) listed with an invalid definition
    #: How the gateway names tools (`[gateway] tool_name_template`, `tool_name_max`): a left-out tool is named as it
    #: would be listed.
    template: str = GatewayPolicy().tool_name_template
    name_max: int = GatewayPolicy().tool_name_max

    def changed(self, entry: Entry) -> bool:
        """Whether `entry`'s definition changed since it was approved."""
        return entry.tool.name in self.drift.get(entry.server, ())

    @property
    def complete(self) -> bool:
        """Every server was searched live: an empty answer really means "no such tool"."""
        return not self.unsearched

    def to_json(self) -> dict[str, Any]:
        """The answer as the search tool's structured content (and `breakwater tools --json`)."""
        return {
            "query": self.query,
            "matches": [entry_json(e) | {"definition_changed": self.changed(e)} for e in self.matches],
            "complete": self.complete,
            "not_searched": [_server_note_json(s) for s in self.unsearched],
            "left_out": [left_out_json(self.template, server, t, self.name_max) for server, t in self.left_out],
        }

    def text(self) -> str:
        """The answer as text an agent (or a person) reads."""
        lines: list[str] = []
        if self.matches:
            lines.append(f"Tools matching {self.query!r}:" if self.query else "Tools:")
            for e in self.matches:
                desc = entry_json(e)["description"]
                flag = "" if e.live else f" [server {e.server} is not ready: last-known definition]"
                if self.changed(e):
                    flag += " [definition changed since approved: review before relying on it]"
                lines.append(f"- {e.name}: {desc}{flag}")
        elif self.complete:
            lines.append(f"No such tool: nothing matches {self.query!r} on any of the {self.servers} servers (all searched).")
        else:
            names = ", ".join(s.name for s in self.unsearched)
            lines.append(f"Nothing matches {self.query!r} among the servers that answered; not searched: {names}.")
        if self.unsearched:
            lines.append("Not searched live (their tools may exist; do not conclude they are missing):")
            lines.extend(f"- {_server_note(s)}" for s in self.unsearched)
        if self.left_out:
            lines.append(
                "Left out (their servers list them, but they cannot be called: an invalid definition, disabled, "
                "or changed since approved):"
            )
            lines.extend(
                f"- {namespaced(self.template, server, t.name, self.name_max)}: {t.reason}" for server, t in self.left_out
            )
        return "\n".join(lines)


def blocked_tool(policy: GatewayPolicy, server: str, tool: str) -> RejectedTool:
    """A tool whose definition changed since it was approved, left out under `drift = "block"`, and how to let it back."""
    name = namespaced(policy.tool_name_template, server, tool, policy.tool_name_max)
    return RejectedTool(
        name=tool,
        reason=f'its definition changed since it was approved (drift = "block"): `breakwater tools --accept {name}` approves it',
    )


def left_out_json(template: str, server: str, tool: RejectedTool, name_max: int) -> dict[str, Any]:
    """A tool left out, as the search and status tools show it: `name` as the gateway would list it (like a match's)."""
    name = namespaced(template, server, tool.name, name_max)
    return {"server": server, "name": name, "tool": tool.name, "reason": tool.reason}


def _server_note(s: ServerStatus) -> str:
    if s.state is ServerState.RETRYING and s.error is not None:
        since = f" since {iso(s.failing_since)}" if s.failing_since is not None else ""
        return (
            f"{s.name}: failing to connect{since} ({s.attempts} attempts, last: {s.error.code.value}: "
            f"{s.error.message}); next attempt at {iso(s.next_retry_at)}"
        )
    if s.state in STILL_CONNECTING:
        return f"{s.name}: still connecting (attempt {max(1, s.attempts)})"
    if s.off_here:
        return f"{s.name}: not started ({s.disabled_by})"
    reason = f"{s.error.code.value}: {s.error.message}" if s.error else "unavailable"
    retry = f"; next retry at {iso(s.next_retry_at)}" if s.next_retry_at else ""
    return f"{s.name}: failed ({reason}){retry}"


def _server_note_json(s: ServerStatus) -> dict[str, Any]:
    return {
        "server": s.name,
        "state": s.state.value,
        "attempts": s.attempts,
        "error": None if s.error is None else s.error.to_json(),
        "next_retry_at": iso(s.next_retry_at),
        "failing_since": iso(s.failing_since),
    } | ({"disabled_by": s.disabled_by} if s.off_here else {})


def text_result(text: str, structured: dict[str, Any]) -> types.CallToolResult:
    """A tool result with the same answer as text and as structured content."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)


class BuiltinTools:
    """The search and status tools, over the gateway's current entries and drift."""

    def __init__(
        self,
        bw: Breakwater,
        policy: GatewayPolicy,
        *,
        entries: Callable[[], list[Entry]],
        drift: Callable[[], Mapping[str, list[str]]],
    ) -> None:
        self.bw = bw
        self.policy = policy
        self._entries = entries
        self._drift = drift
        self.handlers: dict[str, Handler] = {}
        if policy.search_tool:
            self.handlers[policy.search_tool] = self._search_tool
        if policy.status_tool:
            self.handlers[policy.status_tool] = self._status_tool

    @property
    def names(self) -> frozenset[str]:
        """The names the built-in tools are listed under."""
        return frozenset(self.handlers)

    def tools(self) -> list[types.Tool]:
        """The built-in tools' definitions, as `tools/list` shows them."""
        tools = []
        if self.policy.search_tool:
            tools.append(
                types.Tool(
                    name=self.policy.search_tool,
                    description=(
                        "Search every connected MCP server's tools by name and description. The answer always says "
                        "which servers could not be searched (still connecting, or failed with a reason and the next "
                        "retry), so a missing tool is never mistaken for one that does not exist."
                    ),
                    input_schema={
                        "type": "object",
                        "properties": {"query": {"type": "string", "description": "words to look for"}},
                        "required": ["query"],
                    },
                    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
                )
            )
        if self.policy.status_tool:
            tools.append(
                types.Tool(
                    name=self.policy.status_tool,
                    description="Each upstream MCP server's state (ready, connecting, retrying, failed) and why.",
                    input_schema={"type": "object", "properties": {}},
                    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
                )
            )
        return tools

    async def search(self, query: str, *, wait_s: float | None = None) -> SearchAnswer:
        """Rank tools for `query`; first wait briefly for connecting servers that might hold a match."""
        wait = self.policy.search_wait_s if wait_s is None else wait_s
        clock = self.bw.clock
        deadline = clock.monotonic() + wait
        while True:
            entries = self._entries()
            # Off by the config's choice: not the agent's to know of. Off because a value it names is not set here: a
            # server the user expects, not searched ("No such tool ... all searched" while its call said "not started").
            statuses = [s for s in self.bw.status().servers if s.state is not ServerState.DISABLED or s.off_here]
            pending = [s for s in statuses if s.state in STILL_CONNECTING and _might_match(s.name, query, entries)]
            if not pending or clock.monotonic() >= deadline:
                break
            with clock.deadline_scope(deadline):
                await self.bw.wait_changed()
        matches = [e for _, e in rank(entries, query, limit=SEARCH_LIMIT)] if query.strip() else entries
        unsearched = [s for s in statuses if s.state in NOT_READY or s.off_here]
        drift = dict(self._drift())
        left_out = [(s.name, t) for s in statuses for t in s.rejected_tools]
        if self.policy.drift == "block":  # listed by its server, not by the gateway until approved: say so
            left_out += [(server, blocked_tool(self.policy, server, tool)) for server, tools in drift.items() for tool in tools]
        return SearchAnswer(
            query=query,
            matches=matches,
            unsearched=unsearched,
            servers=len(statuses),
            drift=drift,
            left_out=left_out,
            template=self.policy.tool_name_template,
            name_max=self.policy.tool_name_max,
        )

    async def _search_tool(self, ctx: ServerRequestContext[Any], arguments: Mapping[str, Any]) -> types.CallToolResult:
        query = arguments.get("query")
        if not isinstance(query, str):
            return types.CallToolResult(
                content=[types.TextContent(type="text", text='Pass a text \'query\', e.g. {"query": "create invoice"}.')],
                is_error=True,
            )
        answer = await self.search(query)
        return text_result(answer.text(), answer.to_json())

    async def _status_tool(self, ctx: ServerRequestContext[Any], arguments: Mapping[str, Any]) -> types.CallToolResult:
        self._entries()
        status = self.bw.status()
        template, name_max = self.policy.tool_name_template, self.policy.tool_name_max
        report = status.to_json() | {
            "drift": {server: tools for server, tools in self._drift().items()},
            "drift_mode": self.policy.drift,
            "state_store": self.bw.state_store_status(),
            # So a reader (`status --gateway`, the agent) names a left-out tool as it would be listed.
            "tool_name_template": template,
            "tool_name_max": name_max,
            "left_out": [left_out_json(template, s.name, t, name_max) for s in status.servers for t in s.rejected_tools],
            # A ready server whose breaker refuses every call read as healthy here: the breakers that are not closed,
            # and when each lets a call through again.
            "breakers": [
                {key: b[key] for key in ("name", "state", "retry_after_s", "reason")}
                for b in self.bw.gate_status()["breakers"]
                if b["state"] != "closed"
            ],
        }
        return text_result(json.dumps(report, indent=2), report)


def _might_match(server: str, query: str, entries: Sequence[Entry]) -> bool:
    terms = [t for t in query.lower().split() if t]
    if not terms or any(t in server.lower() for t in terms):
        return True
    known = [e for e in entries if e.server == server]
    return not known or bool(rank(known, query, limit=1))
