"""2025-11-25 HTTP sessions in Redis, so any gateway replica can serve a session another one created.

Key layout (`NS` = `[state] namespace`):

    NS:session:{ID}         string   JSON {"version", "params", "level", "subscriptions"}
                                     TTL `[gateway] session_ttl_s`, renewed by use
    NS:session:{ID}:ended   string   "1" once a `DELETE` ended it, TTL `[gateway] session_ttl_s`
    NS:sessions-live:{R}    string   "1", pushed out by replica R's `watch`: Redis still has the records
    NS:sessions-ended       channel  {"replica", "session"} published by a `DELETE`

`version` is the negotiated protocol revision, `params` the client's `initialize` params (client
info and capabilities), `level` the log level it set (`logging/setLevel`), if any, `subscriptions`
the [server, uri] pairs of its resource subscriptions (absent until it subscribes). The record is
written before the `initialize` response leaves, so the client never holds a session id that Redis
does not know. A replica serving a request of a session renews the TTL; the renewal also says
whether the session still exists, which is how a `DELETE` on one replica ends it on all of them.

Redis trouble never fails a request of a session this replica holds (a renewal that cannot be made
keeps the local session); a session it does not hold, whose record cannot be read, is for the caller
to refuse retryably (`find` raises), since a 404 ends the client's session for good.

Records Redis lost come back without waiting for a request (`watch`, once a second): a record whose
save failed while Redis was away, and every record this replica holds when its `sessions-live` mark
is gone (Redis restarted empty), are written again, unless an `ended` mark says a `DELETE` ended the
session. A `DELETE` is published, so the other replicas drop their copies at once: a copy left behind
counted toward their session cap until it idled out, and was written back after a restart (that had
lost the `ended` mark too), bringing the deleted session back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from breakwater._clock import Clock, SystemClock
from breakwater.config._policies import StatePolicy
from breakwater.state._pubsub import listen
from breakwater.state._record_client import MIN_TIMEOUT_S, Reach, record_client

__all__ = ["WATCH_S", "SessionStore"]

log = logging.getLogger("breakwater.sessions")


#: The suffix of the mark a `DELETE` leaves: the session ended (a record merely missing was lost, not ended).
_ENDED = ":ended"
#: How often `watch` looks whether Redis lost records this replica holds (and tries again what it could not save).
WATCH_S = 1.0

# Push out the live mark; 1 when it was missing (Redis lost its records, or never had any). KEYS: mark; ARGV: TTL ms.
_MARK = """
local lost = redis.call('EXISTS', KEYS[1]) == 0 and 1 or 0
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return lost
"""

# Write a record back unless the session was ended (0) or the record is there (2). KEYS: record, ended; ARGV: JSON, TTL ms.
_WRITE_BACK = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return 1 end
return 2
"""


