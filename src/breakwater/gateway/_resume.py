"""Resumable SSE streams (2025-11-25): a client whose call's stream is cut reconnects with `Last-Event-ID`.

A 2025-11-25 POST that commits to an SSE stream (`breakwater.gateway._lazy_sse`: the call sent
something before its answer, or took longer than the commit window) gets event ids, and its events
are kept in a *stream log*: `MemoryStreamLog` in this process, or `breakwater.state._streams.
RedisStreamLog` with `[state] url = "redis://..."`. A call answered as one JSON body is never
written anywhere: its events sit in a list until the answer shows there is nothing to resume.

When the balancer cuts the stream (an idle timeout, a replica draining), the SDK's client sends
`GET` with `Last-Event-ID`. The replica that receives it, any replica with Redis, replays the log
after that id and then *follows* it (Redis `XREAD BLOCK`) until the call's answer, while the call
keeps running where it started and its replica keeps writing into the log. The SDK's own
`_replay_events` tails the replica's local streams after the replay, which cannot see a call
running elsewhere and loses what arrives between the replay and the tail; so the follower returns
only once it has sent the answer, and the SDK's live tail is never used.

Guarantees and limits:

* a log keeps at most `[gateway] resume_events` events (the oldest go first) and is kept while its
  call runs, then `[gateway] resume_ttl_s`; a reconnect to an unknown or expired stream is a 404;
* the replica running the call marks its streams alive (Redis: a key refreshed every
  `OWNER_BEAT_S`); a follower that finds the mark gone without an answer (the replica was killed,
  or the session ended) answers the call itself: OUTCOME_UNKNOWN for a tool call, with its
  operation id, since it may have run;
* only 2025-11-25 request streams: the GET stream of a session is not kept (its notifications are
  this replica's), and 2026-07-28 has no resumption (a cut stream loses the request; the client
  re-issues it, with its operation id).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, SSEEvent, StreamId
from mcp_types import (
    INTERNAL_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)

from breakwater._clock import Clock
from breakwater._wire import OPERATION_ID_META_KEY
from breakwater.state._streams import FOLLOW_POLL_S, OWNER_BEAT_S, StreamLog

if TYPE_CHECKING:
    from mcp.server.streamable_http import StreamableHTTPServerTransport

__all__ = ["ResumableStreams", "SessionStreams", "event_id", "parse_event_id"]

log = logging.getLogger("breakwater.gateway")

#: The first event's sequence number: 1 is the stream's start (the priming event's id).
_START_SEQ = 1


def event_id(request_id: str, seq: int) -> str:
    """The SSE id of event `seq` of the stream of `request_id` (the session is the GET's own)."""
    return f"{seq}/{request_id}"


def parse_event_id(value: str) -> tuple[str, int] | None:
    """(request id, sequence number) of an id `event_id` made, else None."""
    seq, sep, request_id = value.partition("/")
    if not sep or not request_id or not seq.isdigit():
        return None
    return request_id, int(seq)


def _resumable_id(request_id: str) -> bool:
    # It travels in an SSE `id:` line and back in a header: printable ASCII only.
    return request_id.isascii() and request_id.isprintable()


class ResumableStreams:
    """A replica's resumable streams: the log, the bounds, and the followers a drain ends."""

    def __init__(
        self,
        log: StreamLog,
        *,
        clock: Clock,
        ttl_s: float,
        resolve: Callable[[str], tuple[str, str] | None] | None = None,
    ) -> None:
        self.log = log
        self.clock = clock
        self.ttl_s = ttl_s
        #: (server, tool) behind a downstream tool name, so a follower's answer names them as the gate's would.
        self.resolve = resolve
        self._followers: set[anyio.CancelScope] = set()
        #: Streams replayed to a reconnecting client (for status and tests).
        self.resumed = 0
        #: Calls answered by a follower because the replica running them was gone.
        self.orphaned = 0

    def for_session(
        self, transport: StreamableHTTPServerTransport, spawn: Callable[[Callable[[], Awaitable[None]]], None]
    ) -> SessionStreams:
        """The `EventStore` of one session's transport (`spawn` runs a background task in the session manager)."""
        assert transport.mcp_session_id is not None
        return SessionStreams(self, transport.mcp_session_id, alive=lambda: not transport.is_terminated, spawn=spawn)

    def end_followers(self) -> None:
        """End every replayed stream (the drain's last step): each client reconnects to a replica still serving."""
        for scope in list(self._followers):
            scope.cancel()


@dataclass(eq=False)
class _Committed:
    next_seq: int
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    final: bool = False


class SessionStreams(EventStore):
    """One session's resumable streams: the SDK's `EventStore`, plus the lazy path's open / commit / discard.

    A stream is *open* from its POST until the lazy path knows how it is answered: its events get ids
    but stay in memory. `commit` (the answer goes out as SSE) writes them to the log; `discard` (one
    JSON body) drops them. Streams never opened (the GET stream, `initialize`) get no ids and are not kept.
    """

    def __init__(
        self,
        streams: ResumableStreams,
        session_id: str,
        *,
        alive: Callable[[], bool],
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
    ) -> None:
        self.streams = streams
        self.session_id = session_id
        self._alive = alive
        self._spawn = spawn
        self._pending: dict[str, list[tuple[int, JSONRPCMessage]]] = {}
        self._committed: dict[str, _Committed] = {}

    # ---- the lazy path's side -------------------------------------------------------------------

    def open(self, request_id: str) -> bool:
        """Keep the events of this request's stream until `commit` or `discard`; False when it cannot be resumed."""
        if not _resumable_id(request_id):
            return False
        self._pending[request_id] = []
        return True

    def discard(self, request_id: str) -> None:
        """The request was answered without a stream: nothing to keep."""
        self._pending.pop(request_id, None)

    async def commit(self, request: JSONRPCRequest) -> SSEEvent:
        """The request's answer goes out as SSE: write what it carried so far; the priming event to send first."""
        request_id = str(request.id)
        pending = self._pending.pop(request_id, [])
        state = _Committed(next_seq=_START_SEQ + 1 + len(pending))
        self._committed[request_id] = state
        key = (self.session_id, request_id)
        entries = [(seq, _dump(message)) for seq, message in pending]
        # Taken before any await, so no event the router stores meanwhile is written before the start.
        state.lock.acquire_nowait()
        try:
            await self.streams.log.start(key, _info(request, self.streams.resolve), entries, self._alive)
        except Exception as exc:
            log.warning("cannot keep stream %s of session %s (%s); it cannot be resumed", request_id, self.session_id[:8], exc)
        finally:
            state.lock.release()
        if self.streams.log.needs_beat:
            self._spawn(lambda: self._keep_alive(request_id, state))
        return {"id": event_id(request_id, _START_SEQ), "data": ""}

    async def _keep_alive(self, request_id: str, state: _Committed) -> None:
        key = (self.session_id, request_id)
        clock = self.streams.clock
        while True:
            await clock.sleep(OWNER_BEAT_S)
            if state.final or not self._alive():
                return
            try:
                await self.streams.log.beat([key])
            except Exception as exc:
                log.debug("cannot refresh stream %s (%s)", request_id, exc)

    # ---- EventStore ---------------------------------------------------------------------------------

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Give the event an id and keep it, if its stream is open or committed; else no id ("")."""
        if message is None:
            return ""
        pending = self._pending.get(stream_id)
        if pending is not None:
            seq = _START_SEQ + 1 + len(pending)
            pending.append((seq, message))
            return event_id(stream_id, seq)
        state = self._committed.get(stream_id)
        if state is None:
            return ""
        seq = state.next_seq
        state.next_seq += 1
        final = isinstance(message, JSONRPCResponse | JSONRPCError)
        if final:
            state.final = True
            del self._committed[stream_id]
        async with state.lock:
            try:
                await self.streams.log.append((self.session_id, stream_id), seq, _dump(message), final=final)
            except Exception as exc:
                log.warning("cannot keep an event of stream %s (%s); a resume may miss it", stream_id, exc)
        return event_id(stream_id, seq)

    async def known(self, last_event_id: str) -> bool:
        """Whether a GET with this `Last-Event-ID` names an event a stream of this session sent, and the stream is still kept."""
        parsed = parse_event_id(last_event_id)
        if parsed is None:
            return False
        key, after = (self.session_id, parsed[0]), parsed[1]
        try:
            if await self.streams.log.info(key) is None:
                return False
            # An id this stream never sent (ahead of its last event): the reconnect got an empty stream that ended
            # without the answer, which lay behind the id. Every event is in the log before it is sent.
            return after <= _START_SEQ or bool((await self.streams.log.read(key, after - 1, wait_s=0)).entries)
        except Exception as exc:
            log.warning("cannot look up stream %s (%s)", parsed[0], exc)
            return False

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Send the events after `last_event_id`, then follow the stream until the request's answer.

        Returns None always: the answer has been sent (or the stream is gone), so the SDK ends the
        response instead of tailing this replica's own streams.
        """
        parsed = parse_event_id(last_event_id)
        if parsed is None:
            return None
        request_id, after = parsed
        streams = self.streams
        scope = anyio.CancelScope()
        streams._followers.add(scope)
        streams.resumed += 1
        try:
            with scope:
                await self._follow(request_id, after, send_callback)
        except Exception as exc:
            log.warning("stream %s could not be followed (%s); the client may reconnect", request_id, exc)
        finally:
            streams._followers.discard(scope)
        return None

    async def _follow(self, request_id: str, after: int, send: EventCallback) -> None:
        key = (self.session_id, request_id)
        streams = self.streams
        while True:
            read = await streams.log.read(key, after, wait_s=FOLLOW_POLL_S)
            for seq, data in read.entries:
                message = jsonrpc_message_adapter.validate_json(data, by_name=False)
                await send(EventMessage(message, event_id(request_id, seq)))
                after = seq
                if isinstance(message, JSONRPCResponse | JSONRPCError):
                    return
            if read.entries:
                continue
            if not read.known or read.final:
                return
            if not read.alive:
                # The owner writes its answer before it drops the mark: one more look before answering for it.
                if (await streams.log.read(key, after, wait_s=0)).entries:
                    continue
                info = await streams.log.info(key) or {}
                streams.orphaned += 1
                await send(EventMessage(_orphan_answer(request_id, info)))
                return


def _dump(message: JSONRPCMessage) -> str:
    return message.model_dump_json(by_alias=True, exclude_unset=True)


def _info(request: JSONRPCRequest, resolve: Callable[[str], tuple[str, str] | None] | None = None) -> dict[str, Any]:
    """What a follower needs to answer for the request if its replica is gone."""
    params = request.params if isinstance(request.params, dict) else {}
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    name = params.get("name") if request.method == "tools/call" else None
    target = resolve(name) if resolve is not None and isinstance(name, str) else None
    return {
        "id": request.id,
        "method": request.method,
        "server": target[0] if target is not None else None,
        "tool": target[1] if target is not None else name,
        "operation_id": meta.get(OPERATION_ID_META_KEY) if isinstance(meta, dict) else None,
    }


_LOST = (
    "The gateway replica running this call stopped (or its session ended) before the call answered; "
    "the call may or may not have happened."
)


def _orphan_answer(request_id: str, info: dict[str, Any]) -> JSONRPCMessage:
    """The answer a follower gives for a request whose replica is gone: it may have run."""
    raw_id = info.get("id", request_id)
    answer_id: str | int = raw_id if isinstance(raw_id, str | int) else request_id
    if info.get("method") == "tools/call":
        from breakwater.errors import OutcomeUnknownError
        from breakwater.gate._envelope import error_result

        operation_id, server, tool = info.get("operation_id"), info.get("server"), info.get("tool")
        err = OutcomeUnknownError(
            _LOST,
            server=server if isinstance(server, str) else None,
            tool=tool if isinstance(tool, str) else None,
            operation_id=operation_id if isinstance(operation_id, str) else None,
            detail={"reason": "replica_lost"},
        )
        result = error_result(err).model_dump(mode="json", by_alias=True, exclude_none=True)
        return JSONRPCResponse(jsonrpc="2.0", id=answer_id, result=result)
    return JSONRPCError(jsonrpc="2.0", id=answer_id, error=ErrorData(code=INTERNAL_ERROR, message=_LOST))
