"""The one exception hierarchy.

BreakwaterError
├── ConfigError                     a config file is broken: names the file, the key and the fix (exit code 2)
└── CallError                       a tool call failed; each leaf maps one-to-one to an error code the model sees
    ├── CallRefused                 refused before the tool ran: by breakwater, or by the server
    │   ├── CircuitOpenError        CIRCUIT_OPEN         this tool's breaker is open
    │   ├── ServerCircuitOpenError  SERVER_CIRCUIT_OPEN  the whole server's breaker is open
    │   ├── OverloadedError         OVERLOADED           the server's in-flight cap is full
    │   ├── BudgetExhaustedError    BUDGET_EXHAUSTED     the turn's time budget cannot cover an attempt
    │   ├── ServerConnectingError   SERVER_CONNECTING    the server is still starting
    │   ├── ServerUnavailableError  SERVER_UNAVAILABLE   the server is down or failed to start
    │   ├── UnknownToolError        UNKNOWN_TOOL         no such tool on that server
    │   ├── ToolChangedError        TOOL_CHANGED         the tool's definition changed and is blocked until accepted
    │   └── InvalidArgumentsError   INVALID_ARGUMENTS    the arguments do not fit the tool
    └── CallFailed                  an attempt was sent and did not succeed (it may have run)
        ├── CallTimeoutError        TIMEOUT              the call did not answer within its deadline (also a TimeoutError)
        ├── OutcomeUnknownError     OUTCOME_UNKNOWN      a non-retryable call was cut; it may have run
        ├── UpstreamError           UPSTREAM_ERROR       transport or protocol failure
        ├── ToolError               TOOL_ERROR           the tool's own isError result (content passed through)
        ├── CallCancelledError      CANCELLED            the caller cancelled the call
        ├── ResultTooLargeError     RESULT_TOO_LARGE     the result was larger than `[call] max_result_bytes`
        └── ClientCannotAnswerError CLIENT_CANNOT_ANSWER the tool asked the client (or its user) for something, in vain

The two groups split by phase, as httpx's `TransportError` tree does. A `CallRefused` means the tool
did not run: breakwater declined to send (breaker, bulkhead, budget, server not ready, drift) or the
server turned the request away before running it (unknown tool, arguments rejected); only earlier
attempts of the same call, if `attempt` counts any, may have run. A `CallFailed` is about an attempt
that was sent. Only the leaves carry a code; the groups are for `except` clauses.

Every `CallError` carries the envelope fields the model reads (see `breakwater.gate._envelope`), so one
object is both the typed exception a library user catches and the `isError` result the model sees.
"""

from __future__ import annotations

import enum
import functools
import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from mcp.types import ContentBlock

__all__ = [
    "CODE_TO_ERROR",
    "BreakwaterError",
    "BudgetExhaustedError",
    "CallCancelledError",
    "CallError",
    "CallFailed",
    "CallRefused",
    "CallTimeoutError",
    "CircuitOpenError",
    "ClientCannotAnswerError",
    "ConfigError",
    "ErrorCode",
    "InvalidArgumentsError",
    "OutcomeUnknownError",
    "OverloadedError",
    "ResultTooLargeError",
    "ServerCircuitOpenError",
    "ServerConnectingError",
    "ServerUnavailableError",
    "ToolChangedError",
    "ToolError",
    "UnknownToolError",
    "UpstreamError",
]


class BreakwaterError(Exception):
    """Base of every error breakwater raises on purpose."""


def visible(text: str, keep: str = "") -> str:
    """`text` with each control, format (bidirectional), separator or surrogate character written as `\\uXXXX`, but
    those in `keep` (`"\\n\\t"` for a text of several lines).

    For what breakwater prints of a file's or a server's own text: a terminal would otherwise obey such a
    character (an escape sequence that moves the cursor or clears the screen, a bidirectional override that
    makes a name read differently than it is) instead of showing it.
    """
    if text.isprintable() and not any(invisible(c) for c in text):
        return text
    return "".join(f"\\u{ord(c):04x}" if invisible(c) and c not in keep else c for c in text)


