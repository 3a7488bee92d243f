"""`breakwater config check|knobs|import`: validate and explain configuration."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.table import Table

from breakwater._sqlite import NotSQLiteError, check_sqlite_path
from breakwater.cli._common import EXIT_CONFIG, EXIT_OK, Parser, add_config_flag, counted, fail, load_or_exit, out_console, show
from breakwater.cli._text import markup
from breakwater.config import Config, all_knobs
from breakwater.config._knobs import render_markdown
from breakwater.config._model import ToolSettings
from breakwater.config._redact import Redactor
from breakwater.errors import ConfigError
from breakwater.journal import PostgresJournalStore, SQLiteJournalStore, open_journal_store
from breakwater.journal._postgres import CONNINFO_FIX, conninfo_problem

__all__ = ["config_main"]


#: The sections whose settings `config check` names when they are not the built-in defaults.
_SECTIONS = ("connect", "call", "retry", "breaker", "gateway", "journal", "state", "telemetry")


def _own(tool: ToolSettings, key: str) -> Any:
    """The value a tool's own table set for `key` (a `[call]` key or a `[retry]` one)."""
    return getattr(tool.call, key) if hasattr(tool.call, key) else getattr(tool.retry, key)


def _changed(policy: Any, default: Any) -> dict[str, Any]:
    """The fields of `policy` whose value is not `default`'s."""
    return {k: v for k, v in vars(policy).items() if getattr(default, k) != v}


def _understood(config: Config, notes: list[str]) -> dict[str, Any]:
    servers = []
    for spec in config.servers:
        entry = spec.describe()
        for section in ("connect", "call", "retry", "breaker"):
            if overrides := _changed(getattr(spec, section), getattr(config, section)):
                entry[section] = overrides
        # A tool's own table: only what it set (the rest is its server's).
        tools = {name: {k: _own(t, k) for k in sorted(t.explicit)} for name, t in spec.tools.items()}
        if tools:
            entry["tools"] = tools
        servers.append(entry)
    # The settings that are not the built-in defaults, from the file or the environment: printed nowhere, a correct
    # `[gateway] drift = "block"` could not be told from one that was never read.
    policies = {section: getattr(config, section) for section in _SECTIONS}
    settings = {section: changed for section, p in policies.items() if (changed := _changed(p, type(p)()))}
    out: dict[str, Any] = {"path": config.path, "connect": vars(config.connect), "settings": settings, "servers": servers}
    notes = [*config.notes, *notes]
    if notes:
        out["notes"] = notes
    # The settings hold the journal's and state store's URLs: their passwords and query values are secrets too.
    scrubbed: dict[str, Any] = Redactor(config.secrets).scrub(out)
    return scrubbed


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater config",
        description="Validate and explain configuration.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("import", help="turn an mcpServers file into a breakwater config plus the one entry your agent uses")
    check = sub.add_parser("check", help="validate the config and print what was understood (secrets redacted)")
    add_config_flag(check)
    check.add_argument("--json", action="store_true", help="print JSON")
    knobs = sub.add_parser("knobs", help="every knob with its default, environment variable and description")
    knobs.add_argument("--markdown", action="store_true", help="render the Markdown table the README includes")
    return parser


def _print_knobs(markdown: bool) -> None:
    table = all_knobs()
    if markdown:
        sys.stdout.write(render_markdown(table))
        return
    out = Table(title="breakwater knobs", title_justify="left")
    for column in ("key", "default", "environment", "description"):
        out.add_column(column)
    for k in table:
        out.add_row(f"{k.section}.{k.name}", repr(k.default), k.env or "", k.doc)
    show(out)


#: The keys a server's tool lists are written under, and what each does to the list.
TOOL_LIST_KEYS = {
    "disabledTools": "left out of the list",
    "excludeTools": "left out of the list",
    "disabled_tools": "left out of the list",
    "includeTools": "the only tools listed",
    "enabled_tools": "the only tools listed",
}


def _toml(value: Any) -> str:
    """A setting's value as breakwater.toml writes it (`share = false`, not Python's `False`); an unset one (None) as
    the knob table says it, `unset`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "unset"
    return repr(value)


def _assignments(values: dict[str, Any]) -> str:
    """`key = value, ...` in TOML's words (`_toml`)."""
    return ", ".join(f"{k} = {_toml(v)}" for k, v in values.items())


def _print_check(config: Config, as_json: bool, notes: list[str]) -> None:
    understood = _understood(config, notes)
    if as_json:
        print(json.dumps(understood, indent=2))
        return
    console = out_console()
    console.print(f"[green]ok[/]: {markup(config.path or '')}: {counted(len(config.servers), 'server')}")
    for section, changed in understood["settings"].items():
        console.print(markup(f"  [{section}] " + _assignments(changed)))
    for entry in understood["servers"]:
        where = entry.get("url") or " ".join([entry["command"], *entry["args"]])
        flags = "" if entry["enabled"] else " [dim](disabled)[/]"
        console.print(f"  [bold]{markup(entry['name'])}[/] ({entry['transport']}): {markup(where)}{flags}")
        for key in ("env", "headers"):
            if key in entry:
                console.print(f"    {key}: {markup(', '.join(entry[key]))} (values redacted)")
        if "headersHelper" in entry:
            console.print(f"    headersHelper: {markup(entry['headersHelper'])} (its output redacted)")
        for section in ("connect", "call", "retry", "breaker"):
            if section in entry:
                console.print(f"    {section} overrides: {markup(_assignments(entry[section]))}")
        for tool, own in entry.get("tools", {}).items():
            console.print(f"    tool {markup(tool)}: " + markup(_assignments(own)))
        for key, said in TOOL_LIST_KEYS.items():
            if key in entry:
                console.print(f"    {key} ({said}): {markup(', '.join(entry[key]))}")
        for note in entry.get("notes", ()):
            console.print(f"    [yellow]note[/]: {markup(note)}")
    for note in understood.get("notes", ()):
        console.print(f"  [yellow]note[/]: {markup(note)}")


def config_main(argv: list[str]) -> int:
    """`breakwater config check|knobs|import`."""
    if argv[:1] == ["import"]:
        from breakwater.config._import import import_main

        return import_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.action == "knobs":
        _print_knobs(args.markdown)
    else:
        config = load_or_exit(args.config, every_variable=True)
        refused, notes = _stores(config)
        if refused is not None:
            return fail(f"config error: {refused}", EXIT_CONFIG)
        _print_check(config, args.json, notes)
    return EXIT_OK


def _stores(config: Config) -> tuple[ConfigError | None, list[str]]:
    """What the state store's and the journal's clients would refuse in their URLs as they open (asked of them here,
    not as every command reads the config: importing them costs ~0.1 s each), and the notes of a journal file that is
    not one (a directory, a user's own file: calls would go on, unrecorded, so a note, not an error)."""
    from breakwater.state import check_store_url

    try:
        check_store_url(config.state, path=config.path)
    except ConfigError as exc:
        return exc, []
    store = open_journal_store(config.journal.url)
    if isinstance(store, PostgresJournalStore) and "://" in store.conninfo:
        if (problem := conninfo_problem(store.conninfo)) is not None:
            return ConfigError(problem, path=config.path, key="journal.url (BREAKWATER_JOURNAL)", fix=CONNINFO_FIX), []
    elif isinstance(store, SQLiteJournalStore):
        try:
            check_sqlite_path(store.path)
        except NotSQLiteError as exc:
            return None, [f"the call journal: {exc}; calls would go on unrecorded (fix: {store.fix_for(exc)})"]
    return None, []
