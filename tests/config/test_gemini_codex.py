"""Gemini CLI's settings.json and Codex's config.toml load as those agents read them, or fail naming file, key and fix.

The files here are the ones the agents' own `mcp add` commands write (`gemini mcp add`, `codex mcp add`, run
for real from `.tools/`), plus the keys their docs list that no command writes. Codex's own reading of a file
(`codex mcp list --json`) is compared with breakwater's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from breakwater.config import load_config
from breakwater.errors import ConfigError

OK = {"command": sys.executable, "args": ["-c", "pass"]}


def _gemini(tmp_path: Path, servers: dict[str, Any], **top: Any) -> Path:
    folder = tmp_path / ".gemini"
    folder.mkdir(exist_ok=True)
    path = folder / "settings.json"
    path.write_text(json.dumps({"theme": "GitHub", **top, "mcpServers": servers}))
    return path


def _codex(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / ".codex"
    folder.mkdir(exist_ok=True)
    path = folder / "config.toml"
    path.write_text('model = "gpt-5"\napproval_policy = "on-request"\n\n' + text)
    return path


# ---- Gemini CLI ----------------------------------------------------------------------------------


def test_a_gemini_server_list_naming_no_server_is_said_with_the_name_it_meant(tmp_path: Path) -> None:
    """`"allowed": ["githib"]` matched nothing: `github` was off, and nothing said why ("excluded" likewise: on)."""
    path = _gemini(tmp_path, {"github": OK, "fetch": OK}, mcp={"allowed": ["githib", "fetch"], "excluded": ["fetc"]})
    notes = load_config(path, environ={}).notes
    assert "mcp.allowed names 'githib', which is no server in this file (did you mean 'github'?)" in notes
    assert "mcp.excluded names 'fetc', which is no server in this file (did you mean 'fetch'?)" in notes


def test_a_gemini_settings_file_loads_with_its_keys_read_or_noted(tmp_path: Path) -> None:
    path = _gemini(
        tmp_path,
        {
            "local": {**OK, "env": {"KEY": "$MY_KEY", "BOTH": "${MY_KEY}/$MY_KEY"}, "timeout": 30000, "trust": True},
            "remote": {"httpUrl": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer $MY_KEY"}},
            "sse": {"url": "https://mcp.example.com/sse"},
            "picky": {**OK, "includeTools": ["a", "b"], "excludeTools": ["b"]},
            "off": OK,
            "ws": {"tcp": "localhost:9000"},
        },
        mcp={"excluded": ["off"], "serverCommand": "x"},
    )
    config = load_config(path, environ={"MY_KEY": "key-1234"})
    local, remote, sse, picky, off = (config.server(n) for n in ("local", "remote", "sse", "picky", "off"))
    assert local.env == {"KEY": "key-1234", "BOTH": "key-1234/key-1234"}  # Gemini CLI's $NAME, in its own file
    assert "key-1234" in local.secrets and remote.headers == {"Authorization": "Bearer key-1234"}
    assert {n.split(" ")[0] for n in local.notes} == {"timeout", "trust"}
    assert (remote.transport, remote.transport_guessed) == ("http", False)  # httpUrl is streamable HTTP
    assert (sse.transport, sse.transport_guessed) == ("http", True)  # a bare url: tried over HTTP, then SSE on 404/405
    # excludeTools wins over includeTools, as in Gemini CLI.
    assert [picky.tool_filter.left_out(t) for t in ("a", "b", "c")] == [
        None,
        "disabled in the config (excludeTools)",
        "not among the config's includeTools",
    ]
    assert not off.enabled and "mcp.excluded lists it" in off.notes[-1]
    assert [s.name for s in config.servers] == ["local", "remote", "sse", "picky", "off"]
    notes = " | ".join(config.notes)
    assert "mcpServers.ws skipped" in notes and "mcp.serverCommand ignored" in notes and "theme ignored" in notes


def test_gemini_allowed_starts_only_the_servers_it_lists(tmp_path: Path) -> None:
    config = load_config(_gemini(tmp_path, {"a": OK, "b": OK}, mcp={"allowed": ["a"]}), environ={})
    assert [(s.name, s.enabled) for s in config.servers] == [("a", True), ("b", False)]


def test_a_gemini_oauth_object_is_read_and_its_endpoints_left_to_discovery(tmp_path: Path) -> None:
    oauth = {
        "enabled": True,
        "clientId": "cid",
        "scopes": ["read", "write"],
        "redirectUri": "http://localhost:7777/oauth/callback",
    }
    path = _gemini(
        tmp_path,
        {
            "r": {"httpUrl": "https://h.example/mcp", "oauth": oauth},
            "n": {"url": "https://h.example/mcp", "oauth": {"enabled": False}},
        },
    )
    config = load_config(path, environ={})
    settings = config.server("r").oauth
    assert settings is not None and (settings.client_id, settings.scopes) == ("cid", "read write")
    assert any("oauth.redirectUri ignored" in n for n in config.server("r").notes)
    assert config.server("n").oauth is None


def test_dollar_name_is_a_variable_only_in_gemini_files(tmp_path: Path) -> None:
    """Claude Code passes `$NAME` as written, so a .mcp.json keeps it and `config check` says so."""
    path = tmp_path / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": {"a": {**OK, "env": {"KEY": "$MY_KEY", "PRICE": "5$"}}}}))
    spec = load_config(path, environ={"MY_KEY": "key-1234"}).server("a")
    assert spec.env == {"KEY": "$MY_KEY", "PRICE": "5$"}
    said = "env.KEY is '$MY_KEY', passed as written: only Gemini CLI's own files read $NAME as a variable"
    assert spec.notes == (f"{said}; write ${{MY_KEY}} for its value",)


# ---- Codex ---------------------------------------------------------------------------------------


def test_a_codex_config_loads_with_its_keys_read_or_noted(tmp_path: Path) -> None:
    path = _codex(
        tmp_path,
        f"""
