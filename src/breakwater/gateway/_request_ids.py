"""Request ids in flight on a 2025-era connection: unique within it, and exact (`50` is not `"50"`).

The lanes that serve `tools/call` beside the SDK's dispatcher share its rules: a request whose id is in flight is
refused, not run (`unique_ids`); a lane keys its calls by their exact id (`in_flight_key`), so `"50"` runs beside
`50`, and a client's `notifications/cancelled` cancels the lane's call whose id is exactly the one it names (the
stdio lane's own table, `_fast_call`; the dispatcher's table for `--json-response`, `cancel_exactly`). The SDK's
dispatcher keys the requests it runs itself by `coerce_request_id` (`"7"` is `7`): those keep its rule. (The default
mode's lane, `_lazy_call`, still enters its calls under the SDK's key, so there `"50"` is refused while `50` runs,
and a cancel naming `"8"` cancels `8`.) May import the SDK only.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher, cancelled_request_id_from_params
from mcp_types import INVALID_REQUEST, ErrorData

__all__ = ["Lane", "cancel_exactly", "duplicate_id_message", "in_flight_key", "unique_ids"]

logger = logging.getLogger("breakwater.gateway")


class Lane(Protocol):
    """What `unique_ids` asks of a connection's lane (`_fast_call.FastLane`)."""

    def holds(self, request_id: Any) -> bool:
        """Whether a request with this id is in flight on the connection."""


def unique_ids(dispatcher: JSONRPCDispatcher[Any], lane: Lane) -> None:
    """Refuse a request whose id a request in flight on the connection already uses; the SDK ran both.

    Why. A request id is unique within a session (JSON-RPC, MCP). SDK 2.3's dispatcher runs a second
    request with an id in flight beside the first and answers both under the one id: a client that
    resends a `tools/call` under its id (on a timeout of its own) had the tool run twice, a charge
    made twice, and the answers of two runs under one id. The second is answered INVALID_REQUEST
    instead, and not run; the first runs on and is answered as before. Every path a request takes
    into the connection reaches this check: the lanes leave a request whose id is in flight to the
    SDK's dispatcher (`FastLane.holds`, `_fast_http.plain_call`).
    """
    dispatch = dispatcher._dispatch_request

    async def dispatch_unique(req: Any, metadata: Any, on_request: Any, sender_ctx: Any) -> None:
        if not lane.holds(req.id):
            return await dispatch(req, metadata, on_request, sender_ctx)
        logger.warning("a request reused the id %r of a request in flight; refused, not run", req.id)
        error = ErrorData(code=INVALID_REQUEST, message=duplicate_id_message(req.id))
        dispatcher._spawn(dispatcher._write_error, req.id, error, sender_ctx=sender_ctx)
        return None

    dispatcher._dispatch_request = dispatch_unique  # type: ignore[method-assign]
    cancel_exactly(dispatcher)


def cancel_exactly(dispatcher: JSONRPCDispatcher[Any]) -> None:
    """A client's `notifications/cancelled` cancels a lane's call entered in the dispatcher's table (`in_flight_key`)
    whose id is exactly the one it names, as the dispatcher cancels its own; then the dispatcher reads it as ever."""
    dispatch = dispatcher._dispatch_notification

    def dispatch_notification(msg: Any, metadata: Any, on_notify: Any, sender_ctx: Any) -> None:
        if msg.method == "notifications/cancelled":
            request_id = cancelled_request_id_from_params(msg.params)
            entry = dispatcher._in_flight.get(in_flight_key(request_id)) if request_id is not None else None  # type: ignore[call-overload]
            if entry is not None:
                entry.dctx.cancel_requested.set()
                if dispatcher._peer_cancel_mode == "interrupt":
                    entry.scope.cancel()
        dispatch(msg, metadata, on_notify, sender_ctx)

    dispatcher._dispatch_notification = dispatch_notification  # type: ignore[method-assign]


def duplicate_id_message(request_id: Any) -> str:
    """What a request is answered whose id a request in flight already uses (`unique_ids`)."""
    return (
        f"Invalid request: the id {json.dumps(request_id)} is already used by a request in flight in this session, "
        "so this request was not run; give every request its own id"
    )


def in_flight_key(request_id: Any) -> tuple[str, Any]:
    """The key of a lane's request in flight: its id's type and value, for JSON-RPC ids of different types are
    different ids (`50` and `"50"`: a cancel naming `"8"` does not cancel the call with id `8`).

    The SDK's dispatcher keys its own table by `coerce_request_id` (`"7"` is `7`, as the TypeScript SDK does); a
    lane's call in that table (`_fast_http`) is entered under this key, a tuple no coerced id equals, and the client's
    cancel finds it here (`cancel_exactly`)."""
    return type(request_id).__name__, request_id