class SessionStore:
    """Session records in Redis (the `redis` extra)."""

    def __init__(self, policy: StatePolicy, *, ttl_s: float, reach: Reach | None = None, clock: Clock | None = None) -> None:
        self._prefix = f"{policy.namespace}:session:"
        self.channel = f"{policy.namespace}:sessions-ended"
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self.clock: Clock = clock or SystemClock()
        #: This process in the `DELETE` messages (its own are not news to it) and in its live mark.
        self.replica = uuid.uuid4().hex
        # One mark per replica: with one for the fleet, the first replica to see it gone set it again, and the others,
        # seeing it there, wrote nothing back.
        self._mark = f"{policy.namespace}:sessions-live:{self.replica}"
        self._policy = policy
        self._r = record_client(policy, reach=reach)
        # `watch` waits for Redis's answer (a background task: nobody waits on it) and so tells `reach` when it is back.
        self._w = record_client(policy, fail_fast=False)
        #: The latest record this replica wrote or read of each session it serves: written again when Redis lost it.
        self._copies: dict[str, dict[str, Any]] = {}
        #: Sessions whose record could not be written (Redis away): `watch` writes them when it answers again.
        self._unsaved: set[str] = set()

    def _key(self, session_id: str) -> str:
        return self._prefix + session_id

    async def save(self, session_id: str, record: dict[str, Any]) -> None:
        """Write (or replace) the session's record with a fresh TTL."""
        self._copies[session_id] = record
        try:
            await self._r.set(self._key(session_id), json.dumps(record), px=self.ttl_ms)
        except Exception as exc:
            self._unsaved.add(session_id)
            log.warning("cannot store session %s in Redis yet (%s); only this replica can serve it", session_id[:8], exc)
        else:
            self._unsaved.discard(session_id)

    async def find(self, session_id: str) -> dict[str, Any] | None:
        """The session's record, or None when Redis has none; raises when Redis cannot be asked (unknown, not absent)."""
        raw = await self._r.get(self._key(session_id))
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(record, dict):
            return None
        self._copies[session_id] = record
        return record

    async def load(self, session_id: str) -> dict[str, Any] | None:
        """The session's record, or None when Redis has none (or cannot be read)."""
        try:
            return await self.find(session_id)
        except Exception as exc:
            log.warning("cannot read session %s from Redis (%s)", session_id[:8], exc)
            return None

    async def renew(self, session_id: str) -> bool:
        """Push the TTL out again; False only when the session was ended (a `DELETE` on any replica).

        A record that is simply not there was lost (Redis restarted, or a save failed while it was away): the replica
        that serves the session writes its copy again, and serves on. Read as an end, a Redis blip ended every
        2025-11-25 session for good, on the replica that held it too."""
        key = self._key(session_id)
        try:
            if await self._r.pexpire(key, self.ttl_ms):
                return True
            if await self._r.exists(key + _ENDED):
                return False
        except Exception:
            return True
        copy = self._copies.get(session_id)
        if copy is not None:
            await self.save(session_id, copy)
        return True

    def forget(self, session_id: str) -> None:
        """This replica no longer serves the session: drop its copy."""
        self._copies.pop(session_id, None)
        self._unsaved.discard(session_id)

    async def update(self, session_id: str, **fields: Any) -> None:
        """Change fields of an existing record (its TTL is kept)."""
        record = await self.load(session_id)
        if record is None:
            return
        record.update(fields)
        try:
            await self._r.set(self._key(session_id), json.dumps(record), px=self.ttl_ms)
        except Exception as exc:
            log.warning("cannot update session %s in Redis (%s)", session_id[:8], exc)

    async def delete(self, session_id: str) -> bool | None:
        """End the session for every replica; whether it existed (None: Redis cannot be asked).

        A mark says it ended (for the TTL), so a replica that finds the record gone can tell an end from a loss
        (`renew`), and a message tells the replicas holding it to drop it now (`watch`)."""
        self.forget(session_id)
        key = self._key(session_id)
        pipe = self._r.pipeline(transaction=False)
        pipe.set(key + _ENDED, "1", px=self.ttl_ms)
        pipe.delete(key)
        pipe.publish(self.channel, json.dumps({"replica": self.replica, "session": session_id}))
        try:
            _, existed, _ = await pipe.execute()
        except Exception as exc:
            log.warning("cannot delete session %s from Redis (%s)", session_id[:8], exc)
            return None
        return bool(existed)

    async def write_back(self) -> list[str]:
        """Write again the records Redis lost (module docstring); the sessions found ended meanwhile (drop them)."""
        lost = await self._w.eval(_MARK, 1, self._mark, self.ttl_ms)
        self._r.reach.answered()  # Redis answers: the request path need not wait for its own probe to learn it
        ids = list(self._copies) if int(lost) else [s for s in self._unsaved if s in self._copies]
        if not ids:
            return []
        records = [json.dumps(self._copies[s]) for s in ids]
        pipe = self._w.pipeline(transaction=False)
        for session_id, record in zip(ids, records, strict=True):
            key = self._key(session_id)
            pipe.eval(_WRITE_BACK, 2, key, key + _ENDED, record, self.ttl_ms)
        done = await pipe.execute()
        ended = [s for s, n in zip(ids, done, strict=True) if int(n) == 0]
        written = sum(1 for n in done if int(n) == 1)
        self._unsaved.difference_update(ids)
        for session_id in ended:
            self.forget(session_id)
        if written:
            log.warning("wrote back %d session records Redis did not have", written)
        return ended

    async def watch(self, ended: Callable[[str], Awaitable[None]]) -> None:
        """Until cancelled: `ended(id)` for each session another replica ends, and lost records written back (`write_back`)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._listen, ended)
            failing = False
            while True:
                try:
                    gone = await self.write_back()
                except Exception as exc:
                    if not failing:
                        log.debug("cannot look at the session records in Redis (%s)", exc)
                    failing = True
                else:
                    failing = False
                    for session_id in gone:
                        await ended(session_id)
                await self.clock.sleep(WATCH_S)

    async def _listen(self, ended: Callable[[str], Awaitable[None]]) -> None:
        """The `DELETE`s of the other replicas, as they happen (one missed while unsubscribed: the `ended` mark stays)."""
        import redis.asyncio as aredis

        timeout = max(self._policy.timeout_s, MIN_TIMEOUT_S)
        sub = aredis.Redis.from_url(self._policy.url, socket_connect_timeout=timeout, decode_responses=True)

        async def deliver(data: Any) -> None:
            session_id = _ended_elsewhere(data, self.replica)
            if session_id is not None:
                self.forget(session_id)
                await ended(session_id)

        def lost(exc: Exception) -> None:
            log.debug("session subscription lost (%s)", exc)

        try:
            await listen(sub, self.channel, deliver, clock=self.clock, pause_s=WATCH_S, lost=lost)
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await sub.aclose()

    async def aclose(self) -> None:
        """Close the connection pools."""
        await self._r.aclose()
        await self._w.aclose()


def _ended_elsewhere(data: Any, replica: str) -> str | None:
    """The session a `DELETE` message of another replica names, if it is one."""
    if not isinstance(data, str):
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("replica") == replica or not isinstance(body.get("session"), str):
        return None
    return str(body["session"])
