"""Config: both file shapes, every error names file, key and fix, knobs documented once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from breakwater.config import CallPolicy, ConnectPolicy, all_knobs, find_config, load_config
from breakwater.config._knobs import render_markdown
from breakwater.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_reads_claude_code_mcp_json_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .mcp.json as Claude Code writes it loads as is, stdio and HTTP entries alike."""
    monkeypatch.delenv("BREAKWATER_PROTOCOL_MEMORY_DIR")  # the test run's own (conftest), not the file's: defaults all round
    cfg = write(
        tmp_path / ".mcp.json",
        {
            "mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": {"K": "v"}},
                "remote": {"type": "http", "url": "https://example.test/mcp", "headers": {"Authorization": "Bearer abc"}},
                "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
                "cline": {"command": "x", "disabled": True, "autoApprove": [], "alwaysAllow": []},
            }
        },
    )
    config = load_config(cfg)
    fs, remote, legacy, cline = config.servers
    assert (fs.transport, fs.command, fs.args, dict(fs.env)) == (
        "stdio",
        "npx",
        ("-y", "@modelcontextprotocol/server-filesystem", "/tmp"),
        {"K": "v"},
    )
    assert (remote.transport, remote.url, dict(remote.headers)) == (
        "http",
        "https://example.test/mcp",
        {"Authorization": "Bearer abc"},
    )
    assert legacy.transport == "sse"
    assert cline.enabled is False
    assert fs.connect == ConnectPolicy()


def test_vscode_servers_key(tmp_path: Path) -> None:
    """VS Code's "servers" + "inputs" shape loads too."""
    cfg = write(tmp_path / "mcp.json", {"servers": {"a": {"type": "stdio", "command": "a"}}, "inputs": []})
    assert [s.name for s in load_config(cfg).servers] == ["a"]


@pytest.mark.parametrize(
    ("content", "key", "fix_fragment"),
    [
        ('{"mcpServers": {"a": {"command" "x"}}}', None, "JSON syntax"),
        ('{"mcpServers": {"a": {"command": "x"}} /* never closed', None, "JSON syntax"),
        ({"mcpServers": {"a": {"comand": "x"}}}, "mcpServers.a.comand", "did you mean 'command'"),
        ({"mcpServers": {"a": {"args": ["x"]}}}, "mcpServers.a.command", "add"),
        ({"mcpServers": {"a": {"command": "x", "args": "--flag"}}}, "mcpServers.a.args", '"args": ['),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": ["v"]}}}}, "mcpServers.a.env.K", "quote"),
        ({"mcpServers": {"a": {"type": "http"}}}, "mcpServers.a.url", "url"),
        ({"mcpServers": {"a": {"type": "websocket", "url": "ws://x"}}}, "mcpServers.a.type", "stdio"),
        ({"servrs": {}}, "servrs", 'did you mean "servers"?'),  # the key the file has, with the table it meant
        ({"other": {}}, "mcpServers", "mcpServers"),
    ],
)
def test_broken_json_names_file_key_and_fix(tmp_path: Path, content: object, key: str | None, fix_fragment: str) -> None:
    """Each mistake is reported with the file, the key and a fix."""
    cfg = write(tmp_path / "mcp.json", content)
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    err = info.value
    assert err.path == str(cfg)
    assert err.key == key
    assert fix_fragment in (err.fix or "")
    assert str(cfg) in str(err)


def test_toml_policy_layers(tmp_path: Path) -> None:
    """breakwater.toml points at the JSON, sets defaults, overrides per server, and defines servers inline."""
    write(tmp_path / "servers.json", {"mcpServers": {"a": {"command": "a"}, "b": {"command": "b"}}})
    cfg = write(
        tmp_path / "breakwater.toml",
        """
servers_file = "servers.json"
[connect]
attempt_timeout_s = 12
[servers.b]
enabled = false
[servers.b.connect]
attempt_timeout_s = 40
max_per_server_connects = 1
[servers.c]
url = "http://127.0.0.1:8000/mcp"
""",
    )
    config = load_config(cfg, environ={})
    a, b, c = config.servers
    assert a.connect.attempt_timeout_s == 12
    assert (b.enabled, b.connect.attempt_timeout_s, b.connect.max_per_server_connects) == (False, 40, 1)
    assert (c.transport, c.connect.attempt_timeout_s) == ("http", 12)


