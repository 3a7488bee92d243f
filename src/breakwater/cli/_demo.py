"""`breakwater demo`: the whole story on built-in local servers, through the gateway, in under a minute.

No config is needed. The demo starts its own `breakwater testserver`s — healthy ones, one slow to
start, one refusing its first connections, one that crashes at start, one whose command does not
exist — puts `breakwater serve` in front of them, and drives it with a short scripted agent (the
SDK's own client), narrating what the agent sees:

1. start-up: every server's state as it changes;
2. the three-way answer: a tool that does not exist, one whose server is still connecting, one
   whose server failed (with the reason and the next retry);
3. a tool turning slow: its breaker opens after a few timeouts while the other tools stay fast;
4. a destructive call timing out: `OUTCOME_UNKNOWN`, not retried, run exactly once;
5. a per-tool summary.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import anyio
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from breakwater.cli._common import answer_console, counted
from breakwater.testing.server import count_ledger, launch_command, serve_http

__all__ = ["demo_main"]

# The tax server answers nothing until the demo lets it start (`--start-when`), after the fourth act:
# it is still connecting whenever the agent looks for it or calls it, however fast or loaded the
# machine (a fixed delay of 15 s was over before the agent's call on a slow one), and then comes up,
# with a list_changed notification, before the demo ends.
TAX_START_FILE = "tax-may-start"
TAX_UP_WAIT_S = 40
CRM_CRASH = "ModuleNotFoundError: No module named 'crm_sdk'"
STARTUP_WATCH_S = 12
STATS_WIDTH = 132  # the stats table (twelve columns) does not fit in 80 or 120 columns
SLOW_TOOL_TIMEOUT_S = 1


def _stdio_entry(*flags: str) -> dict[str, Any]:
    cmd = launch_command(*flags)
    return {"command": cmd[0], "args": cmd[1:]}


class Agent:
    """The scripted agent: an SDK client of the gateway that records every call it makes."""

    def __init__(self, client: Client, console: Console, t0: float) -> None:
        self.client = client
        self.console = console
        self.t0 = t0
        self.calls: dict[str, list[tuple[str, float]]] = defaultdict(list)

    def say(self, text: str) -> None:
        self.console.print(f"[dim]+{time.monotonic() - self.t0:5.1f}s[/] {text}")

    async def call(self, name: str, args: dict[str, Any] | None = None, *, quiet: bool = False) -> types.CallToolResult:
        started = time.monotonic()
        result = await self.client.call_tool(name, args or {})
        elapsed = time.monotonic() - started
        sc = result.structured_content or {}
        code = str(sc.get("code", "TOOL_ERROR")) if result.is_error else "ok"
        if not name.startswith("breakwater_"):
            self.calls[name].append((code, elapsed))
        if not quiet:
            colour = "green" if code == "ok" else "yellow" if code in ("CIRCUIT_OPEN", "SERVER_CONNECTING") else "red"
            detail = ""
            if result.is_error:
                detail = " — " + escape(str(sc.get("message", "")))[:150]
                if sc.get("operation_id"):
                    detail += f" [dim](operation {sc['operation_id']})[/]"
            self.say(f"  {name:<22} [{colour}]{code:<18}[/] {elapsed * 1000:7.0f} ms{detail}")
        return result


@asynccontextmanager
async def _fleet(workdir: Path) -> AsyncIterator[tuple[Path, Path, Path]]:
    """Start the HTTP servers and write the config: an mcpServers file plus a breakwater.toml with policy."""
    control = workdir / "search-control.json"
    control.write_text(json.dumps({"tools": {}}))
    ledger = workdir / "payments-ledger.jsonl"
    async with (
        serve_http(
            "--name", "search", "--tool", "web_search:latency=0.05,readonly", "--control-file", str(control), stderr=DEVNULL
        ) as search,
        serve_http(
            "--name", "payments", "--refuse-first", "3", "--ledger", str(ledger),
            "--tool", "charge:latency=3,mutating,destructive", stderr=DEVNULL,
        ) as payments,
    ):  # fmt: skip
        servers = {
            "files": _stdio_entry("--name", "files", "--tool", "read_file:latency=0.02,readonly"),
            "search": {"type": "http", "url": search.url},
            "tax": _stdio_entry(
                "--name", "tax", "--start-when", str(workdir / TAX_START_FILE), "--tool", "quote:latency=0.1,readonly"
            ),
            "payments": {"type": "http", "url": payments.url},
            "crm": _stdio_entry("--name", "crm", "--exit-at-start", "1", "--exit-message", CRM_CRASH),
            "erp": {"command": "legacy-erp-mcp-server", "args": ["--stdio"]},
        }
        (workdir / ".mcp.json").write_text(json.dumps({"mcpServers": servers}, indent=2))
        config = workdir / "breakwater.toml"
        config.write_text(
            f"""servers_file = ".mcp.json"

