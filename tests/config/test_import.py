"""`breakwater config import`: an agent's mcpServers file moves behind breakwater, losing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from breakwater.config import load_config


def run_import(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "breakwater", "config", "import", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
        env=env,
    )


SERVERS = {
    "mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": {"K": "v"}},
        "remote": {"type": "http", "url": "https://example.test/mcp", "headers": {"Authorization": "Bearer t0ken"}},
    }
}


def test_import_writes_config_and_one_entry_file(tmp_path: Path) -> None:
    """The servers move to breakwater.servers.json unchanged; the agent gets one entry that runs `breakwater serve`."""
    source = tmp_path / ".mcp.json"
    source.write_text(json.dumps(SERVERS))
    result = run_import(".mcp.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "breakwater.servers.json").read_text()) == SERVERS
    assert json.loads(source.read_text()) == SERVERS, "without --replace the original is untouched"
    agent = json.loads((tmp_path / ".mcp.breakwater.json").read_text())
    (entry,) = agent["mcpServers"].values()
    assert entry["args"][-3:] == ["serve", "--config", str((tmp_path / "breakwater.toml").resolve())]
    config = load_config(tmp_path / "breakwater.toml", environ={})
    original = load_config(source, environ={})
    assert [s.describe() for s in config.servers] == [s.describe() for s in original.servers]
    assert [dict(s.env) for s in config.servers] == [dict(s.env) for s in original.servers]
    # Claude Code will name each tool mcp__breakwater__NAME: that whole name must fit the API's 64 characters.
    assert len(f"mcp__{next(iter(agent['mcpServers']))}__") + config.gateway.tool_name_max == 64


def test_replace_keeps_a_backup_and_refuses_to_clobber(tmp_path: Path) -> None:
    """--replace keeps the original as .bak; a second import refuses to overwrite without --force, and refuses
    to import a file that already goes through breakwater."""
    source = tmp_path / ".mcp.json"
    source.write_text(json.dumps(SERVERS))
    assert run_import(".mcp.json", "--replace", cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / ".mcp.json.bak").read_text()) == SERVERS
    assert list(json.loads(source.read_text())["mcpServers"]) == ["breakwater"]
    again = run_import(".mcp.json", "--replace", "--force", cwd=tmp_path)
    assert again.returncode == 2 and "already called 'breakwater'" in again.stderr
    (tmp_path / "other.json").write_text(json.dumps(SERVERS))
    clash = run_import("other.json", cwd=tmp_path)
    assert clash.returncode == 2 and "--force" in clash.stderr


def test_broken_source_is_a_config_error(tmp_path: Path) -> None:
    """A broken file is reported with file, key and fix, and nothing is written."""
    source = tmp_path / ".mcp.json"
    source.write_text(json.dumps({"mcpServers": {"a": {"comand": "x"}}}))
    result = run_import(".mcp.json", cwd=tmp_path)
    assert result.returncode == 2 and "mcpServers.a.comand" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mcp.json"]


def test_import_carries_variables_and_oauth_over_unexpanded_and_names_what_is_left_to_do(tmp_path: Path) -> None:
    """`${VAR}` and `oauth` reach breakwater.servers.json as written (expanded only when breakwater starts);
    the output names the servers to sign in to and the variables this shell lacks; a WebSocket entry,
    which breakwater cannot serve, stays in the agent's file."""
    servers = {
        "mcpServers": {
            "local": {"command": "npx", "args": ["-y", "server"], "env": {"KEY": "${BW_IMPORT_SET_KEY}"}},
            "templated": {"type": "http", "url": "${BW_IMPORT_UNSET_BASE}/mcp", "headers": {"X-Key": "${BW_IMPORT_SET_KEY}"}},
            "notion": {"type": "http", "url": "https://mcp.notion.test/mcp", "oauth": {"clientId": "abc", "callbackPort": 8080}},
            "socket": {"type": "ws", "url": "wss://example.test/ws"},
        }
    }
    (tmp_path / ".mcp.json").write_text(json.dumps(servers))
    result = run_import(".mcp.json", cwd=tmp_path, env={**os.environ, "BW_IMPORT_SET_KEY": "key-value-123456"})
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "breakwater.servers.json").read_text())
    assert written == {"mcpServers": {k: v for k, v in servers["mcpServers"].items() if k != "socket"}}
    assert "key-value-123456" not in (tmp_path / "breakwater.servers.json").read_text()
    assert "run `breakwater auth login notion` once" in result.stdout
    assert "BW_IMPORT_UNSET_BASE is not set here (mcpServers.templated.url)" in result.stdout
    assert "auth login local" not in result.stdout and "auth login templated" not in result.stdout
    agent = json.loads((tmp_path / ".mcp.breakwater.json").read_text())
    assert list(agent["mcpServers"]) == ["breakwater", "socket"]


