"""The per-server state contract that people, scripts and later parts rely on.

States:

* `pending`     not tried yet (waiting for its start-up slot)
* `connecting`  attempt n in flight (possibly queued for an admission slot: `phase`)
* `ready`       connected; tools known
* `retrying`    the last attempt failed; waiting until `next_retry_at`
* `failed`      the retry budget is spent (or the failure cannot heal by retrying soon);
                background attempts continue at a slow cadence, see `next_retry_at`
* `disabled`    turned off in config

`breakwater status --json` prints `StatusReport.to_json()`, which also lists, per tool of every
ready server, the timeout in force and whether it was configured, learned or the default. Every time
in these documents is written by `iso()` (ISO 8601, UTC, milliseconds) and read back by `from_iso()`.

A core leaf: imports nothing from breakwater, so every stage can use it.
"""

from __future__ import annotations

import datetime as _dt
import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: How `disabled_by` begins for a server the config enables that is off here all the same: a variable it names is
#: not set, its cwd is missing. It counts as not ready (`StatusReport.all_ready`), unlike one the config turns off.
OFF_FOR_VALUES = "a value it names cannot be had here: "

__all__ = [
    "PERSISTENT_REASONS",
    "ErrorInfo",
    "Reason",
    "RejectedTool",
    "ServerState",
    "ServerStatus",
    "StatusReport",
    "ToolTimeout",
    "from_iso",
    "iso",
]


class ServerState(enum.StrEnum):
    """Where one server stands."""

    PENDING = "pending"
    CONNECTING = "connecting"
    READY = "ready"
    RETRYING = "retrying"
    FAILED = "failed"
    DISABLED = "disabled"


class Reason(enum.StrEnum):
    """Why a connect attempt failed."""

    SPAWN_FAILED = "spawn_failed"  # command not found or not executable
    EXITED = "exited"  # the process exited (code and last stderr lines in the message)
    TIMEOUT = "timeout"  # the attempt did not finish within attempt_timeout_s
    REFUSED = "refused"  # nothing listening at the address
    RESET = "reset"  # the peer cut the connection
    UNREACHABLE = "unreachable"  # the host name did not resolve or the network is down
    HTTP_STATUS = "http_status"  # an HTTP error status (in the message)
    AUTH_REQUIRED = "auth_required"  # HTTP 401 or 403
    PROTOCOL_ERROR = "protocol_error"  # the peer does not speak MCP as expected
    TLS = "tls"  # certificate or TLS handshake failure
    CONNECTION_LOST = "connection_lost"  # a ready connection dropped (reconnecting)
    UNHEALTHY = "unhealthy"  # a ready server stopped answering its health check


# Failures that more retries within seconds cannot heal: report `failed` at once (background
# attempts continue) instead of burning the budget and keeping `status --wait` waiting.
PERSISTENT_REASONS = frozenset({Reason.SPAWN_FAILED, Reason.AUTH_REQUIRED, Reason.TLS})


