"""`breakwater call` on a tool that asks the client something mid-call, as a person runs it (`</dev/null`, `| cat`).

No model and no user stand behind a one-shot command: a sampling request, a form or a page to open is refused, and
the call fails CLIENT_CANNOT_ANSWER (the gateway's code for a client without the capability), naming what the tool
asked for, the page's address, and the fix, with exit code 1; `--json` carries the envelope. It was TOOL_ERROR or
UPSTREAM_ERROR ("the server answered with error -32600"): the tool did not fail, the client could not answer.
`roots/list` is answered with the current directory. Real parts: `python -m breakwater call` in a subprocess, the
test server's asking tools (`--asking-tools`) over stdio, in both protocol revisions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from breakwater.testing._asks import DEFAULT_PAGE
from breakwater.testing.server import launch_command
from helpers import isolated_env

ERAS = ["2025-11-25", "2026-07-28"]


def call(tmp_path: Path, tool: str, *args: str, era: str = "2025-11-25", cwd: Path | None = None, **env: str) -> Any:
    """`breakwater call t TOOL ARGS` with stdin from /dev/null and its output piped (as `| cat`)."""
    cmd = launch_command("--asking-tools", "--tool", "echo")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"t": {"command": cmd[0], "args": cmd[1:]}}}))
    return subprocess.run(
        [sys.executable, "-m", "breakwater", "call", "t", tool, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        env=isolated_env(tmp_path, BREAKWATER_PROTOCOL=era, **env),
        stdin=subprocess.DEVNULL,
        cwd=cwd or tmp_path,
        timeout=90,
        check=False,
    )


def failure_line(done: Any, tool: str) -> str:
    """The one line the call's failure is, after checking the exit code and an empty stdout."""
    assert (done.returncode, done.stdout) == (1, ""), (done.returncode, done.stdout, done.stderr)
    last: str = done.stderr.splitlines()[-1]
    assert last.startswith(f"breakwater: call failed: CLIENT_CANNOT_ANSWER: Tool '{tool}' on server 't': "), done.stderr
    assert "TOOL_ERROR" not in done.stderr and "UPSTREAM_ERROR" not in done.stderr, done.stderr
    return last


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("tool", "asked", "fix"),
    [
        ("ask_sampling", "asked the client for sampling", "an agent that supports sampling"),
        ("ask_form", "asked the user to fill in a form (What name should the report carry?)", "supports elicitation"),
        ("ask_url", f"asked the user to open a page (Sign in to the example service): {DEFAULT_PAGE},", "open it yourself"),
    ],
)
def test_a_question_the_command_cannot_answer_is_client_cannot_answer(
    tmp_path: Path, era: str, tool: str, asked: str, fix: str
) -> None:
    """One line: what the tool asked for (a page's address to open), why no answer came, and where it can run."""
    last = failure_line(call(tmp_path, tool, era=era), tool)
    assert asked in last and fix in last and "`breakwater serve`" in last, last
    assert "give the user the address" not in last, last  # the model's advice, not the person's


def test_json_carries_the_envelope_with_the_page(tmp_path: Path) -> None:
    """`--json`: the CallToolResult with the gateway's envelope (request, reason, the page as the server sent it)."""
    done = call(tmp_path, "ask_url", "--json")
    assert done.returncode == 1, done.stderr
    envelope = json.loads(done.stdout)["structuredContent"]
    assert (envelope["ok"], envelope["code"], envelope["request"]) == (False, "CLIENT_CANNOT_ANSWER", "elicitation")
    assert [page["url"] for page in envelope["elicitations"]] == [DEFAULT_PAGE], envelope
    assert DEFAULT_PAGE in envelope["message"] and "breakwater call" in envelope["reason"], envelope
    sampled = json.loads(call(tmp_path, "ask_sampling", "--json", era="2026-07-28").stdout)["structuredContent"]
    assert (sampled["code"], sampled["request"]) == ("CLIENT_CANNOT_ANSWER", "sampling"), sampled


def test_a_page_the_server_needs_opened_first_is_named_for_the_person(tmp_path: Path) -> None:
    """URL elicitation required (-32042): the address and "call again", without the advice written for a model."""
    last = failure_line(call(tmp_path, "ask_url_first"), "ask_url_first")
    assert f"Sign in to the example service — open {DEFAULT_PAGE}" in last, last
    assert "give the user the address" not in last, last


def test_a_page_address_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """The address is the server's text: an escape sequence in it is shown, not obeyed, and the failure stays one line."""
    done = call(tmp_path, "ask_url", "--arg", "url=https://auth.example/\x1b[2J\nsigned")
    last = failure_line(done, "ask_url")
    assert "\x1b" not in done.stderr and "https://auth.example/\\u001b[2J\\u000asigned" in last, done.stderr


@pytest.mark.parametrize("era", ERAS)
def test_roots_are_the_current_directory(tmp_path: Path, era: str) -> None:
    """A server that asks for the client's roots gets the directory `call` runs in, as from an agent started there."""
    project = tmp_path / "my project"
    project.mkdir()
    done = call(tmp_path, "ask_roots", era=era, cwd=project)
    assert (done.returncode, done.stdout.strip()) == (0, project.resolve().as_uri()), done.stderr


def test_the_gateway_judging_calls_too_answers_the_same(tmp_path: Path) -> None:
    """`drift = "block"` puts the gateway's approval check in front of the call: what the tool asks is answered alike."""
    last = failure_line(call(tmp_path, "ask_sampling", BREAKWATER_DRIFT="block"), "ask_sampling")
    assert "asked the client for sampling" in last, last
    done = call(tmp_path, "ask_roots", BREAKWATER_DRIFT="block")
    assert (done.returncode, done.stdout.strip()) == (0, tmp_path.resolve().as_uri()), done.stderr
