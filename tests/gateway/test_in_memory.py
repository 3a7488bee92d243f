"""`breakwater.testing.in_memory`: a real `Breakwater` in front of in-process SDK servers, on the fake clock.

The supervisor, admission, handshake (either protocol revision), gate, retries and deadlines are
all the real ones; only the transport is memory streams and only time is virtual, so what a user
would check (ready with its tools, a call's answer, a timeout to the microsecond) is checked
without a subprocess, in milliseconds.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, RequestParamsMeta, TextContent, Tool, ToolAnnotations

from breakwater import Breakwater, Config, ConnectPolicy, Reason, ServerSpec, ServerState
from breakwater._wire import OPERATION_ID_META_KEY
from breakwater.catalog._catalog import Catalog
from breakwater.config import CallPolicy, GatewayPolicy, RetryPolicy
from breakwater.gateway._server import Gateway
from breakwater.testing import FakeClock, Progress, ScriptedCall, ScriptedServer, in_memory
from helpers import envelope_of

pytestmark = pytest.mark.anyio

T = TypeVar("T")
POLICY = ConnectPolicy(startup_jitter_s=0, attempt_timeout_s=5, backoff_base_s=1, backoff_cap_s=4, budget_s=20)


def shop(clock: FakeClock, events: list[str], cancelled: anyio.Event | None = None) -> MCPServer:
    """An in-process server whose slow tool waits on the test's clock."""
    server = MCPServer("shop")

    @server.tool()
    async def add(a: int, b: int) -> int:
        return a + b

    @server.tool()
    async def slow(seconds: float) -> str:
        events.append(f"slow started at {clock.monotonic():g}")
        try:
            await clock.sleep(seconds)
        except BaseException:
            events.append(f"slow cancelled at {clock.monotonic():g}")
            if cancelled is not None:
                cancelled.set()
            raise
        return "done"

    return server


def spec(name: str = "shop", **kw: Any) -> ServerSpec:
    kw.setdefault("connect", POLICY)
    return ServerSpec(name=name, transport="stdio", command="not-used-in-memory", **kw)


async def with_breakwater(
    tmp_path: Path,
    clock: FakeClock,
    transports: Any,
    specs: tuple[ServerSpec, ...],
    body: Callable[[Breakwater], Awaitable[T]],
) -> T:
    async def run() -> T:
        async with Breakwater(
            Config(servers=specs),
            clock=clock,
            rng=random.Random(3),
            admission_dir=tmp_path / "admission",
            journal=None,
            telemetry=None,
            transports=transports,
        ) as bw:
            return await body(bw)

    with anyio.fail_after(20):  # real seconds: everything here runs on virtual time
        return await clock.run(run)


@pytest.mark.parametrize("protocol", ["auto", "2026-07-28", "2025-11-25"])
async def test_connects_and_calls_an_in_process_server(tmp_path: Path, protocol: str) -> None:
    """Ready after one attempt with both tools, in the revision asked for; a call returns the server's answer."""
    clock = FakeClock()
    server = shop(clock, [])
    policy = ConnectPolicy(startup_jitter_s=0, protocol=protocol)

    async def body(bw: Breakwater) -> tuple[Any, CallToolResult]:
        report = await bw.wait_ready(timeout=30)
        return report.servers[0], await bw.call_tool("shop", "add", {"a": 2, "b": 3})

    status, result = await with_breakwater(tmp_path, clock, in_memory(server), (spec(connect=policy),), body)
    assert (status.state, status.tools, status.attempts, status.error) == (ServerState.READY, 2, 1, None)
    assert status.protocol == ("2025-11-25" if protocol == "2025-11-25" else "2026-07-28")
    assert not result.is_error
    assert result.structured_content == {"result": 5}


