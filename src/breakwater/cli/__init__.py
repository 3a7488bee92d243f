"""The `breakwater` command line.

Each sub-command lives in the module of its concept; this file only routes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _status(argv: list[str]) -> int:
    from breakwater.cli._status import status_main

    return status_main(argv)


def _config(argv: list[str]) -> int:
    from breakwater.cli._config import config_main

    return config_main(argv)


def _serve(argv: list[str]) -> int:
    from breakwater.cli._serve import serve_main

    return serve_main(argv)


def _tools(argv: list[str]) -> int:
    from breakwater.cli._tools import tools_main

    return tools_main(argv)


def _stats(argv: list[str]) -> int:
    from breakwater.cli._stats import stats_main

    return stats_main(argv)


def _demo(argv: list[str]) -> int:
    from breakwater.cli._demo import demo_main

    return demo_main(argv)


def _testserver(argv: list[str]) -> int:
    from breakwater.testing.server import main

    return main(argv)


def _lab(argv: list[str]) -> int:
    from breakwater.lab.cli import main

    return main(argv)


_COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "serve": ("serve every server's tools as one MCP server (stdio or --http)", _serve),
    "tools": ("list or search every server's tools", _tools),
    "status": ("connect to every server and report each one's state", _status),
    "stats": ("per-tool calls, latency percentiles and timeouts from the call journal", _stats),
    "config": ("check the config, list every knob", _config),
    "demo": ("the whole story on built-in local servers, in under a minute", _demo),
    "testserver": ("run the misbehaving MCP test server", _testserver),
    "lab": ("the fleet lab: a deterministic simulator of an MCP server fleet", _lab),
}


def _usage() -> str:
    lines = ["usage: breakwater COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12} {doc}" for name, (doc, _) in _COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    command = _COMMANDS.get(args[0])
    if command is None:
        print(f"breakwater: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return command[1](args[1:])


if __name__ == "__main__":
    sys.exit(main())
