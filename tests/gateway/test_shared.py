"""Stdio `breakwater serve` sessions attached to one shared local gateway: real sessions, a real HTTP upstream.

Every session here is a real `breakwater serve` process driven by the SDK's client; the gateway
they attach to is the real detached `breakwater gateway run`; the upstream is `breakwater
testserver` over streamable HTTP, whose state file counts its handshakes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from breakwater.testing.server import launch_command, read_state
from helpers import (
    ResourceUpdates,
    ask_gateway,
    called_once_up,
    code_of,
    eventually,
    gateway_pids,
    lingering_server,
    serve_on_pipes,
    share_dir,
)

pytestmark = [pytest.mark.long_module(86), pytest.mark.anyio, pytest.mark.plain_gateway]

BREAKWATER = [sys.executable, "-m", "breakwater"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, Path]]:
    """One HTTP testserver for the module: (its MCP URL, its state file)."""
    directory = Path(tempfile.mkdtemp(prefix="bw-up-"))
    port_file, state = directory / "port", directory / "state.json"
    cmd = launch_command("--port", "0", "--port-file", str(port_file), "--state-file", str(state), "--default-tools")
    tools = ["--tool", "order:latency=3,mutating,destructive", "--tool", "peek:latency=2,readonly"]
    proc = subprocess.Popen([*cmd, *tools], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "the testserver did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp", state
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def share() -> Iterator[Path]:
    """A socket directory of the test's own; its gateways die after."""
    with share_dir("bw-sh-") as directory:
        yield directory


def env_for(tmp_path: Path, share: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "BREAKWATER_SHARE": "on",
        "BREAKWATER_SHARE_DIR": str(share),
        "BREAKWATER_SHARE_IDLE_S": "20",
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "admission"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        # The upstream's handshake count is how these tests count connections: every connect must probe
        # (a remembered 2026-07-28 server is pinned without one, `breakwater.connect._protocol_memory`).
        "BREAKWATER_PROTOCOL_MEMORY_DIR": "off",
        **extra,
    }


def write_config(tmp_path: Path, url: str, name: str = "mcp.json", **more: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"mcpServers": {"web": {"type": "http", "url": url}, **more}}))
    return path


@asynccontextmanager
async def session(config: Path, env: dict[str, str], *flags: str, errlog: TextIO = sys.stderr) -> AsyncIterator[Client]:
    """A real `breakwater serve` session, its stderr to `errlog`."""
    params = StdioServerParameters(
        command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config), *flags], env=env
    )
    async with Client(stdio_client(params, errlog=errlog)) as client:
        yield client


def handshakes(state: Path) -> int:
    return int(read_state(state)["handshakes"])


def pid_of(result: types.CallToolResult) -> int:
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return int(result.structured_content["pid"])


