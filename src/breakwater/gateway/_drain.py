"""Graceful drain of `breakwater serve --http`: a replica leaves a fleet without losing a call.

On SIGTERM (`Drain.run`, started by `cli/_serve.py`):

1. `/readyz` answers 503 at once, so the load balancer's health check takes the replica out;
2. every new request is refused (`DrainGuard`): 503 with `Connection: close`, before anything is
   parsed by the SDK or run, so a balancer may replay it on another replica (HAProxy's
   `retry-on 503`). Notifications and responses (a cancellation, the client's answer to a relayed
   elicitation) and `DELETE` still go through, so the calls in flight can finish;
3. the calls in flight get up to `[gateway] drain_s` to finish;
4. what is left is cancelled (the gate passes the cancellation upstream) and each caller is answered
   with an envelope: OUTCOME_UNKNOWN with the operation id for a mutating tool (it may have run), a
   retryable UPSTREAM_ERROR for a read-only one;
5. for `LINGER_S` after the last POST ended, what a client finishing a call sends next is still answered (the
   requests step 2 lets through: the SDK's client lists the tools right after a call to a tool it never listed);
6. the open GET streams are ended and the server exits.

Only POSTs count as in flight: a GET stream of a 2025-11-25 session lives as long as its session.

Gateway tasks (`breakwater.gateway._tasks`) survive the stop as they survive a kill: from the drain's
start, the call of a gateway task that became an upstream task is no call in flight; its upstream
task is left running and its row kept (`TaskOwner.keep`, and `keep_resumed` for adopted ones), so
the restarted gateway adopts the id and resumes it. While the drain runs, polls of this process's
gateway tasks (`tasks/get`, `tasks/cancel`, `tasks/update`) are still answered: they run nothing new,
and a task whose upstream task ended meanwhile answers its result from memory (its row stays for the
next process too). A gateway task whose call is still a plain call is a call in flight like any other.

Stdio ends the same way when its client goes away (`drain_stdio`): when stdin closes, or on SIGTERM
or Ctrl-C; the calls in flight get the same window, what is left is cut with the same envelopes
(written to stdout while the client may still read it), and the process exits 0. After a stop signal
stdin is still read until the drain ends: each new request is answered at once with the refusal HTTP
gives (`stdio_refusal`), and notifications (a cancellation) and responses still go through. A second
stop signal skips what is left of the window (`Drain.cut_now`): the cut and its envelopes come at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from breakwater._clock import Clock, DeadlineScope
from breakwater.errors import CallError, OutcomeUnknownError, UpstreamError
from breakwater.gate._tasks import TASK_OWNER, TaskOwner
from breakwater.gateway._tasks import issued_here, keep_resumed

if TYPE_CHECKING:
    from breakwater._breakwater import Breakwater

__all__ = ["CUT_GRACE_S", "LINGER_S", "Drain", "DrainGuard", "drain_stdio", "replay_body", "stdio_refusal"]

#: After the window, how long the cut calls' envelopes get to be written before the server stops.
CUT_GRACE_S = 0.5
#: How long after its last POST ended a draining gateway still serves (what a draining gateway answers: `DrainGuard`).
#: The SDK's client checks a successful result against the tool's output schema, and lists the tools first when it has
#: never listed them: when the call was the last one the drain waited for, that list met a gateway just stopped, and the
#: client raised `ConnectError` for a call that had run (3 runs in 20 of `test_drain.py`'s follow-up test without it).
LINGER_S = 0.5
#: A request body read while draining (to tell a request from a notification) is capped like the SDK's.
_BODY_LIMIT = 4 * 1024 * 1024
_REFUSAL = (
    "this breakwater gateway is shutting down and runs nothing new; send the request again, to another replica or once "
    "it is back (nothing was run)"
)
#: A `tasks/*` request naming a task this process does not hold: taking it over would start polling here.
_TASK_REFUSAL = (
    "this breakwater gateway is shutting down and takes over no task it does not hold; ask again, another replica "
    "or this one once it is back answers it (nothing was done to the task)"
)
#: The same refusal over stdio, where the session, not a replica, is ending (JSON-RPC internal error, as over HTTP).
_STDIO_REFUSAL = (
    "this breakwater session is shutting down and runs nothing new; send the request again in a new session (nothing was run)"
)
_REFUSAL_CODE = -32603


class _InFlight:
    """One tool call the drain may cut; a context manager (`Drain.call`), a class rather than a generator's: every
    proxied call enters one (issue 16)."""

    __slots__ = ("_calls", "owner", "scope", "sent", "was_sent")

    def __init__(self, calls: set[_InFlight], scope: DeadlineScope, sent: Callable[[], bool], owner: TaskOwner | None) -> None:
        self._calls = calls
        self.scope = scope
        #: True while an attempt is with the upstream (so a mutating call may have run).
        self.sent = sent
        #: The gateway task the call runs for, if any: once its call is an upstream task it survives the drain.
        self.owner = owner
        self.was_sent = False

    def __enter__(self) -> _InFlight:
        self._calls.add(self)
        try:
            self.scope.__enter__()
        except BaseException:
            self._calls.discard(self)
            raise
        return self

    def __exit__(self, *exc: Any) -> bool:
        try:
            return bool(self.scope.__exit__(*exc))
        finally:
            self._calls.discard(self)


class Drain:
    """The replica's drain state: what is in flight, and the cut at the end of the window."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        #: Set once SIGTERM arrived: /readyz is 503 and new requests are refused.
        self.draining = False
        #: The window passed: calls still running were cancelled (and new ones are cut at once).
        self.cutting = False
        #: POSTs to the MCP endpoint being served.
        self.requests = 0
        #: When the last POST ended (`clock.monotonic()`): the drain lingers `LINGER_S` after it.
        self._last_end = -math.inf
        #: Calls cut at the end of the window.
        self.cut = 0
        self._calls: set[_InFlight] = set()
        self._idle: anyio.Event | None = None
        self._began: anyio.Event | None = None  # made by the first `started()`: no Event outside a running loop
        #: A second stop signal came: the window is over (`cut_now`).
        self.hurried = False
        self._window: DeadlineScope | None = None
        #: Called when the drain is over, before the server stops (ends the sessions' GET streams).
        self.on_done: list[Callable[[], None]] = []

    # ---- what is in flight ----------------------------------------------------------------------

    def request_started(self) -> None:
        self.requests += 1

    def request_done(self) -> None:
        self.requests -= 1
        self._last_end = self.clock.monotonic()
        if self.requests <= 0 and self._idle is not None:
            self._idle.set()

    def call(self, sent: Callable[[], bool]) -> _InFlight:
        """A tool call the drain may cut (`with`): the body runs in a scope `run` cancels once the window passed.

        After the block, `.scope.cancelled_caught` says whether it was cut (nothing else cancels it).
        """
        entry = _InFlight(self._calls, self.clock.deadline_scope(math.inf), sent, TASK_OWNER.get())
        if self.cutting:
            entry.scope.cancel()
        elif self.draining and entry.owner is not None:
            entry.owner.keep()
        return entry

    # ---- the drain ------------------------------------------------------------------------------

    async def started(self) -> None:
        """Return once the drain has begun: a wait that is no call (a first list waiting for servers) ends with it,
        to answer what it has while the session can still be answered."""
        if self.draining:
            return
        if self._began is None:
            self._began = anyio.Event()
        await self._began.wait()

    def _survives(self, entry: _InFlight) -> bool:
        """Whether a call outlives the drain: a gateway task's call that is an upstream task now (kept: `_keep`)."""
        return self.draining and entry.owner is not None and entry.owner.following is not None

    def _keep(self) -> None:
        """The drain began: every gateway task's call keeps its upstream task, had or to come (`TaskOwner.keep`)."""
        for entry in list(self._calls):
            if entry.owner is not None:
                entry.owner.keep()
        keep_resumed()

    def _busy(self) -> bool:
        """Requests or calls in flight that the drain waits for (or cuts)."""
        return self.requests > 0 or any(not self._survives(entry) for entry in list(self._calls))

    async def run(self, window_s: float) -> None:
        """Refuse new work, wait up to `window_s` for the calls in flight, cut the rest."""
        self.draining = True
        self._keep()
        if self._began is not None:
            self._began.set()
        clock = self.clock
        if self._busy() and not self.hurried:
            self._window = clock.deadline_scope(clock.monotonic() + window_s)
            try:
                with self._window:
                    await self._wait_idle(math.inf)
            finally:
                self._window = None
        if self._busy():
            self.cutting = True
            for entry in list(self._calls):
                if self._survives(entry):
                    continue
                entry.was_sent = entry.sent()
                self.cut += 1
                entry.scope.cancel()
            await self._wait_idle(clock.monotonic() + CUT_GRACE_S)
        if not self.hurried:
            await self._linger()
        for done in self.on_done:
            done()

    async def _linger(self) -> None:
        """Serve until `LINGER_S` after the last POST ended, then let the requests that came meanwhile finish (a second
        stop signal ends it, as it ends the window)."""
        clock = self.clock
        until = self._last_end + LINGER_S
        if until <= clock.monotonic():
            return
        self._window = clock.deadline_scope(math.inf)  # for `cut_now` only
        try:
            with self._window:
                await clock.sleep(until - clock.monotonic())
        finally:
            self._window = None
        if not self.hurried:
            await self._wait_idle(clock.monotonic() + CUT_GRACE_S)

    def cut_now(self) -> None:
        """End the window now (a second stop signal): `run` cuts what is in flight at once, envelopes and all."""
        self.hurried = True
        if self._window is not None:
            self._window.cancel()

    async def _wait_idle(self, deadline: float) -> None:
        clock = self.clock
        with clock.deadline_scope(deadline):
            while self._busy():
                self._idle = anyio.Event()
                if self.requests <= 0:
                    # Only calls without a request of their own (2026-07-28 rounds in the gateway's task group).
                    await clock.sleep(0.05)
                else:
                    await self._idle.wait()

    def cut_error(self, bw: Breakwater, entry: _InFlight, server: str, tool: str, operation_id: str | None) -> CallError:
        """The envelope of a call cut at the end of the window."""
        from breakwater.gate._classify import RetryClass

        retry_class = bw.gate.retry_class(server, tool)
        detail = {"reason": "gateway_drain", "sent": entry.was_sent}
        if retry_class is not None and retry_class is not RetryClass.SAFE:
            return OutcomeUnknownError(
                "This gateway was shutting down (a replica draining, or a stdio client gone) and its drain window ended "
                "while the call was running; the call was cancelled and may or may not have happened.",
                server=server,
                tool=tool,
                operation_id=operation_id,
                detail=detail,
            )
        return UpstreamError(
            "This gateway was shutting down and cancelled the call before it finished; it is safe to call it again "
            "(another replica serves it, or this one once it is back).",
            server=server,
            tool=tool,
            retryable=True,
            detail=detail,
        )


