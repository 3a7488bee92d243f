"""A conformance-compatible upstream MCP server on the SDK's `MCPServer`.

It offers what the server scenarios of the official conformance suite (npm
`@modelcontextprotocol/conformance`) call: the `test_*` tools, the `test://` resources, the
`test_*` prompts, completion, logging and resource subscriptions. `tests/test_conformance.py`
runs the suite against it directly and through `breakwater serve`.

It serves both protocol revisions the way a careful server does: its sampling and elicitation
tools send server-to-client requests on a 2025-era connection and answer with an
`InputRequiredResult` (multi round-trip) on a 2026-07-28 one, where server-to-client requests do
not exist. `test_watch_resource_update` sends `notifications/resources/updated` for a URI, to the
subscribers of that URI (what the gateway's relay tests need).

    python tests/conformance/server.py                 # stdio
    python tests/conformance/server.py --port 0 --port-file F   # streamable HTTP on 127.0.0.1
"""

from __future__ import annotations

if __name__ == "__main__":  # the suite runs it as a fork of a process that imported the SDK already (`fork_script`)
    from breakwater.testing._launcher import fork_script

    fork_script(__file__)

import argparse
import base64
import contextlib
import json
import socket
import sys
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    AudioContent,
    Completion,
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequiredResult,
    JSONRPCMessage,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

_Ref = PromptReference | ResourceTemplateReference
_Completer = Callable[[_Ref, CompletionArgument, CompletionContext | None], Awaitable[Completion]]

# Logging, sampling and elicitation are deprecated in 2026-07-28 but are what the 2025-era scenarios test.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

# A 1x1 PNG and a tiny WAV header.
TEST_IMAGE_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
TEST_AUDIO_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


