"""Upstream log messages: the levels a downstream asked for, and the messages that belong to no call.

A log message sent while a call is in flight is relayed to that call's caller (`gateway._relay.Relay.log`).
One that belongs to no single call (a background job's, a reconnect's, a warning at start-up, or one sent on
stdio while calls from several clients are in flight) is `IdleLogs.publish`ed:

* to the gateway's own log (`breakwater.gateway.upstream`, which `serve` writes to stderr and a shared
  gateway to its log file), naming the server, at the Python level matching its MCP level, its data on
  one line, cut at `LOG_TEXT_MAX` characters, with the server's secrets redacted;
* as a `notifications/message` to each downstream session that has the server's tools in view and whose
  `logging/setLevel` admits the level, with `logger` naming the server (`server` or `server/its-logger`).

Which sessions: a session is a handshake-era client connection that listed or called the gateway's tools
(those the gateway tells of list changes: `Gateway._track`), of a gateway whose servers include this one. A
shared server's message (HTTP servers, shared stdio ones, every server of a gateway that serves one client)
goes to every such session: they all see its tools, and a shared gateway serves one user's sessions only.
A process a session runs for itself (a per-session stdio server, `gateway._session`) is that session's: its
messages go to that session alone, never to another session running its own process of the same name.
A 2026-07-28 client has no channel for log messages outside a request, and a client that has not yet listed
the tools sees none: for them the gateway's log is where the message shows.

A chatty server cannot flood: each connection's messages pass `LogAllowance` (the allowance a call's relay
uses). What it refuses is counted and said once, when the server has paused for `FLOOD_QUIET_S` (or every
`FLOOD_REPORT_S` while it never pauses): one warning in the gateway's log and one to the sessions.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

import mcp.types as types
from mcp.server.connection import Connection, allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater._breakwater import Breakwater
from breakwater._clock import Clock, SystemClock
from breakwater.config._redact import Redactor
from breakwater.gateway._connection import connection_of

__all__ = [
    "FLOOD_QUIET_S",
    "FLOOD_REPORT_S",
    "LOG_LEVELS",
    "LOG_LEVEL_STATE",
    "LOG_TEXT_MAX",
    "RELAYED_LOGS_BURST",
    "RELAYED_LOGS_PER_S",
    "UPSTREAM_LOG_LEVEL",
    "IdleLogs",
    "LogAllowance",
    "UpstreamLog",
    "admitted_levels",
    "levels_from",
    "render",
]

logger = logging.getLogger("breakwater.gateway")
#: Where upstream log messages outside calls go: a child of the gateway's logger, so it can be quietened alone.
upstream_logger = logging.getLogger("breakwater.gateway.upstream")

LOG_LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
LOG_LEVEL_STATE = "breakwater.logLevel"  # in the downstream connection's `state`: its logging/setLevel
#: Upstream connections opt into every log level; each downstream caller then gets what its own level admits.
UPSTREAM_LOG_LEVEL: types.LoggingLevel = "debug"

#: Log messages relayed per second once the burst is spent (per call, and per upstream connection outside calls);
#: past it they are dropped, counted and reported. A server at debug level (what upstream connections ask for)
#: can send thousands a second; a client, and the model reading them, gains nothing from more than a screenful.
RELAYED_LOGS_PER_S = 20.0
#: Log messages relayed at once before `RELAYED_LOGS_PER_S` applies.
RELAYED_LOGS_BURST = 100

#: A message's data in the gateway's log is cut here: one line of a log, not a dump.
LOG_TEXT_MAX = 2000
#: A flood outside calls is reported once the server sent nothing for this long...
FLOOD_QUIET_S = 1.0
#: ...or this long after it began, if it never pauses (then again for the next stretch).
FLOOD_REPORT_S = 60.0
#: How long one session may take to take one relayed message: a client that stopped reading holds up no other.
SEND_S = 2.0
#: Upstream connections whose allowance is remembered (the oldest forgotten first): sessions come and go.
SOURCES_MAX = 1024

#: MCP's levels (RFC 5424's) as Python's.
PYTHON_LEVELS: Mapping[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "alert": logging.CRITICAL,
    "emergency": logging.CRITICAL,
}


def levels_from(level: object) -> frozenset[types.LoggingLevel]:
    """The levels a `logging/setLevel` of `level` admits (every level when it set none)."""
    return frozenset(LOG_LEVELS[LOG_LEVELS.index(level) :] if level in LOG_LEVELS else LOG_LEVELS)


def admitted_levels(ctx: ServerRequestContext[Any]) -> frozenset[types.LoggingLevel]:
    """The log levels the downstream asked for: per request on 2026-07-28, by `logging/setLevel` before."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return allowed_log_levels(ctx.protocol_version, ctx.meta)
    state = getattr(connection_of(ctx), "state", None)
    return levels_from(state.get(LOG_LEVEL_STATE) if isinstance(state, dict) else None)


