"""Helpers the whole suite shares: what the model was told, waiting for a condition, services CI must have."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import pytest

__all__ = ["code_of", "eventually", "require"]


def code_of(result: Any) -> str | None:
    """The error code of a `CallToolResult` (its envelope's `code`), or None when the call succeeded."""
    sc = result.structured_content
    return sc.get("code") if isinstance(sc, dict) and result.is_error else None


async def eventually(check: Callable[[], bool], timeout: float = 5.0, *, interval: float = 0.02) -> None:
    """Return as soon as `check()` holds; fail the test if it has not within `timeout` seconds."""
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(interval)


def require(reason: str, *, ci_fix: str = "") -> NoReturn:
    """A service or tool the test needs is missing: skip locally, fail under CI=true, where it is part of the contract."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} — CI=true requires it{f' ({ci_fix})' if ci_fix else ''}")
    pytest.skip(reason)