async def test_sessions_of_one_config_share_one_gateway_and_one_upstream_connection(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    url, state = upstream
    config = write_config(tmp_path, url)
    other = write_config(tmp_path, url, "other.json", web2={"type": "http", "url": url})
    env = env_for(tmp_path, share)
    before = handshakes(state)
    imports = tmp_path / "b-imports.txt"
    with imports.open("w") as b_err:
        async with session(config, env) as a, session(config, {**env, "PYTHONPROFILEIMPORTTIME": "1"}, errlog=b_err) as b:
            await shared_by_both(a, b, state, before)
            async with session(other, env) as c:
                await another_config(c, config, env, share, state, before)
    # An attached session never loads the SDK (what keeps its launch quick): its relay does not need it.
    loaded = [line.rsplit("|", 1)[-1].strip() for line in imports.read_text().splitlines() if line.startswith("import time:")]
    assert "breakwater.gateway._pump" in loaded
    assert not [m for m in loaded if m == "mcp" or m.startswith(("mcp.", "mcp_types"))]
    # Socket and directory are the user's only.
    assert oct(share.stat().st_mode & 0o777) == "0o700"
    assert [oct(s.stat().st_mode & 0o777) for s in share.glob("*.sock")] == ["0o600", "0o600"]


async def shared_by_both(a: Client, b: Client, state: Path, before: int) -> None:
    """Two sessions of one config: one gateway, one upstream connection, each its own session."""
    names_a = {t.name for t in (await a.list_tools()).tools}
    names_b = {t.name for t in (await b.list_tools()).tools}
    assert "web__echo" in names_a and names_a == names_b
    assert pid_of(await a.call_tool("web__echo", {"text": "a"})) == pid_of(await b.call_tool("web__echo", {"text": "b"}))
    assert handshakes(state) - before == 1  # two sessions, one upstream connection
    await isolated(a, b)


async def another_config(c: Client, config: Path, env: dict[str, str], share: Path, state: Path, before: int) -> None:
    """Another config never attaches to the first one's gateway: its session has a gateway of its own."""
    assert "web2__echo" in {t.name for t in (await c.list_tools()).tools}
    await eventually(lambda: handshakes(state) - before >= 3, timeout=20)
    assert handshakes(state) - before == 3  # its gateway's own two servers
    # The user's two views, run side by side: `gateway list` and `status`.
    commands = [["gateway", "list", "--json"], ["status", "--json", "--config", str(config)]]
    procs = [subprocess.Popen([*BREAKWATER, *cmd], env=env, stdout=subprocess.PIPE, text=True) for cmd in commands]
    listed, status = (p.communicate(timeout=60)[0] for p in procs)
    gateways = json.loads(listed)
    assert sorted(g["sessions"] for g in gateways) == [1, 2], listed
    assert {g["event_loop"] for g in gateways} == {"uvloop"}  # `[gateway] event_loop = "auto"`, uvloop installed
    shown = json.loads(status)
    assert shown["shared_gateway"]["sessions"] == 2
    assert shown["shared_gateway"]["pid"] in [g["pid"] for g in gateways if g["sessions"] == 2]
    assert [s["state"] for s in shown["servers"]] == ["ready"]
    refusals(share)


async def isolated(a: Client, b: Client) -> None:
    """Each session keeps its own cancellations and progress: a cancels its call, b's goes on with its progress."""
    progress_a: list[float] = []
    progress_b: list[float] = []

    async def on_a(progress: float, total: float | None, message: str | None) -> None:
        progress_a.append(progress)

    async def on_b(progress: float, total: float | None, message: str | None) -> None:
        progress_b.append(progress)

    slow: list[types.CallToolResult] = []
    async with anyio.create_task_group() as tg:

        async def slow_b() -> None:
            slow.append(await b.call_tool("web__slow", {}, progress_callback=on_b))

        tg.start_soon(slow_b)
        with anyio.move_on_after(0.5):  # a's own call, cancelled by a
            await a.call_tool("web__hang", {}, progress_callback=on_a)
    assert not slow[0].is_error
    assert progress_b and not progress_a
    assert not (await a.call_tool("web__echo", {"text": "after"})).is_error  # a's session goes on


def refusals(share: Path) -> None:
    """A gateway refuses another config's fingerprint, another version, and (as root, tried) another user."""
    sock = next(share.glob("gw-*.sock"))
    info = ask_gateway(sock, {"breakwater": "info"})
    assert info is not None
    wrong = ask_gateway(sock, {"breakwater": "attach", "fingerprint": "0" * 32, "version": info["version"]})
    assert wrong is not None and not wrong["ok"] and "another config" in wrong["reason"]
    old = ask_gateway(sock, {"breakwater": "attach", "fingerprint": info["fingerprint"], "version": "0.0.1"})
    assert old is not None and not old["ok"] and "restart it" in old["reason"]
    if os.getuid() == 0:  # as root, also try it as another user: the 0700 directory keeps them out
        probe = f"socket.socket(socket.AF_UNIX).connect({str(sock)!r})"
        as_nobody = subprocess.run(
            [sys.executable, "-c", f"import os, socket; os.setgid(65534); os.setuid(65534); {probe}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert as_nobody.returncode != 0 and "PermissionError" in as_nobody.stderr


async def test_failover_after_kill_answers_the_call_in_flight_serves_again_and_idles_out(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    url, _ = upstream
    config = write_config(tmp_path, url)
    env = env_for(tmp_path, share, BREAKWATER_SHARE_IDLE_S="0.5")
    async with session(config, env) as a:
        first = pid_of(await a.call_tool("web__echo", {"text": "a"}))
        assert "web__peek" in {t.name for t in (await a.list_tools()).tools}  # the session learns peek only reads
        [gateway] = gateway_pids(share)
        answers: dict[str, types.CallToolResult] = {}
        async with anyio.create_task_group() as tg:

            async def call(tool: str) -> None:
                answers[tool] = await a.call_tool(tool, {})

            tg.start_soon(call, "web__order")
            tg.start_soon(call, "web__peek")
            await anyio.sleep(0.5)  # both calls are in flight upstream
            os.kill(gateway, signal.SIGKILL)
            with anyio.fail_after(10):  # answered, not hung
                await eventually(lambda: "web__order" in answers, timeout=10)
            with anyio.fail_after(30):  # the read is sent again to the new gateway, and answered
                await eventually(lambda: "web__peek" in answers, timeout=30)
        assert code_of(answers["web__order"]) == "OUTCOME_UNKNOWN"  # the mutating call is never repeated
        assert pid_of(answers["web__peek"]) == first
        # The session attached to a new gateway: calls (and lists) go on, to the same upstream.
        with anyio.fail_after(30):
            assert pid_of(await a.call_tool("web__echo", {"text": "again"})) == first
        assert "web__echo" in {t.name for t in (await a.list_tools()).tools}
        [second] = gateway_pids(share)
        assert second != gateway
    # With no session left, the gateway exits after its idle time, and takes its socket along.
    await eventually(lambda: gone(second), timeout=20)
    assert not list(share.glob("*.sock"))


def gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie, not yet reaped by the session that started it, counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z"


async def test_stdio_servers_run_per_session_unless_shared_and_no_share_runs_alone(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    url, state = upstream
    cmd = launch_command("--name", "local")
    config = write_config(tmp_path, url, "stdio.json", local={"command": cmd[0], "args": cmd[1:]})
    env = env_for(tmp_path, share)
    before = handshakes(state)
    async with session(config, env) as a, session(config, env) as b:
        # One gateway, one HTTP connection, but a stdio process of each session's own.
        assert pid_of(await a.call_tool("web__echo", {"text": "a"})) == pid_of(await b.call_tool("web__echo", {"text": "b"}))
        assert pid_of(await a.call_tool("local__echo", {"text": "a"})) != pid_of(await b.call_tool("local__echo", {"text": "b"}))
        assert {"local__echo", "web__echo"} <= {t.name for t in (await b.list_tools()).tools}
        assert handshakes(state) - before == 1 and len(gateway_pids(share)) == 1
    # `"shared": true` on the entry: one process of it for every session (the knob's way is tested below).
    shared = write_config(tmp_path, url, "shared.json", local={"command": cmd[0], "args": cmd[1:], "shared": True})
    async with session(shared, env) as a, session(shared, env) as b:
        assert pid_of(await a.call_tool("local__echo", {"text": "a"})) == pid_of(await b.call_tool("local__echo", {"text": "b"}))
    for pid in gateway_pids(share):
        os.kill(pid, signal.SIGKILL)
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    alone = subprocess.run(
        [*BREAKWATER, "serve", "--no-share", "--config", str(config)],
        input=json.dumps(init) + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(alone.stdout.splitlines()[0])["result"]["serverInfo"]["name"] == "breakwater"
    assert not gateway_pids(share)  # --no-share served on its own, with no shared gateway


async def test_a_share_dir_too_deep_for_a_socket_serves_the_session_alone_and_says_which_knob(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """A Unix socket's path holds at most ~107 bytes: a deeper share directory (or XDG_RUNTIME_DIR) cannot
    hold the gateway's socket. The session is served all the same, on its own, and says what to set."""
    url, _state = upstream
    config = write_config(tmp_path, url)
    deep = share / ("d" * 120)
    err = tmp_path / "stderr.txt"
    with err.open("w") as errlog:
        async with session(config, env_for(tmp_path, deep), errlog=errlog) as alone:
            assert pid_of(await alone.call_tool("web__echo", {"text": "a"}))
    said = err.read_text()
    assert "serving this session on its own" in said and "BREAKWATER_SHARE_DIR" in said, said
    assert "Traceback" not in said and not list(deep.glob("gw-*")), said


@pytest.mark.parametrize("where", ["a file", "under a file"])
async def test_a_share_dir_that_is_no_directory_serves_the_session_alone_and_says_which_knob(
    tmp_path: Path, share: Path, upstream: tuple[str, Path], where: str
) -> None:
    """`BREAKWATER_SHARE_DIR=~/notes.txt` said only "[Errno 17] File exists: '/home/me/notes.txt'"."""
    url, _state = upstream
    config = write_config(tmp_path, url)
    blocker = share / "notes.txt"
    blocker.write_text("mine")
    named = blocker if where == "a file" else blocker / "gateways"
    err = tmp_path / "stderr.txt"
    with err.open("w") as errlog:
        async with session(config, env_for(tmp_path, named), errlog=errlog) as alone:
            assert pid_of(await alone.call_tool("web__echo", {"text": "a"}))
    said = " ".join(err.read_text().split())
    why = "it is a file" if where == "a file" else "a part of its path is a file"
    assert f"serving this session on its own: the shared gateway's directory {named} cannot be used ({why})" in said, said
    assert "set [gateway] share_dir (BREAKWATER_SHARE_DIR) to a directory of your own" in said, said
    assert blocker.read_text() == "mine"


_WHERE_SERVER = """
import json, os
from mcp.server.mcpserver import MCPServer

server = MCPServer("where")


@server.tool()
def where() -> str:
    return json.dumps({"cwd": os.getcwd(), "path": os.environ.get("PATH"), "marker": os.environ.get("BW_MARKER"),
                       "entry": os.environ.get("FROM_ENTRY"), "pid": os.getpid(),
                       "bulk": sum(len(v) for k, v in os.environ.items() if k.startswith("BW_BULK_"))})


server.run("stdio")
"""


def repo_with(repo: Path, command: str, script: str) -> Path:
    """A directory standing for an agent's repository, with `command` (a shell `script`) in its `bin`."""
    (repo / "bin").mkdir(parents=True)
    launcher = repo / "bin" / command
    launcher.write_text(f"#!/bin/sh\n{script}\n")
    launcher.chmod(0o755)
    return repo


async def test_a_sessions_own_stdio_server_runs_in_its_directory_with_its_environment(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """Two agents in two repositories, one config: one gateway (one HTTP connection), and each session's stdio
    server started where that session runs, found on that session's PATH, as a `serve` of its own would start it.

    One of them runs in a large environment (a Nix shell's, a CI job's: 400 KB here): its handshake carries it all,
    and it was cut at 64 KiB; that session served itself, told "not a breakwater session"."""
    url, state = upstream
    script = tmp_path / "where_server.py"
    script.write_text(_WHERE_SERVER)
    entry = {"command": "where-server", "env": {"FROM_ENTRY": "e"}}  # found on each session's own PATH
    config = write_config(tmp_path, url, where=entry)
    repos = {name: repo_with(tmp_path / name, "where-server", f"exec {sys.executable} {script}") for name in ("repo-a", "repo-b")}
    base = env_for(tmp_path, share)
    before = handshakes(state)

    # In pieces: one variable may hold at most 128 KiB (the kernel's MAX_ARG_STRLEN), the environment megabytes.
    bulk = {f"BW_BULK_{i}": "x" * 100_000 for i in range(4)}

    def params(repo: Path) -> StdioServerParameters:
        env = {**base, "PATH": f"{repo / 'bin'}{os.pathsep}{base['PATH']}", "BW_MARKER": repo.name}
        if repo.name == "repo-b":
            env |= bulk
        args = [*BREAKWATER[1:], "serve", "--config", str(config)]
        return StdioServerParameters(command=BREAKWATER[0], args=args, env=env, cwd=str(repo))

    seen = {}
    async with Client(params(repos["repo-a"])) as a, Client(params(repos["repo-b"])) as b:
        for name, client in (("repo-a", a), ("repo-b", b)):
            result = await client.call_tool("where__where", {})
            assert not result.is_error, result
            block = result.content[0]
            assert isinstance(block, types.TextContent)
            seen[name] = json.loads(block.text)
        assert pid_of(await a.call_tool("web__echo", {"text": "a"})) == pid_of(await b.call_tool("web__echo", {"text": "b"}))
        assert len(gateway_pids(share)) == 1 and handshakes(state) - before == 1
    for name, repo in repos.items():
        assert Path(seen[name]["cwd"]).resolve() == repo.resolve()
        assert seen[name]["path"].split(os.pathsep)[0] == str(repo / "bin")
        assert seen[name]["entry"] == "e"  # the entry's env, over the session's
        # The session's environment, as a `serve --no-share` of its own gives its servers ([connect] inherit_env = "all").
        assert seen[name]["marker"] == name
    assert (seen["repo-a"]["bulk"], seen["repo-b"]["bulk"]) == (0, 400_000)
    assert seen["repo-a"]["pid"] != seen["repo-b"]["pid"]
    # The sessions' environments went to their servers and nowhere else: not to the gateway's log.
    logged = "".join(log.read_text(errors="replace") for log in share.glob("gw-*.log"))
    assert "repo-a" not in logged and "repo-b" not in logged


async def test_a_first_list_shows_at_once_the_tools_another_session_just_learned(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """Agents started together, one config: one session's own process of a stdio server is slow to come up (queued
    behind the machine's spawn cap, or slow to start), another session's is ready. The slow session's first
    tools/list waits for servers on their way; it must be answered with that server's tools (last known, from the
    shared catalog) as soon as another session's process listed them, not after list_wait_s without them: a client
    that reads the list once would conclude the tool does not exist (seen with 6 cold Inspector one-shots: 2 failed)."""
    url, _ = upstream
    cmd = launch_command("--name", "local")
    config = write_config(tmp_path, url, local={"command": "local-server"})  # found on each session's own PATH
    base = env_for(tmp_path, share, BREAKWATER_LIST_WAIT_S="90")
    repos = {
        name: repo_with(tmp_path / name, "local-server", f"sleep {delay}\nexec {shlex.join(cmd)}")
        for name, delay in (("slow", "600"), ("fast", "0"))
    }

    def params(repo: Path) -> StdioServerParameters:
        env = {**base, "PATH": f"{repo / 'bin'}{os.pathsep}{base['PATH']}"}
        return StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)

    slow_list: dict[str, Any] = {}
    async with Client(params(repos["slow"])) as slow:

        async def first_list() -> None:
            slow_list["names"] = {t.name for t in (await slow.list_tools()).tools}
            slow_list["at"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(first_list)
            await anyio.sleep(1)  # the slow session is waiting for its own `local`
            assert not slow_list
            async with Client(params(repos["fast"])) as fast:
                assert "local__echo" in {t.name for t in (await fast.list_tools()).tools}
                fast_listed = time.monotonic()
                with anyio.fail_after(60):  # list_wait_s is 90: an answer by then came from the catalog
                    while not slow_list:
                        await anyio.sleep(0.05)
    assert {"local__echo", "web__echo"} <= slow_list["names"]
    assert slow_list["at"] - fast_listed < 20, "the waiting list was answered only when its own wait ran out"


def test_the_environment_a_session_gives_its_servers_is_its_own() -> None:
    """An attached session sends its environment, as a `serve` of its own would give its stdio servers (what each
    inherits of it is `[connect] inherit_env`'s); values that are not text are not taken."""
    from breakwater.gateway._share import SessionContext

    sent = {"cwd": "/work/repo", "env": {"PATH": "/x", "GITHUB_TOKEN": "ghp-token-1", "HOME": 3}}
    context = SessionContext.from_json(sent)
    assert context is not None and dict(context.env) == {"PATH": "/x", "GITHUB_TOKEN": "ghp-token-1"}
    assert "/x" not in repr(context) and "ghp-token-1" not in repr(context)  # values may be secrets
    assert SessionContext.from_json({"cwd": "relative", "env": {}}) is None
    assert SessionContext.from_json("nope") is None


def test_every_spelling_of_one_config_file_finds_one_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents write the path their own way (`--config mcp.json` from the repository, `./mcp.json`, an absolute
    path, a symlink): one file is one gateway. Until now each spelling had a gateway of its own, each connecting
    every HTTP server again. A file that says something else still has another."""
    from breakwater.config import load_config
    from breakwater.gateway._share import config_fingerprint

    repo = tmp_path / "repo"
    repo.mkdir()
    config = write_config(repo, "https://example.com/mcp", local={"command": "echo", "args": ["hi"], "shared": True})
    (tmp_path / "link.json").symlink_to(config)
    monkeypatch.chdir(repo)
    spellings = ["mcp.json", "./mcp.json", str(config), "../repo/mcp.json", str(tmp_path / "link.json")]
    assert len({config_fingerprint(load_config(spelling)) for spelling in spellings}) == 1
    other = write_config(repo, "https://example.com/other", "other.json")
    assert config_fingerprint(load_config(other)) != config_fingerprint(load_config(config))


def test_a_stdio_server_is_shared_by_its_entry_or_by_the_knob(tmp_path: Path) -> None:
    """`"shared": true` (JSON), `shared = true` (breakwater.toml, inline or over servers_file) and `[gateway] share_stdio`
    each make a stdio server the gateway's; it is breakwater's own key, read, not noted as a client's."""
    from breakwater.config import load_config
    from breakwater.errors import ConfigError
    from breakwater.gateway._session import per_session

    def own(path: Path, **environ: str) -> list[str]:
        return [s.name for s in per_session(load_config(path, environ=environ))]

    entry = {"command": "srv", "args": ["x"]}
    servers = {"mine": entry, "common": {**entry, "shared": True}, "web": {"type": "http", "url": "http://127.0.0.1:1/mcp"}}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    config = load_config(tmp_path / "mcp.json", environ={})
    assert {s.name: (s.shared, s.notes) for s in config.servers} == {
        "mine": (False, ()),
        "common": (True, ()),
        "web": (False, ()),
    }
    assert config.servers[1].describe()["shared"] is True
    assert own(tmp_path / "mcp.json") == ["mine"]
    assert own(tmp_path / "mcp.json", BREAKWATER_SHARE_STDIO="mine") == []
    toml = tmp_path / "breakwater.toml"
    toml.write_text(
        'servers_file = "mcp.json"\n[servers.mine]\nshared = true\n[servers.common]\nshared = false\n'
        '[servers.inline]\ncommand = "srv"\nshared = true\n'
    )
    assert own(toml) == ["common"]
    (tmp_path / "bad.json").write_text(json.dumps({"mcpServers": {"mine": {**entry, "shared": "yes"}}}))
    with pytest.raises(ConfigError, match="true or false"):
        load_config(tmp_path / "bad.json", environ={})


def test_a_shared_gateway_spreads_its_first_connects_less(tmp_path: Path) -> None:
    """The shared gateway opens every server but the per-session ones, with the start-up jitter capped at
    `[gateway] share_startup_jitter_s` (one process, not a herd); a smaller window of a server's own stays."""
    from breakwater.config import load_config
    from breakwater.gateway._share import shared_config

    servers = {
        "web": {"type": "http", "url": "http://127.0.0.1:1/mcp"},
        "mine": {"command": "srv"},
        "common": {"command": "srv", "shared": True},
    }
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))

    def jitters(**environ: str) -> dict[str, float]:
        config = shared_config(load_config(tmp_path / "mcp.json", environ=environ))
        return {s.name: s.connect.startup_jitter_s for s in config.servers}

    assert jitters() == {"web": 0.1, "common": 0.1}
    assert jitters(BREAKWATER_CONNECT_STARTUP_JITTER_S="0.05") == {"web": 0.05, "common": 0.05}
    assert jitters(BREAKWATER_SHARE_STARTUP_JITTER_S="2") == {"web": 0.5, "common": 0.5}  # [connect]'s default


def test_a_failover_sends_again_only_the_calls_that_read(tmp_path: Path) -> None:
    """readOnlyHint from a relayed tools/list makes a call safe to send again; the config's retry class wins over it."""
    from breakwater.config import load_config
    from breakwater.config._checks import distinct_name
    from breakwater.gateway._pump import ToolSafety, _Session

    (tmp_path / "breakwater.toml").write_text(
        '[servers.web]\nurl = "http://127.0.0.1:1/mcp"\n[servers.web.tools.lies]\nretry = "never"\n'
        '[servers.db]\nurl = "http://127.0.0.1:2/mcp"\n[servers.db.call]\nretry = "safe"\n'
    )
    config = load_config(tmp_path / "breakwater.toml", environ={})
    state = _Session(safety=ToolSafety.of(config))
    renamed = distinct_name("web__lies", "web", "lies", config.gateway.tool_name_max)
    state.note_request(b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}\n')
    tools = [
        {"name": "web__read", "annotations": {"readOnlyHint": True}},
        {"name": "web__write", "annotations": {"readOnlyHint": False, "idempotentHint": True}},
        {"name": "web__bare"},
        {"name": "web__lies", "annotations": {"readOnlyHint": True}},
        {"name": renamed, "annotations": {"readOnlyHint": True}},  # as listed when another tool is `web__lies`
    ]
    state.note_answer(json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"tools": tools}}).encode() + b"\n")
    safe = {n: state.safety.safe(n) for n in ("web__read", "web__write", "web__bare", "web__lies", renamed, "db__any", "nope")}
    assert safe == {
        "web__read": True,
        "web__write": False,
        "web__bare": False,
        "web__lies": False,
        renamed: False,
        "db__any": True,
        "nope": False,
    }
    assert state.safety.safe_call(b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"breakwater_search_tools"}}')


_OUTDATED_SESSION = """
import asyncio, socket, sys
from breakwater._clock import SystemClock
from breakwater.gateway._attach import Attachment, SessionOutdated
from breakwater.gateway._pump import ToolSafety, attached_session

ours, theirs = socket.socketpair()

async def reattach():
    raise SessionOutdated("breakwater was upgraded (1 -> 2) while this session ran: restart this agent session")

async def gateway():  # takes the first request, then dies under it
    reader, writer = await asyncio.open_unix_connection(sock=theirs)
    await reader.readline()
    writer.close()

async def main():
    task = asyncio.create_task(gateway())
    code = await attached_session(Attachment(ours, {}), reattach, safety=ToolSafety(), clock=SystemClock())
    await task
    return code

sys.exit(asyncio.run(main()))
"""


def test_a_session_that_outlived_an_upgrade_says_restart_once_and_ends(tmp_path: Path) -> None:
    """Its gateway gone and no gateway of its version to be had, a session answers what waits, says what to do, and ends."""
    from breakwater.gateway._share import gateway_paths

    assert gateway_paths(tmp_path, "f" * 32, "1.0")[0] != gateway_paths(tmp_path, "f" * 32, "1.1")[0]
    proc = subprocess.Popen(
        [sys.executable, "-c", _OUTDATED_SESSION],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n')
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    proc.wait(timeout=30)  # it ends by itself, its stdin still open
    _, err = proc.communicate()
    assert answer["id"] == 1 and "restart this agent session" in answer["error"]["message"]
    assert proc.returncode == 1
    assert err.decode().count("restart this agent session") == 1


def test_the_cut_answer_of_a_session_is_the_gates() -> None:
    """The relay writes OUTCOME_UNKNOWN without the SDK, exactly as the call gate's `error_result` would."""
    from breakwater.errors import OutcomeUnknownError
    from breakwater.gate._envelope import error_result
    from breakwater.gateway._passthrough import fitted
    from breakwater.gateway._pump import ToolSafety, _cut_answer

    error = OutcomeUnknownError("The shared gateway went away during this call; it may or may not have run.")
    expected = error_result(error).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert json.loads(_cut_answer(5)) == {"jsonrpc": "2.0", "id": 5, "result": expected}
    # A tool with an output schema the envelope does not fit: as the gateway would answer it.
    schema = {"type": "object", "required": ["temperature"]}
    moved = fitted(error_result(error), schema).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert json.loads(_cut_answer(5, schema=True)) == {"jsonrpc": "2.0", "id": 5, "result": moved}
    # Which tools declare one, the session learns from the tools/list answers it relays.
    safety = ToolSafety()
    tools = [{"name": "w__now", "inputSchema": {}, "outputSchema": schema}, {"name": "w__say", "inputSchema": {}}]
    safety.learn(json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"tools": tools}}).encode())
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "w__now"}}
    assert safety.declares_schema(json.dumps(call).encode())
    call["params"] = {"name": "w__say"}
    assert not safety.declares_schema(json.dumps(call).encode())


