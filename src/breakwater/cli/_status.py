"""`breakwater status`: connect to every server (or ask a running gateway) and report each one's state.

When the user's shared local gateway for this config is running (the one stdio `serve` sessions
attach to), `status` asks it instead of connecting from here, and says how many sessions it serves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial

import anyio
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from breakwater._breakwater import Breakwater
from breakwater.cli._common import (
    EXIT_CONFIG,
    EXIT_NOT_READY,
    EXIT_OK,
    Parser,
    add_config_flag,
    counted,
    fail,
    load_or_exit,
    seconds,
    show,
)
from breakwater.cli._text import cell, markup
from breakwater.config import Config, GatewayPolicy
from breakwater.config._checks import DEFAULT_TOOL_NAME_MAX, MAX_TOOL_NAME, namespaced
from breakwater.status import ServerState, StatusReport

__all__ = ["status_main", "status_view"]

DEFAULT_STATUS_WAIT_S = 30.0
LIVE_REFRESH_S = 0.25

STATE_STYLE = {
    ServerState.READY: "green",
    ServerState.CONNECTING: "cyan",
    ServerState.PENDING: "dim",
    ServerState.RETRYING: "yellow",
    ServerState.FAILED: "red",
    ServerState.DISABLED: "dim",
}


def status_view(
    report: StatusReport,
    *,
    now: float | None = None,
    template: str | None = None,
    name_max: int = DEFAULT_TOOL_NAME_MAX,
    drift: Mapping[str, Sequence[str]] | None = None,
    drift_mode: str = "warn",
) -> Group:
    """The status as a compact table, then one line per server that is not ready saying why, and one per tool left out.

    With the gateway's `template` and `name_max` (`[gateway] tool_name_template`, `tool_name_max`), a tool left
    out is named as the gateway would list it, the name an agent would look for.
    """
    now = time.time() if now is None else now
    table = Table(title="breakwater status", title_justify="left")
    for column in ("server", "transport", "state", "protocol", "tools", "attempts", "connect"):
        table.add_column(column, no_wrap=True)
    problems: list[str] = []
    narrow: list[str] = []  # one line per server, where the table does not fit
    for s in report.servers:
        state = s.state.value
        if s.state is ServerState.CONNECTING:
            state += f" #{s.attempt}" + (" (queued)" if s.phase == "queued" else "")
        facts = [s.transport, *(x for x in (s.protocol, None if s.tools is None else f"{s.tools} tools") if x)]
        narrow.append(f"[bold]{markup(s.name)}[/] [{STATE_STYLE[s.state]}]{state}[/] {markup(', '.join(facts))}")
        table.add_row(
            cell(s.name),
            s.transport,
            f"[{STATE_STYLE[s.state]}]{state}[/]",
            cell(s.protocol or ""),
            "" if s.tools is None else str(s.tools),
            str(s.attempts),
            "" if s.connect_ms is None else f"{s.connect_ms} ms",
        )
        if s.error is not None and s.state is not ServerState.READY:
            line = f"[bold]{markup(s.name)}[/]: [{STATE_STYLE[s.state]}]{s.error.code.value}:[/] {markup(s.error.message)}"
            if s.next_retry_at is not None:
                line += f" [dim](next try in {max(0.0, s.next_retry_at - now):.0f} s)[/]"
            problems.append(line)
        if s.disabled_by:
            problems.append(f"[bold]{markup(s.name)}[/]: [dim]not started: {markup(s.disabled_by)}[/]")
        if s.last_drop is not None and s.state is ServerState.READY and s.last_drop_at is not None:
            ago = f"{max(0.0, now - s.last_drop_at):.0f} s ago"
            problems.append(f"[bold]{markup(s.name)}[/]: [dim]reconnected; it dropped {ago}: {markup(s.last_drop.message)}[/]")
        problems += [f"[bold]{markup(s.name)}[/]: [yellow]{markup(note)}[/]" for note in s.unmatched]
        for t in s.rejected_tools:
            name = t.name if template is None else namespaced(template, s.name, t.name, name_max)
            listed = f" (listed as '{markup(t.name)}')" if name != t.name else ""
            problems.append(f"[bold]{markup(s.name)}[/]: [yellow]tool '{markup(name)}'{listed} left out:[/] {markup(t.reason)}")
        for tool in (drift or {}).get(s.name, ()):
            # A changed definition was said by `tools` alone; under "block" the tool had vanished from the list unsaid.
            name = tool if template is None else namespaced(template, s.name, tool, name_max)
            what = "left out until approved" if drift_mode == "block" else "still served; review it"
            accept = f"`breakwater tools --accept {name}` approves it"
            problems.append(
                f"[bold]{markup(s.name)}[/]: [yellow]tool '{markup(name)}' changed since approved:[/] {what}; {accept}"
            )
    table.caption = ", ".join(f"{n} {state}" for state, n in report.summary.items())
    fallback = [Text.from_markup(line) for line in ["[italic]breakwater status[/]", *narrow, f"[dim]{table.caption}[/]"]]
    return Group(_Fitted(table, fallback), *(Text.from_markup(p) for p in problems))


#: A width no terminal has: the table measured as wide as it wants to be.
_UNBOUNDED = 100_000


class _Fitted:
    """The table where the terminal is wide enough for it, else one line per server: `COLUMNS=20` squeezed the table
    until the server column had no width at all."""

    def __init__(self, table: Table, lines: list[Text]) -> None:
        self.table = table
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if Measurement.get(console, options.update(max_width=_UNBOUNDED), self.table).maximum <= options.max_width:
            yield self.table
        else:
            yield from self.lines


async def _wait_live(bw: Breakwater, wait: float, err: Console) -> StatusReport:
    """`wait_ready`, redrawing the table on the terminal while it waits."""
    template, name_max = bw.config.gateway.tool_name_template, bw.config.gateway.tool_name_max
    view = partial(status_view, template=template, name_max=name_max)
    with Live(view(bw.status()), console=err, transient=True, refresh_per_second=8) as live:
        async with anyio.create_task_group() as tg:

            async def refresh() -> None:
                while True:
                    live.update(view(bw.status()))
                    await bw.clock.sleep(LIVE_REFRESH_S)

            tg.start_soon(refresh)
            report = await bw.wait_ready(timeout=wait)
            tg.cancel_scope.cancel()
    return report


async def _run_status(config: Config, wait: float, as_json: bool) -> int:
    from breakwater.gateway._roots import gateway_client_hooks, one_client_servers

    err = Console(stderr=True)
    # Connect as the gateway does, so `tools` counts what the gateway lists (some servers list more to it).
    async with Breakwater(config, client_hooks=gateway_client_hooks(config), one_client=one_client_servers(config)) as bw:
        if wait > 0 and err.is_terminal:
            report = await _wait_live(bw, wait, err)
        elif wait > 0:
            report = await bw.wait_ready(timeout=wait)
        else:
            await bw.clock.sleep(0)
            report = bw.status()
        drift = _learn(config, bw)
    policy = config.gateway
    if as_json:
        print(json.dumps(report.to_json() | {"drift": drift, "drift_mode": policy.drift}, indent=2))
    else:
        template, name_max = policy.tool_name_template, policy.tool_name_max
        show(status_view(report, template=template, name_max=name_max, drift=drift, drift_mode=policy.drift))
    return EXIT_OK if report.all_ready else EXIT_NOT_READY


def _learn(config: Config, bw: Breakwater) -> dict[str, list[str]]:
    """Per ready server, its tools whose definition changed since approved, as the gateway sees them (its catalog).

    Each ready server's tools are kept as its last-known ones too, as the gateway keeps them: the first `serve` after
    a `status` lists them while its servers still connect, where it listed none and waited up to `list_wait_s`."""
    from breakwater.gateway._open import gateway_catalog

    catalog = gateway_catalog(config)
    drift: dict[str, list[str]] = {}
    for spec in config.servers:
        upstream = bw.upstream(spec.name)
        if upstream.state is not ServerState.READY:
            continue
        fingerprint = spec.fingerprint()
        catalog.remember(spec.name, fingerprint, upstream.tools)
        # `accept`: approved as they change, nothing to say.
        if config.gateway.drift != "accept" and (changed := catalog.drifted(spec.name, fingerprint, upstream.tools)):
            drift[spec.name] = changed
    return drift


#: What the gateway's refusals mean for `status --gateway` (the SDK's client says only "an error response"): it was
#: reached, and the fix is in how it was asked.
_REFUSALS = {
    401: "refused the token (HTTP 401): pass the one it was started with, --token or BREAKWATER_TOKEN",
    # A gateway reached at another path (no `/mcp`): it said "Server returned an error response", and to check it runs.
    404: "has no MCP endpoint at this path (HTTP 404): `breakwater serve --http` answers at /mcp",
    405: "has no MCP endpoint at this path (HTTP 405): `breakwater serve --http` answers at /mcp",
    403: "refused this request's Origin (HTTP 403): ask it without an Origin header, as a client off the browser does",
    421: "does not answer to the host in this URL (HTTP 421): use the address it listens on, or start it with "
    "--allowed-host for this name",
}


async def _gateway_status(url: str, token: str | None, as_json: bool, refused: list[int]) -> int:
    """Ask a running `breakwater serve --http` gateway instead of connecting from here; `refused` gets the status of
    each answer that refused a request (4xx)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def note(response: httpx2.Response) -> None:
        if 400 <= response.status_code < 500:
            refused.append(response.status_code)

    headers = {"authorization": f"Bearer {token}"} if token else {}
    hooks = {"response": [note]}
    async with (
        httpx2.AsyncClient(headers=headers, event_hooks=hooks) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        result = await client.call_tool("breakwater_status", {})
    data = result.structured_content or {}
    if as_json:
        print(json.dumps(data, indent=2))
    report = StatusReport.from_json(data)
    lines, server_refuses = breakers_shown(data.get("breakers"))
    if not as_json:
        template, name_max = data.get("tool_name_template"), data.get("tool_name_max")
        named = template if isinstance(template, str) else None
        limit = name_max if isinstance(name_max, int) else MAX_TOOL_NAME
        drift, mode = data.get("drift"), data.get("drift_mode")
        shown = status_view(
            report,
            template=named,
            name_max=limit,
            drift=drift if isinstance(drift, dict) else None,
            drift_mode=mode if isinstance(mode, str) else "warn",
        )
        show(Group(shown, *lines))
    return EXIT_OK if report.all_ready and not server_refuses else EXIT_NOT_READY


def breakers_shown(breakers: object) -> tuple[list[Text], bool]:
    """A line per breaker of the gateway's that is not closed, and whether a server's own breaker is among them (it
    refuses every call: not ready, whatever its connection's state). A ready server whose breaker refused every call
    read as healthy in the table, exit 0 (the JSON named them)."""
    lines, server_refuses = [], False
    for b in breakers if isinstance(breakers, list) else ():
        if isinstance(b, dict) and isinstance(b.get("name"), str):
            wait = b.get("retry_after_s")
            when = f" [dim](lets a call through in {wait:.0f} s)[/]" if isinstance(wait, int | float) and wait > 0 else ""
            state, why = markup(str(b.get("state"))), markup(str(b.get("reason") or ""))
            lines.append(Text.from_markup(f"[bold]{markup(b['name'])}[/]: [red]breaker {state}[/]: {why}{when}"))
            server_refuses = server_refuses or "/" not in b["name"]
    return lines, server_refuses


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater status",
        description="Connect to every configured server and report each one's state.",
    )
    add_config_flag(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--wait",
        type=seconds,
        default=DEFAULT_STATUS_WAIT_S,
        metavar="SECONDS",
        help=f"wait up to this long for servers to become ready (default {DEFAULT_STATUS_WAIT_S:g}; 0 reports at once)",
    )
    parser.add_argument(
        "--gateway", metavar="URL", help="ask a running `breakwater serve --http` gateway (e.g. http://127.0.0.1:8765/mcp)"
    )
    parser.add_argument("--token", help="bearer token for --gateway (default: $BREAKWATER_TOKEN)")
    return parser


