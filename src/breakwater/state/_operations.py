"""Mutating calls a gateway replica forwarded under a client's operation id, in Redis, shared by the fleet.

A client whose call was cut (its replica was killed, the balancer dropped the stream) retries it
through the balancer with the same operation id, and the retry lands on another replica. That
replica must not run the call again when the first one may have run it; these records are how it
knows (`breakwater.gateway._operations` decides what to answer).

Key layout (`NS` = `[state] namespace`):

    NS:op:{ID}        string  JSON {"state": "running"|"done", "replica", "fingerprint", "result"}
                              TTL `[gateway] operation_ttl_s`
    NS:replica:{ID}   string  "1", TTL `REPLICA_LEASE_S`, renewed every quarter of it while the replica runs

`claim` is one `SET NX`: of any number of replicas receiving the same id, exactly one forwards it.
The owner writes the call's answer (`finish`) before it answers its own client, so a retry finds
either the answer, a record whose owner is still alive (wait for it), or a record whose owner's
lease lapsed (the replica died mid-call: the outcome is unknown). `take_over` is a compare-and-set,
so of several retries of a dead owner's call at most one takes it over.

Redis trouble never fails a call: a claim that cannot be made lets the call run unrecorded (a
warning says so), an owner whose lease cannot be read is taken to be alive.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from typing import Any

from breakwater._clock import Clock
from breakwater.config._policies import StatePolicy
from breakwater.connect._lines import is_power_of_ten
from breakwater.state._record_client import record_client

__all__ = ["REPLICA_LEASE_S", "OperationRecords"]

log = logging.getLogger("breakwater.operations")

#: A replica not heard from this long is dead: its running operations' outcomes are unknown. A retry of
#: a call cut by `kill -9` waits at most this long for the verdict, so it is short; a live replica
#: stalled longer (renewals every quarter of it) only makes a retry answer OUTCOME_UNKNOWN early (or,
#: for a tool the server deduplicates, send it upstream under the same id), never run a call twice.
REPLICA_LEASE_S = 2.0
_RENEW_S = REPLICA_LEASE_S / 4

# Replace the record only if it is still exactly what the caller read (a takeover races other retries).
_CAS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


class OperationRecords:
    """The fleet's records of forwarded operations, and this replica's lease (the `redis` extra)."""

    def __init__(self, policy: StatePolicy, *, ttl_s: float, clock: Clock, replica: str | None = None) -> None:
        self.clock = clock
        #: This process's id in the records (a restarted replica is a new one).
        self.replica = replica or uuid.uuid4().hex
        self._ops = f"{policy.namespace}:op:"
        self._replicas = f"{policy.namespace}:replica:"
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self._r = record_client(policy, fail_fast=False)  # a claim must be Redis's answer, never a guess
        self._cas = self._r.register_script(_CAS)

    def _key(self, op_id: str) -> str:
        return self._ops + op_id

    async def claim(self, op_id: str, fingerprint: str) -> tuple[bool, dict[str, Any] | None, str | None]:
        """(claimed, record, raw): claimed is True when this replica now owns the id (or Redis cannot say).

        When another replica holds it, `record` is its record and `raw` its exact text (for `take_over`).
        """
        mine = json.dumps({"state": "running", "replica": self.replica, "fingerprint": fingerprint})
        try:
            for _ in range(2):
                if await self._r.set(self._key(op_id), mine, px=self.ttl_ms, nx=True):
                    return True, None, None
                raw = await self._r.get(self._key(op_id))
                if raw is not None:
                    return False, _parse(raw), raw
                # Gone between the two commands (released or expired): claim again.
        except Exception as exc:
            log.warning("cannot record operation %s in Redis (%s); a retry of it is not deduplicated", op_id[:12], exc)
        return True, None, None

    async def take_over(self, op_id: str, raw: str, fingerprint: str) -> bool:
        """Own the id of a dead replica's call, if no other retry did first."""
        mine = json.dumps({"state": "running", "replica": self.replica, "fingerprint": fingerprint})
        try:
            return bool(await self._cas(keys=[self._key(op_id)], args=[raw, mine, self.ttl_ms]))
        except Exception as exc:
            log.warning("cannot take over operation %s in Redis (%s)", op_id[:12], exc)
            return False

    async def finish(self, op_id: str, fingerprint: str, result: dict[str, Any]) -> None:
        """Record the call's answer (what a retry with the id is given)."""
        record = {"state": "done", "replica": self.replica, "fingerprint": fingerprint, "result": result}
        try:
            await self._r.set(self._key(op_id), json.dumps(record), px=self.ttl_ms)
        except Exception as exc:
            log.warning("cannot store the answer of operation %s in Redis (%s)", op_id[:12], exc)

    async def release(self, op_id: str) -> None:
        """Forget the id: nothing was sent upstream under it, so a retry may run it."""
        try:
            await self._r.delete(self._key(op_id))
        except Exception as exc:
            log.warning("cannot release operation %s in Redis (%s)", op_id[:12], exc)

    async def alive(self, replica: str) -> bool:
        """Whether `replica` renewed its lease lately (True when Redis cannot say: waiting is the safe side)."""
        if replica == self.replica:
            return True
        try:
            return bool(await self._r.exists(self._replicas + replica))
        except Exception:
            return True

    async def keep_alive(self) -> None:
        """Renew this replica's lease until cancelled (run for as long as the replica serves)."""
        failing = 0  # renewals failed in a row: said at the 1st, 10th, 100th... (once a second, 86,000 lines a day)
        while True:
            try:
                await self._r.set(self._replicas + self.replica, "1", px=math.ceil(REPLICA_LEASE_S * 1000))
            except Exception as exc:
                failing += 1
                if is_power_of_ten(failing):
                    # Said even while Redis is away (`Reach`): past the lease, other replicas take this one's calls for dead.
                    log.warning("cannot renew this replica's lease in Redis (%s; %d in a row)", str(exc), failing)
            else:
                if failing:
                    log.warning("this replica's lease in Redis is renewed again, after %d failures", failing)
                failing = 0
            await self.clock.sleep(_RENEW_S)

    async def aclose(self) -> None:
        """Drop this replica's lease at once (its calls are all answered) and close the pool."""
        try:
            await self._r.delete(self._replicas + self.replica)
        except Exception:
            log.debug("cannot drop this replica's lease", exc_info=True)
        await self._r.aclose()


def _parse(raw: str) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
