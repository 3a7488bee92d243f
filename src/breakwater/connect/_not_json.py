"""What an upstream's answer holds that JSON does not have: `NaN`, `Infinity`, `-Infinity`.

The SDK's client parses with pydantic, which takes them as floats, so a server that writes them
(Python's `json.dumps` does by default) reaches breakwater with non-finite numbers in a tool's
`structuredContent` or `_meta`. Passed on, they would become `null` on the gateway's wire (pydantic's
JSON output) but stay NaN for a library caller, and a NaN breaks equality, sorting and whatever the
caller writes next. So they become `null` here, once, for both: what JavaScript's `JSON.stringify`
and pydantic make of them, and the rest of the answer is kept (the call ran; refusing its answer
would invite a repeat). The server is named in a warning, once per tool, since it breaks the
protocol and its author should hear. A tool's definition that holds them is left out instead
(`_tool_list.py`). May import the core leaves only.
"""

from __future__ import annotations

import logging

import mcp.types as types

from breakwater._wire import non_finite_path, with_nulls_for_non_finite

__all__ = ["finite_result"]

logger = logging.getLogger("breakwater.upstream")

_warned: set[tuple[str, str]] = set()


def finite_result(result: types.CallToolResult, *, server: str, tool: str) -> types.CallToolResult:
    """`result` with every NaN or infinite number in `structuredContent` and `_meta` made `null` (the same object if none)."""
    structured, meta = result.structured_content, result.meta
    where = non_finite_path(structured, "structuredContent") if structured is not None else None
    if where is None and meta:
        where = non_finite_path(meta, "_meta")
    if where is None:
        return result
    if (server, tool) not in _warned:
        _warned.add((server, tool))
        logger.warning(
            "%s answered %s with NaN or Infinity at %s, which JSON does not have; passed on as null "
            "(the server should send null or a string)",
            server,
            tool,
            where,
        )
    changes: dict[str, object] = {}
    if structured is not None:
        changes["structured_content"] = with_nulls_for_non_finite(structured)
    if meta:
        changes["meta"] = with_nulls_for_non_finite(meta)
    return result.model_copy(update=changes)
