"""The six missions, their star rules, calibration checks and the shell's progress rules (unlocks, best stars).

A mission is a broken set-up at a pinned seed, a goal (1 star) and efficiency conditions (3 stars).
Each mission lists references and traps: named changes to the set-up with the stars they must earn,
at the pinned seed and on at least 38 of seeds 1–40. `calibration_problems()` checks one seed;
`breakwater.lab.check` checks a range of them. Goals and 3-star rules are `Condition` lists
(`breakwater.lab.goals`), so a verdict can say which condition failed and by how much.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from breakwater.lab.config import MIN_REPLICAS_FOR_STARS, LabConfig
from breakwater.lab.engine import simulate
from breakwater.lab.goals import Condition, control, metric, no_failures
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


@dataclass(frozen=True, kw_only=True, slots=True)
class Variant:
    """A named change to a mission's set-up, and what it must score (on at least 38 of seeds 1–40)."""

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
    why: str = ""
    """Why a trap does what it does: the page shows it once the player has tried the trap."""

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
            "why": self.why,
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
    goal: tuple[Condition, ...]
    """All must hold for 1 star."""
    efficiency: tuple[Condition, ...]
    """With the goal, all must hold for 3 stars."""
    variants: tuple[Variant, ...] = field(default=())

    @property
    def pinned_seed(self) -> int:
        """The seed stars are awarded at."""
        return self.setup.seed

    @property
    def goal_text(self) -> str:
        """The goal in words."""
        text = _join(c.text() for c in self.goal)
        return f"{text[0].upper()}{text[1:]}."

    @property
    def three_star_text(self) -> str:
        """The 3-star rule in words."""
        return f"The goal with {_join(c.text() for c in self.efficiency)}."

    @property
    def fix(self) -> Variant:
        """The first 3-star reference: what `--fix` applies."""
        return next(v for v in self.variants if v.kind == "reference" and v.stars == 3)

    def variant(self, key: str) -> Variant:
        """The variant named `key`; KeyError lists the known keys."""
        for v in self.variants:
            if v.key == key:
                return v
        keys = [v.key for v in self.variants]
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(f"mission {self.id} has no variant {key!r}; {hint}known: {', '.join(keys)}")

    def meets_goal(self, config: LabConfig, metrics: Metrics) -> bool:
        """Every goal condition holds."""
        return all(c.holds(config, metrics) for c in self.goal)

    def efficient(self, config: LabConfig, metrics: Metrics) -> bool:
        """Every 3-star condition holds (the goal aside)."""
        return all(c.holds(config, metrics) for c in self.efficiency)

    def explain(self, config: LabConfig, metrics: Metrics) -> dict[str, list[dict[str, object]]]:
        """Each goal and 3-star condition with the value seen, whether it holds and by how much it misses."""
        return {
            "goal": [c.explain(config, metrics) for c in self.goal],
            "three_stars": [c.explain(config, metrics) for c in self.efficiency],
        }

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values for the page: texts, set-up, pinned seed, conditions and variants."""
        return {
            "id": self.id,
            "name": self.name,
            "lesson": self.lesson,
            "briefing": self.briefing,
            "setup": self.setup.to_dict(),
            "pinned_seed": self.pinned_seed,
            "goal": self.goal_text,
            "three_stars": self.three_star_text,
            "goal_conditions": [c.text() for c in self.goal],
            "three_star_conditions": [c.text() for c in self.efficiency],
            "variants": [v.to_dict() for v in self.variants],
        }


def _join(parts: Iterable[str]) -> str:
    items = list(parts)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ref(key: str, label: str, stars: Stars, **changes: object) -> Variant:
    return Variant(key=key, kind="reference", label=label, changes=MappingProxyType(changes), stars=stars)


def _trap(key: str, label: str, outcome: str, check: Callable[[Metrics, Metrics], bool], why: str, **changes: object) -> Variant:
    return Variant(
        key=key,
        kind="trap",
        label=label,
        changes=MappingProxyType(changes),
        stars=0,
        outcome=outcome,
        check=check,
        why=why,
    )


_FAILED: Final = no_failures()
_NO_DUPLICATES: Final = metric("duplicate_side_effects", "duplicate side effects", "<=", 0)
_NO_GHOSTS: Final = metric("ghost_writes", "ghost writes", "<=", 0)
_ROUND_ROBIN: Final = control("routing", "routing", "==", "round_robin")
_STATELESS_FIXES: Final = {
    "mode": "2026-07-28",
    "routing": "round_robin",
    "keepalive_s": 15,
    "idempotency": True,
    "drain_s": 120,
}

# Every set-up, reference and trap below earns what it states on at least 38 of seeds 1–40
# (`breakwater lab check`, tests/lab/test_check.py). Goals are zero-tolerance only where the fix
# makes the count zero by construction (keep-alive below T: no cuts; idempotency: no duplicates; a
# drain longer than the longest call: no kills); latency goals keep a margin of seconds both ways.
MISSIONS: Final[tuple[Mission, ...]] = (
    Mission(
        id=1,
        name="Sticky by accident",
        lesson="2025-11-25 sessions live in one replica; round-robin produces 404/re-initialize storms.",
        briefing="About one call in five fails, with thousands of 404s and as many re-initializations.",
        setup=LabConfig(mode="2025-11-25/memory", routing="round_robin", replicas=3, keepalive_s=15, seed=1),
        goal=(_FAILED, metric("http_404", "404s", "<=", 0)),
        efficiency=(_ROUND_ROBIN, control("replicas", "replicas", "<=", 3)),
        variants=(
            _ref("affinity", "Switch to session affinity", 1, routing="affinity"),
            _ref("shared-rr", "Shared session store, round-robin", 3, mode="2025-11-25/shared"),
            _ref("stateless-rr", "2026-07-28, round-robin", 3, mode="2026-07-28"),
            _trap(
                "six-rr",
                "Six replicas, still round-robin",
                "more failures than the set-up",
                lambda s, v: v.failed > s.failed,
                "An attempt finds its session only on the replica that holds it: 1 chance in 3 with three "
                "replicas, 1 in 6 with six. More replicas make each of the four attempts likelier to get a 404.",
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
        goal=(_FAILED, _NO_DUPLICATES),
        efficiency=(
            metric("stream_cuts", "stream cuts", "<=", 0),
            control("idle_timeout_s", "idle timeout", "<=", 60, unit="s"),
            control("keepalive_s", "keep-alive interval", ">=", 10, unit="s"),
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
                "Idempotency stops a repeated side effect, not the cut: each attempt of a slow call goes silent "
                "for 45–90 s, the proxy cuts it at 60 s, and in 2026-07-28 a cut cancels the work. After four "
                "attempts the call fails, and the side effect an attempt already applied stays: a ghost write.",
                idempotency=True,
            ),
            _trap(
                "k60",
                "Keep-alive equal to the idle timeout (60 s)",
                "changes nothing",
                lambda s, v: s == v,
                "The keep-alive is written after K seconds of silence, and the proxy cuts after T. With K = T "
                "the cut comes first (a byte at exactly T is too late), so nothing changes: K must be below T.",
                keepalive_s=60,
            ),
        ),
    ),
    Mission(
        id=3,
        name="Friday deploy",
        lesson=(
            "A drain window shorter than the longest call kills it mid-run: its work is lost, and the retry may "
            "apply its side effect twice. Idempotency makes the retry safe; only a drain longer than the long "
            "calls saves the work."
        ),
        briefing="The rolling deploy kills running calls after a 10 s drain; some retries apply side effects twice.",
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
        goal=(_FAILED, _NO_DUPLICATES, metric("deploy_kills", "calls killed by the deploy", "<=", 0)),
        # The slowest tool runs 240 s: a drain just past it is enough, and each extra second of drain
        # makes every deploy slower (three replicas: 3 × (W + 15 s)).
        efficiency=(control("drain_s", "drain window", "<=", 260, unit="s"),),
        variants=(
            _ref("w250", "Drain for 250 s, longer than the slowest call", 3, drain_s=250),
            _ref("w250-idem", "Drain for 250 s, idempotency on", 3, drain_s=250, idempotency=True),
            _ref("w300", "Drain for 300 s (the deploy takes until 1 065 s)", 1, drain_s=300),
            _trap(
                "idem-only",
                "Idempotency alone",
                "no duplicates, but the deploy still kills long calls",
                lambda s, v: v.duplicate_side_effects == 0 and v.deploy_kills > 0,
                "Idempotency makes the retry safe, but the killed call has still lost its work and starts over "
                "on another replica. Slow tools run 60–240 s; a 10 s drain cannot let them finish.",
                idempotency=True,
            ),
            _trap(
                "w45",
                "Drain for 45 s",
                "the deploy still kills long calls",
                lambda s, v: v.deploy_kills > 0,
                "45 s outlasts every ordinary call (the cap is 30 s) but not the slow tools, which run up to "
                "240 s: any still running when the window closes is killed.",
                drain_s=45,
            ),
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
        goal=(_FAILED, metric("p95_ms", "p95 latency", "<=", 10_000, unit="ms")),
        efficiency=(_ROUND_ROBIN, control("replicas", "replicas", "<=", 2)),
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
                "Affinity sends every call of a client to its one pinned replica. The hot client's 5 calls/s "
                "need more than one replica's ten slots, so its queue grows however many replicas sit idle.",
                replicas=6,
            ),
            _trap(
                "memory-rr",
                "Round-robin with sessions in memory",
                "hundreds of failures from 404s",
                lambda s, v: v.failed > 0 and v.http_404 > 0,
                "Round-robin spreads the load, but each session lives in one replica's memory: most attempts "
                "land on another replica, get a 404 and re-initialize, and many calls run out of attempts.",
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
        briefing=(
            "Silent slow calls are cut and cancelled, and a deploy that stops replicas at once kills what runs: "
            "failures, duplicates and ghost writes."
        ),
        setup=LabConfig(
            mode="2026-07-28",
            routing="round_robin",
            replicas=3,
            idle_timeout_s=60,
            keepalive_s=None,
            drain_s=0,
            slow_tools=True,
            rolling_deploy=True,
            seed=1,
        ),
        goal=(_FAILED, _NO_DUPLICATES, _NO_GHOSTS),
        efficiency=(
            control("mode", "protocol", "==", "2026-07-28"),
            _ROUND_ROBIN,
            control("replicas", "replicas", "<=", 3),
            control("drain_s", "drain window", "<=", 60, unit="s"),
            control("idle_timeout_s", "idle timeout", "<=", 60, unit="s"),
        ),
        variants=(
            _ref("k15-idem", "Keep-alive 15 s, idempotency on", 3, keepalive_s=15, idempotency=True),
            _ref("k15-idem-w60", "Keep-alive 15 s, idempotency on, drain 60 s", 3, keepalive_s=15, idempotency=True, drain_s=60),
            _ref("k15-w250", "Keep-alive 15 s, drain 250 s", 1, keepalive_s=15, drain_s=250),
            _trap(
                "k15-only",
                "Keep-alive alone",
                "deploy kills still duplicate side effects",
                lambda s, v: v.duplicate_side_effects >= 1,
                "Keep-alive ends the idle cuts, but a deploy without a drain still kills every running call. "
                "The client re-issues it, and a mutating call killed after its side effect applies it again.",
                keepalive_s=15,
            ),
            _trap(
                "idem-only",
                "Idempotency alone",
                "calls still fail from cuts",
                lambda s, v: v.failed > 0 and v.stream_cuts > 0,
                "Idempotency removes the duplicates, but every silent minute still cuts a slow call's stream, "
                "and in 2026-07-28 a cut cancels the call; cut on all four attempts, it fails.",
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
        goal=(_FAILED, _NO_DUPLICATES, _NO_GHOSTS, metric("p95_ms", "p95 latency", "<=", 30_000, unit="ms")),
        efficiency=(control("drain_s", "drain window", "<=", 120, unit="s"),),
        variants=(
            _ref("stateless-8", "Stateless fixes with 8 replicas", 3, replicas=8, **_STATELESS_FIXES),
            _ref(
                "stateless-8-w200",
                "Stateless fixes with 8 replicas, drain 200 s",
                1,
                **{**_STATELESS_FIXES, "replicas": 8, "drain_s": 200},
            ),
            _trap(
                "stateless-4",
                "Stateless fixes with only 4 replicas",
                "p95 above 30 s: the hot client's slow calls saturate the slots",
                lambda s, v: v.p95_ms is None or v.p95_ms > 30_000,
                "Round-robin spreads the hot client, but its calls and the slow tools need about 40 busy slots "
                "on average, more in a burst, and a deploy takes a replica out: 4 replicas (40 slots) queue.",
                replicas=4,
                **_STATELESS_FIXES,
            ),
            _trap(
                "no-keepalive-8",
                "Stateless fixes with 8 replicas, but no keep-alive",
                "dozens of failed calls from cuts",
                lambda s, v: v.failed > 0 and v.stream_cuts > 0,
                "Capacity cures the queue, not the silence: slow tools still go quiet for 45–90 s, the proxy cuts "
                "them at 60 s, and in 2026-07-28 each cut cancels the call.",
                **{**_STATELESS_FIXES, "replicas": 8, "keepalive_s": None},
            ),
            _trap(
                "affinity-8",
                "Stateless fixes with 8 replicas, but affinity",
                "p95 still minutes: the hot client stays pinned",
                lambda s, v: v.p95_ms is None or v.p95_ms > 30_000,
                "Affinity pins the hot client to one replica, however many there are: its queue grows there.",
                **{**_STATELESS_FIXES, "replicas": 8, "routing": "affinity"},
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
    if not mission.meets_goal(config, metrics):
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
