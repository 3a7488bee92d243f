"""An attempt cut while its credentials were being renewed (after the server's 401, or before the first send): not sent.

The server answered the attempt's request 401 (or 403 `insufficient_scope`), so the tool did not run, and the OAuth flow
was getting a new token before sending it again; or the token had expired, and the flow was getting a new one before
sending it at all (`auth._unsent`). A deadline that cut the attempt then (its timeout,
the turn budget, a cancel from outside breakwater) was read as any cut: OUTCOME_UNKNOWN for a tool that changes
things, "check whether it ran" of a call that never ran. Here the cut claims the refusal, so the flow never sends the
request again, and the attempt ends as the refusal a failed refresh ends in: SERVER_CONNECTING, "the call was not
sent", retryable, no breaker and no timeout counted, and no unknown outcome in the journal.
"""

from __future__ import annotations

from breakwater.auth import login_command
from breakwater.auth._unsent import Refusal, claim, unwatch, watch
from breakwater.errors import CallCancelledError, CallError, ErrorCode, ServerConnectingError

__all__ = ["claim", "cut_unsent", "is_unsent", "unwatch", "watch"]

#: The `reason` of the refusal `cut_unsent` makes; `is_unsent` tells it by it (one error class per code: no subclass).
_REASON = "credentials_refused"


def is_unsent(exc: CallError) -> bool:
    """Whether `exc` is `cut_unsent`'s refusal: the classifier marks it not run (and leaves the retry to the model)."""
    return exc.code is ErrorCode.SERVER_CONNECTING and exc.detail.get("reason") == _REASON


def cut_unsent(
    refusal: Refusal | None, failure: BaseException | None, server: str, tool: str, timeout_s: float, by_budget: bool
) -> BaseException | None:
    """`failure`, unless it is a cut (`TimeoutError`: the deadline; `CallCancelledError`) of an attempt whose request
    waited for its token (refused by the server, or not sent yet) and was not sent since: then the refusal that says
    nothing ran."""
    if refusal is None or not isinstance(failure, TimeoutError | CallCancelledError) or not claim(refusal):
        return failure
    if isinstance(failure, CallCancelledError):
        cut_by, when = "cancel", "the call was cancelled from outside breakwater"
    elif by_budget:
        cut_by, when = "turn budget", "the turn budget ran out"
    else:
        cut_by, when = "timeout", f"the call's timeout of {timeout_s:g} s ran out"
    waiting = refusal.waiting_on or "breakwater was signing in again"
    retry = f"Retry it (run `{login_command(server)}` only if this persists)."
    if refusal.status:
        refused = f"The server refused the call's credentials (HTTP {refusal.status})"
        message = f"{refused}, and {waiting} when {when}; the call was not sent. {retry}"
    else:  # held before its first send: the token had expired
        message = f"The call's token had expired, and {waiting} when {when}; the call was not sent. {retry}"
    detail = {"reason": _REASON, "http_status": refusal.status or None, "cut_by": cut_by}
    return ServerConnectingError(message, server=server, tool=tool, retryable=True, retry_after_s=refusal.wait_s, detail=detail)
