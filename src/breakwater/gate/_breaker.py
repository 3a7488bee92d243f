"""Circuit breakers, one per (server, tool) and one per server.

Written here rather than taken from PyPI on purpose: the four Python breaker libraries measured in
with a concurrent-probe test (pybreaker 1.4.1, aiobreaker 1.2.0, purgatory 3.0.1, circuitbreaker
2.1.3) let 50 of 50 concurrent callers through a "half-open" breaker, none measures a failure
*rate* or slow calls, and pybreaker serialises every call behind one lock. This breaker:

* trips on a failure rate over a sliding time window (with a minimum number of calls), on N
  consecutive failures, or on a separate slow-call rate (slow = longer than a threshold given per
  call, e.g. the tool's expected latency); or when its caller trips it (`trip`: the gate does
  when a tool that answers fast times out twice in a row, see `breakwater.gate._health`);
* stays open for a duration that doubles per consecutive re-open, with ±20 % jitter, capped;
* in half-open admits exactly one probe at a time, as a leased `Permit`; a probe that never reports
  back loses its lease so the breaker cannot wedge;
* ignores what breakwater itself refused: only a `Permit` can record, and a released permit records
  nothing (Envoy's rule: local overload protection never feeds back into upstream health).

Every transition happens in `CircuitBreaker._admit` and `CircuitBreaker._settle` over one plain
`_BreakerData` record, with an `epoch` that increases on every transition and is stamped on each
permit. A shared store (`breakwater.state._base`) plugs in as a `SharedBreaker`: the same two
steps then run atomically in the store (Lua scripts in Redis) with the epoch as the fencing token,
so a paused replica's stale permit cannot flip the state. While the store is unreachable the
breaker falls back to its own record, seeded from the last shared state it saw.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from breakwater._clock import Clock
from breakwater.config._policies import BreakerPolicy
from breakwater.gate._breaker_types import CLOSED, FAILURE, IGNORED, OPEN, BreakerKey, BreakerState, Outcome, Rejection
from breakwater.gate._window import BUCKETS as _BUCKETS
from breakwater.gate._window import Window as _Window

__all__ = [
    "BreakerKey",
    "BreakerRegistry",
    "BreakerSnapshot",
    "BreakerState",
    "BreakerStore",
    "CircuitBreaker",
    "Outcome",
    "Permit",
    "Rejection",
    "SharedBreaker",
    "SharedView",
]


@dataclass(slots=True)
class _BreakerData:
    """The whole state of one breaker: what a shared store would hold under one key."""

    window: _Window
    state: BreakerState = CLOSED
    #: Increases on every transition and every probe grant; permits from another epoch are stale.
    epoch: int = 0
    open_until: float = -math.inf
    consecutive_opens: int = 0
    consecutive_failures: int = 0
    probe_lease_until: float = -math.inf
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedView:
    """A shared breaker's state as this replica last saw it (times on the local monotonic line)."""

    state: BreakerState
    epoch: int
    open_until: float
    consecutive_opens: int
    consecutive_failures: int
    probe_lease_until: float
    reason: str
    calls: int = 0
    failures: int = 0
    slow: int = 0


class SharedBreaker(Protocol):
    """A breaker's state kept in a shared store (see `breakwater.state._base`).

    Each method returns None / False when the store cannot be used right now: the breaker then
    decides from its own record, so a store outage never fails or blocks a call.
    """

    def admit(self, now: float, lease_s: float) -> tuple[int, bool] | Rejection | None:
        """`(epoch, is_probe)` for a permit, a `Rejection`, or None (store unavailable)."""
        ...

    def settle(self, epoch: int, is_probe: bool, outcome: Outcome, slow: bool) -> bool:
        """Report a permit's outcome; False if the store cannot take it (settle locally instead)."""
        ...

    def view(self, now: float) -> SharedView | None:
        """The last shared state seen (whatever the store's health now), or None if none was ever seen."""
        ...

    def available(self) -> bool:
        """Whether the store can be used now."""
        ...

    def bind(self, breaker: CircuitBreaker) -> None:
        """The breaker this state belongs to (reports the store could not take go back to it)."""
        ...


