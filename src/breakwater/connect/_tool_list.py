"""A server's tool list, page by page; a tool whose definition breaks the MCP schema costs only itself.

The SDK validates a `tools/list` page as a whole, so one tool with an `inputSchema` that is not an
object (or none at all) fails the page, the handshake and the whole server, valid tools included.
When a page fails only in its tools, it is asked for once more without the SDK's validation (the
SDK's own framing and session state, pinned minor version), each tool is validated on its own, the
valid ones are served and the others are reported with the reason (`RejectedTool`, shown by
`status` and `tools`). A healthy server never takes this path: it costs nothing until a page fails.
A second tool of the same name is left out the same way, so is one without a name, one whose schema misuses JSON
Schema (`_schema_shape`: the model APIs refuse every tool for one), and one whose definition holds `NaN`
or `Infinity` (the SDK's parser takes them; JSON has neither, and passed on they would reach the
agent as `null`, an `inputSchema` with `"maximum": null` that a strict client refuses whole).
May import the core leaves only.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp import Client
from mcp_types import methods as sdk_methods
from pydantic import ValidationError

from breakwater._wire import non_finite_path
from breakwater.config import ToolFilter
from breakwater.connect._schema_shape import schema_problem
from breakwater.status import RejectedTool

__all__ = ["list_all_tools"]

_REASON_CHARS = 200  # of one rejected tool's reason
_DUPLICATE = "listed twice: this second definition is left out, the first one is served"


async def list_all_tools(client: Client, served: ToolFilter | None = None) -> tuple[list[types.Tool], list[RejectedTool]]:
    """Every valid tool of every page, and the listed tools left out: for an invalid definition, or by the entry's `served`."""
    tools: list[types.Tool] = []
    rejected: list[RejectedTool] = []
    cursor: str | None = None
    while True:
        try:
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        except ValidationError as exc:
            if not _only_tools_wrong(exc):
                raise
            page, left_out = await _list_leniently(client, cursor, exc)
            rejected.extend(left_out)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            tools, rejected = _without_duplicates(*_usable_only(tools, rejected))
            if served is None:
                return tools, rejected
            kept = []
            for tool in tools:
                if (reason := served.left_out(tool.name)) is None:
                    kept.append(tool)
                else:
                    rejected.append(RejectedTool(name=tool.name, reason=reason))
            return kept, rejected


def _usable_only(tools: list[types.Tool], rejected: list[RejectedTool]) -> tuple[list[types.Tool], list[RejectedTool]]:
    """The tools whose definitions are JSON; one holding NaN or Infinity is left out, with where, one whose schema is
    not JSON Schema, and one without a name (the spec's names are 1 to 128 characters; listed, it became the
    server's bare prefix)."""
    kept: list[types.Tool] = []
    for tool in tools:
        if not tool.name.strip():
            rejected.append(RejectedTool(name=tool.name, reason="an empty name, which no call can name"))
            continue
        where = _non_finite_field(tool)
        if where is not None:
            rejected.append(RejectedTool(name=tool.name, reason=f"{where}: NaN or Infinity, which JSON does not have"))
        elif (problem := _schema_problem(tool)) is not None:
            rejected.append(RejectedTool(name=tool.name, reason=problem[:_REASON_CHARS]))
        else:
            kept.append(tool)
    return kept, rejected


def _schema_problem(tool: types.Tool) -> str | None:
    """What is wrong with the tool's schemas as JSON Schema (`_schema_shape`): the model APIs refuse every tool for one."""
    problem = schema_problem(tool.input_schema, "inputSchema")
    if problem is None and tool.output_schema is not None:
        problem = schema_problem(tool.output_schema, "outputSchema")
    return problem


def _non_finite_field(tool: types.Tool) -> str | None:
    for name, value in (("inputSchema", tool.input_schema), ("outputSchema", tool.output_schema), ("_meta", tool.meta)):
        if value is not None and (where := non_finite_path(value, name)) is not None:
            return where
    return None


def _without_duplicates(tools: list[types.Tool], rejected: list[RejectedTool]) -> tuple[list[types.Tool], list[RejectedTool]]:
    """The first tool of each name; later ones are left out (a call by that name could reach either)."""
    if len({t.name for t in tools}) == len(tools):
        return tools, rejected
    seen: set[str] = set()
    kept: list[types.Tool] = []
    for tool in tools:
        if tool.name in seen:
            rejected.append(RejectedTool(name=tool.name, reason=_DUPLICATE))
        else:
            seen.add(tool.name)
            kept.append(tool)
    return kept, rejected


def _only_tools_wrong(exc: ValidationError) -> bool:
    """Whether every problem is inside one entry of `tools` (not the page's own shape)."""
    errors = exc.errors()
    return bool(errors) and all(len(e["loc"]) >= 2 and e["loc"][0] == "tools" and isinstance(e["loc"][1], int) for e in errors)


async def _list_leniently(
    client: Client, cursor: str | None, original: ValidationError
) -> tuple[types.ListToolsResult, list[RejectedTool]]:
    session: Any = client.session  # the SDK's private sending path, without its whole-page validation
    request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor))
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: dict[str, Any] = {}
    session._stamp(data, opts)
    if session._session_read_timeout_seconds is not None:
        opts["timeout"] = session._session_read_timeout_seconds
    raw = await session._dispatcher.send_raw_request(data["method"], data.get("params"), opts)
    version = session._negotiated_version or "2025-11-25"
    items = raw.get("tools") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise original
    kept: list[types.Tool] = []
    rejected: list[RejectedTool] = []
    for index, item in enumerate(items):
        try:
            sdk_methods.validate_server_result("tools/list", version, {"tools": [item]})
            kept.append(types.Tool.model_validate(item, by_name=False))
        except (ValidationError, ValueError, KeyError) as exc:
            rejected.append(RejectedTool(name=_name_of(item, index), reason=_reason(exc)))
    try:
        page = types.ListToolsResult.model_validate({"nextCursor": raw.get("nextCursor"), "tools": []}, by_name=False)
    except ValidationError:
        raise original from None
    page.tools = kept
    # As the SDK's own listing does: remember output schemas (result validation) and header maps.
    page = session._absorb_tool_listing(page, complete=cursor is None and page.next_cursor is None)
    return page, rejected


def _name_of(item: Any, index: int) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return name[:128] if isinstance(name, str) and name else f"#{index + 1} (no name)"


def _reason(exc: Exception) -> str:
    if not isinstance(exc, ValidationError):
        return f"invalid definition: {exc}"[:_REASON_CHARS]
    parts = []
    for error in exc.errors()[:3]:
        loc = [str(p) for p in error["loc"]]
        if loc[:2] == ["tools", "0"]:  # the wrapper page of the per-tool check
            loc = loc[2:]
        where = ".".join(loc)
        parts.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return "; ".join(parts)[:_REASON_CHARS]
