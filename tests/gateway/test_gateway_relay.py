"""What an upstream sends back mid-request reaches the downstream client through `breakwater serve`.

Real parts only: the gateway runs as `python -m breakwater serve` (stdio or HTTP), the upstream is
the conformance server (`tests/conformance/server.py`, stdio or HTTP) and the downstream is the
SDK's `Client` with its own callbacks. Breakwater's upstream connection is either 2026-07-28 (the
upstream asks with an `InputRequiredResult`) or 2025-11-25 (it sends server-to-client requests);
the downstream speaks either revision too (a 2026-07-28 client is asked through an
`InputRequiredResult` of the gateway's own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import ClientRequestContext

from breakwater.gate._tasks import CLIENT_EXTENSION
from breakwater.gateway._relay import RELAYED_LOGS_BURST, RELAYED_LOGS_PER_S, _Caller
from breakwater.testing import FakeClock
from helpers import ResourceUpdates, code_of, stop

# The logging, sampling and subscription APIs are deprecated at 2026-07-28; their 2025 paths are what is tested.
pytestmark = [
    pytest.mark.long_module(146),
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

UPSTREAM = Path(__file__).resolve().parents[1] / "conformance" / "server.py"
BREAKWATER = [sys.executable, "-m", "breakwater"]
WATCHED = "test://watched-resource"
OTHER = "test://static-text"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        BREAKWATER_TOOL_NAME_TEMPLATE="{tool}",
    )


def stdio_upstream() -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(UPSTREAM)]}


@asynccontextmanager
async def running(cmd: list[str], port_file: Path, env: dict[str, str]) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start a server that writes its port to `port_file`; yield its MCP URL and process; stop it by its pid."""
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text().strip():
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp", proc
    finally:
        stop(proc)


@asynccontextmanager
async def http_upstream(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    cmd = [sys.executable, str(UPSTREAM), "--port", "0", "--port-file", str(tmp_path / "up.port")]
    async with running(cmd, tmp_path / "up.port", dict(os.environ)) as (url, _):
        yield {"type": "http", "url": url}


def config(tmp_path: Path, entry: dict[str, Any]) -> Path:
    import json

    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"conf": entry}}))
    return path


def gateway_stdio(path: Path, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(path)], env=env)


@asynccontextmanager
async def gateway_http(tmp_path: Path, path: Path, env: dict[str, str]) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    cmd = [*BREAKWATER, "serve", "--config", str(path), "--http", "127.0.0.1:0", "--port-file", str(tmp_path / "gw.port")]
    async with running(cmd, tmp_path / "gw.port", env) as served:
        yield served


