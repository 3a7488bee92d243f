"""Each server's protocol revision, remembered between starts: no probe once known, the cheaper revision where it loses nothing.

Why. With `protocol = "auto"` every start asked each server which revision it speaks: a
`server/discover` round trip before anything else, and for a server that swallows unknown methods
a wait for the attempt deadline before the `initialize` that works. The spec says a client SHOULD
cache a server's era and MAY keep it across restarts (2026-07-28, basic/versioning). The SDK 2.3
server also pays for the newer revision on every call: its per-request envelope cost it 2.56 M
instructions per `tools/call` against 2.12 M for a 2025-11-25 request (`bench/upstream_cost.py`),
0.24-0.27 ms a call through breakwater on a 2-core machine (interleaved A/B, docs/benchmarks.md).

What is kept, per server (its name and config fingerprint), in one small JSON file: the revision it
was last reached in; for a 2026-07-28 server its discover result (the next start pins the revision
without asking again); what it offered that only 2026-07-28 carries (an extension such as tasks, a
tool whose output is not an object); whether it also took the 2025-11-25 handshake when offered.

How a start chooses (`Upstream._recall`, `Recalled.handshake_is_cheaper`), when the config says `auto`:

* a server last reached on 2025-11-25 gets the `initialize` handshake at once;
* a 2026-07-28 server reached over stdio that offered nothing only that revision carries gets the
  2025-11-25 handshake: it is cheaper per call, and what 2026-07-28 would add is not there (no
  tasks offered). One thing more holds it on 2026-07-28 where several clients share it (every
  server of `serve --http` or of a shared gateway): having asked a client anything (sampling,
  elicitation). Only 2026-07-28 ties such a question to the call that asked it; on 2025-11-25
  over stdio nothing does, so while calls of two sessions are in flight the gateway could not
  tell whose it is (`breakwater.gateway._relay`). Every question a one-client server asks is its
  client's. A server's first question is remembered (`ProtocolMemory.asked`), and a shared server
  that asked is spoken to on 2026-07-28 from its next connect. If a server refuses the handshake,
  that is remembered and it is pinned to 2026-07-28 from then on;
* any other 2026-07-28 server is pinned to 2026-07-28 with the remembered discover result.

Why a shared server may move (issue 16): most servers never ask, and for them the newer revision
cost every call 0.44 M instructions more in an SDK 2.3 server and up to 0.11 M more in the gateway
(`serve --http --json-response`; docs/benchmarks.md, sessions 14 and 26). A server that asks loses
its tie only until its next connect; what it loses meanwhile is the question asked while calls of two
sessions overlap, which is refused (with the reason) rather than sent to the wrong client.

What is remembered is dropped after `MEMORY_MAX_AGE_S` (the next start probes again, and sees a
server that has since gained tasks), when the server names another version of itself in a
handshake than when it was probed, and when a connect that went by it fails for any reason (the
next attempt probes: the command may now start another server).

A server reached over HTTP never moves to the older revision: over HTTP the newer one needs no
session (any replica behind a load balancer may answer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater import _paths
from breakwater.config import ServerSpec
from breakwater.config._checks import OFF_WORDS

__all__ = [
    "MEMORY_DIR_ENV",
    "MEMORY_MAX_AGE_S",
    "ProtocolMemory",
    "Recalled",
    "default_memory_dir",
    "lift_sdk_probe_timeout",
    "memory_at",
    "needs_modern",
    "noting_questions",
]

logger = logging.getLogger("breakwater.upstream")

#: How long what a server's probe showed is trusted before the next start probes it again.
MEMORY_MAX_AGE_S = 7 * 24 * 3600.0
_FORMAT = 1
#: The `[connect] protocol_memory_dir` knob's variable, also read where a config built in code leaves it empty.
MEMORY_DIR_ENV = "BREAKWATER_PROTOCOL_MEMORY_DIR"


SDK_PROBE_TIMEOUT_S = 24 * 3600.0  # effectively none: the attempt deadline applies (see lift_sdk_probe_timeout)


def lift_sdk_probe_timeout() -> None:
    """Let the attempt deadline, not the SDK, bound the `server/discover` probe.

    The SDK's auto mode gives the probe a fixed 10 s and then sends `initialize` on the same
    connection. Under a connect storm a healthy server can take longer than that; the late probe
    and the fallback then both occupy the server (more handshakes in flight than breakwater
    admitted) and a dual-era server refuses the fallback. Breakwater bounds every attempt with its
    own deadline, so the SDK's timer only has to stay out of the way (pinned SDK minor version).
    """
    import mcp.client.session as sdk_session

    sdk_session.DISCOVER_TIMEOUT_SECONDS = SDK_PROBE_TIMEOUT_S


def default_memory_dir() -> Path:
    """Where servers' protocol revisions are remembered when no directory is configured: the user cache dir."""
    return _paths.cache_dir() / "protocols"


def memory_at(setting: str) -> ProtocolMemory | None:
    """The memory a `protocol_memory_dir` setting names: a directory, `off` (None), or empty for the default.

    Empty defers to `$BREAKWATER_PROTOCOL_MEMORY_DIR`, as the journal's default file defers to
    `$BREAKWATER_JOURNAL_DB`, so that a config built in code goes where the environment says too.
    """
    chosen = setting or os.environ.get(MEMORY_DIR_ENV, "")
    if chosen.strip().lower() in OFF_WORDS:  # "OFF" or "none" was a folder of that name where the agent started
        return None
    return ProtocolMemory(Path(chosen).expanduser() if chosen else default_memory_dir())


