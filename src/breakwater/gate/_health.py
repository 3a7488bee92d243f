"""What the gate has seen of one tool's latency, in memory: enough to tell slow from unlucky.

Three decisions of the slow afternoon read it (see the README's "Retries and breakers"):

* **slowness trips the breaker**: a tool whose recent p99 is far below its timeout (a quarter of it
  or less) and that times out `timeouts_to_trip` times in a row is slow now, not unlucky, so its
  breaker opens without waiting for the failure count;
* **cheap probes**: a half-open probe of a tool with a known p99 gets a deadline of a few times
  that p99 (`probe_timeout_factor`, at least `probe_timeout_floor_s`, at most the timeout), so a
  tool that is still slow costs its probe a fraction of the timeout;
* **learned timeouts arrive in time**: the latencies the journal learns from are also kept here,
  so a tool's learned timeout is in force as soon as it has `learn_min_samples` calls, not at the
  journal's next refresh (after that it is recomputed at the journal's cadence, so one bad
  minute cannot ratchet it).

Only answered attempts count as latency; timeouts count for learning at the time they were cut
(as the journal counts them), except a probe's short cut, which says nothing about the timeout.
Bounded: at most `_KEEP` samples per tool, one deque append per attempt.
"""

from __future__ import annotations

import math
from collections import deque

from breakwater.config import JournalPolicy
from breakwater.journal import LearnInput, learned_value

__all__ = ["FAR_BELOW", "KNOWN_SAMPLES", "ToolHealth"]

#: Samples kept per tool: the p99 of the last few hundred calls, and the learning window's tail.
_KEEP = 1000
#: Answered calls before a tool's latency counts as known. Few on purpose: a rarely called tool
#: (one agent, a few calls a minute) must not pay four timeouts while its history fills, and a
#: wrong guess costs one open period and one probe. With fewer than 100 answers the "p99" is the
#: slowest answer seen, so the guard errs towards leaving the breaker alone.
KNOWN_SAMPLES = 5
#: "Far below its timeout": the p99 times this is still within the timeout. A lognormal tail
#: rarely reaches 4× its p99, so two such timeouts in a row are slowness, not chance.
FAR_BELOW = 4.0
# How many latest answers the p99 is taken over (recent, so a tool that got faster is known fast).
_RECENT = 200
# Before a tool's first learned timeout, how often the window is looked at again.
_LOOK_AGAIN_S = 1.0
#: Answers in a row without a progress report after which a tool is no longer taken for one that reports progress:
#: one export that reported progress in the morning gave every later call the idle gap (a minute by default) before a
#: cut, so the same tool hanging in the afternoon stalled the agent a minute per call instead of its learned timeout.
PROGRESS_FORGOTTEN_AFTER = 20