[mcp_servers.local]
command = {json.dumps(sys.executable)}
args = ["-c", "pass"]
env_vars = ["PASSED", {{ name = "ALSO", source = "local" }}, "UNSET_HERE"]
tool_timeout_sec = 120
startup_timeout_ms = 20000
enabled_tools = ["a", "b"]
disabled_tools = ["b"]
default_tools_approval_mode = "approve"

[mcp_servers.local.env]
OWN = "1"
PASSED = "the entry's own wins"

[mcp_servers.remote]
url = "https://mcp.example.com/mcp"
bearer_token_env_var = "TOKEN"
http_headers = {{ "X-Team" = "${{NOT_EXPANDED}}" }}
env_http_headers = {{ "X-Key" = "KEY" }}
scopes = ["read"]
required = true

[mcp_servers.remote.oauth]
client_id = "cid"

[mcp_servers.breakwater]
command = "/opt/bin/breakwater"
args = ["serve", "--config", "/x/breakwater.toml"]
""",
    )
    config = load_config(path, environ={"PASSED": "p", "ALSO": "a", "TOKEN": "tok-12345678", "KEY": "key-98765432"})
    local, remote = config.server("local"), config.server("remote")
    assert local.env == {"PASSED": "the entry's own wins", "ALSO": "a", "OWN": "1"}
    assert (local.call.timeout_s, local.connect.attempt_timeout_s) == (120, 20)
    assert "timeout_s" in local.call_explicit and local.default_timeout_source == "configured"
    assert [local.tool_filter.left_out(t) for t in ("a", "b", "c")] == [
        None,
        "disabled in the config (disabled_tools)",
        "not among the config's enabled_tools",
    ]
    assert any("UNSET_HERE not set here" in n for n in local.notes)
    assert any(n.startswith("default_tools_approval_mode ignored") for n in local.notes)
    # Codex expands nothing in its file; the keys that name variables take them from the environment.
    assert remote.headers == {"X-Team": "${NOT_EXPANDED}", "X-Key": "key-98765432", "Authorization": "Bearer tok-12345678"}
    assert {"tok-12345678", "key-98765432"} <= set(remote.secrets)
    assert remote.oauth is not None and (remote.oauth.client_id, remote.oauth.scopes) == ("cid", "read")
    assert [s.name for s in config.servers] == ["local", "remote"]
    notes = " | ".join(config.notes)
    assert "approval_policy, model ignored: Codex's own settings" in notes
    assert "mcp_servers.breakwater skipped: it starts breakwater serve" in notes


def test_a_breakwater_toml_takes_codex_config_as_its_servers_file(tmp_path: Path) -> None:
    codex = _codex(tmp_path, '[mcp_servers.a]\ncommand = "x"\ntool_timeout_sec = 9\n')
    toml = tmp_path / "breakwater.toml"
    toml.write_text(f'servers_file = "{codex}"\n\n[servers.a.connect]\nbudget_s = 5\n')
    spec = load_config(toml, environ={}).server("a")
    assert (spec.command, spec.call.timeout_s, spec.connect.budget_s) == ("x", 9, 5)


CODEX_BAD = [
    ('command = "x"\ncomand = "y"\n', "mcp_servers.a.comand", "did you mean 'command'"),
    ('command = "x"\nurl = "https://h/mcp"\n', "mcp_servers.a.url", "both command and url are set"),
    ('command = "x"\nbearer_token_env_var = "T"\n', "mcp_servers.a.bearer_token_env_var", "a stdio server has no"),
    ('url = "https://h/mcp"\nenv_vars = ["A"]\n', "mcp_servers.a.env_vars", "an HTTP server has no env_vars"),
    ('url = "https://h/mcp"\nbearer_token = "SECRET1"\n', "mcp_servers.a.bearer_token", "bearer_token_env_var"),
    ('url = "https://h/mcp"\nbearer_token_env_var = "UNSET_T"\n', "mcp_servers.a.bearer_token_env_var", "UNSET_T is not set"),
    ('url = "https://h/mcp"\nenv_http_headers = { "X" = "UNSET_H" }\n', "mcp_servers.a.env_http_headers.X", "UNSET_H"),
    ('command = "x"\ntool_timeout_sec = -1\n', "mcp_servers.a.tool_timeout_sec", "positive"),
    ('command = "x"\ntool_timeout_sec = inf\n', "mcp_servers.a.tool_timeout_sec", "tool_timeout_sec"),
    ('command = "x"\nstartup_timeout_sec = "10"\n', "mcp_servers.a.startup_timeout_sec", "positive"),
    ('command = "x"\nenabled_tools = "a"\n', "mcp_servers.a.enabled_tools", "list of tool names"),
    ('command = "x"\nenv_vars = [{ name = "A", source = "remote" }]\n', "mcp_servers.a.env_vars[0].source", "remote"),
    ('command = "x"\nenv_vars = [3]\n', "mcp_servers.a.env_vars[0]", "variable"),
    ('url = "https://h/mcp"\nscopes = "read"\n', "mcp_servers.a.scopes", "list of scopes"),
    ('url = "https://h/mcp"\n[mcp_servers.a.oauth]\nclient_secret = "SECRET1"\n', "mcp_servers.a.oauth", "client_id"),
    ("enabled = true\n", "mcp_servers.a", "neither command nor url"),
    ('url = "ftp://h/mcp?k=SECRET1"\n', "mcp_servers.a.url", "scheme is 'ftp'"),
]


@pytest.mark.parametrize(
    ("table", "key", "says"), CODEX_BAD, ids=[c[1].rsplit(".", 1)[-1] + f"-{i}" for i, c in enumerate(CODEX_BAD)]
)
def test_a_wrong_codex_entry_names_the_key_as_written(tmp_path: Path, table: str, key: str, says: str) -> None:
    path = _codex(tmp_path, "[mcp_servers.a]\n" + table)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={"A": "1"})
    text = str(info.value)
    assert str(path) in text and f": {key}:" in text and says in text and "fix:" in text, text
    assert "SECRET1" not in text


GEMINI_BAD = [
    ({"httpUrl": "https://h/mcp", "type": "sse"}, "mcpServers.a.type", "httpUrl is a streamable HTTP server's address"),
    ({"httpUrl": "https://h/mcp", "url": "https://h/sse"}, "mcpServers.a.httpUrl", "both url and httpUrl"),
    ({**OK, "httpUrl": "https://h/mcp"}, "mcpServers.a.httpUrl", "a stdio server has no httpUrl"),
    ({**OK, "includeTools": "a"}, "mcpServers.a.includeTools", "list of tool names"),
    ({**OK, "disabledTools": ["a"], "excludeTools": ["b"]}, "mcpServers.a.excludeTools", "both disabledTools and excludeTools"),
    ({**OK, "env": {"K": "$UNSET_V"}}, "mcpServers.a.env.K", "UNSET_V is not set and $UNSET_V (Gemini CLI's form"),
    ({"httpUrl": "https://h/mcp", "oauth": {"enabled": "yes"}}, "mcpServers.a.oauth.enabled", "true or false"),
]


@pytest.mark.parametrize(
    ("entry", "key", "says"), GEMINI_BAD, ids=[c[1].rsplit(".", 1)[-1] + f"-{i}" for i, c in enumerate(GEMINI_BAD)]
)
def test_a_wrong_gemini_entry_names_the_key_as_written(tmp_path: Path, entry: dict[str, Any], key: str, says: str) -> None:
    path = _gemini(tmp_path, {"a": entry})
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    text = str(info.value)
    assert str(path) in text and f": {key}:" in text and says in text and "fix:" in text, text


def test_wrong_gemini_server_lists_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_gemini(tmp_path, {"a": OK}, mcp={"excluded": "a"}), environ={})
    assert ": mcp.excluded:" in str(info.value)


def test_an_entry_that_starts_breakwater_serve_is_skipped_in_any_file(tmp_path: Path) -> None:
    """Pointing breakwater at the agent's own file, which lists breakwater, must not start breakwater inside itself."""
    path = tmp_path / ".mcp.json"
    entries = {
        "bw": {"command": "breakwater", "args": ["serve", "--config", "x.toml"]},
        "bw-module": {"command": sys.executable, "args": ["-m", "breakwater", "serve"]},
        "tester": {"command": "breakwater", "args": ["testserver", "--tool", "add"]},
    }
    path.write_text(json.dumps({"mcpServers": entries}))
    config = load_config(path, environ={})
    assert [s.name for s in config.servers] == ["tester"]
    assert sum("starts breakwater serve" in n for n in config.notes) == 2


