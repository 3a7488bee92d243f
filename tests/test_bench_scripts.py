"""The benchmark scripts still run and print their figures, at their smallest size.

Nothing else runs most of `bench/*.py`, so they broke unseen for sessions at a time (a `Breakwater`
driven without `async with`, a division by zero under a small `--calls`, a journal read before the
shared gateway that held it had flushed). Each script runs as a user runs it, a process started from
the repository's root; nothing is imported from `bench/`. Not here: the valgrind scripts
(gate_instructions, proxy_instructions, upstream_cost: 10-25 s each even at 20 calls), those that
need Redis or PostgreSQL, those tested elsewhere (connect_storm, exactly_once, shared_state's
checker) and those whose smallest run is over 8 s (fleet, shared_gateway, slow_tool).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.long_module(40)

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str) -> str:
    """The script's stdout; its stderr's tail in the failure message when it exits non-zero."""
    done = subprocess.run(
        [sys.executable, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def figure(pattern: str, text: str) -> float:
    """The number `pattern`'s first group captures in `text` (the pattern must be there)."""
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


def test_gate_overhead_prints_the_gate_alone_and_the_rejection_against_an_sdk_call() -> None:
    out = run_bench("gate_overhead.py", "--rounds", "2", "--batch", "5")
    assert "calls per side: 10; journal on (SQLite)" in out
    assert figure(r"gate alone p50\s+([\d.]+) us", out) > 0
    assert figure(r"open-breaker rejection \(envelope result\) p50\s+([\d.]+) us", out) > 0
    # An in-process SDK call costs hundreds of µs, a refusal tens: the ratio is well above 1 even on a loaded host.
    assert figure(r"rejection vs direct SDK call: (\d+)x faster", out) > 1


def test_lab_prints_each_case_with_its_events_and_verdict() -> None:
    out = run_bench("lab.py", "--repeat", "1", "--skip-24h")
    for case in ("default, 10 min", "M6 set-up (heaviest)", *(f"M{i} set-up " for i in range(1, 6))):
        row = re.search(rf"^{re.escape(case)}.*$", out, re.MULTILINE)
        assert row is not None, f"no row {case!r} in:\n{out}"
        calls = figure(r"calls\s+(\d+)", row.group(0))
        assert calls > 0 and figure(r"events\s+(\d+)", row.group(0)) >= calls
        assert re.search(r"runs/s .* target ≤ \d+ ms: (ok|MISSED)$", row.group(0)), row.group(0)
    assert "24 h" not in out


def test_retry_storm_shows_breakwater_retrying_less_than_a_naive_client_in_an_outage() -> None:
    out = run_bench("retry_storm.py", "--calls", "10", "--workers", "4")
    outage, flaky = out.split("10 % random failure")
    # Every call fails: the naive client makes exactly its three attempts each.
    assert figure(r"naive_3_attempts\s+([\d.]+)", outage) == 3.0
    assert figure(r"breakwater_defaults\s+([\d.]+)", outage) < 3.0
    assert figure(r"amplification avoided vs naive \(budget only\): ([\d.]+)x", outage) > 1.0
    for client in ("no_retries", "naive_3_attempts", "breakwater_defaults"):
        assert 0 <= figure(rf"{client}\s+([\d.]+)%\s+attempts/call", flaky) <= 100


def test_large_result_reports_the_fast_tool_beside_big_results_over_and_under_the_limit() -> None:
    out = run_bench("large_result.py", "--over", "60000000", "--under", "100000", "--seconds", "0.5")
    assert figure(r"fast echo alone:\s+p50\s+([\d.]+) ms", out) > 0
    over = re.search(r"^fast echo while big answers 60,000,000 B .*$", out, re.MULTILINE)
    under = re.search(r"^fast echo while big answers 100,000 B .*$", out, re.MULTILINE)
    assert over is not None and under is not None, out
    # Over the limit the big answer is dropped unread and named so; under it, it is parsed and returned.
    assert "'RESULT_TOO_LARGE'" in over.group(0) and "'ok'" not in over.group(0)
    assert "'ok'" in under.group(0)
    assert figure(r"x([\d.]+) p50", over.group(0)) > 0


