"""A 2025-11-25 session roams between two real `serve --http` replicas sharing Redis: its log level and its resource
subscriptions go with it, seen from raw HTTP (a balancer would send each request to either replica)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import redis

from helpers import REDIS_URL, running

pytestmark = pytest.mark.anyio

BREAKWATER = [sys.executable, "-m", "breakwater"]
UPSTREAM = Path(__file__).parents[1] / "conformance" / "server.py"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
WATCHED = "test://watched-resource"


def stored(namespace: str, session_id: str) -> dict[str, Any]:
    """The session's record in Redis."""
    raw = redis.Redis.from_url(REDIS_URL).get(f"{namespace}:session:{session_id}")
    assert isinstance(raw, bytes), raw
    record: dict[str, Any] = json.loads(raw)
    return record


def messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE (or JSON) body."""
    if text.lstrip().startswith("{"):
        return [json.loads(text)]
    # A resumable stream opens with a priming event (an id, empty data): no message in it.
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]


class Session:
    """One 2025-11-25 session over raw HTTP; each request names the replica it goes to."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http
        self.id = ""
        self.next_id = 0

    def headers(self) -> dict[str, str]:
        return {**ACCEPT, "mcp-protocol-version": "2025-11-25", "mcp-session-id": self.id}

    async def open(self, base: str) -> None:
        params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        opened = await self.http.post(
            f"{base}/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}, headers=ACCEPT
        )
        self.id = opened.headers["mcp-session-id"]
        await self.http.post(
            f"{base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers()
        )

    async def request(self, base: str, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        response = await self.http.post(f"{base}/mcp", json=body, headers=self.headers())
        assert response.status_code == 200, response.text
        return messages(response.text)


async def test_a_session_keeps_its_log_level_and_resource_subscriptions_on_another_replica(
    tmp_path: Path, redis_available: None
) -> None:
    """Subscribed and set to `warning` on replica A, the session is then served by replica B: B relays no info-level
    log message to it (a session without a level gets them), and an update of the subscribed resource reaches the
    session's GET stream on B — B made the subscription again on its own upstream connection."""
    namespace = f"bw-roam-{uuid.uuid4().hex[:8]}"
    env = dict(
        os.environ,
        BREAKWATER_STATE_URL=REDIS_URL,
        BREAKWATER_STATE_NAMESPACE=namespace,
        BREAKWATER_TOOL_NAME_TEMPLATE="{tool}",
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_JOURNAL="off",
    )
    upstream_cmd = [sys.executable, str(UPSTREAM), "--port", "0", "--port-file", str(tmp_path / "up.port")]
    try:
        async with running(upstream_cmd, tmp_path / "up.port", dict(os.environ)) as upstream:
            config = tmp_path / "mcp.json"
            config.write_text(json.dumps({"mcpServers": {"conf": {"type": "http", "url": f"{upstream}/mcp"}}}))

            def replica(name: str) -> Any:
                port_file = tmp_path / f"{name}.port"
                cmd = [*BREAKWATER, "serve", "--config", str(config), "--http", "127.0.0.1:0", "--port-file", str(port_file)]
                return running(cmd, port_file, dict(env, BREAKWATER_CATALOG_DIR=str(tmp_path / name)))

            async with replica("a") as a, replica("b") as b, httpx2.AsyncClient(timeout=30) as http:
                for base in (a, b):
                    with anyio.fail_after(60):
                        while (await http.get(f"{base}/readyz")).status_code != 200:
                            await anyio.sleep(0.1)
                session = Session(http)
                await session.open(a)
                await session.request(a, "logging/setLevel", {"level": "warning"})
                await session.request(a, "resources/subscribe", {"uri": WATCHED})
                record = stored(namespace, session.id)
                assert record["level"] == "warning" and record["subscriptions"] == [["conf", WATCHED]]

                # B has never seen the session: its first request adopts it, with the level A recorded.
                logged = await session.request(b, "tools/call", {"name": "test_tool_with_logging", "arguments": {}})
                assert [m.get("method") for m in logged] == [None]
                assert not logged[-1]["result"].get("isError")
                control = Session(http)
                await control.open(b)
                heard = await control.request(b, "tools/call", {"name": "test_tool_with_logging", "arguments": {}})
                assert [m.get("method") for m in heard].count("notifications/message") == 3

                updates: list[str] = []
                async with anyio.create_task_group() as tg:

                    async def listen() -> None:
                        async with http.stream("GET", f"{b}/mcp", headers=session.headers(), timeout=None) as stream:
                            async for line in stream.aiter_lines():
                                if line.startswith("data:") and line[5:].strip():
                                    message = json.loads(line[5:])
                                    if message.get("method") == "notifications/resources/updated":
                                        updates.append(message["params"]["uri"])

                    tg.start_soon(listen)
                    with anyio.fail_after(20):
                        # Until B's own upstream subscription is up, an update has nobody to reach on B.
                        while WATCHED not in updates:
                            await session.request(
                                b, "tools/call", {"name": "test_watch_resource_update", "arguments": {"uri": WATCHED}}
                            )
                            await anyio.sleep(0.2)
                    tg.cancel_scope.cancel()
                assert set(updates) == {WATCHED}
                await session.request(b, "resources/unsubscribe", {"uri": WATCHED})
                record = stored(namespace, session.id)
                assert record["subscriptions"] == []

                # Redis loses the record (a restart, a save that failed while it was away): the replicas that serve the
                # session write it again and serve on. Read as a DELETE, a Redis blip ended every such session for good.
                key = f"{namespace}:session:{session.id}"
                redis.Redis.from_url(REDIS_URL).delete(key)
                await session.request(a, "ping", {})
                assert stored(namespace, session.id)["level"] == "warning"
                # A DELETE on one replica still ends the session on the others.
                assert (await http.delete(f"{b}/mcp", headers=session.headers())).status_code == 200
                gone = await http.post(f"{a}/mcp", json={"jsonrpc": "2.0", "id": 99, "method": "ping"}, headers=session.headers())
                assert gone.status_code == 404, gone.text
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{namespace}:*"))
        if keys:
            client.delete(*keys)
