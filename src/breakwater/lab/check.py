"""`breakwater lab check`: on how many seeds each mission's set-up, reference and trap earns its stated stars.

A mission teaches only if its verdicts survive other traffic: "New random seed" exists so a player
can check that a fix was not luck. This module replays every set-up, reference and trap over a
range of seeds and records the seeds on which each one scores what it states (a set-up 0 stars, a
reference its stars, a trap its stars and its documented outcome).

Runs go through `engine.run`, not the memoised `simulate`: a check makes hundreds of runs once
each, and keeping their event logs would only cost memory.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from breakwater.lab.config import LabConfig
from breakwater.lab.engine import run
from breakwater.lab.metrics import Metrics
from breakwater.lab.missions import MISSIONS, Mission, Stars, score_mission
from breakwater.lab.traffic import CallSpec, generate_traffic

__all__ = ["DEFAULT_SEEDS", "CheckRow", "check_missions", "parse_seeds", "verdicts"]

DEFAULT_SEEDS: Final = "1-40"
"""The seed range the missions are designed to hold on (at least 38 of these 40 seeds)."""
_SEED_PART: Final = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckRow:
    """One set-up, reference or trap of one mission, and the seeds on which it earns its stated stars."""

    mission: int
    key: str
    """`setup`, or the variant's key."""
    kind: Literal["setup", "reference", "trap"]
    stars: Stars
    """What it states: 0 for a set-up and a trap."""
    holds: tuple[int, ...]
    """The seeds on which it earned its stated stars (and, for a trap, its documented outcome)."""
    of: int
    """Seeds tried."""

    @property
    def misses(self) -> int:
        """Seeds tried on which it did not hold."""
        return self.of - len(self.holds)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON values: `mission`, `key`, `kind`, `stars`, `holds` (seeds), `of`."""
        return {
            "mission": self.mission,
            "key": self.key,
            "kind": self.kind,
            "stars": self.stars,
            "holds": list(self.holds),
            "of": self.of,
        }


def parse_seeds(text: str) -> tuple[int, ...]:
    """Seeds from `"1-40"`, `"7"` or `"1-5,9,12-13"`, in the order given, without repeats."""
    seeds: dict[int, None] = {}
    for part in text.split(","):
        match = _SEED_PART.match(part)
        if match is None:
            raise ValueError(f"bad seed range {part.strip()!r}: use N, N-M or a comma-separated list of them")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low:
            raise ValueError(f"bad seed range {part.strip()!r}: the end is before the start")
        if high - low >= 10_000:
            raise ValueError(f"seed range {part.strip()!r} is too long (at most 10 000 seeds)")
        seeds.update(dict.fromkeys(range(low, high + 1)))
    return tuple(seeds)


@functools.lru_cache(maxsize=4)
def _traffic(seed: int, hot: bool) -> tuple[CallSpec, ...]:
    # Every variant of one seed shares its traffic; a few seeds' worth is all a check needs at once.
    return generate_traffic(seed, hot)


def _metrics(config: LabConfig) -> Metrics:
    return run(config, _traffic(config.seed, config.hot_client)).metrics


def verdicts(mission: Mission, seed: int) -> dict[str, bool]:
    """For one seed: `setup` and each variant's key → whether it earns what it states."""
    setup = mission.setup.replace(seed=seed)
    base = _metrics(setup)
    out = {"setup": score_mission(mission.id, setup, base) == 0}
    for v in mission.variants:
        config = v.apply(setup)
        m = base if config == setup else _metrics(config)
        held = score_mission(mission.id, config, m) == v.stars
        out[v.key] = held and (v.check is None or v.check(base, m))
    return out


def check_missions(seeds: Sequence[int], missions: Iterable[Mission] = MISSIONS) -> list[CheckRow]:
    """One row per mission set-up, reference and trap, in mission order, over `seeds`."""
    rows: list[CheckRow] = []
    for mission in missions:
        held: dict[str, list[int]] = {"setup": [], **{v.key: [] for v in mission.variants}}
        for seed in seeds:
            for key, ok in verdicts(mission, seed).items():
                if ok:
                    held[key].append(seed)
        rows.append(CheckRow(mission=mission.id, key="setup", kind="setup", stars=0, holds=tuple(held["setup"]), of=len(seeds)))
        rows.extend(
            CheckRow(mission=mission.id, key=v.key, kind=v.kind, stars=v.stars, holds=tuple(held[v.key]), of=len(seeds))
            for v in mission.variants
        )
    return rows
