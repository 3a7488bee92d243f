"""Honest classification of one attempt.

Given what one upstream attempt produced — an exception from the SDK call or a `CallToolResult` — decide four things
separately, because they are different questions:

* what the breakers learn (`Outcome`: failure / success / ignored),
* which error code the model sees (`None` when the result goes back as it is),
* whether another attempt is allowed, given the tool's retry class (safe / idempotent / never),
* whether the outcome is unknown: the request was sent and then the answer was lost, so the call may have run. For a
  `never` tool that becomes OUTCOME_UNKNOWN, never a retry.

The rules (from how SDK 2.3 reports errors on both sides, and the spec's error codes):

* Failures: timeouts, transport errors (`MCPError` -32000, `httpx2` errors, also inside `ExceptionGroup`s), protocol
  errors (pydantic `ValidationError` on the reply's shape, JSON-RPC errors), `isError` results without a "not retryable"
  answer, and results that violate the tool's `outputSchema` (the SDK's `RuntimeError("Invalid structured content …")`:
  a server that silently reshaped its output is broken, not answering).
* Business answers are not failures: an `isError` result whose `structuredContent` says `retryable: false`, a
  not-found, an argument-validation error, an unknown tool, and a plain-text error that says the input was amiss (no such
  file, not found, access denied, invalid argument) unless it also says a dependency failed (a host not found, a refused
  connection, a timeout). The server did its job; the breaker must not open because a model asked for something that
  does not exist.
* A result that says `retryable: true` is retried only for a tool whose retry class allows a repeat
  (`safe`, `idempotent`): the request ran, and the server's word is as untrusted as its annotations.
  A `never` tool was sent three times, with three side effects, on one call.
* Ignored: the caller's cancellation and breakwater's own refusals (`CallError`s raised locally).
* Origin, not the code, says who failed. The SDK's -32000 (connection closed) and -32001 (request timed out) and
  breakwater's -32090 (result too large) stand for failures made locally and are re-labelled, not forwarded as if the
  server had sent them; but a server may answer with any of these numbers (-32000 is the most common generic server
  error), and an error that came off the wire (`ServerReplyError`) is the server's answer: judged by the rules for a
  server's error reply, never as a timeout, a lost connection, a cancellation or an oversize result.

A user classifier runs first and may return a `Verdict` to override, or None to fall through.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import pydantic
from mcp import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    TextContent,
    ToolAnnotations,
)

from breakwater._wire import ERROR_META_KEY, RESULT_TOO_LARGE
from breakwater.connect._http_cut import SDK_UNREADABLE, cut_info, retry_after_s, unreadable_reply
from breakwater.connect._raw_call import ServerReplyError
from breakwater.errors import SERVER_MARKED_RETRYABLE, TRANSIENT_TEXT_REASON, CallError, ErrorCode
from breakwater.gate._breaker import Outcome
from breakwater.gate._error_text import ARGUMENTS_REJECTED_TEXT, UNKNOWN_TOOL_TEXT, asked_amiss, says_transient
from breakwater.gate._unsent import is_unsent

if TYPE_CHECKING:
    from breakwater.connect._upstream import Upstream

__all__ = [
    "OPERATION_IN_PROGRESS",
    "OPERATION_OUTCOME_UNKNOWN",
    "SUCCESS",
    "AttemptContext",
    "Classifier",
    "RetryClass",
    "Verdict",
    "answer_of",
    "classify",
    "retry_class_for",
    "server_answer",
]

log = logging.getLogger("breakwater.classify")

# Retired "resource not found" (≤ 2025-11-25); old servers still send it.
_LEGACY_NOT_FOUND = -32002
# The codes of failures the SDK or breakwater make themselves; a server may send them too.
_LOCAL_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, RESULT_TOO_LARGE})
# What the SDK is handling when it makes one: its read timeout, or a write the transport refused.
_LOCAL_CAUSES = (TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError)
# The SDK's streamable HTTP client ends a request whose SSE event overflowed `max_sse_event_size` with this.
_SSE_EVENT_TOO_LARGE = re.compile(r"Server-sent event exceeded the \d+ byte limit")
# What the SDK's streamable HTTP client answers, with -32000, a request whose response can no longer come: its
# stream failed, or ended unanswered and could not be resumed (`StreamableHTTPTransport._resolve_abandoned_request`).
_HTTP_ABANDONED = re.compile(r"SSE stream (failed|ended)")


class RetryClass(enum.StrEnum):
    """How safe a tool is to call again after a failure."""

    #: Read-only: repeat freely.
    SAFE = "safe"
    #: Repeating with the same arguments (and operation id) has no additional effect.
    IDEMPOTENT = "idempotent"
    #: May have side effects each time: never repeat, and report a cut call as OUTCOME_UNKNOWN.
    NEVER = "never"


def retry_class_for(annotations: ToolAnnotations | None, configured: RetryClass | str | None = None) -> RetryClass:
    """The retry class of a tool: config if set, else from its MCP annotations.

    Annotations are hints from a server that is not necessarily trusted (spec), so configuration
    wins. `readOnlyHint` → safe; `idempotentHint` → idempotent; `destructiveHint` or no
    annotations → never (the spec's defaults are destructive and not idempotent).
    """
    if configured is not None:
        return RetryClass(configured)
    if annotations is None:
        return RetryClass.NEVER
    if annotations.read_only_hint is True:
        return RetryClass.SAFE
    if annotations.idempotent_hint is True:
        return RetryClass.IDEMPOTENT
    return RetryClass.NEVER


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What one attempt means."""

    #: What the breakers record.
    outcome: Outcome
    #: The error code the model sees; None when the result is returned as it is.
    code: ErrorCode | None
    #: Whether another attempt may be made (the retry class already applied).
    retryable: bool
    #: The request was sent and its answer lost: the call may have run.
    outcome_unknown: bool = False
    #: The request never reached the server, or the server turned it away before running it: nothing happened.
    not_run: bool = False
    #: A server's hint of how long to wait before trying again.
    retry_after_s: float | None = None
    #: A short technical explanation, for logs and the envelope's detail.
    reason: str = ""
    #: The pages a URL-elicitation-required error (-32042) asks the user to open, as the server sent them.
    elicitations: tuple[Mapping[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        """True when the attempt produced a result to return as it is."""
        return self.code is None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptContext:
    """What a classifier knows about the attempt besides its result."""

    server: str
    tool: str
    retry_class: RetryClass
    #: Whether the request had been handed to the transport when it failed (default: assume so).
    request_sent: bool = True


#: A user classifier: return a Verdict to decide, or None to let breakwater's rules decide.
Classifier = Callable[[CallToolResult | BaseException, AttemptContext], Verdict | None]


def classify(
    attempt: CallToolResult | BaseException,
    *,
    retry_class: RetryClass,
    server: str = "",
    tool: str = "",
    request_sent: bool = True,
    classifier: Classifier | None = None,
) -> Verdict:
    """Classify one attempt's result or exception (see the module docstring for the rules)."""
    if classifier is None and isinstance(attempt, CallToolResult):
        # The call path's common case: no context to build, and a success is one shared verdict.
        return SUCCESS if not attempt.is_error else _classify_result(attempt, retry_class)
    ctx = AttemptContext(server=server, tool=tool, retry_class=retry_class, request_sent=request_sent)
    if classifier is not None:
        try:
            verdict = classifier(attempt, ctx)
        except Exception:
            # A broken user classifier must not turn every call into a crash; fall back and say so.
            log.exception("custom classifier failed for %s/%s; using the built-in rules", server, tool)
        else:
            if verdict is not None:
                return verdict
    if isinstance(attempt, CallToolResult):
        return _classify_result(attempt, retry_class)
    return _classify_exception(attempt, ctx)


# -- results ----------------------------------------------------------------------------------

_NOT_FOUND = {"not_found", "notfound", "404", "no_such", "does_not_exist"}
_RETRY_AFTER_KEYS = ("retry_after_s", "retry_after", "retryAfter", "retryAfterSeconds")

#: `breakwater.idempotency`'s reply to a repeated operation id whose first call still runs (HTTP 409).
OPERATION_IN_PROGRESS = "OPERATION_IN_PROGRESS"
#: The `Verdict.reason` of an OPERATION_IN_PROGRESS reply (the gate waits on it instead of counting a failure).
IN_PROGRESS_REASON = "operation in progress"
#: Its reply for an operation whose owner died or was cancelled mid-run: never re-run it.
OPERATION_OUTCOME_UNKNOWN = "OPERATION_OUTCOME_UNKNOWN"
#: `breakwater.idempotency`'s refusals of an operation id, and the `reason` each becomes (the fleet record's words).
_OPERATION_REFUSALS = {"OPERATION_MISMATCH": "operation_mismatch", "INVALID_OPERATION_ID": "invalid_operation_id"}


def _retry_after(data: Any) -> float | None:
    if not isinstance(data, dict):
        return None
    for key in _RETRY_AFTER_KEYS:
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


def _is_not_found(data: dict[str, Any]) -> bool:
    if data.get("status") == 404 or data.get("found") is False:
        return True
    for key in ("code", "error_code", "errorCode", "error"):
        value = data.get(key)
        if isinstance(value, dict):
            value = value.get("code")
        if isinstance(value, (str, int)) and str(value).lower().replace("-", "_") in _NOT_FOUND:
            return True
    return False


def _first_text(result: CallToolResult) -> str:
    return next((b.text for b in result.content if isinstance(b, TextContent)), "")


#: A result that is not an error (frozen: one instance serves every call).
SUCCESS = Verdict(outcome=Outcome.SUCCESS, code=None, retryable=False)


def _classify_result(result: CallToolResult, retry_class: RetryClass) -> Verdict:
    if not result.is_error:
        return SUCCESS
    data = result.structured_content
    if data is None and result.meta:  # a refusal of `breakwater.idempotency` for a tool with an output schema
        data = result.meta.get(ERROR_META_KEY)
    hint = _retry_after(data)
    if isinstance(data, dict):
        code = data.get("code")
        if code == OPERATION_IN_PROGRESS:
            # The server has the operation and is running it: healthy; the same id is asked again after its hint.
            return Verdict(
                outcome=Outcome.SUCCESS,
                code=ErrorCode.TOOL_ERROR,
                retryable=True,
                retry_after_s=hint,
                reason=IN_PROGRESS_REASON,
            )
        if code == OPERATION_OUTCOME_UNKNOWN:
            # The server itself cannot say whether the side effect happened: the client's OUTCOME_UNKNOWN.
            return Verdict(
                outcome=Outcome.SUCCESS,
                code=ErrorCode.OUTCOME_UNKNOWN,
                retryable=False,
                outcome_unknown=True,
                reason="the server reports the operation's outcome as unknown",
            )
        if code in _OPERATION_REFUSALS:
            # `breakwater.idempotency`'s refusal of the call's operation id (used before for other arguments, or no id at
            # all): nothing ran, as the fleet record's own refusal says (INVALID_ARGUMENTS). It read TOOL_ERROR, a
            # failure of a tool that had run, with the real code hidden in the upstream's envelope.
            return Verdict(
                outcome=Outcome.SUCCESS, code=ErrorCode.INVALID_ARGUMENTS, retryable=False, reason=_OPERATION_REFUSALS[code]
            )
        if data.get("retryable") is True:
            return _transient(retry_class, hint, "tool error marked retryable")
        if data.get("retryable") is False:
            return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.TOOL_ERROR, retryable=False, reason="business answer")
        if _is_not_found(data):
            return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.TOOL_ERROR, retryable=False, reason="not found")
    text = _first_text(result)
    if UNKNOWN_TOOL_TEXT.match(text):
        # MCPServer answers an unknown tool with isError (the spec says -32602); same meaning.
        return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.UNKNOWN_TOOL, retryable=False, reason="unknown tool")
    if ARGUMENTS_REJECTED_TEXT.match(text):
        return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.INVALID_ARGUMENTS, retryable=False, reason="arguments rejected")
    if asked_amiss(text):
        return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.TOOL_ERROR, retryable=False, reason="not found or refused input")
    if says_transient(text):  # "temporarily unavailable, try again" in words: as `retryable: true` in data
        return _transient(retry_class, hint, TRANSIENT_TEXT_REASON)
    # The "200 with an error in the body" trap: the tool failed, the breaker must hear about it.
    return Verdict(outcome=Outcome.FAILURE, code=ErrorCode.TOOL_ERROR, retryable=False, retry_after_s=hint, reason="tool error")


