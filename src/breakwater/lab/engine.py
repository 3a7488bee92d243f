"""The discrete-event core: replicas, load balancer, clients, streams and deploys, event by event.

One event order, `(time_ms, phase, seq)`: a heap, plus FIFOs for event kinds that are created
already in that order (arrivals, fresh idle timers, resumes), each with only its head in the heap.
Handlers never iterate an unordered container: replicas are a list, running attempts an
insertion-ordered dict, queues deques, so the same config and traffic give the same run in every
process. The speed-ups are described in docs/lab.md ("Performance"); they must keep every output
bit-for-bit (tests/lab/test_golden.py).

Idle cuts use one lazy timer per connection: the timer fires at `last + T`; if a byte arrived since,
it re-arms itself at the new `last + T`. A byte at exactly `last + T` is a work event (phase 3) and
runs after the deadline (phase 2), so it is too late, as the tie rule demands.
"""

from __future__ import annotations

import functools
import gc
import itertools
from collections import deque
from collections.abc import Sequence
from heapq import heappop as _heappop
from heapq import heappush as _heappush
from operator import itemgetter
from typing import Any, Final

from breakwater.lab.config import (
    DEPLOY_START_MS,
    HARD_STOP_MS,
    MAX_REISSUES,
    REBOOT_MS,
    RECONNECT_DELAY_MS,
    REISSUE_DELAY_MS,
    SLOTS,
    WINDOW_MS,
    LabConfig,
)
from breakwater.lab.metrics import (
    BUCKET_MS,
    LabResult,
    LatencyHistogram,
    LogRecord,
    Metrics,
    Series,
    nearest_rank,
)
from breakwater.lab.traffic import CallSpec, generate_traffic, route_key, route_u

__all__ = ["run", "simulate"]

# Phases, lowest first at equal timestamps.
P_LIFECYCLE: Final = 1
P_DEADLINE: Final = 2
P_WORK: Final = 3
P_CLIENT: Final = 4
P_REFILL: Final = 5

# Event kinds (indices into the handler table). `_CUT` is an idle timer armed when its stream
# opens or resumes (always `now + T`); `_RECUT` is one re-armed later (at `last byte + T`, which
# can be earlier than timers armed since). The two cut kinds come first so the run loop tells them
# apart from the rest with one comparison.
_CUT, _RECUT, _RESUME, _ARRIVE, _SEND, _KILL, _DRAIN, _REBOOT, _MUTATE, _PROGRESS, _FINISH, _REFILL = range(12)

# Replica states, as in `REPLICA_STATES`.
UP: Final = 0
DRAINING: Final = 1
DOWN: Final = 2

# Attempt states.
QUEUED: Final = 0
RUNNING: Final = 1
FINISHED: Final = 2
CANCELLED: Final = 3
KILLED: Final = 4

# Call statuses.
PENDING: Final = 0
OK: Final = 1
FAILED: Final = 2

# Hop kinds for the counter-based routing hash.
HOP_INIT: Final = 0
HOP_POST: Final = 1
HOP_RESUME: Final = 2

MAX_ATTEMPTS: Final = 1 + MAX_REISSUES


class _Call:
    __slots__ = (
        "applied",
        "arrival",
        "attempts_used",
        "client",
        "commits",
        "completion",
        "duration",
        "id",
        "init_hops",
        "max_silence",
        "mut_at",
        "progress",
        "resume_hops",
        "status",
    )

    def __init__(self, spec: CallSpec, slow_tools: bool) -> None:
        self.id = spec.id
        self.client = spec.client
        self.arrival = spec.arrival_ms
        if spec.is_slow(slow_tools):
            self.duration = duration = spec.slow_duration_ms
            self.progress = spec.progress_offsets_ms(slow_tools)
            # Longest byte-free stretch of an execution that starts at once: decides whether a
            # stream opened on an idle replica can ever be cut.
            marks = (0, *self.progress, duration)
            self.max_silence = max(b - a for a, b in itertools.pairwise(marks))
        else:
            # No progress bytes: the whole execution is one silent stretch (the common case,
            # kept free of the generic computation above).
            self.duration = duration = spec.base_duration_ms
            self.progress = ()
            self.max_silence = duration
        # Offset of the side effect from execution start, or -1 for a read-only call.
        self.mut_at = round(spec.mut_frac * duration) if spec.mutating else -1
        self.attempts_used = 0
        self.status = PENDING
        self.commits = 0
        self.applied = False
        self.completion = -1
        self.init_hops = 0
        self.resume_hops = 0


