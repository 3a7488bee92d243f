"""`breakwater lab` on the command line, and `LabConfig` validation for web-form input."""

from __future__ import annotations

import json

import pytest

from breakwater.cli import main as breakwater_main
from breakwater.lab import LabConfig, LabConfigError, mission_report, simulate
from breakwater.lab.cli import main


def _json_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["run", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_mission_setup_scores_zero_and_the_fix_scores_three(capsys: pytest.CaptureFixture[str]) -> None:
    """`--mission 1` shows 0 stars; `--mission 1 --fix` shows 3, through the top-level router too."""
    broken = _json_run(capsys, "--mission", "1")
    assert broken["stars"] == 0
    assert isinstance(broken["metrics"], dict) and broken["metrics"]["http_404"] > 0
    assert breakwater_main(["lab", "run", "--mission", "1", "--fix", "--json"]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert fixed["stars"] == 3
    assert fixed["metrics"]["failed"] == 0


def test_control_flags_override_the_mission_setup(capsys: pytest.CaptureFixture[str]) -> None:
    """`--routing affinity` on M1 is the 1-star reference; `--variant` reaches the same place."""
    assert _json_run(capsys, "--mission", "1", "--routing", "affinity")["stars"] == 1
    assert _json_run(capsys, "--mission", "1", "--variant", "affinity")["stars"] == 1
    out = _json_run(capsys, "--mission", "2", "--keepalive", "off", "--no-slow-tools", "--seed", "1")
    assert out["config"] == {**LabConfig().to_dict(), "mode": "2026-07-28", "routing": "round_robin"}


def test_seed_other_than_pinned_is_exploration(capsys: pytest.CaptureFixture[str]) -> None:
    """A mission run at another seed reports exploration and no stars."""
    out = _json_run(capsys, "--mission", "1", "--fix", "--seed", "12")
    assert out["exploration"] is True
    assert out["stars"] == 0


def test_free_play_json_has_metrics_and_no_stars(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a mission there is no star verdict; `--full` adds series, histogram and log."""
    out = _json_run(capsys, "--replicas", "2", "--hot-client", "--full")
    assert "stars" not in out
    assert {"metrics", "series", "latency_histogram", "log"} <= out.keys()


def test_human_output_has_metrics_stars_and_a_chart(capsys: pytest.CaptureFixture[str]) -> None:
    """The terminal view: the metrics table, the star verdict and charts of calls in flight and failures."""
    assert main(["run", "--mission", "1", "--width", "40"]) == 0
    out = capsys.readouterr().out
    assert "http_404" in out
    assert "0 star(s)" in out
    assert "calls in flight" in out
    assert "failed calls" in out


def test_piped_output_keeps_a_wide_chart_whole(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Off a terminal Rich wraps at 80 columns: a chart of 100 split each row in two, and a mission's text mid-sentence."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["run", "--mission", "1", "--width", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith("calls in flight"))) + 1 :][:3]
    assert all(len(row) > 100 for row in rows), rows  # each row whole: its axis and 100 columns


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--replicas", "9"], "replicas"),
        (["run", "--keepalive", "soon"], "keepalive_s"),
        (["run", "--idle-timeout", "61"], "multiple of 5"),
        (["run", "--mission", "7"], "no mission 7"),
        (["run", "--fix"], "need --mission"),
        (["run", "--mission", "2", "--variant", "nope"], "no variant"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Usage and config errors go to stderr with exit code 2."""
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_missions_listing(capsys: pytest.CaptureFixture[str]) -> None:
    """`breakwater lab missions --json` lists six missions with set-ups, texts and variants."""
    assert main(["missions", "--json"]) == 0
    missions = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in missions] == [1, 2, 3, 4, 5, 6]
    assert all(m["goal"] and m["three_stars"] and m["variants"] for m in missions)
    assert main(["missions"]) == 0
    assert "Sticky by accident" in capsys.readouterr().out


def test_config_validation_names_the_control() -> None:
    """Construction rejects out-of-range and mistyped values with the control's name."""
    with pytest.raises(LabConfigError) as info:
        LabConfig(replicas=0)
    assert info.value.key == "replicas"
    with pytest.raises(ValueError, match="mode"):
        LabConfig(mode="2024")  # type: ignore[arg-type]
    with pytest.raises(LabConfigError, match="integer"):
        LabConfig(replicas=True)
    with pytest.raises(LabConfigError, match="keepalive_s"):
        LabConfig(keepalive_s=4)


def test_from_dict_accepts_web_form_values_and_round_trips() -> None:
    """Strings from a form become typed values; `to_dict()` round-trips."""
    config = LabConfig.from_dict(
        {"replicas": "2", "keepalive_s": "off", "idempotency": "on", "hot_client": "false", "idle_timeout_s": 90}
    )
    assert config == LabConfig(replicas=2, idempotency=True, idle_timeout_s=90)
    assert LabConfig.from_dict({"keepalive_s": "15"}).keepalive_s == 15
    assert LabConfig.from_dict(config.to_dict()) == config
    with pytest.raises(LabConfigError, match="did you mean 'replicas'"):
        LabConfig.from_dict({"replica": 2})
    with pytest.raises(LabConfigError, match="true or false"):
        LabConfig.from_dict({"idempotency": "maybe"})


def test_result_and_mission_report_are_json_serialisable() -> None:
    """`to_dict()` carries series for the charts and a capped log; `mission_report` is one JSON object."""
    result = simulate(LabConfig(rolling_deploy=True))
    data = result.to_dict(log_limit=100)
    json.dumps(data)
    series = data["series"]
    assert isinstance(series, dict)
    n = len(series["in_flight"])
    assert n == result.metrics.run_end_ms // 1000 + 1
    for name in ("cuts", "http_404", "kills", "reissues", "failures", "duplicates", "completions"):
        assert len(series[name]) == n
    assert all(len(per_replica) == n for per_replica in series["busy"])
    assert isinstance(data["log"], list)
    assert len(data["log"]) == 100 and data["log_total"] == len(result.log)
    histogram = data["latency_histogram"]
    assert isinstance(histogram, dict) and sum(histogram["counts"]) == result.metrics.ok
    report = mission_report(1, LabConfig.from_dict({"routing": "affinity"}, base=LabConfig(routing="round_robin")))
    json.dumps(report)
    assert report["stars"] in (0, 1, 3)