def test_environment_overrides_defaults_but_not_server_tables(tmp_path: Path) -> None:
    """Precedence: code default < [connect] < environment < [servers.X.connect]."""
    cfg = write(
        tmp_path / "breakwater.toml",
        """
[connect]
budget_s = 10
[servers.a]
command = "a"
[servers.b]
command = "b"
[servers.b.connect]
budget_s = 99
""",
    )
    config = load_config(cfg, environ={"BREAKWATER_CONNECT_BUDGET_S": "50"})
    assert [s.connect.budget_s for s in config.servers] == [50, 99]


@pytest.mark.parametrize(
    ("toml", "key", "fix_fragment"),
    [
        ("[connect]\nattempt_timout_s = 3\n", "connect.attempt_timout_s", "attempt_timeout_s"),
        ('[connect]\nattempt_timeout_s = "soon"\n', "connect.attempt_timeout_s", "number"),
        ("[connect]\nmax_stdio_connects = 0\n", "connect.max_stdio_connects", "1 or more"),
        ('[connect]\nprotocol = "2024"\n', "connect.protocol", "2026-07-28"),
        ("[servers.ghost]\nenabled = false\n", "servers.ghost", "command"),
        ('servers_file = "nope.json"\n', "servers_file", "mcpServers"),
        ("[conect]\n", "conect", "connect"),
    ],
)
def test_broken_toml_names_file_key_and_fix(tmp_path: Path, toml: str, key: str, fix_fragment: str) -> None:
    """Unknown keys, wrong types and out-of-range values in TOML are caught with a fix."""
    cfg = write(tmp_path / "breakwater.toml", toml)
    with pytest.raises(ConfigError) as info:
        load_config(cfg, environ={})
    assert (info.value.path, info.value.key) == (str(cfg), key)
    assert fix_fragment in (info.value.fix or "")


def test_bad_environment_value_is_reported(tmp_path: Path) -> None:
    """A malformed environment variable is an error that says which variable, not a silent default."""
    cfg = write(tmp_path / "mcp.json", {"mcpServers": {}})
    with pytest.raises(ConfigError) as info:
        load_config(cfg, environ={"BREAKWATER_CONNECT_BUDGET_S": "lots"})
    assert info.value.path == "environment"


def test_find_config_prefers_toml(tmp_path: Path) -> None:
    """Without --config: breakwater.toml first, then .mcp.json, else a clear error."""
    with pytest.raises(ConfigError, match="pass --config"):
        find_config(tmp_path)
    write(tmp_path / ".mcp.json", {"mcpServers": {}})
    assert find_config(tmp_path).name == ".mcp.json"
    write(tmp_path / "breakwater.toml", "")
    assert find_config(tmp_path).name == "breakwater.toml"


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "breakwater", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60, check=False
    )


def test_cli_config_error_exit_code_2(tmp_path: Path) -> None:
    """`status` and `config check` exit 2 on a broken config and say where."""
    cfg = write(tmp_path / "mcp.json", {"mcpServers": {"a": {"comand": "x"}}})
    for command in (["status", "--wait", "0"], ["config", "check"]):
        result = run_cli(*command, "--config", str(cfg))
        assert result.returncode == 2
        assert "mcpServers.a.comand" in result.stderr and "did you mean 'command'" in result.stderr


def test_config_check_redacts_secrets(tmp_path: Path) -> None:
    """`config check` shows what was understood without a single secret value."""
    cfg = write(
        tmp_path / "mcp.json",
        {
            "mcpServers": {
                "a": {"command": "a", "env": {"API_KEY": "sk-planted-secret-1"}},
                "b": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer planted-secret-2"}},
            }
        },
    )
    for extra in ([], ["--json"]):
        result = run_cli("config", "check", "--config", str(cfg), *extra)
        assert result.returncode == 0, result.stderr
        assert "API_KEY" in result.stdout and "Authorization" in result.stdout
        assert "planted-secret" not in result.stdout + result.stderr