def _transient(retry_class: RetryClass, hint: float | None, reason: str, code: ErrorCode = ErrorCode.TOOL_ERROR) -> Verdict:
    """An error the server calls transient: it vouches that trying again is safe and may help (e.g. it shed the request);
    for a `never` tool the retry class decides, not the server, whose word is as untrusted as its annotations."""
    retryable = retry_class is not RetryClass.NEVER
    return Verdict(outcome=Outcome.FAILURE, code=code, retryable=retryable, retry_after_s=hint, reason=reason)


# -- exceptions -------------------------------------------------------------------------------


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _is_cancel(exc: BaseException) -> bool:
    # anyio on asyncio cancels with asyncio.CancelledError. The SDK's transports run on trio too, but breakwater's own
    # stdio transport is asyncio's (`Breakwater` refuses stdio servers under trio), and a trio.Cancelled is not seen here.
    return isinstance(exc, asyncio.CancelledError)


def _cut(ctx: AttemptContext, code: ErrorCode, reason: str, retry_after_s: float | None = None) -> Verdict:
    """A failure after which we cannot tell whether the call ran."""
    if not ctx.request_sent:
        return Verdict(
            outcome=Outcome.FAILURE, code=code, retryable=True, not_run=True, retry_after_s=retry_after_s, reason=reason
        )
    if ctx.retry_class is RetryClass.NEVER:
        return Verdict(
            outcome=Outcome.FAILURE,
            code=ErrorCode.OUTCOME_UNKNOWN,
            retryable=False,
            outcome_unknown=True,
            reason=reason,
        )
    return Verdict(
        outcome=Outcome.FAILURE,
        code=code,
        retryable=True,
        outcome_unknown=True,
        retry_after_s=retry_after_s,
        reason=reason,
    )


