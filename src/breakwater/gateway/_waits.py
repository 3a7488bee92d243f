"""Waiting for the first of several things to happen (a server's change, the catalog's, the session's end)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

__all__ = ["first_of"]


async def first_of(*waits: Callable[[], Awaitable[None]]) -> None:
    """Return as soon as the first of `waits` returns; the others are cancelled."""
    async with anyio.create_task_group() as tg:

        async def wait(changed: Callable[[], Awaitable[None]]) -> None:
            await changed()
            tg.cancel_scope.cancel()

        for changed in waits:
            tg.start_soon(wait, changed)