@asynccontextmanager
async def http_all_the_way(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[str]:
    """An HTTP gateway in front of an HTTP upstream; the gateway's URL."""
    async with http_upstream(tmp_path) as entry, gateway_http(tmp_path, config(tmp_path, entry), env) as (url, _):
        yield url


async def ready(client: Client) -> str:
    """Wait until the upstream is ready behind the gateway; its protocol revision."""
    with anyio.fail_after(30):
        while True:
            report = (await client.call_tool("breakwater_status", {})).structured_content or {}
            if report.get("summary", {}).get("ready", 0) >= 1:
                return str(report["servers"][0]["protocol"])
            await anyio.sleep(0.1)


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


UPSTREAM_ERAS = [pytest.param("auto", id="upstream-2026"), pytest.param("2025-11-25", id="upstream-2025")]
DOWNSTREAM_ERAS = [pytest.param("legacy", id="client-2025"), pytest.param("auto", id="client-2026")]


def era(env: dict[str, str], upstream: str) -> dict[str, str]:
    return dict(env, BREAKWATER_PROTOCOL=upstream)


def expected(upstream: str) -> str:
    return "2026-07-28" if upstream == "auto" else upstream


# ---- sampling and elicitation ------------------------------------------------------------------------------


@pytest.mark.parametrize("downstream", DOWNSTREAM_ERAS)
@pytest.mark.parametrize("upstream", UPSTREAM_ERAS)
async def test_sampling_reaches_the_client_and_its_answer_the_upstream(
    tmp_path: Path, env: dict[str, str], upstream: str, downstream: str
) -> None:
    """A stdio upstream's sampling request is put to the calling client (over a stdio gateway); its answer
    is what the upstream tool returns."""
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="m", stop_reason="endTurn"
        )

    target = gateway_stdio(config(tmp_path, stdio_upstream()), era(env, upstream))
    async with Client(target, mode=downstream, sampling_callback=sample) as client:
        assert client.protocol_version == ("2025-11-25" if downstream == "legacy" else "2026-07-28")
        assert await ready(client) == expected(upstream)
        result = await client.call_tool("test_sampling", {"prompt": "what is six times seven?"})
    assert not result.is_error, result
    assert text(result) == "LLM response: forty-two"
    assert [m.content.text for p in asked for m in p.messages] == ["what is six times seven?"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("upstream", "downstream"),
    [
        pytest.param("2025-11-25", "legacy", id="upstream-2025-client-2025"),
        pytest.param("auto", "auto", id="upstream-2026-client-2026"),
    ],
)
async def test_elicitation_reaches_the_client_over_http(
    tmp_path: Path, env: dict[str, str], upstream: str, downstream: str
) -> None:
    """HTTP all the way: an HTTP upstream's elicitation reaches the client of an HTTP gateway, schema intact."""
    schemas: list[dict[str, Any]] = []

    async def elicit(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        schemas.append(params.requested_schema)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async with (
        http_all_the_way(tmp_path, era(env, upstream)) as url,
        Client(url, mode=downstream, elicitation_callback=elicit) as client,
    ):
        assert await ready(client) == expected(upstream)
        result = await client.call_tool("test_elicitation", {"message": "who are you?"})
    assert not result.is_error, result
    assert text(result) == 'User response: action=accept, content={"username": "ada", "email": "ada@example.com"}'
    assert [sorted(s["properties"]) for s in schemas] == [["email", "username"]]


@pytest.mark.parametrize("downstream", DOWNSTREAM_ERAS)
async def test_a_slow_answer_from_a_person_does_not_time_the_call_out(
    tmp_path: Path, env: dict[str, str], downstream: str
) -> None:
    """The call timeout stands still while the client is being asked: an answer after three times the timeout
    still completes the call (only the hard cap, `max_s`, bounds the wait)."""

    async def elicit(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        await anyio.sleep(3)  # a person reading the question; the call timeout is 1 s
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async with (
        http_all_the_way(tmp_path, dict(era(env, "2025-11-25"), BREAKWATER_CALL_TIMEOUT_S="1")) as url,
        Client(url, mode=downstream, elicitation_callback=elicit) as client,
    ):
        await ready(client)
        result = await client.call_tool("test_elicitation", {"message": "who are you?"})
    assert not result.is_error, result
    assert text(result).startswith("User response: action=accept")


async def test_a_call_that_runs_as_a_gateway_task_refuses_input_requests_at_once(tmp_path: Path, env: dict[str, str]) -> None:
    """A 2026-07-28 client that takes tasks and answers elicitations: a task has no next round to carry the
    question, so the upstream hears a clear refusal at once (never an InputRequiredResult stored as a task result)."""

    async def unused(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("input requests are not relayed into tasks")

    target = gateway_stdio(config(tmp_path, stdio_upstream()), era(env, "2025-11-25"))
    async with Client(target, extensions=[CLIENT_EXTENSION], elicitation_callback=unused) as client:
        await ready(client)
        result = await client.session.call_tool("test_elicitation", {"message": "who?"}, allow_claimed=True)
    assert isinstance(result, types.CallToolResult), result
    assert "breakwater does not relay elicitation into tasks" in text(result), text(result)


async def test_a_shared_server_is_spoken_to_in_the_cheaper_revision_until_it_asks_a_client(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Every server of `serve --http` is shared. One that never asked a client anything gets the cheaper 2025-11-25
    handshake from its second start; the question it then asks still reaches the one client calling; from the next
    start it is on 2026-07-28, which ties each question to the call that asked it (`connect._protocol_memory`)."""
    asked: list[str] = []

    async def sample(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="m", stop_reason="endTurn"
        )

    path = config(tmp_path, stdio_upstream())
    revisions = []
    for start in range(3):
        async with gateway_http(tmp_path, path, env) as (url, _), Client(url, sampling_callback=sample) as client:
            revisions.append(await ready(client))
            if start:
                result = await client.call_tool("test_sampling", {"prompt": f"start {start}"})
                assert text(result) == "LLM response: forty-two", result
    assert revisions == ["2026-07-28", "2025-11-25", "2026-07-28"]
    assert asked == ["start 1", "start 2"]


@pytest.mark.parametrize("downstream", DOWNSTREAM_ERAS)
async def test_a_client_without_sampling_gets_an_error_not_a_hang(tmp_path: Path, env: dict[str, str], downstream: str) -> None:
    """A client that did not declare sampling: the upstream hears a clear refusal at once, never a silence."""
    target = gateway_stdio(config(tmp_path, stdio_upstream()), era(env, "2025-11-25"))
    async with Client(target, mode=downstream) as client:
        await ready(client)
        started = time.monotonic()
        result = await client.call_tool("test_sampling", {"prompt": "hello?"})
        elapsed = time.monotonic() - started
    assert elapsed < 3, elapsed  # the call timeout is 5 s: a relay that waited would have hit it
    assert text(result).startswith("Sampling not supported or error: breakwater: the client that made this call does not")


async def test_the_everything_server_refused_input_wrong_arguments_and_one_tool_count(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The npm `server-everything` behind the gateway, for a client without sampling or elicitation: a tool whose
    sampling (or elicitation) request was refused answers CLIENT_CANNOT_ANSWER, not TOOL_ERROR "fix the input";
    `get-sum {"a": "two"}` answers INVALID_ARGUMENTS naming `a`; and `breakwater status`, `breakwater_status` and
    tools/list agree on how many tools the server has (it lists more to a client that can sample)."""
    import json

    from conformance.node_tools import node_tools

    tools = node_tools()
    main = tools.package_main("@modelcontextprotocol/server-everything")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"everything": {"command": str(tools.node), "args": [str(main), "stdio"]}}}))
    env = dict(env, BREAKWATER_TOOL_NAME_TEMPLATE="{server}__{tool}")
    async with Client(gateway_stdio(path, env)) as client:
        await ready(client)
        listed = [t.name for t in (await client.list_tools()).tools if t.name.startswith("everything__")]
        status = (await client.call_tool("breakwater_status", {})).structured_content or {}
        for name, arguments in (("trigger-sampling-request", {"prompt": "hi"}), ("trigger-elicitation-request", {})):
            refused = await client.call_tool(f"everything__{name}", arguments)
            sc = refused.structured_content or {}
            assert refused.is_error and sc["code"] == "CLIENT_CANNOT_ANSWER", sc
            assert "does not support" in sc["reason"] and "fix the input" not in text(refused)
        wrong = await client.call_tool("everything__get-sum", {"a": "two", "b": 1})
        sc = wrong.structured_content or {}
        assert (sc["code"], sc["field"], sc["attempt"]) == ("INVALID_ARGUMENTS", "a", 0), sc
        assert "argument 'a'" in text(wrong)
    cli = subprocess.run(
        [*BREAKWATER, "status", "--config", str(path), "--json", "--wait", "30"],
        capture_output=True, text=True, env=env, timeout=90, check=False,
    )  # fmt: skip
    (row,) = json.loads(cli.stdout)["servers"]
    assert row["tools"] == status["servers"][0]["tools"] == len(listed), (row, status["servers"][0], listed)