def _not_sent(reason: str, retry_after_s: float | None = None) -> Verdict:
    """A failure that provably happened before the server saw the request: any tool may retry."""
    return Verdict(
        outcome=Outcome.FAILURE,
        code=ErrorCode.UPSTREAM_ERROR,
        retryable=True,
        not_run=True,
        retry_after_s=retry_after_s,
        reason=reason,
    )


def _first_problem(exc: pydantic.ValidationError) -> str:
    """Where the reply first broke the shape, and how (`: content: Input should be a valid list`), for its author."""
    errors = exc.errors(include_input=False, include_url=False)
    if not errors:
        return ""
    where = ".".join(str(part) for part in errors[0]["loc"])
    return f": {where}: {errors[0]['msg']}" if where else f": {errors[0]['msg']}"


def _fatal(reason: str, code: ErrorCode = ErrorCode.UPSTREAM_ERROR) -> Verdict:
    """A failure that another identical attempt would repeat."""
    return Verdict(outcome=Outcome.FAILURE, code=code, retryable=False, reason=reason)


def _classify_exception(exc: BaseException, ctx: AttemptContext) -> Verdict:
    if isinstance(exc, BaseExceptionGroup):
        leaves = list(_leaves(exc))
        # The transport's task group wraps the real error; cancellations beside it are its fallout.
        real = next((e for e in leaves if not _is_cancel(e)), None)
        exc = real if real is not None else leaves[0]
    if isinstance(exc, CallError):
        # Breakwater's own refusal (breaker, budget, bulkhead, deadline already past): no one's failure. Not run, and the
        # model's to retry (the call's time is spent): a cut attempt whose refused request was not sent again (`_unsent`).
        unsent = is_unsent(exc)
        again, hint = exc.retryable and not unsent, exc.retry_after_s
        return Verdict(outcome=Outcome.IGNORED, code=exc.code, retryable=again, retry_after_s=hint, not_run=unsent)
    if _is_cancel(exc):
        return Verdict(
            outcome=Outcome.IGNORED,
            code=ErrorCode.CANCELLED,
            retryable=False,
            outcome_unknown=ctx.request_sent,
            reason="cancelled by the caller",
        )
    if isinstance(exc, MCPError):
        return _classify_mcp_error(exc, ctx)
    if isinstance(exc, TimeoutError):
        return _cut(ctx, ErrorCode.TIMEOUT, "deadline expired")
    if isinstance(exc, httpx2.HTTPError):
        return _classify_http(exc, ctx)
    if isinstance(exc, pydantic.ValidationError):
        return _fatal(f"the reply does not match the MCP protocol shape{_first_problem(exc)}")
    if isinstance(exc, RuntimeError) and (
        "Invalid structured content" in str(exc)
        or "has an output schema but did not return structured content" in str(exc)
        or "Invalid schema for tool" in str(exc)
    ):
        return _fatal("the result violates the tool's declared outputSchema")
    if isinstance(exc, ConnectionRefusedError):
        return _not_sent("connection refused")
    if isinstance(exc, (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)):
        return _cut(ctx, ErrorCode.UPSTREAM_ERROR, f"connection lost: {type(exc).__name__}")
    # Something nobody anticipated: count it, and do not repeat a call that may have had effects.
    return Verdict(
        outcome=Outcome.FAILURE,
        code=ErrorCode.UPSTREAM_ERROR,
        retryable=False,
        outcome_unknown=ctx.request_sent,
        reason=f"unexpected {type(exc).__name__}: {exc}",
    )