@dataclass(frozen=True, kw_only=True)
class ErrorInfo:
    """A failure: a stable code for scripts and a message for people."""

    code: Reason
    message: str
    http_status: int | None = None
    exit_code: int | None = None
    stderr_tail: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorInfo:
        """The inverse of `to_json` (for a status read from a running gateway)."""
        return cls(
            code=Reason(data["code"]),
            message=str(data["message"]),
            http_status=data.get("http_status"),
            exit_code=data.get("exit_code"),
            stderr_tail=tuple(data.get("stderr_tail", ())),
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: `code` and `message`, plus whichever of the optional facts are known."""
        out: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.http_status is not None:
            out["http_status"] = self.http_status
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.stderr_tail:
            out["stderr_tail"] = list(self.stderr_tail)
        return out


def from_iso(text: str | None) -> float | None:
    """The inverse of `iso`."""
    return None if text is None else _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(ts: float | None) -> str | None:
    """An epoch timestamp as ISO 8601 UTC with milliseconds."""
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, kw_only=True)
class RejectedTool:
    """A tool a server listed that breakwater leaves out, and why (its definition breaks the MCP schema).

    The server's other tools are served: one broken definition costs only itself.
    """

    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        """`{"name", "reason"}`."""
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class ServerStatus:
    """A snapshot of one server."""

    name: str
    transport: str
    state: ServerState
    protocol: str | None = None
    tools: int | None = None
    attempts: int = 0
    attempt: int = 0
    phase: str | None = None
    connect_ms: int | None = None
    next_retry_at: float | None = None
    error: ErrorInfo | None = None
    #: Wall time of the first failed attempt since the server was last ready (None: not failing).
    failing_since: float | None = None
    #: Tools the server listed whose definitions are invalid, left out of `tools` (the rest are served).
    rejected_tools: tuple[RejectedTool, ...] = ()
    #: Why a `disabled` server is configured but not started: the key that says so ("mcpServers.x.disabled is true",
    #: "mcp.excluded lists it (Gemini CLI's settings)").
    disabled_by: str | None = None
    #: For a ready server: each tool name the config gives settings or lists for (`[servers.NAME.tools.T]`,
    #: `includeTools`, ...) that the server does not list, said with the key and a close name (a typo configures nothing).
    unmatched: tuple[str, ...] = ()
    #: Why the last ready connection went away (its process exited, with the code and stderr tail; a failed health
    #: check), and when (wall time): kept once the server is ready again, where `error` is cleared.
    last_drop: ErrorInfo | None = None
    last_drop_at: float | None = None
    #: While a connect attempt is in its handshake: when it began (wall time).
    attempt_started_at: float | None = None

    @property
    def off_here(self) -> bool:
        """Whether the config enables the server but it is off: a value it names cannot be had here (`OFF_FOR_VALUES`)."""
        return (self.disabled_by or "").startswith(OFF_FOR_VALUES)

    def to_json(self) -> dict[str, Any]:
        """One entry of `status --json`'s `servers` list (`phase` only while queued for admission,
        `failing_since` only while connects keep failing, `rejected_tools` only when a tool was left out, `disabled_by`
        only for a disabled server, `off_here` only for an enabled server off for a value not set here, `unmatched` only
        when the config names a tool the server does not list, `last_drop` once a ready connection has gone away,
        `attempt_started_at` while a connect attempt is in its handshake)."""
        return (
            {
                "name": self.name,
                "transport": self.transport,
                "state": self.state.value,
                "protocol": self.protocol,
                "tools": self.tools,
                "attempts": self.attempts,
                "connect_ms": self.connect_ms,
                "next_retry_at": iso(self.next_retry_at),
                "error": None if self.error is None else self.error.to_json(),
            }
            | ({"phase": self.phase} if self.phase else {})
            | ({"failing_since": iso(self.failing_since)} if self.failing_since is not None else {})
            | ({"attempt_started_at": iso(self.attempt_started_at)} if self.attempt_started_at is not None else {})
            | ({"rejected_tools": [t.to_json() for t in self.rejected_tools]} if self.rejected_tools else {})
            | ({"disabled_by": self.disabled_by} if self.disabled_by else {})
            | ({"off_here": True} if self.off_here else {})
            | ({"unmatched": list(self.unmatched)} if self.unmatched else {})
            | ({"last_drop": {"at": iso(self.last_drop_at), **self.last_drop.to_json()}} if self.last_drop is not None else {})
        )


@dataclass(frozen=True, kw_only=True)
class ToolTimeout:
    """The per-attempt timeout a call of one tool gets now, and where it comes from."""

    server: str
    tool: str
    timeout_s: float
    #: `configured` (set in the config file: the tool's or its server's own table, or the top-level
    #: `[call]`), `learned` (from the call journal's recorded latencies; it wins over the top-level
    #: `[call]`, not over a server's or tool's own) or `default` (the built-in `[call] timeout_s`).
    source: str
    #: When the tool's learned timeout came into force (epoch seconds): when this process's own calls
    #: of it were enough to learn from. None unless `source` is `learned`, and None for a value the
    #: journal had before this process could tell when (a restart, a `breakwater status` run): the
    #: process's own start time, printed before, was not when it was learned.
    learned_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """One entry of `status --json`'s `timeouts` list (`learned_at` only when it is known)."""
        out: dict[str, Any] = {"server": self.server, "tool": self.tool, "timeout_s": round(self.timeout_s, 3)}
        out["source"] = self.source
        if self.learned_at is not None:
            out["learned_at"] = iso(self.learned_at)
        return out


@dataclass(frozen=True, kw_only=True)
class StatusReport:
    """Every server at one instant."""

    servers: tuple[ServerStatus, ...] = field(default_factory=tuple)
    #: Every tool of every ready server: the timeout in force and its source (learned ones change on their own).
    timeouts: tuple[ToolTimeout, ...] = field(default_factory=tuple)

    @property
    def summary(self) -> dict[str, int]:
        """How many servers are in each state (states with none left out)."""
        counts = Counter(s.state.value for s in self.servers)
        return {state.value: counts[state.value] for state in ServerState if counts[state.value]}

    @property
    def all_ready(self) -> bool:
        """True when every server the config enables is ready (one it enables but that is off here is not)."""
        return all(s.state is ServerState.READY or (s.state is ServerState.DISABLED and not s.off_here) for s in self.servers)

    def to_json(self) -> dict[str, Any]:
        """What `breakwater status --json` prints: `servers`, `summary` and `timeouts`."""
        return {
            "servers": [s.to_json() for s in self.servers],
            "summary": self.summary,
            "timeouts": [t.to_json() for t in self.timeouts],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StatusReport:
        """The inverse of `to_json` (for a status read from a running gateway)."""
        return cls(
            servers=tuple(
                ServerStatus(
                    name=s["name"],
                    transport=s["transport"],
                    state=ServerState(s["state"]),
                    protocol=s.get("protocol"),
                    tools=s.get("tools"),
                    attempts=s.get("attempts", 0),
                    phase=s.get("phase"),
                    connect_ms=s.get("connect_ms"),
                    next_retry_at=from_iso(s.get("next_retry_at")),
                    error=None if s.get("error") is None else ErrorInfo.from_json(s["error"]),
                    failing_since=from_iso(s.get("failing_since")),
                    attempt_started_at=from_iso(s.get("attempt_started_at")),
                    rejected_tools=tuple(
                        RejectedTool(name=str(t.get("name")), reason=str(t.get("reason"))) for t in s.get("rejected_tools", [])
                    ),
                    disabled_by=s.get("disabled_by"),
                    unmatched=tuple(str(note) for note in s.get("unmatched", [])),
                    last_drop=None if s.get("last_drop") is None else ErrorInfo.from_json(s["last_drop"]),
                    last_drop_at=None if s.get("last_drop") is None else from_iso(s["last_drop"].get("at")),
                )
                for s in data.get("servers", [])
            ),
            timeouts=tuple(
                ToolTimeout(
                    server=t["server"],
                    tool=t["tool"],
                    timeout_s=float(t["timeout_s"]),
                    source=t["source"],
                    learned_at=from_iso(t.get("learned_at")),
                )
                for t in data.get("timeouts", [])
            ),
        )