class DrainGuard:
    """ASGI middleware in front of the MCP endpoint: counts POSTs in flight; while draining, refuses new requests."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method")
        drain = self.drain
        if drain.draining:
            if method == "GET":
                await _refuse(send, None)
                return
            if method == "POST":
                body = await _read_body(receive)
                if body is None or (message_id := _request_id(body)) is not _NOT_A_REQUEST:
                    await _refuse(send, None if body is None else message_id, _refusal_of(body))
                    return
                receive = replay_body(body, receive)
        if method != "POST":
            await self.app(scope, receive, send)
            return
        drain.request_started()
        try:
            await self.app(scope, receive, send)
        finally:
            drain.request_done()


_NOT_A_REQUEST = object()
#: The requests a draining gateway still answers: they run nothing, and a client finishing a call may send one. The
#: SDK's client lists the tools after a call to check its structured content: refused, the call's result was lost and
#: the client told "nothing was run" of a call that had run. `tasks/result` (2025-11-25) is not served here: the
#: SDK's own error says so.
_STILL_ANSWERED = frozenset({"ping", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "tasks/result"})
#: Requests about one gateway task, answered while draining when this process holds the task (`_tasks.issued_here`).
_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


def _request_id(body: bytes) -> Any:
    """The id of the JSON-RPC request in `body` that a draining gateway refuses (None for a batch holding one), or
    `_NOT_A_REQUEST` (a notification, an answer, a request it still answers)."""
    try:
        message = json.loads(body)
    except ValueError:
        return _NOT_A_REQUEST  # the SDK answers it with a parse error; nothing runs
    messages = message if isinstance(message, list) else [message]
    for item in messages:
        if isinstance(item, dict) and "method" in item and "id" in item:
            if len(messages) > 1:
                return None
            if item["method"] in _STILL_ANSWERED or (item["method"] in _TASK_METHODS and issued_here(_task_id(item))):
                return _NOT_A_REQUEST
            return item["id"]
    return _NOT_A_REQUEST


def _task_id(request: dict[str, Any]) -> object:
    params = request.get("params")
    return params.get("taskId") if isinstance(params, dict) else None


def _refusal_of(body: bytes | None) -> str:
    """The refusal's message: a request naming a task this process does not hold says so; any other, that it was not run."""
    try:
        message = json.loads(body) if body is not None else None
    except ValueError:
        return _REFUSAL
    if isinstance(message, dict) and message.get("method") in _TASK_METHODS:
        return _TASK_REFUSAL
    return _REFUSAL


