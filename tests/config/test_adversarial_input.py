"""The second adversarial pass over config input: the classes it found, each held by a test.

Accepted-then-crashing values (a host httpx2 refuses, a server name too long for a file name), files
that never end (a FIFO, `/dev/zero`), text printed as markup or obeyed by the terminal, secrets in
shapes the redactor did not know (a whole command line in `command`, `--header=Authorization: ...`,
an `@` in a URL's password), `config import` that printed the agent's other secrets or wrote half
of its files, and an `oauth.clientSecret` of `${VAR}` never expanded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from breakwater._paths import MAX_SECRET_FILE_BYTES, file_stem
from breakwater.config import load_config
from breakwater.config._checks import check_url
from breakwater.config._redact import arg_secrets
from breakwater.errors import ConfigError, visible
from breakwater.testing.server import launch_command

pytestmark = pytest.mark.long_module(20)


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "breakwater", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        check=False,
    )


HOSTS = [
    "127.0.0.1",
    "999.999.999.999",
    "1.2.3",
    "[::1]",
    "[zz]",
    "[fe80::1%25eth0]",
    "exa_mple.com",
    "a..b",
    "\u00e9.com",
    "\u2603.net",
    "xn--a.com",
    "0.0.0.256",
]


@pytest.mark.parametrize("host", HOSTS)
def test_a_url_is_refused_exactly_when_httpx2_would_refuse_it(host: str) -> None:
    """Once, `http://999.999.999.999/` passed `config check` and every connect failed with AddressValueError."""
    url = f"http://{host}:8080/mcp"
    try:
        httpx2.URL(url)
        sendable = True
    except httpx2.InvalidURL:
        sendable = False
    try:
        check_url(url, path="p", key="k")
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == sendable


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_config_that_never_ends_is_refused_at_once(tmp_path: Path, target: str) -> None:
    """A FIFO waited for a writer for ever; /dev/zero read until the memory ran out."""
    path = tmp_path / "fifo"
    if target == "fifo":
        os.mkfifo(path)
    else:
        path = Path(target)
    result = _cli("config", "check", "--config", str(path), cwd=tmp_path, timeout=30)
    assert result.returncode == 2 and "not a regular file" in result.stderr, result.stderr


def test_a_claude_json_of_many_megabytes_is_read(tmp_path: Path) -> None:
    """Claude Code's ~/.claude.json keeps each project's history and grows to tens of megabytes: 4 MiB refused it."""
    history = [{"display": "x" * 1000, "pastedContents": {}} for _ in range(6000)]  # 6 MB
    data = {"mcpServers": {"a": {"command": "x"}}, "projects": {str(tmp_path / "elsewhere"): {"history": history}}}
    path = tmp_path / ".claude.json"
    path.write_text(json.dumps(data))
    assert path.stat().st_size > 6_000_000
    assert [spec.name for spec in load_config(path, environ={}).servers] == ["a"]


def test_a_file_reference_to_a_device_or_a_huge_file_is_refused(tmp_path: Path) -> None:
    """OpenCode's `{file:}` read /dev/zero until a MemoryError, and a 50 MB file for a minute."""
    big = tmp_path / "big.txt"
    big.write_text("x" * (MAX_SECRET_FILE_BYTES + 1))
    for name in ("/dev/zero", str(big)):
        config = tmp_path / "opencode.json"
        config.write_text(
            json.dumps({"mcp": {"a": {"type": "local", "command": ["x"], "environment": {"K": f"{{file:{name}}}"}}}})
        )
        with pytest.raises(ConfigError) as info:
            load_config(config, environ={})
        assert "mcp.a.environment.K" in str(info.value) and (
            "not a regular file" in str(info.value) or "larger" in str(info.value)
        )


