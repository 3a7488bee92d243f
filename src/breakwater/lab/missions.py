"""The six missions, their star rules, calibration checks and the shell's progress rules (unlocks, best stars).

A mission is a broken set-up at a pinned seed, a goal (1 star) and efficiency conditions (3 stars).
Each mission lists references and traps: named changes to the set-up with the stars they must earn
at the pinned seed. `calibration_problems()` checks all of them; the test suite runs it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from breakwater.lab.config import MIN_REPLICAS_FOR_STARS, LabConfig
from breakwater.lab.engine import simulate
from breakwater.lab.metrics import LabResult, Metrics

__all__ = [
    "MISSIONS",
    "Mission",
    "Progress",
    "Stars",
    "Variant",
    "calibration_problems",
    "get_mission",
    "new_seed",
    "score_mission",
]

Stars = Literal[0, 1, 3]
_INJECTIONS: Final = ("slow_tools", "rolling_deploy", "hot_client")


def _no_failures(m: Metrics) -> bool:
    # Goals treat unfinished calls like failures: a call still running at the end did not succeed.
    return m.failed == 0 and m.unfinished == 0


def _p95_at_most(m: Metrics, limit_ms: int) -> bool:
    return m.p95_ms is not None and m.p95_ms <= limit_ms


@dataclass(frozen=True, kw_only=True, slots=True)
class Variant:
    """A named change to a mission's set-up, and what it must score at the pinned seed."""

    key: str
    """Short id, used by `breakwater lab run --mission N --variant KEY`."""
    kind: Literal["reference", "trap"]
    label: str
    changes: Mapping[str, object]
    stars: Stars
    outcome: str = ""
    """What a trap documents, beyond its stars (checked by `check`)."""
    check: Callable[[Metrics, Metrics], bool] | None = None
    """`check(setup_metrics, variant_metrics)`: the documented outcome holds."""

    def apply(self, setup: LabConfig) -> LabConfig:
        """The set-up with this variant's changes."""
        return setup.replace(**dict(self.changes))

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values."""
        return {
            "key": self.key,
            "kind": self.kind,
            "label": self.label,
            "changes": dict(self.changes),
            "stars": self.stars,
            "outcome": self.outcome,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Mission:
    """One mission: set-up, pinned seed, goal, 3-star conditions, references and traps."""

    id: int
    name: str
    lesson: str
    briefing: str
    """What the player sees in the set-up."""
    setup: LabConfig
    """The broken fleet, with the pinned seed."""
    goal_text: str
    three_star_text: str
    goal: Callable[[Metrics], bool]
    efficient: Callable[[LabConfig, Metrics], bool]
    variants: tuple[Variant, ...] = field(default=())

    @property
    def pinned_seed(self) -> int:
        """The seed stars are awarded at."""
        return self.setup.seed

    @property
    def fix(self) -> Variant:
        """The first 3-star reference: what `--fix` applies."""
        return next(v for v in self.variants if v.kind == "reference" and v.stars == 3)

    def variant(self, key: str) -> Variant:
        """The variant named `key`; KeyError lists the known keys."""
        for v in self.variants:
            if v.key == key:
                return v
        raise KeyError(f"mission {self.id} has no variant {key!r}; known: {', '.join(v.key for v in self.variants)}")

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values for the page: texts, set-up, pinned seed and variants."""
        return {
            "id": self.id,
            "name": self.name,
            "lesson": self.lesson,
            "briefing": self.briefing,
            "setup": self.setup.to_dict(),
            "pinned_seed": self.pinned_seed,
            "goal": self.goal_text,
            "three_stars": self.three_star_text,
            "variants": [v.to_dict() for v in self.variants],
        }


def _ref(key: str, label: str, stars: Stars, **changes: object) -> Variant:
    return Variant(key=key, kind="reference", label=label, changes=MappingProxyType(changes), stars=stars)


def _trap(key: str, label: str, outcome: str, check: Callable[[Metrics, Metrics], bool], **changes: object) -> Variant:
    return Variant(key=key, kind="trap", label=label, changes=MappingProxyType(changes), stars=0, outcome=outcome, check=check)


_STATELESS_FIXES: Final = {
    "mode": "2026-07-28",
    "routing": "round_robin",
    "keepalive_s": 15,
    "idempotency": True,
    "drain_s": 120,
}

