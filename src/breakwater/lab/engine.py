"""The discrete-event core (spec §3.7–§3.15).

One priority queue ordered by `(time_ms, phase, seq)`. Handlers never iterate an unordered
container: replicas are a list, running attempts an insertion-ordered dict, queues deques, so the
same config and traffic give the same run in every process.

Idle cuts use one lazy timer per connection: the timer fires at `last + T`; if a byte arrived since,
it re-arms itself at the new `last + T`. A byte at exactly `last + T` is a work event (phase 3) and
runs after the deadline (phase 2), so it is too late, as the tie rule demands.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from heapq import heappop as _heappop
from heapq import heappush as _heappush
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
from breakwater.lab.traffic import CallSpec, route_key, route_u

__all__ = ["run"]

# Phases (§3.15), lowest first at equal timestamps.
P_LIFECYCLE: Final = 1
P_DEADLINE: Final = 2
P_WORK: Final = 3
P_CLIENT: Final = 4
P_REFILL: Final = 5

# Event kinds (indices into the handler table).
_ARRIVE, _SEND, _RESUME, _CUT, _KILL, _DRAIN, _REBOOT, _MUTATE, _PROGRESS, _FINISH, _REFILL = range(11)

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
        self.duration = spec.duration_ms(slow_tools)
        # Offset of the side effect from execution start, or -1 for a read-only call.
        self.mut_at = round(spec.mut_frac * self.duration) if spec.mutating else -1
        self.progress = spec.progress_offsets_ms(slow_tools)
        # Longest byte-free stretch of an execution that starts at once: decides whether a stream
        # opened on an idle replica can ever be cut.
        marks = (0, *self.progress, self.duration)
        self.max_silence = max(b - a for a, b in itertools.pairwise(marks))
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
        "orphaned",
        "replica",
        "session",
        "start",
        "state",
        "uid",
    )

    def __init__(self, uid: int, call: _Call, replica: int, session: _Session | None, now: int) -> None:
        self.uid = uid
        self.call = call
        self.no = call.attempts_used
        self.replica = replica
        self.session = session
        self.state = QUEUED
        self.connected = True
        self.orphaned = False
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
        self.running: dict[int, _Attempt] = {}
        self.queue: deque[_Attempt] = deque()
        self.epoch = 0
        self.busy_ms = 0
        self.last_change = 0
        self.peak_queue = 0
        self.refill_pending = False


class _Sim:
    """One run. Not reusable: build, `run()`, read the result."""

    def __init__(self, config: LabConfig, calls: Sequence[CallSpec], hard_stop_ms: int) -> None:
        self.hard_stop = hard_stop_ms
        n_buckets = hard_stop_ms // BUCKET_MS + 1
        self.cfg = config
        self.n = config.replicas
        self.stateless = config.mode == "2026-07-28"
        self.shared = config.mode == "2025-11-25/shared"
        self.rr = config.routing == "round_robin"
        self.idem = config.idempotency
        # Keep-alive below T means no stream is ever cut (§3.10), so no idle timers are armed at all;
        # K >= T never matters, so it runs exactly like K = off.
        self.cuts_on = not config.keepalive_effective
        self.T = config.idle_timeout_s * 1000
        self.rkey = route_key(config.seed)
        self.calls = [_Call(spec, config.slow_tools) for spec in calls]
        self.replicas = [_Replica(i) for i in range(self.n)]
        self.routable: list[int] = list(range(self.n))
        self.sessions: dict[int, _Session | None] = {}
        self.pins: dict[int, int] = {}
        self.held: list[tuple[int, _Call | _Attempt]] = []
        self.attempts: list[_Attempt] = []
        self.heap: list[tuple[int, int, int, int, object, int]] = []
        self.seq = 0
        self.sid = 0
        self.pending = 0
        self.now = 0
        self.phase = 0
        self.log: list[LogRecord] = []
        self.deploy_end: int | None = None
        # Counters.
        self.dedup_hits = 0
        self.http_404 = 0
        self.reinits = 0
        self.sessions_created = 0
        self.stream_cuts = 0
        self.resume_attempts = 0
        self.resumes_ok = 0
        self.resumes_failed = 0
        self.cancellations = 0
        self.kills = 0
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

    def sample(self, t: int) -> None:
        # Gauges at the start of every bucket up to t, before any event at or after that instant.
        while self.next_sample <= t:
            self.s_in_flight.append(self.pending)
            for rep in self.replicas:
                i = rep.index
                self.s_busy[i].append(len(rep.running))
                self.s_queue[i].append(len(rep.queue))
                self.s_state[i].append(rep.state)
            self.next_sample += BUCKET_MS

    def busy_change(self, rep: _Replica, t: int) -> None:
        # Integrate busy slots over [0, WINDOW] only (utilisation's definition); call before the
        # number of running attempts changes.
        hi = t if t < WINDOW_MS else WINDOW_MS
        lo = rep.last_change if rep.last_change < WINDOW_MS else WINDOW_MS
        rep.busy_ms += len(rep.running) * (hi - lo)
        rep.last_change = t

    def set_state(self, rep: _Replica, state: int) -> None:
        rep.state = state
        self.routable = [r.index for r in self.replicas if r.state == UP]

    def want_refill(self, rep: _Replica, t: int) -> None:
        if not rep.refill_pending and rep.queue and len(rep.running) < SLOTS:
            rep.refill_pending = True
            self.seq += 1
            _heappush(self.heap, (t, P_REFILL, self.seq, _REFILL, rep, 0))

    # -- load balancer (§3.8) --------------------------------------------------------------------

    def route(self, call: _Call, no: int, hop_kind: int, hop_index: int) -> int:
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
            (self.now, self.phase, "pin", call.id, None, new, f"client {client}: {pin if pin is not None else '-'} -> {new}")
        )
        return new

    # -- sessions (2025-11-25) -----------------------------------------------------------------

    def visible(self, session: _Session | None, r: int) -> bool:
        if self.shared:
            return True
        assert session is not None
        return session.home == r and self.replicas[r].epoch == session.epoch

    def initialize(self, call: _Call, no: int, reinit: bool) -> None:
        r = self.route(call, no, HOP_INIT, call.init_hops)
        call.init_hops += 1
        self.sid += 1
        self.sessions[call.client] = _Session(self.sid, r, self.replicas[r].epoch)
        self.sessions_created += 1
        if reinit:
            self.reinits += 1
        self.log.append((self.now, self.phase, "reinit" if reinit else "init", call.id, None, r, self.sid))

    # -- client side (§3.9) --------------------------------------------------------------------

    def send(self, call: _Call, t: int) -> None:
        if call.status != PENDING:
            return
        if call.attempts_used == MAX_ATTEMPTS:
            call.status = FAILED
            self.pending -= 1
            self.c_failures[t // BUCKET_MS] += 1
            self.log.append((self.now, self.phase, "fail", call.id, None, None, None))
            return
        call.attempts_used += 1
        if call.attempts_used > 1:
            self.c_reissues[t // BUCKET_MS] += 1
        self.post(call, t)

    def post(self, call: _Call, t: int) -> None:
        if not self.routable:
            # Only with N = 1 during a deploy: the proxy holds the request, with no idle clock.
            self.held.append((_SEND, call))
            self.log.append((self.now, self.phase, "hold", call.id, None, None, "post"))
            return
        no = call.attempts_used
        session: _Session | None = None
        if not self.stateless:
            if self.sessions.get(call.client) is None:
                self.initialize(call, no, reinit=False)
            session = self.sessions[call.client]
        r = self.route(call, no, HOP_POST, 0)
        self.log.append((self.now, self.phase, "post", call.id, None, r, no))
        if not self.stateless and not self.visible(session, r):
            self.http_404 += 1
            self.c_404[t // BUCKET_MS] += 1
            self.log.append((self.now, self.phase, "404", call.id, None, r, "post"))
            self.initialize(call, no, reinit=True)
            self.send(call, t)
            return
        self.accept(call, r, session, t)

    def accept(self, call: _Call, r: int, session: _Session | None, t: int) -> None:
        rep = self.replicas[r]
        a = _Attempt(len(self.attempts), call, r, session, t)
        self.attempts.append(a)
        rep.queue.append(a)
        self.log.append((t, self.phase, "accept", call.id, a.no, r, len(rep.queue)))
        if len(rep.queue) > rep.peak_queue:
            rep.peak_queue = len(rep.queue)
        # Stream open is a byte (priming event or headers); queued time is silent time. An attempt
        # that starts at this very instant and is never silent for T needs no idle timer: skipping
        # it only saves a no-op event.
        if self.cuts_on and not (len(rep.queue) == 1 and len(rep.running) < SLOTS and call.max_silence < self.T):
            self.seq += 1
            _heappush(self.heap, (t + self.T, P_DEADLINE, self.seq, _CUT, a, a.conn))
        self.want_refill(rep, t)

    def deliver(self, a: _Attempt, t: int) -> None:
        a.delivered = True
        a.connected = False
        call = a.call
        if call.status == PENDING:
            call.status = OK
            call.completion = t
            self.pending -= 1
            self.c_done[t // BUCKET_MS] += 1
            self.log.append((self.now, self.phase, "deliver", call.id, a.no, a.replica, t - call.arrival))

    def orphan_and_resend(self, a: _Attempt, t: int) -> None:
        a.orphaned = True
        self.log.append((self.now, self.phase, "orphan", a.call.id, a.no, a.replica, None))
        self.send(a.call, t)

    # -- event handlers ------------------------------------------------------------------------

    def on_arrive(self, t: int, call: Any, _: int) -> None:
        self.pending += 1
        self.log.append((self.now, self.phase, "arrive", call.id, None, None, call.client))
        self.send(call, t)

    def on_send(self, t: int, call: Any, _: int) -> None:
        self.send(call, t)

    def on_resume(self, t: int, a: Any, _: int) -> None:
        call = a.call
        if call.status != PENDING:
            return
        if not self.routable:
            self.held.append((_RESUME, a))
            self.log.append((self.now, self.phase, "hold", call.id, a.no, None, "resume"))
            return
        self.resume_attempts += 1
        r = self.route(call, a.no, HOP_RESUME, call.resume_hops)
        call.resume_hops += 1
        self.log.append((self.now, self.phase, "resume", call.id, a.no, r, None))
        if not self.visible(a.session, r):
            self.http_404 += 1
            self.c_404[t // BUCKET_MS] += 1
            self.resumes_failed += 1
            self.log.append((self.now, self.phase, "404", call.id, a.no, r, "resume"))
            current = self.sessions.get(call.client)
            # Re-initialize only if no other call has done so since this stream's session.
            if current is not None and a.session is not None and current.sid == a.session.sid:
                self.initialize(call, a.no, reinit=True)
            self.orphan_and_resend(a, t)
            return
        if a.state == KILLED:
            # The producer is dead: a shared buffer cannot bring back the final response.
            self.resumes_failed += 1
            self.log.append((self.now, self.phase, "resume_failed", call.id, a.no, r, "killed"))
            self.orphan_and_resend(a, t)
            return
        self.resumes_ok += 1
        a.connected = True
        a.last = t
        a.conn += 1
        self.log.append((self.now, self.phase, "resume_ok", call.id, a.no, r, None))
        if a.final_emitted:
            self.deliver(a, t)
        elif self.cuts_on:
            self.seq += 1
            _heappush(self.heap, (t + self.T, P_DEADLINE, self.seq, _CUT, a, a.conn))

    def on_cut(self, t: int, a: Any, conn: int) -> None:
        if not a.connected or a.conn != conn:
            return
        due = a.last + self.T
        if due > t:
            self.seq += 1
            _heappush(self.heap, (due, P_DEADLINE, self.seq, _CUT, a, conn))
            return
        self.stream_cuts += 1
        self.c_cuts[t // BUCKET_MS] += 1
        a.connected = False
        self.log.append((self.now, self.phase, "cut", a.call.id, a.no, a.replica, None))
        if not self.stateless:
            # Disconnection is not cancellation: the work goes on; the client resumes.
            self.seq += 1
            _heappush(self.heap, (t + RECONNECT_DELAY_MS, P_CLIENT, self.seq, _RESUME, a, 0))
            return
        # 2026-07-28: closing the stream cancels the request.
        self.cancellations += 1
        rep = self.replicas[a.replica]
        if a.state == QUEUED:
            rep.queue.remove(a)
        else:
            self.busy_change(rep, t)
            del rep.running[a.uid]
            self.want_refill(rep, t)
        a.state = CANCELLED
        a.end = t
        self.log.append((self.now, self.phase, "cancel", a.call.id, a.no, a.replica, None))
        self.seq += 1
        _heappush(self.heap, (t + REISSUE_DELAY_MS, P_CLIENT, self.seq, _SEND, a.call, 0))

    def on_kill(self, t: int, rep: Any, _: int) -> None:
        self.busy_change(rep, t)
        self.set_state(rep, DOWN)
        rep.epoch += 1  # memory-mode sessions and buffers die with the process
        self.log.append((self.now, self.phase, "down", None, None, rep.index, rep.epoch))
        victims = [*rep.running.values(), *rep.queue]
        rep.running.clear()
        rep.queue.clear()
        for a in victims:
            self.kills += 1
            self.c_kills[t // BUCKET_MS] += 1
            a.state = KILLED
            a.end = t
            self.log.append((self.now, self.phase, "kill", a.call.id, a.no, rep.index, None))
            if a.connected:
                a.connected = False
                if self.stateless:
                    self.seq += 1
                    _heappush(self.heap, (t + REISSUE_DELAY_MS, P_CLIENT, self.seq, _SEND, a.call, 0))
                else:
                    self.seq += 1
                    _heappush(self.heap, (t + RECONNECT_DELAY_MS, P_CLIENT, self.seq, _RESUME, a, 0))

    def on_drain(self, t: int, rep: Any, _: int) -> None:
        self.set_state(rep, DRAINING)
        self.log.append((self.now, self.phase, "drain", None, None, rep.index, None))

    def on_reboot(self, t: int, rep: Any, _: int) -> None:
        self.set_state(rep, UP)
        self.log.append((self.now, self.phase, "up", None, None, rep.index, rep.epoch))
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
        self.log.append((self.now, self.phase, "mutation", call.id, a.no, a.replica, None))
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
        self.log.append((self.now, self.phase, "progress", a.call.id, a.no, a.replica, None))

    def on_finish(self, t: int, a: Any, _: int) -> None:
        if a.state != RUNNING:
            return
        rep = self.replicas[a.replica]
        self.busy_change(rep, t)
        del rep.running[a.uid]
        a.state = FINISHED
        a.end = t
        a.final_emitted = True
        self.log.append((self.now, self.phase, "finish", a.call.id, a.no, a.replica, None))
        self.want_refill(rep, t)
        if a.connected:
            self.deliver(a, t)

    def on_refill(self, t: int, rep: Any, _: int) -> None:
        rep.refill_pending = False
        queue = rep.queue
        running = rep.running
        while queue and len(running) < SLOTS:
            a = queue.popleft()
            self.busy_change(rep, t)
            running[a.uid] = a
            a.state = RUNNING
            a.start = t
            call = a.call
            self.log.append((self.now, self.phase, "start", call.id, a.no, rep.index, None))
            if call.mut_at >= 0:
                self.seq += 1
                _heappush(self.heap, (t + call.mut_at, P_WORK, self.seq, _MUTATE, a, 0))
            for offset in call.progress:
                self.seq += 1
                _heappush(self.heap, (t + offset, P_WORK, self.seq, _PROGRESS, a, 0))
            self.seq += 1
            _heappush(self.heap, (t + call.duration, P_WORK, self.seq, _FINISH, a, 0))

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> LabResult:
        cfg = self.cfg
        # Arrivals first, in order, so they take the lowest seqs; heapify beats 1 800 pushes.
        self.heap = [(c.arrival, P_CLIENT, i, _ARRIVE, c, 0) for i, c in enumerate(self.calls, 1)]
        heapq.heapify(self.heap)
        self.seq = len(self.calls)
        if cfg.rolling_deploy:
            w = cfg.drain_s * 1000
            for rep in self.replicas:
                # Pushed drain, kill, reboot per replica in index order, so at one instant replica
                # i's reboot (lower seq) precedes replica i+1's drain, as §3.15 phase 1 requires.
                start = DEPLOY_START_MS + rep.index * (w + REBOOT_MS)
                self.seq += 1
                _heappush(self.heap, (start, P_LIFECYCLE, self.seq, _DRAIN, rep, 0))
                self.seq += 1
                _heappush(self.heap, (start + w, P_DEADLINE, self.seq, _KILL, rep, 0))
                self.seq += 1
                _heappush(self.heap, (start + w + REBOOT_MS, P_LIFECYCLE, self.seq, _REBOOT, rep, 0))
            self.deploy_end = DEPLOY_START_MS + self.n * (w + REBOOT_MS)
        handlers = (
            self.on_arrive,
            self.on_send,
            self.on_resume,
            self.on_cut,
            self.on_kill,
            self.on_drain,
            self.on_reboot,
            self.on_mutate,
            self.on_progress,
            self.on_finish,
            self.on_refill,
        )
        heap = self.heap
        pop = _heappop
        end = 0
        stopped = False
        while heap:
            t, phase, _, kind, obj, arg = pop(heap)
            if t > self.hard_stop:
                stopped = True
                break
            if t >= self.next_sample:
                self.sample(t)
            self.now = t
            self.phase = phase
            end = t
            handlers[kind](t, obj, arg)
        end = self.hard_stop if stopped else max(end, WINDOW_MS)
        self.sample(end)
        return self.result(end)

    def result(self, end: int) -> LabResult:
        for rep in self.replicas:
            self.busy_change(rep, end)
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
            http_404=self.http_404,
            reinitializations=self.reinits,
            sessions_created=self.sessions_created,
            stream_cuts=self.stream_cuts,
            resume_attempts=self.resume_attempts,
            resumes_ok=self.resumes_ok,
            resumes_failed=self.resumes_failed,
            cancellations=self.cancellations,
            deploy_kills=self.kills,
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
    return _Sim(config, calls, hard_stop_ms).run()