class BreakerStore(Protocol):
    """What a `BreakerRegistry` needs from a state store."""

    def shared_breaker(self, name: str, policy: BreakerPolicy, rng: random.Random) -> SharedBreaker | None:
        """The shared state of breaker `name`, or None to keep it in the breaker."""
        ...


class Permit:
    """Leave to make one call. Report its outcome exactly once with `record()` (or `release()`).

    A permit from before a transition is stale: its report is dropped, so calls that were already
    in flight when the breaker opened neither re-open nor extend it.
    """

    __slots__ = ("_breaker", "_done", "epoch", "is_probe", "shared", "slow_threshold_s")

    def __init__(
        self,
        breaker: CircuitBreaker,
        epoch: int,
        is_probe: bool,
        slow_threshold_s: float | None,
        shared: bool = False,
    ) -> None:
        # Positional parameters: two permits are made per attempt, and keywords are matched by name.
        self._breaker = breaker
        self._done = False
        self.epoch = epoch
        #: True for the single half-open trial call.
        self.is_probe = is_probe
        self.slow_threshold_s = slow_threshold_s
        #: Issued from the shared store's state (its epoch is the store's).
        self.shared = shared

    def record(self, outcome: Outcome, duration_s: float) -> bool | None:
        """Report how the call went and how long it took (later reports are ignored): whether it
        opened the breaker, or None when a shared store took it (compare `state` before and after)."""
        if self._done:
            return False
        self._done = True
        return self._breaker._settle(self, outcome, duration_s)

    def release(self) -> None:
        """Give the permit back without a verdict (the call was never sent, or was cancelled)."""
        if not self.is_probe and not self.shared and self._breaker._shared is None:
            # A closed breaker's permit given back changes nothing (an older one is stale): no lock.
            self._done = True
            return
        self.record(IGNORED, 0.0)

    def __repr__(self) -> str:
        return f"Permit(epoch={self.epoch}, is_probe={self.is_probe}, shared={self.shared}, done={self._done})"


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerSnapshot:
    """A breaker's state for `status` and metrics."""

    name: str
    #: Whose breaker this is (`name` parsed, never guessed).
    key: BreakerKey
    state: BreakerState
    calls_in_window: int
    failures_in_window: int
    slow_in_window: int
    failure_rate: float
    slow_call_rate: float
    consecutive_failures: int
    consecutive_opens: int
    #: Monotonic time the open period ends (None unless open).
    open_until: float | None
    #: The same instant as wall-clock epoch seconds, for people and scripts.
    open_until_wall: float | None
    retry_after_s: float
    probe_in_flight: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "state": self.state.value,
            "calls_in_window": self.calls_in_window,
            "failures_in_window": self.failures_in_window,
            "slow_in_window": self.slow_in_window,
            "failure_rate": round(self.failure_rate, 4),
            "slow_call_rate": round(self.slow_call_rate, 4),
            "consecutive_failures": self.consecutive_failures,
            "consecutive_opens": self.consecutive_opens,
            "open_until": self.open_until_wall,
            "retry_after_s": round(self.retry_after_s, 3),
            "probe_in_flight": self.probe_in_flight,
            "reason": self.reason,
        }


