"""`breakwater call SERVER TOOL [JSON_ARGS] [--arg K=V ...]`: one call through the gate, for scripts and pre-flight checks.

The call is exactly the one an agent makes through the gateway (timeouts, retries, breakers, the
journal), made once the server is up: it waits, up to `--wait`, while the server is still
`pending` or `connecting`; a server that is `retrying` after a failure or `failed` is answered at
once with its reason, as the gateway would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp.types as types

from breakwater._breakwater import Breakwater
from breakwater._wire import MAX_JSON_DEPTH, has_non_finite, json_depth, json_kind, non_finite_path, strict_json
from breakwater.cli._call_asks import OneShotAnswers, asked_text
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
from breakwater.config._checks import route_by_shape
from breakwater.errors import ErrorCode
from breakwater.gate._envelope import error_from_result, error_text
from breakwater.status import ServerState

__all__ = ["DEFAULT_CALL_WAIT_S", "call_main", "parse_arguments"]

DEFAULT_CALL_WAIT_S = 30.0
# Still on its way: worth waiting for. Retrying and failed servers carry a reason to show at once.
_ON_ITS_WAY = (ServerState.PENDING, ServerState.CONNECTING)


def _value(text: str) -> Any:
    """A `--arg` value: JSON when it parses (numbers, true, null, objects), else the text itself (`NaN` too: not JSON)."""
    try:
        return strict_json(text)
    except ValueError:
        return text


def parse_arguments(json_args: str | None, pairs: list[str]) -> dict[str, Any]:
    """The tool arguments from a JSON object (`-` reads stdin) and `K=V` pairs (which win); ValueError says what is wrong."""
    arguments: dict[str, Any] = {}
    if json_args is not None:
        text = sys.stdin.read() if json_args == "-" else json_args
        if json_args == "-" and not text.strip():
            raise ValueError("JSON_ARGS '-' read nothing from stdin; pipe a JSON object in, e.g. echo '{\"q\": \"flaky\"}' |")
        try:
            if json_depth(text) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            parsed = strict_json(text)
        except ValueError as exc:
            raise ValueError(f'JSON_ARGS is not JSON ({exc}); pass an object such as \'{{"q": "flaky"}}\'') from None
        # What the tool would be sent is not what was written: a key given twice (the last one won), `1e999`.
        json.loads(text, object_pairs_hook=_once)
        if has_non_finite(parsed):
            raise ValueError(f"JSON_ARGS: {non_finite_path(parsed)} is a number JSON cannot carry (it overflows to infinity)")
        if not isinstance(parsed, dict):
            raise ValueError(f'JSON_ARGS must be a JSON object, got {json_kind(parsed)}; e.g. \'{{"q": "flaky"}}\'')
        arguments.update(parsed)
    given: set[str] = set()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--arg {pair!r}: expected KEY=VALUE, e.g. --arg q=flaky or --arg limit=5")
        if key in given:
            raise ValueError(f"--arg {key}= is given twice; give each argument once")
        given.add(key)
        arguments[key] = parsed_value = _value(value)  # over JSON_ARGS: the one to change in a call written before
        if has_non_finite(parsed_value):
            raise ValueError(f"--arg {key}={value}: a number JSON cannot carry (it overflows to infinity); quote it as text")
    return arguments


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"JSON_ARGS gives the key {twice!r} twice in one object; give it once")
    return dict(pairs)


def _content_text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        return resource.text if isinstance(resource, types.TextResourceContents) else f"[resource {resource.uri}]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}]"
    return f"[{block.type}: {getattr(block, 'mime_type', '')}]"


def _print_result(result: types.CallToolResult, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2))
    err = error_from_result(result)
    if err is None:
        if not as_json:
            texts = [_content_text(b) for b in result.content]
            # A tool that answers only with structured content is shown as that JSON.
            print(lines("\n".join(texts)) if texts else json.dumps(result.structured_content, indent=2))
        return EXIT_OK
    if not as_json:
        # The tool's own words first (for TOOL_ERROR), then breakwater's one line: what happened, what to do.
        own = [b for b in getattr(err, "content", ()) if not isinstance(b, types.TextContent) or b.text != err.message]
        for block in own:
            print(lines(_content_text(block)), file=sys.stderr)
    # The tool asked what no one-shot command can answer: the message names it and the fix; the advice is the model's
    # ("give the user the address"), and the user is the one reading here. A call that may have run names its operation
    # id in its advice (`OutcomeUnknownError.advice_text`), by which the user checks the outcome.
    text = asked_text(err) if err.code is ErrorCode.CLIENT_CANNOT_ANSWER else error_text(err)
    return fail(lines(f"call failed: {err.code.value}: {text}"), EXIT_FAILED)


async def _wait_for(bw: Breakwater, server: str, wait: float) -> None:
    upstream = bw.upstream(server)
    with bw.clock.deadline_scope(bw.clock.monotonic() + wait):
        while upstream.state in _ON_ITS_WAY:
            await bw.wait_changed()


@contextlib.asynccontextmanager
async def _servers(config: Config, answers: OneShotAnswers) -> AsyncIterator[Breakwater]:
    """The servers, behind the gateway when it judges calls too (`drift = "block"`: a changed tool is refused here as
    through `serve`; `call` ran it)."""
    from breakwater.gateway._open import gateway_catalog
    from breakwater.gateway._relay import Relay
    from breakwater.gateway._roots import gateway_client_hooks, one_client_servers
    from breakwater.gateway._server import Gateway

    # Connected as `serve` connects (sampling, elicitation, roots declared): a server that lists a tool only to such a
    # client had it called UNKNOWN_TOOL here, though `tools` listed it. What the tool then asks, `answers` answers.
    relay = Relay()
    hooks = answers.hooks(gateway_client_hooks(config, relay))
    async with Breakwater(config, client_hooks=hooks, one_client=one_client_servers(config)) as bw:
        if config.gateway.drift == "block":
            # As `open_gateway(as_serve=True)` composes it, but with these answers: the gateway's approval check.
            Gateway(bw, config.gateway, catalog=gateway_catalog(config), relay=relay)
        yield bw


async def _call(config: Config, server: str, tool: str, arguments: dict[str, Any], wait: float, as_json: bool) -> int:
    answers = OneShotAnswers()
    async with _servers(config, answers) as bw:
        await _wait_for(bw, server, wait)
        with answers.calling(server):
            if bw.upstream(server).state is ServerState.READY:
                result = await bw.call_tool(server, tool, arguments)
            else:
                # `--wait` is the whole wait for the server: the gate waits for a connecting one within the call's own
                # timeout too, which `--wait 0` ("calls at once") took 5 s. A spent budget makes that wait none.
                async with bw.budget(deadline=bw.clock.monotonic()):
                    result = await bw.call_tool(server, tool, arguments)
        # Printed before the servers are stopped (a second or two for a stubborn one).
        return _print_result(answers.explain(result), as_json)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater call",
        description="Call one tool through the call gate (timeouts, retries, breakers, the journal) and print its "
        "answer: the result's text, or the error's code and what to do. Waits for the server while it is still "
        "connecting. Arguments: a JSON object, or --arg KEY=VALUE pairs (values parse as JSON when they can, "
        "else they are strings), or both (--arg wins). A tool that asks the client for sampling or the user for a "
        "form or a page fails with CLIENT_CANNOT_ANSWER (a page's address is printed): run such a tool from an agent, "
        "through `breakwater serve`. A server that asks for the client's roots gets the current directory.",
    )
    add_config_flag(parser)
    parser.add_argument("server", help="the server's name in the config")
    parser.add_argument("tool", help="the tool's name on that server (not the gateway's server__tool name)")
    parser.add_argument("json_args", nargs="?", metavar="JSON_ARGS", help="the arguments as one JSON object ('-' reads stdin)")
    parser.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE", help="one argument (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the CallToolResult (with the error envelope) as JSON")
    parser.add_argument(
        "--wait",
        type=seconds,
        default=DEFAULT_CALL_WAIT_S,
        metavar="SECONDS",
        help=f"wait up to this long for the server to connect (default {DEFAULT_CALL_WAIT_S:g}; 0 calls at once)",
    )
    return parser


def call_main(argv: list[str]) -> int:
    """`breakwater call SERVER TOOL [JSON_ARGS] [--arg K=V ...] [--json] [--wait S]`."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        arguments = parse_arguments(args.json_args, args.arg)
    except ValueError as exc:
        return fail(str(exc), EXIT_CONFIG)
    config = load_or_exit(args.config)
    names = [spec.name for spec in config.servers]
    if args.server not in names:
        hint = did_you_mean(args.server, names)
        # The name an agent sees (`t__add`), written where the server goes: say the call the user meant.
        if (routed := route_by_shape(config.gateway.tool_name_template, names, args.server)) is not None:
            hint = f" ({args.server!r} is how the gateway names tool {routed[1]!r} of server {routed[0]!r}: "
            hint += f"breakwater call {shlex.join(routed)})"
        return fail(
            f"no server named {args.server!r} in {config.path}{hint}; servers: {', '.join(names) or 'none'}",
            EXIT_CONFIG,
        )
    code: int = anyio.run(_call, config, args.server, args.tool, arguments, args.wait, args.json)
    return code