async def test_a_client_that_leaves_mid_question_does_not_hurt_the_gateway(tmp_path: Path, env: dict[str, str]) -> None:
    """A client that disconnects while the upstream waits on its answer: the gateway keeps serving others."""
    asked = anyio.Event()

    async def never(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    path = config(tmp_path, stdio_upstream())
    async with gateway_http(tmp_path, path, era(env, "2025-11-25")) as (url, proc):
        with anyio.move_on_after(20) as scope:
            async with Client(url, mode="legacy", elicitation_callback=never) as client:
                await ready(client)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "test_elicitation", {"message": "still there?"})
                    await asked.wait()
                    tg.cancel_scope.cancel()  # and the client goes away
        assert not scope.cancelled_caught
        async with Client(url, mode="legacy") as other:
            assert text(await other.call_tool("test_simple_text", {})) == "This is a simple text response for testing."
            report = (await other.call_tool("breakwater_status", {})).structured_content or {}
            assert [s["state"] for s in report["servers"]] == ["ready"]
        assert proc.poll() is None


# ---- log messages -----------------------------------------------------------------------------------------


async def test_log_messages_follow_the_callers_set_level(tmp_path: Path, env: dict[str, str]) -> None:
    """logging/setLevel is served (and declared); an upstream's log messages during a call reach the caller, in
    order, at or above the level it set."""
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    target = gateway_stdio(config(tmp_path, stdio_upstream()), env)
    async with Client(target, mode="legacy", logging_callback=on_log) as client:
        assert client.server_capabilities.logging is not None
        await ready(client)
        assert await client.set_logging_level("debug") == types.EmptyResult()
        await client.call_tool("test_tool_with_logging", {})
        with anyio.fail_after(5):
            while len(logs) < 3:
                await anyio.sleep(0.02)
        assert [(p.level, p.data) for p in logs] == [
            ("info", "Tool execution started"),
            ("info", "Tool processing data"),
            ("info", "Tool execution completed"),
        ]
        # Named for its server, as a message outside a call is (`IdleLogs.publish`): the upstream named no logger.
        assert {p.logger for p in logs} == {"conf"}
        logs.clear()
        await client.set_logging_level("warning")
        await client.call_tool("test_tool_with_logging", {})
        # No fixed sleep: the gateway relays a call's log messages before its result, so once the
        # result is here every message the call produced has been delivered or dropped.
        assert logs == []


