"""breakwater: the isolation layer between an AI agent and its MCP tool servers.

The public API is what this module exports; everything in a module whose name starts with an
underscore is private.
"""

from breakwater._breakwater import Breakwater
from breakwater._clock import Clock, DeadlineScope, SystemClock
from breakwater.config import Config, ConnectPolicy, ServerSpec, load_config
from breakwater.errors import BreakwaterError, ConfigError
from breakwater.status import ErrorInfo, Reason, ServerState, ServerStatus, StatusReport
from breakwater.tasks._store import PendingTask, TaskStore
from breakwater.testing import FakeClock  # public home: breakwater.testing; kept here for existing imports

__all__ = [
    "Breakwater",
    "BreakwaterError",
    "Clock",
    "Config",
    "ConfigError",
    "ConnectPolicy",
    "DeadlineScope",
    "ErrorInfo",
    "FakeClock",
    "PendingTask",
    "Reason",
    "ServerSpec",
    "ServerState",
    "ServerStatus",
    "StatusReport",
    "SystemClock",
    "TaskStore",
    "load_config",
]