MISSIONS: Final[tuple[Mission, ...]] = (
    Mission(
        id=1,
        name="Sticky by accident",
        lesson="2025-11-25 sessions live in one replica; round-robin produces 404/re-initialize storms.",
        briefing="About one call in five fails, with thousands of 404s and as many re-initializations.",
        setup=LabConfig(mode="2025-11-25/memory", routing="round_robin", replicas=3, keepalive_s=15, seed=1),
        goal_text="No failed calls and no 404s.",
        three_star_text="The goal, keeping round-robin, with at most 3 replicas.",
        goal=lambda m: _no_failures(m) and m.http_404 == 0,
        efficient=lambda c, m: c.routing == "round_robin" and c.replicas <= 3,
        variants=(
            _ref("affinity", "Switch to session affinity", 1, routing="affinity"),
            _ref("shared-rr", "Shared session store, round-robin", 3, mode="2025-11-25/shared"),
            _ref("stateless-rr", "2026-07-28, round-robin", 3, mode="2026-07-28"),
            _trap(
                "six-rr",
                "Six replicas, still round-robin",
                "more failures than the set-up",
                lambda s, v: v.failed > s.failed,
                replicas=6,
            ),
        ),
    ),
    Mission(
        id=2,
        name="The silent minute",
        lesson=(
            "Slow tools go quiet longer than the proxy's idle timeout; in 2026-07-28 a cut cancels the work; "
            "keep-alive below the idle timeout is the real fix."
        ),
        briefing="Streams of slow calls are cut and cancelled: failed calls, duplicate side effects, ghost writes.",
        setup=LabConfig(
            mode="2026-07-28",
            routing="round_robin",
            replicas=3,
            idle_timeout_s=60,
            keepalive_s=None,
            slow_tools=True,
            seed=1,
        ),
        goal_text="No failed calls and no duplicate side effects.",
        three_star_text="The goal with no stream cuts, idle timeout at most 60 s and keep-alive at least 10 s.",
        goal=lambda m: _no_failures(m) and m.duplicate_side_effects == 0,
        efficient=lambda c, m: (
            m.stream_cuts == 0 and c.idle_timeout_s <= 60 and c.keepalive_s is not None and c.keepalive_s >= 10
        ),
        variants=(
            _ref("t120", "Raise the idle timeout to 120 s", 1, idle_timeout_s=120),
            _ref("shared", "2025-11-25 with a shared store (resumes the cuts)", 1, mode="2025-11-25/shared"),
            _ref("k15", "Keep-alive every 15 s", 3, keepalive_s=15),
            _ref("k30", "Keep-alive every 30 s", 3, keepalive_s=30),
            _trap(
                "idem-only",
                "Idempotency alone",
                "no duplicates, but calls still fail and ghost writes remain",
                lambda s, v: v.duplicate_side_effects == 0 and v.failed > 0 and v.ghost_writes > 0,
                idempotency=True,
            ),
            _trap(
                "k60",
                "Keep-alive equal to the idle timeout (60 s)",
                "changes nothing",
                lambda s, v: s == v,
                keepalive_s=60,
            ),
        ),
    ),
    Mission(
        id=3,
        name="Friday deploy",
        lesson="A short drain kills long calls; retries duplicate side effects unless tools are idempotent.",
        briefing="The rolling deploy kills running calls; their retries apply side effects twice.",
        setup=LabConfig(
            mode="2025-11-25/memory",
            routing="affinity",
            replicas=3,
            keepalive_s=15,
            drain_s=10,
            slow_tools=True,
            rolling_deploy=True,
            seed=1,
        ),
        goal_text="No duplicate side effects and no failed calls.",
        three_star_text="The goal with idempotency on and a drain window of at most 60 s.",
        goal=lambda m: _no_failures(m) and m.duplicate_side_effects == 0,
        efficient=lambda c, m: c.idempotency and c.drain_s <= 60,
        variants=(
            _ref("w250", "Drain for 250 s (no kills; a slow deploy)", 1, drain_s=250),
            _ref("idem-w30", "Idempotency on, drain 30 s", 3, idempotency=True, drain_s=30),
        ),
    ),
    Mission(
        id=4,
        name="One loud tenant",
        lesson=(
            "Affinity pins a hot client to one replica; more replicas don't help; round-robin needs shared sessions "
            "or 2026-07-28."
        ),
        briefing="One replica is saturated by the hot client while the others idle; p95 is minutes.",
        setup=LabConfig(mode="2025-11-25/memory", routing="affinity", replicas=3, keepalive_s=15, hot_client=True, seed=1),
        goal_text="p95 latency at most 10 s and no failed calls.",
        three_star_text="The goal with round-robin and at most 2 replicas.",
        goal=lambda m: _no_failures(m) and _p95_at_most(m, 10_000),
        efficient=lambda c, m: c.routing == "round_robin" and c.replicas <= 2,
        variants=(
            _ref("stateless-rr3", "2026-07-28, round-robin, 3 replicas", 1, mode="2026-07-28", routing="round_robin"),
            _ref(
                "shared-rr2",
                "Shared store, round-robin, 2 replicas",
                3,
                mode="2025-11-25/shared",
                routing="round_robin",
                replicas=2,
            ),
            _ref(
                "stateless-rr2",
                "2026-07-28, round-robin, 2 replicas",
                3,
                mode="2026-07-28",
                routing="round_robin",
                replicas=2,
            ),
            _trap(
                "affinity6",
                "Affinity with 6 replicas",
                "p95 still above 10 s: the hot client stays pinned",
                lambda s, v: v.p95_ms is not None and v.p95_ms > 10_000,
                replicas=6,
            ),
            _trap(
                "memory-rr",
                "Round-robin with sessions in memory",
                "hundreds of failures from 404s",
                lambda s, v: v.failed > 0 and v.http_404 > 0,
                routing="round_robin",
            ),
        ),
    ),
    Mission(
        id=5,
        name="Stateless, not carefree",
        lesson=(
            "2026-07-28 fixes routing, but every broken stream (cut or deploy kill) cancels work, so keep-alive and "
            "idempotency both matter."
        ),
        briefing="Cuts and deploy kills cancel calls: failures, duplicates and ghost writes.",
        setup=LabConfig(
            mode="2026-07-28",
            routing="round_robin",
            replicas=3,
            idle_timeout_s=60,
            keepalive_s=None,
            drain_s=20,
            slow_tools=True,
            rolling_deploy=True,
            seed=1,
        ),
        goal_text="No failed calls, no duplicate side effects and no ghost writes.",
        three_star_text=(
            "The goal, staying on 2026-07-28 with round-robin, at most 3 replicas, drain at most 60 s and idle "
            "timeout at most 60 s."
        ),
        goal=lambda m: _no_failures(m) and m.duplicate_side_effects == 0 and m.ghost_writes == 0,
        efficient=lambda c, m: (
            c.mode == "2026-07-28"
            and c.routing == "round_robin"
            and c.replicas <= 3
            and c.drain_s <= 60
            and c.idle_timeout_s <= 60
        ),
        variants=(
            _ref("k15-w250", "Keep-alive 15 s, drain 250 s", 1, keepalive_s=15, drain_s=250),
            _ref("k15-idem", "Keep-alive 15 s, idempotency on", 3, keepalive_s=15, idempotency=True),
            _ref("k15-idem-w60", "Keep-alive 15 s, idempotency on, drain 60 s", 3, keepalive_s=15, idempotency=True, drain_s=60),
            _trap(
                "k15-only",
                "Keep-alive alone",
                "deploy kills still duplicate side effects",
                lambda s, v: v.duplicate_side_effects >= 1,
                keepalive_s=15,
            ),
            _trap(
                "idem-only",
                "Idempotency alone",
                "calls still fail from cuts",
                lambda s, v: v.failed > 0 and v.stream_cuts > 0,
                idempotency=True,
            ),
        ),
    ),
    Mission(
        id=6,
        name="Peak-hour deploy",
        lesson="All three injections at once: capacity, routing, keep-alive, drain and idempotency together.",
        briefing="Minutes of latency, duplicates, hundreds of 404s and thousands of cut/resume cycles.",
        setup=LabConfig(
            mode="2025-11-25/memory",
            routing="affinity",
            replicas=4,
            keepalive_s=None,
            drain_s=20,
            slow_tools=True,
            rolling_deploy=True,
            hot_client=True,
            seed=1,
        ),
        goal_text="No failed calls, no duplicates, no ghost writes and p95 at most 30 s.",
        three_star_text="The goal with at most 6 replicas and a drain window of at most 120 s.",
        goal=lambda m: _no_failures(m) and m.duplicate_side_effects == 0 and m.ghost_writes == 0 and _p95_at_most(m, 30_000),
        efficient=lambda c, m: c.replicas <= 6 and c.drain_s <= 120,
        variants=(
            _ref("stateless-8", "Stateless fixes with 8 replicas", 1, replicas=8, **_STATELESS_FIXES),
            _ref("stateless-6", "Stateless fixes with 6 replicas", 3, replicas=6, **_STATELESS_FIXES),
            _trap(
                "stateless-4",
                "Stateless fixes with only 4 replicas",
                "p95 above 30 s: the hot client's slow calls saturate the slots",
                lambda s, v: v.p95_ms is None or v.p95_ms > 30_000,
                replicas=4,
                **_STATELESS_FIXES,
            ),
        ),
    ),
)