async def test_a_silent_tool_times_out_exactly_and_is_cancelled_upstream(tmp_path: Path) -> None:
    """A call past its timeout comes back at exactly the timeout, and the server's handler is cancelled then."""
    clock = FakeClock()
    events: list[str] = []
    cancelled = anyio.Event()

    async def body(bw: Breakwater) -> tuple[float, CallToolResult]:
        await bw.wait_ready(timeout=30)
        started = clock.monotonic()
        result = await bw.call_tool("shop", "slow", {"seconds": 3600}, timeout=2.5)
        elapsed = clock.monotonic() - started
        await cancelled.wait()  # had the cancellation not reached it, the handler would finish at +3600 s instead
        return elapsed, result

    server = shop(clock, events, cancelled)
    elapsed, result = await with_breakwater(tmp_path, clock, in_memory(server), (spec(),), body)
    assert elapsed == pytest.approx(2.5)
    assert result.is_error and isinstance(result.structured_content, dict)
    # `slow` is not declared read-only or idempotent: a lost answer is an unknown outcome, not retried.
    assert result.structured_content["code"] == "OUTCOME_UNKNOWN"
    assert result.structured_content["timeout_s"] == 2.5
    assert events == ["slow started at 1000", "slow cancelled at 1002.5"]


async def test_retries_back_off_on_the_fake_clock(tmp_path: Path) -> None:
    """A read-only tool that fails twice is retried after jittered backoffs and its third answer is returned."""
    clock = FakeClock()
    server = MCPServer("flaky")
    calls: list[float] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup() -> CallToolResult:
        calls.append(clock.monotonic())
        if len(calls) < 3:
            body = {"ok": False, "code": "UNAVAILABLE", "retryable": True, "message": "try again"}
            return CallToolResult(content=[TextContent(type="text", text="busy")], structured_content=body, is_error=True)
        return CallToolResult(content=[TextContent(type="text", text="found")], structured_content={"ok": True})

    retry = RetryPolicy(max_attempts=3, backoff_base_s=1.0, backoff_cap_s=8.0)

    async def body(bw: Breakwater) -> CallToolResult:
        await bw.wait_ready(timeout=30)
        return await bw.call_tool("flaky", "lookup", {})

    result = await with_breakwater(tmp_path, clock, in_memory(server), (spec("flaky", retry=retry),), body)
    assert result.structured_content == {"ok": True}
    assert len(calls) == 3
    waits = [b - a for a, b in itertools.pairwise(calls)]
    assert 0 <= waits[0] <= 1.0 and 0 <= waits[1] <= 2.0, waits


async def test_one_factory_serves_several_servers_by_name(tmp_path: Path) -> None:
    """A mapping names each spec's server; a spec it does not name fails to connect, saying so."""
    clock = FakeClock()
    a, b = MCPServer("a"), MCPServer("b")

    @a.tool()
    async def hello() -> str:
        return "from a"

    @b.tool()
    async def hello_b() -> str:
        return "from b"

    quick_fail = ConnectPolicy(startup_jitter_s=0, attempt_timeout_s=1, backoff_base_s=1, backoff_cap_s=1, budget_s=3)

    async def body(bw: Breakwater) -> tuple[Any, ...]:
        report = await bw.wait_ready(timeout=60)
        return (*report.servers, await bw.call_tool("a", "hello", {}), await bw.call_tool("b", "hello_b", {}))

    specs = (spec("a"), spec("b"), spec("c", connect=quick_fail))
    sa, sb, sc, ra, rb = await with_breakwater(tmp_path, clock, in_memory({"a": a, "b": b}), specs, body)
    assert (sa.state, sb.state, sc.state) == (ServerState.READY, ServerState.READY, ServerState.FAILED)
    assert sc.error.code is Reason.PROTOCOL_ERROR and "no server named 'c'" in sc.error.message
    assert [ra.content[0].text, rb.content[0].text] == ["from a", "from b"]


async def test_a_scripted_server_shows_what_reached_it_and_relays_progress(tmp_path: Path) -> None:
    """`ScriptedServer` lists exactly its tools, records each call as sent (operation id included), relays progress."""
    clock = FakeClock()
    listed = [Tool(name="charge", input_schema={"type": "object"}, annotations=ToolAnnotations(idempotent_hint=True))]

    async def answer(call: ScriptedCall, n: int, progress: Progress) -> CallToolResult:
        await progress(0.5, 1.0, "halfway")
        await clock.sleep(1.0)
        return CallToolResult(content=[TextContent(type="text", text=f"charged #{n}")])

    scripted = ScriptedServer(listed, answer)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async def body(bw: Breakwater) -> CallToolResult:
        await bw.wait_ready(timeout=30)
        return await bw.call_tool("pay", "charge", {"cents": 120}, progress_callback=on_progress, operation_id="op-1")

    result = await with_breakwater(tmp_path, clock, in_memory(scripted.server), (spec("pay"),), body)
    assert not result.is_error and result.content[0].text == "charged #1"  # type: ignore[union-attr]
    assert scripted.calls == [ScriptedCall("charge", {"cents": 120}, {OPERATION_ID_META_KEY: "op-1"})]
    assert seen == [(0.5, 1.0, "halfway")]