async def test_a_flood_of_log_messages_is_cut_and_the_caller_told_how_many_it_missed(tmp_path: Path, env: dict[str, str]) -> None:
    """A server that sends 500 log messages in one call: the caller gets the first burst in order, then what the
    rate admits, and one warning, before the result, that says how many it did not get."""
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    chatty = {"command": sys.executable, "args": ["-m", "breakwater", "testserver", "--tool", "chatty:logs=500"]}
    target = gateway_stdio(config(tmp_path, chatty), env)
    async with Client(target, mode="legacy", logging_callback=on_log) as client:
        await ready(client)
        await client.set_logging_level("debug")
        result = await client.call_tool("chatty", {})
        assert not result.is_error, result
    relayed = [p.data for p in logs if p.level == "info"]
    warnings = [str(p.data) for p in logs if p.level == "warning"]
    assert relayed[:RELAYED_LOGS_BURST] == [f"chatty: log message {n} of 500" for n in range(1, RELAYED_LOGS_BURST + 1)]
    assert RELAYED_LOGS_BURST <= len(relayed) < 500
    assert len(warnings) == 1 and logs[-1].level == "warning", "one report, after the messages, before the result"
    assert f"{500 - len(relayed)} log message(s) from 'conf' during this call were not relayed" in warnings[0]