def test_config_check_prints_the_files_text_not_markup_or_control(tmp_path: Path) -> None:
    """An argument `[/]` crashed Rich's markup (a traceback); a bidirectional override was obeyed by the terminal."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"[red]a": {"command": "x", "args": ["[/]", "\u202eb", "[bold]c"]}}}))
    result = _cli("config", "check", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "[red]a" in result.stdout and "x [/] \\u202eb [bold]c" in result.stdout
    assert "\u202e" not in result.stdout


def test_an_error_shows_a_keys_invisible_characters_escaped(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"a": {"command": "x", "env": {"K\\u0007\\u202e": 5, "K\\u0007\\u202e": 6}}}}')
    with pytest.raises(ConfigError) as info:
        load_config(config, environ={})
    assert "\u202e" not in str(info.value).splitlines()[0].split(": ", 2)[1] and "\\u202e" in str(info.value)
    assert visible("a\u202eb\nc") == "a\\u202eb\\u000ac"


@pytest.mark.anyio
async def test_a_long_server_name_serves_its_tools(tmp_path: Path) -> None:
    """A 300-character name passed `config check`; `serve` then died at tools/list: its cache file's name was too long."""
    name = "s" * 300
    command = launch_command("--tool", "add")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {name: {"command": command[0], "args": command[1:]}}}))
    env = {**os.environ, "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog")}
    env["BREAKWATER_PROTOCOL_MEMORY_DIR"] = str(tmp_path / "protocols")
    serve = StdioServerParameters(command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env)
    with anyio.fail_after(60):
        async with Client(serve, mode="legacy") as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            # The name is cut to the client's limit with a hash of the whole (`tool_name_max`): the server's own tools.
            assert len([tool for tool in listed if tool.startswith("sss")]) >= 1, listed
    assert len(file_stem(name)) <= 100 and file_stem(name) != file_stem("s" * 301)
    assert [p for p in (tmp_path / "catalog").iterdir() if p.name.startswith(file_stem(name))]