class _Session:
    __slots__ = ("epoch", "home", "sid")

    def __init__(self, sid: int, home: int, epoch: int) -> None:
        self.sid = sid
        self.home = home
        self.epoch = epoch


class _Attempt:
    __slots__ = (
        "call",
        "conn",
        "connected",
        "delivered",
        "end",
        "final_emitted",
        "last",
        "no",
        "rep",
        "replica",
        "session",
        "start",
        "state",
    )

    def __init__(self, call: _Call, rep: _Replica, session: _Session | None, now: int) -> None:
        self.call = call
        self.no = call.attempts_used
        # The replica object saves an index lookup in every handler; the index goes in the log.
        self.rep = rep
        self.replica = rep.index
        self.session = session
        self.state = QUEUED
        self.connected = True
        self.last = now
        self.conn = 0
        self.final_emitted = False
        self.delivered = False
        self.start = -1
        self.end = -1


class _Replica:
    __slots__ = ("busy_ms", "epoch", "index", "last_change", "peak_queue", "queue", "refill_pending", "running", "state")

    def __init__(self, index: int) -> None:
        self.index = index
        self.state = UP
        # Running attempts in start order (a dict: ordered, with O(1) removal).
        self.running: dict[_Attempt, None] = {}
        self.queue: deque[_Attempt] = deque()
        self.epoch = 0
        self.busy_ms = 0
        self.last_change = 0
        self.peak_queue = 0
        self.refill_pending = False


def _busy_change(rep: _Replica, t: int) -> None:
    # Integrate busy slots over [0, WINDOW] only (utilisation's definition); call before the number
    # of running attempts changes. Once `last_change` has passed the window this adds nothing, so
    # hot callers skip the call then.
    hi = t if t < WINDOW_MS else WINDOW_MS
    lo = rep.last_change if rep.last_change < WINDOW_MS else WINDOW_MS
    rep.busy_ms += len(rep.running) * (hi - lo)
    rep.last_change = t


_Event = tuple[int, int, int, int, Any, int]
"""`(time_ms, phase, seq, kind, subject, arg)`: seqs are unique, so tuples never compare beyond them."""