def test_a_calls_log_allowance_is_a_burst_then_a_rate() -> None:
    clock = FakeClock()
    caller = _Caller(server="s", request=None, connection=object(), capabilities=None, clock=clock)
    assert all(caller.admit_log() for _ in range(RELAYED_LOGS_BURST))
    assert not caller.admit_log() and caller.logs_dropped == 1
    clock.advance(1 / RELAYED_LOGS_PER_S)
    assert caller.admit_log() and not caller.admit_log()
    clock.advance(3600)  # a quiet hour earns one burst, no more
    assert sum(caller.admit_log() for _ in range(2 * RELAYED_LOGS_BURST)) == RELAYED_LOGS_BURST
    assert caller.logs_dropped == 2 + RELAYED_LOGS_BURST


@pytest.mark.parametrize("level", [pytest.param("info", id="opted-in"), pytest.param(None, id="not-opted-in")])
async def test_a_2026_client_gets_log_messages_only_when_it_opts_in(
    tmp_path: Path, env: dict[str, str], level: str | None
) -> None:
    """2026-07-28 logging is opt-in per request (`_meta` logLevel): HTTP gateway, HTTP upstream."""
    logs: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(str(params.data))

    async with http_all_the_way(tmp_path, env) as url, Client(url, logging_callback=on_log, log_level=level) as client:  # type: ignore[arg-type]
        assert client.protocol_version == "2026-07-28"
        await ready(client)
        await client.call_tool("test_tool_with_logging", {})
        # The result is the sync point: the gateway relays a call's log messages before its result.
    assert logs == (["Tool execution started", "Tool processing data", "Tool execution completed"] if level else [])


# ---- resource subscriptions -------------------------------------------------------------------------------


async def upstream_subscriptions(client: Client, uri: str = OTHER) -> str:
    """What the upstream itself holds (the tool answers with its subscription set), and an update for `uri`."""
    return text(await client.call_tool("test_watch_resource_update", {"uri": uri}))


@pytest.mark.parametrize("upstream", UPSTREAM_ERAS)
async def test_resource_subscriptions_are_shared_upstream_and_end_with_the_last_session(
    tmp_path: Path, env: dict[str, str], upstream: str
) -> None:
    """Two sessions subscribe to one URI: the upstream is subscribed once and both hear each update once; the one
    that unsubscribed stops hearing them; when the last session goes away the upstream is unsubscribed (seen in
    the upstream's own subscription set, which a 2025-era upstream keeps; a 2026-07-28 one holds a listen stream).
    """
    a_updates, b_updates = ResourceUpdates(), ResourceUpdates()
    path = config(tmp_path, stdio_upstream())
    async with (
        gateway_http(tmp_path, path, era(env, upstream)) as (url, _),
        Client(url, mode="legacy", message_handler=a_updates) as a,
    ):
        assert a.server_capabilities.resources is not None and a.server_capabilities.resources.subscribe
        assert await ready(a) == expected(upstream)
        async with Client(url, mode="legacy", message_handler=b_updates) as b:
            await a.subscribe_resource(WATCHED)
            await b.subscribe_resource(WATCHED)
            await a.subscribe_resource(OTHER)
            held = await upstream_subscriptions(a, WATCHED)
            if upstream != "auto":
                assert held == f"subscribed: {sorted([OTHER, WATCHED])}"
            # Updates leave the upstream in order, on one channel: once OTHER's arrived, WATCHED's had.
            await upstream_subscriptions(a, OTHER)
            await a_updates.wait_for(OTHER)
            assert a_updates.uris == [WATCHED, OTHER]
            await b_updates.wait_for(WATCHED)

            await a.unsubscribe_resource(WATCHED)
            a_updates.uris.clear()
            b_updates.uris.clear()
            await upstream_subscriptions(a, WATCHED)
            await upstream_subscriptions(a, OTHER)
            await a_updates.wait_for(OTHER)
            assert a_updates.uris == [OTHER]
            await b_updates.wait_for(WATCHED)
        # b is gone: nobody wants WATCHED any more.
        if upstream != "auto":
            with anyio.fail_after(10):
                while await upstream_subscriptions(a) != f"subscribed: {[OTHER]}":
                    await anyio.sleep(0.1)


