"""The `Breakwater` object's life cycle and the checks of a library caller's input, against real testservers.

Entering on an event loop breakwater's stdio transport cannot run on, using the object after its `async with`
ended, leaving it twice; and what `call_tool`, `budget` and `from_config` say to a caller who passed something
they cannot take. tests/gate/test_gate_real_servers.py has the first of these (entered once, no calls outside).
"""

from __future__ import annotations

import collections.abc
import math
import subprocess
import sys
import types
import typing
from pathlib import Path

import anyio
import pytest
from mcp.server.mcpserver import MCPServer

import breakwater
from breakwater import Breakwater, Config, ConfigError, ConnectPolicy, ServerSpec, ServerState
from breakwater.config import RetryPolicy
from breakwater.testing import in_memory
from breakwater.testing.server import count_ledger, launch_command, serve_http
from helpers import code_of, isolated_env

FAST_CONNECT = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=20, attempt_timeout_s=15)
FAST_RETRY = RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05)


def stdio(name: str, *flags: str, enabled: bool = True) -> ServerSpec:
    cmd = launch_command("--name", name, *flags)
    return ServerSpec(
        name=name, transport="stdio", command=cmd[0], args=tuple(cmd[1:]), enabled=enabled, connect=FAST_CONNECT, retry=FAST_RETRY
    )


def unopened(tmp_path: Path, *specs: ServerSpec) -> Breakwater:
    return Breakwater(Config(servers=specs), admission_dir=tmp_path / "admission", journal=None)


async def wait_all_ready(bw: Breakwater) -> None:
    report = await bw.wait_ready(timeout=30)
    assert all(s.state is ServerState.READY for s in report.servers if s.state is not ServerState.DISABLED), report.to_json()


# ---- the event loop --------------------------------------------------------------------------


def test_stdio_servers_under_trio_are_refused_at_enter_saying_how_to_run_on_asyncio(tmp_path: Path) -> None:
    """Under trio every stdio server failed with "protocol error: RuntimeError: no running event loop" and was retried
    forever, blamed on the server: breakwater's stdio transport is asyncio's. Entering now says so, at once."""
    pytest.importorskip("trio")
    bw = unopened(tmp_path, stdio("files"))

    async def main() -> None:
        async with bw:
            pass

    with pytest.raises(RuntimeError) as info:
        anyio.run(main, backend="trio")
    said = str(info.value)
    assert "stdio servers on asyncio only" in said and "trio" in said and "files" in said, said
    assert "anyio.run(main)" in said and "asyncio.run(main())" in said, said


def test_http_servers_and_in_memory_transports_keep_working_under_trio(tmp_path: Path) -> None:
    """Only stdio servers on breakwater's own transport need asyncio: an HTTP server (beside a disabled stdio one) and a
    stdio entry reached through `breakwater.testing.in_memory` are called, and a call cancelled, under trio as under
    asyncio."""
    pytest.importorskip("trio")
    shop = MCPServer("shop")

    @shop.tool()
    async def search(q: str) -> str:
        return f"found {q}"

    async def main() -> tuple[bool, bool]:
        async with serve_http("--tool", "echo:readonly", "--tool", "slow:latency=30,readonly") as server:
            http = ServerSpec(name="web", transport="http", url=server.url, connect=FAST_CONNECT, retry=FAST_RETRY)
            async with unopened(tmp_path, http, stdio("off", enabled=False)) as bw:
                await wait_all_ready(bw)
                over_http = await bw.call_tool("web", "echo", {"a": 1})
                # The caller's own cancel scope ends a call as on asyncio (it raised "no running event loop").
                with anyio.move_on_after(0.5) as scope:
                    await bw.call_tool("web", "slow", {})
                assert scope.cancelled_caught
        memory = ServerSpec(name="shop", transport="stdio", command="not-used-in-memory", connect=FAST_CONNECT)
        async with Breakwater(Config(servers=(memory,)), transports=in_memory(shop), journal=None) as bw:
            await wait_all_ready(bw)
            in_process = await bw.call_tool("shop", "search", {"q": "boots"})
        return over_http.is_error, in_process.is_error

    async def bounded() -> tuple[bool, bool]:
        with anyio.fail_after(60):
            return await main()

    assert anyio.run(bounded, backend="trio") == (False, False)


# ---- after the `async with` ------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("servers", [1, 0], ids=["a-server", "no-server"])
async def test_status_and_wait_changed_raise_after_close_and_a_waiter_wakes_at_close(tmp_path: Path, servers: int) -> None:
    """After `async with` ended, `status()` still said "ready" for servers it had stopped, and `wait_changed()` waited
    forever, in a waiter blocked in it at the close too. Now both raise as `call_tool` does, the waiter at once; also
    when no server changes state at the close (none configured: a config being written, a test's)."""
    bw = unopened(tmp_path, *[stdio("s")][:servers])
    heard: list[BaseException] = []

    async def waiter() -> None:
        try:
            while True:  # a change on the way (a tool list refreshed) wakes it too: it waits again
                await bw.wait_changed()
        except RuntimeError as exc:
            heard.append(exc)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg, bw:  # the waiter's task group outlives `bw`
            await wait_all_ready(bw)
            assert [s.state for s in bw.status().servers] == [ServerState.READY] * servers  # inside, as ever
            tg.start_soon(waiter)
            await anyio.sleep(0.1)
    assert len(heard) == 1 and "after its `async with` ended" in str(heard[0]), heard
    with pytest.raises(RuntimeError, match="after its `async with` ended"):
        bw.status()
    with pytest.raises(RuntimeError, match="after its `async with` ended"):
        await bw.wait_changed()


