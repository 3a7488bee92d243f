"""Resumable streams over real HTTP: a call's SSE stream cut mid-call is resumed with Last-Event-ID.

Real `serve --http` replicas (`breakwater.testing._fleet`), a real upstream whose tool reports
progress, the machine's Redis and HAProxy. Three proofs: without Redis, the replica that ran the
call replays what the client missed; with Redis, a replica that never saw the call does it while
the first one still runs it; and behind HAProxy with the keep-alive off, the balancer's idle
timeout cuts the SDK client's stream and the client resumes it with nothing lost.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from breakwater.testing._fleet import ACCEPT, Fleet, FleetOptions
from breakwater.testing._sse import sse_events
from helpers import REDIS_URL

pytestmark = pytest.mark.anyio

#: Progress every 0.4 s for 2 s: events before and after the cut.
PROGRESSING = "prog:latency=2,progress=0.4,readonly"


async def _session(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    opened = await http.post(url, json=init, headers=ACCEPT)
    headers = {**ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


async def _cut_after_two_progress(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> tuple[str, list[Any]]:
    """POST the progressing call, read up to its second progress event, then drop the connection: (last id, progress)."""
    body = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "shop__prog", "arguments": {}, "_meta": {"progressToken": "p"}}}  # fmt: skip
    seen: list[Any] = []
    last_id = ""
    async with http.stream("POST", url, json=body, headers=headers) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        async for event in sse_events(response):
            last_id = event.get("id") or last_id
            if '"notifications/progress"' in event.get("data", ""):
                seen.append(event["data"])
                if len(seen) == 2:
                    break
    return last_id, seen


async def _resume(http: httpx2.AsyncClient, url: str, headers: dict[str, str], last_id: str) -> tuple[dict[str, Any], int]:
    """GET with Last-Event-ID: (the answer, progress events replayed or followed before it)."""
    async with http.stream("GET", url, headers={**headers, "last-event-id": last_id}) as response:
        assert response.status_code == 200
        progress = 0
        async for event in sse_events(response):
            data = event.get("data") or ""
            if '"notifications/progress"' in data:
                progress += 1
            elif data:
                return json.loads(data), progress
    raise AssertionError("the resumed stream ended without the answer")


async def _resumed(http: httpx2.AsyncClient, port: int) -> int:
    """`breakwater_streams_resumed_total` of the replica on `port`."""
    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith("breakwater_streams_resumed_total"))))


async def _ready(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with anyio.fail_after(30):
        while not (await http.post(url, json=body, headers=headers)).json().get("result", {}).get("tools"):
            await anyio.sleep(0.2)


async def test_without_redis_the_same_replica_replays_a_cut_stream(tmp_path: Path, haproxy: str) -> None:
    """Also: a silent call's stream, opened lazily, carries the `sse_keepalive_s` pings from the start."""
    options = FleetOptions(replicas=1, keepalive_s=0.3, upstream_tools=(PROGRESSING, "silent:latency=1.5,readonly"))
    async with Fleet(tmp_path, options) as fleet, httpx2.AsyncClient(timeout=30) as http:
        url = f"http://127.0.0.1:{fleet.replicas[0].port}/mcp"
        headers = await _session(http, url)
        await _ready(http, url, headers)
        last_id, seen = await _cut_after_two_progress(http, url, headers)
        assert last_id and len(seen) == 2
        await anyio.sleep(0.9)  # two more progress events are sent while nobody listens
        answer, progress = await _resume(http, url, headers, last_id)
        assert answer["id"] == 5 and not answer["result"].get("isError")
        assert answer["result"]["structuredContent"]["tool"] == "prog"
        assert progress >= 2  # the missed ones (and those after the reconnect)
        # The stream is kept for a later reconnect; an id it never gave out is a 404 (the client stops trying).
        again, _ = await _resume(http, url, headers, last_id)
        assert again == answer
        unknown = await http.get(url, headers={**headers, "last-event-id": "3/99"})
        assert unknown.status_code == 404

        body = {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "shop__silent", "arguments": {}}}
        async with http.stream("POST", url, json=body, headers=headers) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines()]
        pings = [line for line in lines if line.startswith(":")]
        # 1.5 s of silence at one ping per 0.3 s (the commit itself waits at most 0.3 s): a few, not none.
        assert len(pings) >= 2, lines
        assert json.loads([line for line in lines if line.startswith("data:") and line[5:].strip()][-1][5:])["id"] == 6