def invisible(c: str) -> bool:
    """Whether the character `c` shows nothing of its own: a control, format (bidirectional), separator or surrogate
    character, or one Unicode marks as ignorable in display (a variation selector, a Hangul filler, U+034F), or the
    blank braille pattern. A name holding one reads as another name, or as nothing."""
    if unicodedata.category(c) in _INVISIBLE_CATEGORIES:
        return True
    code = ord(c)
    return code >= 0x34F and any(low <= code <= high for low, high in _IGNORABLE)


#: Unicode categories `invisible` counts: controls, formats, line and paragraph separators, surrogates.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt) outside those categories, and U+2800.
_IGNORABLE = (
    *((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2800, 0x2800), (0x3164, 0x3164)),
    *((0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0xE0100, 0xE01EF)),
)


class ConfigError(BreakwaterError):
    """A configuration that cannot be used, with where and how to fix it."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None, fix: str | None = None):
        self.path = path
        self.key = key
        self.fix = fix
        self.detail = message
        # A key is the file's own text: a control or bidirectional character in it is shown, not obeyed, by the terminal.
        where = ": ".join(visible(p) for p in (path, key) if p)
        text = f"{where}: {message}" if where else message
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class ErrorCode(enum.StrEnum):
    """The codes a model sees in `structuredContent.code`; each names one distinct situation."""

    TIMEOUT = "TIMEOUT"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    SERVER_CIRCUIT_OPEN = "SERVER_CIRCUIT_OPEN"
    OVERLOADED = "OVERLOADED"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    SERVER_CONNECTING = "SERVER_CONNECTING"
    SERVER_UNAVAILABLE = "SERVER_UNAVAILABLE"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    TOOL_CHANGED = "TOOL_CHANGED"
    UPSTREAM_ERROR = "UPSTREAM_ERROR"
    TOOL_ERROR = "TOOL_ERROR"
    CANCELLED = "CANCELLED"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    CLIENT_CANNOT_ANSWER = "CLIENT_CANNOT_ANSWER"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"


# Keys every envelope has; extra detail may not shadow them.
ENVELOPE_KEYS: tuple[str, ...] = (
    *("ok", "code", "retryable", "retry_after_s", "attempt", "max_attempts", "server", "tool", "operation_id", "message"),
)
_ENVELOPE_KEY_SET = frozenset(ENVELOPE_KEYS)


class CallError(BreakwaterError):
    """A tool call that failed, with everything the model needs to decide what to do next.

    Subclasses set the class attributes; instances carry the facts of one failure. `attempt` is the
    number of upstream attempts made (0 when breakwater refused before sending anything) and
    `max_attempts` the number the retry policy allowed. `detail` holds extra keys for
    `structuredContent` (e.g. `next_retry_at`, `reason`, `connect_attempt`).
    """

    code: ClassVar[ErrorCode]
    #: Whether a later call may succeed, unless the instance says otherwise.
    default_retryable: ClassVar[bool]
    #: The situation in a few words (README table, default message).
    summary: ClassVar[str]
    #: What the model should do next; `{wait}` becomes "about N s" or "a moment".
    advice: ClassVar[str]

    def __init__(
        self,
        message: str | None = None,
        *,
        server: str | None = None,
        tool: str | None = None,
        retryable: bool | None = None,
        retry_after_s: float | None = None,
        attempt: int = 0,
        max_attempts: int = 1,
        operation_id: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        if not hasattr(type(self), "code"):
            # The base (or an intermediate class) has no code: it names no situation the model could be told of.
            raise TypeError(f"{type(self).__name__} is abstract: raise one of its subclasses (one per error code)")
        self.message = message if message is not None else self.summary
        self.server = server
        self.tool = tool
        self.retryable = self.default_retryable if retryable is None else retryable
        self.retry_after_s = retry_after_s
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.operation_id = operation_id
        if detail and not _ENVELOPE_KEY_SET.isdisjoint(detail):
            raise ValueError(f"detail keys shadow envelope keys: {sorted(_ENVELOPE_KEY_SET.intersection(detail))}")
        self.detail: dict[str, Any] = dict(detail) if detail else {}
        super().__init__(self.message)

    def __str__(self) -> str:
        where = "/".join(p for p in (self.server, self.tool) if p)
        return f"{self.code.value}: {where}: {self.message}" if where else f"{self.code.value}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, server={self.server!r}, tool={self.tool!r}, "
            f"retryable={self.retryable!r}, retry_after_s={self.retry_after_s!r}, attempt={self.attempt!r})"
        )

    def advice_text(self) -> str:
        """The "what to do next" sentence, with the wait filled in."""
        if self.default_retryable and not self.retryable:
            # An advice that invites a retry, on an error this call must not repeat (`retryable: false`): the two
            # said opposite things to the model (an invalid reply to a call that may have run).
            return NOT_RETRYABLE_ADVICE
        return self.advice.format(wait=self._wait_text())

    def _wait_text(self) -> str:
        """How long to wait, as the advice says it: "about N s" from `retry_after_s`, else (none, or passed) "a moment"."""
        seconds = self.retry_after_s
        return _about(seconds) if seconds is not None and seconds > 0 else "a moment"


#: The advice of an error whose kind is retried, for a call that must not be (its `retryable` is false).
NOT_RETRYABLE_ADVICE = "Do not repeat this call: use another tool if one can do the job, or tell the user."

#: The advice of a tool error the tool marks transient (its `structuredContent` says `retryable: true`).
TRANSIENT_TOOL_ADVICE = "The tool says this error is transient: wait {wait} and try again, or use another tool meanwhile."

#: The advice of an error the tool marks transient, of a tool breakwater does not repeat (retry class `never`).
UNREPEATED_TOOL_ADVICE = (
    "The tool says a later attempt may work, but breakwater did not retry it because the tool may have side effects: "
    "repeat it only if a repeat is safe, after {wait}{again}; otherwise use another tool or tell the user."
)
#: The same for a server's error answer (UPSTREAM_ERROR) that the server marks retryable: the request may have half-run.
UNREPEATED_SERVER_ADVICE = (
    "The server says a later attempt may work, but breakwater did not retry it because the tool may have side effects and "
    "the call may have run: check first whether it took effect (for example with a read-only tool), and repeat it only if "
    "it did not and a repeat is safe, after {wait}{again}; otherwise use another tool or tell the user."
)
#: How the `reason` of a server's error answer whose data says `retryable: true` ends (`gate._classify`).
SERVER_MARKED_RETRYABLE = "; the server marks it retryable"
#: The `reason` of a tool's plain-text error worded as transient, "try again later" (`gate._error_text.says_transient`).
TRANSIENT_TEXT_REASON = "tool error worded as transient"

_new_exception = BaseException.__new__


def refusal_error(
    cls: type[CallError],
    server: str | None,
    tool: str | None,
    retry_after_s: float | None,
    attempt: int,
    max_attempts: int,
    operation_id: str | None,
    detail: dict[str, Any],
) -> CallError:
    """`cls(server=server, …, detail=detail)`, for the call path's own refusals (an open breaker, a full bulkhead).

    Every field by position and set directly, in `__init__`'s order: the keyword constructor cost
    ~15,000 instructions of an open breaker's ~115,000 (bench/gate_instructions.py), against ~5,000.
    For classes that keep `CallError.__init__` only, and a `detail` the caller made for this error (it
    is kept, not copied) whose keys are not envelope keys. tests/gate/test_envelope.py holds the two equal.
    """
    message = cls.summary
    err: CallError = _new_exception(cls, message)
    err.message = message
    err.server = server
    err.tool = tool
    err.retryable = cls.default_retryable
    err.retry_after_s = retry_after_s
    err.attempt = attempt
    err.max_attempts = max_attempts
    err.operation_id = operation_id
    err.detail = detail
    return err


def _about(seconds: float) -> str:
    """A wait for the model to read: "about 2.5 s", or "a while" for one no clock can say (infinite or NaN)."""
    # No wait breakwater computes is infinite, but an error must never fail to print.
    return f"about {_fmt_seconds(seconds)}" if math.isfinite(seconds) else "a while"


def _fmt_seconds(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    return f"{round(seconds)} s"


class CallRefused(CallError):
    """The call, or its next attempt, was refused before the tool ran: by breakwater, or by the server.

    The group of CIRCUIT_OPEN, SERVER_CIRCUIT_OPEN, OVERLOADED, BUDGET_EXHAUSTED, SERVER_CONNECTING,
    SERVER_UNAVAILABLE, UNKNOWN_TOOL, TOOL_CHANGED and INVALID_ARGUMENTS; not raised itself.

    One that no attempt preceded (`attempt` 0) names no operation (`operation_id` None, whatever is set): nothing was sent
    under the id, and a model read an open breaker's refusal with one as an operation to check or reuse.
    """

    @property
    def operation_id(self) -> str | None:
        """The call's operation id once an attempt was sent under it, else None."""
        return self._operation_id if self.attempt else None

    @operation_id.setter
    def operation_id(self, value: str | None) -> None:
        self._operation_id = value


