"""The events of resumable SSE streams: in this process, or in Redis so a client's reconnect can land on any replica.

`MemoryStreamLog` keeps them in memory (a reconnect must reach the same replica); `RedisStreamLog`
shares them. `breakwater.gateway._resume` writes and follows them. Redis key layout (`NS` = `[state]
namespace`, one stream per 2025-11-25 request that went out as SSE):

    NS:sse:{SESSION}:{REQUEST}        stream  entry id 0-SEQ, field m = the JSON-RPC message   MAXLEN `[gateway] resume_events`
    NS:sse-info:{SESSION}:{REQUEST}   string  JSON {"id", "method", "tool", "operation_id"}     (the stream is known)
    NS:sse-live:{SESSION}:{REQUEST}   string  "1" while the call runs (PX `OWNER_LOST_S`), "done" once answered

(The request id is the client's own JSON-RPC id, so it is the last part of each key: no id can name
another key's stream.)

Only the replica running the call writes a stream, in order, so the entry ids are its own sequence
numbers (`0-2`, `0-3`, ...; the SSE ids carry the same number). It refreshes the `live` mark every
`OWNER_BEAT_S` while the call runs; all three keys expire `[gateway] resume_ttl_s` after the last
write. A follower (`breakwater.gateway._resume`) reads with `XREAD BLOCK` and treats a missing mark
without an answer as a replica that is gone.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from breakwater._clock import Clock
from breakwater.config._policies import StatePolicy
from breakwater.config._service_policies import GatewayPolicy
from breakwater.state._record_client import record_client

__all__ = [
    "FOLLOW_POLL_S",
    "MAX_STREAMS",
    "OWNER_BEAT_S",
    "OWNER_LOST_S",
    "MemoryStreamLog",
    "RedisStreamLog",
    "StreamKey",
    "StreamLog",
    "StreamRead",
    "memory_stream_log",
]

#: How long a follower waits for a new event before it looks at the owner's liveness mark again.
FOLLOW_POLL_S = 1.0
#: How often the replica running a call refreshes its stream's liveness mark (Redis).
OWNER_BEAT_S = 1.0
#: A liveness mark not refreshed for this long means the replica running the call is gone.
OWNER_LOST_S = 5.0
#: Streams one replica keeps in memory at most (without Redis); the least recently written go first.
MAX_STREAMS = 10_000

#: (session id, request id): one request's response stream.
StreamKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class StreamRead:
    """What a follower's read found: new `(seq, JSON)` entries; whether the stream is known, its owner lives, it is answered."""

    entries: Sequence[tuple[int, str]]
    known: bool
    alive: bool
    #: The answer is in the log (a client past it has nothing left to get).
    final: bool = False


class StreamLog(Protocol):
    """Where the events of resumable streams are kept (this process, or Redis for the whole fleet)."""

    #: Whether the owner must refresh its liveness mark (`beat`) while its call runs.
    needs_beat: bool

    async def start(
        self, key: StreamKey, info: dict[str, Any], entries: Sequence[tuple[int, str]], alive: Callable[[], bool]
    ) -> None:
        """Open the stream's log with what it already carries; `alive()` says whether its owner still runs it."""
        ...

    async def append(self, key: StreamKey, seq: int, data: str, *, final: bool) -> None:
        """Add one event (`final`: the request's answer, after which nothing follows)."""
        ...

    async def beat(self, keys: Sequence[StreamKey]) -> None:
        """Refresh the liveness marks (and retention) of streams whose calls still run here."""
        ...

    async def info(self, key: StreamKey) -> dict[str, Any] | None:
        """The stream's start record (method, tool, operation id), or None when it is unknown or expired."""
        ...

    async def read(self, key: StreamKey, after: int, *, wait_s: float) -> StreamRead:
        """Entries after `after`, waiting up to `wait_s` when there are none yet."""
        ...


@dataclass(eq=False)
class _MemoryStream:
    info: dict[str, Any]
    entries: deque[tuple[int, str]]
    alive: Callable[[], bool]
    expires: float
    final: bool = False
    changed: anyio.Event = field(default_factory=anyio.Event)
    #: The characters its entries hold (what `MemoryStreamLog.max_bytes` bounds).
    size: int = 0


