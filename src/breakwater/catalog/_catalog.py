"""The catalog: every tool the gateway knows, under a namespaced name, even while its server is down.

Each server's last-known tool list is kept on disk, keyed by the server's name and a fingerprint of
its config, so the tools of a server that is still connecting (or has failed) are known by name
from the first second — and a call to one answers "its server is connecting", never "no such tool".
The ranking behind `breakwater_search_tools` is `breakwater.catalog._search`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types

from breakwater import _paths
from breakwater.config._checks import DEFAULT_TOOL_NAME_MAX, downstream_names, namespaced

__all__ = ["Catalog", "Entry", "default_catalog_dir", "entry_json", "namespaced", "tool_fingerprint"]

logger = logging.getLogger("breakwater.catalog")


def default_catalog_dir() -> Path:
    """Where last-known tool lists live when no directory is configured."""
    return _paths.cache_dir() / "catalog"


def tool_fingerprint(tool: types.Tool) -> str:
    """A hash of what defines a tool for the model: description, schemas, annotations."""
    body = tool.model_dump(
        mode="json", by_alias=True, exclude_none=True, include={"description", "input_schema", "output_schema", "annotations"}
    )
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One tool as the gateway shows it."""

    name: str  # namespaced, downstream
    server: str
    tool: types.Tool  # the upstream definition, its upstream name
    live: bool  # from a ready server (False: last known, from the cache)

    def downstream(self) -> types.Tool:
        """The definition downstream clients see: the upstream one, renamed, without its `execution`.

        `execution.taskSupport` (2025-11-25) says how the *upstream* takes the tool. Downstream the
        gateway answers every tool as an ordinary call (it calls a task-only tool as a task itself,
        `gate/_task_required.py`) and offers no 2025-11-25 tasks, so relayed as it came it told a
        client a tool it may call could only be called as a task the gateway does not take.
        """
        return self.tool.model_copy(update={"name": self.name, "execution": None})


