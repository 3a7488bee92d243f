"""The relay: what an upstream sends back mid-call (sampling, elicitation, log messages) reaches the caller."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.lowlevel
import mcp.types as types
from mcp import MCPError
from mcp.client.session import ClientRequestContext
from mcp.server.context import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp_types.jsonrpc import URL_ELICITATION_REQUIRED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from breakwater._clock import Clock, SystemClock
from breakwater._wire import ENVELOPE_META_KEY, RELATED_TASK_META_KEY
from breakwater.config import ServerSpec
from breakwater.config._redact import Redactor
from breakwater.errors import ClientCannotAnswerError, ErrorCode
from breakwater.gate._attempt import ATTEMPT_WATCHER, AttemptDeadline
from breakwater.gate._envelope import error_result
from breakwater.gateway._connection import connection_of

# Re-exported (`X as X`): where the gateway's modules and tests have always found them.
from breakwater.gateway._log_relay import LOG_LEVEL_STATE as LOG_LEVEL_STATE
from breakwater.gateway._log_relay import RELAYED_LOGS_BURST as RELAYED_LOGS_BURST
from breakwater.gateway._log_relay import RELAYED_LOGS_PER_S as RELAYED_LOGS_PER_S
from breakwater.gateway._log_relay import (
    UPSTREAM_LOG_LEVEL,
    IdleLogs,
    LogAllowance,
    UpstreamLog,
)
from breakwater.gateway._log_relay import admitted_levels as _admitted_levels
from breakwater.tasks._server import current_task_id

logger = logging.getLogger("breakwater.gateway")

PROGRESS_DRAIN_CHECKPOINTS = 3
#: The downstream request whose upstream call is running in this context (see `Relay`).
_CALLER: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar("breakwater_relay_caller", default=None)


#: URL elicitations sent to clients whose completion notice breakwater remembers where to send.
URL_PAGES_MAX = 1024
#: Transports whose wire does not say which request a server message belongs to.
UNCORRELATED_TRANSPORTS = frozenset({"stdio", "sse"})
#: How long a finished call waits for log messages still being relayed before it answers.
RELAY_DRAIN_S = 1.0
#: How long a finished 2026-07-28 multi-round call keeps its result for the client's next round.
EXCHANGE_KEEP_S = 60.0
EXCHANGE_STATE_PREFIX = "breakwater-exchange:"
#: Checkpoints a round waits after the first input request, so requests issued together go out together.
EXCHANGE_GATHER_CHECKPOINTS = 5


@dataclass(eq=False)
class _Caller:
    """A downstream request in flight to one server: where that server's requests and log messages go."""

    server: str
    request: ServerRequestContext[Any] | None
    connection: object
    capabilities: types.ClientCapabilities | None
    exchange: _Exchange | None = None
    finished: bool = False
    #: The upstream attempt in flight for this call, whose timeout pauses while the caller is asked something.
    attempt: AttemptDeadline | None = None
    #: The call runs as a gateway task (breakwater.gateway._tasks): no round to carry a question in.
    in_task: bool = False
    #: The server's requests this call could not get answered: (kind, why), in order.
    refusals: list[tuple[str, str]] = field(default_factory=list)
    #: The clock the drain's bound runs on (the Breakwater's).
    clock: Clock = field(default_factory=SystemClock)
    #: Log messages of this call not relayed: more than `RELAYED_LOGS_PER_S` (reported before the answer: `drain`).
    logs_dropped: int = 0
    _asks: set[anyio.CancelScope] = field(default_factory=set)
    _deliveries: int = 0
    _log_allowance: LogAllowance | None = None  # made at the call's first log message
    #: Set when the last delivery under way ends, while `drain` waits for it (made there: most calls relay nothing).
    _idle: anyio.Event | None = None

    @property
    def ctx(self) -> ServerRequestContext[Any] | None:
        """The downstream request to talk on now (a 2026-07-28 caller has none between rounds)."""
        return self.exchange.ctx if self.exchange is not None else self.request

    @contextlib.contextmanager
    def asking(self) -> Iterator[anyio.CancelScope]:
        """The scope of one relayed request: cancelled when the call ends, so it never waits on a caller that left.

        Meanwhile the upstream attempt's own timeout stands still: the answer may come from a person,
        and only the attempt's hard cap (`max_s`, or the turn budget) bounds the wait.
        """
        scope = anyio.CancelScope()
        if self.finished:
            scope.cancel()
        self._asks.add(scope)
        try:
            with scope, self.attempt.waiting_on_caller() if self.attempt is not None else contextlib.nullcontext():
                yield scope
        finally:
            self._asks.discard(scope)

    @contextlib.contextmanager
    def delivering(self) -> Iterator[None]:
        """One relayed notification; the call answers only after those under way are delivered (`drain`)."""
        self._deliveries += 1
        try:
            yield
        finally:
            self._deliveries -= 1
            if not self._deliveries and self._idle is not None:
                self._idle.set()

    async def drain(self) -> None:
        """Let messages that arrived before the result reach the caller before the result does."""
        # The SDK hands each notification (and progress) to its callback in a task of its own.
        for _ in range(PROGRESS_DRAIN_CHECKPOINTS):
            await anyio.lowlevel.checkpoint()
        if self._deliveries:
            with self.clock.deadline_scope(self.clock.monotonic() + RELAY_DRAIN_S):
                while self._deliveries:
                    self._idle = anyio.Event()
                    await self._idle.wait()
        if self.logs_dropped:
            await self._report_dropped_logs()

    def admit_log(self) -> bool:
        """Whether one more log message of this call may be relayed (a token bucket on the relay's clock)."""
        if self._log_allowance is None:
            self._log_allowance = LogAllowance(self.clock)
        if self._log_allowance.admit():
            return True
        self.logs_dropped += 1
        return False

    async def _report_dropped_logs(self) -> None:
        """Tell the caller, once and before the answer, how many of the call's log messages it did not get."""
        dropped, self.logs_dropped = self.logs_dropped, 0
        logger.info("%s sent more log messages than a call relays: %d not relayed", self.server, dropped)
        ctx = self.ctx
        if ctx is None or "warning" not in _admitted_levels(ctx):
            return
        text = (
            f"breakwater: {dropped} log message(s) from {self.server!r} during this call were not relayed: it sent more"
            f" than {RELAYED_LOGS_BURST} at once, then more than {RELAYED_LOGS_PER_S:g} a second"
        )
        params = types.LoggingMessageNotificationParams(level="warning", logger="breakwater", data=text)
        with contextlib.suppress(Exception):  # the caller went away: nothing to tell
            await ctx.session.send_notification(
                types.LoggingMessageNotification(params=params), related_request_id=ctx.request_id
            )

    def refuse(self, kind: str, why: str) -> types.ErrorData:
        """Refuse the server's `kind` request for this call, and remember why (see `explain_refusal`)."""
        self.refusals.append((kind, why))
        return _refusal(why)

    def finish(self) -> None:
        self.finished = True
        for scope in list(self._asks):
            scope.cancel()