class InMemoryEventStore(EventStore):
    """Keeps every SSE event so a client that reconnects with Last-Event-ID gets what it missed (SEP-1699)."""

    def __init__(self) -> None:
        self._events: list[tuple[StreamId, EventId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(len(self._events) + 1)
        self._events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        stream = next((s for s, e, _ in self._events if e == last_event_id), None)
        if stream is None:
            return None
        for s, e, message in self._events:
            if s == stream and int(e) > int(last_event_id) and message is not None:
                await send_callback(EventMessage(message, e))
        return stream


def _modern(ctx: Context) -> bool:
    """A 2026-07-28 request: input comes through `InputRequiredResult`, not server-to-client requests."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def build_server() -> MCPServer:
    mcp = MCPServer("breakwater-conformance-upstream", version="1.0.0")
    subscriptions: set[str] = set()
    subscribers: dict[str, list[Any]] = {}  # uri -> sessions of handshake-era subscribers

    # ---- tools -----------------------------------------------------------------------------------

    @mcp.tool()
    def test_simple_text() -> str:
        """Tests simple text content response"""
        return "This is a simple text response for testing."

    @mcp.tool()
    def test_image_content() -> list[ImageContent]:
        """Tests image content response"""
        return [ImageContent(type="image", data=TEST_IMAGE_BASE64, mime_type="image/png")]

    @mcp.tool()
    def test_audio_content() -> list[AudioContent]:
        """Tests audio content response"""
        return [AudioContent(type="audio", data=TEST_AUDIO_BASE64, mime_type="audio/wav")]

    @mcp.tool()
    def test_embedded_resource() -> list[EmbeddedResource]:
        """Tests embedded resource content response"""
        resource = TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        )
        return [EmbeddedResource(type="resource", resource=resource)]

    @mcp.tool()
    def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
        """Tests response with multiple content types (text, image, resource)"""
        resource = TextResourceContents(
            uri="test://mixed-content-resource", mime_type="application/json", text='{"test": "data", "value": 123}'
        )
        return [
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=TEST_IMAGE_BASE64, mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]

    @mcp.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Tests tool that emits log messages during execution"""
        for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await ctx.info(text)
            await anyio.sleep(0.05)
        return "Tool with logging executed successfully"

    @mcp.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Tests tool that reports progress notifications"""
        for step in (0, 50, 100):
            await ctx.report_progress(progress=step, total=100, message=f"Completed step {step} of 100")
            await anyio.sleep(0.05)
        meta = ctx.request_context.meta
        token = meta.get("progressToken") if isinstance(meta, dict) else getattr(meta, "progress_token", None)
        return str(token if token is not None else 0)

    @mcp.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str | InputRequiredResult:
        """Tests server-initiated sampling (LLM completion request)"""
        messages = [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))]
        if _modern(ctx):
            answer = (ctx.input_responses or {}).get("sampling")
            if not isinstance(answer, CreateMessageResult):
                params = CreateMessageRequestParams(messages=messages, max_tokens=100)
                return InputRequiredResult(input_requests={"sampling": CreateMessageRequest(params=params)})
            result = answer
        else:
            try:
                result = await ctx.session.create_message(messages=messages, max_tokens=100, related_request_id=ctx.request_id)
            except Exception as exc:
                return f"Sampling not supported or error: {exc}"
        text = result.content.text if isinstance(result.content, TextContent) else "No response"
        return f"LLM response: {text}"

    async def elicit(ctx: Context, message: str, schema: dict[str, Any], label: str) -> str | InputRequiredResult:
        if _modern(ctx):
            answer = (ctx.input_responses or {}).get("elicitation")
            if not isinstance(answer, ElicitResult):
                params = ElicitRequestFormParams(message=message, requested_schema=schema)
                return InputRequiredResult(input_requests={"elicitation": ElicitRequest(params=params)})
            result = answer
        else:
            try:
                result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
            except Exception as exc:
                return f"Elicitation not supported or error: {exc}"
        content = json.dumps(result.content or {}) if result.action == "accept" else "{}"
        return f"{label}: action={result.action}, content={content}"

    @mcp.tool()
    async def test_elicitation(message: str, ctx: Context) -> str | InputRequiredResult:
        """Tests server-initiated elicitation (user input request)"""
        schema = {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }
        return await elicit(ctx, message, schema, "User response")

    @mcp.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str | InputRequiredResult:
        """Tests elicitation with default values for all primitive types (SEP-1034)"""
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verification status", "default": True},
            },
            "required": [],
        }
        return await elicit(ctx, "Please provide user information", schema, "Elicitation result")

    @mcp.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str | InputRequiredResult:
        """Tests elicitation with enum schema variations per SEP-1330"""
        schema = {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {
                    "type": "string",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                "titledMulti": {
                    "type": "array",
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
            "required": [],
        }
        return await elicit(ctx, "Please select values using different enum schema types", schema, "Elicitation completed")

    @mcp.tool()
    def test_error_handling() -> str:
        """Tests error response handling"""
        raise RuntimeError("This tool intentionally returns an error for testing")

    @mcp.tool()
    async def test_reconnection(ctx: Context) -> str:
        """Tests SSE polling by closing stream mid-call (SEP-1699)"""
        await ctx.info("Before disconnect")
        await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        await ctx.info("After reconnect")
        return "Reconnection test completed"

    @mcp.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
    def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None) -> str:
        return f"name={name!r} address={address!r}"

    tool = mcp._tool_manager.get_tool("json_schema_2020_12_tool")
    assert tool is not None
    tool.parameters = JSON_SCHEMA_2020_12

    # ---- resources -------------------------------------------------------------------------------

    @mcp.resource("test://static-text", mime_type="text/plain")
    def static_text_resource() -> str:
        """A static text resource for testing"""
        return "This is the content of the static text resource."

    @mcp.resource("test://static-binary", mime_type="image/png")
    def static_binary_resource() -> bytes:
        """A static binary resource (image) for testing"""
        return base64.b64decode(TEST_IMAGE_BASE64)

    @mcp.resource("test://template/{id}/data", mime_type="application/json")
    def template_resource(id: str) -> str:
        """A resource template with parameter substitution"""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @mcp.resource("test://watched-resource", mime_type="text/plain")
    def watched_resource() -> str:
        """A resource that can be subscribed to for updates"""
        return "Watched resource content"

    # ---- prompts ---------------------------------------------------------------------------------

    @mcp.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A simple prompt without arguments"""
        return [UserMessage(role="user", content=TextContent(type="text", text="This is a simple prompt for testing."))]

    @mcp.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        """A prompt with required arguments"""
        text = f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
        return [UserMessage(role="user", content=TextContent(type="text", text=text))]

    @mcp.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        """A prompt that includes an embedded resource"""
        resource = TextResourceContents(uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing.")
        return [
            UserMessage(role="user", content=EmbeddedResource(type="resource", resource=resource)),
            UserMessage(role="user", content=TextContent(type="text", text="Please process the embedded resource above.")),
        ]

    @mcp.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt that includes image content"""
        return [
            UserMessage(role="user", content=ImageContent(type="image", data=TEST_IMAGE_BASE64, mime_type="image/png")),
            UserMessage(role="user", content=TextContent(type="text", text="Please analyze the image above.")),
        ]

    # ---- completion, logging, subscriptions ------------------------------------------------------

    # The SDK leaves the `completion` decorator unannotated; it hands the function back unchanged.
    completion = cast(Callable[[], Callable[[_Completer], _Completer]], mcp.completion)

    @completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference, argument: CompletionArgument, context: CompletionContext | None
    ) -> Completion:
        return Completion(values=[], total=0, has_more=False)

    async def set_level(ctx: ServerRequestContext[Any], params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    async def subscribe(ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
        subscriptions.add(str(params.uri))
        subscribers.setdefault(str(params.uri), []).append(ctx.session)
        return EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams) -> EmptyResult:
        subscriptions.discard(str(params.uri))
        subscribers.pop(str(params.uri), None)
        return EmptyResult()

    @mcp.tool()
    async def test_watch_resource_update(ctx: Context, uri: str = "test://watched-resource") -> str:
        """Sends notifications/resources/updated for `uri` to its subscribers (both protocol revisions)"""
        await ctx.notify_resource_updated(uri)  # 2026-07-28 subscribers: their subscriptions/listen streams
        for session in subscribers.get(uri, []):
            with contextlib.suppress(Exception):  # a subscriber that went away
                await session.send_resource_updated(uri)
        return f"subscribed: {sorted(subscriptions)}"

    low = mcp._lowlevel_server
    low.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    low.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return mcp


async def _serve_http(mcp: MCPServer, port: int, port_file: str | None) -> None:
    import uvicorn

    app = mcp.streamable_http_app(event_store=InMemoryEventStore(), retry_interval=100)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    if port_file:
        Path(port_file).write_text(str(sock.getsockname()[1]))
    await uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, help="serve streamable HTTP on 127.0.0.1:PORT (0 = any free port)")
    parser.add_argument("--port-file", help="write the bound port here")
    args = parser.parse_args(argv)
    mcp = build_server()
    if args.port is None:
        mcp.run("stdio")
    else:
        anyio.run(_serve_http, mcp, args.port, args.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
