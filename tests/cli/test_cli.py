"""The `breakwater` command as a person uses it: real subprocesses, real test servers, real ports.

Every failure a person can cause is one line with a documented exit code; piped output is complete;
`tools` answers in seconds; `call` makes one call through the gate.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from breakwater.testing.server import launch_command

pytestmark = pytest.mark.long_module(100)

BREAKWATER = [sys.executable, "-m", "breakwater"]
LONG_SERVER = "warehouse-inventory-and-fulfilment-service"
LONG_TOOL = "reserve_stock_for_outbound_shipment"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of every `breakwater` run: its files in `tmp_path`, connects started at once."""
    # An exported COLUMNS sizes piped tables on purpose; these runs are piped as a person's `| cat` is.
    inherited = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return dict(
        inherited,
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )


def run(env: dict[str, str], *args: str, timeout: float = 90, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`breakwater ARGS` with stdout and stderr piped (not a terminal), as `breakwater ... | cat` runs it (in `cwd`)."""
    return subprocess.run(
        [*BREAKWATER, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


def write_config(path: Path, servers: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def stdio_entry(*flags: str) -> dict[str, Any]:
    cmd = launch_command(*flags)
    return {"command": cmd[0], "args": cmd[1:]}


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A TCP listener that accepts connections and never answers: a server that never becomes ready."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(60)
    with sock:
        yield sock


def silent_url(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"


# ---- the command itself --------------------------------------------------------------------------------


def test_version_flag_prints_the_installed_version(env: dict[str, str]) -> None:
    """`breakwater --version` and `-V` print the installed version and exit 0."""
    for flag in ("--version", "-V"):
        result = run(env, flag)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"breakwater {version('mcp-breakwater')}\n"


def test_a_typo_in_the_command_suggests_the_right_one(env: dict[str, str]) -> None:
    """A mistyped command is one line naming the closest command, with exit code 2."""
    result = run(env, "stauts")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "unknown command 'stauts'" in result.stderr and "'status'" in result.stderr.partition("did you mean")[2]
    # A subcommand's too: `config chek` listed the choices and left the reader to find it.
    for argv, meant in ((["config", "chek"], "check"), (["auth", "statu"], "status"), (["gateway", "lsit"], "list")):
        typo = run(env, *argv)
        assert typo.returncode == 2 and f"(did you mean '{meant}'?)" in typo.stderr, typo.stderr
    # A command's flag before the command is no misspelt command (it said "did you mean 'config'").
    early = run(env, "--config", "x.toml", "status")
    assert (
        early.returncode == 2
        and early.stderr
        == "breakwater: --config goes after the command: breakwater COMMAND --config ... (see breakwater --help)\n"
    )


def test_status_of_a_gateway_that_takes_the_connection_and_never_answers_says_so(env: dict[str, str]) -> None:
    """A stopped gateway (SIGSTOP, a debugger): it said "ReadTimeout: ; check ... that serve --http is running"."""
    import socket

    with socket.socket() as silent:  # the kernel completes the handshake; nothing ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        result = run(env, "status", "--gateway", url)
    assert result.returncode == 1, result.stderr
    assert f"the gateway at {url} took the connection but did not answer in time" in result.stderr, result.stderr


def test_a_misspelt_breakwater_variable_is_said_with_the_one_it_meant(env: dict[str, str], tmp_path: Path) -> None:
    """`BREAKWATER_CALL_TIMEOUTS=60` changed nothing, and nothing said so."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry()})
    result = run({**env, "BREAKWATER_CALL_TIMEOUTS": "60"}, "config", "check", "--config", str(config))
    assert result.returncode == 0, result.stderr
    said = "breakwater: warning: BREAKWATER_CALL_TIMEOUTS is no setting of breakwater's (did you mean BREAKWATER_CALL_TIMEOUT_S?)"
    assert said in result.stderr, result.stderr
    assert "warning" not in run(env, "config", "check", "--config", str(config)).stderr  # the suite's own are known


def test_serve_refuses_an_allowed_host_no_host_header_can_carry(env: dict[str, str], tmp_path: Path) -> None:
    """A URL, a wildcard, nothing: taken without a word, and every request was then refused 421."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry()})
    for value in ("https://gw.example.com", "*", "", "gw.example.com/mcp"):
        result = run(env, "serve", "--http", "0", "--allowed-host", value, "--config", str(config))
        assert result.returncode == 2 and "--allowed-host: expected a host name or address" in result.stderr, result.stderr
    from breakwater.cli._serve import parse_listen

    assert parse_listen("LOCALHOST:0") == ("localhost", 0)  # refused as "not loopback: needs a token"


def test_serve_http_reads_host_and_port_and_refuses_what_it_would_have_to_guess() -> None:
    """`--http http://127.0.0.1:8080` listened nowhere (refused as the non-loopback host `http://127.0.0.1`), `--http ::1`
    as host `:` on port 1, and `--http ８０８０` on port 8080; each is refused now with the spelling it needs."""
    import argparse

    from breakwater.cli._serve import parse_listen

    for given, meant in (
        ("8080", ("127.0.0.1", 8080)),
        (":8080", ("127.0.0.1", 8080)),
        (" 8080 ", ("127.0.0.1", 8080)),
        ("[::1]:8080", ("::1", 8080)),
        ("[FD00::7]:0", ("fd00::7", 0)),
        ("Box.Local:65535", ("box.local", 65535)),
    ):
        assert parse_listen(given) == meant, given
    for given, said in (
        ("http://127.0.0.1:8080", "got the URL 'http://127.0.0.1:8080': pass its host and port"),
        ("::1", "an IPv6 address goes in brackets, e.g. [::1]:8080"),
        ("fd00::7:8080", "an IPv6 address goes in brackets"),
        ("[::1]", "expected [IPV6]:PORT"),
        ("[::1]8080", "expected [IPV6]:PORT"),
        ("\uff18\uff10\uff18\uff10", "expected [HOST:]PORT"),
        ("65536", "expected [HOST:]PORT"),
        ("a b:80", "expected [HOST:]PORT"),
        ("user@host:80", "expected [HOST:]PORT"),
        ("127.0.0.1:", "expected [HOST:]PORT"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
            parse_listen(given)


def test_command_line_numbers_are_read_as_a_person_writes_them() -> None:
    """`--wait ５` waited 5 s and `--port 8_0` listened on 80: Python reads other digits and `_`; the config's knobs
    already refused both."""
    import argparse

    from breakwater.cli._common import seconds, whole

    port = whole(0, 65535)
    assert (seconds("2.5"), seconds("1e1"), seconds(" 3 "), port("8080")) == (2.5, 10.0, 3.0, 8080)
    for bad in ("\uff15", "1_0", "\u0665", "0x10"):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            port(bad)


def test_serve_started_in_a_terminal_says_what_it_is_for_and_piped_says_nothing(env: dict[str, str], tmp_path: Path) -> None:
    """A person who ran `breakwater serve` by hand waited before a silent terminal, and what they typed got nothing."""
    import pty
    import select

    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry()})
    argv = [*BREAKWATER, "serve", "--no-share", "--config", str(config)]
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    finally:
        os.close(follower)
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 30)  # a silent serve would leave readline waiting for ever
        assert ready, "serve said nothing on its stderr in 30 s"
        first = proc.stderr.readline().decode()
        assert first.startswith("breakwater: serving MCP on stdin and stdout, for an agent to start"), first
        assert "breakwater status, breakwater tools, breakwater demo" in first, first
    finally:
        proc.kill()
        proc.communicate(timeout=30)
        os.close(leader)
    piped = run(env, "serve", "--no-share", "--config", str(config))  # stdin from /dev/null, as no agent gives it
    assert piped.returncode == 0 and "for an agent to start" not in piped.stderr, piped.stderr


def test_serve_refuses_http_flags_over_stdio(env: dict[str, str], tmp_path: Path) -> None:
    """`serve --token T` over stdio started and ignored the token: a user could believe something was protected."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry()})
    for flags, said in (
        (["--token", "s3cret-token-1234"], "--token: only for --http"),
        (["--allowed-host", "evil.example", "--json-response"], "--allowed-host, --json-response: only for --http"),
    ):
        result = run(env, "serve", "--no-share", *flags, "--config", str(config))
        assert result.returncode == 2 and said in result.stderr and "add --http [HOST:]PORT" in result.stderr, result.stderr
        assert "s3cret" not in result.stderr


def test_help_documents_the_exit_codes_and_the_tools_wait(env: dict[str, str]) -> None:
    """`--help` lists every exit code; `tools --help` says how long it waits by default."""
    top = run(env, "--help")
    assert top.returncode == 0
    for code in ("0", "1", "2", "3", "130"):
        assert f"\n  {code} " in top.stdout
    assert "--version" in top.stdout and "call" in top.stdout
    tools = run(env, "tools", "--help")
    assert "--wait SECONDS" in tools.stdout and "default 3" in tools.stdout


def test_usage_errors_are_one_line_with_exit_code_2(env: dict[str, str]) -> None:
    """A wrong flag value is one line naming the command, the problem and where the help is; exit 2."""
    for args, expected in (
        (["status", "--wait", "-1"], "breakwater status: argument --wait: expected a number of seconds, 0 or more"),
        # "nan" reached the clock as a deadline: a traceback from `call` and `tools`, and `status` waited not at all.
        (["call", "--wait", "nan", "s", "t"], "breakwater call: argument --wait: expected a number of seconds, 0 or more"),
        (["tools", "--wait", "nan"], "breakwater tools: argument --wait: expected a number of seconds, 0 or more"),
        (["stats", "--since", "soon"], "breakwater stats: --since: expected a duration such as 90s"),
        (["serve", "--http", "99999"], "breakwater serve: argument --http: expected [HOST:]PORT"),
        (["call", "only-a-server"], "breakwater call: the following arguments are required: tool"),
    ):
        result = run(env, *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(expected), result.stderr
        assert "--help)" in result.stderr


# ---- output that is complete when piped -------------------------------------------------------------


def test_an_output_encoding_that_cannot_write_a_name_shows_it_escaped(env: dict[str, str], tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii (or a Latin-1 terminal) and a server named "sérveur": a UnicodeEncodeError traceback."""
    config = write_config(tmp_path / "mcp.json", {"sérveur-日本": {**stdio_entry(), "disabled": True}})
    result = run({**env, "PYTHONIOENCODING": "ascii"}, "status", "--wait", "0", "--config", str(config))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "s\\xe9rveur-\\u65e5\\u672c" in result.stdout, result.stdout


def test_status_on_a_narrow_terminal_lists_each_server_on_a_line(env: dict[str, str], tmp_path: Path) -> None:
    """`COLUMNS=20`: the table was squeezed until the server column had no width ("│ │ … │"); a table that does not fit
    is one line per server, its name whole."""
    config = write_config(tmp_path / "mcp.json", {"payments": {**stdio_entry(), "disabled": True}})
    narrow = run({**env, "COLUMNS": "20"}, "status", "--wait", "0", "--config", str(config))
    assert narrow.returncode == 0, narrow.stderr
    assert "payments disabled stdio" in " ".join(narrow.stdout.split()) and "┃" not in narrow.stdout, narrow.stdout
    wide = run({**env, "COLUMNS": "200"}, "status", "--wait", "0", "--config", str(config))
    assert "┃ server" in wide.stdout and "payments" in wide.stdout, wide.stdout


def test_piped_status_keeps_long_names_whole(env: dict[str, str], tmp_path: Path) -> None:
    """`breakwater status | cat` prints every name in full, on one line, without colour codes."""
    long_name = "a-server-whose-name-alone-is-wider-than-an-eighty-column-terminal-" + "x" * 30
    config = write_config(tmp_path / "mcp.json", {long_name: {**stdio_entry(), "disabled": True}})
    result = run(env, "status", "--wait", "0", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert any(long_name in line for line in result.stdout.splitlines())
    assert "…" not in result.stdout and "\x1b[" not in result.stdout


def test_calls_made_with_call_show_in_full_in_piped_stats(env: dict[str, str], tmp_path: Path) -> None:
    """The journal's table, piped, has every column of every row: no "…", nothing cut at 80 columns."""
    env = dict(env, BREAKWATER_JOURNAL=str(tmp_path / "journal.sqlite3"))
    config = write_config(tmp_path / "mcp.json", {LONG_SERVER: stdio_entry("--tool", f"{LONG_TOOL}:latency=0.05")})
    for _ in range(2):
        assert run(env, "call", LONG_SERVER, LONG_TOOL, "--config", str(config)).returncode == 0

    table = run(env, "stats", "--since", "1h", "--config", str(config))
    assert table.returncode == 0, table.stderr
    assert "…" not in table.stdout and "\x1b[" not in table.stdout
    row = next(line for line in table.stdout.splitlines() if LONG_TOOL in line)
    assert LONG_SERVER in row and " 2 " in row and "100.0 %" in row and "default" in row
    assert len(row) > 80, "the twelve columns are all there, wider than a terminal would show"

    as_json = json.loads(run(env, "stats", "--json", "--config", str(config)).stdout)
    assert [(t["server"], t["tool"], t["calls"]) for t in as_json["tools"]] == [(LONG_SERVER, LONG_TOOL, 2)]


@pytest.mark.anyio
async def test_status_shows_the_revision_each_start_speaks_and_serve_speaks_it_too(env: dict[str, str], tmp_path: Path) -> None:
    """A user's first `status` probes the server (2026-07-28); from the next start on, a stdio server that
    serves one client and needs nothing of 2026-07-28 is spoken to in 2025-11-25, by `status` and `serve` alike."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry("--tool", "echo")})

    def protocols() -> list[Any]:
        result = run(env, "status", "--json", "--config", str(config))
        assert result.returncode == 0, result.stderr
        return [server["protocol"] for server in json.loads(result.stdout)["servers"]]

    assert protocols() == ["2026-07-28"]
    assert protocols() == ["2025-11-25"]
    serve = StdioServerParameters(command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--config", str(config)], env=env)
    async with Client(serve, mode="legacy") as client:
        assert not (await client.call_tool("shop__echo", {"text": "hi"})).is_error
        status = await client.call_tool("breakwater_status", {})
    assert isinstance(status.structured_content, dict)
    assert [s["protocol"] for s in status.structured_content["servers"]] == ["2025-11-25"]
    assert list(Path(env["BREAKWATER_PROTOCOL_MEMORY_DIR"]).glob("shop-*.json")), "kept in the test's own memory"


def test_a_relative_config_that_is_not_there_is_named_with_the_folder_it_was_looked_for_in(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`servers.json: cannot read the file: No such file or directory` did not say where: an agent starts `serve` in a
    folder of its own choosing, which the user does not see."""
    for command in (["config", "check"], ["status", "--wait", "0"]):
        result = run(env, *command, "--config", "servers.json", cwd=tmp_path)
        assert result.returncode == 2, result
        assert f"servers.json: cannot read the file {tmp_path / 'servers.json'}: " in result.stderr, result.stderr
        assert f"read from the folder breakwater runs in, {tmp_path}" in result.stderr, result.stderr


def test_a_config_under_home_written_with_a_tilde_is_found_as_an_agent_starts_serve(env: dict[str, str], tmp_path: Path) -> None:
    """Agents start servers without a shell, so `"args": ["serve", "--config", "~/bw.json"]` reached breakwater with its
    `~`: "cannot read the file /project/~/bw.json". A stdio session through a real client answers now."""
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    home.mkdir()
    write_config(home / "bw.json", {"shop": stdio_entry()})
    env = {**env, "HOME": str(home)}
    checked = run(env, "config", "check", "--config", "~/bw.json", cwd=project)
    assert checked.returncode == 0 and f"ok: {home / 'bw.json'}: 1 server" in checked.stdout, checked.stdout + checked.stderr

    async def one_call() -> bool | None:
        params = StdioServerParameters(
            command=BREAKWATER[0], args=[*BREAKWATER[1:], "serve", "--no-share", "--config", "~/bw.json"], env=env, cwd=project
        )
        async with Client(params) as client:
            return (await client.call_tool("breakwater_status", {})).is_error

    assert anyio.run(one_call) is False


@pytest.mark.anyio
async def test_an_sse_entry_on_a_streamable_http_server_is_told_to_try_http(env: dict[str, str], tmp_path: Path) -> None:
    """`"type": "sse"` on a URL that speaks streamable HTTP failed as `http_status: HTTP 400 from ...` alone."""
    from breakwater.testing.server import serve_http

    async with serve_http() as server:
        config = write_config(tmp_path / "mcp.json", {"wrong": {"type": "sse", "url": server.url}})
        result = await anyio.to_thread.run_sync(lambda: run(env, "status", "--json", "--wait", "5", "--config", str(config)))
    (wrong,) = json.loads(result.stdout)["servers"]
    assert wrong["error"]["code"] == "http_status", wrong
    assert wrong["error"]["message"].endswith('a streamable HTTP endpoint answers an SSE client so: try "type": "http"'), wrong


# ---- tools answers in seconds -----------------------------------------------------------------------------


def test_tools_answers_within_seconds_naming_the_server_still_connecting(
    env: dict[str, str], tmp_path: Path, silent_server: socket.socket
) -> None:
    """With a server that never becomes ready, `tools` answers by default in seconds, not in half a minute."""
    config = write_config(
        tmp_path / "mcp.json",
        {"fine": stdio_entry("--tool", "echo:latency=0"), "silent": {"type": "http", "url": silent_url(silent_server)}},
    )
    started = time.monotonic()
    result = run(env, "tools", "--config", str(config))
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "silent: still connecting" in result.stdout
    # A healthy server is listed, or (on a machine too busy to start it within the wait) named too.
    assert "fine__echo" in result.stdout or "fine: still connecting" in result.stdout
    # The default wait is 3 s; process start and shutdown on a busy machine take a few more.
    assert elapsed < 20, f"tools took {elapsed:.1f} s"


# ---- one line and an exit code ------------------------------------------------------------------------


def test_a_busy_port_is_one_line_and_exit_code_3(env: dict[str, str], tmp_path: Path) -> None:
    """`serve --http PORT` on a port in use says so in one line, with what to do, and exits 3."""
    config = write_config(tmp_path / "mcp.json", {"fine": stdio_entry()})
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run(env, "serve", "--http", str(port), "--config", str(config))
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "in use" in result.stderr and "--http" in result.stderr


# The process itself, as a user's Ctrl-C reaches it: the suite's fork-server launcher passes a signal on a moment later,
# and `communicate` closing stdin meanwhile ended `serve` as the end of input does (exit 0: 1 run in ~15 on a loaded
# host, on Python 3.13 in CI; 0 in 40 run directly).
@pytest.mark.plain_gateway
@pytest.mark.parametrize(
    ("command", "signum"),
    [
        (["status", "--wait", "30"], signal.SIGINT),
        (["tools", "--wait", "30"], signal.SIGINT),
        (["call", "silent", "anything", "--wait", "30"], signal.SIGINT),
        (["serve"], signal.SIGINT),
        # SIGTERM (Ctrl-Break on Windows: the same code path, `_platform.terminate_as_interrupt`) stops as Ctrl-C does.
        (["status", "--wait", "30"], signal.SIGTERM),
    ],
    ids=["status", "tools", "call", "serve", "status-sigterm"],
)
def test_ctrl_c_is_one_line_and_exit_code_130(
    env: dict[str, str], tmp_path: Path, silent_server: socket.socket, command: list[str], signum: signal.Signals
) -> None:
    """Ctrl-C while a command waits on a server that never answers: `breakwater: interrupted`, exit 130."""
    config = write_config(tmp_path / "mcp.json", {"silent": {"type": "http", "url": silent_url(silent_server)}})
    proc = subprocess.Popen(
        [*BREAKWATER, *command, "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # Its connect reaching the server proves the command is running, waiting on it.
        connection, _ = silent_server.accept()
        with connection:
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == "breakwater: interrupted\n"
    assert "Traceback" not in out


def test_ctrl_c_stops_serve_http_with_exit_code_130(env: dict[str, str], tmp_path: Path) -> None:
    """Ctrl-C on `serve --http`: the gateway shuts down cleanly, says so in one line and exits 130."""
    config = write_config(tmp_path / "mcp.json", {"fine": stdio_entry()})
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [*BREAKWATER, "serve", "--http", "0", "--port-file", str(port_file), "--config", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the gateway never announced its port"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "breakwater: interrupted"
    assert "Traceback" not in err


# ---- call -------------------------------------------------------------------------------------------------


def test_call_prints_the_result_and_parses_arg_values_as_json(env: dict[str, str], tmp_path: Path) -> None:
    """`call SERVER TOOL --arg k=v`: the tool's text on stdout, exit 0; values that parse as JSON are JSON."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry("--tool", "echo:latency=0")})
    pairs = ["--arg", "a=2", "--arg", "b=3.5", "--arg", "label=two"]
    result = run(env, "call", "shop", "echo", '{"payload": "hi"}', *pairs, "--config", str(config))
    assert result.returncode == 0, result.stderr
    echoed = json.loads(result.stdout)
    assert echoed["tool"] == "echo"
    assert echoed["arguments"].items() >= {"payload": "hi", "a": 2, "b": 3.5, "label": "two"}.items()

    as_json = run(env, "call", "shop", "echo", "--arg", "payload=x", "--json", "--config", str(config))
    assert as_json.returncode == 0, as_json.stderr
    call_result = json.loads(as_json.stdout)
    assert call_result["isError"] is False
    assert call_result["structuredContent"]["arguments"]["payload"] == "x"


def test_call_shows_the_error_envelope_and_exits_1(env: dict[str, str], tmp_path: Path) -> None:
    """A failed call: the tool's words, then one line with the code and what to do; `--json` has the envelope."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry("--tool", "broken:latency=0,error=1")})
    result = run(env, "call", "shop", "broken", "--config", str(config))
    assert result.returncode == 1
    assert result.stdout == ""
    last = result.stderr.splitlines()[-1]
    assert last.startswith("breakwater: call failed: TOOL_ERROR: Tool 'broken' on server 'shop'")

    as_json = run(env, "call", "shop", "nosuch", "--json", "--config", str(config))
    assert as_json.returncode == 1
    envelope = json.loads(as_json.stdout)["structuredContent"]
    assert (envelope["ok"], envelope["code"], envelope["server"], envelope["tool"]) == (False, "UNKNOWN_TOOL", "shop", "nosuch")


def test_a_call_that_may_have_run_names_its_operation_id(env: dict[str, str], tmp_path: Path) -> None:
    """OUTCOME_UNKNOWN in plain text: what cut it, and the operation id the user checks the outcome by (only --json had it)."""
    ledger = tmp_path / "ledger.jsonl"
    tools = ("--tool", "order:latency=3,mutating", "--ledger", str(ledger))
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry(*tools)})
    result = run({**env, "BREAKWATER_CALL_TIMEOUT_S": "0.5"}, "call", "shop", "order", "--config", str(config))
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert "OUTCOME_UNKNOWN" in last and "did not answer in time (no answer within 0.5 s)" in last, last
    named = re.findall(r'operationId "([0-9a-f]+)"|\(operation id ([0-9a-f]+)\)', last)
    assert len(named) == 1, last  # named once: by the advice, or by the command when the advice does not
    operation_id = "".join(named[0])
    assert [json.loads(line)["operation_id"] for line in ledger.read_text().splitlines()] == [operation_id]


def test_call_wait_is_the_whole_wait_for_a_server_still_starting(env: dict[str, str], tmp_path: Path) -> None:
    """`--wait 0` calls at once: the gate's own wait for a connecting server (the call's timeout) came on top of it,
    `--wait N` took N + 5 s. With a 60 s call timeout the old code took a minute."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry("--startup-delay", "120", "--tool", "add")})
    started = time.monotonic()
    result = run({**env, "BREAKWATER_CALL_TIMEOUT_S": "60"}, "call", "shop", "add", "--wait", "0", "--config", str(config))
    elapsed = time.monotonic() - started
    assert result.returncode == 1 and "SERVER_CONNECTING" in result.stderr, result.stderr
    assert elapsed < 30, elapsed  # the process's own start and stop, on a loaded machine, with room to spare


def test_call_usage_errors_exit_2_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    """An unknown server (with a suggestion) or arguments that are not a JSON object: one line, exit 2."""
    config = write_config(tmp_path / "mcp.json", {"shop": stdio_entry()})
    for args, expected in (
        (["shopp", "echo"], "no server named 'shopp'"),
        # The tool's name as the agent sees it, where the server goes: the call meant is said.
        (["shop__echo", "{}"], "is how the gateway names tool 'echo' of server 'shop': breakwater call shop echo"),
        (["shop", "echo", "[1, 2]"], "JSON_ARGS must be a JSON object"),
        (["shop", "echo", "{not json"], "JSON_ARGS is not JSON"),
        (["shop", "echo", '{"x": NaN}'], "JSON_ARGS is not JSON (NaN is not a JSON value)"),
        (["shop", "echo", '{"x": [-Infinity]}'], "-Infinity is not a JSON value"),
        # Deeper than the parser's recursion: a RecursionError traceback and exit 1.
        (["shop", "echo", '{"x": ' + "[" * 5000 + "]" * 5000 + "}"], "JSON_ARGS is not JSON (nested deeper than 256 levels)"),
        (["shop", "echo", '{"x": ' + "[" * 300 + "]" * 300 + "}"], "nested deeper than 256 levels"),
        (["shop", "echo", "--arg", "novalue"], "expected KEY=VALUE"),
        # What the tool would be sent is not what was written: the last of two keys, infinity.
        (["shop", "echo", '{"path": "/safe", "path": "/etc"}'], "JSON_ARGS gives the key 'path' twice in one object"),
        (["shop", "echo", "--arg", "path=/safe", "--arg", "path=/etc"], "--arg path= is given twice"),
        (["shop", "echo", '{"a": [1, 1e999]}'], "JSON_ARGS: a[1] is a number JSON cannot carry"),
        (["shop", "echo", "--arg", "a=-1e999"], "--arg a=-1e999: a number JSON cannot carry"),
    ):
        result = run(env, "call", *args, "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
    assert "(did you mean 'shop'?)" in run(env, "call", "shopp", "echo", "--config", str(config)).stderr


def test_ctrl_c_inside_an_import_that_wraps_it_is_still_an_interruption(capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while a dataclass is being defined (an attached `serve` loading its relay just after handing its
    session over) reaches the CLI, on Python 3.11, as RuntimeError("Error calling __set_name__ ...") from the
    KeyboardInterrupt (3.12 stopped wrapping it). It is an interruption all the same: one line and 130, not a
    traceback and 1 (seen once in CI)."""
    import dataclasses

    from breakwater.cli import _run

    class Interrupting:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    interrupting = Interrupting()

    def command(argv: list[str]) -> int:
        @dataclasses.dataclass
        class Defined:  # the class body's descriptor is interrupted as Python sets it up
            field: Any = interrupting

        return 0

    # What this Python makes of it, so the test holds the real shape on each version.
    with pytest.raises(RuntimeError if sys.version_info < (3, 12) else KeyboardInterrupt):
        command([])
    assert _run(command, []) == 130
    assert capsys.readouterr().err == "breakwater: interrupted\n"

    def wrapping(argv: list[str]) -> int:  # any wrapper that keeps the interrupt as its cause, on every version
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__") from exc

    assert _run(wrapping, []) == 130
    assert capsys.readouterr().err == "breakwater: interrupted\n"

    def failing(argv: list[str]) -> int:
        raise RuntimeError("a real error")

    with pytest.raises(RuntimeError, match="a real error"):  # anything else still propagates
        _run(failing, [])


_SAMPLING_SERVER = """
import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import CallToolResult, ListToolsResult, TextContent, Tool

OPEN = {"type": "object"}


async def list_tools(ctx, params):
    tools = [Tool(name="plain", input_schema=OPEN)]
    if ctx.session.client_params.capabilities.sampling is not None:  # as server-everything lists its sampling tool
        tools.append(Tool(name="summarise", input_schema=OPEN))
    return ListToolsResult(tools=tools)


async def call_tool(ctx, params):
    return CallToolResult(content=[TextContent(type="text", text="ran " + params.name)])


server = Server("s", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
"""


def test_tools_and_call_see_the_tools_serve_lists(env: dict[str, str], tmp_path: Path) -> None:
    """A server that lists a tool only to a client that can answer sampling (server-everything does): `tools` saved the
    shorter list to the catalog (a cold `serve` then answered its first clients with it), and `call` said UNKNOWN_TOOL
    of a tool `tools` listed; both connected without the capabilities `serve` declares."""
    script = tmp_path / "sampling_server.py"
    script.write_text(_SAMPLING_SERVER)
    config = write_config(tmp_path / "mcp.json", {"s": {"command": sys.executable, "args": [str(script)]}})
    listed = run(env, "tools", "--json", "--wait", "30", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert sorted(m["name"] for m in json.loads(listed.stdout)["matches"]) == ["s__plain", "s__summarise"], listed.stdout
    saved = [json.loads(p.read_text()) for p in (tmp_path / "catalog").glob("s-*.json")]
    assert any("summarise" in json.dumps(entry) for entry in saved), saved
    called = run(env, "call", "s", "summarise", "--wait", "30", "--config", str(config))
    assert (called.returncode, called.stdout.strip()) == (0, "ran summarise"), called.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="Windows does not remove a folder a process runs in")
@pytest.mark.parametrize("command", [["config", "check"], ["serve"], ["status", "--wait", "0"]])
def test_a_command_started_in_a_removed_folder_says_so_in_one_line(
    env: dict[str, str], tmp_path: Path, command: list[str]
) -> None:
    """An agent or a shell left in a folder that was removed (a deleted checkout): `config check` ended in a
    FileNotFoundError traceback. Every command says what is wrong and exits 2, before anything starts."""
    gone = tmp_path / "gone"
    gone.mkdir()
    # The program removes its own folder first: the state a shell left in a deleted folder starts it in.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import os, sys; os.rmdir({str(gone)!r}); from breakwater.cli import run; sys.argv[1:] = {command!r}; run()",
        ],
        cwd=gone,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == "breakwater: the current directory no longer exists; cd to one that does and run again\n"
