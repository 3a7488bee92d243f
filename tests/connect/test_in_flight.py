"""`InFlightClient.drained`: what a connection whose sign-in ended waits for before it closes, over a real socket.

A real uvicorn server holds a `subscriptions/listen` POST open (as a 2026-07-28 server does for the connection's
life) and a GET stream, and answers a `tools/call` POST after a delay, streamed as SSE. `drained` must return once the
call's answer has been read and closed, not before (the call would be cut: OUTCOME_UNKNOWN) and not after the streams
that never end (the close would wait out its whole bound).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from breakwater.connect._in_flight import InFlightClient
from breakwater.gateway._listen import tcp_listener
from helpers import eventually

pytestmark = pytest.mark.anyio

#: How long the server takes to answer the call.
ANSWER_S = 0.5


async def _mcp(request: Request) -> Response:
    body: dict[str, Any] = {} if request.method == "GET" else json.loads(await request.body())
    if request.method == "POST" and "id" not in body:
        return Response(status_code=202)  # a notification: accepted, nothing to answer

    async def events() -> AsyncIterator[bytes]:
        if request.method == "GET" or body.get("method") == "subscriptions/listen":
            await anyio.sleep_forever()  # a stream for the connection's life
        await anyio.sleep(ANSWER_S)
        answer = {"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}}
        yield f"event: message\ndata: {json.dumps(answer)}\n\n".encode()

    return StreamingResponse(events(), media_type="text/event-stream")


@asynccontextmanager
async def _server() -> AsyncIterator[str]:
    sock = tcp_listener("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/mcp", _mcp, methods=["GET", "POST"])]), log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await eventually(lambda: server.started, 10)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        finally:
            server.should_exit = True
            server.force_exit = True


async def test_drained_waits_for_a_call_answer_and_not_for_the_streams_that_never_end() -> None:
    async with _server() as url, InFlightClient(timeout=30) as http, anyio.create_task_group() as tg:
        answered: list[float] = []

        async def stream(method: str, message: dict[str, Any] | None) -> None:
            async with http.stream(method, url, json=message) as response:
                async for _ in response.aiter_bytes():
                    if message is not None and message.get("method") == "tools/call":
                        answered.append(time.monotonic())

        tg.start_soon(stream, "GET", None)
        tg.start_soon(stream, "POST", {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": {}})
        tg.start_soon(stream, "POST", {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t"}})
        tg.start_soon(stream, "POST", {"jsonrpc": "2.0", "method": "notifications/initialized"})  # awaits no answer
        await anyio.sleep(0.1)  # all four sent
        started = time.monotonic()
        with anyio.fail_after(10):
            await http.drained()
        drained_at = time.monotonic()
        assert answered and answered[0] <= drained_at, "drained before the call's answer was read"
        assert drained_at - started < ANSWER_S + 5, drained_at - started  # not held by the listen or GET stream
        tg.cancel_scope.cancel()


async def test_drained_returns_at_once_with_nothing_in_flight() -> None:
    async with InFlightClient() as http:
        with anyio.fail_after(1):
            await http.drained()
