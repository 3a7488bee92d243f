"""`breakwater demo`, the README's first command: the whole story on its built-in servers, and nothing left behind.

One real run (about 25 s): `breakwater demo` piped, as `make demo | cat` runs it, with its own servers, its own
gateway and its own journal. What a user would check: it ends with exit 0, every act of the story is told with
the answer the agent saw, the journal's table is printed, and no process, gateway or directory outlives it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.long_module(33)


def test_the_demo_tells_the_whole_story_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = set(Path(tempfile.gettempdir()).glob("breakwater-demo-*"))
    # The worker's home (conftest) is shared by its tests: what another test's gateways left there is not the demo's.
    gateways = Path(os.environ["XDG_CACHE_HOME"]) / "breakwater" / "gateways"
    gateways_before = set(gateways.glob("gw-*"))
    done = subprocess.run(
        [sys.executable, "-m", "breakwater", "demo"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "BREAKWATER_SHARE": "on"},  # the user's default: the demo must not share regardless
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in out + done.stderr
    for act in ("1. Start-up", "2. Where is tool X?", "3. search.web_search turns 40 s slow", "4. A destructive call"):
        assert act in out, act
    # The three-way answer, the slow tool's breaker, the destructive call's honest outcome, the journal.
    for code in ("UNKNOWN_TOOL", "SERVER_CONNECTING", "SERVER_UNAVAILABLE", "CIRCUIT_OPEN", "OUTCOME_UNKNOWN"):
        assert code in out, code
    assert "breakwater stats" in out and "journal.sqlite3" in out
    # Nothing outlives it: its temporary directory is gone, and no shared gateway was started in the user's cache.
    assert set(Path(tempfile.gettempdir()).glob("breakwater-demo-*")) <= before
    assert set(gateways.glob("gw-*")) <= gateways_before, sorted(gateways.glob("gw-*"))