# ---- the agents' own commands write the files ----------------------------------------------------


def _run(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_what_codex_mcp_add_writes_loads_as_codex_reads_it(tmp_path: Path) -> None:
    from conformance.node_tools import node_tools

    tools = node_tools()
    home = tmp_path / ".codex"
    home.mkdir()
    env = dict(tools.env(), CODEX_HOME=str(home), HOME=str(tmp_path))
    codex = str(tools.bin / "codex")
    _run([codex, "mcp", "add", "local", "--env", "API_KEY=s3cret", "--", sys.executable, "-c", "pass"], env)
    _run([codex, "mcp", "add", "remote", "--url", "https://mcp.example.com/mcp", "--bearer-token-env-var", "TOKEN"], env)
    path = home / "config.toml"
    with path.open("a") as f:  # keys the docs list that `mcp add` has no flag for
        f.write('\n[mcp_servers.slow]\ncommand = "x"\ntool_timeout_sec = 90\nstartup_timeout_sec = 25\nenabled_tools = ["one"]\n')
    theirs = {s["name"]: s for s in json.loads(_run([codex, "mcp", "list", "--json"], env))}
    config = load_config(path, environ={"TOKEN": "t0k"})
    assert sorted(theirs) == sorted(s.name for s in config.servers) == ["local", "remote", "slow"]
    local, remote, slow = config.server("local"), config.server("remote"), config.server("slow")
    assert theirs["local"]["transport"] == {
        "type": "stdio",
        "command": local.command,
        "args": list(local.args),
        "env": dict(local.env),
        "env_vars": [],
        "cwd": None,
    }
    assert theirs["remote"]["transport"]["url"] == remote.url and remote.headers == {"Authorization": "Bearer t0k"}
    assert theirs["remote"]["transport"]["bearer_token_env_var"] == "TOKEN"
    assert (theirs["slow"]["tool_timeout_sec"], theirs["slow"]["startup_timeout_sec"]) == (
        slow.call.timeout_s,
        slow.connect.attempt_timeout_s,
    )
    assert slow.tool_filter.only == frozenset({"one"})


def test_what_gemini_mcp_add_writes_loads(tmp_path: Path) -> None:
    from conformance.node_tools import node_tools

    tools = node_tools()
    env = dict(tools.env(), HOME=str(tmp_path))
    add = [str(tools.bin / "gemini"), "mcp", "add", "-s", "user"]
    # Positionals first: yargs takes every word after an array option (-e, --include-tools) into it.
    local = ["local", sys.executable, "-e", "API_KEY=$MY_KEY", "--include-tools", "add,echo", "--trust", "--", "-c", "pass"]
    _run([*add, *local], env)
    _run([*add, "-t", "http", "-H", "Authorization: Bearer $MY_KEY", "remote", "https://mcp.example.com/mcp"], env)
    _run([*add, "-t", "sse", "legacy", "https://mcp.example.com/sse"], env)
    path = tmp_path / ".gemini" / "settings.json"
    written = json.loads(path.read_text())["mcpServers"]
    assert written["local"]["includeTools"] == ["add,echo"]  # one string: Gemini CLI 0.61 writes the list as given
    config = load_config(path, environ={"MY_KEY": "key-1234"})
    local_spec, remote, legacy = config.server("local"), config.server("remote"), config.server("legacy")
    assert (local_spec.command, local_spec.args, dict(local_spec.env)) == (
        sys.executable,
        ("-c", "pass"),
        {"API_KEY": "key-1234"},
    )
    assert local_spec.tool_filter.only == frozenset({"add", "echo"})
    assert (remote.transport, remote.url, dict(remote.headers)) == (
        "http",
        written["remote"]["url"],
        {"Authorization": "Bearer key-1234"},
    )
    assert (legacy.transport, legacy.url) == ("sse", "https://mcp.example.com/sse")


# ---- config import: the agent's file keeps its settings and lists breakwater alone -------------------


def _import(path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "breakwater", "config", "import", str(path), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)


def _understood(path: Path, environ: dict[str, str]) -> list[dict[str, Any]]:
    return [{**s.describe(), "call": s.call, "connect": s.connect} for s in load_config(path, environ=environ).servers]


def test_import_of_a_codex_config_moves_its_servers_and_keeps_every_other_setting(tmp_path: Path) -> None:
    import tomllib

    source = _codex(
        tmp_path,
        f"""# my servers
[mcp_servers.local]
command = {json.dumps(sys.executable)}
args = ["-c", "pass"]
tool_timeout_sec = 90
enabled_tools = ["a"]

[mcp_servers.local.env]
K = "v"

[mcp_servers."remote one"]
url = "https://mcp.example.com/mcp"
bearer_token_env_var = "TOKEN"

# the fast profile
[profiles.fast]
model = "gpt-5-mini"
""",
    )
    original = source.read_text()
    (tmp_path / ".codex" / "original.toml").write_text(original)
    done = _import(source, "--replace")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".codex" / "config.toml.bak").read_text() == original
    written, before = tomllib.loads(source.read_text()), tomllib.loads(original)
    assert {k: v for k, v in written.items() if k != "mcp_servers"} == {k: v for k, v in before.items() if k != "mcp_servers"}
    assert list(written["mcp_servers"]) == ["breakwater"] and "# the fast profile\n[profiles.fast]" in source.read_text()
    entry = written["mcp_servers"]["breakwater"]
    assert entry["args"][-3:] == ["serve", "--config", str((tmp_path / ".codex" / "breakwater.toml").resolve())]
    assert entry["tool_timeout_sec"] > 60  # Codex's default would cut a call breakwater still governs
    assert entry["startup_timeout_sec"] >= 15  # and its 10 s start-up is close to breakwater's 5 s first-list wait
    from conformance.node_tools import node_tools

    tools = node_tools()  # Codex itself reads the new file: breakwater is its one server
    env = dict(tools.env(), CODEX_HOME=str(tmp_path / ".codex"), HOME=str(tmp_path))
    theirs = json.loads(_run([str(tools.bin / "codex"), "mcp", "list", "--json"], env))
    assert [(s["name"], s["transport"]["args"], s["tool_timeout_sec"]) for s in theirs] == [
        ("breakwater", entry["args"], entry["tool_timeout_sec"])
    ]
    environ = {"TOKEN": "tok-12345678"}
    assert _understood(tmp_path / ".codex" / "breakwater.toml", environ) == _understood(
        tmp_path / ".codex" / "original.toml", environ
    )


