"""Waiting for a server that is on its way up, instead of refusing a call it could have answered.

A call that arrives while its server is `pending` or `connecting` (the first second after `serve`
starts, a one-shot client's only call) waits for the connect to finish, bounded by the call's own
window. A server that is `retrying` after a refused attempt, or `failed`, is not expected to make it
within a call's window: the caller hears at once, with the reason. May import the core leaves and
`connect`'s `Upstream`.
"""

from __future__ import annotations

from typing import Any

from breakwater._clock import Clock
from breakwater.config import ServerSpec
from breakwater.connect._upstream import Upstream
from breakwater.status import ServerState, ServerStatus, iso

__all__ = ["ON_ITS_WAY", "call_window", "connecting_note", "wait_until_ready"]

#: The states of a server whose connect is under way, so worth a caller's wait.
ON_ITS_WAY = frozenset({ServerState.PENDING, ServerState.CONNECTING})


def _usable(upstream: Upstream) -> bool:
    return upstream.state is ServerState.READY and upstream.client is not None


async def wait_until_ready(upstream: Upstream, *, clock: Clock, seconds: float, deadline: float | None = None) -> bool:
    """Wait up to `seconds` (and never past the monotonic `deadline`) while `upstream` is on its way up.

    Returns True when the server is ready to take the call. Returns at once (False) for a server
    that is retrying, failed or disabled: those answer with their reason, not with a wait.
    """
    if _usable(upstream):
        return True
    end = clock.monotonic() + max(0.0, seconds)
    if deadline is not None:
        end = min(end, deadline)
    while upstream.state in ON_ITS_WAY and clock.monotonic() < end and not upstream.closing:
        with clock.deadline_scope(end):
            await upstream.wait_changed()
    return _usable(upstream)


def call_window(spec: ServerSpec, tool: str, timeout: float | None = None) -> float:
    """How long a call of `tool` may wait for its server: the call's own timeout, else the configured one.

    The tool's definition is not known before its server is ready, so this is the configuration's
    answer (the tool's own `[servers.X.tools.T]` table, else the server's `[call]`).
    """
    if timeout is not None:
        return timeout
    own = spec.tools.get(tool)
    return (own.call if own is not None else spec.call).timeout_s


def connecting_note(snap: ServerStatus, now: float) -> tuple[str | None, dict[str, Any]]:
    """What is known about a server that keeps failing to connect: a message and envelope detail.

    For a server that is `retrying` after failed attempts: since when, how many attempts, the last
    reason and the next attempt, so an agent is not told "still starting up" about a URL that has
    refused connections for minutes. For a `failed` one, the same detail without a message (its
    SERVER_UNAVAILABLE message has the reason). (None, {}) for a server simply on its way up.
    """
    if snap.state not in (ServerState.RETRYING, ServerState.FAILED) or snap.error is None or snap.failing_since is None:
        return None, {}
    detail = {
        "failing_since": iso(snap.failing_since),
        "connect_attempts": snap.attempts,
        "next_retry_at": iso(snap.next_retry_at),
    }
    if snap.state is ServerState.FAILED:  # its own message already names the reason
        return None, detail
    ago = max(0.0, now - snap.failing_since)
    since = f"{round(ago)} s" if ago < 120 else f"{round(ago / 60)} min"
    message = (
        f"The server has failed to connect since {iso(snap.failing_since)} ({since} ago, {snap.attempts} attempts; "
        f"last: {snap.error.code.value}, {snap.error.message}); the next attempt is at {iso(snap.next_retry_at)}. "
        "The call was not sent."
    )
    return message, detail
