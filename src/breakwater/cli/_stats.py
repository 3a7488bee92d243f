"""`breakwater stats`: per-tool calls, success, latency percentiles and timeouts, read from the call journal."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.table import Table

from breakwater.cli._common import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    Parser,
    add_config_flag,
    counted,
    fail,
    load_or_exit,
    show,
)
from breakwater.cli._text import cell
from breakwater.config import Config, find_config
from breakwater.errors import ConfigError

__all__ = ["stats_main", "stats_view"]

DEFAULT_STATS_SINCE = "1h"
IN_FLIGHT_SHOWN = 200  # attempts sent and never finished, oldest first: more is a list nobody reads


def _journal_config(config_path: str | None) -> tuple[Any, Config | None]:
    """`[journal]` and the config it came from: the named one, else one found here, else the defaults (and environment)."""
    from breakwater.config import JournalPolicy
    from breakwater.config._knobs import build_policy, env_layer

    if config_path is None:
        try:
            config_path = str(find_config())
        except ConfigError:
            # No config is fine: `stats` reads the default journal.
            return build_policy(JournalPolicy, [env_layer(JournalPolicy)]), None
    config = load_or_exit(config_path)
    return config.journal, config


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _pct(rate: float | None) -> str:
    return "" if rate is None else f"{rate * 100:.1f} %" if rate < 0.9995 or rate == 1 else f"{rate * 100:.2f} %"


def _timeout_cell(seconds: float | None, source: str | None) -> str:
    # The timeout in force, marked by where it came from: a learned one is what changes on its own.
    if seconds is None:
        return ""
    # Seconds, and a one-word source: the twelfth column must not push the table past 120 columns.
    mark = {"learned": " [cyan]learned[/]", "configured": " [dim]config[/]"}.get(source or "", " [dim]default[/]")
    return f"{_seconds(seconds)} s{mark}" if seconds >= 1 else _ms(seconds) + mark


def _seconds(seconds: float) -> str:
    # Three significant digits, as the latency columns give: a learned timeout is a quantile times the headroom, and
    # `:g` printed its six digits ("4.06788 s", "16.1701 s") as if they meant something. Whole seconds from 100 on
    # (`:.3g` writes 3600 as "3.6e+03").
    return f"{seconds:.0f}" if seconds >= 99.95 else f"{seconds:.3g}"


def stats_view(stats: list[Any], *, since: str, location: str) -> Table:
    """Per-tool journal statistics as a table."""
    from breakwater.cli._stats_format import summarize

    table = Table(title=f"breakwater stats: last {since}", title_justify="left")
    # Short headers: twelve columns must still read on an 80-column terminal.
    columns = ("server", "tool", "calls", "ok", "p50", "p95", "p99", "timeouts", "retries", "opens", "unknown", "timeout")
    for column in columns:
        table.add_column(column, no_wrap=True, justify="left" if column in ("server", "tool") else "right")
    for s in stats:
        success = s.success_rate
        style = "green" if success is not None and success >= 0.99 else "yellow" if success and success >= 0.9 else "red"
        table.add_row(
            cell(s.server),
            cell(s.tool),
            str(s.calls),
            f"[{style}]{_pct(success)}[/]" if success is not None else "",
            _ms(s.p50_s),
            _ms(s.p95_s),
            _ms(s.p99_s),
            f"{s.timeouts} ({_pct(s.timeout_rate)})" if s.timeouts else "0",
            str(s.retries),  # a count, as `--json` gives it and beside `calls` (0.67 read as a count of retries)
            str(s.breaker_opens),
            f"[red]{s.outcome_unknown}[/]" if s.outcome_unknown else "0",
            _timeout_cell(s.timeout_s, s.timeout_source),
        )
    totals = summarize(stats)
    table.caption = f"{location}: {totals['calls']} calls, {totals['attempts']} attempts, {totals['timeouts']} timeouts"
    return table


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater stats",
        description="Per tool: calls, success rate, p50/p95/p99 latency of answered attempts, timeout rate, "
        "retries, breaker opens, OUTCOME_UNKNOWN count and the timeout in force (configured, learned or "
        "default), read from the call journal (whether or not a gateway is running); then the calls to tools that are "
        "not read-only that were sent and never finished: outcome unknown when their process died (server, tool, "
        "operation id, when), else in flight. Piped or redirected, the "
        "table is printed in full, without colour; --json is the format for programs.",
    )
    add_config_flag(parser)
    parser.add_argument("--since", default=DEFAULT_STATS_SINCE, metavar="DURATION", help="window: 90s, 15m, 1h, 2d (default 1h)")
    parser.add_argument("--server", help="only this server")
    parser.add_argument("--tool", help="only this tool")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--journal", metavar="URL", help="journal to read: a path, sqlite:///PATH or postgresql://... (default: [journal] url)"
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="rank every raw attempt for exact percentiles (slower) instead of the per-minute rollups (within 1 %%)",
    )
    return parser


def in_flight_lines(marks: list[Any]) -> list[str]:
    """The attempts of mutating tools sent and never finished: outcome unknown (their process is gone), or in flight."""
    from breakwater.status import iso

    unknown = [m for m in marks if m.outcome_unknown]
    lines: list[str] = []
    if unknown:
        lines.append(
            f"Outcome unknown: {counted(len(unknown), 'call')} sent to a tool that is not read-only, whose process stopped "
            "before the answer (check whether each took effect before repeating it):"
        )
        for m in unknown:
            op = f"operation {m.operation_id}" if m.operation_id else "no operation id"
            lines.append(
                f"  {iso(m.started_at)}  {m.server}/{m.tool}  {op}  (call {m.call_id}, attempt {m.attempt}, process {m.writer})"
            )
    live = len(marks) - len(unknown)
    if live:
        lines.append(f"In flight now: {counted(live, 'call')} to tools that are not read-only, sent by running processes.")
    return lines


def _print(args: argparse.Namespace, stats: list[Any], marks: list[Any], since_s: float, location: str) -> None:
    if args.json:
        out = {
            "journal": location,
            "since_s": since_s,
            "until": time.time(),
            "tools": [s.to_json() for s in stats],
            "in_flight": [m.to_json() for m in marks],
        }
        print(json.dumps(out, indent=2))
        return
    if not stats:
        where = "".join(f" {flag} {value}" for flag, value in (("--server", args.server), ("--tool", args.tool)) if value)
        print(f"no calls recorded in the last {args.since}{where} (journal: {location})")
    else:
        show(stats_view(stats, since=args.since, location=location))
    for line in in_flight_lines(marks):
        print(line)


def stats_main(argv: list[str]) -> int:
    """`breakwater stats`: per-tool calls, success, latency percentiles and timeouts, from the journal."""
    from breakwater.cli._stats_format import parse_duration
    from breakwater.journal import Journal, JournalError, SQLiteJournalStore, open_journal_store
    from breakwater.journal._sql import journal_fix

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        since_s = parse_duration(args.since)
    except ValueError:
        parser.error(f"--since: expected a duration such as 90s, 15m, 1h30m or 2d, got {args.since!r}")
    policy, config = _journal_config(args.config)
    try:
        store = open_journal_store(args.journal if args.journal is not None else policy.url)
    except JournalError as exc:
        return fail(str(exc), EXIT_CONFIG)
    if store is None:
        return fail('the journal is off ([journal] url = "off"); pass --journal URL to read one', EXIT_CONFIG)
    journal = Journal(store, policy=policy)
    try:
        if isinstance(store, SQLiteJournalStore) and not store.path.exists():
            if args.journal is not None:
                # A journal named on the command line, and not there: a mistyped path read as "no calls recorded".
                return fail(f"no journal at {store.location}: nothing was ever recorded there; check --journal", EXIT_FAILED)
            # The configured one, before the first call: never create a journal just to report that it is empty.
            stats, marks = [], []
        else:
            journal.refresh_learned()
            stats = journal.stats(since_s, server=args.server, tool=args.tool, exact=args.exact, config=config)
            marks = [
                m for m in journal.in_flight(IN_FLIGHT_SHOWN) if args.server in (None, m.server) and args.tool in (None, m.tool)
            ]
    except JournalError as exc:
        return fail(str(exc), EXIT_CONFIG)
    except Exception as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""  # PostgreSQL's LINE 2 and caret: not for here
        fix = journal_fix(store, exc)
        return fail(
            f"cannot read the journal at {store.location}: {type(exc).__name__}: {said}" + (f" (fix: {fix})" if fix else ""),
            EXIT_FAILED,
        )
    finally:
        store.close()
    _print(args, stats, marks, since_s, store.location)
    return EXIT_OK
