"""Errors of a tool that declares an output schema, as clients that check the schema take them.

The TypeScript SDK's client (Claude Code, Cursor, the Inspector) checks `structuredContent` against
the tool's output schema even on an `isError` result. The gateway's error envelope used to sit
there, so every error of such a tool became the client's own "Structured content does not match the
tool's output schema", and the model never read the envelope's advice. The npm "everything"
server's `get-structured-content` declares an output schema; a location outside its enum is refused
by the gate (INVALID_ARGUMENTS) before it is sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import TextContent

from helpers import isolated_env

pytestmark = pytest.mark.anyio

TOOL = "everything__get-structured-content"


def config(tmp_path: Path) -> tuple[Path, dict[str, str], object]:
    from conformance.node_tools import node_tools

    tools = node_tools()
    main = tools.package_main("@modelcontextprotocol/server-everything")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"everything": {"command": str(tools.node), "args": [str(main), "stdio"]}}}))
    env = isolated_env(tmp_path, BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"), BREAKWATER_LIST_WAIT_S="30")
    return path, env, tools


def test_the_inspector_gets_the_error_and_its_envelope_not_a_schema_failure(tmp_path: Path) -> None:
    """The Inspector CLI's one-shot call: the error result arrives as a result (the note for the model in its
    content, the envelope under `_meta["io.breakwater/error"]`, no `structuredContent`); a good call still
    answers structured content the Inspector checked against the schema."""
    path, env, tools = config(tmp_path)
    serve = [sys.executable, "-m", "breakwater", "serve", "--no-share", "--config", str(path)]
    inspector = [str(tools.bin / "mcp-inspector"), "--cli", "--method", "tools/call", "--tool-name", TOOL]  # type: ignore[attr-defined]
    run_env = dict(env, PATH=tools.env()["PATH"])  # type: ignore[attr-defined]

    def call(location: str) -> subprocess.CompletedProcess[str]:
        cmd = [*inspector, "--tool-arg", f"location={location}", "--", *serve]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=run_env, check=False)

    refused = call("Mars")
    assert "output schema" not in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert "tool_is_error" in refused.stderr, refused.stderr  # the Inspector's word for an isError result
    answer = json.loads(refused.stdout)
    assert answer["isError"] is True and "structuredContent" not in answer, answer
    envelope = answer["_meta"]["io.breakwater/error"]
    assert (envelope["code"], envelope["field"]) == ("INVALID_ARGUMENTS", "location"), envelope
    assert "Fix the arguments" in answer["content"][-1]["text"]
    good = call("Chicago")
    assert good.returncode == 0, good.stderr[-2000:]
    assert set(json.loads(good.stdout)["structuredContent"]) == {"temperature", "conditions", "humidity"}


async def test_an_sdk_client_reads_the_same_envelope(tmp_path: Path) -> None:
    """The Python SDK's client (which checks the schema only on success): the same result, the envelope in `_meta`."""
    path, env, _ = config(tmp_path)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "breakwater", "serve", "--no-share", "--config", str(path)], env=env
    )
    async with Client(params) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert listed[TOOL].output_schema is not None
        result = await client.call_tool(TOOL, {"location": "Mars"})
        plain = await client.call_tool("everything__echo", {"message": 7})
    assert result.is_error and result.structured_content is None, result
    assert result.meta is not None and result.meta["io.breakwater/error"]["code"] == "INVALID_ARGUMENTS"
    assert isinstance(result.content[-1], TextContent) and '"Mars" is not one of' in result.content[-1].text
    # A tool without an output schema keeps its envelope in structuredContent, as before.
    assert plain.is_error and (plain.structured_content or {}).get("code") == "INVALID_ARGUMENTS", plain


def test_a_moved_envelope_is_counted_by_its_code() -> None:
    """The gateway's call counter (`/metrics`) reads the envelope where `fitted` put it, not "tool_error"."""
    from breakwater.errors import InvalidArgumentsError
    from breakwater.gate._envelope import error_result
    from breakwater.gateway._metrics import _call_outcome
    from breakwater.gateway._passthrough import fitted

    schema = {"type": "object", "properties": {"temperature": {"type": "number"}}, "required": ["temperature"]}
    refused = error_result(InvalidArgumentsError("no", server="weather", tool="now"))
    moved = fitted(refused, schema)
    assert moved.structured_content is None and moved is not refused
    assert _call_outcome(moved) == _call_outcome(refused) == ("invalid_arguments", "weather")
    # An open object schema takes the envelope as it is: nothing moves.
    assert fitted(refused, {"type": "object"}) is refused


def test_a_moved_envelope_reads_back_as_the_same_error() -> None:
    """`error_from_result` (what `breakwater call` prints from) finds a moved envelope, and a TOOL_ERROR's own
    structured content where the tool put it."""
    from mcp.types import CallToolResult

    from breakwater.errors import ToolError
    from breakwater.gate._envelope import envelope_of, error_from_result, error_result
    from breakwater.gateway._passthrough import fitted

    schema = {"type": "object", "properties": {"temperature": {"type": "number"}}, "required": ["temperature"]}
    own = {"temperature": -1}
    tool_error = ToolError("bad city", server="weather", tool="now", content=[TextContent(type="text", text="no such city")])
    tool_error.upstream_structured_content = own
    moved = fitted(error_result(tool_error), schema)
    assert moved.structured_content == own and envelope_of(moved) is not None
    back = error_from_result(moved)
    assert isinstance(back, ToolError) and back.upstream_structured_content == own
    assert [b.text for b in back.content if isinstance(b, TextContent)] == ["no such city"]
    plain = CallToolResult(content=[TextContent(type="text", text="x")], structured_content={"code": "X"}, is_error=True)
    assert envelope_of(plain) is None  # an upstream's own error is not an envelope
