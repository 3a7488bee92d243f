"""The `status`, `config`, `serve`, `tools` and `stats` commands.

Exit codes: 0 success (every enabled server ready), 1 some server not ready, 2 a config or usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from breakwater._breakwater import Breakwater
from breakwater.config import Config, all_knobs, find_config, load_config
from breakwater.config._knobs import render_markdown
from breakwater.errors import ConfigError
from breakwater.status import ServerState, StatusReport

if TYPE_CHECKING:  # the gateway's modules load only for the commands that use them
    from breakwater.catalog._catalog import Catalog
    from breakwater.config import GatewayPolicy

__all__ = ["config_main", "load_or_exit", "stats_main", "status_main"]

EXIT_OK = 0
EXIT_NOT_READY = 1
EXIT_CONFIG = 2
DEFAULT_STATUS_WAIT_S = 30.0
LIVE_REFRESH_S = 0.25

_STATE_STYLE = {
    ServerState.READY: "green",
    ServerState.CONNECTING: "cyan",
    ServerState.PENDING: "dim",
    ServerState.RETRYING: "yellow",
    ServerState.FAILED: "red",
    ServerState.DISABLED: "dim",
}


def load_or_exit(path: str | None) -> Config:
    """Load the named config (or find one); on error print it and exit with code 2."""
    try:
        return load_config(path if path is not None else find_config())
    except ConfigError as exc:
        print(f"breakwater: config error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="breakwater.toml or an mcpServers JSON file (default: ./breakwater.toml, ./.mcp.json)",
    )


def status_view(report: StatusReport, *, now: float | None = None) -> Group:
    """The status as a compact table, then one line per server that is not ready saying why."""
    now = time.time() if now is None else now
    table = Table(title="breakwater status", title_justify="left")
    for column in ("server", "transport", "state", "protocol", "tools", "attempts", "connect"):
        table.add_column(column, no_wrap=True)
    problems: list[str] = []
    for s in report.servers:
        state = s.state.value
        if s.state is ServerState.CONNECTING:
            state += f" #{s.attempt}" + (" (queued)" if s.phase == "queued" else "")
        table.add_row(
            s.name,
            s.transport,
            f"[{_STATE_STYLE[s.state]}]{state}[/]",
            s.protocol or "",
            "" if s.tools is None else str(s.tools),
            str(s.attempts),
            "" if s.connect_ms is None else f"{s.connect_ms} ms",
        )
        if s.error is not None and s.state is not ServerState.READY:
            line = f"[bold]{escape(s.name)}[/]: [{_STATE_STYLE[s.state]}]{s.error.code.value}[/] {escape(s.error.message)}"
            if s.next_retry_at is not None:
                line += f" [dim](next try in {max(0.0, s.next_retry_at - now):.0f} s)[/]"
            problems.append(line)
    table.caption = ", ".join(f"{n} {state}" for state, n in report.summary.items())
    return Group(table, *(Text.from_markup(p) for p in problems))


async def _run_status(config: Config, wait: float, as_json: bool) -> int:
    err = Console(stderr=True)
    async with Breakwater(config) as bw:
        if wait > 0 and err.is_terminal:
            with Live(status_view(bw.status()), console=err, transient=True, refresh_per_second=8) as live:
                async with anyio.create_task_group() as tg:

                    async def refresh() -> None:
                        while True:
                            live.update(status_view(bw.status()))
                            await anyio.sleep(LIVE_REFRESH_S)

                    tg.start_soon(refresh)
                    report = await bw.wait_ready(timeout=wait)
                    tg.cancel_scope.cancel()
        elif wait > 0:
            report = await bw.wait_ready(timeout=wait)
        else:
            await anyio.sleep(0)
            report = bw.status()
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        Console().print(status_view(report))
    return EXIT_OK if report.all_ready else EXIT_NOT_READY


async def _gateway_status(url: str, token: str | None, as_json: bool) -> int:
    """Ask a running `breakwater serve --http` gateway instead of connecting from here."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers) as http, Client(streamable_http_client(url, http_client=http)) as client:
        result = await client.call_tool("breakwater_status", {})
    data = result.structured_content or {}
    if as_json:
        print(json.dumps(data, indent=2))
    report = StatusReport.from_json(data)
    if not as_json:
        Console().print(status_view(report))
    return EXIT_OK if report.all_ready else EXIT_NOT_READY