@pytest.mark.anyio
async def test_leaving_twice_or_never_entered_says_so(tmp_path: Path) -> None:
    """A second `__aexit__` raised a bare AssertionError (`assert self._tg is not None`)."""
    bw = unopened(tmp_path, stdio("s"))
    with pytest.raises(RuntimeError, match="never entered"):
        await bw.__aexit__(None, None, None)
    async with bw:
        pass
    with pytest.raises(RuntimeError, match="closed already"):
        await bw.__aexit__(None, None, None)


# ---- a library caller's input ----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_bad_operation_id_is_raised_before_anything_is_sent_whatever_the_tool(tmp_path: Path) -> None:
    """It was judged by the tool: INVALID_ARGUMENTS for one that changes things, dropped unsaid for a read-only one.
    Now `call_tool` raises as for its other bad arguments (TypeError for no string, ValueError for what
    `_wire.operation_id_problem` refuses), while the gateway's path (`gate_call`: ids the model sent) still answers
    INVALID_ARGUMENTS."""
    ledger = tmp_path / "ledger.jsonl"
    tools = ("--tool", "order:mutating,idempotent", "--tool", "look:readonly")
    bw = unopened(tmp_path, stdio("s", *tools, "--ledger", str(ledger)))
    async with bw:
        await wait_all_ready(bw)
        for tool in ("order", "look"):
            for bad in ("", "x" * 256):
                with pytest.raises(ValueError, match="operation id must be a non-empty string of at most 255"):
                    await bw.call_tool("s", tool, {}, operation_id=bad)
            with pytest.raises(TypeError, match="operation_id must be a string, got int"):
                await bw.call_tool("s", tool, {}, operation_id=123)  # type: ignore[arg-type]
        assert count_ledger(ledger) == 0
        assert bw.gate_status()["in_flight"] == {"s": 0}
        # What `_wire.operation_id_problem` takes is taken: the longest, and one of a space.
        for good in ("x" * 255, " "):
            result = await bw.call_tool("s", "order", {}, operation_id=good)
            assert not result.is_error and result.structured_content is not None, result
            assert result.structured_content["operation_id"] == good
        # The gateway's path, for an id a downstream agent sent: a result the model reads, not an exception.
        refused = await bw.gate_call("s", "order", {}, progress_callback=None, operation_id="")
        assert code_of(refused) == "INVALID_ARGUMENTS"
    assert count_ledger(ledger) == 2


@pytest.mark.anyio
async def test_a_plain_function_is_a_progress_callback_to_the_type_checker_too(tmp_path: Path) -> None:
    """The docstring and `_guarded` take a plain (not async) function, but the annotation said `Awaitable[None]`:
    `mypy --strict` refused the call below (this file is checked by it)."""
    hint = typing.get_type_hints(Breakwater.call_tool)["progress_callback"]
    callback = next(a for a in typing.get_args(hint) if typing.get_origin(a) is collections.abc.Callable)
    returns = typing.get_args(callback)[-1]
    assert typing.get_origin(returns) in (typing.Union, types.UnionType) and type(None) in typing.get_args(returns), hint

    seen: list[tuple[float, float | None, str | None]] = []

    def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with unopened(tmp_path, stdio("s", "--tool", "slow:latency=1,progress=0.2,readonly")) as bw:
        await wait_all_ready(bw)
        result = await bw.call_tool("s", "slow", {}, progress_callback=on_progress)
    assert not result.is_error, result
    assert seen, "no progress reached the plain callback"


@pytest.mark.anyio
@pytest.mark.parametrize("seconds", [math.nan, -1.0])
async def test_a_budget_that_is_no_number_of_seconds_says_what_it_must_be(tmp_path: Path, seconds: float) -> None:
    """NaN was refused as "a budget cannot be negative: nan"."""
    bw = unopened(tmp_path)
    with pytest.raises(ValueError, match=r"a budget must be a number of seconds, 0 or more: got (nan|-1\.0)"):
        bw.budget(seconds=seconds)


def test_from_config_without_a_file_says_to_pass_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "pass --config PATH", a flag of the command line; the command line still says that."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        Breakwater.from_config()
    said = str(info.value)
    assert "Breakwater.from_config(PATH)" in said and "--config" not in said, said
    assert "no breakwater.toml or .mcp.json in" in said, said
    argv = [sys.executable, "-m", "breakwater", "config", "check"]
    cli = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=isolated_env(tmp_path), timeout=60, check=False)
    assert cli.returncode == 2 and "fix: pass --config PATH" in cli.stderr, cli.stderr


def test_the_package_docstring_names_deadline_scope() -> None:
    """`DeadlineScope` is in `__all__` but the docstring's list of what is exported left it out."""
    assert breakwater.__doc__ is not None and "`DeadlineScope`" in breakwater.__doc__
