"""The connect-storm benchmark runs end to end (a miniature storm) and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.long_module(71)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "connect_storm.py"


def test_miniature_storm_reports_both_clients() -> None:
    """Both clients run in one invocation; breakwater connects everything with about one attempt per connect."""
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sessions", "3", "--servers", "2", "--work", "0.05", "--repeats", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) >= {"bound_s", "naive", "breakwater"}
    bw = figures["breakwater"]
    assert bw["connected_min"] == 1.0
    assert 1.0 <= bw["attempts_per_connect"] <= 1.05
    # Per-server cap 2, two servers: never more than four handshakes in flight.
    assert bw["peak_in_flight"] <= 4
    assert "x bound" in result.stdout


def test_miniature_storm_of_attached_sessions_connects_each_server_once_and_reports_its_floor() -> None:
    """Sessions that attach to one shared gateway: one upstream connect per server, and the in-run floor beside it."""
    storm = ["--only", "attached", "--sessions", "3", "--servers", "2", "--work", "0.05", "--repeats", "1", "--json"]
    result = subprocess.run(
        [sys.executable, str(BENCH), *storm],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])["attached"]
    assert figures["connected_min"] == 1.0
    assert figures["upstream_connects"] == 2  # three sessions, two servers: each connected once
    [floor] = figures["floor_s"]
    assert floor > 0
    assert "start-up above the floor" in result.stdout