async def test_an_operation_id_breakwater_cannot_keep_is_refused_not_replaced(tmp_path: Path) -> None:
    """A caller's id that is no non-empty string (12345, "") was replaced by a new one of breakwater's, silently: an
    agent's retry under it ran the charge again. Through the gateway it is refused (INVALID_ARGUMENTS: the model sent it);
    from the library, `call_tool` raises as for its other bad arguments (tests/test_library_lifecycle.py). Nothing runs."""
    clock = FakeClock()
    listed = [Tool(name="charge", input_schema={"type": "object"}, annotations=ToolAnnotations(destructive_hint=True))]

    async def answer(call: ScriptedCall, n: int, progress: Progress) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=f"charged #{n}")])

    scripted = ScriptedServer(listed, answer)
    policy = GatewayPolicy()

    async def body(bw: Breakwater) -> list[CallToolResult]:
        gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        await bw.wait_ready(timeout=30)
        with pytest.raises(ValueError, match="operation id must be a non-empty string"):
            await bw.call_tool("pay", "charge", {}, operation_id="")
        answers: list[CallToolResult] = []
        async with Client(gateway.server, mode="legacy") as client:
            for bad in (12345, "", "x" * 256):
                meta = cast(RequestParamsMeta, {OPERATION_ID_META_KEY: bad})  # an open TypedDict: vendor keys are allowed
                answers.append(await client.call_tool("pay__charge", {}, meta=meta))
        return answers

    answers = await with_breakwater(tmp_path, clock, in_memory(scripted.server), (spec("pay"),), body)
    for result in answers:
        assert (envelope_of(result)["code"], "Invalid operation id" in envelope_of(result)["message"]) == (
            "INVALID_ARGUMENTS",
            True,
        ), result
    assert scripted.calls == []


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_gateway_serves_an_in_process_server_to_an_in_process_client(tmp_path: Path, mode: str) -> None:
    """Client → gateway → gate → supervisor → server, all in one event loop: the namespaced tool answers, and
    a call past its timeout comes back as the gateway's error envelope at exactly the timeout."""
    clock = FakeClock()
    policy = GatewayPolicy()

    async def body(bw: Breakwater) -> tuple[list[str], CallToolResult, CallToolResult, float]:
        gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            await bw.wait_ready(timeout=30)
            async with Client(gateway.server, mode=mode) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                added = await client.call_tool("shop__add", {"a": 20, "b": 22})
                started = clock.monotonic()
                slow = await client.call_tool("shop__slow", {"seconds": 600})
                elapsed = clock.monotonic() - started
            tg.cancel_scope.cancel()
        return names, added, slow, elapsed

    call = CallPolicy(timeout_s=3.0)
    names, added, slow, elapsed = await with_breakwater(tmp_path, clock, in_memory(shop(clock, [])), (spec(call=call),), body)
    assert {"shop__add", "shop__slow"} <= set(names)
    assert added.structured_content == {"result": 42}
    # `slow` returns text: its output schema has the gateway put the envelope under `_meta`.
    assert (envelope_of(slow)["code"], envelope_of(slow)["timeout_s"]) == ("OUTCOME_UNKNOWN", 3.0), slow
    assert elapsed == pytest.approx(3.0)


