"""The lab's web server keeps its memory bounded: summaries in its caches, never event logs.

The heaviest settings (the M6 set-up on one replica with a 10 s idle timeout and a 300 s drain) log
1.4 million records, about 120 MB each; a server that cached those grew by that much per slider
position. This test drives a real `breakwater lab serve` process with 200 runs of such settings and
reads its resident set size from /proc.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from breakwater.lab import get_mission

pytestmark = pytest.mark.long_module(88)

RSS_LIMIT_MB = 300
RUNS = 200
DISTINCT = 25
"""Distinct heavy configurations, cycled: each is a fresh simulation the first time it is asked for."""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(pid, port) of `breakwater lab serve --port 0` in a subprocess."""
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "lab", "serve", "--port", "0"], stdout=subprocess.PIPE, stderr=log
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "serving on http://127.0.0.1:" in line, line
        yield proc.pid, int(line.split("127.0.0.1:", 1)[1].split("/")[0])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.mark.timeout(300)
def test_rss_stays_under_300_mb_after_200_heavy_runs(server: tuple[int, int]) -> None:
    """200 runs over 25 of the heaviest configurations; the server's RSS stays under 300 MB throughout."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux /proc")
    pid, port = server
    heavy = get_mission(6).setup.replace(replicas=1, idle_timeout_s=10)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    peak = 0.0
    started = time.monotonic()
    for i in range(RUNS):
        config = heavy.replace(drain_s=300 - i % DISTINCT)
        body = json.dumps({"mission": 6, "config": config.to_dict()})
        conn.request("POST", "/api/run", body=body, headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        answer = json.loads(res.read())
        assert res.status == 200
        assert answer["metrics"]["stream_cuts"] > 10_000  # it really is a heavy run
        peak = max(peak, _rss_mb(pid))
    conn.close()
    elapsed = time.monotonic() - started
    print(f"lab serve: {RUNS} runs ({DISTINCT} distinct) in {elapsed:.1f} s, peak RSS {peak:.0f} MB")
    assert peak < RSS_LIMIT_MB, f"peak RSS {peak:.0f} MB"
