"""What `breakwater stats` shows a person after a slow afternoon (issue 19's scenario, run by hand through `serve`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from breakwater.journal import AttemptRecord, Journal, SQLiteJournalStore

BREAKWATER = [sys.executable, "-m", "breakwater"]


def test_stats_prints_a_learned_timeout_to_three_digits_after_an_incident(tmp_path: Path) -> None:
    """A 0.2 s tool cut at its 1 s learned timeout, then at the 2.02 s one that followed: its learned timeout is a
    histogram quantile times 2, and the table printed it as `4.06788 s learned` (and report's `16.1701 s`), six
    digits beside latency columns of three."""
    db = tmp_path / "journal.sqlite"
    journal = Journal(SQLiteJournalStore(db))
    now = time.time()
    answered = [0.17, 0.18, 0.19, 0.2, 0.21, 0.22, 0.23, 0.25, 0.27, 0.29] * 2
    cuts = [1.0, 1.0, 2.02, 0.85, 0.85, 0.85]  # two timeouts at 1 s, one at the 2.02 s that followed, three probes
    for i, duration in enumerate(answered + cuts):
        outcome = "completed" if i < len(answered) else "timeout"
        journal.record(
            AttemptRecord(
                server="shop",
                tool="search",
                call_id=f"c{i}",
                attempt=1,
                started_at=now - 60 + i,
                duration_s=duration,
                outcome=outcome,
                error_code=None if outcome == "completed" else "TIMEOUT",
            )
        )
    journal.close()
    env = dict(os.environ, COLUMNS="200", BREAKWATER_JOURNAL_LEARN_MIN_SAMPLES="10")
    run = subprocess.run(
        [*BREAKWATER, "stats", "--journal", str(db), "--since", "1h"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if "search" in line)
    # q99.9 of the samples is the 2.02 s cut, held to HANG_FACTOR (4) times the answers' own (the 0.29 s cell), times 2:
    # about 2.34 s, shown as such (the histogram's cell value printed in full read "2.33742 s").
    assert re.search(r"\b2\.3[345] s learned", row), row
