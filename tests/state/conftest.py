"""The state tests' own Redis: a redis-server on a free port, killable and stoppable, never the machine's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers import OwnRedis


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    """A started `OwnRedis`, killed after the test."""
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()
