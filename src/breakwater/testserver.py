"""The misbehaving MCP test server; moved to `breakwater.testing.server`, kept here so old imports work."""

from breakwater.testing.server import *  # noqa: F403
from breakwater.testing.server import __all__ as __all__
