"""2025-11-25 HTTP sessions in Redis, so any gateway replica can serve a session another one created.

Key layout (`NS` = `[state] namespace`):

    NS:session:{ID}   string  JSON {"version", "params", "level", "subscriptions"}   TTL `[gateway] session_ttl_s`, renewed by use

`version` is the negotiated protocol revision, `params` the client's `initialize` params (client
info and capabilities), `level` the log level it set (`logging/setLevel`), if any, `subscriptions`
the [server, uri] pairs of its resource subscriptions (absent until it subscribes). The record is
written before the `initialize` response leaves, so the client never holds a session id that Redis
does not know. A replica serving a request of a session renews the TTL; the renewal also says
whether the session still exists, which is how a `DELETE` on one replica ends it on all of them.

Redis trouble never fails a request: a session the store cannot read is unknown (404, as without
Redis); a renewal that cannot be made keeps the local session.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from breakwater.config._policies import StatePolicy
from breakwater.state._record_client import Reach, record_client

__all__ = ["SessionStore"]

log = logging.getLogger("breakwater.sessions")


#: The suffix of the mark a `DELETE` leaves: the session ended (a record merely missing was lost, not ended).
_ENDED = ":ended"


class SessionStore:
    """Session records in Redis (the `redis` extra)."""

    def __init__(self, policy: StatePolicy, *, ttl_s: float, reach: Reach | None = None) -> None:
        self._prefix = f"{policy.namespace}:session:"
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self._r = record_client(policy, reach=reach)
        #: The latest record this replica wrote or read of each session it serves: written again when Redis lost it.
        self._copies: dict[str, dict[str, Any]] = {}

    def _key(self, session_id: str) -> str:
        return self._prefix + session_id

    async def save(self, session_id: str, record: dict[str, Any]) -> None:
        """Write (or replace) the session's record with a fresh TTL."""
        self._copies[session_id] = record
        try:
            await self._r.set(self._key(session_id), json.dumps(record), px=self.ttl_ms)
        except Exception as exc:
            log.warning("cannot store session %s in Redis (%s); only this replica can serve it", session_id[:8], exc)

    async def load(self, session_id: str) -> dict[str, Any] | None:
        """The session's record, or None when Redis has none (or cannot be read)."""
        try:
            raw = await self._r.get(self._key(session_id))
        except Exception as exc:
            log.warning("cannot read session %s from Redis (%s)", session_id[:8], exc)
            return None
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

    async def delete(self, session_id: str) -> bool:
        """End the session for every replica; whether it existed. A mark says it ended (for the TTL), so a replica
        that finds the record gone can tell an end from a loss (`renew`)."""
        self.forget(session_id)
        key = self._key(session_id)
        try:
            await self._r.set(key + _ENDED, "1", px=self.ttl_ms)
            return bool(await self._r.delete(key))
        except Exception as exc:
            log.warning("cannot delete session %s from Redis (%s)", session_id[:8], exc)
            return False

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._r.aclose()
