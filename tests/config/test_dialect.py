"""The mcpServers dialect: `${VAR}` expansion as Claude Code does it, every client's keys, envFile, headersHelper.

Config-level and fast: files in a temporary directory, an explicit environment, no processes (the
CLI runs that prove `config check`, `status` and `serve` refuse an unset variable alike run in-process).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from breakwater.cli import main as cli_main
from breakwater.config import load_config
from breakwater.config._files import load_config_lenient
from breakwater.config._redact import Redactor
from breakwater.errors import ConfigError


def write(tmp_path: Path, servers: dict[str, Any], name: str = ".mcp.json", **top: Any) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **top}))
    return path


def one(tmp_path: Path, entry: dict[str, Any], env: dict[str, str], name: str = ".mcp.json") -> Any:
    return load_config(write(tmp_path, {"s": entry}, name), environ=env).server("s")


# ---- expansion --------------------------------------------------------------------------------


def test_every_field_claude_code_expands_is_expanded(tmp_path: Path) -> None:
    env = {"BIN": "/usr/bin/node", "DIR": "/srv", "TOKEN": "tok-123456789", "HOST": "127.0.0.1:8123"}
    stdio = one(
        tmp_path,
        {"command": "${BIN}", "args": ["${DIR}/server.js", "--port=${PORT:-9000}"], "env": {"${DIR}": "k=${TOKEN}"}},
        env,
    )
    assert stdio.command == "/usr/bin/node"
    assert stdio.args == ("/srv/server.js", "--port=9000")
    assert dict(stdio.env) == {"${DIR}": "k=tok-123456789"}, "values are expanded, names are not"
    http = one(tmp_path, {"url": "http://${HOST}/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}, env)
    assert http.url == "http://127.0.0.1:8123/mcp"
    assert dict(http.headers) == {"Authorization": "Bearer tok-123456789"}


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("${A:-fallback}", {}, "fallback"),
        ("${A:-fallback}", {"A": ""}, ""),  # set to empty is set: no default (Claude Code's `!== undefined`)
        ("$A and ${A}", {"A": "x"}, "$A and x"),  # no braces, no expansion
        ("${A:-x:-y}", {}, "x"),  # the default ends at the next :- (Claude Code splits in two, drops the rest)
        ("${A:-}", {}, ""),
        ("${A}", {"A": "${B}", "B": "no"}, "${B}"),  # one pass: values are not expanded again
        ("${A:-${B}}", {"B": "b"}, "${B}"),  # the reference ends at the first }: the default is "${B", plus "}"
        ("pre-${A}-${B:-2}-post", {"A": "1"}, "pre-1-2-post"),
        ("${env:A}", {"A": "x"}, "x"),  # Cursor's and VS Code's spelling
    ],
)
def test_expansion_rules(tmp_path: Path, text: str, env: dict[str, str], expected: str) -> None:
    assert one(tmp_path, {"command": "run", "args": [text]}, env).args == (expected,)


def test_an_unset_variable_is_an_error_naming_file_entry_key_and_variable(tmp_path: Path) -> None:
    path = write(tmp_path, {"api": {"url": "https://example.test/mcp", "headers": {"X-Key": "${API_KEY}"}}})
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    err = caught.value
    assert err.path == str(path)
    assert err.key == "mcpServers.api.headers.X-Key"
    assert "API_KEY is not set" in err.detail
    assert err.fix is not None and "${API_KEY:-value}" in err.fix


def test_config_check_refuses_an_unset_variable_and_status_runs_without_its_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`config check` says the file is not ready to run whole; `status` (as `serve`) runs the rest, this server off."""
    path = write(tmp_path, {"api": {"command": "server", "env": {"TOKEN": "${BW_TEST_UNSET_TOKEN}"}}})
    # In-process: the CLI's own entry point, as `breakwater ...` runs it, without paying for a new interpreter.
    with pytest.raises(SystemExit) as exited:
        cli_main(["config", "check", "--config", str(path)])
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "mcpServers.api.env.TOKEN" in stderr and "BW_TEST_UNSET_TOKEN is not set" in stderr
    assert cli_main(["status", "--wait", "0", "--json", "--config", str(path)]) == 1  # a server it enables is off
    said = capsys.readouterr()
    assert json.loads(said.out)["servers"][0]["state"] == "disabled"
    assert "server 'api' is off" in said.err and "BW_TEST_UNSET_TOKEN is not set" in said.err