def test_an_attaching_session_starts_without_loading_the_sdk(tmp_path: Path) -> None:
    """The relay a session runs when it attaches imports neither the SDK nor the gateway, nor an HTTP client or
    rich: 14 sessions launched at once start on the same cores as the gateway they start, so each costs little."""
    import mcp.types

    from breakwater._wire import CONNECTION_CLOSED

    assert CONNECTION_CLOSED == mcp.types.CONNECTION_CLOSED  # spelled out in _wire so that configs load without the SDK
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"type": "http", "url": "https://user:pw@example.com/mcp?k=v"}}}))
    probe = (
        "import json, sys, breakwater.cli._serve, breakwater.cli._gateway, breakwater.gateway._attach, "
        "breakwater.gateway._pump, breakwater.gateway._share; "
        "from breakwater.config import load_config; "
        f"c = load_config({str(config)!r}); breakwater.gateway._share.config_fingerprint(c); "
        "breakwater.gateway._pump.ToolSafety.of(c); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    )
    heavy = ("mcp.", "mcp_types", "breakwater.gateway._server", "httpx", "rich", "anyio._backends")
    assert not [m for m in loaded if m == "mcp" or m.startswith(heavy)]


def test_a_failed_over_session_is_replayed_under_ids_of_its_own() -> None:
    """What a new gateway is told after a failover: initialize and setLevel again (their answers not the client's),
    then every request still waiting; answers the client already had are never asked for twice."""
    from breakwater.gateway._pump import _Session

    state = _Session()
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "error"}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "x"}},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "c"}},
    ]
    for message in lines:
        state.note_request(json.dumps(message).encode() + b"\n")
    for answered in (1, 2):
        assert state.note_answer(f'{{"jsonrpc":"2.0","id":{answered},"result":{{}}}}\n'.encode())
    replayed = [json.loads(line) for line in state.replays(1)]
    assert [(m.get("method"), m.get("id")) for m in replayed] == [
        ("initialize", "breakwater-replay-init-1"),
        ("notifications/initialized", None),
        ("logging/setLevel", "breakwater-replay-level-1"),
        ("tools/list", 3),  # still waiting; the cancelled call is not sent again
    ]
    # The replays' answers are the relay's, not the client's; the list's answer is the client's.
    assert not state.note_answer(b'{"jsonrpc":"2.0","id":"breakwater-replay-init-1","result":{}}\n')
    assert state.note_answer(b'{"jsonrpc":"2.0","id":3,"result":{"tools":[]}}\n')
    assert not state.pending


