"""Configuration: which servers to connect to, and the policy for each.

Two file shapes are read:

* an agent's own file, unchanged, with default policy: `mcpServers` JSON as Claude Code
  (`.mcp.json`, `~/.claude.json`), Claude Desktop, Cursor, Gemini CLI and VS Code (`"servers"`) write
  it, OpenCode's and Zed's servers of other shapes (`_shapes.py`) (`_files.py`, each entry by
  `_entry.py` in every client's dialect, `_dialect.py`), or Codex's `config.toml` (`_codex.py`);
* a `breakwater.toml`, which may point at such a file (`servers_file`), define servers inline
  (`[servers.NAME]`), and set policy: `[connect]`, `[call]`, `[breaker]` and `[retry]` for every
  server, `[servers.NAME.connect]` (`.call`, `.breaker`, `.retry`) for one, and
  `[servers.NAME.tools.TOOL]` for one tool (any `[call]` knob but `max_in_flight` and `max_result_bytes`, plus
  `max_attempts`).

Without `--config`, breakwater looks for `breakwater.toml`, then `.mcp.json`, in the current
directory. Every error names the file, the key and the fix. An HTTP entry's `oauth` object (Claude
Code's keys, and breakwater's for client credentials) becomes `ServerSpec.oauth` (`_oauth.py`).

The model (`Config`, `ServerSpec`, `ToolSettings`, `ToolFilter`) is in `_model.py`, the file readers in
`_files.py` and `_codex.py`, the policies in `_policies.py` and the knob machinery in `_knobs.py`. May import the
core leaves only.
"""

from __future__ import annotations

from breakwater.config._files import DEFAULT_CONFIG_NAMES as DEFAULT_CONFIG_NAMES  # importable as before
from breakwater.config._files import find_config, load_config
from breakwater.config._model import Config, OAuthSettings, ServerSpec, ToolFilter, ToolSettings, all_knobs
from breakwater.config._model import Transport as Transport  # importable as before
from breakwater.config._policies import (
    BreakerPolicy,
    CallPolicy,
    ConnectPolicy,
    GatewayPolicy,
    JournalPolicy,
    RetryPolicy,
    StatePolicy,
    TelemetryPolicy,
)

__all__ = [
    "BreakerPolicy",
    "CallPolicy",
    "Config",
    "ConnectPolicy",
    "GatewayPolicy",
    "JournalPolicy",
    "OAuthSettings",
    "RetryPolicy",
    "ServerSpec",
    "StatePolicy",
    "TelemetryPolicy",
    "ToolFilter",
    "ToolSettings",
    "all_knobs",
    "find_config",
    "load_config",
]
