"""What a finished call leaves in `serve --http`'s memory: nothing of itself, however long its session lives.

In-process (the gateway's own objects are looked at, after a garbage collection), over real HTTP (uvicorn on a
127.0.0.1 port, as `serve --http` runs it) and a real stdio upstream. Each 2025-11-25 session pinned the request of
its first list or call (its body three times over: uvicorn's, Starlette's, the parsed params) until the session
ended, 30 minutes idle by default: ten sessions that each sent a 3 MB call held 300 MB.
"""

from __future__ import annotations

import gc
import socket
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn

from breakwater import ServerSpec
from breakwater.catalog._catalog import Catalog
from breakwater.config import Config, ConnectPolicy, GatewayPolicy, JournalPolicy
from breakwater.gateway._http import http_app
from breakwater.gateway._open import open_gateway
from breakwater.testing.server import launch_command

pytestmark = pytest.mark.anyio

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
BIG = 1024 * 1024


def _held(marker: str) -> list[str]:
    """What the process holds that carries `marker`: every str and bytes reachable from a tracked object, one level
    into untracked containers (a dict of strings only is not tracked)."""
    gc.collect()
    probe, probe_bytes = marker[:64], marker[:64].encode()
    held: dict[int, str] = {}
    for root in gc.get_objects():
        stack = list(gc.get_referents(root))
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if len(item) >= BIG and item is not marker and probe in item:
                    held[id(item)] = f"str of {len(item)} in {type(root).__qualname__}"
            elif isinstance(item, (bytes, bytearray)):
                if len(item) >= BIG and probe_bytes in item:
                    held[id(item)] = f"bytes of {len(item)} in {type(root).__qualname__}"
            elif isinstance(item, (dict, list, tuple)) and not gc.is_tracked(item):
                stack.extend(gc.get_referents(item))
    return sorted(held.values())


async def _call(http: httpx2.AsyncClient, url: str, arguments: dict[str, Any], revision: str) -> str:
    """A 2025-11-25 session (left open) that calls `t__echo` once, or a 2026-07-28 call; the answer's type and text."""
    params = {"name": "t__echo", "arguments": arguments}
    if revision == "2026-07-28":
        meta = {
            "io.modelcontextprotocol/protocolVersion": revision,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        headers = {**ACCEPT, "mcp-protocol-version": revision, "mcp-method": "tools/call", "mcp-name": "t__echo"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params, "_meta": meta}}
        answer = await http.post(url, headers=headers, json=body)
        assert answer.status_code == 200, answer.text
        return f"{answer.headers['content-type']} {answer.text}"
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    opened = await http.post(url, headers=ACCEPT, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
    headers = {**ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    answer = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    assert answer.status_code == 200, answer.text
    return f"{answer.headers['content-type']} {answer.text}"


@pytest.mark.parametrize(
    ("revision", "json_response", "latency"),
    [
        ("2025-11-25", False, 0.0),  # answered as one JSON body
        ("2025-11-25", False, 0.5),  # outlives the commit window: an SSE stream, through the SDK's router
        ("2025-11-25", True, 0.0),
        ("2026-07-28", False, 0.0),
    ],
)
async def test_a_finished_call_of_a_live_session_leaves_nothing_of_itself(
    tmp_path: Path, revision: str, json_response: bool, latency: float
) -> None:
    connect = ConnectPolicy(startup_jitter_s=0)
    spec = ServerSpec(
        name="t",
        transport="stdio",
        command=launch_command()[0],
        args=(*launch_command()[1:], "--tool", f"echo:readonly,latency={latency}"),
        connect=connect,
    )
    # A commit window shorter than the call; no resumption log (it keeps a streamed answer for its TTL, by design).
    policy = GatewayPolicy(sse_keepalive_s=0.2, resume_events=0)
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"), gateway=policy)
    catalog = Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog")
    marker = uuid.uuid4().hex * (BIG // 32)
    async with open_gateway(config, catalog=catalog) as gateway:
        await gateway.bw.wait_ready(timeout=30)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        server = uvicorn.Server(
            uvicorn.Config(
                http_app(gateway, host="127.0.0.1", token=None, json_response=json_response), log_level="warning", lifespan="on"
            )
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
            async with httpx2.AsyncClient(timeout=30) as http:
                with anyio.fail_after(30):
                    while not server.started:
                        await anyio.sleep(0.01)
                for _ in range(3):  # three sessions, each left open with its call answered
                    answered = await _call(http, url, {"payload": marker}, revision)
                    assert marker in answered
                    assert answered.startswith("text/event-stream" if latency else "application/json"), answered[:80]
                    del answered
            held = _held(marker)
            server.should_exit = True
    assert held == []
