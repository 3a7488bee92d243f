"""`breakwater auth login --no-browser`, `auth status --json` and `auth logout`, as a person runs them.

The login prints the authorization URL as the only line on stdout and waits at the loopback
callback or for the final redirect URL pasted on stdin; the test plays the person whose browser is
elsewhere: it opens the URL (the test server approves at once) and pastes where it was redirected.
Then a second login takes the loopback callback with stdin open and silent, and still exits.
Against the real OAuth test server (`oauth_server.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from breakwater.cli import main


def _breakwater(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command in this process (the same code as the installed `breakwater`): code, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_login_no_browser_then_status_then_logout(
    oauth_server: str, config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"remote": {"type": "http", "url": f"{oauth_server}/mcp"}}}))
    env = dict(os.environ)  # XDG_CONFIG_HOME points at this test's config directory (the fixture)
    login = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "auth", "login", "remote", "--no-browser", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert login.stdout is not None
    url = login.stdout.readline().strip()
    assert url.startswith(f"{oauth_server}/authorize?") and "code_challenge_method=S256" in url
    # The person's browser is on another machine: it gets the redirect, and the person pastes that URL.
    redirect = httpx2.get(url, follow_redirects=False, timeout=10).headers["location"]
    assert redirect.startswith("http://localhost:") and "code=" in redirect
    out, err = login.communicate(input=redirect + "\n", timeout=60)
    assert login.returncode == 0, err
    assert out == ""  # the URL was the only line on stdout
    assert "signed in to remote with scopes 'mcp:tools'" in err

    code, status, status_err = _breakwater(capsys, "auth", "status", "--json", "--config", str(config))
    assert code == 0, status_err
    (row,) = json.loads(status)["servers"]
    assert (row["name"], row["signed_in"], row["scopes"], row["refreshable"], row["expired"]) == (
        "remote",
        True,
        "mcp:tools",
        True,
        False,
    )
    tokens = json.loads((config_home / "oauth-tokens.json").read_text())["servers"][f"{oauth_server}/mcp"]["tokens"]
    assert tokens["access_token"] not in status + status_err + err

    code, _, logout_err = _breakwater(capsys, "auth", "logout", "remote", "--config", str(config))
    assert code == 0 and "signed out of remote" in logout_err
    _, after, _ = _breakwater(capsys, "auth", "status", "--json", "--config", str(config))
    assert json.loads(after)["servers"][0]["signed_in"] is False

    # Signed in again through the loopback callback, while standard input stays open and silent (a
    # terminal): the command still ends once the tokens are stored.
    again = subprocess.Popen(
        login.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert again.stdout is not None
    httpx2.get(again.stdout.readline().strip(), follow_redirects=True, timeout=10)
    assert again.wait(timeout=60) == 0
    assert again.stdin is not None
    again.stdin.close()


def test_login_refuses_a_stdio_server(tmp_path: Path, config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"local": {"command": "true"}}}))
    code, _, err = _breakwater(capsys, "auth", "login", "local", "--config", str(config))
    assert code == 2
    assert "local is a stdio server: there is nothing to sign in to" in err