class Catalog:
    """Live and last-known tools of every server, with on-disk memory."""

    def __init__(self, *, template: str, directory: Path | None, name_max: int = DEFAULT_TOOL_NAME_MAX) -> None:
        self.template = template
        #: The longest name it gives a tool (`[gateway] tool_name_max`).
        self.name_max = name_max
        self._dir = directory
        self._last_known: dict[str, list[types.Tool]] = {}
        self._pins: dict[str, dict[str, str]] = {}
        #: Moves whenever a server's last-known tools change. In a shared gateway one catalog serves every
        #: session, and a session's own stdio server may still be queued when another session's process of
        #: it lists its tools: the waiting session's view is rebuilt, and its first tools/list answered, then.
        self.version = 0
        self._changed = anyio.Event()
        self._renamed: set[tuple[str, str]] = set()  # (taken name, the name given instead), each warned of once
        #: Why a write of one of the catalog's files failed in this process, or None: `tools --accept` says it.
        self.problem: str | None = None

    def _path(self, server: str, fingerprint: str) -> Path | None:
        if self._dir is None:
            return None
        return self._dir / f"{_paths.file_stem(server)}-{fingerprint}.json"

    def load(self, server: str, fingerprint: str) -> list[types.Tool]:
        """The last-known tools of `server` as configured now (empty when never seen)."""
        if server in self._last_known:
            return self._last_known[server]
        tools: list[types.Tool] = []
        path = self._path(server, fingerprint)
        if path is not None and path.is_file():
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                tools = [types.Tool.model_validate(t) for t in data["tools"]]
        self._last_known[server] = tools
        return tools

    def remember(self, server: str, fingerprint: str, tools: Sequence[types.Tool]) -> None:
        """Keep `tools` as the last-known list of `server` (in memory and on disk)."""
        if self._last_known.get(server) == list(tools):
            return
        self._last_known[server] = list(tools)
        self.version += 1
        self._changed.set()
        self._changed = anyio.Event()
        path = self._path(server, fingerprint)
        if path is None:
            return
        payload = {"server": server, "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]}
        self._write(path, json.dumps(payload))

    async def wait_changed(self) -> None:
        """Return at the next change of any server's last-known tools."""
        await self._changed.wait()

    # ---- definition pins (drift) -------------------------------------------------------------

    def _pins_path(self, server: str, fingerprint: str) -> Path | None:
        path = self._path(server, fingerprint)
        return None if path is None else path.with_suffix(".pins.json")

    def pins(self, server: str, fingerprint: str) -> dict[str, str]:
        """The approved definition fingerprint of each tool of `server` (tool name -> fingerprint)."""
        if server not in self._pins:
            pins: dict[str, str] = {}
            path = self._pins_path(server, fingerprint)
            if path is not None and path.is_file():
                with contextlib.suppress(OSError, ValueError):
                    loaded = json.loads(path.read_text())
                    pins = {str(k): str(v) for k, v in loaded.items()}
            self._pins[server] = pins
        return self._pins[server]

    def _save_pins(self, server: str, fingerprint: str) -> None:
        path = self._pins_path(server, fingerprint)
        if path is None:
            return
        self._write(path, json.dumps(self._pins[server], sort_keys=True))

    def _write(self, path: Path, text: str) -> None:
        """One of the catalog's files, written whole; `problem` says why not, and stays (a later write of another server's
        file says nothing of this one's). The cache is an optimisation: a read-only or full disk must never break the
        gateway, but is said once (`_paths.say_unusable`)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _paths.write_atomic(path, text)
        except OSError as exc:
            self.problem = f"cannot write {path}: {exc.strerror or exc}"
            _paths.say_unusable(
                logger,
                "the last-known tools and approved tool definitions",
                path.parent,
                exc,
                "[gateway] catalog_dir (BREAKWATER_CATALOG_DIR) to a writable directory",
                "tools are listed only once their servers connect, and approvals of changed tools last one run",
            )

    def drifted(self, server: str, fingerprint: str, tools: Sequence[types.Tool]) -> list[str]:
        """Tools whose definition differs from the approved one. A tool seen for the first time is
        approved as it is (trust on first use), so only a change under a running setup is reported."""
        pins = self.pins(server, fingerprint)
        changed: list[str] = []
        fresh = False
        for tool in tools:
            current = tool_fingerprint(tool)
            approved = pins.get(tool.name)
            if approved is None:
                pins[tool.name] = current
                fresh = True
            elif approved != current:
                changed.append(tool.name)
        if fresh:
            self._save_pins(server, fingerprint)
        return changed

    def accept(self, server: str, fingerprint: str, tools: Sequence[types.Tool], names: Iterable[str] | None = None) -> list[str]:
        """Approve the current definitions (of `names`, or every tool); returns the tools whose pin changed."""
        pins = self.pins(server, fingerprint)
        wanted = None if names is None else set(names)
        accepted = []
        for tool in tools:
            if wanted is not None and tool.name not in wanted:
                continue
            current = tool_fingerprint(tool)
            if pins.get(tool.name) != current:
                pins[tool.name] = current
                accepted.append(tool.name)
        if accepted:
            self._save_pins(server, fingerprint)
            self.version += 1  # what may be called changed (the gate's `approve` reads the version)
        return accepted

    def entries(
        self, servers: Iterable[tuple[str, bool, Sequence[types.Tool]]], reserved: frozenset[str] = frozenset()
    ) -> list[Entry]:
        """Entries for `(server, live, tools)` triples, in order.

        Two tools that would be named alike (servers "a b" and "a_b", or "a"'s "b__add" and "a__b"'s
        "add") are both listed: the server with the stronger `claim` (a__b; a_b) keeps the name, the
        other's tool gets a `distinct_name`, with a warning; so does a tool named as one of breakwater's own
        (`reserved`). (A server's list holds each name once: `connect._tool_list` leaves out a second.)
        """
        listed = [(server, live, tool) for server, live, tools in servers for tool in tools]
        names = downstream_names(self.template, [(server, tool.name) for server, _live, tool in listed], self.name_max, reserved)
        out: list[Entry] = []
        for (server, live, tool), name in zip(listed, names, strict=True):
            self._warn_if_renamed(name, server, tool.name)
            out.append(Entry(name=name, server=server, tool=tool, live=live))
        return out

    def _warn_if_renamed(self, name: str, server: str, tool: str) -> None:
        taken = namespaced(self.template, server, tool, self.name_max)
        if name != taken and (taken, name) not in self._renamed:
            self._renamed.add((taken, name))
            logger.warning("server %r's tool %r is listed as %r: %r is another tool's", server, tool, name, taken)


def entry_json(entry: Entry) -> dict[str, Any]:
    """A search hit as JSON."""
    return {
        "name": entry.name,
        "server": entry.server,
        "tool": entry.tool.name,
        "description": (entry.tool.description or "").strip().splitlines()[0] if entry.tool.description else "",
        "live": entry.live,
    }
