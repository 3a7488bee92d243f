"""`drift = "block"` at the call gate: a tool whose live definition differs from the approved one is refused.

The gateway hid such a tool from its list and refused it in its own call handler, where the server may not
be ready yet: a call made while the server was connecting ran the changed tool once it was, and so did
`breakwater call`, which has no gateway. The gate asks `ChangedTools` once the server is ready and the tool
known (`CallGate.approve`), wherever the call comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp.types as types

from breakwater.catalog._catalog import Catalog
from breakwater.connect._upstream import Upstream
from breakwater.errors import ToolChangedError

__all__ = ["ChangedTools"]


class ChangedTools:
    """The gate's `approve` under `drift = "block"` (see the module docstring)."""

    def __init__(self, catalog: Catalog, upstream: Callable[[str], Upstream]) -> None:
        self._catalog = catalog
        self._upstream = upstream
        #: Per server, the tool list last judged, the catalog's version then, and the tools in it that changed.
        self._judged: dict[str, tuple[list[types.Tool], Any, frozenset[str]]] = {}

    def __call__(self, server: str, tool: str) -> ToolChangedError | None:
        upstream = self._upstream(server)
        # A relist replaces the upstream's list object; an accept moves the catalog's version.
        tools, version = upstream.tools, self._catalog.version
        judged = self._judged.get(server)
        if judged is None or judged[0] is not tools or judged[1] != version:
            changed = frozenset(self._catalog.drifted(server, upstream.spec.fingerprint(), tools))
            judged = self._judged[server] = (tools, version, changed)
        if tool not in judged[2]:
            return None
        return ToolChangedError(f"The definition of tool '{tool}' changed since it was approved.", server=server, tool=tool)