def test_proxy_overhead_prints_a_row_per_target_with_its_ratio_to_direct_and_no_errors() -> None:
    small = ("--calls", "20", "--bursts", "1", "--concurrency", "5", "--hol-calls", "2", "--warmup", "2")
    out = run_bench("proxy_overhead.py", "--no-install", "--only", "direct,breakwater-stdio-noshare", *small)
    assert re.search(r"^\| direct \| .* \| 1\.00× \| .* \| 0 \|$", out, re.MULTILINE), out
    row = re.search(r"^\| breakwater-stdio-noshare \| .* \| ([\d.]+)× \| .* \| 0 \|$", out, re.MULTILINE)
    assert row is not None, out
    assert float(row.group(1)) > 0
    assert figure(r"breakwater-stdio-noshare p50 / direct p50: ([\d.]+)×", out) == float(row.group(1))


def test_http_memory_reads_both_targets_memory_before_and_after_a_round() -> None:
    small = ("--rounds", "1", "--sessions", "1", "--mb", "0.1", "--latency", "0.05", "--hold", "0.1", "--settle", "0.1")
    out = run_bench("http_memory.py", *small)
    assert "1 rounds of 1 abandoned sessions × 0.1 MB calls" in out
    for name in ("sdk", "breakwater"):
        row = re.search(rf"^{name}\s+(\d+)\s+(\d+)\s+([+-]\d+)$", out, re.MULTILINE)
        assert row is not None, f"no row {name!r} in:\n{out}"
        start, after = float(row.group(1)), float(row.group(2))
        assert 10 < start < 2000 and 10 < after < 2000  # resident MB of a live Python process


def test_journal_counts_every_call_the_on_gateway_answered() -> None:
    small = ("--rows", "1000", "--writes", "1000", "--calls", "150", "--rounds", "2", "--batch", "5")
    out = run_bench("journal.py", "--no-postgres", *small)
    assert figure(r"build \+ record \(the gate's cost\)\s+(\d+) /", out) > 0
    assert figure(r"^SQLite: writer ([\d,]+) rows/s", out.replace(",", "")) > 0
    assert "PostgreSQL" not in out
    # From call 101 on a learned timeout decides each of the 50 calls left, for each of the four distributions.
    assert len(re.findall(r"^  \S+\s+[\d.]+ s\s+\d+/50 = ", out, re.MULTILINE)) == 4
    assert figure(r"journal off  p50\s+(\d+) us", out) > 0 and figure(r"journal on   p50\s+(\d+) us", out) > 0
    # 200 warm-up calls and 2 x 5 measured: the rows the gateway wrote are the calls it answered.
    assert "journal rows written by the 'on' gateway: 210 calls" in out


def test_journal_says_so_when_too_few_calls_learn_a_timeout() -> None:
    out = run_bench("journal.py", "--only", "learn", "--calls", "100")
    assert out.count("no call decided by a learned timeout in 100 calls") == 4


def test_lab_truth_puts_the_lab_beside_figures_the_fleet_measured(tmp_path: Path) -> None:
    # Figures of one real `bench/lab_truth.py --only rr --save` run (the fleet itself takes about 20 s).
    failures = ["2025-11-25 shop__work: 404"] * 3 + ["2025-11-25 shop__order: 404"] * 4 + ["2025-11-25 shop__report: 404"] * 3
    rr = {"calls": 84, "failed": 10, "404s": 22, "cuts": 0, "resumes": 0, "duplicates": 0, "failures": failures}
    rr |= {"exits": [[0, 2.17], [0, 0.32], [0, 0.27]], "took_s": 12.33}
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"rr": rr}))
    out = run_bench("lab_truth.py", "--fleet-json", str(fleet), "--lab-seeds", "1")
    row = re.search(r"^\| rr: round-robin, no Redis \(the broken baseline\) \| (.*) \|$", out, re.MULTILINE)
    assert row is not None, out
    cells = [cell.split(" / ") for cell in row.group(1).split(" | ")]
    assert [fleet_side for fleet_side, _ in cells] == ["84", "10", "22", "0", "0", "0"]
    lab_404s = float(cells[2][1].removesuffix(" **off**"))
    assert lab_404s > 0  # the lab, too, loses sessions to round-robin without a shared store
