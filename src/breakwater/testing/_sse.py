"""Reading a streamable HTTP call's SSE answer as the SDK's client does: the events, the answer to one request, and a
resume with Last-Event-ID after a cut (the fleet's synthetic clients, `_fleet`, and the fleet tests)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2

__all__ = ["RESUME_ATTEMPTS", "RESUME_DELAY_S", "read_stream", "resume_stream", "sse_events"]

#: The SDK client's reconnect attempts and its delay when the server sends no `retry:` (1 s).
RESUME_ATTEMPTS = 2
RESUME_DELAY_S = 1.0


async def sse_events(response: httpx2.Response) -> AsyncIterator[dict[str, str]]:
    """The events of an SSE body as they arrive: {"id", "event", "data", "retry"} fields (comments skipped)."""
    event: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[name] = event[name] + "\n" + value if name == "data" and name in event else value


async def read_stream(response: httpx2.Response, request_id: int) -> tuple[dict[str, Any] | None, str | None]:
    """(the answer to `request_id`, or None if the stream ended or was cut first; the last event id seen)."""
    last_event_id: str | None = None
    with contextlib.suppress(httpx2.HTTPError):
        async for event in sse_events(response):
            last_event_id = event.get("id") or last_event_id
            with contextlib.suppress(ValueError):
                message = json.loads(event.get("data") or "null")
                if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                    return message, last_event_id
    return None, last_event_id


async def resume_stream(
    http: httpx2.AsyncClient, url: str, headers: dict[str, str], last_event_id: str | None, request_id: int
) -> dict[str, Any] | None:
    """GET with Last-Event-ID until the answer comes (a resumed stream may be cut again), as the SDK's client does."""
    attempts = 0
    while last_event_id is not None and attempts < RESUME_ATTEMPTS:
        await anyio.sleep(RESUME_DELAY_S)
        try:
            async with http.stream("GET", url, headers={**headers, "last-event-id": last_event_id}) as response:
                if response.status_code != 200:
                    attempts += 1
                    continue
                answer, seen = await read_stream(response, request_id)
        except httpx2.HTTPError:
            attempts += 1
            continue
        if answer is not None:
            return answer
        # A reconnect that got through resets the count (the SDK's client does the same).
        attempts = 0 if seen not in (None, last_event_id) else attempts + 1
        last_event_id = seen or last_event_id
    return None