class MemoryStreamLog:
    """Resumable streams in this process, kept `ttl_s` after the call: bounded by `events` per stream, `MAX_STREAMS`
    streams and `max_bytes` in all (the least recently written go first).

    The byte bound (the entries' JSON text, counted in characters) and `sweep` are why a replica's memory follows its
    traffic: ten abandoned 3 MB answers were held, 63 MB, until the next stream was written, however long after their
    time that came.
    """

    needs_beat = False

    def __init__(
        self, *, events: int, ttl_s: float, clock: Clock, max_streams: int = MAX_STREAMS, max_bytes: int | None = None
    ) -> None:
        self.events = events
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_streams = max_streams
        self.max_bytes = max_bytes
        self._streams: OrderedDict[StreamKey, _MemoryStream] = OrderedDict()
        #: The characters of every stream's entries.
        self.size = 0
        self._started = anyio.Event()

    def __len__(self) -> int:
        return len(self._streams)

    def _over(self) -> bool:
        return len(self._streams) > self.max_streams or (self.max_bytes is not None and self.size > self.max_bytes)

    def _purge(self) -> None:
        now = self.clock.monotonic()
        while self._streams:
            key, stream = next(iter(self._streams.items()))
            over = self._over()
            if not over and stream.expires > now:
                return
            if not over and not stream.final and stream.alive():
                # Its call still runs: kept (a long silent call can still be resumed), looked at again later.
                stream.expires = now + self.ttl_s
                self._streams.move_to_end(key)
                continue
            del self._streams[key]
            self.size -= stream.size
            stream.changed.set()

    async def sweep(self) -> None:
        """Drop each stream when its time is up, until cancelled (else only the next write looked: an idle replica
        held its last answers for good)."""
        while True:
            self._purge()
            if self._streams:
                first = next(iter(self._streams.values()))
                await self.clock.sleep(max(0.0, first.expires - self.clock.monotonic()))
            else:
                self._started = anyio.Event()
                await self._started.wait()

    def _get(self, key: StreamKey) -> _MemoryStream | None:
        self._purge()
        return self._streams.get(key)

    async def start(
        self, key: StreamKey, info: dict[str, Any], entries: Sequence[tuple[int, str]], alive: Callable[[], bool]
    ) -> None:
        kept = deque(entries, maxlen=self.events)
        size = sum(len(data) for _, data in kept)
        if (old := self._streams.get(key)) is not None:
            self.size -= old.size
        self._streams[key] = _MemoryStream(info, kept, alive, self.clock.monotonic() + self.ttl_s, size=size)
        self.size += size
        self._streams.move_to_end(key)
        self._started.set()
        self._purge()

    async def append(self, key: StreamKey, seq: int, data: str, *, final: bool) -> None:
        stream = self._streams.get(key)
        if stream is None:
            return
        if len(stream.entries) == stream.entries.maxlen:  # the oldest goes
            gone = len(stream.entries[0][1])
            stream.size -= gone
            self.size -= gone
        stream.entries.append((seq, data))
        stream.size += len(data)
        self.size += len(data)
        stream.final = stream.final or final
        stream.expires = self.clock.monotonic() + self.ttl_s
        self._streams.move_to_end(key)
        stream.changed.set()
        stream.changed = anyio.Event()
        self._purge()

    async def beat(self, keys: Sequence[StreamKey]) -> None:
        return None

    async def info(self, key: StreamKey) -> dict[str, Any] | None:
        stream = self._get(key)
        return None if stream is None else stream.info

    async def read(self, key: StreamKey, after: int, *, wait_s: float) -> StreamRead:
        stream = self._get(key)
        if stream is not None and not stream.final and stream.alive() and all(seq <= after for seq, _ in stream.entries):
            changed = stream.changed
            with self.clock.deadline_scope(self.clock.monotonic() + wait_s):
                await changed.wait()
            stream = self._get(key)
        if stream is None:
            return StreamRead((), known=False, alive=False)
        entries = [entry for entry in stream.entries if entry[0] > after]
        return StreamRead(entries, known=True, alive=stream.final or stream.alive(), final=stream.final)