def status_main(argv: list[str]) -> int:
    """`breakwater status`: connect to every server and report each one's state."""
    parser = argparse.ArgumentParser(
        prog="breakwater status",
        description="Connect to every configured server and report each one's state. "
        "Exit 0 when every enabled server is ready, 1 when any is not, 2 for a config error.",
    )
    _add_config_flag(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_STATUS_WAIT_S,
        metavar="SECONDS",
        help=f"wait up to this long for servers to become ready (default {DEFAULT_STATUS_WAIT_S:g}; 0 reports at once)",
    )
    parser.add_argument(
        "--gateway", metavar="URL", help="ask a running `breakwater serve --http` gateway (e.g. http://127.0.0.1:8765/mcp)"
    )
    parser.add_argument("--token", help="bearer token for --gateway (default: $BREAKWATER_TOKEN)")
    args = parser.parse_args(argv)
    if args.wait < 0:
        parser.error("--wait must be 0 or more")
    if args.gateway:
        import os

        token = args.token or os.environ.get("BREAKWATER_TOKEN") or None
        try:
            return anyio.run(_gateway_status, args.gateway, token, args.json)
        except Exception as exc:
            leaf: BaseException = exc
            while isinstance(leaf, BaseExceptionGroup):  # the transports wrap their failures in groups
                leaf = leaf.exceptions[0]
            print(f"breakwater: cannot reach the gateway at {args.gateway}: {type(leaf).__name__}: {leaf}", file=sys.stderr)
            return EXIT_NOT_READY
    config = load_or_exit(args.config)
    return anyio.run(_run_status, config, args.wait, args.json)


def _understood(config: Config) -> dict[str, Any]:
    defaults = config.connect
    servers = []
    for spec in config.servers:
        entry = spec.describe()
        overrides = {k: v for k, v in vars(spec.connect).items() if getattr(defaults, k) != v}
        if overrides:
            entry["connect"] = overrides
        servers.append(entry)
    return {"path": config.path, "connect": vars(defaults), "servers": servers}


def config_main(argv: list[str]) -> int:
    """`breakwater config check|knobs|import`."""
    if argv[:1] == ["import"]:
        from breakwater.config._import import import_main

        return import_main(argv[1:])
    parser = argparse.ArgumentParser(prog="breakwater config", description="Validate and explain configuration.")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("import", help="turn an mcpServers file into a breakwater config plus the one entry your agent uses")
    check = sub.add_parser("check", help="validate the config and print what was understood (secrets redacted)")
    _add_config_flag(check)
    check.add_argument("--json", action="store_true", help="print JSON")
    knobs = sub.add_parser("knobs", help="every knob with its default, environment variable and description")
    knobs.add_argument("--markdown", action="store_true", help="render the Markdown table the README includes")
    args = parser.parse_args(argv)
    if args.action == "knobs":
        table = all_knobs()
        if args.markdown:
            sys.stdout.write(render_markdown(table))
        else:
            out = Table(title="breakwater knobs", title_justify="left")
            for column in ("key", "default", "environment", "description"):
                out.add_column(column)
            for k in table:
                out.add_row(f"{k.section}.{k.name}", repr(k.default), k.env or "", k.doc)
            Console().print(out)
        return EXIT_OK
    config = load_or_exit(args.config)
    understood = _understood(config)
    if args.json:
        print(json.dumps(understood, indent=2))
    else:
        console = Console()
        console.print(f"[green]ok[/]: {config.path}: {len(config.servers)} server(s)")
        for entry in understood["servers"]:
            where = entry.get("url") or " ".join([entry["command"], *entry["args"]])
            flags = "" if entry["enabled"] else " [dim](disabled)[/]"
            console.print(f"  [bold]{entry['name']}[/] ({entry['transport']}): {where}{flags}")
            for key in ("env", "headers"):
                if key in entry:
                    console.print(f"    {key}: {', '.join(entry[key])} (values redacted)")
            if "connect" in entry:
                console.print(f"    connect overrides: {entry['connect']}")
    return EXIT_OK


# ---- the gateway ------------------------------------------------------------------------------


def _gateway_parts(config: Config) -> tuple[GatewayPolicy, Catalog]:
    from pathlib import Path

    from breakwater.catalog._catalog import Catalog, default_catalog_dir

    policy = config.gateway
    directory = Path(policy.catalog_dir) if policy.catalog_dir else default_catalog_dir()
    return policy, Catalog(template=policy.tool_name_template, directory=directory)


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected [HOST:]PORT, got {value!r}")
    return host, int(port)


