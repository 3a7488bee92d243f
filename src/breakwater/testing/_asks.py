"""The test server's asking tools (`breakwater testserver --asking-tools`): tools that ask the client mid-call.

Real servers ask the client for a model's answer (sampling), for a form the user fills in or a page the
user opens (elicitation), and for the directories it works in (roots). These tools ask exactly that,
in whichever revision the call came in: on 2025-11-25 as a server-to-client request during the call,
on 2026-07-28 as an `InputRequiredResult` the client answers in its next round. A refusal is not
caught: the tool fails as most servers' do (the SDK makes the exception an `isError` result).

    ask_sampling   sampling/createMessage with the `prompt` argument; returns the model's text
    ask_form       elicitation/create (form: one string `name`); returns the action and content
    ask_url        elicitation/create (URL mode) for the page `url` (default below); returns the action
    ask_url_first  the 2025-11-25 "URL elicitation required" error (-32042) naming the page `url`
    ask_roots      roots/list; returns the roots' URIs, one a line
"""

from __future__ import annotations

import warnings
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning, UrlElicitationRequiredError
from mcp.types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    SamplingMessage,
    TextContent,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = ["ASKING_TOOLS", "DEFAULT_PAGE", "add_asking_tools"]

#: The page `ask_url` and `ask_url_first` ask the user to open when the call names none.
DEFAULT_PAGE = "https://auth.example/connect?state=bw-test"
#: The names `add_asking_tools` registers.
ASKING_TOOLS = ("ask_sampling", "ask_form", "ask_url", "ask_url_first", "ask_roots")
_FORM = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
_READONLY = ToolAnnotations(read_only_hint=True)


def _modern(ctx: Context[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _url(page: str, message: str) -> ElicitRequestURLParams:
    return ElicitRequestURLParams(message=message, url=page, elicitation_id="bw-test-page")


async def ask_sampling(ctx: Context[Any, Any], prompt: str = "What is six times seven?") -> str | InputRequiredResult:
    """Ask the client's model `prompt` (sampling/createMessage); answer with its text."""
    messages = [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))]
    if _modern(ctx):
        answer = (ctx.input_responses or {}).get("sampling")
        if not isinstance(answer, CreateMessageResult):
            params = CreateMessageRequestParams(messages=messages, max_tokens=100)
            return InputRequiredResult(input_requests={"sampling": CreateMessageRequest(params=params)})
        result = answer
    else:
        result = await ctx.session.create_message(messages=messages, max_tokens=100, related_request_id=ctx.request_id)
    return result.content.text if isinstance(result.content, TextContent) else f"[{result.content.type}]"


async def ask_form(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Ask the user for a name through a form (elicitation/create); answer with what they did."""
    message = "What name should the report carry?"
    if _modern(ctx):
        answer = (ctx.input_responses or {}).get("elicitation")
        if not isinstance(answer, ElicitResult):
            params = ElicitRequestFormParams(message=message, requested_schema=_FORM)
            return InputRequiredResult(input_requests={"elicitation": ElicitRequest(params=params)})
        result = answer
    else:
        result = await ctx.session.elicit_form(message, _FORM, related_request_id=ctx.request_id)
    return f"{result.action}: {result.content or {}}"


async def ask_url(ctx: Context[Any, Any], url: str = DEFAULT_PAGE) -> str | InputRequiredResult:
    """Ask the user to open `url` (a URL elicitation during the call); answer with what they did."""
    page = _url(url, "Sign in to the example service")
    if _modern(ctx):
        answer = (ctx.input_responses or {}).get("page")
        if not isinstance(answer, ElicitResult):
            return InputRequiredResult(input_requests={"page": ElicitRequest(params=page)})
        return answer.action
    result: ElicitResult = await ctx.session.elicit_url(page.message, page.url, page.elicitation_id, ctx.request_id)
    return result.action


async def ask_url_first(url: str = DEFAULT_PAGE) -> str:
    """Fail with "URL elicitation required" (-32042, 2025-11-25): the user must open `url` first."""
    raise UrlElicitationRequiredError([_url(url, "Sign in to the example service")])


async def ask_roots(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Ask the client for its roots (roots/list); answer with their URIs, one a line."""
    if _modern(ctx):
        answer = (ctx.input_responses or {}).get("roots")
        if not isinstance(answer, ListRootsResult):
            return InputRequiredResult(input_requests={"roots": ListRootsRequest()})
        result = answer
    else:
        result = await ctx.session.list_roots()
    return "\n".join(str(root.uri) for root in result.roots) or "(no roots)"


def add_asking_tools(mcp: MCPServer) -> None:
    """Register the asking tools on `mcp`."""
    # Sampling, roots and server-to-client requests are deprecated at 2026-07-28; their 2025 paths are the point here.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    for tool in (ask_sampling, ask_form, ask_url, ask_url_first, ask_roots):
        mcp.add_tool(tool, name=tool.__name__, annotations=_READONLY)