[servers.search.tools.web_search]
timeout_s = {SLOW_TOOL_TIMEOUT_S}

[servers.payments.tools.charge]
timeout_s = 1

[servers.tax.tools.quote]
timeout_s = 2
"""
        )
        yield config, control, ledger


async def _startup(agent: Agent) -> None:
    agent.console.rule("[bold]1. Start-up: six servers — one slow, one refusing at first, two broken")
    seen: dict[str, tuple[str, int]] = {}
    deadline = time.monotonic() + STARTUP_WATCH_S
    while time.monotonic() < deadline:
        report = (await agent.call("breakwater_status", quiet=True)).structured_content or {}
        for s in report.get("servers", []):
            key = (s["state"], s["attempts"])
            if seen.get(s["name"]) == key or s["state"] == "pending":
                continue
            seen[s["name"]] = key
            error = s.get("error") or {}
            if s["state"] == "ready":
                what = f"[green]ready[/] ({s['protocol']}, {s['tools']} tools, attempt {s['attempts']}, {s['connect_ms']} ms)"
            elif s["state"] == "connecting":
                what = f"[cyan]connecting[/], attempt {s['attempts']}"
            else:
                colour = "yellow" if s["state"] == "retrying" else "red"
                what = f"[{colour}]{s['state']}[/]: {error.get('code')} — {escape(str(error.get('message')))}"
            agent.say(f"[bold]{s['name']:<9}[/] {what}")
        states = Counter(s["state"] for s in report.get("servers", []))
        if states["ready"] + states["failed"] >= 5:
            break
        await anyio.sleep(0.25)


async def _three_way(agent: Agent) -> None:
    agent.console.rule("[bold]2. Where is tool X? Three different answers")
    agent.say("agent: look for a tax quote tool (its server is still starting)")
    result = await agent.call("breakwater_search_tools", {"query": "tax quote"}, quiet=True)
    for line in result.content[0].text.splitlines():  # type: ignore[union-attr]
        agent.console.print(f"         {escape(line)}")
    agent.say("agent: look for an invoice tool (the erp server cannot start)")
    result = await agent.call("breakwater_search_tools", {"query": "invoice"}, quiet=True)
    for line in result.content[0].text.splitlines():  # type: ignore[union-attr]
        agent.console.print(f"         {escape(line)}")
    agent.say("agent: call tools on those servers anyway, and one that exists nowhere")
    await agent.call("erp__create_invoice", {"amount": 120})
    await agent.call("crm__find_customer", {"name": "ACME"})
    await agent.call("tax__quote", {"amount": 120})
    await agent.call("weather__forecast", {"city": "Oslo"})


async def _slow_tool(agent: Agent, control: Path) -> None:
    agent.console.rule("[bold]3. search.web_search turns 40 s slow: its breaker opens, the other tools stay fast")
    for turn in range(1, 9):
        if turn == 3:
            control.write_text(json.dumps({"tools": {"web_search": {"latency": 40}}}))
            agent.say("[magenta]incident: web_search now takes 40 s per call[/]")
        agent.say(f"turn {turn}")
        await agent.call("files__read_file", {"payload": "notes.md"})
        await agent.call("search__web_search", {"payload": "mcp breakwater"})


async def _destructive(agent: Agent, ledger: Path) -> None:
    agent.console.rule("[bold]4. A destructive call times out: OUTCOME_UNKNOWN, never retried blindly")
    await agent.call("payments__charge", {"payload": "order 1042: 120 EUR"})
    await anyio.sleep(2.5)  # let the upstream call finish (or be cancelled) so the ledger is final
    ran = counted(count_ledger(ledger, tool="charge"), "time")
    agent.say(f"payments ledger: the charge ran {ran} — the agent must check, not retry")


def _summary(agent: Agent) -> None:
    agent.console.rule("[bold]5. Per-tool summary (what the agent saw)")
    table = Table()
    for column in ("tool", "calls", "ok", "outcomes", "p50", "max"):
        table.add_column(column)
    for name, calls in agent.calls.items():
        codes = Counter(code for code, _ in calls)
        durations = [d for _, d in calls]
        outcomes = ", ".join(f"{code} x{n}" for code, n in codes.items() if code != "ok") or "-"
        table.add_row(
            name,
            str(len(calls)),
            str(codes["ok"]),
            outcomes,
            f"{statistics.median(durations) * 1000:.0f} ms",
            f"{max(durations) * 1000:.0f} ms",
        )
    agent.console.print(table)


async def _run(console: Console) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="breakwater-demo-"))
    env = dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(workdir / "admission"),
        BREAKWATER_CATALOG_DIR=str(workdir / "catalog"),
        BREAKWATER_PROTOCOL_MEMORY_DIR=str(workdir / "protocols"),
        # The demo's calls go to a journal of its own, not to the user's.
        BREAKWATER_JOURNAL=str(workdir / "journal.sqlite3"),
        # Its gateway is its session's own, as `--no-share` runs it: it exits with the session, its journal
        # flushed for `stats`, and nothing outlives the temporary directory (a shared gateway would).
        BREAKWATER_SHARE="off",
    )
    notifications: list[float] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            notifications.append(time.monotonic())

    try:
        async with _fleet(workdir) as (config, control, ledger):
            console.print(f"[dim]config: {config} (+ .mcp.json beside it); gateway: breakwater serve --config {config}[/]")
            params = StdioServerParameters(
                command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env, cwd=str(workdir)
            )
            with (workdir / "gateway.log").open("w") as errlog:
                async with Client(stdio_client(params, errlog=errlog), mode="legacy", message_handler=on_message) as client:
                    agent = Agent(client, console, time.monotonic())
                    await _startup(agent)
                    await _three_way(agent)
                    await _slow_tool(agent, control)
                    await _destructive(agent, ledger)
                    console.rule("[bold]... and the slow-starting tax server comes up")
                    (workdir / TAX_START_FILE).touch()
                    with anyio.move_on_after(TAX_UP_WAIT_S):
                        while True:
                            heard = len(notifications)
                            tax = [t.name for t in (await client.list_tools()).tools if t.name.startswith("tax__")]
                            if tax:
                                when = f"+{notifications[-1] - agent.t0:.1f}s" if notifications else "earlier"
                                found = ", ".join(tax)
                                agent.say(f"notifications/tools/list_changed arrived ({when}); re-listing finds: {found}")
                                await agent.call("tax__quote", {"amount": 120})
                                break
                            while len(notifications) == heard:
                                await anyio.sleep(0.1)
                    _summary(agent)
            # The gateway has exited and flushed its journal: what an on-call engineer would see.
            console.rule("[bold]... and what the gateway's call journal recorded (breakwater stats)")
            stats = subprocess.run(
                # With the config, the timeout column shows the demo's own per-tool timeouts as configured.
                [sys.executable, "-m", "breakwater", "stats", "--config", str(config), "--journal", env["BREAKWATER_JOURNAL"]],
                capture_output=True,
                text=True,
                env={**env, "COLUMNS": str(console.width)},
                check=False,
            )
            console.print(stats.stdout.rstrip() or stats.stderr.rstrip(), markup=False, highlight=False)
            agent.say("done")
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def demo_main(argv: list[str]) -> int:
    """`breakwater demo`: no arguments; runs in under a minute."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    console = answer_console(highlight=False)
    if not console.is_terminal:
        console = answer_console(highlight=False, width=STATS_WIDTH)  # piped: wide enough for every table
    return anyio.run(_run, console)