def test_a_whole_command_line_and_a_header_argument_hold_secrets(tmp_path: Path) -> None:
    """Cursor's `"command": "prog --api-key=K"` and mcp-remote's `--header=Authorization: Bearer T` were printed."""
    config = tmp_path / "mcp.json"
    entry = {
        "command": "prog --api-key=Kk1Kk1Kk1Kk1 --token Tt2Tt2Tt2Tt2",
        "args": ["--header=Authorization: Bearer Hh3Hh3Hh3Hh3"],
    }
    config.write_text(json.dumps({"mcpServers": {"a": entry}}))
    secrets = load_config(config, environ={}).server("a").secrets
    assert {"Kk1Kk1Kk1Kk1", "Tt2Tt2Tt2Tt2", "Hh3Hh3Hh3Hh3"} <= set(secrets)
    assert "Hh3Hh3Hh3Hh3" in set(arg_secrets(["--header", "Authorization: Bearer Hh3Hh3Hh3Hh3"]))
    result = _cli("config", "check", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0 and not any(s[:8] in result.stdout for s in ("Kk1Kk1Kk1Kk1", "Tt2Tt2Tt2Tt2", "Hh3Hh3Hh3Hh3"))


def test_a_user_password_pair_after_curls_user_flags_is_a_secret(tmp_path: Path) -> None:
    """A failing headersHelper `curl -sf -u deploy:PASSWORD ...` was quoted whole in its error, on the status page."""
    words = {
        "curl -sf -u deploy:Pp4Pp4Pp4Pp4 https://vault.example/h": "Pp4Pp4Pp4Pp4",
        "curl --user=ops:Qq5Qq5Qq5Qq5 https://vault.example/h": "Qq5Qq5Qq5Qq5",
        "curl -U proxy:Rr6Rr6Rr6Rr6 https://vault.example/h": "Rr6Rr6Rr6Rr6",
        "curl -u sk_live_Ss7Ss7Ss7Ss7: https://api.example/v1": "sk_live_Ss7Ss7Ss7Ss7",  # an API key as the user
    }
    for command, secret in words.items():
        assert secret in set(arg_secrets(command.split())), command
    assert set(arg_secrets(["ls", "-u", "-l", "/tmp"])) == set()
    config = tmp_path / "mcp.json"
    entry = {
        "type": "http",
        "url": "http://127.0.0.1:9/mcp",
        "headersHelper": "curl -sf -u deploy:Pp4Pp4Pp4Pp4 http://127.0.0.1:9/h",
    }
    config.write_text(json.dumps({"mcpServers": {"jira": entry}}))
    result = _cli("config", "check", "--config", str(config), cwd=tmp_path)
    assert "deploy:<redacted>" in result.stdout and "Pp4Pp4" not in result.stdout + result.stderr, result


@pytest.mark.parametrize(
    ("entry", "secret"),
    [
        ({"command": "x", "args": ["--api-key=Aa1Aa1Aa1Aa1\u0000"]}, "Aa1Aa1Aa1Aa1"),
        ({"command": "x --token=Bb2Bb2Bb2Bb2\u200b"}, "Bb2Bb2Bb2Bb2"),
        ({"type": "http", "url": "http://user:Pa@Cc3Cc3Cc3Cc3@127.0.0.1:99999/mcp"}, "Cc3Cc3Cc3Cc3"),
        ({"type": "http", "url": "http://127.0.0.1:99999/mcp#Dd4Dd4Dd4Dd4"}, "Dd4Dd4Dd4Dd4"),
        ({"type": "http", "url": "http://127.0.0.1:99999/Ee5Ee5Ee5Ee5/mcp"}, "Ee5Ee5Ee5Ee5"),
    ],
)
def test_a_config_error_does_not_quote_a_secret(tmp_path: Path, entry: dict[str, object], secret: str) -> None:
    """An error is written before the config's secrets are known to the redactor: it quotes none of them."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": entry}}))
    with pytest.raises(ConfigError) as info:
        load_config(config, environ={})
    assert secret[:8] not in str(info.value) and "mcpServers.a" in str(info.value)


def test_a_url_path_holding_an_expanded_secret_is_redacted_in_config_check(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"url": "http://127.0.0.1:1/${API_TOKEN}/mcp"}}}))
    result = _cli("config", "check", "--json", "--config", str(config), cwd=tmp_path, env={"API_TOKEN": "Ff6Ff6Ff6Ff6"})
    assert result.returncode == 0 and "Ff6Ff6Ff" not in result.stdout and "127.0.0.1:1" in result.stdout


def test_an_oauth_client_secret_variable_is_expanded_and_secret(tmp_path: Path) -> None:
    """The README says `"clientSecret": "${VAR}"`; the literal `${VAR}` was sent to the token endpoint."""
    config = tmp_path / "mcp.json"
    oauth = {"grantType": "client_credentials", "clientId": "cid", "clientSecret": "${MY_CS}"}
    config.write_text(json.dumps({"mcpServers": {"a": {"type": "http", "url": "https://h.test/mcp", "oauth": oauth}}}))
    loaded = load_config(config, environ={"MY_CS": "Gg7Gg7Gg7Gg7"})
    spec = loaded.server("a")
    assert spec.oauth is not None and spec.oauth.client_secret == "Gg7Gg7Gg7Gg7" and "Gg7Gg7Gg7Gg7" in loaded.secrets
    with pytest.raises(ConfigError, match="MY_CS"):
        load_config(config, environ={})


def test_import_prints_no_secret_of_the_agents_file(tmp_path: Path) -> None:
    """The agent's new file was printed whole: other projects' servers of ~/.claude.json, entries left with the agent."""
    command = launch_command("--tool", "add")
    data = {
        "mcpServers": {
            "t": {"command": command[0], "args": command[1:], "env": {"K": "Hh8Hh8Hh8Hh8"}},
            "ws": {"type": "ws", "url": "ws://h.test/x?token=Ii9Ii9Ii9Ii9", "headers": {"Authorization": "Bearer Jj0Jj0Jj0Jj0"}},
        },
        "projects": {"/elsewhere": {"mcpServers": {"o": {"command": "x", "env": {"K": "Kk1Kk1Kk1Kk2"}}}}},
    }
    (tmp_path / ".claude.json").write_text(json.dumps(data))
    result = _cli("config", "import", ".claude.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not any(
        s[:8] in result.stdout + result.stderr for s in ("Hh8Hh8Hh8Hh8", "Ii9Ii9Ii9Ii9", "Jj0Jj0Jj0Jj0", "Kk1Kk1Kk1Kk2")
    )
    assert ".claude.breakwater.json" in result.stdout


def test_import_writes_every_file_or_none(tmp_path: Path) -> None:
    """A target that could not be written (here a directory) left the other two files written and a traceback."""
    command = launch_command("--tool", "add")
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"t": {"command": command[0], "args": command[1:]}}}))
    (tmp_path / ".mcp.breakwater.json").mkdir()
    result = _cli("config", "import", ".mcp.json", "--force", cwd=tmp_path)
    assert result.returncode == 1 and "nothing was changed" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mcp.breakwater.json", ".mcp.json"]


def test_import_of_a_file_without_servers_is_refused(tmp_path: Path) -> None:
    """It wrote a gateway in front of nothing, and the agent's file that starts it."""
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {}}))
    result = _cli("config", "import", ".mcp.json", cwd=tmp_path)
    assert result.returncode == 2 and "no server" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mcp.json"]