async def test_a_cold_start_forks_one_gateway_that_keeps_none_of_the_sessions_pipes(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """Sessions launched at once start one gateway, forked from one of them (no new interpreter): it runs in a
    session of its own, reads the null device, writes its log (0600), holds none of the agent's pipes (a session
    that ends closes its stdout for good), and idles out after the last session leaves."""
    url, state = upstream
    config = write_config(tmp_path, url)
    env = env_for(tmp_path, share, BREAKWATER_SHARE_IDLE_S="1")
    before = handshakes(state)
    upstream_pids: list[int] = []
    all_in, leave = anyio.Event(), anyio.Event()

    async def one() -> None:
        async with session(config, env) as client:
            assert "web__echo" in {t.name for t in (await client.list_tools()).tools}
            upstream_pids.append(pid_of(await client.call_tool("web__echo", {"text": "hi"})))
            if len(upstream_pids) == 4:
                all_in.set()
            await leave.wait()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)
            await all_in.wait()
            [gateway] = gateway_pids(share)
            assert handshakes(state) - before == 1 and len(set(upstream_pids)) == 1
            forked_from_a_session(gateway, share)
            leave.set()
    await eventually(lambda: gone(gateway), timeout=20)
    assert not list(share.glob("*.sock"))


def descriptors(pid: int) -> dict[int, str]:
    """The open descriptors of `pid` and what they point at; one closed while /proc is read is not open."""
    fds = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            fds[int(fd.name)] = os.readlink(fd)
        except FileNotFoundError:  # the gateway closed it (a finished connect, a socket) between listing and reading
            continue
    return fds


