"""The misbehaving MCP test server; moved to `breakwater.testing.server`, kept here so old imports work.

`python -m breakwater.testserver ...` runs it as `breakwater testserver ...` does (it used to import and
exit 0 in silence, which a config pointing at it read as a server that quit).
"""

import sys

from breakwater.testing.server import *  # noqa: F403
from breakwater.testing.server import __all__ as __all__
from breakwater.testing.server import main as _main

if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
