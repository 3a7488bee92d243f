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
    # A home of its own, where nothing may be left: the learned revisions of its servers (new paths and ports each
    # run) piled up in the user's cache, run after run.
    home = tmp_path / "h"
    run = Path(tempfile.mkdtemp(prefix="bw-demo-run-"))  # short: a socket's path must fit in ~107 bytes
    dirs = {
        "XDG_CACHE_HOME": ".cache",
        "XDG_DATA_HOME": ".local/share",
        "XDG_STATE_HOME": ".local/state",
        "XDG_CONFIG_HOME": ".config",
    }
    env = {**os.environ, "HOME": str(home), **{name: str(home / sub) for name, sub in dirs.items()}, "XDG_RUNTIME_DIR": str(run)}
    done = subprocess.run(
        [sys.executable, "-m", "breakwater", "demo"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**env, "BREAKWATER_SHARE": "on"},  # the user's default: the demo must not share regardless
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
    # Nothing outlives it: its temporary directory is gone, and nothing is left in the user's home or runtime directory
    # (no shared gateway, no cache).
    assert set(Path(tempfile.gettempdir()).glob("breakwater-demo-*")) <= before
    left = sorted(str(path) for place in (home, run) for path in place.rglob("*") if not path.is_dir())
    assert left == [], left
