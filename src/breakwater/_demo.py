"""`breakwater demo`: the whole story on built-in local servers, as a readable timeline.

No config is needed: the demo starts its own `breakwater testserver`s — some healthy, one slow to
start, one refusing its first connections, one that crashes at start, one whose command does not
exist — connects to all of them through breakwater, and narrates every state change and call.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import anyio
import mcp.types as types
from rich.console import Console
from rich.markup import escape

from breakwater._breakwater import Breakwater
from breakwater._commands import status_view
from breakwater.config import load_config
from breakwater.status import ServerState
from breakwater.testserver import launch_command, serve_http

__all__ = ["demo_main"]

SLOW_START_S = 6
CRM_CRASH = "ModuleNotFoundError: No module named 'crm_sdk'"
READY_WAIT_S = 20


def _stdio_entry(*flags: str) -> dict[str, Any]:
    cmd = launch_command(*flags)
    return {"command": cmd[0], "args": cmd[1:]}


@contextlib.asynccontextmanager
async def _fleet(workdir: Path) -> AsyncIterator[Path]:
    """Start the HTTP servers and write the mcpServers file the demo's agent uses."""
    async with (
        serve_http("--name", "search", "--tool", "web_search:latency=0.05,readonly", stderr=DEVNULL) as search,
        serve_http(
            "--name", "payments", "--refuse-first", "3", "--tool", "charge:latency=0.1,mutating,destructive", stderr=DEVNULL
        ) as payments,
    ):
        servers = {
            "files": _stdio_entry("--name", "files", "--tool", "read_file:latency=0.02,readonly"),
            "search": {"type": "http", "url": search.url},
            "tax": _stdio_entry("--name", "tax", "--startup-delay", str(SLOW_START_S), "--tool", "quote:latency=0.1,readonly"),
            "payments": {"type": "http", "url": payments.url},
            "crm": _stdio_entry("--name", "crm", "--exit-at-start", "1", "--exit-message", CRM_CRASH),
            "legacy-erp": {"command": "legacy-erp-mcp-server", "args": ["--stdio"]},
        }  # fmt: skip
        config = workdir / ".mcp.json"
        config.write_text(json.dumps({"mcpServers": servers}, indent=2))
        yield config


def _narrate(console: Console, t0: float, bw: Breakwater, seen: dict[str, tuple[str, int]]) -> None:
    for s in bw.status().servers:
        key = (s.state.value, s.attempts)
        if seen.get(s.name) == key:
            continue
        seen[s.name] = key
        at = f"[dim]+{time.monotonic() - t0:5.1f}s[/]"
        if s.state is ServerState.PENDING:
            continue
        if s.state is ServerState.READY:
            what = f"[green]ready[/] ({s.protocol}, {s.tools} tools, attempt {s.attempts}, {s.connect_ms} ms)"
        elif s.state is ServerState.CONNECTING:
            what = f"[cyan]connecting[/], attempt {s.attempts}"
        elif s.state in (ServerState.RETRYING, ServerState.FAILED) and s.error is not None:
            wait = "" if s.next_retry_at is None else f"; next try in {max(0.0, s.next_retry_at - time.time()):.1f} s"
            colour = "yellow" if s.state is ServerState.RETRYING else "red"
            what = f"[{colour}]{s.state.value}[/]: {s.error.code.value} — {escape(s.error.message)}{wait}"
        else:
            what = s.state.value
        console.print(f"{at} [bold]{s.name:<10}[/] {what}")


def _show_result(console: Console, label: str, result: types.CallToolResult) -> None:
    if result.is_error:
        sc = result.structured_content or {}
        code = sc.get("code", "TOOL_ERROR")
        text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
        console.print(f"  {label}: [red]{code}[/] — {escape(text)[:200]}")
    else:
        console.print(f"  {label}: [green]ok[/] {escape(json.dumps(result.structured_content))[:120]}")


async def _run(console: Console) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="breakwater-demo-"))
    try:
        async with _fleet(workdir) as config_path:
            config = load_config(config_path)
            console.rule("[bold]1. Start-up: six servers, one slow, one refusing, two broken")
            console.print(f"config: {config_path} ({len(config.servers)} servers, no breakwater.toml: default policy)\n")
            t0 = time.monotonic()
            seen: dict[str, tuple[str, int]] = {}
            async with Breakwater(config, admission_dir=workdir / "admission") as bw:
                async with anyio.create_task_group() as tg:

                    async def narrator() -> None:
                        while True:
                            _narrate(console, t0, bw, seen)
                            await bw.wait_changed()

                    tg.start_soon(narrator)
                    await bw.wait_ready(timeout=READY_WAIT_S)
                    tg.cancel_scope.cancel()
                _narrate(console, t0, bw, seen)
                console.print()
                console.print(status_view(bw.status()))

                console.rule("[bold]2. Calls: healthy tools answer; broken servers answer at once, with the reason")
                for server, tool, args in (
                    ("files", "read_file", {"payload": "README.md"}),
                    ("search", "web_search", {"payload": "breakwater"}),
                    ("crm", "lookup", {"payload": "ACME"}),
                ):
                    try:
                        result = await bw.call_tool(server, tool, args)
                    except Exception as exc:  # the gate is not wired in yet: say so plainly
                        console.print(f"  {server}.{tool}: [red]{type(exc).__name__}[/] — {escape(str(exc))}")
                    else:
                        _show_result(console, f"{server}.{tool}", result)
            console.print(f"\n[dim]done in {time.monotonic() - t0:.1f} s; try: breakwater status --config {config_path}[/]")
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def demo_main(argv: list[str]) -> int:
    """`breakwater demo`: no arguments; runs in under a minute."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    return anyio.run(_run, Console(highlight=False))