def forked_from_a_session(pid: int, share: Path) -> None:
    """What /proc says of the gateway at `pid`: a `serve` forked, detached, and of the agent's pipes only those the
    sessions handed over (each live session's stdin and stdout: `breakwater.gateway._handoff`)."""
    proc = Path(f"/proc/{pid}")
    assert b"serve" in (proc / "cmdline").read_bytes().split(b"\0")  # no `gateway run` interpreter was started
    assert os.getsid(pid) not in (os.getsid(0), pid)  # detached from ours, and no session leader (forked twice)
    [log] = share.glob("gw-*.log")
    fds = descriptors(pid)
    assert fds[0] == os.devnull and fds[1] == fds[2] == str(log)
    # The agent's pipes are those this test process (the agent) holds the other end of; uvloop's own self-pipes
    # (both ends in the gateway) are no session's.
    agent_pipes = {target for target in descriptors(os.getpid()).values() if target.startswith("pipe:")}
    handed = {descriptors(serve)[fd] for serve in sessions_of_this_agent() for fd in (0, 1)}
    assert len(handed) == 8 and handed <= agent_pipes  # four sessions, each its own stdin and stdout
    assert agent_pipes & set(fds.values()) == handed, fds
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def sessions_of_this_agent() -> list[int]:
    """The pids of the `breakwater serve` processes this test process started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"serve" in cmdline:
            found.append(int(stat.parent.name))
    return found


def piped_serve(config: Path, env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    """`breakwater serve` on `config`, on pipes of this test's own (its stderr dropped)."""
    command = [*BREAKWATER, "serve", "--config", str(config)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, **popen)