def test_values_from_the_environment_in_env_and_headers_are_secrets(tmp_path: Path) -> None:
    env = {"SHORT": "s3cr3", "GITHUB_TOKEN": "ghp_0123456789abcdef", "REGION": "eu-west-1-long"}
    http = one(tmp_path, {"url": "https://example.test/${REGION}/mcp", "headers": {"X-Key": "prefix-${SHORT}-suffix"}}, env)
    # The whole header value was always a secret; a short value inside it is one too, on its own.
    assert "s3cr3" in http.secrets
    stdio = one(tmp_path, {"command": "run", "args": ["--repo", "${GITHUB_TOKEN}", "--region", "${REGION}"]}, env)
    # Named like a credential: a secret wherever it lands. A region is not.
    assert "ghp_0123456789abcdef" in stdio.secrets
    assert not any("eu-west" in s for s in stdio.secrets)
    redact = Redactor(stdio.secrets)
    assert "ghp_0123456789abcdef" not in redact("upstream said: bad token ghp_0123456789abcdef")


def test_vs_code_and_cursor_variables(tmp_path: Path) -> None:
    spec = one(
        tmp_path,
        {"command": "${userHome}/bin/s", "args": ["${workspaceFolder}", "${workspaceFolderBasename}", "a${/}b"]},
        {},
        name=".vscode/mcp.json",
    )
    assert spec.command == str(Path.home()) + "/bin/s"
    assert spec.args == (str(tmp_path.resolve()), tmp_path.resolve().name, "a/b")


@pytest.mark.parametrize("ref", ["${input:github-token}", "${command:pickFile}", "${config:mcp.key}"])
def test_vs_code_prompts_are_an_error_that_says_what_to_write(tmp_path: Path, ref: str) -> None:
    path = tmp_path / ".vscode" / "mcp.json"
    path.parent.mkdir()
    inputs = [{"id": "github-token", "type": "promptString"}]
    path.write_text(json.dumps({"inputs": inputs, "servers": {"gh": {"command": "gh", "env": {"T": ref}}}}))
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.key == "servers.gh.env.T"
    assert "no editor to ask" in caught.value.detail
    assert caught.value.fix is not None and "environment variable" in caught.value.fix
    if ref.startswith("${input:"):
        assert "${GITHUB_TOKEN}" in caught.value.fix


def test_toml_inline_servers_expand_too(tmp_path: Path) -> None:
    path = tmp_path / "breakwater.toml"
    path.write_text('[servers.a]\nurl = "${BASE:-http://127.0.0.1:9}/mcp"\nheaders = { Authorization = "Bearer ${T}" }\n')
    spec = load_config(path, environ={"T": "tok-abcdefgh"}).server("a")
    assert spec.url == "http://127.0.0.1:9/mcp" and dict(spec.headers) == {"Authorization": "Bearer tok-abcdefgh"}


def test_lenient_loading_keeps_unset_references_and_names_them(tmp_path: Path) -> None:
    path = write(tmp_path, {"a": {"url": "${BASE}/mcp", "headers": {"Authorization": "Bearer ${T}"}}})
    config, missing = load_config_lenient(path, environ={})
    assert config.server("a").url == "${BASE}/mcp"
    assert missing == [("mcpServers.a.url", "BASE"), ("mcpServers.a.headers.Authorization", "T")]


# ---- every client's keys ------------------------------------------------------------------------