def test_import_of_a_codex_config_refuses_servers_it_cannot_take_out_as_text(tmp_path: Path) -> None:
    source = _codex(tmp_path, 'mcp_servers.a.command = "x"\n')  # dotted keys at the top, not a table of its own
    done = _import(source, "--replace")
    assert done.returncode == 2 and "mcp_servers" in done.stderr and "fix:" in done.stderr, done.stderr
    assert not (tmp_path / ".codex" / "config.toml.bak").exists()


def test_import_of_gemini_settings_carries_its_server_lists_and_variables(tmp_path: Path) -> None:
    source = _gemini(
        tmp_path,
        {"local": {**OK, "env": {"KEY": "$MY_KEY"}, "excludeTools": ["wipe"]}, "off": OK},
        mcp={"excluded": ["off"], "serverCommand": "x"},
    )
    done = _import(source, "--replace", env={**os.environ, "MY_KEY": "key-1234"})
    assert done.returncode == 0, done.stderr
    agent = json.loads(source.read_text())
    assert agent["theme"] == "GitHub" and agent["mcp"] == {"serverCommand": "x"}  # breakwater is not excluded
    assert list(agent["mcpServers"]) == ["breakwater"]
    environ = {"MY_KEY": "key-1234"}
    moved = _understood(tmp_path / ".gemini" / "breakwater.toml", environ)
    assert moved == _understood(tmp_path / ".gemini" / "settings.json.bak", environ)
    assert [s["enabled"] for s in moved] == [True, False]


