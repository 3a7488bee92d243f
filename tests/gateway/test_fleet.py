"""A fleet behind a real load balancer: three `serve --http` replicas behind HAProxy, sharing Redis, restarted under load."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from breakwater._wire import OPERATION_ID_META_KEY, REPLAYED_META_KEY
from breakwater.testing._fleet import ACCEPT, UPSTREAM_TOOLS, Fleet, FleetOptions, loaded
from breakwater.testing._ledger import read_ledger
from helpers import REDIS_URL, eventually

pytestmark = [pytest.mark.long_module(46), pytest.mark.anyio]


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


def _modern_call(tool: str, operation_id: str) -> tuple[dict[str, str], dict[str, Any]]:
    meta = {
        OPERATION_ID_META_KEY: operation_id,
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": tool}
    return headers, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}, "_meta": meta}}


def _legacy_call(session: str, tool: str, operation_id: str, request_id: int = 1) -> tuple[dict[str, str], dict[str, Any]]:
    headers = {**ACCEPT, "mcp-protocol-version": "2025-11-25", "mcp-session-id": session}
    params = {"name": tool, "arguments": {}, "_meta": {OPERATION_ID_META_KEY: operation_id}}
    return headers, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _result(response: Any) -> dict[str, Any]:
    """The tools/call result in a JSON or SSE answer."""
    assert response.status_code == 200, (response.status_code, response.text)
    if response.headers.get("content-type", "").startswith("application/json"):
        assert "result" in response.json(), response.text
        return dict(response.json()["result"])
    data = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
    return dict(next(m for m in data if "result" in m)["result"])


async def test_kill_9_loses_only_the_calls_it_ran_and_their_retries_never_run_them_twice(
    tmp_path: Path, haproxy: str, redis_available: None
) -> None:
    """The issue's kill -9 target: a replica killed mid-call loses only the calls it was running; each one's retry
    through the balancer, under the same operation id, is answered (OUTCOME_UNKNOWN with the id, or the first call's
    stored answer), and the ledger shows no call run twice; the clients under load see the same."""
    # Long enough that the kill lands while both calls run even on a machine loaded enough to see their ledger
    # lines late (at 2.5 s, a load of 20 once let a call finish first).
    tools = (*UPSTREAM_TOOLS, "hold:latency=4,mutating")
    options = FleetOptions(redis_url=REDIS_URL, idle_timeout_s=5.0, keepalive_s=0.5, drain_s=5.0, upstream_tools=tools)
    async with Fleet(tmp_path, options) as fleet:
        victim, other = fleet.replicas[0], fleet.replicas[1]
        lost = [uuid.uuid4().hex, uuid.uuid4().hex]
        abandoned = uuid.uuid4().hex
        answers: dict[str, Any] = {}

        async def direct(replica: Any, op: str, give_up_s: float) -> None:
            headers, body = _modern_call("shop__hold", op) if op in lost else _legacy_call(session, "shop__hold", op)
            # A deadline on the whole answer, not httpx's timeout: that one is per read, and the replica's SSE
            # keep-alive (every keepalive_s) restarts it, so a 0.5 s read timeout once waited out the 4 s call.
            try:
                with anyio.fail_after(give_up_s):
                    url = f"http://127.0.0.1:{replica.port}/mcp"
                    answers[op] = await fleet.http.post(url, headers=headers, json=body, timeout=60.0)
            except (httpx2.HTTPError, TimeoutError) as exc:
                answers[op] = exc

        # A 2025-11-25 session (a cut stream is not a cancellation there: the call runs on without its client).
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
        session = (await fleet.http.post(fleet.url, json=init, headers=ACCEPT)).headers["mcp-session-id"]
        await fleet.http.post(
            fleet.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=_legacy_call(session, "", "")[0]
        )
        async with loaded(fleet.url, modern_clients=3, legacy_clients=3, rate=3.0) as stats:
            async with anyio.create_task_group() as tg:
                for op in lost:
                    tg.start_soon(direct, victim, op, 30.0)
                # A client that gives up on its answer early: the call still runs to its end on a live replica.
                tg.start_soon(direct, other, abandoned, 0.5)
                await eventually(lambda: {*lost, abandoned} <= {r["operation_id"] for r in read_ledger(fleet.ledger)}, 20)
                await victim.stop(signal.SIGKILL)
            assert all(isinstance(answers[op], httpx2.HTTPError) for op in lost), answers
            assert isinstance(answers[abandoned], TimeoutError), answers
            # Each client retries through the balancer, under the same operation id.
            for op in lost:
                headers, body = _modern_call("shop__hold", op)
                retried = _result(await fleet.http.post(fleet.url, headers=headers, json=body))
                envelope = retried["structuredContent"]
                assert (envelope["code"], envelope["operation_id"], envelope["reason"]) == ("OUTCOME_UNKNOWN", op, "replica_lost")
            # A new request (id) in the same session, carrying the same operation id.
            headers, body = _legacy_call(session, "shop__hold", abandoned, request_id=2)
            replayed = _result(await fleet.http.post(fleet.url, headers=headers, json=body))
            assert replayed["structuredContent"]["operation_id"] == abandoned and not replayed.get("isError")
            assert replayed["_meta"][REPLAYED_META_KEY] is True
            victim.start()
            await victim.wait_ready(fleet.http)
            await anyio.sleep(1.0)
        ledger = [r["operation_id"] for r in read_ledger(fleet.ledger)]
        assert all(ledger.count(op) == 1 for op in (*lost, abandoned)), ledger
        assert fleet.duplicates() == 0
        assert stats.calls > 30
        # Whatever the background clients had in flight on the victim was cut, retried and answered.
        assert stats.unanswered == 0, stats.failures
        assert stats.retried == stats.reconciled + stats.unknown + stats.rerun
        # Failed: the retries answered OUTCOME_UNKNOWN, and the calls resumed on another replica that were answered so
        # (a 2025-11-25 stream cut by the kill after its first event: the follower cannot know either).
        assert stats.failed == stats.unknown + stats.resumed_unknown, stats.failures
