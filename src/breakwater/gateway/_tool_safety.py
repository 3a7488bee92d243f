"""Which tool calls a failover may send again: those that only read (`ToolSafety`).

When the shared gateway dies under a session, its `serve` answers each call in flight: one that only reads is
sent again to the next gateway, any other is answered OUTCOME_UNKNOWN (`_pump`). This says which is which, from
the config's retry classes and the `tools/list` answers the session relayed (or the gateway told it).
Imports neither asyncio nor the SDK: an attached `serve` is a relay that starts without them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from breakwater.config import Config
from breakwater.config._checks import distinct_name, name_affixes, namespaced

__all__ = ["ToolSafety"]


@dataclass
class ToolSafety:
    """Which tool calls a failover may send again: those that only read.

    The config's retry class wins (a tool's own, then its server's), as it does in the call gate;
    without one, the tool's `readOnlyHint` as the `tools/list` answers this session relayed said.
    Anything unknown is not safe.
    """

    builtins: frozenset[str] = frozenset()
    #: Downstream name -> the retry class the config gives that tool itself.
    configured: dict[str, str] = field(default_factory=dict)
    #: (name prefix, name suffix, retry class) of each server the config gives a retry class.
    servers: list[tuple[str, str, str]] = field(default_factory=list)
    #: Downstream name -> its readOnlyHint, from the tools/list answers relayed.
    learned: dict[str, bool] = field(default_factory=dict)
    #: Downstream names of the tools that declare an output schema, from the same answers.
    schemas: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, config: Config) -> ToolSafety:
        """What `config` says: breakwater's own tools are safe, and every retry class it sets."""
        template = config.gateway.tool_name_template
        safety = cls(builtins=frozenset(n for n in (config.gateway.search_tool, config.gateway.status_tool) if n))
        for spec in config.servers:
            if spec.call.retry != "auto":
                safety.servers.append((*name_affixes(template, spec.name), spec.call.retry))
            for tool, settings in spec.tools.items():
                if settings.call.retry != "auto":
                    name = namespaced(template, spec.name, tool, config.gateway.tool_name_max)
                    safety.configured[name] = settings.call.retry
                    # And the name it is listed under when another server's tool has that one (the catalog's rule).
                    safety.configured[distinct_name(name, spec.name, tool, config.gateway.tool_name_max)] = settings.call.retry
        return safety

    def learn(self, answer: bytes) -> None:
        """Note each tool's readOnlyHint, and whether it declares an output schema, from a `tools/list` answer."""
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            for tool in json.loads(answer)["result"]["tools"]:
                hints = tool.get("annotations") or {}
                name = str(tool["name"])
                self.learned[name] = hints.get("readOnlyHint") is True
                if tool.get("outputSchema") is not None:
                    self.schemas.add(name)
                else:
                    self.schemas.discard(name)

    def safe(self, name: str) -> bool:
        """Whether a call of the tool named `name` downstream only reads."""
        if name in self.builtins:
            return True
        if name in self.configured:
            return self.configured[name] == "safe"
        fits = [
            (len(p) + len(s), retry)
            for p, s, retry in self.servers
            if len(name) >= len(p) + len(s) and name.startswith(p) and name.endswith(s)
        ]
        if fits:
            return max(fits)[1] == "safe"  # the most specific server's
        return self.learned.get(name, False)

    def safe_call(self, line: bytes) -> bool:
        """Whether the `tools/call` request `line` only reads."""
        name = _called(line)
        return name is not None and self.safe(name)

    def declares_schema(self, line: bytes) -> bool:
        """Whether the tool the `tools/call` request `line` calls declares an output schema."""
        return _called(line) in self.schemas


def _called(line: bytes) -> str | None:
    """The tool name of the `tools/call` request `line`, or None."""
    with contextlib.suppress(ValueError, AttributeError):
        name = json.loads(line).get("params", {}).get("name")
        return name if isinstance(name, str) else None
    return None