def test_config_check_prints_every_setting_it_understood(tmp_path: Path) -> None:
    """`[gateway] drift = "block"` and a tool's own table were printed nowhere: a correct setting could not be told from
    one that was never read. Each setting that is not the built-in default is named, in both forms."""
    cfg = tmp_path / "breakwater.toml"
    cfg.write_text(
        '[gateway]\ndrift = "block"\n[servers.gh]\ncommand = "gh-mcp"\n'
        '[servers.gh.retry]\nmax_attempts = 5\n[servers.gh.tools.create_issue]\ntimeout_s = 20\nretry = "idempotent"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BREAKWATER_")}
    text = run_cli("config", "check", "--config", str(cfg), env=env).stdout
    assert "[gateway] drift = 'block'" in text, text
    assert "retry overrides: max_attempts = 5" in text and "tool create_issue: retry = 'idempotent', timeout_s = 20.0" in text
    understood = json.loads(run_cli("config", "check", "--json", "--config", str(cfg), env=env).stdout)
    assert understood["settings"] == {"gateway": {"drift": "block"}}
    (gh,) = understood["servers"]
    assert gh["retry"] == {"max_attempts": 5} and gh["tools"] == {"create_issue": {"retry": "idempotent", "timeout_s": 20.0}}


def test_readme_knob_table_matches_code() -> None:
    """The README's knob table is the output of `breakwater config knobs --markdown`."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- knobs:start -->\n(.*?)<!-- knobs:end -->", readme, re.S)
    assert match, "README.md lacks the <!-- knobs:start --> ... <!-- knobs:end --> block"
    assert match.group(1) == render_markdown(all_knobs()), "regenerate with: make docs"


def test_every_knob_is_documented_with_env() -> None:
    """Every knob has a description and its own environment variable."""
    knobs = all_knobs()
    assert knobs
    envs = [k.env for k in knobs]
    assert all(k.doc and k.doc.endswith(".") for k in knobs)
    assert all(e and e.startswith("BREAKWATER_") for e in envs)
    assert len(set(envs)) == len(envs)


def test_a_range_error_writes_its_bounds_as_a_person_would() -> None:
    """1 GiB is 1073741824 in the message, not 1.07374e+09 (which no one can type back in)."""
    with pytest.raises(ConfigError) as caught:
        CallPolicy(max_result_bytes=2**31)
    assert "1073741824" in str(caught.value) and "e+" not in str(caught.value)


def test_retry_timeouts_is_a_tools_key_as_the_readme_says(tmp_path: Path) -> None:
    """The README says `retry_timeouts` works per server or per tool; per tool it was refused as an unknown key."""
    path = tmp_path / "breakwater.toml"
    path.write_text('[servers.s]\ncommand = "x"\n[servers.s.tools.t]\nretry_timeouts = true\n')
    config = load_config(path, environ={})
    assert config.server("s").tools["t"].retry.retry_timeouts is True
    assert config.server("s").retry.retry_timeouts is False


def test_config_check_prints_settings_in_tomls_words(tmp_path: Path) -> None:
    """`[gateway] share = False` and `{'retry_timeouts': True}`: Python's spelling of what breakwater.toml writes
    `false` and `true`; each setting reads as the line to write in the file."""
    cfg = tmp_path / "breakwater.toml"
    cfg.write_text(
        '[gateway]\nshare = false\n[servers.gh]\ncommand = "gh-mcp"\n[servers.gh.retry]\nretry_timeouts = true\n'
        "[servers.gh.tools.create_issue]\nretry_timeouts = true\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BREAKWATER_")}
    text = run_cli("config", "check", "--config", str(cfg), env=env).stdout
    assert "[gateway] share = false" in text, text
    assert "retry overrides: retry_timeouts = true" in text and "tool create_issue: retry_timeouts = true" in text, text
    assert "True" not in text and "False" not in text, text


def test_path_knobs_read_home_and_a_relative_path_from_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`catalog_dir = "~/bw"` in a config file made a folder named `~` wherever the agent started breakwater, and
    `url = "j.db"` a journal in each project an agent was started in; `servers_file` was already read from the
    file's folder. The environment's relative paths stay the working directory's; off and URLs stay as written."""
    home, folder, elsewhere = tmp_path / "home", tmp_path / "cfg", tmp_path / "project"
    for d in (home, folder, elsewhere):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    config = folder / "breakwater.toml"
    config.write_text(
        '[journal]\nurl = "sqlite:///logs/j.db"\n'
        '[gateway]\ncatalog_dir = "~/bw-catalog"\nshare_dir = "run"\n'
        '[connect]\nadmission_dir = "../abs-not/../adm"\nprotocol_memory_dir = "off"\n'
        '[servers.a]\ncommand = "true"\n'
    )
    loaded = load_config(config, environ={})
    assert loaded.journal.url == f"sqlite:///{folder / 'logs' / 'j.db'}"
    assert loaded.gateway.catalog_dir == str(home / "bw-catalog")
    assert loaded.gateway.share_dir == str(folder / "run")
    assert Path(loaded.connect.admission_dir).resolve() == tmp_path / "adm"
    assert loaded.connect.protocol_memory_dir == "off"
    # Spelled relative to here, the file's own folder is still where its paths are read from.
    assert load_config(Path("../cfg/breakwater.toml"), environ={}).gateway.share_dir == str(folder / "run")
    from_env = load_config(
        config, environ={"BREAKWATER_CATALOG_DIR": "cat", "BREAKWATER_JOURNAL": "postgresql://u@127.0.0.1/test"}
    )
    assert from_env.gateway.catalog_dir == str(elsewhere / "cat")
    assert from_env.journal.url == "postgresql://u@127.0.0.1/test"
    for off in ("off", "OFF", "", "none"):
        assert load_config(config, environ={"BREAKWATER_JOURNAL": off}).journal.url == off
        assert load_config(config, environ={"BREAKWATER_PROTOCOL_MEMORY_DIR": off}).connect.protocol_memory_dir == off
    # A directory that cannot be turned off: "off" made a folder of that name.
    for knob, variable in (("catalog_dir", "BREAKWATER_CATALOG_DIR"), ("share_dir", "BREAKWATER_SHARE_DIR")):
        config.write_text('[servers.a]\ncommand = "true"\n')
        with pytest.raises(ConfigError, match=f"{variable}: 'off' cannot turn this off: it is a directory"):
            load_config(config, environ={variable: "off"})
        config.write_text(f'[gateway]\n{knob} = "Disabled"\n[servers.a]\ncommand = "true"\n')
        with pytest.raises(ConfigError, match=f"gateway.{knob}: 'Disabled' cannot turn this off"):
            load_config(config, environ={})


def test_store_urls_with_options_their_clients_read_are_taken(tmp_path: Path) -> None:
    """The URL checks ask the clients' own parsers: what they read passes (the refusals are in test_bad_input)."""
    config = tmp_path / "breakwater.toml"
    for state, journal in (
        (
            "redis://127.0.0.1:6379/2?socket_timeout=2.5&health_check_interval=10",
            "postgresql://u@127.0.0.1:5432/db?sslmode=disable",
        ),
        ("rediss://:pw@cache.example:6380/0?ssl_cert_reqs=none", "postgres://127.0.0.1/db?connect_timeout=5&application_name=bw"),
        ("unix:///run/redis.sock?db=3", "sqlite:///j.db"),
    ):
        config.write_text(f'[state]\nurl = "{state}"\n[journal]\nurl = "{journal}"\n[servers.a]\ncommand = "true"\n')
        loaded = load_config(config, environ={})
        assert loaded.state.url == state and loaded.journal.url.startswith(journal.split("/j.db")[0])