def raw_session(config: Path, env: dict[str, str], errlog: Path) -> subprocess.Popen[bytes]:
    """A `breakwater serve` on pipes of this test's own, initialized, its `echo` called once and answered."""
    proc = serve_on_pipes(config, env, errlog)
    assert proc.stdin is not None and proc.stdout is not None
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "web__echo", "arguments": {"text": "x"}}},
    ]
    proc.stdin.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    answered: set[int] = set()
    while answered != {1, 2}:
        line = proc.stdout.readline()
        assert line, "serve ended before answering"
        message = json.loads(line)
        if "id" in message and "method" not in message:
            answered.add(message["id"])
    return proc


def ends_within(proc: subprocess.Popen[bytes], seconds: float, holders: list[int]) -> bytes:
    """What is left on `proc`'s stdout once its end comes (the test fails if it does not come in time, and says which of
    `proc` and `holders` still hold its pipe)."""
    assert proc.stdout is not None
    pipe = descriptors(os.getpid())[proc.stdout.fileno()]
    done: list[bytes] = []
    reader = threading.Thread(target=lambda: done.append(proc.stdout.read() if proc.stdout else b""), daemon=True)
    reader.start()
    reader.join(seconds)
    holding = [pid for pid in [proc.pid, *holders] if pid != os.getpid() and pipe in set(descriptors(pid).values())]
    assert done, f"the agent's end of serve's stdout did not end within {seconds} s: still held by {holding} (serve {proc.pid})"
    return done[0]