def test_gemini_cli_connects_to_breakwater_after_import(tmp_path: Path) -> None:
    """The whole move as a Gemini CLI user makes it: `gemini mcp add`, `config import --replace`, `gemini mcp list`."""
    from conformance.node_tools import node_tools

    tools = node_tools()
    env = dict(tools.env(), HOME=str(tmp_path), BREAKWATER_SHARE="off")
    add = [str(tools.bin / "gemini"), "mcp", "add", "-s", "user"]
    _run([*add, "adder", sys.executable, "--", "-m", "breakwater", "testserver", "--tool", "add"], env)
    settings = tmp_path / ".gemini" / "settings.json"
    done = _import(settings, "--replace", env=env)
    assert done.returncode == 0, done.stderr
    # Gemini CLI starts no server in a folder it has not been told to trust.
    (tmp_path / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(tmp_path): "TRUST_FOLDER"}))
    done = subprocess.run(
        [str(tools.bin / "gemini"), "mcp", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    listed = [line for line in (done.stdout + done.stderr).splitlines() if "breakwater" in line]  # it prints to stderr
    assert len(listed) == 1 and "serve --config" in listed[0] and listed[0].endswith("- Connected"), done.stdout + done.stderr


# ---- servers a client keeps beside its top-level list ----------------------------------------------


def test_claude_codes_local_scope_is_read_for_the_folder_breakwater_runs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`claude mcp add` (its default, local scope) keeps a server in ~/.claude.json under the project's folder; a
    session there gets it, and it wins over a user-scope server of the same name."""
    from conformance.node_tools import node_tools

    tools = node_tools()
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    env = dict(tools.env(), HOME=str(tmp_path))
    claude = str(tools.bin / "claude")
    for scope, name, command in (
        ("local", "here", "local-cmd"),
        ("user", "everywhere", "user-cmd"),
        ("user", "here", "shadowed"),
    ):
        subprocess.run([claude, "mcp", "add", "-s", scope, name, "--", command], cwd=project, env=env, check=True, timeout=120)
    path = tmp_path / ".claude.json"
    monkeypatch.chdir(project / "sub")  # a session in a folder of the project
    config = load_config(path, environ={})
    assert {s.name: s.command for s in config.servers} == {"everywhere": "user-cmd", "here": "local-cmd"}
    assert any(n.startswith(f"projects.{project}.mcpServers read") and n.endswith(": here") for n in config.notes)
    monkeypatch.chdir(tmp_path)  # no project here: the user's servers only, and a note that says why
    config = load_config(path, environ={})
    assert {s.name: s.command for s in config.servers} == {"everywhere": "user-cmd", "here": "shadowed"}
    assert any(n.startswith("projects: none is") for n in config.notes)


def test_vs_code_user_settings_with_an_mcp_object_load_and_import(tmp_path: Path) -> None:
    """VS Code kept servers in settings.json (`"mcp": {"servers": ...}`) before it had mcp.json; both load."""
    settings = tmp_path / "settings.json"
    settings.write_text(
        '{\n  // mine\n  "editor.fontSize": 14,\n  "mcp": {"servers": {"a": {"type": "stdio", "command": "x"}}}\n}\n'
    )
    config = load_config(settings, environ={})
    assert [(s.name, s.command) for s in config.servers] == [("a", "x")] and "editor.fontSize ignored" in config.notes[0]
    done = _import(settings, "--replace")
    assert done.returncode == 0, done.stderr
    agent = json.loads(settings.read_text())
    assert agent["editor.fontSize"] == 14 and list(agent["mcp"]["servers"]) == ["breakwater"]
    assert [s.name for s in load_config(tmp_path / "breakwater.toml", environ={}).servers] == ["a"]


def _toml_string(text: str) -> str:
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\U{ord(c):08x}" for c in text) + '"'


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_string(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return _toml_string(value)


_NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)
_LEAF = st.one_of(_NAMES, st.integers(-(2**40), 2**40), st.booleans(), st.floats(allow_nan=False))
_VALUES = st.recursive(
    _LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_NAMES, inner, max_size=3)), max_leaves=6
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    servers=st.dictionaries(
        _NAMES,
        st.dictionaries(st.sampled_from(["args", "env", "tools", "name", "required", "scopes"]), _VALUES, max_size=3),
        max_size=3,
    ),
    settings_=st.dictionaries(st.sampled_from(["model", "approval_policy", "notify"]), _VALUES, max_size=2),
)
def test_property_a_codex_import_moves_any_servers_exactly_or_refuses(
    tmp_path: Path, servers: dict[str, Any], settings_: dict[str, Any]
) -> None:
    """Whatever a Codex file's servers hold (any names, strings, nesting), import writes them back exactly and leaves
    every other setting as it was, or refuses with the file, the key and the fix; it never writes a file that says
    something else."""
    from breakwater.config._import import plan_import

    folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    source = folder / "config.toml"
    lines = [f"{k} = {_toml(v)}" for k, v in settings_.items()]
    for name, table in servers.items():
        lines += [f"[mcp_servers.{_toml_string(name)}]", 'command = "x"', *(f"{k} = {_toml(v)}" for k, v in table.items())]
    source.write_text("\n".join(lines) + "\n")
    try:
        files = plan_import(source)
    except ConfigError as exc:
        assert str(source) in str(exc) and "fix:" in str(exc), str(exc)
        return
    import tomllib

    written = tomllib.loads(files[folder / "breakwater.servers.toml"])
    assert written.get("mcp_servers", {}) == {n: {"command": "x", **t} for n, t in servers.items() if n != "breakwater"}
    agent = tomllib.loads(files[source])
    assert {k: v for k, v in agent.items() if k != "mcp_servers"} == settings_
    assert list(agent["mcp_servers"]) == ["breakwater"]


def test_import_of_a_codex_config_keeps_its_approvals_under_the_tools_names_through_breakwater(tmp_path: Path) -> None:
    """Codex asked before `github`'s calls (`prompt`) and never before its `search`: behind breakwater the one entry asks
    by the most careful of the servers' defaults, and each tool's own mode moves to the tool's new name."""
    import tomllib

    source = _codex(
        tmp_path,
        """[mcp_servers.github]
command = "x"
default_tools_approval_mode = "prompt"

[mcp_servers.github.tools.search]
approval_mode = "approve"

[mcp_servers.notes]
command = "y"
""",
    )
    assert _import(source, "--replace").returncode == 0
    entry = tomllib.loads(source.read_text())["mcp_servers"]["breakwater"]
    assert entry["default_tools_approval_mode"] == "prompt"
    assert entry["tools"] == {"github__search": {"approval_mode": "approve"}}
    from conformance.node_tools import node_tools

    tools = node_tools()  # and Codex reads the entry
    env = dict(tools.env(), CODEX_HOME=str(tmp_path / ".codex"), HOME=str(tmp_path))
    assert [s["name"] for s in json.loads(_run([str(tools.bin / "codex"), "mcp", "list", "--json"], env))] == ["breakwater"]


def test_status_says_why_a_server_is_not_started(tmp_path: Path) -> None:
    """A server Gemini CLI's `mcp.excluded` names, or one the entry turns off, is `disabled` in `status`, with the
    key that decided it: a user who sees a server missing learns where to look."""
    from breakwater.status import StatusReport

    settings = _gemini(tmp_path, {"on": OK, "off": OK, "paused": {**OK, "disabled": True}}, mcp={"excluded": ["off"]})
    cmd = [sys.executable, "-m", "breakwater", "status", "--json", "--config", str(settings)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "BREAKWATER_SHARE": "off"}
    )
    report = StatusReport.from_json(json.loads(done.stdout))
    said = {s.name: (s.state.value, s.disabled_by) for s in report.servers}
    assert said["off"] == ("disabled", "mcp.excluded lists it (Gemini CLI's settings)")
    assert said["paused"] == ("disabled", "mcpServers.paused.disabled is true")
    assert said["on"][1] is None
    table = subprocess.run(
        [c for c in cmd if c != "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "BREAKWATER_SHARE": "off"},
    )
    assert "off: not started: mcp.excluded lists it (Gemini CLI's settings)" in table.stdout