class _Sim:
    """One run. Not reusable: build, `run()`, read the result.

    Performance notes (docs/lab.md, "Performance"): a run is one Python loop over up to a million
    events, so the state lives in slots, hot handlers bind what they use to locals, sequence
    numbers come from a C counter, and the idle-cut/resume cycle (most events of a loaded run) is
    handled inside the loop without a method call. Any change must keep results bit-for-bit.
    """

    __slots__ = (
        "T",
        "attempts",
        "c_404",
        "c_cuts",
        "c_done",
        "c_dups",
        "c_failures",
        "c_kills",
        "c_reissues",
        "calls",
        "cancellations",
        "cfg",
        "cut_fifo",
        "cuts_on",
        "dedup_hits",
        "deploy_end",
        "hard_stop",
        "heap",
        "held",
        "idem",
        "log",
        "n",
        "next_sample",
        "next_seq",
        "pending",
        "phase",
        "pins",
        "reinits",
        "replicas",
        "resume_fifo",
        "resumes_failed",
        "resumes_ok",
        "rkey",
        "routable",
        "rr",
        "s_busy",
        "s_in_flight",
        "s_queue",
        "s_state",
        "sessions",
        "sessions_created",
        "shared",
        "sid",
        "stateless",
    )

    def __init__(self, config: LabConfig, calls: Sequence[CallSpec], hard_stop_ms: int) -> None:
        self.hard_stop = hard_stop_ms
        n_buckets = hard_stop_ms // BUCKET_MS + 1
        self.cfg = config
        self.n = config.replicas
        self.stateless = config.mode == "2026-07-28"
        self.shared = config.mode == "2025-11-25/shared"
        self.rr = config.routing == "round_robin"
        self.idem = config.idempotency
        # Keep-alive below T means no stream is ever cut (each ping resets the idle timer), so no idle timers are armed at all;
        # K >= T never matters, so it runs exactly like K = off.
        self.cuts_on = not config.keepalive_effective
        self.T = config.idle_timeout_s * 1000
        self.rkey = route_key(config.seed)
        slow_tools = config.slow_tools
        self.calls = [_Call(spec, slow_tools) for spec in calls]
        self.replicas = [_Replica(i) for i in range(self.n)]
        # Updated in place (handlers hold references to it).
        self.routable: list[int] = list(range(self.n))
        self.sessions: dict[int, _Session | None] = {}
        self.pins: dict[int, int] = {}
        self.held: list[tuple[int, _Call | _Attempt]] = []
        self.attempts: list[_Attempt] = []
        self.heap: list[_Event] = []
        self.cut_fifo: deque[_Event] = deque()
        self.resume_fifo: deque[_Event] = deque()
        # Arrivals own seqs 1..len(calls); every other event takes the next number.
        self.next_seq = itertools.count(len(self.calls) + 1).__next__
        self.sid = 0
        self.pending = 0
        self.phase = 0
        self.log: list[LogRecord] = []
        self.deploy_end: int | None = None
        # Counters. Stream cuts, 404s, kills and resume attempts are sums of the per-bucket
        # counters below, so the hot paths count them once.
        self.dedup_hits = 0
        self.reinits = 0
        self.sessions_created = 0
        self.resumes_ok = 0
        self.resumes_failed = 0
        self.cancellations = 0
        # Series.
        self.next_sample = 0
        self.s_in_flight: list[int] = []
        self.s_busy: list[list[int]] = [[] for _ in range(self.n)]
        self.s_queue: list[list[int]] = [[] for _ in range(self.n)]
        self.s_state: list[list[int]] = [[] for _ in range(self.n)]
        self.c_cuts = [0] * n_buckets
        self.c_404 = [0] * n_buckets
        self.c_kills = [0] * n_buckets
        self.c_reissues = [0] * n_buckets
        self.c_failures = [0] * n_buckets
        self.c_dups = [0] * n_buckets
        self.c_done = [0] * n_buckets

    # -- plumbing ------------------------------------------------------------------------------

    def sample(self, t: int) -> int:
        """Record the gauges at the start of every bucket up to t; return the next sample time.

        Called before any event at or after those instants, so all the buckets it fills at once
        share one value per gauge: they are appended as a batch.
        """
        nxt = self.next_sample
        if nxt > t:
            return nxt
        k = (t - nxt) // BUCKET_MS + 1
        if k == 1:
            self.s_in_flight.append(self.pending)
            for rep in self.replicas:
                i = rep.index
                self.s_busy[i].append(len(rep.running))
                self.s_queue[i].append(len(rep.queue))
                self.s_state[i].append(rep.state)
        else:
            self.s_in_flight.extend([self.pending] * k)
            for rep in self.replicas:
                i = rep.index
                self.s_busy[i].extend([len(rep.running)] * k)
                self.s_queue[i].extend([len(rep.queue)] * k)
                self.s_state[i].extend([rep.state] * k)
        self.next_sample = nxt = nxt + k * BUCKET_MS
        return nxt

    def set_state(self, rep: _Replica, state: int) -> None:
        rep.state = state
        self.routable[:] = [r.index for r in self.replicas if r.state == UP]

    # Fresh idle timers are all due `T` after the instant they are armed, and resumes
    # `RECONNECT_DELAY_MS` after theirs; as the clock never goes back, each kind arrives already in
    # queue order (time, phase, seq). So each waits in a FIFO and only its head sits in the heap:
    # in a loaded run these are most pending events, and the heap stays short. The run loop
    # advances a FIFO when its head pops.

    def arm_cut(self, a: _Attempt, due: int, conn: int) -> None:
        event = (due, P_DEADLINE, self.next_seq(), _CUT, a, conn)
        if not self.cut_fifo:
            _heappush(self.heap, event)
        self.cut_fifo.append(event)

    def schedule_resume(self, a: _Attempt, due: int) -> None:
        event = (due, P_CLIENT, self.next_seq(), _RESUME, a, 0)
        if not self.resume_fifo:
            _heappush(self.heap, event)
        self.resume_fifo.append(event)

    def want_refill(self, rep: _Replica, t: int) -> None:
        if not rep.refill_pending and rep.queue and len(rep.running) < SLOTS:
            rep.refill_pending = True
            _heappush(self.heap, (t, P_REFILL, self.next_seq(), _REFILL, rep, 0))

    # -- load balancer -------------------------------------------------------------------------

    def route(self, call: _Call, no: int, hop_kind: int, hop_index: int, t: int) -> int:
        """Pick a routable replica; the caller has checked that one exists."""
        routable = self.routable
        if self.rr:
            u = route_u(self.rkey, call.id, no, hop_kind, hop_index)
            return routable[int(u * len(routable))]
        client = call.client
        pin = self.pins.get(client)
        if pin is not None and self.replicas[pin].state == UP:
            return pin
        if pin is None and self.replicas[client % self.n].state == UP:
            new = client % self.n
        else:
            reps = self.replicas
            new = min(routable, key=lambda i: (len(reps[i].running) + len(reps[i].queue), i))
        self.pins[client] = new
        self.log.append(
            (t, self.phase, "pin", call.id, None, new, f"client {client}: {pin if pin is not None else '-'} -> {new}")
        )
        return new

    # -- sessions (2025-11-25) -----------------------------------------------------------------

    def initialize(self, call: _Call, no: int, reinit: bool, t: int) -> None:
        r = self.route(call, no, HOP_INIT, call.init_hops, t)
        call.init_hops += 1
        self.sid += 1
        self.sessions[call.client] = _Session(self.sid, r, self.replicas[r].epoch)
        self.sessions_created += 1
        if reinit:
            self.reinits += 1
        self.log.append((t, self.phase, "reinit" if reinit else "init", call.id, None, r, self.sid))

    # -- client side -------------------------------------------------------------------------

    def send(self, call: _Call, t: int) -> None:
        if call.status != PENDING:
            return
        if call.attempts_used == MAX_ATTEMPTS:
            call.status = FAILED
            self.pending -= 1
            self.c_failures[t // BUCKET_MS] += 1
            self.log.append((t, self.phase, "fail", call.id, None, None, None))
            return
        call.attempts_used += 1
        if call.attempts_used > 1:
            self.c_reissues[t // BUCKET_MS] += 1
        self.post(call, t)

    def post(self, call: _Call, t: int) -> None:
        if not self.routable:
            # Only with N = 1 during a deploy: the proxy holds the request, with no idle clock.
            self.held.append((_SEND, call))
            self.log.append((t, self.phase, "hold", call.id, None, None, "post"))
            return
        no = call.attempts_used
        phase = self.phase
        log_append = self.log.append
        replicas = self.replicas
        session: _Session | None = None
        stateful = not self.stateless
        if stateful:
            session = self.sessions.get(call.client)
            if session is None:
                self.initialize(call, no, False, t)
                session = self.sessions[call.client]
        if self.rr:
            r = self.route(call, no, HOP_POST, 0, t)
        else:
            # Affinity's common case inline: the pin stands and its replica is up.
            r = self.pins.get(call.client, -1)
            if r < 0 or replicas[r].state != UP:
                r = self.route(call, no, HOP_POST, 0, t)
        log_append((t, phase, "post", call.id, None, r, no))
        rep = replicas[r]
        if stateful and not self.shared and (session is None or session.home != r or rep.epoch != session.epoch):
            self.c_404[t // BUCKET_MS] += 1
            log_append((t, phase, "404", call.id, None, r, "post"))
            self.initialize(call, no, True, t)
            self.send(call, t)
            return
        # Accept: the attempt joins the replica's queue.
        a = _Attempt(call, rep, session, t)
        self.attempts.append(a)
        queue = rep.queue
        queue.append(a)
        depth = len(queue)
        log_append((t, phase, "accept", call.id, no, r, depth))
        if depth > rep.peak_queue:
            rep.peak_queue = depth
        # Stream open is a byte (priming event or headers); queued time is silent time. An attempt
        # that starts at this very instant and is never silent for T needs no idle timer: skipping
        # it only saves a no-op event.
        idle_now = len(rep.running) < SLOTS
        if self.cuts_on and not (depth == 1 and idle_now and call.max_silence < self.T):
            self.arm_cut(a, t + self.T, 0)
        if idle_now and not rep.refill_pending:
            rep.refill_pending = True
            _heappush(self.heap, (t, P_REFILL, self.next_seq(), _REFILL, rep, 0))

    def deliver(self, a: _Attempt, t: int) -> None:
        a.delivered = True
        a.connected = False
        call = a.call
        if call.status == PENDING:
            call.status = OK
            call.completion = t
            self.pending -= 1
            self.c_done[t // BUCKET_MS] += 1
            self.log.append((t, self.phase, "deliver", call.id, a.no, a.replica, t - call.arrival))

    def orphan_and_resend(self, a: _Attempt, t: int) -> None:
        self.log.append((t, self.phase, "orphan", a.call.id, a.no, a.replica, None))
        self.send(a.call, t)

    # -- event handlers ------------------------------------------------------------------------

    def on_arrive(self, t: int, call: Any, _: int) -> None:
        self.pending += 1
        self.log.append((t, P_CLIENT, "arrive", call.id, None, None, call.client))
        self.send(call, t)

    def on_send(self, t: int, call: Any, _: int) -> None:
        self.send(call, t)

    def on_resume(self, t: int, a: Any, _: int) -> None:
        call = a.call
        if call.status != PENDING:
            return
        phase = self.phase
        log = self.log
        routable = self.routable
        if not routable:
            self.held.append((_RESUME, a))
            log.append((t, phase, "hold", call.id, a.no, None, "resume"))
            return
        no = a.no
        if self.rr:
            r = routable[int(route_u(self.rkey, call.id, no, HOP_RESUME, call.resume_hops) * len(routable))]
        else:
            # Affinity's common case inline: the pin stands and its replica is up.
            r = self.pins.get(call.client, -1)
            if r < 0 or self.replicas[r].state != UP:
                r = self.route(call, no, HOP_RESUME, call.resume_hops, t)
        call.resume_hops += 1
        log.append((t, phase, "resume", call.id, no, r, None))
        session = a.session
        if not (self.shared or (session.home == r and self.replicas[r].epoch == session.epoch)):
            self.c_404[t // BUCKET_MS] += 1
            self.resumes_failed += 1
            log.append((t, phase, "404", call.id, no, r, "resume"))
            current = self.sessions.get(call.client)
            # Re-initialize only if no other call has done so since this stream's session.
            if current is not None and session is not None and current.sid == session.sid:
                self.initialize(call, no, True, t)
            self.orphan_and_resend(a, t)
            return
        if a.state == KILLED:
            # The producer is dead: a shared buffer cannot bring back the final response.
            self.resumes_failed += 1
            log.append((t, phase, "resume_failed", call.id, no, r, "killed"))
            self.orphan_and_resend(a, t)
            return
        self.resumes_ok += 1
        a.connected = True
        a.last = t
        a.conn += 1
        log.append((t, phase, "resume_ok", call.id, no, r, None))
        if a.final_emitted:
            self.deliver(a, t)
        elif self.cuts_on:
            self.arm_cut(a, t + self.T, a.conn)

    def on_cut(self, t: int, a: Any, conn: int) -> None:
        # The general path; the run loop handles stale timers, re-arms and 2025-11-25 cuts itself.
        if not a.connected or a.conn != conn:
            return
        due = a.last + self.T
        if due > t:
            _heappush(self.heap, (due, P_DEADLINE, self.next_seq(), _RECUT, a, conn))
            return
        self.c_cuts[t // BUCKET_MS] += 1
        a.connected = False
        self.log.append((t, P_DEADLINE, "cut", a.call.id, a.no, a.replica, None))
        if not self.stateless:
            # Disconnection is not cancellation: the work goes on; the client resumes.
            self.schedule_resume(a, t + RECONNECT_DELAY_MS)
            return
        # 2026-07-28: closing the stream cancels the request.
        self.cancellations += 1
        rep = a.rep
        if a.state == QUEUED:
            rep.queue.remove(a)
        else:
            _busy_change(rep, t)
            del rep.running[a]
            self.want_refill(rep, t)
        a.state = CANCELLED
        a.end = t
        self.log.append((t, P_DEADLINE, "cancel", a.call.id, a.no, a.replica, None))
        _heappush(self.heap, (t + REISSUE_DELAY_MS, P_CLIENT, self.next_seq(), _SEND, a.call, 0))

    def on_kill(self, t: int, rep: Any, _: int) -> None:
        _busy_change(rep, t)
        self.set_state(rep, DOWN)
        rep.epoch += 1  # memory-mode sessions and buffers die with the process
        self.log.append((t, P_DEADLINE, "down", None, None, rep.index, rep.epoch))
        victims = [*rep.running, *rep.queue]
        rep.running.clear()
        rep.queue.clear()
        for a in victims:
            self.c_kills[t // BUCKET_MS] += 1
            a.state = KILLED
            a.end = t
            self.log.append((t, P_DEADLINE, "kill", a.call.id, a.no, rep.index, None))
            if a.connected:
                a.connected = False
                if self.stateless:
                    _heappush(self.heap, (t + REISSUE_DELAY_MS, P_CLIENT, self.next_seq(), _SEND, a.call, 0))
                else:
                    self.schedule_resume(a, t + RECONNECT_DELAY_MS)

    def on_drain(self, t: int, rep: Any, _: int) -> None:
        self.set_state(rep, DRAINING)
        self.log.append((t, P_LIFECYCLE, "drain", None, None, rep.index, None))

    def on_reboot(self, t: int, rep: Any, _: int) -> None:
        self.set_state(rep, UP)
        self.log.append((t, P_LIFECYCLE, "up", None, None, rep.index, rep.epoch))
        held, self.held = self.held, []
        for kind, obj in held:
            if kind == _SEND:
                assert isinstance(obj, _Call)
                self.post(obj, t)
            else:
                self.on_resume(t, obj, 0)

    def on_mutate(self, t: int, a: Any, _: int) -> None:
        if a.state != RUNNING:
            return
        call = a.call
        # Logged identically either way: idempotency must not change the log (invariant 5).
        self.log.append((t, P_WORK, "mutation", call.id, a.no, a.replica, None))
        if self.idem and call.applied:
            self.dedup_hits += 1
            return
        call.commits += 1
        call.applied = True
        if call.commits > 1:
            self.c_dups[t // BUCKET_MS] += 1

    def on_progress(self, t: int, a: Any, _: int) -> None:
        if a.state != RUNNING:
            return
        if a.connected:
            a.last = t
        self.log.append((t, P_WORK, "progress", a.call.id, a.no, a.replica, None))

    def on_finish(self, t: int, a: Any, _: int) -> None:
        if a.state != RUNNING:
            return
        rep = a.rep
        if rep.last_change < WINDOW_MS:
            _busy_change(rep, t)
        del rep.running[a]
        a.state = FINISHED
        a.end = t
        a.final_emitted = True
        self.log.append((t, P_WORK, "finish", a.call.id, a.no, a.replica, None))
        if not rep.refill_pending and rep.queue:
            # A slot has just been freed, so the replica is below SLOTS.
            rep.refill_pending = True
            _heappush(self.heap, (t, P_REFILL, self.next_seq(), _REFILL, rep, 0))
        if a.connected:
            self.deliver(a, t)

    def on_refill(self, t: int, rep: Any, _: int) -> None:
        rep.refill_pending = False
        queue = rep.queue
        running = rep.running
        free = SLOTS - len(running)
        if not queue or free <= 0:
            return
        # One integration step covers every start: the rest would add nothing at the same t.
        if rep.last_change < WINDOW_MS:
            _busy_change(rep, t)
        heap = self.heap
        log_append = self.log.append
        next_seq = self.next_seq
        index = rep.index
        while queue and free:
            free -= 1
            a = queue.popleft()
            running[a] = None
            a.state = RUNNING
            a.start = t
            call = a.call
            log_append((t, P_REFILL, "start", call.id, a.no, index, None))
            if call.mut_at >= 0:
                _heappush(heap, (t + call.mut_at, P_WORK, next_seq(), _MUTATE, a, 0))
            for offset in call.progress:
                _heappush(heap, (t + offset, P_WORK, next_seq(), _PROGRESS, a, 0))
            _heappush(heap, (t + call.duration, P_WORK, next_seq(), _FINISH, a, 0))

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> LabResult:
        cfg = self.cfg
        calls = self.calls
        # Arrivals own the lowest seqs, in order. Only the next one waits in the queue (pushed when
        # its predecessor pops): a short heap is a cheap heap, and the pop order is unchanged
        # because arrivals are pushed in their own (time, seq) order.
        arrivals = sorted(((c.arrival, P_CLIENT, i, _ARRIVE, c, 0) for i, c in enumerate(calls, 1)), key=itemgetter(0, 2))
        n_arrivals = len(arrivals)
        next_arrival = 1
        heap = self.heap
        if arrivals:
            heap.append(arrivals[0])
        push = _heappush
        next_seq = self.next_seq
        if cfg.rolling_deploy:
            w = cfg.drain_s * 1000
            for rep in self.replicas:
                # Pushed drain, kill, reboot per replica in index order, so at one instant replica
                # i's reboot (lower seq) precedes replica i+1's drain, as the phase order requires.
                start = DEPLOY_START_MS + rep.index * (w + REBOOT_MS)
                push(heap, (start, P_LIFECYCLE, next_seq(), _DRAIN, rep, 0))
                push(heap, (start + w, P_DEADLINE, next_seq(), _KILL, rep, 0))
                push(heap, (start + w + REBOOT_MS, P_LIFECYCLE, next_seq(), _REBOOT, rep, 0))
            self.deploy_end = DEPLOY_START_MS + self.n * (w + REBOOT_MS)
        handlers = (
            self.on_cut,
            self.on_cut,
            self.on_resume,
            self.on_arrive,
            self.on_send,
            self.on_kill,
            self.on_drain,
            self.on_reboot,
            self.on_mutate,
            self.on_progress,
            self.on_finish,
            self.on_refill,
        )
        on_resume = self.on_resume
        on_cut = self.on_cut
        pop = _heappop
        hard_stop = self.hard_stop
        next_sample = self.next_sample
        T = self.T
        stateful = not self.stateless
        log_append = self.log.append
        c_cuts = self.c_cuts
        routable = self.routable
        rr = self.rr
        rkey = self.rkey
        pins = self.pins
        replicas = self.replicas
        shared = self.shared
        cuts_on = self.cuts_on
        cut_fifo = self.cut_fifo
        cut_fifo_popleft = cut_fifo.popleft
        resume_fifo = self.resume_fifo
        resume_fifo_popleft = resume_fifo.popleft
        resumes_ok = 0  # inline resumes; added to the handler's count at the end
        end = 0
        stopped = False
        while heap:
            t, phase, _, kind, obj, arg = pop(heap)
            if t > hard_stop:
                stopped = True
                break
            if t >= next_sample:
                next_sample = self.sample(t)
            end = t
            if kind <= _RECUT:
                # The idle-cut timer, inline: in a loaded 2025-11-25 run most events are these
                # timers and the resumes they cause.
                if kind == _CUT:
                    cut_fifo_popleft()
                    if cut_fifo:
                        push(heap, cut_fifo[0])
                if not obj.connected or obj.conn != arg:
                    continue
                due = obj.last + T
                if due > t:
                    push(heap, (due, P_DEADLINE, next_seq(), _RECUT, obj, arg))
                elif stateful:
                    c_cuts[t // BUCKET_MS] += 1
                    obj.connected = False
                    log_append((t, P_DEADLINE, "cut", obj.call.id, obj.no, obj.replica, None))
                    # Disconnection is not cancellation: the work goes on; the client resumes.
                    event = (t + RECONNECT_DELAY_MS, P_CLIENT, next_seq(), _RESUME, obj, 0)
                    if not resume_fifo:
                        push(heap, event)
                    resume_fifo.append(event)
                else:
                    self.phase = phase
                    on_cut(t, obj, arg)
                continue
            self.phase = phase
            if kind == _RESUME:
                resume_fifo_popleft()
                if resume_fifo:
                    push(heap, resume_fifo[0])
                # The common resume inline: the call is pending, the stream's replica is picked
                # and sees the session, and the attempt lives. Anything else (or any doubt) goes
                # to `on_resume`, which decides from scratch: nothing is changed before this
                # branch commits.
                call = obj.call
                if call.status != PENDING:
                    continue
                if routable:
                    if rr:
                        r = routable[int(route_u(rkey, call.id, obj.no, HOP_RESUME, call.resume_hops) * len(routable))]
                    else:
                        r = pins.get(call.client, -1)
                    if r >= 0 and replicas[r].state == UP and obj.state != KILLED:
                        session = obj.session
                        if shared or (session.home == r and replicas[r].epoch == session.epoch):
                            call.resume_hops += 1
                            log_append((t, P_CLIENT, "resume", call.id, obj.no, r, None))
                            resumes_ok += 1
                            obj.connected = True
                            obj.last = t
                            obj.conn = conn = obj.conn + 1
                            log_append((t, P_CLIENT, "resume_ok", call.id, obj.no, r, None))
                            if obj.final_emitted:
                                self.deliver(obj, t)
                            elif cuts_on:
                                event = (t + T, P_DEADLINE, next_seq(), _CUT, obj, conn)
                                if not cut_fifo:
                                    push(heap, event)
                                cut_fifo.append(event)
                            continue
                on_resume(t, obj, arg)
            elif kind == _ARRIVE:
                if next_arrival < n_arrivals:
                    push(heap, arrivals[next_arrival])
                    next_arrival += 1
                self.pending += 1
                log_append((t, P_CLIENT, "arrive", obj.id, None, None, obj.client))
                self.send(obj, t)
            else:
                handlers[kind](t, obj, arg)
        self.resumes_ok += resumes_ok
        end = hard_stop if stopped else max(end, WINDOW_MS)
        self.sample(end)
        return self.result(end)

    def result(self, end: int) -> LabResult:
        for rep in self.replicas:
            _busy_change(rep, end)
        calls = self.calls
        ok_lat = sorted(c.completion - c.arrival for c in calls if c.status == OK)
        failed = sum(1 for c in calls if c.status == FAILED)
        unfinished = sum(1 for c in calls if c.status == PENDING)
        wasted_ms = 0
        lost = 0
        for a in self.attempts:
            if a.delivered or a.start < 0:
                continue
            wasted_ms += (a.end if a.end >= 0 else end) - a.start
            if a.state == FINISHED:
                lost += 1
        util = tuple(rep.busy_ms / (SLOTS * WINDOW_MS) for rep in self.replicas)
        metrics = Metrics(
            calls=len(calls),
            ok=len(ok_lat),
            failed=failed,
            unfinished=unfinished,
            p50_ms=nearest_rank(ok_lat, 50),
            p95_ms=nearest_rank(ok_lat, 95),
            p99_ms=nearest_rank(ok_lat, 99),
            duplicate_side_effects=sum(c.commits - 1 for c in calls if c.commits > 1),
            ghost_writes=sum(1 for c in calls if c.status != OK and c.commits >= 1),
            dedup_hits=self.dedup_hits,
            # Events past the hard stop never run, so the bucket counters hold every count.
            http_404=sum(self.c_404),
            reinitializations=self.reinits,
            sessions_created=self.sessions_created,
            stream_cuts=sum(self.c_cuts),
            # Every resume attempt ends ok or failed.
            resume_attempts=self.resumes_ok + self.resumes_failed,
            resumes_ok=self.resumes_ok,
            resumes_failed=self.resumes_failed,
            cancellations=self.cancellations,
            deploy_kills=sum(self.c_kills),
            reissues=sum(c.attempts_used - 1 for c in calls if c.attempts_used > 0),
            lost_results=lost,
            wasted_slot_seconds=wasted_ms / 1000,
            utilisation=util,
            utilisation_mean=sum(util) / len(util),
            utilisation_max=max(util),
            peak_queue=tuple(rep.peak_queue for rep in self.replicas),
            deploy_end_ms=self.deploy_end,
            run_end_ms=end,
        )
        n = end // BUCKET_MS + 1
        series = Series(
            in_flight=self.s_in_flight,
            busy=self.s_busy,
            queue=self.s_queue,
            state=self.s_state,
            cuts=self.c_cuts[:n],
            http_404=self.c_404[:n],
            kills=self.c_kills[:n],
            reissues=self.c_reissues[:n],
            failures=self.c_failures[:n],
            duplicates=self.c_dups[:n],
            completions=self.c_done[:n],
        )
        return LabResult(config=self.cfg, metrics=metrics, series=series, latency=LatencyHistogram.of(ok_lat), log=self.log)


def run(config: LabConfig, calls: Sequence[CallSpec], *, hard_stop_ms: int = HARD_STOP_MS) -> LabResult:
    """Simulate `calls` (ordered by arrival) under `config`; the seed in `config` keys routing only.

    Most callers want `simulate()`, which generates the traffic from the seed. This entry point lets
    tests run crafted one-call scenarios and the benchmark run a day of traffic (with a later
    `hard_stop_ms`).
    """
    # A run allocates a tracked object or two per event (log records, queue entries, attempts) and
    # keeps most of them, so the cyclic collector would run every few hundred events and rescan the
    # growing log: about a third of a loaded run's time. The run makes no reference cycles (all
    # of it is freed by reference counting), so the collector is paused for its duration. Only a
    # caller that found it enabled pauses and resumes it, so concurrent runs (the page's threads)
    # can never leave it off.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _Sim(config, calls, hard_stop_ms).run()
    finally:
        if paused:
            gc.enable()


@functools.lru_cache(maxsize=128)
def simulate(config: LabConfig) -> LabResult:
    """Run ten minutes of the seed's traffic through the fleet `config` describes (pure, memoised)."""
    return run(config, generate_traffic(config.seed, config.hot_client))
