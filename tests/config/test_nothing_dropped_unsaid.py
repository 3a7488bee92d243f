"""Inputs a client's file may hold that breakwater took without a word, or refused with a fix that could not work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from breakwater.config import load_config
from breakwater.errors import ConfigError


def test_a_misspelt_table_of_servers_is_named_with_the_one_it_meant(tmp_path: Path) -> None:
    """`mcpservers` beside `mcpServers` was "the client's own settings": its servers never ran, unsaid."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"command": "echo"}}, "mcpservers": {"y": {"command": "echo"}}}))
    assert "mcpservers ignored: did you mean mcpServers? its servers are not read" in load_config(path).notes


def test_a_null_env_or_oauth_is_none(tmp_path: Path) -> None:
    """Zed writes `"env": null` (and reads it as none); it was refused as "expected a table of strings"; so was
    `"oauth": null`."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"context_servers": {"e": {"source": "custom", "command": "echo", "env": None}}}))
    assert load_config(path).server("e").env == {}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"type": "http", "url": "https://x.example/mcp", "oauth": None}}}))
    assert load_config(path).server("x").oauth is None
    assert not any("oauth kept" in note for note in load_config(path).server("x").notes)


@pytest.mark.parametrize("variable", ["${workspaceFolder:api}", "${file}", "${relativeFile}"])
def test_a_vs_code_editor_variable_is_named_as_one(tmp_path: Path, variable: str) -> None:
    """The fix said "set workspaceFolder:api in the environment": no shell can set a variable of that name."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": {"gh": {"type": "stdio", "command": "echo", "args": [variable]}}}))
    with pytest.raises(ConfigError, match="VS Code fills this in from the editor") as refused:
        load_config(path, environ={})
    assert "write the value itself" in str(refused.value.fix)


def test_an_env_file_that_is_not_utf8_says_to_save_it_so(tmp_path: Path) -> None:
    (tmp_path / "bad.env").write_bytes(b"\xff\xfe=1\n")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"command": "echo", "envFile": "bad.env"}}}))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.fix == "save it as UTF-8"


def test_a_key_beside_vs_codes_servers_in_its_user_settings_is_named(tmp_path: Path) -> None:
    """`"mcp": {"servers": ..., "inptus": [...]}`: the misspelt key vanished without a note."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"mcp": {"servers": {"a": {"command": "echo"}}, "inptus": [], "zzz": 5}}))
    notes = load_config(path).notes
    assert "mcp.inptus ignored: did you mean mcp.inputs?" in notes and "mcp.zzz ignored: VS Code's own setting" in notes
