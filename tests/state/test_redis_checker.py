"""The Jepsen-style checker of bench/shared_state.py, CI-sized (a few seeds, well under 60 s).

Each seed runs 3 replica processes (clocks skewed up to ±60 s) through one breaker against a
redis-server of its own, with upstream health flips, SIGSTOP/SIGCONT pauses and Redis restarts,
then checks probe exclusivity and epoch monotonicity over the recorded history. The big run is
`python bench/shared_state.py check --big`.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import require

BENCH = Path(__file__).resolve().parents[2] / "bench" / "shared_state.py"


def _checker() -> object:
    spec = importlib.util.spec_from_file_location("shared_state_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checker_finds_planted_violations() -> None:
    """The checker is not vacuous: overlapping probes and a backwards epoch are reported."""
    check = _checker().check  # type: ignore[attr-defined]
    history = [
        {"ev": "permit", "w": 0, "epoch": 10, "probe": True, "shared": True, "t_req": 1.0, "t": 1.0},
        {"ev": "probe_end", "w": 0, "epoch": 10, "shared": True, "t": 1.3},
        {"ev": "permit", "w": 1, "epoch": 9, "probe": True, "shared": True, "t_req": 1.1, "t": 1.1},
    ]
    violations = check(history)["violations"]
    assert any("overlap" in v for v in violations)
    history[2].update(t_req=2.0, t=2.0)
    history.append({"ev": "probe_end", "w": 1, "epoch": 9, "shared": True, "t": 2.1})
    assert any("backwards" in v for v in check(history)["violations"])


def test_no_violations_under_pauses_restarts_and_skew() -> None:
    if shutil.which("redis-server") is None:
        require("redis-server is not installed")
    result = subprocess.run(
        [sys.executable, str(BENCH), "check", "--seeds", "2", "--duration", "7", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    runs = json.loads(result.stdout)
    assert [r["violations"] for r in runs] == [[], []], result.stdout
    assert sum(r["shared_probes"] for r in runs) > 0  # the run did reach half-open and probe