def _graceful_server_class() -> Any:
    import contextlib
    from collections.abc import Iterator

    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, minus its re-raise of SIGTERM/SIGINT after its own shutdown.

        uvicorn raises the signal again once the HTTP side has stopped, which kills the process
        before breakwater's shutdown runs: the journal's last batch was lost and stdio upstreams
        were left to notice on their own. The signal still stops the server; the process then
        exits normally, with code 0, once everything is closed.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                self._captured_signals.clear()

    return GracefulServer


async def _serve(
    config: Config,
    listen: tuple[str, int] | None,
    token: str | None,
    port_file: str | None,
    allowed_hosts: tuple[str, ...] = (),
    json_response: bool = False,
) -> int:

    from breakwater.gateway._http import LOOPBACK_HOSTS, http_app
    from breakwater.gateway._metrics import Metrics
    from breakwater.gateway._server import Gateway

    policy, catalog = _gateway_parts(config)
    # Over HTTP the gateway also serves /metrics and the status page, fed by every attempt.
    metrics = Metrics() if listen is not None else None
    async with Breakwater(config, observers=[metrics] if metrics is not None else ()) as bw:
        gateway = Gateway(bw, policy, catalog=catalog)
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            if listen is None:
                from breakwater.gateway._stdio_server import stdio_server

                async with stdio_server() as (read, write):
                    await gateway.server.run(read, write, gateway.server.create_initialization_options())
            else:
                import uvicorn

                server_class = _graceful_server_class()
                host, port = listen
                from breakwater.gateway._listen import tcp_listener

                sock = tcp_listener(host, port)
                bound = sock.getsockname()[1]
                shown = f"[{host}]" if ":" in host else host
                print(f"breakwater: serving MCP on http://{shown}:{bound}/mcp", file=sys.stderr)
                print(
                    f"breakwater: status page on http://{shown}:{bound}/ (also /metrics, /healthz, /readyz)",
                    file=sys.stderr,
                    flush=True,
                )
                if host not in LOOPBACK_HOSTS:
                    print("breakwater: non-loopback listener: every request needs the bearer token", file=sys.stderr)
                if port_file:
                    from pathlib import Path

                    Path(port_file).write_text(str(bound))
                app = http_app(
                    gateway, host=host, token=token, metrics=metrics, allowed_hosts=allowed_hosts, json_response=json_response
                )
                server = server_class(uvicorn.Config(app, log_level="warning", lifespan="on"))
                await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    return EXIT_OK


