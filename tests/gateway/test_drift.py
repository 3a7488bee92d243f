"""Definition drift: a server that changes a tool under a running setup is noticed, and can be blocked until accepted."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from breakwater.config._checks import distinct_name
from breakwater.testing.server import launch_command
from helpers import run_breakwater as breakwater

pytestmark = pytest.mark.anyio


def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A server whose flags live in a file, so its tools can change while its config stays the same."""
    flags = tmp_path / "flags"
    cmd = " ".join(shlex.quote(part) for part in launch_command())
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"svc": {"command": "sh", "args": ["-c", f'exec {cmd} $(cat "{flags}")']}}}))
    env = dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
    )
    return config, flags, env


async def session(config: Path, env: dict[str, str]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Connect through the gateway; return the listed tools, the status tool's answer and a call's envelope."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env)
    async with Client(params) as client:
        with anyio.fail_after(30):
            while True:
                status = (await client.call_tool("breakwater_status", {})).structured_content or {}
                if status["summary"].get("ready") == 1:
                    break
                await anyio.sleep(0.1)
        names = [t.name for t in (await client.list_tools()).tools]
        call = await client.call_tool("svc__lookup", {})
        return names, status, {"is_error": call.is_error, **(call.structured_content or {})}


async def early_call(config: Path, env: dict[str, str]) -> dict[str, Any]:
    """A call at once, the server still starting: the gateway lists its last-known tools, and the call waits for it."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env)
    async with Client(params) as client:
        call = await client.call_tool("svc__lookup", {})
    return {"is_error": call.is_error, **(call.structured_content or {})}


def accept(config: Path, env: dict[str, str], *names: str) -> str:
    result = breakwater(env, "tools", *names, "--accept", "--config", str(config), "--wait", "20")
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_block_mode_hides_a_changed_tool_until_a_person_accepts_it(tmp_path: Path) -> None:
    """drift = block: a changed tool disappears from the list, calls answer TOOL_CHANGED, status names it;
    `breakwater tools --accept` brings it back."""
    config, flags, env = setup(tmp_path)
    env["BREAKWATER_DRIFT"] = "block"
    flags.write_text("--tool lookup:latency=0,readonly")
    names, status, call = await session(config, env)
    assert "svc__lookup" in names and call["is_error"] is False and status["drift"] == {}
    flags.write_text("--tool lookup:latency=0,destructive")  # the server's new version: same name, new contract
    names, status, call = await session(config, env)
    assert "svc__lookup" not in names
    assert status["drift"] == {"svc": ["lookup"]}
    assert (call["is_error"], call["code"], call["retryable"]) == (True, "TOOL_CHANGED", False)
    # A call made before the server is ready (the tool listed as last known) and `breakwater call` both ran it.
    assert (await early_call(config, env))["code"] == "TOOL_CHANGED"
    command = [sys.executable, "-m", "breakwater", "call", "svc", "lookup", "--config", str(config), "--wait", "20"]
    direct = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert direct.returncode == 1 and "TOOL_CHANGED" in direct.stderr, direct.stdout + direct.stderr
    # A person is told where it went: it vanished from `tools`, `tools lookup` said "No such tool", `status` nothing.
    said = breakwater(env, "tools", "lookup", "--config", str(config), "--wait", "20")
    blocked = 'svc__lookup: its definition changed since it was approved (drift = "block"): `breakwater tools --accept'
    assert blocked in said.stdout, said.stdout
    listed = json.loads(breakwater(env, "tools", "--json", "--config", str(config), "--wait", "20").stdout)
    assert [t["name"] for t in listed["left_out"]] == ["svc__lookup"]
    shown = breakwater(env, "status", "--config", str(config), "--wait", "20")
    assert "svc: tool 'svc__lookup' changed since approved: left out until approved;" in shown.stdout, shown.stdout
    as_json = json.loads(breakwater(env, "status", "--json", "--config", str(config), "--wait", "20").stdout)
    assert (as_json["drift"], as_json["drift_mode"]) == ({"svc": ["lookup"]}, "block")
    # A name no server lists said "nothing had changed", exit 0, while the change waited under its real name.
    for name, hint in (("svc__lookpu", " (did you mean 'svc__lookup'?)"), ("lookup", "; the gateway names it svc__lookup")):
        refused = breakwater(env, "tools", name, "--accept", "--config", str(config), "--wait", "20")
        assert refused.returncode == 2 and f"no ready server lists a tool of that name{hint}" in refused.stderr, refused.stderr
    assert "accepted: svc__lookup" in accept(config, env, "svc__lookup")
    names, status, call = await session(config, env)
    assert "svc__lookup" in names and call["is_error"] is False and status["drift"] == {}


async def test_warn_mode_keeps_the_tool_and_says_so(tmp_path: Path) -> None:
    """drift = warn (the default): the changed tool stays usable; status and search flag it."""
    config, flags, env = setup(tmp_path)
    flags.write_text("--tool lookup:latency=0,readonly")
    await session(config, env)
    flags.write_text("--tool lookup:latency=0,idempotent")
    names, status, call = await session(config, env)
    assert "svc__lookup" in names and call["is_error"] is False
    assert status["drift"] == {"svc": ["lookup"]}
    result = subprocess.run(
        [sys.executable, "-m", "breakwater", "tools", "lookup", "--json", "--config", str(config), "--wait", "20"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    (match,) = json.loads(result.stdout)["matches"]
    assert match["name"] == "svc__lookup" and match["definition_changed"] is True


async def test_a_tool_renamed_for_a_clash_is_accepted_by_the_name_it_is_listed_under(tmp_path: Path) -> None:
    """Server "svc"'s `x__lookup` and "svc__x"'s `lookup` are both `svc__x__lookup`; "svc__x" claims it (the more
    specific), "svc"'s tool is listed under a name of its own, and `--accept` of that name approves its changed
    definition (it named nothing before)."""
    config, flags, env = setup(tmp_path)
    changing = json.loads(config.read_text())["mcpServers"]["svc"]
    fixed = launch_command("--tool", "lookup:latency=0,readonly")
    servers = {"svc": changing, "svc__x": {"command": fixed[0], "args": fixed[1:]}}
    config.write_text(json.dumps({"mcpServers": servers}))
    env["BREAKWATER_DRIFT"] = "block"
    renamed = distinct_name("svc__x__lookup", "svc", "x__lookup", 64)
    flags.write_text("--tool x__lookup:latency=0,readonly")
    params = StdioServerParameters(command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env)

    async def listed() -> list[str]:
        async with Client(params) as client:
            with anyio.fail_after(30):
                while (await client.call_tool("breakwater_status", {})).structured_content["summary"].get("ready") != 2:
                    await anyio.sleep(0.1)
            return [t.name for t in (await client.list_tools()).tools]

    assert {"svc__x__lookup", renamed} <= set(await listed())
    flags.write_text("--tool x__lookup:latency=0,destructive")
    assert renamed not in await listed()  # blocked until accepted
    assert f"accepted: {renamed}" in accept(config, env, renamed)
    assert renamed in await listed()


def test_a_catalog_that_cannot_be_written_is_said_once_and_an_approval_it_cannot_keep_fails(tmp_path: Path) -> None:
    """`BREAKWATER_CATALOG_DIR` naming a file (or a read-only home): the last-known tools and the approved definitions
    were dropped without a word, so drift was never seen (every start pinned afresh) and `tools --accept` printed
    "accepted" for an approval gone with its process. Now each process says it once, and `--accept` exits 1."""
    config, flags, env = setup(tmp_path)
    flags.write_text("--tool lookup:latency=0,readonly --tool other:latency=0")
    blocker = tmp_path / "catalog"
    blocker.write_text("not a directory")
    env["BREAKWATER_DRIFT"] = "block"
    listed = breakwater(env, "tools", "--config", str(config), "--wait", "20")
    assert listed.returncode == 0 and "svc__lookup" in listed.stdout, listed.stdout + listed.stderr
    said = [line for line in listed.stderr.splitlines() if "cannot keep the last-known tools" in line]
    assert len(said) == 1, listed.stderr  # two servers' worth of writes (tools and pins), one line
    assert f"in {blocker} (a file is where a directory should be)" in said[0], said
    assert "(fix: set [gateway] catalog_dir (BREAKWATER_CATALOG_DIR) to a writable directory)" in said[0], said
    refused = breakwater(env, "tools", "svc__lookup", "--accept", "--config", str(config), "--wait", "20")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "accepted:" not in refused.stdout and "breakwater: not accepted: svc__lookup: cannot write" in refused.stderr
    assert blocker.read_text() == "not a directory"