@dataclass(eq=False)
class _Question:
    """An input request a 2026-07-28 caller is to answer in its next round."""

    request: types.CreateMessageRequest | types.ElicitRequest
    result_type: type[BaseModel]
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: Any = None


@dataclass(eq=False)
class _Exchange:
    """A call from a 2026-07-28 client that an upstream asked for input (multi round-trip, SEP-2322).

    That revision has no server-to-client requests: the gateway answers the round with an
    `InputRequiredResult` carrying the upstream's questions and a `request_state` naming this
    exchange, while the upstream call waits in a task of its own; the client's next round brings
    the answers and waits for the result (or the next questions).
    """

    token: str
    tool: str
    ctx: ServerRequestContext[Any] | None = None  # the round in progress
    questions: dict[str, _Question] = field(default_factory=dict)
    result: types.CallToolResult | None = None
    done: bool = False
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    collected: anyio.Event = field(default_factory=anyio.Event)
    _changed: anyio.Event = field(default_factory=anyio.Event)
    _count: int = 0

    def poke(self) -> None:
        self._changed.set()

    async def ask(
        self, caller: _Caller, kind: str, request: types.CreateMessageRequest | types.ElicitRequest, result_type: type[BaseModel]
    ) -> Any:
        """Put `request` to the client in its next round; its answer (or an error when the call ends first)."""
        self._count += 1
        key = f"{kind}-{self._count}"
        question = self.questions[key] = _Question(request, result_type)
        self.poke()
        try:
            with caller.asking():
                await question.answered.wait()
                return question.answer
        finally:
            self.questions.pop(key, None)
        return types.ErrorData(code=types.INTERNAL_ERROR, message="breakwater: the call ended before the client answered")

    def answer(self, responses: Mapping[str, Any] | None) -> None:
        for key, response in (responses or {}).items():
            question = self.questions.get(key)
            if question is None or question.answered.is_set():
                continue
            raw = (
                response.model_dump(by_alias=True, mode="json", exclude_none=True)
                if isinstance(response, BaseModel)
                else response
            )
            try:
                question.answer = question.result_type.model_validate(raw, by_name=False)
            except ValidationError:
                question.answer = types.ErrorData(code=types.INVALID_PARAMS, message=f"the answer to {key!r} has the wrong shape")
            question.answered.set()

    def open_questions(self) -> dict[str, _Question]:
        return {k: q for k, q in self.questions.items() if not q.answered.is_set()}

    async def settle(self) -> None:
        """Wait until the call finished or has a question open (new, or one the last round left unanswered)."""
        while not self.done and not self.open_questions():
            self._changed = anyio.Event()
            await self._changed.wait()
        for _ in range(EXCHANGE_GATHER_CHECKPOINTS):
            await anyio.lowlevel.checkpoint()