async def test_with_redis_another_replica_resumes_a_stream_while_the_first_runs_the_call(
    tmp_path: Path, haproxy: str, redis_available: None
) -> None:
    options = FleetOptions(replicas=2, redis_url=REDIS_URL, keepalive_s=0.3, upstream_tools=(PROGRESSING,))
    async with Fleet(tmp_path, options) as fleet, httpx2.AsyncClient(timeout=30) as http:
        a, b = (f"http://127.0.0.1:{r.port}/mcp" for r in fleet.replicas)
        headers = await _session(http, a)
        await _ready(http, a, headers)
        import redis.asyncio as aredis

        r = aredis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            # Calls answered as one JSON body (tools/list above) wrote no stream: resumption costs them nothing.
            assert [k async for k in r.scan_iter(f"{fleet.namespace}:sse*")] == []
            last_id, seen = await _cut_after_two_progress(http, a, headers)
            assert len(seen) == 2
            assert len([k async for k in r.scan_iter(f"{fleet.namespace}:sse*")]) == 3  # the stream, info, live
        finally:
            await r.aclose()
        await anyio.sleep(0.5)
        answer, progress = await _resume(http, b, headers, last_id)  # b never saw the session nor the call
        assert answer["id"] == 5 and answer["result"]["structuredContent"]["tool"] == "prog"
        assert not answer["result"].get("isError")
        assert progress >= 2
        assert [await _resumed(http, r.port) for r in fleet.replicas] == [0, 1]


async def test_with_redis_a_call_whose_replica_died_is_answered_outcome_unknown_naming_server_and_tool(
    tmp_path: Path, haproxy: str, redis_available: None
) -> None:
    """The replica running the call is killed: another one answers the resumed stream OUTCOME_UNKNOWN, naming the
    server and the tool apart, as the gate's own answers do (it named `shop__prog` as the tool, and no server)."""
    options = FleetOptions(replicas=2, redis_url=REDIS_URL, keepalive_s=0.3, upstream_tools=("prog:latency=30,progress=0.4",))
    async with Fleet(tmp_path, options) as fleet, httpx2.AsyncClient(timeout=30) as http:
        a, b = (f"http://127.0.0.1:{r.port}/mcp" for r in fleet.replicas)
        headers = await _session(http, a)
        await _ready(http, a, headers)
        last_id, _ = await _cut_after_two_progress(http, a, headers)
        await fleet.replicas[0].stop(signal.SIGKILL)
        with anyio.fail_after(20):
            answer, _ = await _resume(http, b, headers, last_id)
        envelope = answer["result"]["structuredContent"]
        assert answer["id"] == 5 and answer["result"]["isError"] is True
        assert (envelope["code"], envelope["reason"], envelope["server"], envelope["tool"]) == (
            "OUTCOME_UNKNOWN",
            "replica_lost",
            "shop",
            "prog",
        )


async def test_behind_haproxy_an_idle_cut_stream_is_resumed_by_the_sdk_client(
    tmp_path: Path, haproxy: str, redis_available: None
) -> None:
    """Keep-alive off: HAProxy's idle timeout cuts the silent stream; the SDK's client reconnects with
    Last-Event-ID through the balancer (round-robin over three replicas) and gets the rest and the result."""
    options = FleetOptions(
        replicas=3,
        redis_url=REDIS_URL,
        keepalive_s=0,
        # Silences: 1 s until the commit, 1.4 s to the first progress (both under the idle timeout), then
        # 2.4 s (over it: cut at 4.4 s, resumed at 5.4 s, after the second progress at 4.8 s).
        idle_timeout_s=2.0,
        upstream_tools=("quiet:latency=5.6,progress=2.4,readonly",),
    )
    async with Fleet(tmp_path, options) as fleet, httpx2.AsyncClient(timeout=30) as http:
        await _ready(http, fleet.url, await _session(http, fleet.url))
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        async with Client(streamable_http_client(fleet.url, http_client=http), mode="legacy") as client:
            with anyio.fail_after(30):
                result = await client.call_tool("shop__quiet", {}, progress_callback=on_progress)
        assert not result.is_error, result
        assert (result.structured_content or {}).get("tool") == "quiet"
        # At 2.4 s (before the cut) and at 4.8 s (while the stream was cut): both arrived.
        assert len(seen) == 2, seen
        # HAProxy's own word that it cut the call's stream: its log line ends the POST with "sD" (server-side
        # timeout during the data phase).
        lines = (tmp_path / "haproxy.log").read_text().splitlines()
        assert any('"POST /mcp' in line and " sD" in line for line in lines), "\n".join(lines)
        # Which replica resumed it is round-robin's choice; one of them did.
        assert sum([await _resumed(http, r.port) for r in fleet.replicas]) >= 1