EVERY_CLIENT = {
    "claude-code": {
        "type": "http",
        "url": "https://example.test/mcp",
        "headersHelper": "get-headers.sh",
        "oauth": {"clientId": "abc", "callbackPort": 8080, "authServerMetadataUrl": "https://as.test/.well-known/x"},
    },
    "cursor": {"type": "sse", "url": "https://example.test/sse", "auth": {"CLIENT_ID": "x", "scopes": ["a"]}},
    "desktop": {"command": "npx", "args": ["-y", "server"], "env": {"K": "v"}},
    "vscode": {"type": "stdio", "command": "s", "dev": {"watch": "src"}, "sandboxEnabled": True, "gallery": "x", "version": "1"},
    "cline": {"command": "s", "alwaysAllow": ["t"], "autoApprove": [], "disabledTools": ["u"], "timeout": 60, "disabled": False},
    "ws": {"type": "ws", "url": "wss://example.test/ws"},
    "ide": {"type": "sse-ide", "url": "http://127.0.0.1:1/sse", "ideName": "VS Code", "ideRunningInWindows": False},
}


def test_every_key_every_client_writes_loads_with_notes(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, EVERY_CLIENT, numStartups=4, projects={}), environ={})
    assert [s.name for s in config.servers] == ["claude-code", "cursor", "desktop", "vscode", "cline"]
    notes = {s.name: s.notes for s in config.servers}
    assert notes["claude-code"] == ("oauth kept; sign-in: breakwater auth login claude-code",)
    assert config.server("claude-code").headers_helper == "get-headers.sh"
    assert config.server("cursor").transport == "sse" and "auth kept" in notes["cursor"][0]
    assert notes["desktop"] == ()
    assert any("sandboxEnabled ignored" in n and "unsandboxed" in n for n in notes["vscode"])
    assert {n.split(" ")[0] for n in notes["cline"]} == {"alwaysAllow", "autoApprove", "timeout"}
    assert config.server("cline").tool_filter.without == {"u"}  # kept: those tools are left out
    assert any("mcpServers.ws skipped" in n and "WebSocket" in n for n in config.notes)
    assert any("mcpServers.ide skipped" in n for n in config.notes)
    assert any(n.startswith("numStartups ignored") for n in config.notes)
    assert any(n.startswith("projects: none is") for n in config.notes)  # Claude Code's local scope: none for this folder
    # config check prints them, with the oauth object untouched.
    understood = config.server("claude-code").describe()
    assert understood["notes"] == list(notes["claude-code"]) and understood["headersHelper"] == "get-headers.sh"


def test_a_command_written_with_its_arguments_gets_a_note_naming_the_program_alone(tmp_path: Path) -> None:
    """`config check` says how a command line in `command` is started (split as a shell splits it) and how to write it for
    every client, naming only the program (the arguments may hold a secret). A program whose path holds a space,
    or a first word that is no program, gets no note."""
    spaced = tmp_path / "my server"
    spaced.write_text("#!/bin/sh\n")
    spaced.chmod(0o755)
    servers = {
        "joined": {"command": "sh -c true --token s3cr3t"},
        "path": {"command": str(spaced)},
        "plain": {"command": "sh"},
        "unknown": {"command": "breakwater-no-such-program --flag"},
    }
    config = load_config(write(tmp_path, servers), environ={})
    (note,) = config.server("joined").notes
    assert note.startswith("command holds its arguments: started as 'sh'") and "Claude Code does not start it" in note
    assert '"command": "sh"' in note and "s3cr3t" not in note
    assert all(config.server(name).notes == () for name in ("path", "plain", "unknown"))


def test_windsurfs_server_url_is_the_url_of_an_http_server(tmp_path: Path) -> None:
    """Windsurf's `mcp_config.json` names a remote server's address `serverUrl`, `${env:VAR}` and headers included."""
    entry = {"serverUrl": "https://example.test/${env:MCP_PATH}", "headers": {"Authorization": "Bearer ${env:TOKEN}"}}
    spec = one(tmp_path, entry, {"MCP_PATH": "mcp", "TOKEN": "t0ken-value-123"})
    assert (spec.transport, spec.url, spec.headers["Authorization"]) == (
        "http",
        "https://example.test/mcp",
        "Bearer t0ken-value-123",
    )
    assert "t0ken-value-123" in spec.secrets
    for wrong, message in (
        ({"serverUrl": "ftp://example.test/mcp"}, "scheme is 'ftp'"),
        ({"serverUrl": "https://a.test/mcp", "url": "https://b.test/mcp"}, "both url and serverUrl"),
        ({"command": "s", "serverUrl": "https://a.test/mcp"}, "a stdio server has no serverUrl"),
    ):
        with pytest.raises(ConfigError, match=message) as caught:
            one(tmp_path, wrong, {})
        assert caught.value.key == "mcpServers.s.serverUrl"