def test_import_names_the_claude_code_permission_rules_that_must_follow_the_tools(tmp_path: Path) -> None:
    """A rule `mcp__github__delete_repo` in Claude Code's deny list matches nothing once the tool is
    `mcp__breakwater__github__delete_repo`: the denied tool would be asked for instead. Import says so, rule by rule."""
    (tmp_path / ".mcp.json").write_text(
        json.dumps(SERVERS | {"mcpServers": {**SERVERS["mcpServers"], "github": {"command": "x"}}})
    )
    (tmp_path / ".claude").mkdir()
    rules = {"deny": ["mcp__github__delete_repo", "Bash(rm:*)"], "allow": ["mcp__github", "mcp__fs__*"]}
    (tmp_path / ".claude" / "settings.json").write_text(json.dumps({"permissions": rules}))
    result = run_import(".mcp.json", cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr
    said = [line.split(": ", 2)[-1] for line in result.stdout.splitlines() if "permissions." in line]
    suffix = " (the tool's name through breakwater)"
    assert [line.removesuffix(suffix) for line in said] == [
        "permissions.allow 'mcp__github' must become 'mcp__breakwater__github__*'",
        "permissions.allow 'mcp__fs__*' must become 'mcp__breakwater__fs__*'",
        "permissions.deny 'mcp__github__delete_repo' must become 'mcp__breakwater__github__delete_repo'",
    ]
    assert all(line.endswith(suffix) for line in said)


def test_the_readmes_two_steps_need_no_force(tmp_path: Path) -> None:
    """`import` then, when happy, `import --replace`: the second step found the first step's files and asked for --force."""
    source = tmp_path / ".mcp.json"
    source.write_text(json.dumps(SERVERS))
    assert run_import(".mcp.json", cwd=tmp_path).returncode == 0
    replaced = run_import(".mcp.json", "--replace", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert list(json.loads(source.read_text())["mcpServers"]) == ["breakwater"]
    assert json.loads((tmp_path / ".mcp.json.bak").read_text()) == SERVERS
    # What another import wrote, or the user edited since, is still never overwritten without --force.
    (tmp_path / "breakwater.toml").write_text("# tuned by hand\n")
    (tmp_path / "other.json").write_text(json.dumps(SERVERS))
    clash = run_import("other.json", cwd=tmp_path)
    assert clash.returncode == 2 and "breakwater.toml" in clash.stderr and "--force" in clash.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_a_private_agent_file_gives_private_files(tmp_path: Path) -> None:
    """The servers' secrets were written world-readable (0644) from a 0600 ~/.claude.json, which --replace made 0644 too."""
    source = tmp_path / ".claude.json"
    source.write_text(json.dumps(SERVERS))
    source.chmod(0o600)
    assert run_import(".claude.json", cwd=tmp_path).returncode == 0
    written = ["breakwater.servers.json", "breakwater.toml", ".claude.breakwater.json"]
    assert {name: oct((tmp_path / name).stat().st_mode & 0o777) for name in written} == dict.fromkeys(written, "0o600")
    (tmp_path / "breakwater.toml").chmod(0o640)  # a file that exists keeps its own permissions
    assert run_import(".claude.json", "--replace", "--force", cwd=tmp_path).returncode == 0
    assert oct(source.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "breakwater.toml").stat().st_mode & 0o777) == "0o640"
    assert oct((tmp_path / ".claude.json.bak").stat().st_mode & 0o777) == "0o600"


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges there")
def test_replace_writes_through_a_symlinked_agent_file(tmp_path: Path) -> None:
    """A dotfiles setup links .mcp.json to a file kept elsewhere: --replace made the link a plain file."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "mcp.json").write_text(json.dumps(SERVERS))
    project = tmp_path / "project"
    project.mkdir()
    (project / ".mcp.json").symlink_to(dotfiles / "mcp.json")
    assert run_import(".mcp.json", "--replace", cwd=project).returncode == 0
    assert (project / ".mcp.json").is_symlink()
    assert list(json.loads((dotfiles / "mcp.json").read_text())["mcpServers"]) == ["breakwater"]
    assert json.loads((project / ".mcp.json.bak").read_text()) == SERVERS


def test_a_codex_variable_not_set_is_named_without_a_default_codex_cannot_take(tmp_path: Path) -> None:
    """Codex's keys name a variable (`bearer_token_env_var = "X"`): the note advised `${X:-value}`, which no such key takes."""
    source = tmp_path / "config.toml"
    source.write_text('[mcp_servers.needs]\nurl = "https://h.test/mcp"\nbearer_token_env_var = "BW_CODEX_UNSET_Q"\n')
    result = run_import("config.toml", cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "BW_CODEX_UNSET_Q"})
    assert result.returncode == 0, result.stderr
    note = next(line for line in result.stdout.splitlines() if "BW_CODEX_UNSET_Q is not set here" in line)
    assert ":-value" not in note and "the others run" in note