class ToolHealth:
    """One tool's recent latencies and its current run of timeouts."""

    __slots__ = (
        "_answered",
        "_learn_due",
        "_samples",
        "_sorted",
        "answered_total",
        "learned_at",
        "learned_s",
        "quiet_answers",
        "sends_progress",
        "timeouts_in_a_row",
    )

    def __init__(self) -> None:
        #: Latest answered durations (s), newest last.
        self._answered: deque[float] = deque(maxlen=_RECENT)
        #: `(monotonic at, duration s, answered)` of answered and timed-out attempts, for learning.
        self._samples: deque[tuple[float, float, bool]] = deque(maxlen=_KEEP)
        self._sorted: list[float] | None = None
        #: Answers seen since the tool was first listed.
        self.answered_total = 0
        self._learn_due = -math.inf
        #: Timeouts since the last answer.
        self.timeouts_in_a_row = 0
        #: The timeout learned from these samples, once there were enough (None before).
        self.learned_s: float | None = None
        #: When this process's own calls were first enough to learn this tool's timeout from (wall clock); None for a
        #: timeout the journal learned before this process ran (when that was is not known here).
        self.learned_at: float | None = None
        #: The tool reported progress in a call: its next calls wait at least the idle gap for their first report
        #: (`AttemptDeadline.for_call`), not a learned timeout shorter than its reports' spacing; forgotten after
        #: `PROGRESS_FORGOTTEN_AFTER` answers in a row without a report.
        self.sends_progress = False
        #: Answers since its last progress report (the answer of the call that reported counts one).
        self.quiet_answers = 0

    def answered(self, now: float, duration_s: float) -> None:
        """An attempt got an answer (a result or the tool's own error) after `duration_s`."""
        self._answered.append(duration_s)
        self.answered_total += 1
        self._samples.append((now, duration_s, True))
        self._sorted = None
        self.timeouts_in_a_row = 0
        if self.sends_progress:
            self.quiet_answers += 1
            if self.quiet_answers > PROGRESS_FORGOTTEN_AFTER:
                self.sends_progress = False

    def progressed(self) -> None:
        """The tool reported progress in a call: its next calls wait at least the idle gap for a first report."""
        self.sends_progress = True
        self.quiet_answers = 0

    def timed_out(self, now: float, duration_s: float, *, short: bool) -> None:
        """An attempt was cut by its deadline; `short`: a probe's cut, not the tool's timeout."""
        self.timeouts_in_a_row += 1
        if not short:
            self._samples.append((now, duration_s, False))

    def _ordered(self) -> list[float] | None:
        # Sorted once per change, and only when asked (on a timeout, a probe, a refusal): never on the healthy path.
        if len(self._answered) < KNOWN_SAMPLES:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._answered)
        return self._sorted

    def p99(self) -> float | None:
        """The p99 of the latest answers, or None while fewer than `KNOWN_SAMPLES` are known."""
        ordered = self._ordered()
        return None if ordered is None else ordered[min(len(ordered), math.ceil(0.99 * len(ordered))) - 1]

    def median(self) -> float | None:
        """The median of the latest answers (what "usually" means in an error message), or None."""
        # `_sorted` is only ever set with enough samples: the refusal of an open breaker reads it this way, without a call.
        ordered = self._sorted
        if ordered is None:
            if len(self._answered) < KNOWN_SAMPLES:  # `_ordered`'s first answer, without its frame
                return None
            ordered = self._ordered()
        return None if ordered is None else ordered[(len(ordered) - 1) // 2]

    def far_below(self, timeout_s: float) -> bool:
        """Whether the tool's known p99 is far below `timeout_s` (so timeouts mean it turned slow)."""
        p99 = self.p99()
        return p99 is not None and p99 * FAR_BELOW <= timeout_s

    def probe_timeout(self, timeout_s: float, factor: float, floor_s: float) -> float:
        """The deadline for a half-open probe: `factor` × p99, at least `floor_s`, never above `timeout_s`."""
        p99 = self.p99()
        if p99 is None or factor <= 0:
            return timeout_s
        return min(timeout_s, max(floor_s, factor * p99))

    def learn(self, now: float, policy: JournalPolicy) -> float | None:
        """The learned timeout (the journal's formula over these samples), or None before there are enough.

        The first value comes as soon as there are `learn_min_samples` answers in the window (looked
        for at most once a second); after that it is recomputed every `learn_refresh_s`.
        """
        if now < self._learn_due or self.answered_total < policy.learn_min_samples:
            return self.learned_s
        since = now - policy.learn_window_s
        recent = [(d, ok) for at, d, ok in self._samples if at >= since]
        answered = [d for d, ok in recent if ok]
        inp = LearnInput.of("", "", len(answered), [d for d, _ in recent], answered, policy.learn_quantile)
        value = learned_value(inp, policy)
        if value is None:
            self._learn_due = now + _LOOK_AGAIN_S
            return self.learned_s
        self.learned_s = value
        self._learn_due = now + policy.learn_refresh_s
        return value