async def _read_body(receive: Any) -> bytes | None:
    """The whole request body, or None past the limit."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _BODY_LIMIT:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay_body(body: bytes, receive: Any) -> Any:
    """An ASGI `receive` that hands the app a request body already read, then the connection's own messages."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def stdio_refusal(line: bytes) -> tuple[Any, int, str] | None:
    """For a stdio line read while draining: `(id, code, message)` of its refusal if it is a request, else None."""
    message_id = _request_id(line)
    if message_id is _NOT_A_REQUEST:
        return None
    refusal = _STDIO_REFUSAL if _refusal_of(line) == _REFUSAL else _TASK_REFUSAL
    return message_id, _REFUSAL_CODE, refusal


async def _refuse(send: Any, message_id: Any, message: str = _REFUSAL) -> None:
    error = {"jsonrpc": "2.0", "id": message_id, "error": {"code": _REFUSAL_CODE, "message": message}}
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", b"0"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(error).encode()})


#: Loop turns given to the cut calls' answers to leave the session (the response is written after the
#: handler returns, a few hand-offs later) before its read side closes and the session stops.
_FLUSH_TURNS = 50


async def drain_stdio(drain: Drain, window_s: float) -> None:
    """The stdio client went away (stdin closed) or a stop signal came: let the calls in flight finish within
    `window_s`, cut the rest, and let their answers out."""
    import anyio.lowlevel

    await drain.run(window_s)
    for _ in range(_FLUSH_TURNS):
        await anyio.lowlevel.checkpoint()


def end_get_streams(manager: Any) -> None:
    """End every session's open GET stream cleanly, so the server's shutdown does not wait on them.

    A client reconnects its GET stream at once, through the balancer, to a replica still serving.
    """
    for transport in list(getattr(manager, "_server_instances", {}).values()):
        transport.close_standalone_sse_stream()


def set_sse_keepalive(seconds: float) -> None:
    """Send an SSE comment on every silent HTTP stream each `seconds` (0: never). Process-wide.

    The SDK builds its SSE responses itself and offers no per-app setting: its 2025-11-25 streams are
    sse-starlette's `EventSourceResponse` (15 s by default), its 2026-07-28 ones ping at a module
    constant, which is also how long such a request may stay silent before it commits to SSE.
    """
    import mcp.server._streamable_http_modern as modern
    from sse_starlette import EventSourceResponse

    EventSourceResponse.DEFAULT_PING_INTERVAL = seconds  # type: ignore[assignment]  # annotated int, takes float
    modern._SSE_PING_INTERVAL = seconds if seconds > 0 else math.inf
