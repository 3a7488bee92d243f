"""One Redis channel listened to for as long as the process runs: the breaker store's mirror updates, the session
store's `DELETE`s of other replicas."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import anyio

from breakwater._clock import Clock

__all__ = ["listen"]

#: How long one wait for a message lasts before the next (a lost connection shows up at the latest then).
_POLL_S = 5.0


async def listen(
    client: Any,
    channel: str,
    deliver: Callable[[Any], Awaitable[None]],
    *,
    clock: Clock,
    pause_s: float,
    lost: Callable[[Exception], None],
    subscribed: Callable[[bool], None] = lambda _: None,
) -> NoReturn:
    """Hand the data of each message on `channel` to `deliver`, until cancelled.

    A subscription that fails is told to `lost` and made again after `pause_s`; what was published meanwhile is
    missed (each caller has a slower way to catch up). `subscribed` hears when a subscription holds and ends.
    """
    while True:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            subscribed(True)
            while True:
                message = await pubsub.get_message(timeout=_POLL_S)
                if message is not None:
                    await deliver(message.get("data"))
        except Exception as exc:
            subscribed(False)
            lost(exc)
        finally:
            subscribed(False)
            with anyio.CancelScope(shield=True), clock.deadline_scope(clock.monotonic() + 1.0), contextlib.suppress(Exception):
                await pubsub.aclose()
        await clock.sleep(pause_s)