def memory_stream_log(policy: GatewayPolicy, clock: Clock) -> MemoryStreamLog:
    """This replica's own log of resumable streams, bounded as `[gateway]` says (run its `sweep` beside it)."""
    return MemoryStreamLog(events=policy.resume_events, ttl_s=policy.resume_ttl_s, clock=clock, max_bytes=policy.resume_max_bytes)


_DONE = "done"


class RedisStreamLog:
    """Resumable streams in Redis (the `redis` extra); the `StreamLog` of `breakwater.gateway._resume`."""

    needs_beat = True

    def __init__(self, policy: StatePolicy, *, events: int, ttl_s: float, owner_lost_s: float = OWNER_LOST_S) -> None:
        self._namespace = policy.namespace
        self.events = events
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self.live_ms = max(1, math.ceil(owner_lost_s * 1000))
        # A follower's XREAD BLOCK holds its connection for up to FOLLOW_POLL_S.
        self._r = record_client(policy, blocking_s=FOLLOW_POLL_S)

    def _keys(self, key: tuple[str, str]) -> tuple[str, str, str]:
        """The stream's keys: its events, its start record, its liveness mark."""
        tail = f"{key[0]}:{key[1]}"
        ns = self._namespace
        return f"{ns}:sse:{tail}", f"{ns}:sse-info:{tail}", f"{ns}:sse-live:{tail}"

    async def start(
        self, key: tuple[str, str], info: dict[str, Any], entries: Sequence[tuple[int, str]], alive: Callable[[], bool]
    ) -> None:
        """Open the stream with its start record, what it carried so far and a fresh liveness mark."""
        k, info_key, live_key = self._keys(key)
        pipe = self._r.pipeline(transaction=False)
        pipe.set(info_key, json.dumps(info), px=self.ttl_ms)
        for seq, data in entries:
            pipe.xadd(k, {"m": data}, id=f"0-{seq}", maxlen=self.events, approximate=False)
        if entries:
            pipe.pexpire(k, self.ttl_ms)
        pipe.set(live_key, "1", px=self.live_ms)
        await pipe.execute()

    async def append(self, key: tuple[str, str], seq: int, data: str, *, final: bool) -> None:
        """One event; the answer turns the liveness mark into `done` (kept as long as the events)."""
        k, info_key, live_key = self._keys(key)
        pipe = self._r.pipeline(transaction=False)
        pipe.xadd(k, {"m": data}, id=f"0-{seq}", maxlen=self.events, approximate=False)
        pipe.pexpire(k, self.ttl_ms)
        pipe.pexpire(info_key, self.ttl_ms)
        # Written after the event, so a follower that sees the mark change also sees the event.
        pipe.set(live_key, _DONE if final else "1", px=self.ttl_ms if final else self.live_ms)
        await pipe.execute()

    async def beat(self, keys: Sequence[tuple[str, str]]) -> None:
        """The calls of these streams still run here: marks and retention pushed out again."""
        pipe = self._r.pipeline(transaction=False)
        for key in keys:
            k, info_key, live_key = self._keys(key)
            pipe.set(live_key, "1", px=self.live_ms, xx=True)
            pipe.pexpire(k, self.ttl_ms)
            pipe.pexpire(info_key, self.ttl_ms)
        await pipe.execute()

    async def info(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The start record, or None when the stream is unknown or expired."""
        raw = await self._r.get(self._keys(key)[1])
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def read(self, key: tuple[str, str], after: int, *, wait_s: float) -> StreamRead:
        """Entries after `after` (`XREAD BLOCK` up to `wait_s` when there are none), with the stream's state."""
        k, info_key, live_key = self._keys(key)
        block = max(1, round(wait_s * 1000)) if wait_s > 0 else None
        found = await self._r.xread({k: f"0-{after}"}, count=100, block=block)
        entries = [(int(entry_id.partition("-")[2]), fields.get("m", "")) for _, items in found for entry_id, fields in items]
        pipe = self._r.pipeline(transaction=False)
        pipe.exists(info_key)
        pipe.get(live_key)
        known, live = await pipe.execute()
        return StreamRead(entries, known=bool(known), alive=live is not None, final=live == _DONE)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._r.aclose()
