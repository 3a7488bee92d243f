"""The fleet lab: a deterministic simulator of an MCP server fleet (see docs/lab.md)."""

from __future__ import annotations

from breakwater.lab.config import LabConfig
from breakwater.lab.engine import run
from breakwater.lab.metrics import LabResult
from breakwater.lab.traffic import generate_traffic


def simulate(config: LabConfig) -> LabResult:
    """Run ten minutes of the seed's traffic through the fleet `config` describes."""
    return run(config, generate_traffic(config.seed, config.hot_client))