class CallFailed(CallError):
    """An attempt was sent and did not succeed; unless the leaf says otherwise, the call may have run.

    The group of TIMEOUT, OUTCOME_UNKNOWN, UPSTREAM_ERROR, TOOL_ERROR, CANCELLED, CLIENT_CANNOT_ANSWER
    and RESULT_TOO_LARGE; not raised itself.
    """


class CallTimeoutError(CallFailed, TimeoutError):
    """The tool did not answer within its deadline; breakwater cancelled the call upstream.

    Raised for tools that are safe or idempotent to repeat (a `never` tool reports
    OUTCOME_UNKNOWN instead).
    """

    code = ErrorCode.TIMEOUT
    default_retryable = True
    summary = "The tool did not answer in time and the call was cancelled."
    advice = "It is answering slowly right now: use another tool if one can do the job, or go on without it."

    def advice_text(self) -> str:
        """How slow the tool is against its usual latency, what to do instead, and when breakwater tries it again; or,
        for a call the caller's turn budget cut, what the spent budget allows (the tool may not be slow at all)."""
        if self.detail.get("cut_by") == "turn budget":
            return BudgetExhaustedError.advice
        usual, timeout = self.detail.get("usual_s"), self.detail.get("timeout_s")
        first = "It is answering slowly right now"
        if isinstance(usual, (int, float)):
            first += f" (it usually answers in {_fmt_latency(usual)})"
        elif isinstance(timeout, (int, float)):
            # No recent answer: "slowly right now" told of a change there was no history for, to a tool that may
            # always take longer than its timeout (a search of /usr, 11 s, cut at 5 s on every call).
            first = (
                f"No recent answer of it to compare with: it may always take longer than its {_fmt_seconds(timeout)}"
                " timeout (the user can raise it: [call] timeout_s)"
            )
        text = f"{first}: use another tool if one can do the job, or go on without it"
        return text + _when_again(self, "its circuit breaker opened")