def _sampling_gap(caps: types.ClientCapabilities | None, params: types.CreateMessageRequestParams) -> str | None:
    """Why the caller cannot take this sampling request (None: it can)."""
    sampling = caps.sampling if caps is not None else None
    if sampling is None:
        return "does not support sampling"
    if (params.tools or params.tool_choice) and sampling.tools is None:
        return "does not support sampling with tools"
    if params.include_context not in (None, "none") and sampling.context is None:
        return "does not support sampling with included context"
    return None


def _elicitation_gap(caps: types.ClientCapabilities | None, params: types.ElicitRequestParams) -> str | None:
    """Why the caller cannot take this elicitation request (None: it can)."""
    elicitation = caps.elicitation if caps is not None else None
    if elicitation is None:
        return "does not support elicitation"
    if isinstance(params, types.ElicitRequestURLParams):
        return None if elicitation.url is not None else "does not support URL elicitation"
    # An empty `elicitation: {}` means form mode (the 2025-06-18 shape).
    return None if elicitation.form is not None or elicitation.url is None else "does not support form elicitation"


#: Where an upstream's `notifications/resources/updated` goes: `(server, uri)`.
UpdateSink = Callable[[str, str], Awaitable[None]]


#: Why no client was asked: `breakwater call` and `status` have none behind them; a shared server's request outside a call
#: belongs to no single session.
_NO_CALLER = " (a command-line call has no client to ask; a request outside a call belongs to no single client)"


def _refusal(message: str) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message=f"breakwater: {message}")


