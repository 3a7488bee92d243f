"""Mutating calls a gateway replica forwarded under a client's operation id, in Redis, shared by the fleet.

A client whose call was cut (its replica was killed, the balancer dropped the stream) retries it
through the balancer with the same operation id, and the retry lands on another replica. That
replica must not run the call again when the first one may have run it; these records are how it
knows (`breakwater.gateway._operations` decides what to answer).

Key layout (`NS` = `[state] namespace`):

    NS:op:{ID}        string  JSON {"state": "running"|"done", "replica", "fingerprint", "result"}
                              TTL `[gateway] operation_ttl_s`
    NS:replica:{ID}   string  "1", TTL `REPLICA_LEASE_S`, renewed every quarter of it while the replica runs
    NS:ops-live       string  "1", TTL `operation_ttl_s`, pushed out by every renewal: Redis still has its records
    NS:ops-settling   string  "1", TTL `REPLICA_LEASE_S`, set when `ops-live` was found missing

`claim` is one script around `SET NX`: of any number of replicas receiving the same id, exactly one forwards it.
The owner writes the call's answer (`finish`) before it answers its own client, so a retry finds
either the answer, a record whose owner is still alive (wait for it), or a record whose owner's
lease lapsed (the replica died mid-call: the outcome is unknown). `take_over` is a compare-and-set,
so of several retries of a dead owner's call at most one takes it over.

Redis trouble never fails a call: a claim that cannot be made lets the call run unrecorded (a
warning says so), an owner whose lease cannot be read is taken to be alive.

A Redis that comes back empty (restarted without persistence, a failover to a replica that had not
caught up) has lost the records of the calls still running. A retry that found no record claimed the
id and ran the call a second time. So the replica keeps what it wrote of each call it runs, and every
lease renewal writes back the records that are missing (and the answers, releases and claims it could
not write while Redis was away), in the same round trip, only where the key is missing or still its
own. That leaves the time until the next renewal (a quarter lease, 0.5 s): a claim that finds the
`ops-live` mark missing knows Redis lost its data, sets it and `ops-settling` for one lease, and
while that lasts an id without a record is not claimed (`claim` says `SETTLING`, the retry waits):
within a lease every live replica has renewed and written its records back (a namespace Redis has
never seen looks the same: the first lease after a fleet's first start, a call with an id waits up
to 2 s once). What remains: a replica stalled longer than its lease (it is taken for dead then
anyway), a record Redis lost while keeping `ops-live` (a failover whose replica had the mark but
not the claim: up to one renewal, 0.5 s), and a call run while Redis is away and retried elsewhere
before Redis answers again (both run it: neither could ask).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from typing import Any, Final

import anyio

from breakwater._clock import Clock
from breakwater.config._policies import StatePolicy
from breakwater.connect._lines import is_power_of_ten
from breakwater.state._record_client import record_client

__all__ = ["MAX_PENDING", "REPLICA_LEASE_S", "SETTLING", "OperationRecords"]

log = logging.getLogger("breakwater.operations")

#: A replica not heard from this long is dead: its running operations' outcomes are unknown. A retry of
#: a call cut by `kill -9` waits at most this long for the verdict, so it is short; a live replica
#: stalled longer (renewals every quarter of it) only makes a retry answer OUTCOME_UNKNOWN early (or,
#: for a tool the server deduplicates, send it upstream under the same id), never run a call twice.
REPLICA_LEASE_S = 2.0
_RENEW_S = REPLICA_LEASE_S / 4

#: `claim`'s answer while Redis has just come back empty: the live replicas have not written their records back yet.
SETTLING: Final = "settling"
#: Writes (answers, releases) kept for Redis at most, while it does not answer; the oldest go first.
MAX_PENDING = 10_000

# Claim the id (SET NX), unless Redis lost its records lately (the `live` mark is missing, or was within a lease).
# KEYS: op, live, settling; ARGV: record, record TTL ms, settling ms. {1} claimed, {0, record} held, {2} settling.
_CLAIM = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[3])
end
local held = redis.call('GET', KEYS[1])
if held then return {0, held} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {2} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
"""

# The lease, and the `live` mark: found missing, Redis lost its records (settle, as `_CLAIM` does).
# KEYS: lease, live, settling; ARGV: lease ms, live ms, settling ms.
_RENEW = """
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[3])
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
"""

