"""Failure classification, from real SDK objects: real results, real MCPErrors, real transport errors."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import anyio
import httpx2
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client, MCPError
from mcp.server import MCPServer
from mcp.server.lowlevel import Server
from mcp.server.mcpserver.exceptions import ToolError as ServerToolError
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    CallToolResult,
    ElicitRequestURLParams,
    ListToolsResult,
    TextContent,
    Tool,
    ToolAnnotations,
)

from breakwater.connect._http_cut import CUT_KEY
from breakwater.errors import BudgetExhaustedError, CircuitOpenError, ErrorCode
from breakwater.gate._breaker import Outcome
from breakwater.gate._classify import SUCCESS, AttemptContext, RetryClass, Verdict, classify, retry_class_for

SAFE, IDEMPOTENT, NEVER = RetryClass.SAFE, RetryClass.IDEMPOTENT, RetryClass.NEVER


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def v(attempt: CallToolResult | BaseException, retry_class: RetryClass = SAFE, **kwargs: Any) -> Verdict:
    return classify(attempt, retry_class=retry_class, server="s", tool="t", **kwargs)


def result(text: str = "ok", *, is_error: bool = False, structured: Any = None) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured, is_error=is_error)


# -- real SDK behaviour -------------------------------------------------------------------------

server = MCPServer("classify")


@server.tool()
def add(a: int, b: int) -> int:
    return a + b


@server.tool()
def refuse(order_id: str) -> str:
    raise ServerToolError(f"order {order_id} is already shipped")


@server.tool()
def crash() -> str:
    raise ValueError("secret detail")


@server.tool()
async def slow() -> str:
    await anyio.sleep(10)
    return "late"


@server.tool()
async def protocol_error() -> str:
    raise MCPError(INTERNAL_ERROR, "upstream exploded")


@server.tool()
async def sign_in() -> str:
    page = ElicitRequestURLParams(message="Connect your calendar", url="https://cal.example/auth?s=1", elicitation_id="e1")
    raise UrlElicitationRequiredError([page])


@pytest.mark.anyio
async def test_a_server_that_needs_the_user_on_a_page_gives_the_model_its_address() -> None:
    """URL elicitation required (-32042, 2025-11-25): the server is healthy and no input or retry helps; the
    user must open the page. The model is told so with the address (it was "needs the user", and a TOOL_ERROR
    whose advice is to fix the input)."""
    async with Client(server, mode="legacy") as client:
        with pytest.raises(MCPError) as needed:
            await client.call_tool("sign_in", {})
    verdict = v(needed.value)
    assert (verdict.outcome, verdict.code, verdict.retryable) == (Outcome.SUCCESS, ErrorCode.CLIENT_CANNOT_ANSWER, False)
    assert "Connect your calendar — open https://cal.example/auth?s=1" in verdict.reason
    assert [(page["url"], page["message"]) for page in verdict.elicitations] == [
        ("https://cal.example/auth?s=1", "Connect your calendar")
    ]


@pytest.mark.anyio
async def test_real_mcpserver_results() -> None:
    async with Client(server) as client:
        ok = await client.call_tool("add", {"a": 1, "b": 2})
        unknown = await client.call_tool("nope", {})
        bad_args = await client.call_tool("add", {"a": "x", "b": 1})
        refused = await client.call_tool("refuse", {"order_id": "A1"})
        crashed = await client.call_tool("crash", {})
        with pytest.raises(MCPError) as internal:
            await client.call_tool("protocol_error", {})
        with pytest.raises(MCPError) as timed_out:
            await client.call_tool("slow", {}, read_timeout_seconds=0.02)

    assert v(ok) == Verdict(outcome=Outcome.SUCCESS, code=None, retryable=False)
    assert v(ok).ok

    # The server is healthy in these three: the request was wrong, so no breaker may hear a failure.
    assert (v(unknown).outcome, v(unknown).code, v(unknown).retryable) == (
        Outcome.SUCCESS,
        ErrorCode.UNKNOWN_TOOL,
        False,
    )
    assert (v(bad_args).outcome, v(bad_args).code, v(bad_args).retryable) == (
        Outcome.SUCCESS,
        ErrorCode.INVALID_ARGUMENTS,
        False,
    )

    # "200 with an error in the body": the tool failed, and that is a failure.
    for r in (refused, crashed):
        assert (v(r).outcome, v(r).code, v(r).retryable) == (Outcome.FAILURE, ErrorCode.TOOL_ERROR, False)

    assert internal.value.code == INTERNAL_ERROR
    assert (v(internal.value).outcome, v(internal.value).code, v(internal.value).retryable) == (
        Outcome.FAILURE,
        ErrorCode.UPSTREAM_ERROR,
        True,
    )

    assert timed_out.value.code == REQUEST_TIMEOUT
    safe = v(timed_out.value, SAFE)
    assert (safe.outcome, safe.code, safe.retryable, safe.outcome_unknown) == (
        Outcome.FAILURE,
        ErrorCode.TIMEOUT,
        True,
        True,
    )
    never = v(timed_out.value, NEVER)
    assert (never.outcome, never.code, never.retryable, never.outcome_unknown) == (
        Outcome.FAILURE,
        ErrorCode.OUTCOME_UNKNOWN,
        False,
        True,
    )


@pytest.mark.anyio
async def test_real_output_schema_violation_is_a_failure() -> None:
    # A low-level server whose result does not match its own declared outputSchema.
    async def on_list_tools(ctx: Any, params: Any) -> ListToolsResult:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        return ListToolsResult(tools=[Tool(name="shape", input_schema={"type": "object"}, output_schema=schema)])

    async def on_call_tool(ctx: Any, params: Any) -> CallToolResult:
        return CallToolResult(content=[], structured_content={"n": "reshaped"})

    low = Server("low", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    async with Client(low) as client:
        await client.list_tools()
        with pytest.raises(RuntimeError) as violated:
            await client.call_tool("shape", {})
    verdict = v(violated.value, SAFE)
    assert (verdict.outcome, verdict.code, verdict.retryable) == (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False)
    assert "outputSchema" in verdict.reason


@pytest.mark.anyio
async def test_real_refused_connection_inside_an_exception_group() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(BaseExceptionGroup) as group:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            await client.call_tool("x", {})
    for retry_class in RetryClass:
        verdict = v(group.value, retry_class)
        # Never reached the server: even a `never` tool may try again.
        assert (verdict.outcome, verdict.code, verdict.retryable, verdict.outcome_unknown) == (
            Outcome.FAILURE,
            ErrorCode.UPSTREAM_ERROR,
            True,
            False,
        )


def test_protocol_shape_violation_is_a_failure() -> None:
    with pytest.raises(pydantic.ValidationError) as bad:
        CallToolResult.model_validate({"content": "not a list", "isError": "maybe"})
    verdict = v(bad.value)
    assert (verdict.outcome, verdict.code, verdict.retryable) == (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False)


# -- the table ----------------------------------------------------------------------------------

request = httpx2.Request("POST", "http://upstream/mcp")

# (attempt, retry class, request sent) -> (outcome, code, retryable, outcome unknown)
TABLE: list[tuple[str, BaseException | CallToolResult, RetryClass, bool, tuple[Outcome, ErrorCode | None, bool, bool]]] = [
    ("result ok", result(), NEVER, True, (Outcome.SUCCESS, None, False, False)),
    (
        "HTTP 403 asking for more scope (a step-up): the credentials fall short, nothing ran",
        MCPError(CONNECTION_CLOSED, "the server refused the request: HTTP 403", {CUT_KEY: {"status": 403, "credentials": True}}),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False),
    ),
    (
        "HTTP 403 for another reason: refused before it ran, not a sign-in matter",
        MCPError(CONNECTION_CLOSED, "the server refused the request: HTTP 403", {CUT_KEY: {"status": 403}}),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False, False),
    ),
    (
        "plain-text isError: no such file (the model's input), not a failure",
        result("ENOENT: no such file or directory, open '/work/nope.txt'", is_error=True),
        NEVER,
        True,
        (Outcome.SUCCESS, ErrorCode.TOOL_ERROR, False, False),
    ),
    (
        "plain-text isError: a path outside the allowed directories",
        result("Access denied - path outside allowed directories: /etc not in /work", is_error=True),
        SAFE,
        True,
        (Outcome.SUCCESS, ErrorCode.TOOL_ERROR, False, False),
    ),
    (
        "plain-text isError: a host not found is a dependency failing",
        result("getaddrinfo ENOTFOUND api.example.com", is_error=True),
        SAFE,
        True,
        (Outcome.FAILURE, ErrorCode.TOOL_ERROR, False, False),
    ),
    (
        "plain-text isError: not found, but the service behind it is unavailable",
        result("upstream 503: service unavailable, record not found in cache", is_error=True),
        SAFE,
        True,
        # Worded as transient ("service unavailable"): a read-only tool is tried again, as for `retryable: true`.
        (Outcome.FAILURE, ErrorCode.TOOL_ERROR, True, False),
    ),
    (
        "isError, retryable false: a business answer",
        result("insufficient funds", is_error=True, structured={"retryable": False}),
        NEVER,
        True,
        (Outcome.SUCCESS, ErrorCode.TOOL_ERROR, False, False),
    ),
    (
        "isError, not found",
        result("no such order", is_error=True, structured={"error": {"code": "NOT_FOUND"}}),
        SAFE,
        True,
        (Outcome.SUCCESS, ErrorCode.TOOL_ERROR, False, False),
    ),
    (
        "isError, retryable true: the server vouches for a retry of a tool that may repeat",
        result("shed", is_error=True, structured={"retryable": True, "retry_after_s": 2}),
        IDEMPOTENT,
        True,
        (Outcome.FAILURE, ErrorCode.TOOL_ERROR, True, False),
    ),
    (
        # The request ran: a never tool was sent three times, with three side effects, on the server's word.
        "isError, retryable true, never tool: the retry class decides",
        result("shed", is_error=True, structured={"retryable": True, "retry_after_s": 2}),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.TOOL_ERROR, False, False),
    ),
    ("isError without a hint", result("boom", is_error=True), SAFE, True, (Outcome.FAILURE, ErrorCode.TOOL_ERROR, False, False)),
    ("our deadline, safe", TimeoutError(), SAFE, True, (Outcome.FAILURE, ErrorCode.TIMEOUT, True, True)),
    ("our deadline, idempotent", TimeoutError(), IDEMPOTENT, True, (Outcome.FAILURE, ErrorCode.TIMEOUT, True, True)),
    ("our deadline, never", TimeoutError(), NEVER, True, (Outcome.FAILURE, ErrorCode.OUTCOME_UNKNOWN, False, True)),
    (
        "connection closed mid-call, idempotent",
        MCPError(CONNECTION_CLOSED, "Connection closed"),
        IDEMPOTENT,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, True),
    ),
    (
        "connection closed mid-call, never",
        MCPError(CONNECTION_CLOSED, "Connection closed"),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.OUTCOME_UNKNOWN, False, True),
    ),
    (
        "connection closed before sending, never",
        MCPError(CONNECTION_CLOSED, "Connection closed"),
        NEVER,
        False,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False),
    ),
    (
        "SSE stream cut, never",
        ExceptionGroup("transport", [httpx2.RemoteProtocolError("peer closed", request=request)]),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.OUTCOME_UNKNOWN, False, True),
    ),
    (
        "nested group: connect error beside its cancellation fallout",
        BaseExceptionGroup("outer", [asyncio.CancelledError(), ExceptionGroup("inner", [httpx2.ConnectError("refused")])]),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False),
    ),
    (
        "httpx2 read timeout",
        httpx2.ReadTimeout("read", request=request),
        SAFE,
        True,
        (Outcome.FAILURE, ErrorCode.TIMEOUT, True, True),
    ),
    (
        "HTTP 503 with Retry-After",
        httpx2.HTTPStatusError(
            "503", request=request, response=httpx2.Response(503, headers={"Retry-After": "7"}, request=request)
        ),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False),
    ),
    (
        "HTTP 500 (server answered with an error), never",
        MCPError(INTERNAL_ERROR, "Server returned an error response"),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False, True),
    ),
    (
        "session terminated: the server forgot us, nothing ran",
        MCPError(INVALID_REQUEST, "Session terminated"),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False),
    ),
    (
        "method not found",
        MCPError(METHOD_NOT_FOUND, "Not Found"),
        SAFE,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False, False),
    ),
    (
        "spec unknown tool (-32602)",
        MCPError(INVALID_PARAMS, "Unknown tool: x"),
        SAFE,
        True,
        (Outcome.SUCCESS, ErrorCode.UNKNOWN_TOOL, False, False),
    ),
    (
        "invalid params",
        MCPError(INVALID_PARAMS, "Invalid arguments"),
        SAFE,
        True,
        (Outcome.SUCCESS, ErrorCode.INVALID_ARGUMENTS, False, False),
    ),
    (
        "application error flagged retryable, never tool: the retry class decides",
        MCPError(1234, "rate limited", {"retryable": True, "retry_after": 3}),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False, False),
    ),
    (
        "application error flagged retryable, safe tool",
        MCPError(1234, "rate limited", {"retryable": True, "retry_after": 3}),
        SAFE,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False),
    ),
    ("caller cancelled", asyncio.CancelledError(), SAFE, True, (Outcome.IGNORED, ErrorCode.CANCELLED, False, True)),
    (
        "breakwater's own refusal",
        CircuitOpenError(retry_after_s=4.0),
        SAFE,
        False,
        (Outcome.IGNORED, ErrorCode.CIRCUIT_OPEN, True, False),
    ),
    (
        "budget spent",
        BudgetExhaustedError(),
        SAFE,
        False,
        (Outcome.IGNORED, ErrorCode.BUDGET_EXHAUSTED, False, False),
    ),
    ("connection refused", ConnectionRefusedError(), NEVER, True, (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, True, False)),
    (
        "pipe broke mid-call, never",
        anyio.BrokenResourceError(),
        NEVER,
        True,
        (Outcome.FAILURE, ErrorCode.OUTCOME_UNKNOWN, False, True),
    ),
    (
        "something unforeseen",
        KeyError("x"),
        SAFE,
        True,
        (Outcome.FAILURE, ErrorCode.UPSTREAM_ERROR, False, True),
    ),
]


@pytest.mark.parametrize(("attempt", "retry_class", "sent", "expected"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_classification_table(
    attempt: BaseException | CallToolResult,
    retry_class: RetryClass,
    sent: bool,
    expected: tuple[Outcome, ErrorCode | None, bool, bool],
) -> None:
    verdict = v(attempt, retry_class, request_sent=sent)
    assert (verdict.outcome, verdict.code, verdict.retryable, verdict.outcome_unknown) == expected


def test_retry_after_hints_are_read() -> None:
    assert v(result("shed", is_error=True, structured={"retryable": True, "retry_after_s": 2})).retry_after_s == 2.0
    response = httpx2.Response(503, headers={"Retry-After": "7"}, request=request)
    assert v(httpx2.HTTPStatusError("503", request=request, response=response)).retry_after_s == 7.0
    assert v(MCPError(1234, "rate limited", {"retryable": True, "retry_after": 3})).retry_after_s == 3.0


# -- the user's classifier ------------------------------------------------------------------------


def test_a_user_classifier_overrides_and_can_defer() -> None:
    seen: list[AttemptContext] = []

    def mine(attempt: CallToolResult | BaseException, ctx: AttemptContext) -> Verdict | None:
        seen.append(ctx)
        if isinstance(attempt, CallToolResult) and attempt.is_error and "quota" in str(attempt.content):
            return Verdict(outcome=Outcome.IGNORED, code=ErrorCode.TOOL_ERROR, retryable=False, reason="quota")
        return None

    quota = v(result("quota exceeded", is_error=True), classifier=mine)
    assert quota.outcome is Outcome.IGNORED and quota.reason == "quota"
    other = v(result("boom", is_error=True), classifier=mine)
    assert other.outcome is Outcome.FAILURE  # deferred to the built-in rules
    assert seen[0] == AttemptContext(server="s", tool="t", retry_class=SAFE, request_sent=True)


def test_a_broken_user_classifier_falls_back_to_the_rules(caplog: pytest.LogCaptureFixture) -> None:
    def broken(attempt: CallToolResult | BaseException, ctx: AttemptContext) -> Verdict | None:
        raise ZeroDivisionError

    assert v(TimeoutError(), classifier=broken).code is ErrorCode.TIMEOUT
    assert "custom classifier failed" in caplog.text


# -- retry class from annotations -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "configured", "expected"),
    [
        (None, None, NEVER),
        (ToolAnnotations(), None, NEVER),
        (ToolAnnotations(read_only_hint=True), None, SAFE),
        (ToolAnnotations(read_only_hint=False, idempotent_hint=True), None, IDEMPOTENT),
        (ToolAnnotations(destructive_hint=True), None, NEVER),
        (ToolAnnotations(read_only_hint=False, destructive_hint=False), None, NEVER),
        # Annotations are hints from an untrusted server: configuration wins both ways.
        (ToolAnnotations(destructive_hint=True), "safe", SAFE),
        (ToolAnnotations(read_only_hint=True), RetryClass.NEVER, NEVER),
    ],
)
def test_retry_class_from_annotations(
    annotations: ToolAnnotations | None, configured: str | RetryClass | None, expected: RetryClass
) -> None:
    assert retry_class_for(annotations, configured) is expected


def test_an_unknown_configured_class_is_refused() -> None:
    with pytest.raises(ValueError):
        retry_class_for(None, "sometimes")


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(max_size=40),
    structured=st.none() | st.dictionaries(st.text(max_size=8), st.booleans() | st.integers() | st.text(max_size=8), max_size=3),
    retry_class=st.sampled_from(list(RetryClass)),
)
def test_a_plain_result_is_the_one_shared_success_verdict(
    text: str, structured: dict[str, Any] | None, retry_class: RetryClass
) -> None:
    """The gate's attempt takes `SUCCESS` for a result that is not an error without calling `classify` (no
    classifier set): `classify` must give that very verdict for every such result, whatever its content."""
    result = CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)
    assert classify(result, retry_class=retry_class, server="s", tool="t") is SUCCESS