def server_answer(exc: BaseException, *, session_open: bool, over_http: bool = False) -> BaseException:
    """`exc` as a `ServerReplyError` when the SDK's path relayed the server's error answer with a local code.

    The raw stdio path marks every error it reads off the wire itself. The SDK hands the server's
    answers and its own failures over alike, as plain `MCPError`s, so here origin is read from what
    its own leave behind: the read timeout (-32001) and a refused write (-32000) are raised while
    handling the transport's error; breakwater's -32090 carries `max_result_bytes`, a cut HTTP request
    its cut; a -32000 on a session that closed (`session_open` is False) is the close. Over HTTP
    (`over_http`) the SDK's transport also ends a request whose stream failed or ended unanswered with
    a -32000 of its own, which says so in its message (`_HTTP_ABANDONED`); any other -32000 on a live
    session is the server's answer. Taken for a lost connection, it tore a remote server's session
    down and told the model an effect was unknown, after every such answer.
    """
    if type(exc) is not MCPError or exc.code not in _LOCAL_CODES or isinstance(exc.__context__, _LOCAL_CAUSES):
        return exc
    code, data = exc.code, exc.data
    if code == RESULT_TOO_LARGE and isinstance(data, dict) and "max_result_bytes" in data:
        return exc
    if code == CONNECTION_CLOSED and (
        not session_open or cut_info(data) is not None or (over_http and _HTTP_ABANDONED.match(exc.message))
    ):
        return exc
    reply = ServerReplyError(code=code, message=exc.message, data=data)
    reply.__cause__ = exc
    return reply