def test_clines_transport_type_and_roos_watch_paths_and_disabled_tools(tmp_path: Path) -> None:
    """Cline's older files say `transportType`; Roo's `watchPaths` is noted as not watched; `disabledTools` is kept."""
    sse = one(tmp_path, {"url": "https://example.test/sse", "transportType": "sse"}, {})
    assert (sse.transport, sse.transport_guessed) == ("sse", False)
    roo = one(tmp_path, {"command": "s", "watchPaths": ["src"], "disabledTools": ["wipe", "drop"]}, {})
    assert roo.tool_filter.without == {"wipe", "drop"} and roo.describe()["disabledTools"] == ["drop", "wipe"]
    assert [n.split(":")[0] for n in roo.notes] == ["watchPaths ignored"]
    assert one(tmp_path, {"url": "https://example.test/mcp"}, {}).transport_guessed is True
    with pytest.raises(ConfigError, match="expected a list of tool names") as caught:
        one(tmp_path, {"command": "s", "disabledTools": "wipe"}, {})
    assert caught.value.key == "mcpServers.s.disabledTools"


def test_a_key_no_client_writes_is_still_a_typo(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, {"a": {"command": "s", "headerHelper": "x"}}), environ={})
    assert caught.value.key == "mcpServers.a.headerHelper"


def test_headers_helper_belongs_to_http_servers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a stdio server has no headersHelper"):
        load_config(write(tmp_path, {"a": {"command": "s", "headersHelper": "x"}}), environ={})