def _fmt_latency(seconds: float) -> str:
    return f"{round(seconds * 1000)} ms" if seconds < 1 else _fmt_seconds(seconds)


def _when_again(err: CallError, why: str) -> str:
    """The end of the advice: when breakwater lets a call through again (never an invitation to retry at once)."""
    if err.detail.get("breaker") in ("open", "half_open") and err.retry_after_s is not None and err.retry_after_s > 0:
        return f"; {why}, and breakwater tries the tool again in {_about(err.retry_after_s)}."
    return "."


def _same_operation(operation_id: str | None, lead: str) -> str:
    """`lead` and the operation id a repeat must reuse, or nothing without one: under the same id a server that records
    its operations answers a repeat from its record instead of acting twice (`breakwater.idempotency`)."""
    return f'{lead} the same operation id (operationId "{visible(operation_id)}")' if operation_id else ""


class OutcomeUnknownError(CallFailed):
    """A call that must not be repeated timed out or was cut after it was sent; it may have run."""

    code = ErrorCode.OUTCOME_UNKNOWN
    default_retryable = False
    summary = "The result could not be confirmed; the action may or may not have happened."
    advice = "Do not retry it blindly: check whether it took effect (for example with a read-only tool) or ask the user."

    def advice_text(self) -> str:
        """Check before repeating; with the breaker's reopening and the operation id a repeat must reuse, when known: the
        model read neither, so it could not tell a refusal to come from an open breaker, nor a repeat from a new action."""
        opened = _when_again(self, "Its circuit breaker opened")
        opened = f"{opened[2:]} " if opened != "." else ""
        again = _same_operation(self.operation_id, "; if it did not and you repeat it, pass")
        return f"{opened}{self.advice[:-1]}{again}."