async def test_a_2026_client_listens_for_resource_updates(tmp_path: Path, env: dict[str, str]) -> None:
    """A 2026-07-28 client's subscriptions/listen stream carries the updates of the URIs it named, from a
    2026-07-28 HTTP upstream held on a listen stream of the gateway's own."""
    async with http_all_the_way(tmp_path, env) as url, Client(url) as client:
        assert await ready(client) == "2026-07-28"
        events: list[Any] = []
        with anyio.fail_after(15):
            async with client.listen(resource_subscriptions=[WATCHED]) as subscription:

                async def trigger() -> None:
                    await upstream_subscriptions(client, OTHER)  # not listened to: must not arrive
                    await upstream_subscriptions(client, WATCHED)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(trigger)
                    async for event in subscription:
                        events.append(event)
                        break
    assert [getattr(e, "uri", e) for e in events] == [WATCHED]


async def test_a_2026_client_is_asked_through_an_input_required_result(tmp_path: Path, env: dict[str, str]) -> None:
    """On the wire to a 2026-07-28 client: the round answers `InputRequiredResult` with the upstream's question and
    the gateway's `requestState`; the next round, carrying the answer, gets the result; a state the gateway never
    issued is refused. The upstream (2025-11-25, stdio) meanwhile waits on its server-to-client request."""

    async def unused(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("this test answers by hand")

    target = gateway_stdio(config(tmp_path, stdio_upstream()), era(env, "2025-11-25"))
    async with Client(target, elicitation_callback=unused) as client:
        assert client.protocol_version == "2026-07-28"
        await ready(client)
        arguments = {"message": "name?"}
        first = await client.session.call_tool("test_elicitation", arguments, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state
        ((key, question),) = (first.input_requests or {}).items()
        assert isinstance(question, types.ElicitRequest) and question.params.message == "name?"
        with pytest.raises(MCPError) as refused:
            await client.session.call_tool("test_elicitation", arguments, request_state="made-up", allow_input_required=True)
        assert refused.value.code == types.INVALID_PARAMS
        answer = types.ElicitResult(action="accept", content={"username": "grace", "email": "g@example.com"})
        final = await client.session.call_tool(
            "test_elicitation",
            arguments,
            input_responses={key: answer},
            request_state=first.request_state,
            allow_input_required=True,
        )
    assert isinstance(final, types.CallToolResult) and not final.is_error, final
    assert text(final) == 'User response: action=accept, content={"username": "grace", "email": "g@example.com"}'


async def test_a_2026_client_that_never_comes_back_costs_the_calls_hard_cap(tmp_path: Path, env: dict[str, str]) -> None:
    """A 2026-07-28 client that is asked and never answers: a person may be answering, so the call's timeout
    stands still, but its hard cap (`max_s`) ends it; its late round gets that outcome, and the gateway serves on."""

    async def unused(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("this test never answers")

    limits = {"BREAKWATER_CALL_TIMEOUT_S": "0.5", "BREAKWATER_CALL_MAX_S": "1.5"}
    target = gateway_stdio(config(tmp_path, stdio_upstream()), dict(era(env, "2025-11-25"), **limits))
    async with Client(target, elicitation_callback=unused) as client:
        await ready(client)
        first = await client.session.call_tool("test_elicitation", {"message": "hello?"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        await anyio.sleep(2.5)  # past the 1.5 s hard cap
        late = await client.session.call_tool(
            "test_elicitation", {"message": "hello?"}, request_state=first.request_state, allow_input_required=True
        )
        assert isinstance(late, types.CallToolResult) and late.is_error
        # A tool that may have side effects and was cut off: the gate calls its outcome unknown.
        assert code_of(late) in ("TIMEOUT", "OUTCOME_UNKNOWN"), late
        assert text(await client.call_tool("test_simple_text", {})) == "This is a simple text response for testing."
