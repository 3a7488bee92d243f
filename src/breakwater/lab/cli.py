"""`breakwater lab ...`: run the simulator in the terminal, or serve its web page (`serve`).

Parses, builds a `LabConfig`, calls the library and renders; no model logic lives here.
Exit codes: 0 success, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Final

from breakwater.lab import (
    LabConfig,
    LabConfigError,
    LabResult,
    get_mission,
    is_exploration,
    score_mission,
    simulate,
)
from breakwater.lab.chart import bar_chart, downsample
from breakwater.lab.check import DEFAULT_SEEDS, check_missions, parse_seeds
from breakwater.lab.config import MODES, ROUTINGS, WINDOW_MS
from breakwater.lab.engine import MAX_DURATION_S
from breakwater.lab.metrics import LOG_LIMIT
from breakwater.lab.missions import MISSIONS

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["main", "parse_duration"]

CHART_WIDTH: Final = 72
# Flag dest -> LabConfig field. Flags left unset keep the mission's (or the default) value.
_CONTROL_FLAGS: Final = {
    "mode": "mode",
    "routing": "routing",
    "replicas": "replicas",
    "idle_timeout": "idle_timeout_s",
    "keepalive": "keepalive_s",
    "drain": "drain_s",
    "idempotency": "idempotency",
    "slow_tools": "slow_tools",
    "rolling_deploy": "rolling_deploy",
    "hot_client": "hot_client",
    "seed": "seed",
}


def _parser() -> argparse.ArgumentParser:
    from breakwater.cli._common import Parser, whole  # a usage error as one line, as every other command's

    parser = Parser(prog="breakwater lab", description="The fleet lab: an MCP fleet simulator.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="simulate ten minutes of traffic and print metrics, stars and a chart")
    run.add_argument("--mission", type=int, metavar="N", help="load mission N's set-up (1-6) and score it")
    fix = run.add_mutually_exclusive_group()
    fix.add_argument("--fix", action="store_true", help="apply the mission's 3-star reference fix")
    fix.add_argument("--variant", metavar="KEY", help="apply one of the mission's references or traps by key")
    controls = run.add_argument_group("controls (override the mission set-up or the defaults)")
    controls.add_argument("--mode", choices=MODES, help="protocol revision and state model")
    controls.add_argument("--routing", choices=ROUTINGS, help="load-balancer routing")
    controls.add_argument("--replicas", type=int, metavar="N", help="number of replicas, 1-8")
    controls.add_argument("--idle-timeout", type=int, metavar="S", help="proxy idle timeout T in seconds, 10-300")
    controls.add_argument("--keepalive", metavar="S|off", help="SSE keep-alive interval K in seconds (5-120) or off")
    controls.add_argument("--drain", type=int, metavar="S", help="deploy drain window W in seconds, 0-300")
    bool_flag = argparse.BooleanOptionalAction
    controls.add_argument("--idempotency", action=bool_flag, default=None, help="idempotent mutating tools")
    injections = run.add_argument_group("injections")
    injections.add_argument("--slow-tools", action=bool_flag, default=None, help="2%% of calls run 60-240 s")
    injections.add_argument("--rolling-deploy", action=bool_flag, default=None, help="drain and reboot each replica")
    injections.add_argument("--hot-client", action=bool_flag, default=None, help="client 0 sends 5 extra calls/s")
    run.add_argument("--seed", type=int, metavar="S", help="traffic seed (a mission scores only at its pinned seed)")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of tables and charts")
    run.add_argument(
        "--duration",
        metavar="TIME",
        help="arrival window: seconds or 90s, 10m, 2h, 1h30m; up to 24h (default 10m; missions score only 10m)",
    )
    run.add_argument("--full", action="store_true", help="with --json: add series, histogram and the event log")
    run.add_argument(
        "--log-limit",
        type=whole(0),
        default=LOG_LIMIT,
        metavar="N",
        help=f"with --full: keep the first N log records (default {LOG_LIMIT}; 0 keeps all); says when it cut",
    )
    run.add_argument("--width", type=whole(1), default=CHART_WIDTH, metavar="COLS", help="chart width in columns")

    check = sub.add_parser("check", help="on how many seeds each mission's set-up, reference and trap earns its stated stars")
    check.add_argument("--seeds", default=DEFAULT_SEEDS, metavar="RANGE", help="seeds to try, e.g. 1-40 or 1-5,9")
    check.add_argument("--mission", type=int, action="append", metavar="N", help="check only mission N (repeatable)")
    check.add_argument("--json", action="store_true", help="print a JSON array of {mission, key, holds, of}")

    missions = sub.add_parser("missions", help="list the missions: set-up, goal, star rules, references, traps")
    missions.add_argument("--json", action="store_true", help="print a JSON array")

    serve = sub.add_parser("serve", help="serve the lab's web page (controls, missions, charts) on 127.0.0.1")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need a token)")
    serve.add_argument("--port", type=whole(0, 65535), default=8765, help="port to listen on (default 8765; 0 picks a free one)")
    serve.add_argument("--open", action="store_true", help="open the page in a web browser")
    serve.add_argument(
        "--token",
        default=None,
        help="API token, required to bind a non-loopback host (default: $BREAKWATER_LAB_TOKEN)",
    )
    return parser


def _build_config(args: argparse.Namespace) -> LabConfig:
    config = LabConfig()
    if args.mission is not None:
        mission = get_mission(args.mission)
        config = mission.setup
        if args.fix:
            config = mission.fix.apply(config)
        elif args.variant is not None:
            config = mission.variant(args.variant).apply(config)
    elif args.fix or args.variant is not None:
        raise LabConfigError("--fix and --variant need --mission", key="mission")
    changes: dict[str, Any] = {}
    for dest, name in _CONTROL_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            changes[name] = value
    return LabConfig.from_dict(changes, base=config) if changes else config


def _chart_lines(result: LabResult, width: int) -> list[str]:
    series = result.series
    n = len(series.in_flight)
    per_col = n / min(n, width) if n else 1.0
    lines = bar_chart("calls in flight", downsample(series.in_flight, width), seconds_per_value=per_col)
    lines.append("")
    lines += bar_chart("failed calls", downsample(series.failures, width, sum), seconds_per_value=per_col, height=3)
    trouble = [c + h + k for c, h, k in zip(series.cuts, series.http_404, series.kills, strict=True)]
    if any(trouble):
        lines.append("")
        lines += bar_chart("cuts + 404s + kills", downsample(trouble, width, sum), seconds_per_value=per_col, height=3)
    return lines


def _print_human(
    console: Console,
    config: LabConfig,
    result: LabResult,
    mission_id: int | None,
    width: int,
    *,
    exploring: bool,
    duration: int | None,
) -> None:
    keepalive = "off" if config.keepalive_s is None else f"{config.keepalive_s} s"
    injections = [n for n in ("slow_tools", "rolling_deploy", "hot_client") if getattr(config, n)]
    console.print(
        f"{config.mode} · {config.routing} · {config.replicas} replicas · T {config.idle_timeout_s} s · "
        f"K {keepalive} · W {config.drain_s} s · idempotency {'on' if config.idempotency else 'off'} · "
        f"injections: {', '.join(injections) or 'none'} · seed {config.seed}"
        + ("" if duration is None else f" · {duration} s of arrivals"),
        markup=False,
        highlight=False,
    )
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result.metrics.to_dict().items():
        if isinstance(value, list):
            shown = ", ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in value)
        elif isinstance(value, float):
            shown = f"{value:.2f}"
        else:
            shown = "-" if value is None else str(value)
        table.add_row(name, shown)
    console.print(table)
    if mission_id is not None:
        mission = get_mission(mission_id)
        if exploring:
            console.print(
                f"Mission {mission_id} ({mission.name}): exploration at seed {config.seed}; stars are awarded "
                f"only for ten minutes at the pinned seed {mission.pinned_seed}.",
                markup=False,
            )
        else:
            stars = score_mission(mission_id, config, result)
            shown = "★" * stars + "☆" * (3 - stars)
            console.print(f"Mission {mission_id} ({mission.name}): {shown} {stars} star(s)", markup=False)
            console.print(f"  goal: {mission.goal_text}\n  3 stars: {mission.three_star_text}", markup=False)
            verdict = mission.explain(config, result.metrics)
            for part, conditions in (("goal", verdict["goal"]), ("3 stars", verdict["three_stars"])):
                for c in conditions:
                    if not c["holds"]:
                        console.print(f"  {part} not met: {c['text']} ({c['miss']})", markup=False)
    console.print("\n".join(_chart_lines(result, width)), markup=False, highlight=False)


def _run(args: argparse.Namespace) -> int:
    try:
        config = _build_config(args)
        duration = None if args.duration is None else parse_duration(args.duration)
    except (LabConfigError, KeyError) as exc:
        print(f"breakwater lab: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    if duration == WINDOW_MS // 1000:
        duration = None
    # Only `--full` shows the event log, so only it pays for keeping one.
    result = simulate(config, keep_log=args.full, duration_s=duration)
    exploring = args.mission is not None and (is_exploration(args.mission, config) or duration is not None)
    if args.json:
        out: dict[str, object] = {"config": config.to_dict(), "metrics": result.metrics.to_dict()}
        if args.full:
            limit = args.log_limit or None
            out = result.to_dict(log_limit=limit)
            kept = len(out["log"])  # type: ignore[arg-type]
            out["log_truncated"] = kept < result.log_records
            if kept < result.log_records:
                print(
                    f"breakwater lab: the event log has {result.log_records} records; kept the first {kept} "
                    "(--log-limit 0 keeps them all)",
                    file=sys.stderr,
                )
        out["duration_s"] = WINDOW_MS // 1000 if duration is None else duration
        if args.mission is not None:
            out["mission"] = args.mission
            out["exploration"] = exploring
            out["stars"] = 0 if exploring else score_mission(args.mission, config, result)
        print(json.dumps(out))
        return 0
    from breakwater.cli._common import out_console  # here: `--json` needs no terminal rendering

    _print_human(out_console(), config, result, args.mission, max(10, args.width), exploring=exploring, duration=duration)
    return 0


_DURATION: Final = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")


def parse_duration(text: str) -> int:
    """Seconds from "600", "90s", "10m", "2h" or "1h30m"; at most 24 h (`LabConfigError` otherwise)."""
    match = _DURATION.match(text.strip().lower())
    if not text.strip() or match is None:
        raise LabConfigError(f"must be seconds or a time like 90s, 10m, 2h or 1h30m, got {text!r}", key="duration")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not 1 <= total <= MAX_DURATION_S:
        raise LabConfigError(f"must be between 1 s and 24 h, got {text!r}", key="duration")
    return total


def _missions(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([m.to_dict() for m in MISSIONS]))
        return 0
    from breakwater.cli._common import out_console

    console = out_console()
    for m in MISSIONS:
        console.print(f"[bold]M{m.id} · {m.name}[/bold] (pinned seed {m.pinned_seed})")
        console.print(f"  {m.lesson}\n  set-up: {m.setup.to_dict()}", markup=False)
        console.print(f"  goal (1 star): {m.goal_text}\n  3 stars: {m.three_star_text}", markup=False)
        for v in m.variants:
            console.print(f"  {v.kind} {v.key!r}: {v.label} -> {v.stars} star(s) {v.outcome}", markup=False)
        console.print()
    return 0


def _check(args: argparse.Namespace) -> int:
    try:
        seeds = parse_seeds(args.seeds)
        missions = MISSIONS if not args.mission else tuple(get_mission(n) for n in args.mission)
    except (ValueError, KeyError) as exc:
        print(f"breakwater lab check: {exc.args[0]}", file=sys.stderr)
        return 2
    rows = check_missions(seeds, missions)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows]))
        return 0
    from rich.table import Table

    from breakwater.cli._common import out_console

    table = Table(show_header=True, header_style="bold")
    for name, justify in (("mission", "left"), ("key", "left"), ("kind", "left"), ("stars", "right"), ("holds", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("seeds where it does not hold")
    for row in rows:
        missed = [s for s in seeds if s not in set(row.holds)]
        table.add_row(
            f"M{row.mission}", row.key, row.kind, str(row.stars), f"{len(row.holds)}/{row.of}", ", ".join(map(str, missed))
        )
    out_console().print(table)
    return 0


def main(argv: list[str]) -> int:
    """Run `breakwater lab` with `argv` (without the `lab`); returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    if args.command == "run":
        return _run(args)
    if args.command == "serve":
        # Imported here: the terminal commands need no HTTP machinery.
        from breakwater.lab.web import TOKEN_ENV, serve

        token = args.token or os.environ.get(TOKEN_ENV) or None
        return serve(args.host, args.port, token=token, open_browser=args.open)
    if args.command == "check":
        return _check(args)
    return _missions(args)