async def test_a_server_that_needs_the_user_on_a_page_is_answered_with_the_address_once(tmp_path: Path) -> None:
    """A 2025-11-25 server that needs a sign-in elsewhere first (URL elicitation required, -32042): the text the
    model reads gives the user's step and the page's address, and the call is not repeated."""
    from mcp.shared.exceptions import UrlElicitationRequiredError
    from mcp.types import ElicitRequestURLParams

    clock = FakeClock()
    server = MCPServer("cal")
    asked: list[int] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))  # safe to retry: only the error stops it
    async def agenda() -> str:
        asked.append(1)
        page = ElicitRequestURLParams(message="Connect your calendar", url="https://cal.example/auth?s=1", elicitation_id="e1")
        raise UrlElicitationRequiredError([page])

    policy = ConnectPolicy(startup_jitter_s=0, protocol="2025-11-25")

    async def body(bw: Breakwater) -> CallToolResult:
        await bw.wait_ready(timeout=30)
        return await bw.call_tool("cal", "agenda", {})

    result = await with_breakwater(tmp_path, clock, in_memory(server), (spec("cal", connect=policy),), body)
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["code"] == "CLIENT_CANNOT_ANSWER"
    [text] = [block.text for block in result.content if isinstance(block, TextContent)]
    assert "Connect your calendar — open https://cal.example/auth?s=1" in text and "give the user the address" in text
    assert asked == [1]


async def test_a_resource_of_a_server_not_ready_is_not_said_to_be_offered_by_nobody(tmp_path: Path) -> None:
    """A resource is asked for while its server is down: the answer names the servers that are not ready (it was
    "no server offers the resource", the resource's "does not exist")."""
    from mcp import MCPError

    clock = FakeClock()
    policy = GatewayPolicy()

    async def body(bw: Breakwater) -> str:
        gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            await bw.wait_ready(timeout=30)
            async with Client(gateway.server, mode="legacy") as client:
                with pytest.raises(MCPError) as refused:
                    await client.read_resource("docs://readme")
            tg.cancel_scope.cancel()
        return refused.value.error.message

    down = ConnectPolicy(startup_jitter_s=0, attempt_timeout_s=1, backoff_base_s=60, backoff_cap_s=60, budget_s=600)
    specs = (spec(), spec("docs", connect=down))  # no in-process server answers for docs: it keeps retrying
    message = await with_breakwater(tmp_path, clock, in_memory({"shop": shop(clock, [])}), specs, body)
    assert "no ready server offers the resource 'docs://readme'" in message
    assert "docs (retrying)" in message and "shop" not in message


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_relayed_results_name_breakwater_as_their_server_not_the_upstream(tmp_path: Path, mode: str) -> None:
    """A 2026-07-28 upstream stamps every result with its own `serverInfo`. Through the gateway, a 2026-07-28
    client reads breakwater's in the tool's, the prompt's and the resource's results (it read the upstream's),
    a 2025-era client none (its revision has no such stamp), and the tool's own `_meta` reaches both."""
    from mcp.types import GetPromptResult, ReadResourceResult
    from mcp_types import SERVER_INFO_META_KEY

    clock = FakeClock()
    policy = GatewayPolicy()
    server = MCPServer("shop")

    @server.tool()
    async def receipt() -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="ok")], _meta={"shop/receipt": 7})

    @server.prompt()
    async def greet() -> str:
        return "hello"

    @server.resource("shop://terms")
    async def terms() -> str:
        return "be nice"

    async def body(bw: Breakwater) -> tuple[CallToolResult, GetPromptResult, ReadResourceResult]:
        gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            await bw.wait_ready(timeout=30)
            async with Client(gateway.server, mode=mode) as client:
                called = await client.call_tool("shop__receipt", {})
                prompt = await client.get_prompt("shop__greet")
                read = await client.read_resource("shop://terms")
            tg.cancel_scope.cancel()
        return called, prompt, read

    upstream = spec(connect=ConnectPolicy(startup_jitter_s=0, protocol="2026-07-28"))
    called, prompt, read = await with_breakwater(tmp_path, clock, in_memory(server), (upstream,), body)
    assert not called.is_error and called.meta is not None and called.meta["shop/receipt"] == 7
    for result in (called, prompt, read):
        stamp = (result.meta or {}).get(SERVER_INFO_META_KEY)
        if mode == "legacy":
            assert stamp is None, result.meta
        else:
            assert stamp is not None and stamp["name"] == "breakwater", result.meta