# ---- the third pass: variations of the same classes --------------------------------------------------------------


def test_one_redaction_table_serves_every_redactor_of_the_same_secrets() -> None:
    """Built per Redactor, `config check` of 1,000 servers with a secret each took over 30 s (each server's describe
    built the table of all 1,000 registered secrets)."""
    from breakwater.config._redact import Redactor

    secrets = [f"BigSecret{i:06d}xyz" for i in range(50)]
    first, second = Redactor(secrets), Redactor(list(reversed(secrets)))
    assert first._tables()[0] is second._tables()[0]
    assert first("x BigSecret000007xyz y") == "x <redacted> y"


def test_a_key_in_a_url_path_is_a_secret(tmp_path: Path) -> None:
    """Zapier's `/mcp/sk-ak-.../sse` was shown in config check, status and /api/status; `auth status --json` showed
    the whole URL, password and query too."""
    url = "http://bob:Pp9Pp9Pp9Pp9@127.0.0.1:9/mcp/sk-ak-Zz8Zz8Zz8Zz8Zz8/sse?token=Qq7Qq7Qq7Qq7"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"z": {"url": url, "oauth": {"clientId": "cid"}}}}))
    assert "sk-ak-Zz8Zz8Zz8Zz8Zz8" in load_config(config, environ={}).server("z").secrets
    home = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for command in (["config", "check"], ["config", "check", "--json"], ["auth", "status", "--json"], ["auth", "status"]):
        result = _cli(*command, "--config", str(config), cwd=tmp_path, env=home)
        assert result.returncode == 0, result.stderr
        shown = result.stdout + result.stderr
        assert not any(s in shown for s in ("Pp9Pp9Pp", "Zz8Zz8Zz", "Qq7Qq7Qq")), shown
    assert "/mcp/<redacted>/sse" in _cli("config", "check", "--config", str(config), cwd=tmp_path).stdout


def test_claude_json_with_only_other_folders_servers_loads_none_and_says_why(tmp_path: Path) -> None:
    """It was refused: `no "mcpServers" object`, fix "write mcpServers"; and a project "" matched every folder."""
    data = {"numStartups": 3, "projects": {"/nowhere/else": {"mcpServers": {"p": OK_ENTRY}}, "": {"mcpServers": {"q": OK_ENTRY}}}}
    (tmp_path / ".claude.json").write_text(json.dumps(data))
    result = _cli("config", "check", "--config", str(tmp_path / ".claude.json"), cwd=tmp_path)
    assert result.returncode == 0 and "0 servers" in result.stdout and "none is" in result.stdout, result.stdout


OK_ENTRY = {"command": "x"}