def test_env_file_gives_the_server_its_variables_and_env_wins(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text('# comment\nexport A=1\nB="two words"\nC=3 # trailing\nSECRET=from-file\n')
    spec = one(tmp_path, {"command": "s", "envFile": "${workspaceFolder}/.env", "env": {"C": "env"}}, {})
    assert dict(spec.env) == {"A": "1", "B": "two words", "C": "env", "SECRET": "from-file"}
    assert "from-file" in spec.secrets


def test_a_bad_env_file_names_the_line_not_its_value(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("GOOD=1\nsk-not-a-name-0123456789\n")
    with pytest.raises(ConfigError) as caught:
        one(tmp_path, {"command": "s", "envFile": ".env"}, {})
    assert "line 2" in str(caught.value) and "sk-not-a-name" not in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read the envFile"):
        one(tmp_path, {"command": "s", "envFile": "missing.env"}, {})


# ---- JSON with comments ---------------------------------------------------------------------


JSONC = """{
  // this workspace's servers
  "servers": {
    "files": {"type": "stdio", "command": "npx", "args": ["-y", "server-files", "a,}", "// not a comment"],},
    /* the remote one,
       signed in with a token */
    "remote": {"type": "http", "url": "https://mcp.example.test/mcp/*x*/", "headers": {"Authorization": "Bearer \\"//\\""}},
  },
  "inputs": [],
}
"""
CLEAN = {
    "servers": {
        "files": {"type": "stdio", "command": "npx", "args": ["-y", "server-files", "a,}", "// not a comment"]},
        "remote": {"type": "http", "url": "https://mcp.example.test/mcp/*x*/", "headers": {"Authorization": 'Bearer "//"'}},
    },
    "inputs": [],
}


def test_a_vs_code_file_with_comments_and_trailing_commas_reads_as_its_json_would(tmp_path: Path) -> None:
    """VS Code reads mcp.json as JSONC; what is inside strings ("//", "/*", ",}") stays as written."""
    commented = tmp_path / ".vscode" / "mcp.json"
    commented.parent.mkdir()
    commented.write_text(JSONC)
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(CLEAN))
    got, want = (load_config(p, environ={}) for p in (commented, clean))
    assert [s.describe() for s in got.servers] == [s.describe() for s in want.servers]
    assert got.server("files").args == ("-y", "server-files", "a,}", "// not a comment")
    assert dict(got.server("remote").headers) == {"Authorization": 'Bearer "//"'}


def test_a_syntax_error_after_a_comment_is_reported_at_its_own_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{\n  /* one\n     two */ "mcpServers": {\n    "a": {"command" "x"}\n  }\n}\n')
    with pytest.raises(ConfigError, match=r"line 4, column 21") as info:  # at "x", where the colon is missing
        load_config(path, environ={})
    assert info.value.path == str(path)


def test_config_import_takes_a_commented_file(tmp_path: Path) -> None:
    source = tmp_path / "mcp.json"
    source.write_text(JSONC)
    assert cli_main(["config", "import", str(source)]) == 0
    assert json.loads((tmp_path / "breakwater.servers.json").read_text()) == {"servers": CLEAN["servers"]}


def test_a_number_where_a_string_goes_is_passed_as_the_file_writes_it(tmp_path: Path) -> None:
    """`"env": {"F": 1.50, "E": 1e3}` reached the server as "1.5" and "1000.0" (Python's spelling) while `true` was
    refused. VS Code's mcp.json takes numbers in `env`; breakwater passes each as written, and notes it, as Claude Code
    takes only strings there. `headers` and `args` are read alike."""
    path = tmp_path / "mcp.json"
    path.write_text(
        '{"mcpServers": {"e": {"command": "x", "args": ["--port", 8080, 2.50], "env": {"N": 5, "F": 1.50, "E": 1e3,'
        ' "NEG": -0, "BIG": 12345678901234567890, "S": "text"}},'
        ' "h": {"url": "http://127.0.0.1:9/mcp", "headers": {"X-Version": 2.0, "X-Small": 1E-2}}}}'
    )
    config = load_config(path, environ={})
    stdio, http = config.server("e"), config.server("h")
    assert stdio.env == {"N": "5", "F": "1.50", "E": "1e3", "NEG": "-0", "BIG": "12345678901234567890", "S": "text"}
    assert stdio.args == ("--port", "8080", "2.50")
    assert http.headers == {"X-Version": "2.0", "X-Small": "1E-2"}
    (note,) = [n for n in stdio.notes if "a number where a string goes" in n]
    assert note.startswith("env.N, env.F, env.E, env.NEG, env.BIG, args[1], args[2]:") and "Claude Code" in note
    assert any(n.startswith("headers.X-Version, headers.X-Small: a number") for n in http.notes)
    # Every other non-string is refused, naming the file and key (a null unsets the variable: tests/config/test_null_env.py).
    for value in ("true", "[1]", '{"a": 1}'):
        path.write_text(f'{{"mcpServers": {{"e": {{"command": "x", "env": {{"T": {value}}}}}}}}}')
        with pytest.raises(ConfigError, match=r"mcpServers\.e\.env\.T: expected a string value") as info:
            load_config(path, environ={})
        assert info.value.fix == "quote the value"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[servers.e]\ncommand = "x"\nenv = { N = 5 }\n', "servers.e.env.N"),
        ('[mcp_servers.e]\ncommand = "x"\nenv = { F = 1.50 }\n', "mcp_servers.e.env.F"),
        ('[mcp_servers.h]\nurl = "http://127.0.0.1:9/mcp"\nhttp_headers = { X-V = 2 }\n', "mcp_servers.h.http_headers.X-V"),
    ],
)
def test_a_number_in_a_toml_files_string_table_is_refused_as_true_is(tmp_path: Path, text: str, key: str) -> None:
    """Codex takes only strings in `env` and `http_headers`, and TOML keeps no text of a number to pass as written."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.key == key and info.value.fix == "quote the value" and "got a number" in info.value.detail
