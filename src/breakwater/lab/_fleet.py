"""The lab's fleet model: calls, sessions, attempts, replicas, and the state of one run.

`Fleet` holds a run's state and the plumbing every event handler uses: sampling the gauges, the
load balancer, sessions (2025-11-25), the client side, delivery, and the result.
The event handlers and the loop that drives them are in `engine.py`. Every name here is hot:
the same performance rules apply (docs/lab.md, "Performance"), and any change must keep every
output bit-for-bit (tests/lab/test_golden.py).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from heapq import heappush as _heappush
from typing import Any, Final

from breakwater.lab.config import MAX_REISSUES, SLOTS, WINDOW_MS, LabConfig
from breakwater.lab.metrics import BUCKET_MS, LabResult, LatencyHistogram, LogRecord, Metrics, Series, nearest_rank
from breakwater.lab.traffic import CallSpec, route_key, route_u

# Phases, lowest first at equal timestamps.
P_LIFECYCLE: Final = 1
P_DEADLINE: Final = 2
P_WORK: Final = 3
P_CLIENT: Final = 4
P_REFILL: Final = 5

# Event kinds (indices into the handler table). `CUT` is an idle timer armed when its stream
# opens or resumes (always `now + T`); `RECUT` is one re-armed later (at `last byte + T`, which
# can be earlier than timers armed since). The two cut kinds come first so the run loop tells them
# apart from the rest with one comparison.
CUT, RECUT, RESUME, ARRIVE, SEND, KILL, DRAIN, REBOOT, MUTATE, PROGRESS, FINISH, REFILL = range(12)

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


class Call:
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


class Session:
    __slots__ = ("epoch", "home", "sid")

    def __init__(self, sid: int, home: int, epoch: int) -> None:
        self.sid = sid
        self.home = home
        self.epoch = epoch


class Attempt:
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

    def __init__(self, call: Call, rep: Replica, session: Session | None, now: int) -> None:
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


class Replica:
    __slots__ = (
        "busy_ms",
        "epoch",
        "index",
        "last_change",
        "peak_queue",
        "queue",
        "refill_pending",
        "running",
        "state",
        "window",
    )

    def __init__(self, index: int, window_ms: int = WINDOW_MS) -> None:
        self.index = index
        self.window = window_ms
        """The arrival window: utilisation integrates busy slots over [0, window]."""
        self.state = UP
        # Running attempts in start order (a dict: ordered, with O(1) removal).
        self.running: dict[Attempt, None] = {}
        self.queue: deque[Attempt] = deque()
        self.epoch = 0
        self.busy_ms = 0
        self.last_change = 0
        self.peak_queue = 0
        self.refill_pending = False


def busy_change(rep: Replica, t: int) -> None:
    # Integrate busy slots over [0, window] only (utilisation's definition); call before the number
    # of running attempts changes. Once `last_change` has passed the window this adds nothing, so
    # hot callers skip the call then.
    window = rep.window
    hi = t if t < window else window
    lo = rep.last_change if rep.last_change < window else window
    rep.busy_ms += len(rep.running) * (hi - lo)
    rep.last_change = t


class LogCounter(list):  # type: ignore[type-arg]
    """Stands in for the event log when a caller wants metrics and series only: counts records, keeps none.

    The heaviest settings log over a million records (about 120 MB); the page never shows them.
    """

    __slots__ = ("n",)

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def append(self, record: object) -> None:
        """Count the record and drop it."""
        self.n += 1


Event = tuple[int, int, int, int, Any, int]
"""`(time_ms, phase, seq, kind, subject, arg)`: seqs are unique, so tuples never compare beyond them."""


class Fleet:
    """The state of one run and the plumbing its event handlers share (the handlers are `engine._Sim`'s)."""

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
        "window",
    )

    def __init__(
        self,
        config: LabConfig,
        calls: Sequence[CallSpec],
        hard_stop_ms: int,
        keep_log: bool = True,
        window_ms: int = WINDOW_MS,
    ) -> None:
        self.hard_stop = hard_stop_ms
        self.window = window_ms
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
        self.calls = [Call(spec, slow_tools) for spec in calls]
        self.replicas = [Replica(i, window_ms) for i in range(self.n)]
        # Updated in place (handlers hold references to it).
        self.routable: list[int] = list(range(self.n))
        self.sessions: dict[int, Session | None] = {}
        self.pins: dict[int, int] = {}
        self.held: list[tuple[int, Call | Attempt]] = []
        self.attempts: list[Attempt] = []
        self.heap: list[Event] = []
        self.cut_fifo: deque[Event] = deque()
        self.resume_fifo: deque[Event] = deque()
        # Arrivals own seqs 1..len(calls); every other event takes the next number.
        self.next_seq = itertools.count(len(self.calls) + 1).__next__
        self.sid = 0
        self.pending = 0
        self.phase = 0
        self.log: list[LogRecord] = [] if keep_log else LogCounter()
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

    def set_state(self, rep: Replica, state: int) -> None:
        rep.state = state
        self.routable[:] = [r.index for r in self.replicas if r.state == UP]

    # Fresh idle timers are all due `T` after the instant they are armed, and resumes
    # `RECONNECT_DELAY_MS` after theirs; as the clock never goes back, each kind arrives already in
    # queue order (time, phase, seq). So each waits in a FIFO and only its head sits in the heap:
    # in a loaded run these are most pending events, and the heap stays short. The run loop
    # advances a FIFO when its head pops.

    def arm_cut(self, a: Attempt, due: int, conn: int) -> None:
        event = (due, P_DEADLINE, self.next_seq(), CUT, a, conn)
        if not self.cut_fifo:
            _heappush(self.heap, event)
        self.cut_fifo.append(event)

    def schedule_resume(self, a: Attempt, due: int) -> None:
        event = (due, P_CLIENT, self.next_seq(), RESUME, a, 0)
        if not self.resume_fifo:
            _heappush(self.heap, event)
        self.resume_fifo.append(event)

    def want_refill(self, rep: Replica, t: int) -> None:
        if not rep.refill_pending and rep.queue and len(rep.running) < SLOTS:
            rep.refill_pending = True
            _heappush(self.heap, (t, P_REFILL, self.next_seq(), REFILL, rep, 0))

    # -- load balancer -------------------------------------------------------------------------

    def route(self, call: Call, no: int, hop_kind: int, hop_index: int, t: int) -> int:
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

    def initialize(self, call: Call, no: int, reinit: bool, t: int) -> None:
        r = self.route(call, no, HOP_INIT, call.init_hops, t)
        call.init_hops += 1
        self.sid += 1
        self.sessions[call.client] = Session(self.sid, r, self.replicas[r].epoch)
        self.sessions_created += 1
        if reinit:
            self.reinits += 1
        self.log.append((t, self.phase, "reinit" if reinit else "init", call.id, None, r, self.sid))

    # -- client side -------------------------------------------------------------------------

    def send(self, call: Call, t: int) -> None:
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

    def post(self, call: Call, t: int) -> None:
        if not self.routable:
            # Only with N = 1 during a deploy: the proxy holds the request, with no idle clock.
            self.held.append((SEND, call))
            self.log.append((t, self.phase, "hold", call.id, None, None, "post"))
            return
        no = call.attempts_used
        phase = self.phase
        log_append = self.log.append
        replicas = self.replicas
        session: Session | None = None
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
        a = Attempt(call, rep, session, t)
        self.attempts.append(a)
        queue = rep.queue
        queue.append(a)
        depth = len(queue)
        log_append((t, phase, "accept", call.id, no, r, depth))
        # Peak queue counts attempts that wait: the ones beyond the free slots, which this instant's
        # refill (the last phase, after every finish and cut at t) will not start. An attempt
        # accepted by an idle replica waits 0 ms and is not counted.
        free = SLOTS - len(rep.running)
        waiting = depth - free if free > 0 else depth
        if waiting > rep.peak_queue:
            rep.peak_queue = waiting
        # Stream open is a byte (priming event or headers); queued time is silent time. An attempt
        # that starts at this very instant and is never silent for T needs no idle timer: skipping
        # it only saves a no-op event.
        idle_now = free > 0
        if self.cuts_on and not (depth == 1 and idle_now and call.max_silence < self.T):
            self.arm_cut(a, t + self.T, 0)
        if idle_now and not rep.refill_pending:
            rep.refill_pending = True
            _heappush(self.heap, (t, P_REFILL, self.next_seq(), REFILL, rep, 0))

    def deliver(self, a: Attempt, t: int) -> None:
        a.delivered = True
        a.connected = False
        call = a.call
        if call.status == PENDING:
            call.status = OK
            call.completion = t
            self.pending -= 1
            self.c_done[t // BUCKET_MS] += 1
            self.log.append((t, self.phase, "deliver", call.id, a.no, a.replica, t - call.arrival))

    def orphan_and_resend(self, a: Attempt, t: int) -> None:
        self.log.append((t, self.phase, "orphan", a.call.id, a.no, a.replica, None))
        self.send(a.call, t)

    # -- the result ----------------------------------------------------------------------------

    def result(self, end: int) -> LabResult:
        for rep in self.replicas:
            busy_change(rep, end)
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
        util = tuple(rep.busy_ms / (SLOTS * self.window) for rep in self.replicas)
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
            # `math.fsum`, not `sum`: Python 3.12 made `sum` of floats compensated, so its last bit differed
            # from 3.11's and a seed's result was not the same on every Python (tests/lab/test_golden.py).
            utilisation_mean=math.fsum(util) / len(util),
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
        log = self.log
        total = log.n if isinstance(log, LogCounter) else len(log)
        return LabResult(
            config=self.cfg,
            metrics=metrics,
            series=series,
            latency=LatencyHistogram.of(ok_lat),
            log=[] if isinstance(log, LogCounter) else log,
            log_total=total,
        )