def get_mission(mission_id: int) -> Mission:
    """Mission `mission_id` (1–6); KeyError otherwise."""
    if not 1 <= mission_id <= len(MISSIONS):
        raise KeyError(f"no mission {mission_id}; missions are 1–{len(MISSIONS)}")
    return MISSIONS[mission_id - 1]


def score_mission(mission_id: int, config: LabConfig, result: LabResult | Metrics) -> Stars:
    """Stars for a run of mission `mission_id`: 0, 1 (goal met) or 3 (goal met efficiently).

    No stars below `MIN_REPLICAS_FOR_STARS` replicas, or with one of the mission's injections turned
    off (the injection is the scenario, not a control). The seed is not checked here; see
    `is_exploration()`.
    """
    mission = get_mission(mission_id)
    metrics = result.metrics if isinstance(result, LabResult) else result
    if config.replicas < MIN_REPLICAS_FOR_STARS:
        return 0
    if any(getattr(mission.setup, name) and not getattr(config, name) for name in _INJECTIONS):
        return 0
    if not mission.goal(metrics):
        return 0
    return 3 if mission.efficient(config, metrics) else 1


def is_exploration(mission_id: int, config: LabConfig) -> bool:
    """True when the seed is not the mission's pinned seed: the run is shown, but earns no stars."""
    return config.seed != get_mission(mission_id).pinned_seed