def test_an_env_file_with_a_bom_names_its_first_variable_as_written(tmp_path: Path) -> None:
    """Notepad's BOM became part of the first name (`\\ufeffFIRST_K`): the server never got FIRST_K."""
    (tmp_path / ".env").write_bytes("\ufeffFIRST_K=one\r\nSECOND_K=two\r\n".encode())
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "envFile": str(tmp_path / ".env")}}}))
    assert dict(load_config(config, environ={}).server("a").env) == {"FIRST_K": "one", "SECOND_K": "two"}


@pytest.mark.parametrize("char", ["\ufe0f", "\u034f", "\u3164", "\u115f", "\u17b4", "\u2800", "\uffa0"])
def test_a_server_name_with_a_character_that_shows_nothing_is_refused(tmp_path: Path, char: str) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {f"a{char}b": {"command": "x"}}}))
    with pytest.raises(ConfigError, match=f"U\\+{ord(char):04X}"):
        load_config(config, environ={})


def test_names_that_look_the_same_are_noted_and_kept_apart_on_disk(tmp_path: Path) -> None:
    """ "é" composed and decomposed, "Git" and "git": accepted without a word, and (with "a b" and "a_b") one cache file."""
    config = tmp_path / "mcp.json"
    names = ["\u00e9", "e\u0301", "Git", "git", "a b", "a_b"]
    config.write_text(json.dumps({"mcpServers": {name: {"command": "x"} for name in names}}))
    notes = " ".join(load_config(config, environ={}).notes)
    assert "'\\xe9', 'e\\u0301' look the same" in notes and "'Git', 'git' look the same" in notes
    stems = [file_stem(name) for name in names]
    assert len(set(stems)) == len(names) and len({s.lower() for s in stems}) == len(names)
    assert file_stem("github") == "github"  # a name that needs nothing keeps its cache file


@pytest.mark.parametrize("value", ["1_000", "\u0665", "0x10", "1 2"])
def test_a_number_written_as_text_is_plain_digits(value: str) -> None:
    """Python's int() read "1_000" and the Arabic-Indic "٥"; an environment variable set so was taken as a number."""
    with pytest.raises(ConfigError, match=r"BREAKWATER_CALL_TIMEOUT_S|timeout_s"):
        load_config_env({"BREAKWATER_CALL_TIMEOUT_S": value})


def load_config_env(environ: dict[str, str]) -> None:
    from breakwater.config import CallPolicy
    from breakwater.config._knobs import build_policy, env_layer

    build_policy(CallPolicy, [env_layer(CallPolicy, environ)])


def test_status_says_which_configured_tool_names_the_server_does_not_list(tmp_path: Path) -> None:
    """`[servers.t.tools.ecko]` (a typo) and `includeTools: ["g__echo"]` (the gateway's name) configured nothing, and
    nothing said so; the allow-list hid every tool."""
    command = launch_command("--tool", "echo", "--tool", "add")
    toml = tmp_path / "breakwater.toml"
    toml.write_text(
        f"servers_file = 'mcp.json'\n[servers.t]\ncommand = {json.dumps(command[0])}\nargs = {json.dumps(command[1:])}\n"
        "[servers.t.tools.ecko]\ntimeout_s = 9\n[servers.t.tools.add]\ntimeout_s = 9\n"
    )
    (tmp_path / "mcp.json").write_text(
        json.dumps({"mcpServers": {"g": {"command": command[0], "args": command[1:], "includeTools": ["g__echo", "add"]}}})
    )
    result = _cli("status", "--json", "--wait", "30", "--config", str(toml), cwd=tmp_path)
    servers = {s["name"]: s for s in json.loads(result.stdout)["servers"]}
    assert servers["t"]["unmatched"] == [
        "servers.t.tools.ecko names the tool 'ecko', which the server does not list (did you mean 'echo'?)"
    ]
    assert servers["g"]["unmatched"] == [
        "includeTools names the tool 'g__echo', which the server does not list (did you mean 'echo'?)"
    ]
    text = _cli("status", "--wait", "30", "--config", str(toml), cwd=tmp_path)
    assert "t: servers.t.tools.ecko names the tool 'ecko'" in text.stdout + text.stderr
