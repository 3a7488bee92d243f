"""Synthetic traffic and the lab's random numbers (one seeded stream, drawn in a fixed order).

Common random numbers: each purpose has its own stream derived from the seed by hashing, and every
call draws the same values in the same order whether or not an injection uses them. So traffic is a
function of the seed alone, and toggling a control or injection never reshuffles it.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import struct
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final

from breakwater.lab.config import (
    CLIENTS,
    DURATION_CAP_MS,
    DURATION_MEDIAN_S,
    DURATION_SIGMA,
    HOT_RATE_PER_S,
    MUT_FRAC_HIGH,
    MUT_FRAC_LOW,
    MUT_P,
    PROGRESS_GAP_MAX_MS,
    PROGRESS_GAP_MIN_MS,
    PROGRESS_GAPS,
    RATE_PER_S,
    SLOW_MAX_MS,
    SLOW_MIN_MS,
    SLOW_P,
    WINDOW_MS,
)

__all__ = ["HOT_CLIENT", "HOT_ID_BASE", "CallSpec", "generate_traffic", "route_u", "stream_rng"]

HOT_CLIENT: Final = 0
HOT_ID_BASE: Final = 1_000_000
"""Hot-client call ids start here, so they never collide with base ids."""

_UNIT: Final = NormalDist()
# A uniform draw of exactly 0 would give inv_cdf(0) = -inf; clamp into the open interval.
_TINY: Final = 1e-12


@dataclass(frozen=True, kw_only=True, slots=True)
class CallSpec:
    """One logical call's fixed work. Every attempt of the call does exactly this work."""

    id: int
    client: int
    arrival_ms: int
    base_duration_ms: int
    """Duration when the call is not slow (log-normal, capped)."""
    mutating: bool
    mut_frac: float
    """Where in the run the side effect happens, as a fraction of the duration."""
    slow_u: float
    """The call is slow under Slow tools when this is below `SLOW_P`."""
    slow_duration_ms: int
    progress_gaps_ms: tuple[int, ...]
    """Gaps between progress bytes of a slow call; the first is measured from execution start."""

    def is_slow(self, slow_tools: bool) -> bool:
        """Whether this call runs slow under the given Slow tools setting."""
        return slow_tools and self.slow_u < SLOW_P

    def duration_ms(self, slow_tools: bool) -> int:
        """The execution time of every attempt of this call."""
        return self.slow_duration_ms if self.is_slow(slow_tools) else self.base_duration_ms

    def progress_offsets_ms(self, slow_tools: bool) -> tuple[int, ...]:
        """Progress byte offsets from execution start that fall strictly before completion."""
        if not self.is_slow(slow_tools):
            return ()  # normal calls emit no progress [design]
        out: list[int] = []
        at = 0
        for gap in self.progress_gaps_ms:
            at += gap
            if at >= self.slow_duration_ms:
                break
            out.append(at)
        return tuple(out)


def _seed64(seed: int, label: str) -> int:
    digest = hashlib.sha256(f"{seed}|{label}".encode()).digest()
    value: int = struct.unpack(">Q", digest[:8])[0]
    return value


def stream_rng(seed: int, label: str) -> random.Random:
    """An independent PRNG for one purpose (`traffic`, `hot`), derived from the seed by hashing."""
    return random.Random(_seed64(seed, label))


# Called for every round-robin hop: the layout is compiled once and the hash bound at import.
_ROUTE_HOP: Final = struct.Struct(">QQBBH").pack
_blake2b: Final = hashlib.blake2b


def route_u(route_key: int, call_id: int, attempt: int, hop_kind: int, hop_index: int) -> float:
    """Counter-based uniform in [0, 1) for one routing decision.

    `route_key` is `_seed64(seed, "route")`. Being a hash of the decision's coordinates, a pick never
    depends on how many other draws happened before it.
    """
    raw = _ROUTE_HOP(route_key, call_id, attempt, hop_kind, hop_index)
    value = int.from_bytes(_blake2b(raw, digest_size=8).digest(), "big")
    return value / 18446744073709551616.0  # 2**64


def route_key(seed: int) -> int:
    """The per-seed key of the counter-based routing hash."""
    return _seed64(seed, "route")


def _draw_call(rng: random.Random, call_id: int, client: int | None, arrival_ms: int) -> CallSpec:
    # Fixed draws in a fixed order, so a seed means one traffic everywhere: client, duration, mutating, fraction, slow_u, slow
    # duration, six gaps. The client draw happens even for the hot stream, so both streams share
    # one recipe.
    rnd = rng.random
    drawn_client = min(int(rnd() * CLIENTS), CLIENTS - 1)
    z = _UNIT.inv_cdf(min(max(rnd(), _TINY), 1.0 - _TINY))
    seconds = DURATION_MEDIAN_S * math.exp(DURATION_SIGMA * z)
    base = max(1, min(DURATION_CAP_MS, round(seconds * 1000)))
    mutating = rnd() < MUT_P
    frac = MUT_FRAC_LOW + (MUT_FRAC_HIGH - MUT_FRAC_LOW) * rnd()
    slow_u = rnd()
    slow = round(SLOW_MIN_MS + (SLOW_MAX_MS - SLOW_MIN_MS) * rnd())
    gaps = tuple(round(PROGRESS_GAP_MIN_MS + (PROGRESS_GAP_MAX_MS - PROGRESS_GAP_MIN_MS) * rnd()) for _ in range(6))
    assert len(gaps) == PROGRESS_GAPS
    return CallSpec(
        id=call_id,
        client=drawn_client if client is None else client,
        arrival_ms=arrival_ms,
        base_duration_ms=base,
        mutating=mutating,
        mut_frac=frac,
        slow_u=slow_u,
        slow_duration_ms=slow,
        progress_gaps_ms=gaps,
    )


def _stream(seed: int, label: str, rate_per_s: float, first_id: int, client: int | None, window_ms: int) -> tuple[CallSpec, ...]:
    rng = stream_rng(seed, label)
    out: list[CallSpec] = []
    t_s = 0.0
    window_s = window_ms / 1000
    while True:
        t_s += -math.log(1.0 - rng.random()) / rate_per_s
        if t_s >= window_s:
            break
        arrival = min(round(t_s * 1000), window_ms - 1)
        out.append(_draw_call(rng, first_id + len(out), client, arrival))
    return tuple(out)


# A hot seed's traffic is about 1 MB of CallSpecs: a handful of seeds is all a page or a check revisits.
@functools.lru_cache(maxsize=8)
def generate_traffic(seed: int, hot: bool = False, window_ms: int = WINDOW_MS) -> tuple[CallSpec, ...]:
    """The calls offered in one run: the base stream, plus the hot client's stream when `hot`.

    Pure and cached: the result depends only on `(seed, hot, window_ms)`, and the base calls are
    identical either way. Ordered by arrival, then id. Each stream is drawn in arrival order until
    the window ends, so a longer window starts with the same calls as a shorter one.
    """
    base = _stream(seed, "traffic", RATE_PER_S, 0, None, window_ms)
    if not hot:
        return base
    extra = _stream(seed, "hot", HOT_RATE_PER_S, HOT_ID_BASE, HOT_CLIENT, window_ms)
    return tuple(sorted(base + extra, key=lambda c: (c.arrival_ms, c.id)))