def answer_of(exc: BaseException, upstream: Upstream) -> BaseException:
    """`server_answer` for an error a call on `upstream` raised: its session's state and its kind read off it."""
    return server_answer(exc, session_open=_session_open(upstream), over_http=upstream.process is None)


def _session_open(upstream: Upstream) -> bool:
    """Whether `upstream`'s connection is still up: its SDK session, and a stdio server's raw calls."""
    process, client = upstream.process, upstream.client
    if client is None:
        return False
    if process is not None and (process.raw_calls is None or process.raw_calls.closed):
        return False
    try:
        dispatcher = client.session._dispatcher
    except RuntimeError:  # the client was not entered, or has exited
        return False
    return not getattr(dispatcher, "_closed", False)


def _classify_local(exc: MCPError, ctx: AttemptContext) -> Verdict | None:
    """The verdict on a failure the SDK or breakwater made locally (by its code), or None for another error."""
    code, message = exc.code, exc.message
    if code == REQUEST_TIMEOUT:
        return _cut(ctx, ErrorCode.TIMEOUT, "request timed out (SDK read timeout)")
    if code == RESULT_TOO_LARGE or (code == CONNECTION_CLOSED and _SSE_EVENT_TOO_LARGE.search(message)):
        # The server answered (it is healthy; the tool ran) with more than the limit: the same request
        # would bring back the same answer, so it is never repeated.
        return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.RESULT_TOO_LARGE, retryable=False, reason=message)
    if code == CONNECTION_CLOSED:
        cut = cut_info(exc.data)
        if cut is None:
            return _cut(ctx, ErrorCode.UPSTREAM_ERROR, f"connection closed: {message}")
        # One HTTP request cut (see breakwater.connect._http_cut): never sent is safe for any tool to repeat.
        kind = str(cut.get("error", "transport error"))
        status = cut.get("status")
        if isinstance(status, int):  # an HTTP error status without a JSON-RPC error of the server's
            return _classify_status(status, _retry_after(exc.data), ctx, credentials=cut.get("credentials") is True)
        if cut.get("sent") is False:
            return _not_sent(f"could not connect: {kind}")
        return _cut(ctx, ErrorCode.TIMEOUT if "Timeout" in kind else ErrorCode.UPSTREAM_ERROR, f"connection cut: {kind}")
    if code == INVALID_REQUEST and "session terminated" in message.lower():
        # HTTP 404 on a known session (the SDK's transport says so): the server forgot us and did not run the call.
        return _not_sent("session terminated", _retry_after(exc.data))
    return None


