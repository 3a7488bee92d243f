"""A session's first prompts and resources lists, and its first reads, reach the servers still on their way.

Many clients (Claude Code's slash commands, the Inspector's one-shot CLI) list prompts and resources
once, right after the handshake. The gateway lists them live from the ready servers, so an answer
given at once left out every server still connecting. Real parts: `breakwater serve` in a real
process, the conformance server (`tests/conformance/server.py`) as the upstream, started 1.5 s late,
and a server that cannot start at all, which is not waited for.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from helpers import isolated_env

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

UPSTREAM = Path(__file__).resolve().parents[1] / "conformance" / "server.py"
LATE_START = "import runpy, sys, time; time.sleep(1.5); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


async def _lists(client: Client) -> tuple[set[str], set[str], set[str]]:
    prompts = {p.name for p in (await client.list_prompts()).prompts}
    resources = {str(r.uri) for r in (await client.list_resources()).resources}
    templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    return prompts, resources, templates


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "late": {"command": sys.executable, "args": ["-c", LATE_START, str(UPSTREAM)]},
                    "gone": {"command": "breakwater-no-such-server"},
                }
            }
        )
    )
    return config


def _serve(tmp_path: Path) -> StdioServerParameters:
    args = ["-m", "breakwater", "serve", "--no-share", "--config", str(_config(tmp_path))]
    # The failed server stays retrying (not connecting again) for longer than the test runs.
    env = isolated_env(tmp_path, BREAKWATER_CONNECT_BACKOFF_BASE_S="60", BREAKWATER_LIST_WAIT_S="60")
    return StdioServerParameters(command=sys.executable, args=args, env=env)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_first_lists_wait_for_a_server_on_its_way_and_not_for_one_that_failed(tmp_path: Path, mode: str) -> None:
    with anyio.fail_after(90):
        async with Client(StdioServerParameters(command=sys.executable, args=[str(UPSTREAM)]), mode=mode) as direct:
            want_prompts, want_resources, want_templates = await _lists(direct)
        async with Client(_serve(tmp_path), mode=mode) as client:
            started = time.monotonic()
            prompts, resources, templates = await _lists(client)
            waited = time.monotonic() - started
    assert want_prompts and want_resources and want_templates, "the conformance server offers all three"
    assert prompts == {f"late__{name}" for name in want_prompts}
    assert resources == want_resources
    assert templates == want_templates
    # Ready about 1.5 s after the start; far below the 60 s bound, which the failed server would have run out.
    assert waited < 30, waited


async def test_a_first_read_of_a_uri_never_listed_waits_for_the_server_that_offers_it(tmp_path: Path) -> None:
    """A client that knows its URIs reads (or subscribes) without listing first: a static resource and one made
    from a template come back as the server gives them, not as "no ready server offers the resource"."""
    uris = ["test://static-text", "test://template/42/data"]
    with anyio.fail_after(90):
        async with Client(StdioServerParameters(command=sys.executable, args=[str(UPSTREAM)]), mode="legacy") as direct:
            want = [(await direct.read_resource(uri)).contents for uri in uris]
        async with Client(_serve(tmp_path), mode="legacy") as client:
            got = [(await client.read_resource(uri)).contents for uri in uris]
            await client.subscribe_resource("test://watched-resource")
    assert got == want