async def test_a_session_the_agent_ends_or_kills_lets_go_of_the_agents_pipes_at_once(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """The gateway serves a session on the pipes its `serve` handed over; when the agent closes the session's input,
    interrupts its `serve` or kills it, the agent sees the session's output end at once, as it would with `serve`
    alone, while the gateway goes on serving the other sessions."""
    url, _ = upstream
    config = write_config(tmp_path, url)
    env = env_for(tmp_path, share)
    async with session(config, env) as keeper:  # holds the gateway
        await keeper.call_tool("web__echo", {"text": "a"})
        [gateway] = gateway_pids(share)
        for end in ("close input", "SIGINT", "SIGKILL"):
            errlog = tmp_path / f"serve-{end}.err"
            proc = raw_session(config, env, errlog)
            pipes = {descriptors(proc.pid)[fd] for fd in (0, 1)}
            assert pipes <= set(descriptors(gateway).values())  # the gateway serves it on them
            assert proc.stdin is not None
            if end == "close input":
                proc.stdin.close()
            else:
                os.kill(proc.pid, signal.SIGINT if end == "SIGINT" else signal.SIGKILL)
            assert ends_within(proc, 10, [gateway]) == b"", end
            # Interrupted: 130, or (1 run in 12 under load) the signal's own end after serve said so; a shell shows 130.
            expected = {"close input": {0}, "SIGINT": {130, -signal.SIGINT}, "SIGKILL": {-signal.SIGKILL}}[end]
            assert proc.wait(10) in expected, errlog.read_text()
            if end == "SIGINT":
                assert errlog.read_text().strip().endswith("breakwater: interrupted")
            await eventually(lambda: not pipes & set(descriptors(gateway).values()), timeout=10)  # noqa: B023 - awaited here
        assert not (await keeper.call_tool("web__echo", {"text": "b"})).is_error
        assert gateway_pids(share) == [gateway]


def test_a_session_decides_and_shakes_hands_before_it_loads_asyncio(tmp_path: Path, share: Path) -> None:
    """Up to its first handshake a stdio session imports no event loop: at a cold start the first one forks the
    gateway sooner, and the others wait for its answer asleep, leaving the cores to the gateway's imports."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"type": "http", "url": "https://example.com/mcp"}}}))
    probe = (
        "import json, sys, breakwater.cli, breakwater.cli._serve, breakwater.cli._gateway, breakwater.gateway._start; "
        "from breakwater.cli._common import load_or_exit; "
        "from breakwater.gateway import _share; "
        f"c = load_or_exit({str(config)!r}); "
        "_share.gateway_paths(_share.share_dir(c.gateway), _share.config_fingerprint(c), _share.breakwater_version()); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    env = {**os.environ, "BREAKWATER_SHARE_DIR": str(share)}  # short: a socket's path must fit in 107 bytes
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True, env=env)
    loaded = json.loads(run.stdout)
    assert not [m for m in loaded if m in ("asyncio", "anyio", "mcp", "breakwater.gateway._pump", "breakwater._clock")]


def test_a_gateway_that_dies_before_answering_is_named_with_its_log(tmp_path: Path) -> None:
    """A session connected to a gateway that was still starting, and died: it is told so (and where the log is),
    and serves on its own rather than waiting."""
    import threading

    from breakwater.gateway._share import AttachRefused, bind_socket
    from breakwater.gateway._start import attach_now

    sock = tmp_path / "gw-x.sock"
    listener = bind_socket(sock)
    assert listener is not None
    listener.setblocking(True)
    outcome: list[BaseException] = []

    def attach() -> None:
        try:
            attach_now(sock, {"breakwater": "attach"}, 10)
        except BaseException as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=attach)
    waiting.start()
    conn, _ = listener.accept()
    assert conn.recv(65536).startswith(b'{"breakwater": "attach"')
    conn.close()  # the gateway's end, gone before it answered
    listener.close()
    waiting.join(10)
    # And one that dies with the session's connection still in its backlog, never accepted.
    listener = bind_socket(sock)
    assert listener is not None
    waiting = threading.Thread(target=attach)
    waiting.start()
    await_backlog = time.monotonic() + 10
    while _backlog(sock) == 0 and time.monotonic() < await_backlog:
        time.sleep(0.01)
    listener.close()
    waiting.join(10)
    assert [type(e) for e in outcome] == [AttachRefused, AttachRefused]
    for refused in outcome:
        assert "closed the connection before answering" in str(refused) and "gw-x.log" in str(refused)


def _backlog(sock: Path) -> int:
    """How many connections wait to be accepted by the listening Unix socket at `sock`: in /proc/net/unix each is a
    socket of its own under the listener's path, without the listener's accepting flag (__SO_ACCEPTCON)."""
    lines = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
    return sum(1 for fields in lines if fields[-1] == str(sock) and fields[3] == "00000000")


def test_a_session_that_arrives_as_the_gateway_exits_starts_the_next_one(tmp_path: Path) -> None:
    """A session queued on the socket as the gateway idles out (or is stopped) was reset with the listener, read that
    as a gateway that died starting, and served itself unshared ("closed the connection before answering"). The
    gateway turns it away instead: told it exits, the session finds no gateway, and starts the next one there."""
    import asyncio

    from breakwater.gateway._attach import connect_gateway
    from breakwater.gateway._share import bind_socket, pid_path, turn_away
    from breakwater.gateway._start import attach_now

    sock = tmp_path / "gw-x.sock"
    listener = bind_socket(sock)
    assert listener is not None
    pid_path(sock).write_text(f"{os.getpid()}\n")
    found: list[object] = []

    def attach() -> None:
        try:
            found.append(attach_now(sock, {"breakwater": "attach"}, 10))
        except Exception as exc:  # before the fix: AttachRefused, "closed the connection before answering"
            found.append(exc)

    blocking = threading.Thread(target=attach)
    blocking.start()  # a session's first attach (`attach_now`), then a failover's (`connect_gateway`)

    async def on_the_loop() -> None:
        queued = asyncio.ensure_future(connect_gateway(sock, {"breakwater": "attach"}))
        waited = time.monotonic() + 10
        while _backlog(sock) < 2 and time.monotonic() < waited:
            await asyncio.sleep(0.01)
        assert _backlog(sock) == 2, "both sessions should be queued, unaccepted"
        assert turn_away(listener) == 2
        listener.close()
        found.append(await asyncio.wait_for(queued, 10))

    asyncio.run(on_the_loop())
    blocking.join(10)
    assert found == [None, None]  # "nothing listens here": each starts the next gateway (`open_attachment`)
    assert not sock.exists() and not pid_path(sock).exists()
    after = bind_socket(sock)  # the next gateway binds the path at once
    assert after is not None
    after.close()


def test_a_session_turned_away_mid_hello_still_reads_that_the_gateway_exits(tmp_path: Path) -> None:
    """A hello carries the session's environment, which can outgrow the socket's buffer: the gateway turned the session
    away (answered, closed) while its hello was still being sent, the send failed, and the answer went unread: the
    session served itself unshared. What the gateway wrote is read whatever the send met."""
    import asyncio

    from breakwater.gateway._attach import connect_gateway
    from breakwater.gateway._share import bind_socket, turn_away
    from breakwater.gateway._start import attach_now

    hello = {"breakwater": "attach", "session": {"cwd": "/", "env": {"BIG": "x" * 1_000_000}}}  # past any socket buffer

    def turned_away(attach: Callable[[Path], object]) -> object:
        sock = tmp_path / "gw-x.sock"
        listener = bind_socket(sock)
        assert listener is not None
        found: list[object] = []

        def run() -> None:
            try:
                found.append(attach(sock))
            except Exception as exc:  # before the fix: AttachRefused, "closed the connection before answering"
                found.append(exc)

        session = threading.Thread(target=run)
        session.start()
        waited = time.monotonic() + 10
        while _backlog(sock) == 0 and time.monotonic() < waited:
            time.sleep(0.01)
        time.sleep(0.2)  # the session is blocked in its send: the hello filled the queued connection's buffer
        assert turn_away(listener) == 1
        listener.close()
        session.join(10)
        return found

    assert turned_away(lambda sock: attach_now(sock, hello, 10)) == [None]
    assert turned_away(lambda sock: asyncio.run(connect_gateway(sock, hello))) == [None]


def test_a_forked_gateway_keeps_no_descriptor_the_agent_gave_its_session(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """An agent may leave more than stdio open in the server it launches; the gateway forked from that session
    holds none of it (a pipe it kept would never read as closed), as a spawned one's `close_fds` ensured."""
    url, _ = upstream
    config = write_config(tmp_path, url)
    read_end, write_end = os.pipe()
    proc = piped_serve(config, env_for(tmp_path, share), pass_fds=(write_end,))
    assert proc.stdin is not None and proc.stdout is not None
    try:
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        [gateway] = gateway_pids(share)
        held = set(descriptors(gateway).values())
        assert f"pipe:[{os.fstat(write_end).st_ino}]" not in held, held
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        os.close(read_end)
        os.close(write_end)


CONFORMANCE_SERVER = Path(__file__).resolve().parents[1] / "conformance" / "server.py"
WATCHED = "test://watched-resource"


def resource_session(config: Path, env: dict[str, str], heard: ResourceUpdates) -> Client:
    """An attached `serve` session of a handshake-era client that records its resource updates."""
    params = StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)
    return Client(stdio_client(params), mode="legacy", message_handler=heard)


