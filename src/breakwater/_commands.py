"""The `status` and `config` commands.

Exit codes: 0 success (every enabled server ready), 1 some server not ready, 2 a config or usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from breakwater._breakwater import Breakwater
from breakwater._knobs import render_markdown
from breakwater.config import Config, all_knobs, find_config, load_config
from breakwater.errors import ConfigError
from breakwater.status import ServerState, StatusReport

__all__ = ["config_main", "load_or_exit", "status_main"]

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
    args = parser.parse_args(argv)
    if args.wait < 0:
        parser.error("--wait must be 0 or more")
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
        from breakwater._import import import_main

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


def _gateway_parts(config: Config) -> tuple[Any, Any]:
    from pathlib import Path

    from breakwater._catalog import Catalog, default_catalog_dir

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


async def _serve(config: Config, listen: tuple[str, int] | None, token: str | None, port_file: str | None) -> int:
    import socket

    from breakwater._gateway import LOOPBACK_HOSTS, Gateway, http_app

    policy, catalog = _gateway_parts(config)
    async with Breakwater(config) as bw:
        gateway = Gateway(bw, policy, catalog=catalog)
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            if listen is None:
                from mcp.server.stdio import stdio_server

                async with stdio_server() as (read, write):
                    await gateway.server.run(read, write, gateway.server.create_initialization_options())
            else:
                import uvicorn

                host, port = listen
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                # Listen before announcing the port: a client that reads it may connect at once.
                sock.listen(128)
                bound = sock.getsockname()[1]
                shown = f"[{host}]" if ":" in host else host
                print(f"breakwater: serving MCP on http://{shown}:{bound}/mcp", file=sys.stderr, flush=True)
                if host not in LOOPBACK_HOSTS:
                    print("breakwater: non-loopback listener: every request needs the bearer token", file=sys.stderr)
                if port_file:
                    from pathlib import Path

                    Path(port_file).write_text(str(bound))
                app = http_app(gateway, host=host, token=token)
                server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
                await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    return EXIT_OK


def serve_main(argv: list[str]) -> int:
    """`breakwater serve`: one MCP server in front of every configured server."""
    import os

    from breakwater._gateway import LOOPBACK_HOSTS

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
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    token = args.token or os.environ.get("BREAKWATER_TOKEN") or None
    if args.http and args.http[0] not in LOOPBACK_HOSTS and not token:
        print(
            f"breakwater: refusing to listen on {args.http[0]} without a token: anyone who can reach it could call "
            "your tools.\n  fix: pass --token (or set BREAKWATER_TOKEN), or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    config = load_or_exit(args.config)
    return anyio.run(_serve, config, args.http, token, args.port_file)


async def _tools(config: Config, query: str, as_json: bool, wait: float, accept: bool) -> int:
    from breakwater._gateway import Gateway

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