@dataclass
class LogAllowance:
    """A token bucket on `clock`: `RELAYED_LOGS_BURST` messages at once, then `RELAYED_LOGS_PER_S` a second."""

    clock: Clock
    _left: float = RELAYED_LOGS_BURST
    _counted_at: float | None = None

    def admit(self) -> bool:
        """Whether one more message may be relayed (it is counted against the allowance if so)."""
        now = self.clock.monotonic()
        if self._counted_at is not None:
            self._left = min(RELAYED_LOGS_BURST, self._left + (now - self._counted_at) * RELAYED_LOGS_PER_S)
        self._counted_at = now
        if self._left >= 1 - 1e-9:  # a rate's worth of seconds earns one whole message, float error aside
            self._left -= 1
            return True
        return False


#: Where an `UpstreamLog` hands each message: the relay's `Relay.log`.
LogSink = Callable[["UpstreamLog", types.LoggingMessageNotificationParams], Awaitable[None]]


@dataclass(eq=False)
class UpstreamLog:
    """One upstream connection's `logging_callback`: which server, and what of it must not reach a log."""

    server: str
    transport: str
    redact: Redactor
    sink: LogSink
    #: The attached session whose own process this connection is (its token: the sink of its resource updates);
    #: None for a shared connection.
    session: object | None = None

    async def __call__(self, params: types.LoggingMessageNotificationParams) -> None:
        await self.sink(self, params)


def render(data: Any, redact: Redactor) -> str:
    """A message's data for the gateway's log: on one line, compact JSON unless it is text, cut, redacted."""
    if isinstance(data, str):
        text = data
    else:
        try:
            text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
        except ValueError:  # a circular structure cannot come off the wire; say what it is rather than fail
            text = repr(data)
    if len(text) > LOG_TEXT_MAX:
        text = f"{text[:LOG_TEXT_MAX]}… ({len(text) - LOG_TEXT_MAX} more characters)"
    # Redacted before the line breaks are escaped, so a secret is matched as it was written.
    return redact(text).replace("\r", "\\r").replace("\n", "\\n")


class Audience(Protocol):
    """A gateway whose sessions may hear a server's messages: the servers it serves (`bw`)."""

    @property
    def bw(self) -> Breakwater: ...


@dataclass(eq=False)
class _Sessions:
    """One gateway's tracked connections, and which of its servers are its session's own processes."""

    connections: Mapping[int, Connection]
    own: frozenset[str]
    session: object | None


@dataclass(eq=False)
class _Source:
    """One upstream connection's allowance outside calls, and what it dropped since it was last reported."""

    allowance: LogAllowance
    dropped: int = 0
    reporting: bool = False


