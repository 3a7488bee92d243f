"""What the OAuth flow tells the call gate of one attempt's request: not sent yet, or refused and not sent again yet.

A 401 (or a 403 `insufficient_scope`) means the server turned the request away before running it. The flow then
refreshes the token (or signs in again) and resends the request. While it does, a deadline that cuts the attempt (its
timeout, the turn budget, a cancel) cut a call that never ran, and the gate, which knows only that the request was
handed to the connection, told the model OUTCOME_UNKNOWN ("it may have run; check before repeating"). The same held
before the first send: a token that expired (hourly, for most servers) is refreshed before the request goes out, and a
cut while the token endpoint was slow was told the same about a call that never left.

The gate hands each attempt a `Refusal` in a context variable (`watch`); the SDK's transports run each request in a
copy of its sender's context, so the flow's `_auth_flow` finds it there. The first request the attempt sends is its
`tools/call`; the flow holds it (`held`) until it has a token, marks it refused (`noted`), and asks before sending it
or sending it again (`may_send`). A gate that cuts the attempt claims the request while it is held or refused
(`claim`): from then on the flow never sends it (a request held when it was claimed goes to the connection marked
`NOT_SENT`, which the transport answers itself), so "the call was not sent" stays true. Both run on one event loop, so
the claim and the send cannot both win.
"""

from __future__ import annotations

import contextvars
from typing import Final

import httpx2

__all__ = ["NOT_SENT", "Refusal", "claim", "held", "may_send", "noted", "unwatch", "waiting_for", "watch", "watched"]

#: Sent (or about to be), no answer yet: if it is cut now, it may have run.
OPEN: Final = 0
#: The server refused it (its status in `Refusal.status`); not sent again since.
REFUSED: Final = 1
#: Answered otherwise: whatever cuts the attempt now, the server had it.
ANSWERED: Final = 2
#: Refused or held, and the attempt was cut before it was sent: it never will be.
ABANDONED: Final = 3
#: Not sent yet: the flow is getting its token (waiting for the token state, or a refresh).
HELD: Final = 4

#: The `httpx2.Request` extension on a request the flow gives up before sending: the connection's transport answers it
#: "not sent" without sending it (an auth flow cannot end without yielding the request it was given).
NOT_SENT: Final = "breakwater.not_sent"

_ATTEMPT: contextvars.ContextVar[Refusal | None] = contextvars.ContextVar("breakwater_attempt_refusal", default=None)


class Refusal:
    """One attempt's `tools/call` request, as the OAuth flow saw it."""

    __slots__ = ("_token", "request", "state", "status", "wait_s", "waiting_on")

    def __init__(self) -> None:
        #: The attempt's own request (the first the flow saw in the attempt's context), once seen.
        self.request: httpx2.Request | None = None
        self.state = OPEN
        #: The status that refused it (401, 403); 0 while it was only held.
        self.status = 0
        #: What the resend waits for ("remote's token endpoint https://…/token"), for the model's message.
        self.waiting_on = ""
        #: The most that wait lasts (the refresh's bound), if known.
        self.wait_s: float | None = None
        self._token: contextvars.Token[Refusal | None] | None = None


def watch() -> Refusal:
    """A fresh `Refusal` for the attempt about to send its request, in the current context (`unwatch` ends it)."""
    refusal = Refusal()
    refusal._token = _ATTEMPT.set(refusal)
    return refusal


def unwatch(refusal: Refusal | None) -> None:
    """The attempt is over: the requests its task sends next are not its own."""
    if refusal is not None and refusal._token is not None:
        _ATTEMPT.reset(refusal._token)
        refusal._token = None


def watched(request: httpx2.Request) -> Refusal | None:
    """The attempt's `Refusal` if `request` is the attempt's own request, else None (no attempt, or another request:
    the `notifications/cancelled` a cut sends, a task's polls)."""
    refusal = _ATTEMPT.get()
    if refusal is None:
        return None
    if refusal.request is None:
        refusal.request = request
        return refusal
    return refusal if refusal.request is request else None


def held(refusal: Refusal | None) -> None:
    """The attempt's request waits for its token before it is sent (the token state's lock, or a refresh)."""
    if refusal is not None and refusal.state == OPEN:
        refusal.state = HELD


def noted(refusal: Refusal | None, response: httpx2.Response, refused: bool) -> None:
    """The server answered the attempt's request: `refused` it for its credentials, or otherwise."""
    if refusal is None or refusal.state == ABANDONED:
        return
    if not refused:
        refusal.state = ANSWERED
    elif refusal.state == OPEN:
        refusal.state, refusal.status = REFUSED, response.status_code


def waiting_for(refusal: Refusal | None, what: str, wait_s: float | None) -> None:
    """The held or refused request waits for `what` (a new token from "remote's token endpoint https://…/token"), at
    most `wait_s`, before it is sent."""
    if refusal is not None and refusal.state in (REFUSED, HELD):
        refusal.waiting_on, refusal.wait_s = what, wait_s


def may_send(refusal: Refusal | None) -> bool:
    """Whether the held or refused request may be sent now (False: the attempt was cut, and told it was not sent)."""
    if refusal is None:
        return True
    if refusal.state == ABANDONED:
        return False
    if refusal.state in (REFUSED, HELD):
        refusal.state = OPEN
    return True


def claim(refusal: Refusal | None) -> bool:
    """The attempt was cut: True if its request was held or refused and not sent since, which now it never will be."""
    if refusal is None or refusal.state not in (REFUSED, HELD):
        return False
    refusal.state = ABANDONED
    return True