async def update(client: Client, server: str) -> str:
    """Have `server` send an update of WATCHED to its subscribers; what it says it holds."""
    result = await client.call_tool(f"{server}__test_watch_resource_update", {"uri": WATCHED})
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def all_ready(client: Client) -> None:
    """Wait until every server of the session is ready (its list may show another session's last-known tools sooner)."""
    with anyio.fail_after(30):
        while True:
            status = (await client.call_tool("breakwater_status", {})).structured_content or {}
            if all(server["state"] == "ready" for server in status["servers"]):
                return
            await anyio.sleep(0.1)


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # resources/subscribe is 2025-era
@pytest.mark.parametrize("upstream", ["2025-11-25", "2026-07-28"])
async def test_sessions_with_servers_of_their_own_each_hear_their_resource_updates(
    tmp_path: Path, share: Path, upstream: str
) -> None:
    """Sessions whose config has a stdio server of their own each have a gateway view of their own. A shared
    server's resource updates reach every session subscribed to the URI, whichever attached last and whether
    or not it is still there, and the upstream stays subscribed while any session wants it. (Each view took
    the shared servers' updates for itself: the last session to attach heard them all, the others none.)"""
    config = tmp_path / "mcp.json"
    local = launch_command("--tool", "echo:latency=0")
    servers = {
        "conf": {"command": sys.executable, "args": [str(CONFORMANCE_SERVER)], "shared": True},
        "own": {"command": local[0], "args": local[1:]},  # per session: each session gets a view of its own
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    env = env_for(tmp_path, share, BREAKWATER_PROTOCOL=upstream)
    a_heard, b_heard = ResourceUpdates(), ResourceUpdates()
    async with resource_session(config, env, a_heard) as a:
        await all_ready(a)
        await a.subscribe_resource(WATCHED)
        async with resource_session(config, env, b_heard) as b:  # attaches after a subscribed
            await all_ready(b)
            await b.subscribe_resource(WATCHED)
            await update(a, "conf")
            await a_heard.wait_for(WATCHED)
            await b_heard.wait_for(WATCHED)
        a_heard.uris.clear()
        held = await update(a, "conf")  # b has left: a still hears, and the upstream still holds the subscription
        await a_heard.wait_for(WATCHED)
        if upstream == "2025-11-25":
            assert held == f"subscribed: {[WATCHED]}"


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # resources/subscribe is 2025-era
async def test_a_sessions_own_server_updates_that_session_only(tmp_path: Path, share: Path) -> None:
    """Each session runs its own process of a stdio server: its updates reach that session, not the one that
    attached last (which heard them all, while the session whose server it was heard none)."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"own": {"command": sys.executable, "args": [str(CONFORMANCE_SERVER)]}}}))
    env = env_for(tmp_path, share, BREAKWATER_PROTOCOL="2025-11-25")
    a_heard, b_heard = ResourceUpdates(), ResourceUpdates()
    async with resource_session(config, env, a_heard) as a, resource_session(config, env, b_heard) as b:
        for client in (a, b):
            await all_ready(client)
            await client.subscribe_resource(WATCHED)
        await update(a, "own")
        await a_heard.wait_for(WATCHED)
        await update(b, "own")  # b's own process: its update comes after a's would have
        await b_heard.wait_for(WATCHED)
        assert (a_heard.uris, b_heard.uris) == ([WATCHED], [WATCHED])


def test_a_sessions_own_server_holds_none_of_its_pipes_so_the_session_ends_at_once(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """The gateway receives a session's stdin, stdout and bell as descriptors over its socket, and those are
    inheritable: the session's own stdio servers, started after, held them, so its `serve` heard the session
    end only once every such server had exited. With one that ignores the end of its input (the npm
    "everything" server, here a wrapper that sleeps on), that was 2 s after the client closed stdin, when
    both SDKs' clients signal the server they launched."""
    url, _ = upstream
    own_pid = tmp_path / "own.pid"
    config = write_config(tmp_path, url, own=lingering_server(own_pid))
    proc = piped_serve(config, env_for(tmp_path, share))
    assert proc.stdin is not None and proc.stdout is not None
    try:
        answer = called_once_up(proc, "own__ping")
        assert answer["result"]["isError"] is False, answer  # the session's own server is up
        # The session's stdin and stdout, and the pipes its `serve` holds (the bell among them).
        session_pipes = {f"pipe:[{os.fstat(f.fileno()).st_ino}]" for f in (proc.stdin, proc.stdout)}
        session_pipes |= {v for fd, v in descriptors(proc.pid).items() if fd > 2 and v.startswith("pipe:")}
        held = set(descriptors(int(own_pid.read_text())).values())
        assert not session_pipes & held, (session_pipes, held)
        gone_at = time.monotonic()
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - gone_at < 1.5  # was 2 s and more: the server's exit, not the session's end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_session_hears_the_shared_gateway_s_journal_trouble_on_its_stderr(
    tmp_path: Path, share: Path, upstream: tuple[str, Path]
) -> None:
    """A `[journal] url` that cannot be written was said on `serve --no-share`'s stderr (which the agent keeps, in Claude
    Code's MCP logs) and only in the shared gateway's log file when sessions attach to one: they now hear it too."""
    url, _ = upstream
    config = write_config(tmp_path, url)
    env = env_for(tmp_path, share, BREAKWATER_JOURNAL="postgresql://nobody@127.0.0.1:1/none")
    with (tmp_path / "first.log").open("w") as first_err:
        async with session(config, env, errlog=first_err) as first:
            assert not (await first.call_tool("web__echo", {})).is_error  # its journal row is what fails to be written
            with anyio.fail_after(30):  # the gateway's writer tries the journal on its own thread, soon after its start
                while "the call journal" not in "".join(p.read_text() for p in share.rglob("*.log")):
                    await anyio.sleep(0.1)
            with (tmp_path / "second.log").open("w") as second_err:
                async with session(config, env, errlog=second_err) as second:
                    await second.list_tools()
    said = (tmp_path / "second.log").read_text()
    assert "the shared gateway says: the call journal" in said and "127.0.0.1:1" in said, said
    assert "fix:" in said, said