class CircuitBreaker:
    """One breaker. `acquire()` before a call, `permit.record()` after it; all time from `clock`."""

    def __init__(
        self,
        name: str,
        policy: BreakerPolicy | None = None,
        *,
        clock: Clock,
        rng: random.Random | None = None,
        key: BreakerKey | None = None,
    ) -> None:
        """`key` says whose breaker it is (default: a server breaker named `name`)."""
        self.name = name
        self.key = key if key is not None else BreakerKey(name)
        self.policy = policy or BreakerPolicy()
        self._clock = clock
        self._rng = rng or random.Random()
        self._data = _BreakerData(window=_Window(self.policy.window_s / _BUCKETS))
        # Held only around the few lines of a transition, never across a call: the breaker adds no
        # serialisation (pybreaker holds its lock around the guarded call). Needed only if a breaker
        # is shared across threads; uncontended it costs tens of nanoseconds.
        self._lock = threading.Lock()
        self._shared: SharedBreaker | None = None
        #: Its state lives in this process only (no shared store attached): `Permit.record` says whether it
        #: opened it. An attribute `attach` keeps, not a property: the journal reads it on every attempt.
        self.in_process = True
        # Whether the last decision came from the shared store (so a fallback must seed _data first).
        self._use_shared = False

    # -- public -------------------------------------------------------------------------------

    def acquire(self, slow_threshold_s: float | None = None, lease_s: float | None = None) -> Permit | Rejection:
        """A permit to make one call, or a rejection if the breaker is open (the gate passes both by position).

        `slow_threshold_s`: a call longer than this counts as slow (None: never slow).
        `lease_s`: how long a half-open probe may stay out before another is allowed (default: the
        policy's `probe_lease_s`); pass the call's own deadline so a probe outlives its timeout.
        """
        if self._shared is None:
            d = self._data
            # The usual case, decided without the clock or the lock: the epoch is read before the
            # state, so the permit is of this closed period, or stale (its report then dropped).
            epoch = d.epoch
            if d.state is CLOSED:
                return Permit(self, epoch, False, slow_threshold_s)
        lease = lease_s or self.policy.probe_lease_s
        with self._lock:
            if self._shared is None:
                return self._admit(self._clock.monotonic(), slow_threshold_s, lease)
            now = self._clock.monotonic()
            if self._shared is not None:
                got = self._shared.admit(now, lease)
                if got is not None:
                    self._use_shared = True
                    if isinstance(got, Rejection):
                        return got
                    epoch, is_probe = got
                    return Permit(self, epoch, is_probe=is_probe, slow_threshold_s=slow_threshold_s, shared=True)
                self._go_local(now)
            return self._admit(now, slow_threshold_s, lease)

    def trip(self, reason: str) -> bool:
        """Open a closed breaker now, on evidence only its caller has (a tool turned slow); False if it was not closed.

        In-process breakers only: a breaker kept in a shared store goes by the store's rules.
        """
        with self._lock:
            if self._shared is not None or self._data.state is not CLOSED:
                return False
            self._data.reason = reason
            self._move(OPEN, self._clock.monotonic())
            return True

    def attach(self, shared: SharedBreaker | None) -> None:
        """Keep this breaker's state in a shared store from now on (None: in this process)."""
        with self._lock:
            self._shared = shared
            self.in_process = shared is None
            self._use_shared = False
        if shared is not None:
            shared.bind(self)

    def _go_local(self, now: float) -> None:
        """The store is unavailable: continue from the last shared state seen (called under the lock)."""
        if not self._use_shared or self._shared is None:
            return
        self._use_shared = False
        view = self._shared.view(now)
        if view is None:
            return
        d = self._data
        # Keep the store's epoch so permits issued from it still settle here; an open breaker
        # stays open and a probe elsewhere still counts: an outage must not close (or open) anything.
        d.epoch = view.epoch
        d.state = view.state
        d.open_until = view.open_until if view.state is OPEN else -math.inf
        d.consecutive_opens = view.consecutive_opens
        d.consecutive_failures = view.consecutive_failures
        d.probe_lease_until = view.probe_lease_until if view.state is BreakerState.HALF_OPEN else -math.inf
        d.reason = view.reason
        d.window.clear()

    @property
    def state(self) -> BreakerState:
        """The state a caller would meet now (OPEN past its end reads as HALF_OPEN).

        Cheaper than `snapshot().state`: the call path (and the journal) reads it on every call, and
        the window totals a snapshot computes are not needed for it.
        """
        if self._shared is not None:
            return self.snapshot().state
        d = self._data
        if d.state is CLOSED:  # whatever the time (the journal reads both breakers per attempt)
            return CLOSED
        with self._lock:
            if d.state is OPEN and d.open_until <= self._clock.monotonic():
                return BreakerState.HALF_OPEN
            return d.state

    def admits_freely(self) -> bool:
        """In-process and closed: `acquire` would give an ordinary permit, and giving it back unused changes nothing."""
        return self._shared is None and self._data.state is CLOSED

    def rejection(self) -> Rejection | None:
        """The refusal `acquire` would give now, taking nothing (no permit, no transition), or None if it would admit.

        None too when only the shared store could say (a breaker this replica has not seen yet, or the
        store is unreachable). The gate asks before checking a call's arguments: a call an open
        breaker refuses is refused as such, at the cost of this read alone.
        """
        shared = self._shared
        if shared is None:
            d = self._data
            if d.state is CLOSED:  # the usual case, decided without the clock or the lock
                return None
            with self._lock:
                return _refusal(d.state, d.open_until, d.probe_lease_until, d.reason, self._clock.monotonic(), self.policy)
        now = self._clock.monotonic()
        v = shared.view(now) if shared.available() else None
        return None if v is None else _refusal(v.state, v.open_until, v.probe_lease_until, v.reason, now, self.policy)

    def snapshot(self) -> BreakerSnapshot:
        """A consistent copy of the breaker's state."""
        with self._lock:
            now = self._clock.monotonic()
            if self._shared is not None:
                view = self._shared.view(now) if self._shared.available() else None
                if view is not None:
                    return self._snapshot_of(view, now)
                self._go_local(now)
            d = self._data
            calls, failures, slow = d.window.totals(now)
            local = SharedView(
                state=d.state,
                epoch=d.epoch,
                open_until=d.open_until,
                consecutive_opens=d.consecutive_opens,
                consecutive_failures=d.consecutive_failures,
                probe_lease_until=d.probe_lease_until,
                reason=d.reason,
                calls=calls,
                failures=failures,
                slow=slow,
            )
            return self._snapshot_of(local, now)

    def _snapshot_of(self, v: SharedView, now: float) -> BreakerSnapshot:
        # One reading of the state for both homes: the local record is put in the shared view's shape.
        state = v.state
        retry_after = 0.0
        probe_in_flight = False
        if state is OPEN:
            retry_after = max(0.0, v.open_until - now)
            if retry_after == 0.0:
                state = BreakerState.HALF_OPEN
        elif state is BreakerState.HALF_OPEN:
            probe_in_flight = v.probe_lease_until > now
            retry_after = _half_open_wait(v.probe_lease_until, now, self.policy) if probe_in_flight else 0.0
        is_open = v.state is OPEN
        return BreakerSnapshot(
            name=self.name,
            key=self.key,
            state=state,
            calls_in_window=v.calls,
            failures_in_window=v.failures,
            slow_in_window=v.slow,
            failure_rate=v.failures / v.calls if v.calls else 0.0,
            slow_call_rate=v.slow / v.calls if v.calls else 0.0,
            consecutive_failures=v.consecutive_failures,
            consecutive_opens=v.consecutive_opens,
            open_until=v.open_until if is_open else None,
            open_until_wall=self._clock.time() + (v.open_until - now) if is_open else None,
            retry_after_s=retry_after,
            probe_in_flight=probe_in_flight,
            reason=v.reason,
        )

    # -- transitions: the only code that changes _data ---------------------------------------

    def _admit(self, now: float, slow_threshold_s: float | None, lease_s: float) -> Permit | Rejection:
        d = self._data
        if d.state is CLOSED:
            return Permit(self, d.epoch, is_probe=False, slow_threshold_s=slow_threshold_s)
        refused = _refusal(d.state, d.open_until, d.probe_lease_until, d.reason, now, self.policy)
        if refused is not None:
            return refused
        if d.state is OPEN:  # its time is up
            self._move(BreakerState.HALF_OPEN, now)
        # HALF_OPEN with no probe out: one probe holds the lease; a new epoch per grant fences off a
        # probe whose lease ran out, so only the latest probe's report can decide.
        d.epoch += 1
        d.probe_lease_until = now + lease_s
        return Permit(self, d.epoch, is_probe=True, slow_threshold_s=slow_threshold_s)

    def _settle(self, permit: Permit, outcome: Outcome, duration_s: float) -> bool | None:
        slow = outcome is not IGNORED and permit.slow_threshold_s is not None and duration_s > permit.slow_threshold_s
        lock = self._lock
        lock.acquire()  # not `with`: a third of the cost of taking the lock, twice per call
        try:
            if permit.shared and self._shared is not None and self._shared.settle(permit.epoch, permit.is_probe, outcome, slow):
                return None
            d = self._data
            if self._use_shared or d.state is not CLOSED or outcome is IGNORED or permit.epoch != d.epoch:
                return self._settle_local(permit.epoch, outcome, slow)
            # `_settle_local`'s closed-breaker branch inlined, and `_trip_reason` asked only once one of
            # its thresholds is met: every answer settles two breakers this way (bench/gate_instructions.py).
            now = self._clock.monotonic()
            failed = outcome is FAILURE
            w = d.window
            w.add(now, failed, slow)
            d.consecutive_failures = d.consecutive_failures + 1 if failed else 0
            p, calls = self.policy, w.calls
            if d.consecutive_failures < p.consecutive_failures and (
                calls < p.minimum_calls or (w.failures / calls < p.failure_rate and w.slow / calls < p.slow_call_rate)
            ):
                return False
            d.reason = self._trip_reason(now)
            self._move(OPEN, now)
            return True
        finally:
            lock.release()

    def settle_lost(self, epoch: int, outcome: Outcome, slow: bool) -> None:
        """A shared report the store could not take after all: apply it to the local state (store degraded)."""
        with self._lock:
            self._settle_local(epoch, outcome, slow)

    def _settle_local(self, epoch: int, outcome: Outcome, slow: bool) -> bool:
        """Apply one outcome to the local record (called under the lock); True if it opened the breaker."""
        now = self._clock.monotonic()
        if self._use_shared:
            self._go_local(now)
        d = self._data
        if epoch != d.epoch:
            return False  # stale: the breaker moved on since this permit was issued
        if d.state is BreakerState.HALF_OPEN:
            if outcome is IGNORED:
                d.probe_lease_until = -math.inf  # free the slot for the next caller's probe
            elif outcome is Outcome.SUCCESS and not slow:
                self._move(CLOSED, now)
            else:
                d.reason = "probe was slow" if outcome is Outcome.SUCCESS else "probe failed"
                self._move(OPEN, now)
                return True
            return False
        if d.state is not CLOSED or outcome is IGNORED:
            return False
        failed = outcome is FAILURE
        d.window.add(now, failed, slow)
        d.consecutive_failures = d.consecutive_failures + 1 if failed else 0
        reason = self._trip_reason(now)
        if reason:
            d.reason = reason
            self._move(OPEN, now)
            return True
        return False

    def _trip_reason(self, now: float) -> str:
        # Called right after `window.add(now, …)`, which dropped what fell out of the window: its totals are current.
        p, d = self.policy, self._data
        if d.consecutive_failures >= p.consecutive_failures:
            return f"{d.consecutive_failures} consecutive failures"
        w = d.window
        calls, failures, slow = w.calls, w.failures, w.slow
        if calls >= p.minimum_calls:
            if failures / calls >= p.failure_rate:
                return f"{failures} of {calls} calls failed in {p.window_s:g} s"
            if slow / calls >= p.slow_call_rate:
                return f"{slow} of {calls} calls were slow in {p.window_s:g} s"
        return ""

    def _move(self, state: BreakerState, now: float) -> None:
        d = self._data
        d.epoch += 1
        d.state = state
        d.probe_lease_until = -math.inf
        if state is OPEN:
            d.consecutive_opens += 1
            d.open_until = now + self._open_duration(d.consecutive_opens)
        elif state is CLOSED:
            # A fresh start: the evidence that tripped the breaker is history.
            d.consecutive_opens = 0
            d.consecutive_failures = 0
            d.open_until = -math.inf
            d.reason = ""
            d.window.clear()

    def _open_duration(self, opens: int) -> float:
        p = self.policy
        base = p.open_max_s if opens > 64 else min(p.open_max_s, p.open_base_s * 2.0 ** (opens - 1))
        jittered = base * self._rng.uniform(1.0 - p.open_jitter, 1.0 + p.open_jitter)
        # Clamp after jitter: at the cap the spread is [cap·(1−j), cap], never above the cap.
        return min(p.open_max_s, jittered)


