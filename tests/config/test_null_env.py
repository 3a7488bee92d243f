"""VS Code's `"env": {"NAME": null}` (its `Record<string, string | number | null>`): that server does not inherit NAME.

Breakwater refused the whole file ("expected a string value, got null — fix: quote the value", and quoting passed the
text "null"). Read here in every JSON dialect whose entry has an `env` map; the spawn side is in
tests/gateway/test_env_unset.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from breakwater.config import ServerSpec, load_config
from breakwater.connect._environment import inherited
from breakwater.errors import ConfigError

SECRET = "s3cr3t-token-value-0123456789"

#: (file name, table, entry, the key as written): each dialect's env map, with A unset and B set.
DIALECTS: list[tuple[str, str, dict[str, Any], str]] = [
    ("mcp.json", "mcpServers", {"command": "python3", "env": {"A": None, "B": SECRET}}, "env"),
    ("mcp.json", "servers", {"type": "stdio", "command": "python3", "env": {"A": None, "B": SECRET}}, "env"),
    ("opencode.json", "mcp", {"type": "local", "command": ["python3"], "environment": {"A": None, "B": SECRET}}, "environment"),
    ("settings.json", "context_servers", {"command": "python3", "env": {"A": None, "B": SECRET}}, "env"),
    ("settings.json", "context_servers", {"command": {"path": "python3", "env": {"A": None, "B": SECRET}}}, "command.env"),
]


def spec_of(tmp_path: Path, name: str, table: str, entry: dict[str, Any]) -> ServerSpec:
    path = tmp_path / name
    path.write_text(json.dumps({table: {"s": entry}}))
    (spec,) = load_config(path, environ={}).servers
    return spec


@pytest.mark.parametrize(("name", "table", "entry", "written"), DIALECTS)
def test_a_null_env_value_unsets_the_variable_in_every_json_dialect(
    tmp_path: Path, name: str, table: str, entry: dict[str, Any], written: str
) -> None:
    spec = spec_of(tmp_path, name, table, entry)
    assert spec.env_unset == ("A",) and dict(spec.env) == {"B": SECRET}
    # A name is no secret: `config check` shows it; the value beside it stays redacted.
    described = spec.describe()
    assert described["env_unset"] == ["A"] and described["env"] == {"B": "<redacted>"}
    assert any(note.startswith(f"{written}.A: null, not inherited by this server") for note in spec.notes), spec.notes
    assert "A" not in inherited(spec, {"A": "inherited", "C": "c"}) and inherited(spec, {"A": "x", "C": "c"})["C"] == "c"


def test_the_unset_wins_over_the_envfile_and_holds_with_a_minimal_inheritance(tmp_path: Path) -> None:
    """VS Code's entry `env` wins over its `envFile`: a null there unsets the file's value too. `inherit_env =
    "minimal"` keeps HOME and PATH, but not one the entry unsets."""
    (tmp_path / ".env").write_text("HOME=/from/the/file\nKEEP=1\n")
    spec = spec_of(tmp_path, "mcp.json", "servers", {"command": "python3", "envFile": ".env", "env": {"HOME": None}})
    assert spec.env_unset == ("HOME",) and dict(spec.env) == {"KEEP": "1"}
    minimal = ServerSpec(name="m", transport="stdio", command="x", env_unset=("HOME",))
    minimal = replace(minimal, connect=replace(minimal.connect, inherit_env="minimal"))
    assert inherited(minimal, {"HOME": "/root", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_a_null_header_value_is_still_refused_with_a_fix_that_works(tmp_path: Path) -> None:
    """No client unsets a header: a null there is an error, and quoting it would send the text "null"."""
    entry = {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": None}}
    with pytest.raises(ConfigError) as raised:
        spec_of(tmp_path, "mcp.json", "servers", entry)
    assert raised.value.key == "servers.s.headers.X-Key"
    assert raised.value.fix == 'remove "X-Key" or write its value in quotes'


def test_an_unset_name_is_checked_as_a_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        spec_of(tmp_path, "mcp.json", "servers", {"command": "python3", "env": {"A=B": None}})
    assert raised.value.key == "servers.s.env.A=B" and "invalid environment variable name" in str(raised.value)


@pytest.mark.parametrize(
    ("unset", "said"),
    [("A", "expected a sequence of variable names"), (("A", 1), "expected a sequence"), (("B",), "'B' is both set")],
)
def test_a_spec_built_in_python_checks_its_unset_names(unset: Any, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        ServerSpec(name="s", transport="stdio", command="x", env={"B": "b"}, env_unset=unset)
    assert said in str(raised.value) and raised.value.key == "servers.s.env_unset"


def test_the_unset_changes_the_fingerprint_and_only_then() -> None:
    """A server restarted when its unset names change (a fingerprint defines the connection); one without any keeps
    the fingerprint it had before they existed."""
    plain = ServerSpec(name="s", transport="stdio", command="x")
    assert plain.fingerprint() != ServerSpec(name="s", transport="stdio", command="x", env_unset=("A",)).fingerprint()
    before = json.dumps(["stdio", "x", [], [], None, None, []])  # what a fingerprint hashed before `env_unset`
    assert plain.fingerprint() == hashlib.sha256(before.encode()).hexdigest()[:16]


def test_config_import_writes_the_null_back_as_breakwater_reads_it(tmp_path: Path) -> None:
    folder = tmp_path / ".vscode"
    folder.mkdir()
    (folder / "mcp.json").write_text(json.dumps({"servers": {"s": {"command": "python3", "env": {"A": None, "B": "b"}}}}))
    done = subprocess.run(
        [sys.executable, "-m", "breakwater", "config", "import", str(folder / "mcp.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "s: env.A: null, not inherited by this server" in done.stdout
    (spec,) = load_config(folder / "breakwater.toml", environ={}).servers
    assert spec.env_unset == ("A",) and dict(spec.env) == {"B": "b"}