def calibration_problems(mission: Mission, *, seed: int | None = None) -> list[str]:
    """Every calibration check (set-up scores 0, each variant its stars, each trap its outcome) that fails for
    `mission` at `seed` (default: the pinned seed)."""

    setup = mission.setup if seed is None else mission.setup.replace(seed=seed)
    problems: list[str] = []
    base = simulate(setup).metrics
    got = score_mission(mission.id, setup, base)
    if got != 0:
        problems.append(f"M{mission.id} set-up scores {got} stars, expected 0")
    for v in mission.variants:
        cfg = v.apply(setup)
        m = simulate(cfg).metrics
        got = score_mission(mission.id, cfg, m)
        if got != v.stars:
            problems.append(f"M{mission.id} {v.kind} {v.key!r} scores {got} stars, expected {v.stars}")
        if v.check is not None and not v.check(base, m):
            problems.append(f"M{mission.id} trap {v.key!r}: expected {v.outcome!r}")
    return problems


# -- the lab shell's rules (docs/lab.md, invariant 26) ---------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Best stars per mission. Immutable: `record()` returns the new progress."""

    best: tuple[int, ...] = (0,) * len(MISSIONS)

    def unlocked(self, mission_id: int) -> bool:
        """Mission 1 is always open; mission k+1 opens once mission k has at least 1 star."""
        get_mission(mission_id)
        return mission_id == 1 or self.best[mission_id - 2] >= 1

    def record(self, mission_id: int, stars: int) -> Progress:
        """Keep the best star count: a worse retry never lowers it."""
        if not self.unlocked(mission_id):
            raise ValueError(f"mission {mission_id} is locked")
        best = list(self.best)
        best[mission_id - 1] = max(best[mission_id - 1], stars)
        return dataclasses.replace(self, best=tuple(best))


def new_seed(config: LabConfig, rng: random.Random | None = None) -> LabConfig:
    """ "New random seed": the same config with only the seed replaced (from OS entropy by default)."""
    source = rng if rng is not None else random.SystemRandom()
    return config.replace(seed=source.randrange(0, 2**31))