def test_a_vs_code_input_in_one_server_does_not_block_the_import(tmp_path: Path) -> None:
    """One `${input:...}` (VS Code asks for it as it starts a server) made the whole import exit 2."""
    folder = tmp_path / ".vscode"
    folder.mkdir()
    needs = {"type": "http", "url": "https://h.test/mcp", "headers": {"Authorization": "Bearer ${input:tok}"}}
    data = {"inputs": [{"id": "tok", "type": "promptString"}], "servers": {"fine": {"command": "x"}, "needs": needs}}
    (folder / "mcp.json").write_text(json.dumps(data))
    result = run_import(".vscode/mcp.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "${input:tok} (servers.needs.headers.Authorization) is VS Code's to ask" in result.stdout
    servers = json.loads((folder / "breakwater.servers.json").read_text())["servers"]
    assert servers["needs"]["headers"]["Authorization"] == "Bearer ${input:tok}"  # carried over as written


def test_an_agent_file_with_comments_says_they_are_not_carried_over(tmp_path: Path) -> None:
    """Zed's and VS Code's files start with comments; --replace dropped them without a word (the .bak keeps them)."""
    source = tmp_path / ".mcp.json"
    source.write_text('// my servers\n{"mcpServers": {"a": {"command": "x"},},}\n')
    result = run_import(".mcp.json", "--replace", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ".mcp.json's comments (and trailing commas) are not in the files written" in result.stdout
    assert (tmp_path / ".mcp.json.bak").read_text().startswith("// my servers")


def test_a_server_rejected_in_claude_code_is_not_started_read_or_imported(tmp_path: Path) -> None:
    """Claude Code asks before it starts a project's `.mcp.json` servers and keeps a "no" in `disabledMcpjsonServers`;
    breakwater, reading the same file or importing it, started the rejected server (anyone can commit a `.mcp.json`)."""
    from breakwater.config import load_config

    home = tmp_path / "home"
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"fs": {"command": "x"}, "untrusted": {"command": "y"}}}))
    (tmp_path / ".claude").mkdir()
    local = tmp_path / ".claude" / "settings.local.json"
    local.write_text(json.dumps({"enabledMcpjsonServers": ["fs"], "disabledMcpjsonServers": ["untrusted"]}))
    env = {**os.environ, "HOME": str(home)}
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        read = {spec.name: spec for spec in load_config(tmp_path / ".mcp.json").servers}
    finally:
        if old_home is not None:
            os.environ["HOME"] = old_home
    assert read["fs"].enabled and not read["untrusted"].enabled
    assert read["untrusted"].disabled_by == (
        f"disabledMcpjsonServers in {local} lists it (rejected in Claude Code);"
        f' to start it, remove "untrusted" from disabledMcpjsonServers in {local}'
    )
    result = run_import(".mcp.json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "breakwater.servers.json").read_text())["mcpServers"]
    assert written["untrusted"]["disabled"] is True and "disabled" not in written["fs"]
    assert "untrusted: not started: disabledMcpjsonServers in .claude/settings.local.json lists it" in result.stdout


def test_servers_switched_off_in_claude_codes_mcp_panel_are_not_started_read_or_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code's /mcp → Disable writes the server's name into `projects[DIR].disabledMcpServers` of ~/.claude.json and
    never starts it in DIR, whichever scope it is from; breakwater, reading ~/.claude.json there, started it."""
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    data = {
        "numStartups": 3,
        "mcpServers": {"userwide": {"type": "stdio", "command": "u"}, "kept": {"type": "stdio", "command": "k"}},
        "projects": {
            str(project): {"mcpServers": {"local1": {"command": "l"}}, "disabledMcpServers": ["userwide", "local1"]},
            str(tmp_path / "other"): {"disabledMcpServers": ["kept"]},
        },
    }
    path = tmp_path / ".claude.json"
    path.write_text(json.dumps(data))
    monkeypatch.chdir(project / "sub")  # a session in a folder of the project
    read = {spec.name: spec for spec in load_config(path, environ={}).servers}
    said = f'projects["{project}"].disabledMcpServers lists it'
    assert not read["userwide"].enabled and not read["local1"].enabled and read["kept"].enabled
    assert (read["userwide"].disabled_by or "").startswith(said) and (read["local1"].disabled_by or "").startswith(said)
    # Wide enough for the note on one line whatever the length of the test's folder (CI's wrapped it).
    env = {**os.environ, "HOME": str(tmp_path), "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0", "COLUMNS": "400"}
    for command in (["config", "check"], ["status", "--wait", "0"]):
        result = subprocess.run(
            [sys.executable, "-m", "breakwater", *command, "--config", str(path)],
            capture_output=True,
            text=True,
            cwd=project / "sub",
            env=env,
            timeout=120,
            check=False,
        )
        lines = result.stdout.splitlines()
        for name in ("userwide", "local1"):  # config check: a note under the server's line; status: a line of its own
            at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{name} ") or line.startswith(f"{name}:"))
            assert f"not started: {said}" in (lines[at] if lines[at].startswith(f"{name}:") else lines[at + 1]), result
    result = run_import(str(path), cwd=project / "sub", env=env)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "breakwater.servers.json").read_text())["mcpServers"]
    assert written["userwide"]["disabled"] is True and "disabled" not in written["kept"]
    assert 'userwide written with "disabled": true' in result.stdout and "disabledMcpServers" in result.stdout
    monkeypatch.chdir(tmp_path)  # no project here: every user-scope server runs
    assert all(spec.enabled for spec in load_config(path, environ={}).servers)


def test_a_project_entrys_lists_in_claude_json_switch_its_mcp_json_servers_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's entry of ~/.claude.json holds Claude Code's older `disabledMcpjsonServers` (a rejected `.mcp.json`
    server) and the /mcp panel's `disabledMcpServers`; Claude Code starts neither, and breakwater started both."""
    home, project = tmp_path / "home", tmp_path / "repo"
    home.mkdir()
    project.mkdir()
    servers = {"fs": {"command": "x"}, "rejected": {"command": "y"}, "off": {"command": "z"}}
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": servers}))
    entry = {"enabledMcpjsonServers": ["fs"], "disabledMcpjsonServers": ["rejected"], "disabledMcpServers": ["off"]}
    (home / ".claude.json").write_text(json.dumps({"projects": {str(project): entry}}))
    monkeypatch.setenv("HOME", str(home))
    read = {spec.name: spec for spec in load_config(project / ".mcp.json", environ={}).servers}
    assert read["fs"].enabled and not read["rejected"].enabled and not read["off"].enabled
    state = home / ".claude.json"
    assert (
        read["rejected"].disabled_by
        == f'projects["{project}"].disabledMcpjsonServers in {state} lists it (rejected in Claude Code);'
        f' to start it, remove "rejected" from projects["{project}"].disabledMcpjsonServers in {state}'
    )
    assert (read["off"].disabled_by or "").startswith(f'projects["{project}"].disabledMcpServers in {state} lists it')
    assert (read["off"].disabled_by or "").endswith(
        f'to start it, switch it on in Claude Code\'s /mcp (or remove "off" from projects["{project}"].disabledMcpServers'
        f" in {state})"
    )
    result = run_import(".mcp.json", cwd=project, env={**os.environ, "HOME": str(home)})
    assert result.returncode == 0, result.stderr
    written = json.loads((project / "breakwater.servers.json").read_text())["mcpServers"]
    assert written["rejected"]["disabled"] is True and written["off"]["disabled"] is True and "disabled" not in written["fs"]


def test_numbers_where_strings_go_are_imported_as_the_text_breakwater_passes(tmp_path: Path) -> None:
    """The servers file was written by Python's JSON writer: `1.50` became 1.5 and `1e3` 1000.0, and breakwater then
    passed "1.5" and "1000.0" where it passed "1.50" and "1e3" before the import."""
    source = tmp_path / "mcp.json"
    source.write_text('{"mcpServers": {"e": {"command": "x", "args": [8080, 2.50], "env": {"N": 5, "F": 1.50, "E": 1e3}}}}')
    before = load_config(source, environ={}).server("e")
    result = run_import("mcp.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "breakwater.servers.json").read_text())["mcpServers"]["e"]
    assert written["env"] == {"N": "5", "F": "1.50", "E": "1e3"} and written["args"] == ["8080", "2.50"]
    after = load_config(tmp_path / "breakwater.toml", environ={}).server("e")
    assert (after.env, after.args) == (before.env, before.args)
    assert "e: env.N, env.F, env.E, args[0], args[1]: numbers, written in quotes as the file wrote them" in result.stdout
