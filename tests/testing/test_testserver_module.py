"""`python -m breakwater.testserver` is the test server, as `breakwater testserver` is (not a silent exit 0)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_old_module_path_runs_the_server() -> None:
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    done = subprocess.run(
        [sys.executable, "-m", "breakwater.testserver", "--tool", "echo:latency=0"],
        input=json.dumps(hello) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "breakwater-testserver"