def _refusal(
    state: BreakerState, open_until: float, lease_until: float, reason: str, now: float, policy: BreakerPolicy
) -> Rejection | None:
    """The refusal a breaker in this state gives a call at `now`, or None if it admits one (closed, or due a probe)."""
    if state is OPEN:
        # `Rejection(...)` without its `__new__`, a Python frame (each refusal of an open breaker makes one).
        return _tuple_new(Rejection, (open_until - now, state, reason)) if now < open_until else None
    if state is BreakerState.HALF_OPEN and lease_until > now:
        return Rejection(_half_open_wait(lease_until, now, policy), state, reason)
    return None


_tuple_new = tuple.__new__


def _half_open_wait(lease_until: float, now: float, policy: BreakerPolicy) -> float:
    # The probe usually answers long before its lease ends; suggest the shorter of the two.
    return max(0.0, min(lease_until - now, policy.open_base_s))


class BreakerRegistry:
    """The breakers of one process: one per server and one per (server, tool), created on first use."""

    def __init__(
        self,
        *,
        clock: Clock,
        rng: random.Random | None = None,
        policy: BreakerPolicy | None = None,
        policy_for: Callable[[str, str | None], BreakerPolicy] | None = None,
        store: BreakerStore | None = None,
    ) -> None:
        """`policy_for(server, tool)` (tool None for the server breaker) overrides `policy` per key;
        `store` (see `breakwater.state._base`) shares the breakers' state with other replicas."""
        self._clock = clock
        self._rng = rng or random.Random()
        self._policy = policy or BreakerPolicy()
        self._policy_for = policy_for
        self._store = store
        self._breakers: dict[BreakerKey, CircuitBreaker] = {}

    def attach_store(self, store: BreakerStore | None) -> None:
        """Keep every breaker's state (those made so far and those to come) in `store` (None: in this process)."""
        self._store = store
        for breaker in self:
            breaker.attach(None if store is None else store.shared_breaker(breaker.name, breaker.policy, self._rng))

    def _get(self, server: str, tool: str | None) -> CircuitBreaker:
        key = BreakerKey(server, tool)
        breaker = self._breakers.get(key)
        if breaker is None:
            policy = self._policy_for(server, tool) if self._policy_for else self._policy
            breaker = CircuitBreaker(key.name, policy, clock=self._clock, rng=self._rng, key=key)
            if self._store is not None:
                breaker.attach(self._store.shared_breaker(key.name, policy, self._rng))
            self._breakers[key] = breaker
        return breaker

    def server(self, server: str) -> CircuitBreaker:
        """The per-server breaker."""
        return self._get(server, None)

    def tool(self, server: str, tool: str) -> CircuitBreaker:
        """The per-(server, tool) breaker."""
        return self._get(server, tool)

    def __iter__(self) -> Iterator[CircuitBreaker]:
        return iter(list(self._breakers.values()))

    def snapshots(self) -> list[BreakerSnapshot]:
        """Snapshots of every breaker created so far, by name."""
        return sorted((b.snapshot() for b in self), key=lambda s: s.name)
