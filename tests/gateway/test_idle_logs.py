"""An upstream's log messages sent outside any call: in the gateway's log, and relayed to the sessions that see it.

Real parts only: `breakwater serve` (stdio, or sessions of a shared gateway) in front of `breakwater testserver
--idle-logs N`, which sends N log messages (info and warning in turn) after each call has answered, and the SDK's
client recording the log notifications it gets. The upstream connection speaks 2025-11-25: 2026-07-28 has no
channel for a server's log messages outside a request.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from breakwater.gateway._log_relay import FLOOD_QUIET_S, RELAYED_LOGS_BURST, RELAYED_LOGS_PER_S
from breakwater.testing.server import launch_command
from helpers import eventually, isolated_env, share_dir

# The logging API is deprecated at 2026-07-28; its 2025 path is what is tested.
pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

BREAKWATER = [sys.executable, "-m", "breakwater"]
SECRET = "sk-idle-0123456789abcdef"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield isolated_env(tmp_path, BREAKWATER_PROTOCOL="2025-11-25")


def entry(count: int, name: str = "idler", **more: Any) -> dict[str, Any]:
    cmd = launch_command("--idle-logs", str(count), "--name", name, "--tool", "echo")
    return {"command": cmd[0], "args": cmd[1:], **more}


def write_config(tmp_path: Path, servers: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


class Logs:
    """The log notifications a client got, in order."""

    def __init__(self) -> None:
        self.got: list[types.LoggingMessageNotificationParams] = []

    async def __call__(self, params: types.LoggingMessageNotificationParams) -> None:
        self.got.append(params)

    def data(self, logger: str | None = None) -> list[str]:
        return [str(p.data) for p in self.got if logger is None or p.logger == logger]


@asynccontextmanager
async def serve(config: Path, env: dict[str, str], errlog: Path, logs: Logs) -> AsyncIterator[Client]:
    """A `breakwater serve` session (its stderr written to `errlog`) seen by a 2025-11-25 client recording log messages."""
    params = StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)
    with errlog.open("w") as err:
        async with Client(stdio_client(params, errlog=err), mode="legacy", logging_callback=logs) as client:
            yield client


async def call(client: Client, name: str) -> None:
    """Call `name` once its server is up (the gateway answers SERVER_CONNECTING before)."""
    with anyio.fail_after(30):
        while True:
            result = await client.call_tool(name, {})
            if (result.structured_content or {}).get("code") != "SERVER_CONNECTING":
                assert not result.is_error, result
                return
            await anyio.sleep(0.1)


async def test_an_idle_log_reaches_the_client_named_for_its_server_and_shows_in_the_gateways_stderr(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The messages come after the call answered: the client gets both, `logger` naming the server, the config's
    secret redacted; the warning is in `serve`'s stderr, naming the server (its info is below the log's level)."""
    name = f"idler-{SECRET}"  # the server speaks of a configured secret in every message
    config = write_config(tmp_path, {"files": entry(2, name, env={"IDLER_API_KEY": SECRET})})
    logs = Logs()
    async with serve(config, env, tmp_path / "stderr", logs) as client:
        await client.set_logging_level("debug")
        await call(client, "files__echo")
        await eventually(lambda: len(logs.got) >= 2, timeout=10)
    assert [(p.level, p.data) for p in logs.got] == [
        ("info", "idler-<redacted>: idle log message 1 of 2"),
        ("warning", "idler-<redacted>: idle log message 2 of 2"),
    ]
    assert {p.logger for p in logs.got} == {"files/idler-<redacted>"}
    stderr = (tmp_path / "stderr").read_text()
    assert "upstream 'files' (warning, logger 'idler-<redacted>'): idler-<redacted>: idle log message 2 of 2" in stderr
    assert "idle log message 1 of 2" not in stderr
    assert SECRET[:8] not in stderr


async def test_an_idle_log_below_the_clients_level_is_not_relayed(tmp_path: Path, env: dict[str, str]) -> None:
    """At `warning`, the client gets the warnings and none of the info messages sent before each of them."""
    config = write_config(tmp_path, {"files": entry(4)})
    logs = Logs()
    async with serve(config, env, tmp_path / "stderr", logs) as client:
        await client.set_logging_level("warning")
        await call(client, "files__echo")
        await eventually(lambda: len(logs.got) >= 2, timeout=10)
        await call(client, "files__echo")  # a round trip more for any info message on its way
        await eventually(lambda: len(logs.got) >= 4, timeout=10)
    assert [p.level for p in logs.got] == ["warning"] * 4
    assert logs.data() == [f"idler: idle log message {n} of 4" for n in (2, 4, 2, 4)]


