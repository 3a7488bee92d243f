"""breakwater: the isolation layer between an AI agent and its MCP tool servers."""

from breakwater._clock import Clock, DeadlineScope, FakeClock, SystemClock
from breakwater.errors import BreakwaterError, ConfigError

__all__ = ["BreakwaterError", "Clock", "ConfigError", "DeadlineScope", "FakeClock", "SystemClock"]