def _classify_mcp_error(exc: MCPError, ctx: AttemptContext) -> Verdict:
    if not isinstance(exc, ServerReplyError):  # made locally, or by a transport that cannot tell (see `server_answer`)
        local = _classify_local(exc, ctx)
        if local is not None:
            return local
    # The server's error answer. (A -32800 "request cancelled" from it is one too: breakwater's own
    # cancellations, the caller's or the deadline's, are judged before any answer.)
    code, message = exc.code, exc.message
    hint = _retry_after(exc.data)
    if code in (INVALID_PARAMS, _LEGACY_NOT_FOUND):
        # A correct refusal: the server is healthy, the request was wrong.
        lowered = message.lower()
        if "unknown tool" in lowered or "tool not found" in lowered:
            return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.UNKNOWN_TOOL, retryable=False, reason=message)
        if code == _LEGACY_NOT_FOUND or "not found" in lowered:
            return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.TOOL_ERROR, retryable=False, reason=message)
        return Verdict(outcome=Outcome.SUCCESS, code=ErrorCode.INVALID_ARGUMENTS, retryable=False, reason=message)
    if code == URL_ELICITATION_REQUIRED:
        # The server needs the user on a page of its own first (a sign-in elsewhere, a payment): no other input
        # and no retry helps, and the model must hand the user the address, which was lost as "needs the user".
        return Verdict(
            outcome=Outcome.SUCCESS,
            code=ErrorCode.CLIENT_CANNOT_ANSWER,
            retryable=False,
            reason=_pages_to_open(message, exc.data),
            elicitations=_url_elicitations(exc.data),
        )
    unreadable = code == PARSE_ERROR and message.startswith(SDK_UNREADABLE)
    # The server's "try again" (data `retryable: true`) ends the reason: `UpstreamError.advice_text` must not deny it.
    marked = SERVER_MARKED_RETRYABLE if isinstance(exc.data, dict) and exc.data.get("retryable") is True else ""
    if code in (INTERNAL_ERROR, 0) or unreadable:
        # HTTP 5xx or a crashed handler: it may have half-run, so only repeatable tools retry. So may a call whose
        # answer the SDK's HTTP client could not read: the server sent no -32700, and the model read one, with a
        # pydantic dump of the server's bytes.
        message = unreadable_reply(message[len(SDK_UNREADABLE) :]) if unreadable else f"server error: {message}{marked}"
        verdict = _cut(ctx, ErrorCode.UPSTREAM_ERROR, message, hint)
        # (Unreadable, its answer may have said it ran: OUTCOME_UNKNOWN, as for a cut call.)
        if verdict.code is ErrorCode.OUTCOME_UNKNOWN and not unreadable:
            # The server did answer, with an error: report that, and still refuse to repeat.
            return Verdict(
                outcome=Outcome.FAILURE,
                code=ErrorCode.UPSTREAM_ERROR,
                retryable=False,
                outcome_unknown=True,
                retry_after_s=hint,
                reason=message,
            )
        return verdict
    if marked:  # as a tool error marked retryable: a `never` tool is not repeated (its envelope: `retryable: false`)
        return _transient(ctx.retry_class, hint, f"protocol error {code}: {message}{marked}", ErrorCode.UPSTREAM_ERROR)
    # Parse errors, method not found, header mismatch (already resent once by the SDK), missing
    # capability, unsupported version, application codes: repeating the same request repeats them.
    return _fatal(f"protocol error {code}: {message}")