# Write back a record of ours: only where the key is missing or still holds what we wrote before (ARGV[2]).
# KEYS: op; ARGV: new value ('' = delete), the value it may replace ('' = none), TTL ms.
_RESTORE = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return 0 end
if held and held ~= ARGV[2] then return 0 end
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
end
return 1
"""

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

    def __init__(
        self,
        policy: StatePolicy,
        *,
        ttl_s: float,
        clock: Clock,
        replica: str | None = None,
        settle_s: float = REPLICA_LEASE_S,
    ) -> None:
        self.clock = clock
        #: This process's id in the records (a restarted replica is a new one).
        self.replica = replica or uuid.uuid4().hex
        self._ops = f"{policy.namespace}:op:"
        self._replicas = f"{policy.namespace}:replica:"
        self._marks = (f"{policy.namespace}:ops-live", f"{policy.namespace}:ops-settling")
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        #: How long claims of unknown ids wait after Redis lost its records (the live replicas write theirs back).
        self.settle_ms = max(1, math.ceil(settle_s * 1000))
        self._r = record_client(policy, fail_fast=False)  # a claim must be Redis's answer, never a guess
        self._cas = self._r.register_script(_CAS)
        self._claim = self._r.register_script(_CLAIM)
        #: The running record this replica wrote (or could not write) of each call it runs: written back when missing.
        self._running: dict[str, str] = {}
        #: Writes Redis did not take (an answer, a release): (value, '' to delete; the value it may replace).
        self._pending: dict[str, tuple[str, str]] = {}
        # A write-back in flight must not bring back a record `release` deletes meanwhile.
        self._restoring = anyio.Lock()

    def _key(self, op_id: str) -> str:
        return self._ops + op_id

    async def claim(self, op_id: str, fingerprint: str) -> tuple[bool, dict[str, Any] | None, str | None]:
        """(claimed, record, raw): claimed is True when this replica now owns the id (or Redis cannot say).

        When another replica holds it, `record` is its record and `raw` its exact text (for `take_over`).
        Not claimed and no record (`raw` is `SETTLING`): Redis lost its records lately, ask again shortly.
        """
        mine = json.dumps({"state": "running", "replica": self.replica, "fingerprint": fingerprint})
        live, settling = self._marks
        try:
            answer = await self._claim(keys=[self._key(op_id), live, settling], args=[mine, self.ttl_ms, self.settle_ms])
        except Exception as exc:
            log.warning("cannot record operation %s in Redis (%s); a retry of it is not deduplicated", op_id[:12], exc)
            # Written when Redis answers again (where no other replica recorded the id): a retry from then on waits.
            self._running[op_id] = mine
            return True, None, None
        if int(answer[0]) == 1:
            self._running[op_id] = mine
            return True, None, None
        if int(answer[0]) == 2:
            return False, None, SETTLING
        raw = str(answer[1])
        return False, _parse(raw), raw

    async def take_over(self, op_id: str, raw: str, fingerprint: str) -> bool:
        """Own the id of a dead replica's call, if no other retry did first."""
        mine = json.dumps({"state": "running", "replica": self.replica, "fingerprint": fingerprint})
        try:
            taken = bool(await self._cas(keys=[self._key(op_id)], args=[raw, mine, self.ttl_ms]))
        except Exception as exc:
            log.warning("cannot take over operation %s in Redis (%s)", op_id[:12], exc)
            return False
        if taken:
            self._running[op_id] = mine
        return taken

    async def finish(self, op_id: str, fingerprint: str, result: dict[str, Any]) -> None:
        """Record the call's answer (what a retry with the id is given)."""
        record = json.dumps({"state": "done", "replica": self.replica, "fingerprint": fingerprint, "result": result})
        before = self._running.pop(op_id, "")
        try:
            await self._r.set(self._key(op_id), record, px=self.ttl_ms)
        except Exception as exc:
            log.warning("cannot store the answer of operation %s in Redis yet (%s)", op_id[:12], exc)
            self._keep(op_id, record, before)

    async def release(self, op_id: str) -> None:
        """Forget the id: nothing was sent upstream under it, so a retry may run it."""
        async with self._restoring:
            before = self._running.pop(op_id, "")
        try:
            await self._r.delete(self._key(op_id))
        except Exception as exc:
            log.warning("cannot release operation %s in Redis yet (%s)", op_id[:12], exc)
            if before:
                self._keep(op_id, "", before)

    def _keep(self, op_id: str, value: str, before: str) -> None:
        """A write for the next renewal to make (bounded: the oldest goes, its retry then finds what Redis has)."""
        self._pending[op_id] = (value, before)
        while len(self._pending) > MAX_PENDING:
            dropped = next(iter(self._pending))
            del self._pending[dropped]
            log.warning("dropped the unwritten record of operation %s: too many waiting for Redis", dropped[:12])

    @property
    def running(self) -> int:
        """Calls this replica runs under a recorded id (their records are written back when Redis loses them)."""
        return len(self._running)

    async def alive(self, replica: str) -> bool:
        """Whether `replica` renewed its lease lately (True when Redis cannot say: waiting is the safe side)."""
        if replica == self.replica:
            return True
        try:
            return bool(await self._r.exists(self._replicas + replica))
        except Exception:
            return True

    async def renew(self) -> None:
        """Renew the lease and write back, in one round trip, the records of this replica's calls Redis lacks."""
        live, settling = self._marks
        lease_ms = math.ceil(REPLICA_LEASE_S * 1000)
        async with self._restoring:
            running = list(self._running.items())
            pending = list(self._pending.items())
            pipe = self._r.pipeline(transaction=False)
            # EVAL, not EVALSHA: a Redis that restarted has forgotten the scripts, and this is when it matters.
            pipe.eval(_RENEW, 3, self._replicas + self.replica, live, settling, lease_ms, self.ttl_ms, self.settle_ms)
            for op_id, raw in running:
                pipe.eval(_RESTORE, 1, self._key(op_id), raw, "", self.ttl_ms)
            for op_id, (value, before) in pending:
                pipe.eval(_RESTORE, 1, self._key(op_id), value, before, self.ttl_ms)
            done = await pipe.execute()
        for op_id, write in pending:
            if self._pending.get(op_id) == write:
                del self._pending[op_id]
        restored = sum(int(n) for n in done[1 : 1 + len(running)])
        if restored:
            log.warning("wrote back the records of %d running operations Redis had lost", restored)

    async def keep_alive(self) -> None:
        """Renew this replica's lease (and write back its records) until cancelled (run for as long as the replica serves)."""
        failing = 0  # renewals failed in a row: said at the 1st, 10th, 100th... (once a second, 86,000 lines a day)
        while True:
            try:
                await self.renew()
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