class Relay:
    """Carries what an upstream sends back mid-request to the downstream request it belongs to.

    Sampling and elicitation requests, log messages and resource updates reach the gateway through
    callbacks on each upstream's `mcp.Client` (`client_kwargs`). A callback finds its downstream
    request (a `_Caller`) from the context of the upstream request it belongs to: the SDK runs
    it in that context for streamable HTTP upstreams (the message rode that request's stream) and
    for 2026-07-28 input requests (asked inside the call). On stdio (and the old SSE transport)
    the wire does not say which request a message belongs to: it goes to the caller when every
    call in flight to that server comes from one downstream connection, and is refused (requests)
    when calls from several are in flight. A request nobody can answer gets an MCP error at once; a
    relayed request never outlives its call. A log message that belongs to no single call goes to
    the gateway's log and to the sessions that see its server (`logs`: `gateway._log_relay.IdleLogs`).
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        """`clock` bounds the wait for deliveries still under way when a call answers. Made before the
        `Breakwater` whose connections carry its callbacks, and so before the gateway that owns the
        subscriptions; the gateway names where resource updates go with `deliver_to`."""
        self._resource_updated: UpdateSink = _no_subscribers
        self._clock: Clock = clock or SystemClock()
        self._callers: dict[str, list[_Caller]] = {}
        self.exchanges: dict[str, _Exchange] = {}
        #: (server, elicitationId) -> the caller whose client was sent that page to open: where the server's
        #: `notifications/elicitation/complete` for it goes. The oldest go first past `URL_PAGES_MAX`.
        self._url_pages: OrderedDict[tuple[str, str], _Caller] = OrderedDict()
        #: Log messages outside calls; each gateway sharing this relay names its sessions with `logs.attend`.
        self.logs = IdleLogs(clock=self._clock)

    def deliver_to(self, resource_updated: UpdateSink) -> None:
        """Where `notifications/resources/updated` from upstreams go from now on: `resource_updated(server, uri)`."""
        self._resource_updated = resource_updated

    def calling(self, ctx: ServerRequestContext[Any], server: str, *, exchange: _Exchange | None = None) -> _Calling:
        """Relay what `server` sends back while the body (`async with`) runs to the downstream request `ctx`."""
        return _Calling(self, ctx, server, exchange)

    def _caller(self, server: str, transport: str, meta: Any = None) -> _Caller | None:
        caller = _CALLER.get()
        if caller is not None and caller.server == server:
            return None if caller.finished else caller
        live = [c for c in self._callers.get(server, ()) if not c.finished]
        # A 2025-11-25 task tags what it asks with its id (`_meta`), whatever the transport: the call that made it.
        related = meta.get(RELATED_TASK_META_KEY) if isinstance(meta, Mapping) else None
        task_id = related.get("taskId") if isinstance(related, Mapping) else None
        if isinstance(task_id, str):
            for c in live:
                if getattr(c.attempt, "task_id", None) == task_id:
                    return c
        if transport not in UNCORRELATED_TRANSPORTS:
            return None
        if live and all(c.connection is live[-1].connection for c in live):
            return live[-1]
        return None

    def refused(self, server: str, transport: str, kind: str, why: str) -> types.ErrorData:
        """Refuse `server`'s `kind` request; for the call it belongs to, if one is in flight, remembered as its reason."""
        caller = self._caller(server, transport)
        return caller.refuse(kind, why) if caller is not None else _refusal(why)

    @property
    def clock(self) -> Clock:
        """The clock that bounds the relay's waits."""
        return self._clock

    def client_kwargs(self, spec: ServerSpec) -> dict[str, Any]:
        """The relay callbacks for `spec`'s `mcp.Client` (an `Upstream.client_hooks`)."""
        return self._client_kwargs(spec, None)

    def hooks_delivering_to(self, resource_updated: UpdateSink) -> Callable[[ServerSpec], dict[str, Any]]:
        """`client_kwargs`, but resource updates go to `resource_updated` (one attached session's own servers,
        whose subscriptions that session's view holds), not where `deliver_to` sends the shared servers'."""
        return lambda spec: self._client_kwargs(spec, resource_updated)

    def _client_kwargs(self, spec: ServerSpec, resource_updated: UpdateSink | None) -> dict[str, Any]:
        server, transport = spec.name, spec.transport

        async def sampling(
            context: ClientRequestContext, params: types.CreateMessageRequestParams
        ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
            result: Any = await self.sample(server, transport, params)
            return cast("types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData", result)

        async def elicitation(
            context: ClientRequestContext, params: types.ElicitRequestParams
        ) -> types.ElicitResult | types.ErrorData:
            result: Any = await self.elicit(server, transport, params)
            return cast("types.ElicitResult | types.ErrorData", result)

        async def message(item: Any) -> None:
            if isinstance(item, types.ResourceUpdatedNotification):
                await (resource_updated or self._resource_updated)(server, str(item.params.uri))
            elif isinstance(item, types.ElicitCompleteNotification):
                await self._url_page_done(server, item.params.elicitation_id)

        return {
            "sampling_callback": sampling,
            "elicitation_callback": elicitation,
            # A session's own process (`hooks_delivering_to`) is told apart: its messages outside calls are that session's.
            "logging_callback": UpstreamLog(server, transport, Redactor(spec.secrets), self._log_from, resource_updated),
            "message_handler": message,
            "log_level": UPSTREAM_LOG_LEVEL,
        }

    async def sample(self, server: str, transport: str, params: types.CreateMessageRequestParams) -> Any:
        """An upstream `sampling/createMessage`, asked of the downstream caller."""
        caller = self._caller(server, transport, params.meta)
        if caller is None:
            return _refusal(f"no single client call to {server!r} is waiting for this sampling request{_NO_CALLER}")
        gap = _sampling_gap(caller.capabilities, params)
        if gap is not None:
            return caller.refuse("sampling", f"the client that made this call {gap}")
        wants_tools = bool(params.tools or params.tool_choice)
        result_type = types.CreateMessageResultWithTools if wants_tools else types.CreateMessageResult
        return await self._ask(caller, "sampling", types.CreateMessageRequest(params=params), result_type)

    async def elicit(self, server: str, transport: str, params: types.ElicitRequestParams) -> Any:
        """An upstream `elicitation/create`, asked of the downstream caller."""
        caller = self._caller(server, transport, params.meta)
        if caller is None:
            return _refusal(f"no single client call to {server!r} is waiting for this elicitation request{_NO_CALLER}")
        gap = _elicitation_gap(caller.capabilities, params)
        if gap is not None:
            return caller.refuse("elicitation", f"the client that made this call {gap}")
        return await self._ask(caller, "elicitation", types.ElicitRequest(params=params), types.ElicitResult)

    async def _ask(
        self, caller: _Caller, kind: str, request: types.CreateMessageRequest | types.ElicitRequest, result_type: type[BaseModel]
    ) -> Any:
        if caller.exchange is not None:
            return await caller.exchange.ask(caller, kind, request, result_type)
        ctx = caller.ctx
        if ctx is None or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            # 2026-07-28 has no server-to-client requests; the gateway carries input requests on tools/call only.
            if caller.in_task:
                return caller.refuse(kind, f"the client's call runs as a task, and breakwater does not relay {kind} into tasks")
            method = ctx.method if ctx is not None else "this request"
            return caller.refuse(kind, f"a 2026-07-28 client can be asked for {kind} during tools/call only, not {method}")
        if isinstance(request.params, types.ElicitRequestURLParams) and request.params.elicitation_id:
            self._page_sent(caller, request.params.elicitation_id)
        try:
            with caller.asking():
                metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
                return await ctx.session.send_request(request, result_type, metadata=metadata)
        except MCPError as exc:
            caller.refusals.append((kind, f"the client refused it: {exc.error.message}"))
            return exc.error
        except Exception as exc:  # a client that went away or answered nonsense must not break the upstream call
            logger.debug("relaying %s to the downstream client failed", kind, exc_info=True)
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"breakwater: the client did not answer: {type(exc).__name__}"
            )
        return types.ErrorData(code=types.INTERNAL_ERROR, message="breakwater: the call ended before the client answered")

    def url_elicitation_required(self, result: types.CallToolResult, caller: _Caller) -> MCPError | None:
        """The server's URL-elicitation-required error (-32042) as it sent it, for a caller that can open the pages
        itself; each page is remembered for the server's completion notice.

        The gate turns it into CLIENT_CANNOT_ANSWER with each page's address in the text, which is what a
        model needs from a client that cannot take URL elicitations. A 2025-11-25 client that declared
        `elicitation.url` shows the pages to its user and retries when they are done: it gets the error the
        spec gives it, with the server's `elicitations`, rather than a text for its model.
        """
        structured = result.structured_content
        if not result.is_error or not isinstance(structured, Mapping):
            return None
        pages = structured.get("elicitations")
        if structured.get("code") != ErrorCode.CLIENT_CANNOT_ANSWER.value or not pages or not isinstance(pages, list):
            return None
        ctx = caller.ctx
        if ctx is None or caller.in_task or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None  # 2026-07-28 carries input requests in results, and a task has no request to fail
        elicitation = caller.capabilities.elicitation if caller.capabilities is not None else None
        if elicitation is None or elicitation.url is None:
            return None
        for page in pages:
            self._page_sent(caller, str(page["elicitationId"]))
        message = structured.get("message")
        text = message if isinstance(message, str) else "URL elicitation required"
        return MCPError(URL_ELICITATION_REQUIRED, text, {"elicitations": pages})

    def _page_sent(self, caller: _Caller, elicitation_id: str) -> None:
        self._url_pages[(caller.server, elicitation_id)] = caller
        while len(self._url_pages) > URL_PAGES_MAX:
            self._url_pages.popitem(last=False)

    async def _url_page_done(self, server: str, elicitation_id: str) -> None:
        """A server's `notifications/elicitation/complete`, to the client it had sent to open that page.

        The client may retry what waited for the page. On the call's own stream while the call runs,
        on the connection's after (a 2025-11-25 HTTP client's GET stream).
        """
        caller = self._url_pages.pop((server, elicitation_id), None)
        ctx = caller.ctx if caller is not None else None
        if caller is None or ctx is None:
            logger.debug("%s completed elicitation %r, which breakwater sent to no client", server, elicitation_id)
            return
        note = types.ElicitCompleteNotification(params=types.ElicitCompleteNotificationParams(elicitation_id=elicitation_id))
        try:
            await ctx.session.send_notification(note, related_request_id=None if caller.finished else ctx.request_id)
        except Exception:  # the client went away: nothing to tell
            logger.debug("could not relay the completion of elicitation %r from %s", elicitation_id, server, exc_info=True)

    async def _log_from(self, source: UpstreamLog, params: types.LoggingMessageNotificationParams) -> None:
        await self.log(source.server, source.transport, params, source=source)

    async def log(
        self, server: str, transport: str, params: types.LoggingMessageNotificationParams, *, source: UpstreamLog | None = None
    ) -> None:
        """An upstream `notifications/message`, to the caller (if its level admits it); one that belongs to no
        single call, to the gateway's log and the sessions that see `server` (`IdleLogs.publish`, from `source`)."""
        caller = self._caller(server, transport, params.meta)
        if caller is None:
            await self.logs.publish(source or UpstreamLog(server, transport, Redactor(()), self._log_from), params)
            return
        with caller.delivering():
            ctx = caller.ctx
            if ctx is None or caller.finished or params.level not in _admitted_levels(ctx) or not caller.admit_log():
                return
            # Named as outside calls (`IdleLogs.publish`): "server" or "server/its-logger", so that one client sees one
            # shape; and the server's own secrets stay out of what its caller is told, as there.
            own = (source.redact(params.logger) if source is not None else params.logger) if params.logger else None
            update: dict[str, Any] = {"logger": f"{server}/{own}" if own else server}
            if source is not None:
                update["data"] = source.redact.scrub(params.data)
            params = params.model_copy(update=update)
            try:
                await ctx.session.send_notification(
                    types.LoggingMessageNotification(params=params), related_request_id=ctx.request_id
                )
            except Exception:  # the caller went away: nothing to tell
                logger.debug("could not relay a log message from %s", server, exc_info=True)


