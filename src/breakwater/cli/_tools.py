"""`breakwater tools [QUERY]`: the search tool's answer on the command line, and `--accept` for changed tools."""

from __future__ import annotations

import argparse
import json

import anyio

from breakwater.catalog._catalog import Entry
from breakwater.cli._common import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    Parser,
    add_config_flag,
    did_you_mean,
    fail,
    load_or_exit,
    seconds,
)
from breakwater.cli._text import lines
from breakwater.config import Config

__all__ = ["DEFAULT_TOOLS_WAIT_S", "tools_main"]

# A person asking "what tools do I have?" gets an answer in a few seconds: servers still connecting
# then are named in the answer (with their last-known tools, when there are any), not waited for.
DEFAULT_TOOLS_WAIT_S = 3.0
# Approving definitions needs the live ones: `--accept` waits as long as `status` does.
DEFAULT_ACCEPT_WAIT_S = 30.0


async def _tools(config: Config, query: str, as_json: bool, wait: float, accept: bool) -> int:
    from breakwater.gateway._open import open_gateway

    async with open_gateway(config, watch=False, as_serve=True) as gateway:
        await gateway.bw.wait_ready(timeout=wait)
        if accept:
            names = query.split()
            if unknown := _unknown(gateway.live_entries(), names):
                return fail(unknown, EXIT_CONFIG)
            accepted = gateway.accept(names)
            if (problem := gateway.catalog.problem) is not None:
                # Approved in this process only (or pinned afresh in it): the next `serve` cannot know the approval.
                fix = "set [gateway] catalog_dir (BREAKWATER_CATALOG_DIR) to a writable directory and accept again"
                which = ", ".join(accepted or names) or "the changed tools"
                return fail(f"not accepted: {which}: {problem} (fix: {fix})", EXIT_FAILED)
            print("accepted: " + (", ".join(accepted) if accepted else "nothing had changed"))
            return EXIT_OK
        answer = await gateway.search(query, wait_s=0)
    if as_json:
        print(json.dumps(answer.to_json(), indent=2))
    else:
        print(lines(answer.text()))  # the servers' own names and descriptions
    return EXIT_OK


def _unknown(live: list[Entry], names: list[str]) -> str | None:
    """What is wrong with the first name `--accept` cannot approve (no ready server lists it), else None.

    Such a name said "nothing had changed", exit 0, while a changed tool waited for approval under its real name.
    """
    listed = {e.name: e for e in live}
    for name in names:
        if name in listed:
            continue
        own = [e.name for e in live if e.tool.name == name]  # the server's own name for a tool the gateway renames
        hint = f"; the gateway names it {own[0]}" if own else did_you_mean(name, listed)
        return f"--accept {name}: no ready server lists a tool of that name{hint}"
    return None


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater tools",
        description="List or search every server's tools. The answer names the servers that could not be searched "
        "(still connecting, or failed, with the reason); their last-known tools are listed and marked.",
    )
    add_config_flag(parser)
    parser.add_argument("query", nargs="*", help="words to look for (none: list every tool)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--wait",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"wait up to this long for servers to become ready (default {DEFAULT_TOOLS_WAIT_S:g}, with --accept "
        f"{DEFAULT_ACCEPT_WAIT_S:g}; 0 answers at once from what is known); servers still not ready are named in the answer",
    )
    parser.add_argument(
        "--accept",
        action="store_true",
        help="approve the current definitions of the named tools (server__tool), or of every changed tool",
    )
    return parser


def tools_main(argv: list[str]) -> int:
    """`breakwater tools [QUERY]`: the search tool's answer on the command line."""
    parser = _parser()
    args = parser.parse_args(argv)
    wait = args.wait if args.wait is not None else DEFAULT_ACCEPT_WAIT_S if args.accept else DEFAULT_TOOLS_WAIT_S
    config = load_or_exit(args.config)
    code: int = anyio.run(_tools, config, " ".join(args.query), args.json, wait, args.accept)
    return code