async def test_a_flood_of_idle_logs_is_cut_and_the_cut_said_once(tmp_path: Path, env: dict[str, str]) -> None:
    """500 messages at once: the client gets the first burst in order, the rest cut, and one warning saying how
    many it did not get; the gateway's stderr says it once too."""
    config = write_config(tmp_path, {"files": entry(500)})
    logs = Logs()
    async with serve(config, env, tmp_path / "stderr", logs) as client:
        await client.set_logging_level("debug")
        await call(client, "files__echo")
        await eventually(lambda: bool(logs.data("breakwater")), timeout=15)
        await anyio.sleep(2 * FLOOD_QUIET_S)  # the report is not repeated
    relayed = logs.data("files/idler")
    reports = logs.data("breakwater")
    assert relayed[:RELAYED_LOGS_BURST] == [f"idler: idle log message {n} of 500" for n in range(1, RELAYED_LOGS_BURST + 1)]
    assert RELAYED_LOGS_BURST <= len(relayed) < 250, len(relayed)
    assert len(reports) == 1 and logs.got[-1].level == "warning", reports
    why = f"it sent more than {RELAYED_LOGS_BURST} at once, then more than {RELAYED_LOGS_PER_S:g} a second"
    assert reports[0] == (
        f"breakwater: {500 - len(relayed)} log message(s) from 'files' outside any call were not relayed: {why}"
    )
    stderr = (tmp_path / "stderr").read_text()
    assert stderr.count("log message(s) outside any call not relayed") == 1
    assert f"upstream 'files': {500 - len(relayed)} log message(s) outside any call not relayed: {why}" in stderr


async def test_a_log_inside_a_call_reaches_its_caller_with_the_servers_secret_redacted(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A message sent while the call runs goes to that call's caller, as the upstream sent it but for a configured
    secret, which the caller never sees (outside calls the same holds: the first test)."""
    tool = f"leak-{SECRET}"
    cmd = launch_command("--tool", f"{tool}:logs=2")
    config = write_config(tmp_path, {"files": {"command": cmd[0], "args": cmd[1:], "env": {"IDLER_API_KEY": SECRET}}})
    logs = Logs()
    async with serve(config, env, tmp_path / "stderr", logs) as client:
        await client.set_logging_level("debug")
        await call(client, f"files__{tool}")
    assert logs.data() == [f"leak-<redacted>: log message {n} of 2" for n in (1, 2)]


@pytest.fixture
def share() -> Iterator[Path]:
    with share_dir("bw-il-") as directory:
        yield directory


async def test_a_shared_gateway_relays_a_sessions_own_server_to_it_alone_and_a_shared_one_to_every_session(
    tmp_path: Path, env: dict[str, str], share: Path
) -> None:
    """Two sessions of one shared gateway: each runs its own process of `mine`, and one `common` serves both.
    What A's own process logs reaches A alone; what `common` logs reaches both; the gateway's log has each."""
    config = write_config(tmp_path, {"mine": entry(2, "mine"), "common": entry(2, "common", shared=True)})
    env = dict(env, BREAKWATER_SHARE="on", BREAKWATER_SHARE_DIR=str(share), BREAKWATER_SHARE_IDLE_S="20")
    a_logs, b_logs = Logs(), Logs()
    async with serve(config, env, tmp_path / "a.err", a_logs) as a, serve(config, env, tmp_path / "b.err", b_logs) as b:
        for client in (a, b):
            await client.set_logging_level("debug")
            await call(client, "breakwater_status")
            await client.list_tools()  # the tools in view: what makes a session hear their servers
        await call(a, "mine__echo")
        await eventually(lambda: len(a_logs.data("mine/mine")) >= 2, timeout=10)
        await call(a, "common__echo")
        await eventually(lambda: len(a_logs.data("common/common")) >= 2 and len(b_logs.data("common/common")) >= 2)
        await call(b, "breakwater_status")  # a round trip more for any message of A's process on its way to B
    assert a_logs.data("mine/mine") == ["mine: idle log message 1 of 2", "mine: idle log message 2 of 2"]
    assert b_logs.data("mine/mine") == []
    assert (
        b_logs.data("common/common")
        == a_logs.data("common/common")
        == [
            "common: idle log message 1 of 2",
            "common: idle log message 2 of 2",
        ]
    )
    (log,) = share.glob("gw-*.log")
    text = log.read_text()
    assert "upstream 'mine' (warning, logger 'mine'): mine: idle log message 2 of 2" in text
    assert "upstream 'common' (warning, logger 'common'): common: idle log message 2 of 2" in text