def _classify_http(exc: httpx2.HTTPError, ctx: AttemptContext) -> Verdict:
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
        return _not_sent(f"could not connect: {type(exc).__name__}")
    if isinstance(exc, (httpx2.ReadTimeout, httpx2.WriteTimeout)):
        return _cut(ctx, ErrorCode.TIMEOUT, f"transport {type(exc).__name__}")
    if isinstance(exc, httpx2.HTTPStatusError):
        response = exc.response
        return _classify_status(response.status_code, retry_after_s(response.headers.get("retry-after")), ctx)
    return _cut(ctx, ErrorCode.UPSTREAM_ERROR, f"connection lost: {type(exc).__name__}")


def _classify_status(status: int, hint: float | None, ctx: AttemptContext, *, credentials: bool = False) -> Verdict:
    """The verdict on an HTTP error status that answered a request (`connect._http_cut` says which did, and whether it
    refused the credentials: a 401, or a 403 that asks for more scope)."""
    if status in (429, 503):
        # Shed before processing: safe to retry for every tool, after the server's hint.
        return _not_sent(f"HTTP {status}: the server turned the request away before running it", hint)
    if status == 401 or credentials:
        # The credentials were refused (the sign-in could not be refreshed) or fall short (a step-up's 403, which read
        # "the connection failed or sent an invalid reply" on the first call): nothing ran. The connection is dropped
        # (`_attempt`), and its reconnect tells whether `breakwater auth login` is needed.
        return _not_sent(f"HTTP {status}: the server refused the credentials before running the request")
    if status >= 500:
        return _cut(ctx, ErrorCode.UPSTREAM_ERROR, f"HTTP {status}", hint)
    return _fatal(f"HTTP {status}: the server refused the request before running it")


def _url_elicitations(data: object) -> tuple[Mapping[str, Any], ...]:
    """The well-formed URL elicitations of a -32042 error's data (mode, url, message, elicitationId: strings)."""
    items = data.get("elicitations") if isinstance(data, dict) else None
    keys = ("mode", "url", "message", "elicitationId")
    return tuple(
        dict(item)
        for item in (items if isinstance(items, list) else ())
        if isinstance(item, dict) and item.get("mode") == "url" and all(isinstance(item.get(k), str) for k in keys)
    )


def _pages_to_open(message: str, data: object) -> str:
    """What a URL-elicitation-required error (-32042, 2025-11-25) asks of the user, with each page's address."""
    pages = []
    elicitations = data.get("elicitations") if isinstance(data, dict) else None
    for item in elicitations if isinstance(elicitations, list) else ():
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            why = item.get("message")
            pages.append(f"{why} — open {item['url']}" if isinstance(why, str) and why else f"open {item['url']}")
    if not pages:
        return f"the server needs the user to complete a step in a browser first: {message}"
    return f"the server needs the user to open a page first, then call the tool again: {'; '.join(pages)}"