@dataclass(eq=False)
class IdleLogs:
    """The upstream log messages that belong to no call: to the gateway's log and to the sessions that see the server."""

    clock: Clock = field(default_factory=SystemClock)
    _audiences: weakref.WeakKeyDictionary[Audience, _Sessions] = field(default_factory=weakref.WeakKeyDictionary)
    _sources: OrderedDict[tuple[str, object | None], _Source] = field(default_factory=OrderedDict)

    def attend(self, gateway: Audience, connections: Mapping[int, Connection]) -> None:
        """Relay messages of `gateway`'s servers to `connections` (its tracked sessions, a live mapping) from now on.

        Held weakly: an attached session's view goes when its session ends.
        """
        own_servers = getattr(gateway.bw, "own", None)  # an attached session's `SessionServers`: its own processes
        own: frozenset[str] = frozenset()
        session: object | None = None
        if isinstance(own_servers, Breakwater):
            specs = [spec for spec in own_servers.config.servers if spec.enabled]
            own = frozenset(spec.name for spec in specs)
            for spec in specs:
                # The token its connections carry: what the relay's hooks for this session's servers make.
                hooks = own_servers.upstream(spec.name).client_hooks
                hook = hooks(spec).get("logging_callback") if hooks is not None else None
                if isinstance(hook, UpstreamLog):
                    session = hook.session
                    break
        self._audiences[gateway] = _Sessions(connections, own, session)

    async def publish(self, source: UpstreamLog, params: types.LoggingMessageNotificationParams) -> None:
        """`params` from `source`, which belongs to no single call: to the log and the sessions, within the allowance."""
        state = self._source(source)
        if not state.allowance.admit():
            state.dropped += 1
            if not state.reporting:
                state.reporting = True
                try:
                    await self._report_when_quiet(source, state)
                finally:
                    state.reporting = False
            return
        level = PYTHON_LEVELS.get(params.level, logging.WARNING)
        if upstream_logger.isEnabledFor(level):
            named = f", logger {source.redact(params.logger)!r}" if params.logger else ""
            text = render(params.data, source.redact)
            upstream_logger.log(level, "upstream %r (%s%s): %s", source.server, params.level, named, text)
        relayed = {
            "level": params.level,
            "logger": f"{source.server}/{source.redact(params.logger)}" if params.logger else source.server,
            "data": source.redact.scrub(params.data),
        }
        await self._send(source, params.level, relayed)

    def _source(self, source: UpstreamLog) -> _Source:
        key = (source.server, source.session)
        state = self._sources.get(key)
        if state is None:
            state = self._sources[key] = _Source(LogAllowance(self.clock))
            while len(self._sources) > SOURCES_MAX:
                self._sources.popitem(last=False)
        self._sources.move_to_end(key)
        return state

    def _hearing(self, source: UpstreamLog) -> list[Connection]:
        """The sessions that see `source`'s server: each tracked connection of each gateway serving it, once."""
        found: dict[int, Connection] = {}
        for gateway, sessions in list(self._audiences.items()):
            if source.server not in {spec.name for spec in gateway.bw.config.servers}:
                continue
            own = source.server in sessions.own
            # A session's own process is heard by that session alone; a shared connection by no session's own view.
            if own != (source.session is not None) or (own and source.session is not sessions.session):
                continue
            found.update((id(c), c) for c in list(sessions.connections.values()))
        return list(found.values())

    async def _send(self, source: UpstreamLog, level: types.LoggingLevel, params: Mapping[str, Any]) -> None:
        for connection in self._hearing(source):
            if level not in levels_from(connection.state.get(LOG_LEVEL_STATE)):
                continue
            with self.clock.deadline_scope(self.clock.monotonic() + SEND_S):
                await connection.notify("notifications/message", params)  # best effort: never raises

    async def _report_when_quiet(self, source: UpstreamLog, state: _Source) -> None:
        """Once the flood pauses (or has gone on for `FLOOD_REPORT_S`), say once how much of it was not relayed."""
        began = self.clock.monotonic()
        while True:
            seen = state.dropped
            await self.clock.sleep(FLOOD_QUIET_S)
            if state.dropped == seen or self.clock.monotonic() - began >= FLOOD_REPORT_S:
                break
        dropped, state.dropped = state.dropped, 0
        why = f"it sent more than {RELAYED_LOGS_BURST} at once, then more than {RELAYED_LOGS_PER_S:g} a second"
        upstream_logger.warning("upstream %r: %d log message(s) outside any call not relayed: %s", source.server, dropped, why)
        text = f"breakwater: {dropped} log message(s) from {source.server!r} outside any call were not relayed: {why}"
        await self._send(source, "warning", {"level": "warning", "logger": "breakwater", "data": text})