class CircuitOpenError(CallRefused):
    """This tool failed or timed out repeatedly; breakwater is refusing calls to it for a while (nothing was sent)."""

    code = ErrorCode.CIRCUIT_OPEN
    default_retryable = True
    summary = "This tool has been failing or answering too slowly, so breakwater paused calls to it; nothing was sent."
    advice = "Use another tool if one can do the job, or go on without it; breakwater tries this one again in {wait}."

    def advice_text(self) -> str:
        """What to do instead, with the tool's usual latency when known, and when breakwater tries it again."""
        usual = self.detail.get("usual_s")
        return _circuit_advice(self._wait_text(), usual if isinstance(usual, (int, float)) else None)


@functools.lru_cache(maxsize=256)
def _circuit_advice(wait: str, usual: float | None) -> str:
    # Remembered: every refusal of an open breaker asks for it, and the wait repeats for a tenth of a second or more.
    text = f"Use another tool if one can do the job, or go on without it; breakwater tries this one again in {wait}"
    if usual is not None:
        text += f" (when healthy it answers in {_fmt_latency(usual)})"
    return text + "."


class ServerCircuitOpenError(CallRefused):
    """The whole server failed repeatedly; calls to every tool on it are refused for a while."""

    code = ErrorCode.SERVER_CIRCUIT_OPEN
    default_retryable = True
    summary = "The server behind this tool has been failing, so breakwater paused calls to it; nothing was sent."
    advice = "Use a tool from another server if possible, or go on without it; breakwater tries the server again in {wait}."


class OverloadedError(CallRefused):
    """The server already has as many calls in flight as it is allowed; this one was refused at once."""

    code = ErrorCode.OVERLOADED
    default_retryable = True
    summary = "The server is busy with other calls; this one was not sent."
    advice = "Wait {wait} and retry, or do something else first."


class BudgetExhaustedError(CallRefused):
    """The turn's time budget cannot cover another attempt; nothing more was sent."""

    code = ErrorCode.BUDGET_EXHAUSTED
    default_retryable = False
    summary = "The time budget for this turn is spent; the call was not attempted."
    advice = "Do not retry in this turn: answer with what you have, or ask the user whether to continue."


class ServerConnectingError(CallRefused):
    """The server is still starting or reconnecting; the call was not sent."""

    code = ErrorCode.SERVER_CONNECTING
    default_retryable = True
    summary = "The server is still starting up; the call was not sent."
    advice = "Wait {wait} and retry, or use another tool meanwhile."


class ServerUnavailableError(CallRefused):
    """The server is down or failed to start; breakwater retries the connection in the background."""

    code = ErrorCode.SERVER_UNAVAILABLE
    default_retryable = True
    summary = "The server is not available right now; the call was not sent."
    advice = "Use a tool from another server, or tell the user this capability is down; retry after {wait} at the earliest."


class UnknownToolError(CallRefused):
    """The server has no tool by that name."""

    code = ErrorCode.UNKNOWN_TOOL
    default_retryable = False
    summary = "There is no tool by that name on this server."
    advice = "Do not retry: check the tool list and use a tool that exists."


class ToolChangedError(CallRefused):
    """The server changed this tool's definition since it was approved, and the config blocks changed tools."""

    code = ErrorCode.TOOL_CHANGED
    default_retryable = False
    summary = "The tool's definition changed since a person approved it, so breakwater blocks it."
    advice = "Do not retry: ask the user to review the change (breakwater tools --accept) or use another tool."


class UpstreamError(CallFailed):
    """The connection or the protocol failed, or the server answered the call with an error (its message is the text)."""

    code = ErrorCode.UPSTREAM_ERROR
    default_retryable = True
    summary = "The connection to the tool's server failed or it sent an invalid reply."
    advice = "Wait {wait} and retry once; if it fails again, use another tool or tell the user."

    def advice_text(self) -> str:
        """Wait and retry once; or, for a server's "try again" (its error data says `retryable: true`) on a call breakwater
        does not repeat (a `never` tool), why not and what to check first: "Do not repeat this call" contradicted it."""
        reason = self.detail.get("reason")
        if self.retryable or not (isinstance(reason, str) and reason.endswith(SERVER_MARKED_RETRYABLE)):
            return super().advice_text()
        return UNREPEATED_SERVER_ADVICE.format(wait=self._wait_text(), again=_same_operation(self.operation_id, ", with"))