def _can_answer(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the downstream client declared it can take sampling or elicitation requests."""
    caps = ctx.session.client_capabilities
    return caps is not None and (caps.sampling is not None or caps.elicitation is not None)


class _Calling:
    """`Relay.calling`'s context. A class, not an `asynccontextmanager`: every proxied call enters one (issue 16)."""

    __slots__ = ("_caller", "_exchange", "_relay", "_request", "_server", "_tokens")

    def __init__(self, relay: Relay, ctx: ServerRequestContext[Any], server: str, exchange: _Exchange | None) -> None:
        self._relay, self._request, self._server, self._exchange = relay, ctx, server, exchange

    async def __aenter__(self) -> _Caller:
        ctx, server = self._request, self._server
        caller = self._caller = _Caller(
            server=server,
            request=ctx,
            connection=connection_of(ctx),
            capabilities=ctx.session.client_capabilities,
            exchange=self._exchange,
            in_task=current_task_id() is not None,
            clock=self._relay._clock,
        )
        self._relay._callers.setdefault(server, []).append(caller)
        self._tokens = (_CALLER.set(caller), ATTEMPT_WATCHER.set(lambda attempt: setattr(caller, "attempt", attempt)))
        return caller

    async def __aexit__(self, *exc: object) -> None:
        caller, callers = self._caller, self._relay._callers
        caller.finish()
        ATTEMPT_WATCHER.reset(self._tokens[1])
        _CALLER.reset(self._tokens[0])
        mine = callers.get(self._server)
        if mine is not None:
            mine.remove(caller)
            if not mine:
                del callers[self._server]


def explain_refusal(result: types.CallToolResult, caller: _Caller) -> types.CallToolResult:
    """A tool error (or the server's error answer) that followed a refused sampling, elicitation or roots
    request, as CLIENT_CANNOT_ANSWER.

    The tool's own words stay first; the code and advice say that different input will not help,
    where a plain TOOL_ERROR would tell the model to fix its input. A server whose tool raised on the
    refusal (the Python SDK answers that with a JSON-RPC error) came back as UPSTREAM_ERROR, "the
    connection to the tool's server failed": it did not, the client could not answer.
    """
    structured = result.structured_content
    if not result.is_error or not caller.refusals or not isinstance(structured, Mapping):
        return result
    if structured.get("code") not in (ErrorCode.TOOL_ERROR.value, ErrorCode.UPSTREAM_ERROR.value):
        return result
    kind, why = caller.refusals[-1]
    err = ClientCannotAnswerError(
        f"The tool asked the client for {kind}, and got no answer: {why}.",
        server=structured.get("server"),
        tool=structured.get("tool"),
        attempt=int(structured.get("attempt") or 1),
        max_attempts=int(structured.get("max_attempts") or 1),
        operation_id=structured.get("operation_id"),
        detail={"request": kind, "reason": why},
    )
    ours = error_result(err)
    own = [block for block in result.content if not (block.meta or {}).get(ENVELOPE_META_KEY)]
    return ours.model_copy(update={"content": [*own, *ours.content]})


async def _no_subscribers(server: str, uri: str) -> None:
    return None