def needs_modern(capabilities: types.ServerCapabilities | None, tools: Sequence[types.Tool]) -> list[str]:
    """What a 2026-07-28 server offered that only that revision carries (empty: the 2025-11-25 handshake loses nothing)."""
    reasons: list[str] = []
    if capabilities is not None:
        reasons += [f"extension {name}" for name in sorted(capabilities.extensions or {})]
        if capabilities.tasks is not None:
            reasons.append("tasks")
    for tool in tools:
        schema = tool.output_schema
        if schema is not None and schema.get("type") != "object":
            reasons.append(f"tool {tool.name} has a non-object output")
    return reasons


def noting_questions(hooks: Mapping[str, Any], asked: Callable[[], None]) -> dict[str, Any]:
    """`hooks` (an `mcp.Client`'s keyword arguments for one connection) with `asked()` called before that connection's
    first sampling or elicitation request (once: what it writes down does not change with the next question)."""
    pending = [asked]

    def note() -> None:
        if pending:
            pending.pop()()

    noted = dict(hooks)
    for key in ("sampling_callback", "elicitation_callback"):
        if (callback := hooks.get(key)) is not None:
            noted[key] = _noting(callback, note)
    return noted


def _noting(callback: Callable[..., Awaitable[Any]], asked: Callable[[], None]) -> Callable[..., Awaitable[Any]]:
    async def noting(*args: Any) -> Any:
        asked()
        return await callback(*args)

    return noting


@dataclass(frozen=True, kw_only=True)
class Recalled:
    """What a start knows of a server from an earlier one."""

    protocol: str
    #: The 2026-07-28 discover result (raw, as the wire had it); None for a 2025-era server.
    discover: dict[str, Any] | None
    #: What the server offered that only 2026-07-28 carries (see `needs_modern`).
    needs: tuple[str, ...]
    #: Whether the server took the 2025-11-25 handshake (None: never offered it).
    handshake: bool | None
    #: The version the server gave of itself when this was learned ("" when it gave none).
    server_version: str
    learned_at: float
    #: Whether the server has asked a client for input (sampling, elicitation) since this was learned.
    asks: bool = False

    @property
    def modern(self) -> bool:
        """Whether the server was last reached on 2026-07-28."""
        return self.protocol in MODERN_PROTOCOL_VERSIONS

    def handshake_is_cheaper(self, *, one_client: bool, transport: str) -> bool:
        """Whether a 2026-07-28 server is better spoken to with the 2025-11-25 handshake (module docstring)."""
        return (
            self.modern
            and transport == "stdio"
            and not self.needs
            and self.handshake is not False
            and (one_client or not self.asks)
        )

    def prior_discover(self) -> types.DiscoverResult | None:
        """The remembered discover result, for a pinned 2026-07-28 connect (None if it no longer parses)."""
        if self.discover is None:
            return None
        try:
            return types.DiscoverResult.model_validate(self.discover)
        except ValueError:
            return None


class ProtocolMemory:
    """Servers' protocol revisions on disk, one file per server and config (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, spec: ServerSpec) -> Path:
        return self.directory / f"{_paths.file_stem(spec.name)}-{spec.fingerprint()}.json"

    def recall(self, spec: ServerSpec, now: float) -> Recalled | None:
        """What is remembered of `spec`'s server, if it is recent enough to go by."""
        recalled = self._read(spec)
        if recalled is None or not 0 <= now - recalled.learned_at <= MEMORY_MAX_AGE_S:
            return None
        return recalled

    def _read(self, spec: ServerSpec) -> Recalled | None:
        try:
            data = json.loads(self._path(spec).read_text(encoding="utf-8"))
            if data.get("format") != _FORMAT:
                return None
            recalled = Recalled(
                protocol=str(data["protocol"]),
                discover=data.get("discover") if isinstance(data.get("discover"), dict) else None,
                needs=tuple(str(n) for n in data.get("needs", ())),
                handshake=data.get("handshake") if isinstance(data.get("handshake"), bool) else None,
                server_version=str(data.get("server_version", "")),
                learned_at=float(data["learned_at"]),
                asks=data.get("asks") is True,
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # never written, unreadable or from another format: probe, as with no memory
        return recalled

    def keep(self, spec: ServerSpec, recalled: Recalled) -> None:
        """Remember `recalled` for `spec` (replaced whole: a reader never sees half a file).

        That the server asked a client something stays remembered until the memory is forgotten: a
        later connect of the same server, which learns the rest again, has not seen it ask yet.
        """
        if not recalled.asks and (known := self._read(spec)) is not None and known.asks:
            recalled = replace(recalled, asks=True)
        body = {"format": _FORMAT, "server": spec.name, **asdict(recalled)}
        path = self._path(spec)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _paths.write_atomic(path, json.dumps(body))
        except OSError as exc:  # a read-only cache costs the next start a probe, nothing more: said once
            costs = "each start asks every server which protocol revision it speaks again"
            setting = "[connect] protocol_memory_dir (BREAKWATER_PROTOCOL_MEMORY_DIR) to a writable directory, or to off"
            _paths.say_unusable(logger, "the servers' protocol revisions", self.directory, exc, setting, costs)

    def asked(self, spec: ServerSpec, now: float) -> bool:
        """Remember that `spec`'s server asked a client for input; True when that is news (it was not known)."""
        recalled = self.recall(spec, now)
        if recalled is None or recalled.asks:
            return False
        self.keep(spec, replace(recalled, asks=True))
        return True

    def forget(self, spec: ServerSpec) -> None:
        """Drop what is remembered of `spec`'s server: its next start probes."""
        with contextlib.suppress(OSError):
            self._path(spec).unlink()