class ToolError(CallFailed):
    """The tool ran and reported an error itself (`isError: true`; retryable if it marks it transient).

    Its own content is passed through."""

    code = ErrorCode.TOOL_ERROR
    default_retryable = False
    summary = "The tool reported an error."
    advice = "Read the tool's message above; fix the input or take another approach rather than repeating the same call."

    def __init__(
        self,
        message: str | None = None,
        *,
        content: Sequence[ContentBlock] = (),
        upstream_structured_content: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        #: The upstream result's content blocks, unchanged.
        self.content: list[ContentBlock] = list(content)
        #: The upstream result's `structuredContent`, if it had one.
        self.upstream_structured_content = upstream_structured_content

    def advice_text(self) -> str:
        """Fix the input; or, for an error the tool marks transient (`retryable: true`), wait and try again: "rather
        than repeating the same call" beside `retryable: true` and the tool's own "try again" told the model both."""
        if self.retryable:
            return TRANSIENT_TOOL_ADVICE.format(wait=self._wait_text())
        said = self.upstream_structured_content
        marked = isinstance(said, dict) and said.get("retryable") is True
        if marked or self.detail.get("reason") == TRANSIENT_TEXT_REASON:
            # The server's "try again" (its data, or its words) on a tool breakwater does not repeat (retry class `never`):
            # "rather than repeating the same call" contradicted it, and hid that only a second side effect stood in the way.
            again = _same_operation(self.operation_id, ", with")
            return UNREPEATED_TOOL_ADVICE.format(wait=self._wait_text(), again=again)
        return self.advice


class CallCancelledError(CallFailed):
    """The caller cancelled the call; breakwater passed the cancellation upstream."""

    code = ErrorCode.CANCELLED
    default_retryable = False
    summary = "The call was cancelled before it finished."
    advice = "Do not retry unless the user still wants it done."


class InvalidArgumentsError(CallRefused):
    """The arguments do not fit the tool's input schema, or the server refused them or the call's operation id."""

    code = ErrorCode.INVALID_ARGUMENTS
    default_retryable = False
    summary = "The arguments do not fit the tool's input schema."
    advice = "Fix the arguments to match the tool's schema before calling it again."


class ClientCannotAnswerError(CallFailed):
    """The tool needed an answer from the client or its user (sampling, elicitation, roots, a page to open), in vain.

    The question could not be put to the client or it refused, or the server needs the user to open a page
    first (a URL elicitation it required): the reason names the page."""

    code = ErrorCode.CLIENT_CANNOT_ANSWER
    default_retryable = False
    summary = (
        "The tool needed the client to answer a sampling, elicitation or roots request, or the user to open a "
        "page first, and got no answer."
    )
    advice = (
        "Do not change the input: this tool needs a client that can answer that request, or the user's step "
        "the reason names (give the user the address). Use another tool, or tell the user what the tool needs."
    )


class ResultTooLargeError(CallFailed):
    """The server's answer was larger than `[call] max_result_bytes`; it was dropped unread, and never retried.

    The tool ran (its effects, if any, happened); only its answer was refused, so repeating the same
    request would fetch the same oversized answer again.
    """

    code = ErrorCode.RESULT_TOO_LARGE
    default_retryable = False
    summary = "The tool's result was too large to pass on, so breakwater dropped it."
    advice = (
        "Do not repeat the same call: ask for less (a narrower query, a smaller page or limit, one item at a time), "
        "or tell the user the answer is too large."
    )


def _code_table() -> dict[ErrorCode, type[CallError]]:
    """Each code's one class: the classes under `CallError` that set `code` themselves (the leaves)."""
    found: dict[ErrorCode, type[CallError]] = {}
    pending = list(CallError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "code" not in vars(cls):
            continue
        if cls.code in found:  # pragma: no cover - guarded by a test
            raise TypeError(f"two classes for {cls.code}: {found[cls.code].__name__}, {cls.__name__}")
        found[cls.code] = cls
    return {code: found[code] for code in ErrorCode if code in found}


#: Every error code and its one exception class.
CODE_TO_ERROR: Mapping[ErrorCode, type[CallError]] = _code_table()