def status_main(argv: list[str]) -> int:
    """`breakwater status`: connect to every server and report each one's state."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.gateway:
        if not args.gateway.startswith(("http://", "https://")):
            return fail(
                f"--gateway: expected an http(s) URL such as http://127.0.0.1:8765/mcp, got {args.gateway!r}", EXIT_CONFIG
            )
        token = args.token or os.environ.get("BREAKWATER_TOKEN") or None
        refused: list[int] = []
        try:
            result: int = anyio.run(_gateway_status, args.gateway, token, args.json, refused)
        except Exception as exc:
            if refused and (why := _REFUSALS.get(refused[-1])) is not None:
                if refused[-1] == 401 and token is None:
                    why = "wants a token (HTTP 401): pass the one it was started with, --token or BREAKWATER_TOKEN"
                return fail(f"the gateway at {args.gateway} {why}", EXIT_CONFIG)
            leaf: BaseException = exc
            while isinstance(leaf, BaseExceptionGroup):  # the transports wrap their failures in groups
                leaf = leaf.exceptions[0]
            if isinstance(leaf, TimeoutError) or type(leaf).__name__.endswith("Timeout"):
                # Reached, and silent: "check that it is running" sent the reader to the wrong place.
                said = "took the connection but did not answer in time (stopped, or too busy); check its process"
                return fail(f"the gateway at {args.gateway} {said}", EXIT_NOT_READY)
            return fail(
                f"cannot reach the gateway at {args.gateway}: {type(leaf).__name__}: {leaf}; "
                "check the URL and that `breakwater serve --http` is running",
                EXIT_NOT_READY,
            )
        return result
    config = load_or_exit(args.config)
    from breakwater.cli._gateway import shared_gateway_info

    shared = shared_gateway_info(config)
    if shared is not None:
        from breakwater.gateway._session import per_session

        if not per_session(config):
            return _shared_status(shared, args.json, config.gateway)
        seen = shared.get("sessions_status")
        if isinstance(seen, dict):  # the agents' sessions run their own copies: what they see is the answer
            return _shared_status(shared, args.json, config.gateway, StatusReport.from_json(seen))
        # Those run in each session, and no session runs: connect to everything from here.
        print(
            f"breakwater: shared gateway pid {shared.get('pid')}, serving {counted(shared.get('sessions'), 'session')}; "
            "its sessions' own stdio servers are not its to report, so this status connects from here",
            file=sys.stderr,
        )
    code: int = anyio.run(_run_status, config, args.wait, args.json)
    return code


def _shared_status(info: dict[str, object], as_json: bool, gateway: GatewayPolicy, seen: StatusReport | None = None) -> int:
    """The status of the shared gateway this config's sessions attach to, as it sees its servers, or (`seen`) as its
    sessions see theirs."""
    data = info.get("status")
    report = seen or StatusReport.from_json(data if isinstance(data, dict) else {})
    sessions = counted(info.get("sessions"), "session")
    line = f"shared gateway pid {info.get('pid')}, serving {sessions} (breakwater gateway list)"
    if seen is not None:
        line += "; each server as the session that fares worst with it sees it"
    if as_json:
        shown = report.to_json() | {"shared_gateway": {k: info.get(k) for k in ("pid", "sessions", "version", "started")}}
        print(json.dumps(shown, indent=2))
    else:
        print(f"breakwater: {line}", file=sys.stderr, flush=True)
        show(status_view(report, template=gateway.tool_name_template, name_max=gateway.tool_name_max))
    return EXIT_OK if report.all_ready else EXIT_NOT_READY
