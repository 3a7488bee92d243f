"""`SessionServers` stands in for a `Breakwater` (a cast) wherever an attached session's gateway reads one.

The cast hides a missing attribute from mypy: the status tool read `bw.gate_status`, which `SessionServers` lacked,
and failed in every session with a stdio server of its own. This holds every attribute the gateway's modules read
through a gateway's `bw` to exist on it (the web page and the metrics read the HTTP gateway's own `Breakwater`).
"""

from __future__ import annotations

import re
from pathlib import Path

from breakwater import Breakwater
from breakwater.config import Config, JournalPolicy
from breakwater.gateway._session import SessionServers

GATEWAY = Path(__file__).resolve().parents[2] / "src" / "breakwater" / "gateway"
#: Modules that serve only `serve --http`'s own gateway, never a session's view.
_HTTP_ONLY = {"_web.py", "_metrics.py", "_session.py"}


def test_every_attribute_a_gateway_reads_of_its_servers_is_on_a_sessions_servers(tmp_path: Path) -> None:
    config = Config(servers=(), journal=JournalPolicy(url="off"))
    servers = SessionServers(config, Breakwater(config, admission_dir=tmp_path), Breakwater(config, admission_dir=tmp_path))
    read: dict[str, set[str]] = {}
    for module in sorted(GATEWAY.glob("*.py")):
        if module.name in _HTTP_ONLY:
            continue
        for name in re.findall(r"\bbw\.([a-z_]+)", module.read_text()):
            read.setdefault(name, set()).add(module.name)
    assert {"gate_call", "gate", "status", "gate_status", "upstream"} <= read.keys(), read  # the scan sees the reads
    missing = {name: sorted(where) for name, where in read.items() if not hasattr(servers, name)}
    assert missing == {}
