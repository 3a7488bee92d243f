import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run `@pytest.mark.anyio` tests on asyncio only: uvicorn and the SDK's HTTP server need it."""
    return "asyncio"
