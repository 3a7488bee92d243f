"""A fleet behind a real load balancer: three `serve --http` replicas behind HAProxy, sharing Redis, restarted under load."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from breakwater.testing._fleet import ACCEPT, Fleet, FleetOptions, loaded
from helpers import REDIS_URL, require

pytestmark = pytest.mark.anyio


@pytest.fixture
def haproxy() -> str:
    found = shutil.which("haproxy") or (Path("/usr/sbin/haproxy").exists() and "/usr/sbin/haproxy")
    if not found:
        require("haproxy is not installed", ci_fix="apt-get install -y haproxy; .ci/run does it")
    return str(found)


async def test_a_rolling_restart_with_redis_and_a_long_drain_loses_no_call(
    tmp_path: Path, haproxy: str, redis_available: None
) -> None:
    """The issue's target on a small run: round-robin, Redis, keep-alive below the idle timeout and a drain
    window longer than the longest call: 0 failed calls, 0 404s, 0 duplicate executions, both revisions."""
    options = FleetOptions(redis_url=REDIS_URL, idle_timeout_s=2.0, keepalive_s=0.5, drain_s=10.0)
    async with Fleet(tmp_path, options) as fleet:
        async with loaded(fleet.url, modern_clients=3, legacy_clients=3, rate=3.0) as stats:
            await anyio.sleep(0.5)
            await fleet.rolling_restart()
            await anyio.sleep(0.3)
        assert [code for r in fleet.replicas for code, _ in r.exits] == [0, 0, 0]
        assert stats.calls > 30
        assert stats.failures == []
        assert (stats.failed, stats.not_found, stats.reinits) == (0, 0, 0)
        assert fleet.duplicates() == 0
        # DELETE ends a session on every replica: round-robin sends the three requests to three replicas.
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
        opened = await fleet.http.post(fleet.url, json=init, headers=ACCEPT)
        session = {**ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        assert (await fleet.http.delete(fleet.url, headers=session)).status_code == 200
        listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        for _ in range(3):
            assert (await fleet.http.post(fleet.url, json=listed, headers=session)).status_code == 404


def test_the_readme_shows_the_haproxy_config_the_fleet_runs() -> None:
    """The README's example is `haproxy_config` itself (production timeouts), so the documented config is the tested one."""
    from breakwater.testing._fleet import haproxy_config

    shown = haproxy_config(
        listen_port=8765,
        replicas=[("gw1", "127.0.0.1:8801"), ("gw2", "127.0.0.1:8802"), ("gw3", "127.0.0.1:8803")],
        idle_timeout_s=60,
        check_interval_ms=1000,
    )
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert f"```\n{shown.rstrip()}\n```" in readme