def serve_main(argv: list[str]) -> int:
    """`breakwater serve`: one MCP server in front of every configured server."""
    import os

    from breakwater.config._checks import check_listener_token
    from breakwater.gateway._stdio_server import reserve_standard_fds

    parser = argparse.ArgumentParser(
        prog="breakwater serve",
        description="Serve every configured server's tools as one MCP server, through the call gate. "
        "stdio by default (what Claude Code, Cursor, Claude Desktop and VS Code launch).",
    )
    _add_config_flag(parser)
    parser.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        type=_parse_listen,
        help="serve streamable HTTP instead (default host 127.0.0.1; any other host needs --token)",
    )
    parser.add_argument("--token", help="bearer token HTTP clients must send (default: $BREAKWATER_TOKEN)")
    parser.add_argument(
        "--state",
        metavar="URL",
        help="share breaker and retry-budget state with other replicas: redis://HOST:PORT/DB "
        "(default: [state] url, $BREAKWATER_STATE_URL, else in-process)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name clients use to reach a non-loopback listener (repeatable; the listen address and, "
        "on 0.0.0.0 or ::, this machine's host name are always allowed)",
    )
    parser.add_argument(
        "--json-response",
        action="store_true",
        help="answer 2025-11-25 HTTP requests with plain JSON instead of an SSE stream: faster, but progress, "
        "log messages, sampling and elicitation cannot reach those clients mid-call (2026-07-28 clients are "
        "unaffected: they get JSON whenever nothing is streamed)",
    )
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    token = args.token or os.environ.get("BREAKWATER_TOKEN") or None
    if args.http and (problem := check_listener_token(args.http[0], token)):
        print(problem, file=sys.stderr)
        return EXIT_CONFIG
    config = load_or_exit(args.config)
    if args.state is not None:
        from dataclasses import replace

        try:
            config = replace(config, state=replace(config.state, url=args.state))
        except ConfigError as exc:
            print(f"breakwater: --state: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    reserve_standard_fds()  # a closed stdin must not become the event loop's descriptor
    return anyio.run(_serve, config, args.http, token, args.port_file, tuple(args.allowed_host), args.json_response)


async def _tools(config: Config, query: str, as_json: bool, wait: float, accept: bool) -> int:
    from breakwater.gateway._server import Gateway

    policy, catalog = _gateway_parts(config)
    async with Breakwater(config) as bw:
        gateway = Gateway(bw, policy, catalog=catalog)
        await bw.wait_ready(timeout=wait)
        if accept:
            accepted = gateway.accept(query.split())
            print("accepted: " + (", ".join(accepted) if accepted else "nothing had changed"))
            return EXIT_OK
        answer = await gateway.search(query, wait_s=0)
    if as_json:
        print(json.dumps(answer.to_json(), indent=2))
    else:
        print(answer.text())
    return EXIT_OK


def tools_main(argv: list[str]) -> int:
    """`breakwater tools [QUERY]`: the search tool's answer on the command line."""
    parser = argparse.ArgumentParser(
        prog="breakwater tools",
        description="List or search every server's tools. The answer names the servers that could not be searched.",
    )
    _add_config_flag(parser)
    parser.add_argument("query", nargs="*", help="words to look for (none: list every tool)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--wait", type=float, default=DEFAULT_STATUS_WAIT_S, metavar="SECONDS", help="wait for servers")
    parser.add_argument(
        "--accept",
        action="store_true",
        help="approve the current definitions of the named tools (server__tool), or of every changed tool",
    )
    args = parser.parse_args(argv)
    config = load_or_exit(args.config)
    return anyio.run(_tools, config, " ".join(args.query), args.json, args.wait, args.accept)


# ---- the journal -------------------------------------------------------------------------------

DEFAULT_STATS_SINCE = "1h"


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
    return f"{seconds:g} s{mark}" if seconds >= 1 else _ms(seconds) + mark


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
            s.server,
            s.tool,
            str(s.calls),
            f"[{style}]{_pct(success)}[/]" if success is not None else "",
            _ms(s.p50_s),
            _ms(s.p95_s),
            _ms(s.p99_s),
            f"{s.timeouts} ({_pct(s.timeout_rate)})" if s.timeouts else "0",
            "" if s.retries_per_call is None else f"{s.retries_per_call:.2f}",
            str(s.breaker_opens),
            f"[red]{s.outcome_unknown}[/]" if s.outcome_unknown else "0",
            _timeout_cell(s.timeout_s, s.timeout_source),
        )
    totals = summarize(stats)
    table.caption = f"{location}: {totals['calls']} calls, {totals['attempts']} attempts, {totals['timeouts']} timeouts"
    return table


def stats_main(argv: list[str]) -> int:
    """`breakwater stats`: per-tool calls, success, latency percentiles and timeouts, from the journal."""
    from breakwater.cli._stats_format import parse_duration
    from breakwater.journal import Journal, JournalError, SQLiteJournalStore, open_journal_store

    parser = argparse.ArgumentParser(
        prog="breakwater stats",
        description="Per tool: calls, success rate, p50/p95/p99 latency of answered attempts, timeout rate, "
        "retries per call, breaker opens, OUTCOME_UNKNOWN count and the timeout in force (configured, learned or "
        "default), read from the call journal (whether or not a gateway is running).",
    )
    _add_config_flag(parser)
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
    args = parser.parse_args(argv)
    try:
        since_s = parse_duration(args.since)
    except ValueError as exc:
        parser.error(f"--since: {exc}")
    policy, config = _journal_config(args.config)
    try:
        store = open_journal_store(args.journal if args.journal is not None else policy.url)
    except JournalError as exc:
        print(f"breakwater: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if store is None:
        print('breakwater: the journal is off ([journal] url = "off"); pass --journal URL to read one', file=sys.stderr)
        return EXIT_CONFIG
    journal = Journal(store, policy=policy)
    try:
        if isinstance(store, SQLiteJournalStore) and not store.path.exists():
            # Never create a journal just to report that it is empty.
            stats = []
        else:
            journal.refresh_learned()
            stats = journal.stats(since_s, server=args.server, tool=args.tool, exact=args.exact, config=config)
    except JournalError as exc:
        print(f"breakwater: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:
        print(f"breakwater: cannot read the journal at {store.location}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_NOT_READY
    finally:
        store.close()
    if args.json:
        out = {
            "journal": store.location,
            "since_s": since_s,
            "until": time.time(),
            "tools": [s.to_json() for s in stats],
        }
        print(json.dumps(out, indent=2))
    elif not stats:
        where = "".join(f" {flag} {value}" for flag, value in (("--server", args.server), ("--tool", args.tool)) if value)
        print(f"no calls recorded in the last {args.since}{where} (journal: {store.location})")
    else:
        Console().print(stats_view(stats, since=args.since, location=store.location))
    return EXIT_OK
