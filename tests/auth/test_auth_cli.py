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
from typing import Any

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


def _json_with_a_broken_entry(path: Path, url: str) -> str:
    broken = {"command": "x", "args": ["${BW_TEST_NEVER_SET}"]}
    path.write_text(
        json.dumps({"mcpServers": {"broken": broken, "remote": {"type": "http", "url": url}, "bad": {"url": "http://"}}})
    )
    return "mcpServers.broken"


def _toml_with_a_broken_entry(path: Path, url: str) -> str:
    path.write_text(
        f'[servers.remote]\nurl = "{url}"\n[servers.slow]\ncommand = "x"\n[servers.slow.call]\ntimeout_s = -1\n'
        '[servers.bad]\nurl = "http://"\n'
    )
    return "servers.slow.call.timeout_s"


@pytest.mark.parametrize("write", [_json_with_a_broken_entry, _toml_with_a_broken_entry], ids=["json", "toml"])
def test_login_works_when_only_that_servers_entry_is_valid(
    write: Any, oauth_server: str, config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another server's broken entry is a warning naming file, key and fix, and the sign-in goes on; `serve` and
    `config check` still refuse the file, and a login to the broken server itself is refused with its error."""
    os.environ.pop("BW_TEST_NEVER_SET", None)
    config = tmp_path / ("breakwater.toml" if write is _toml_with_a_broken_entry else "mcp.json")
    key = write(config, f"{oauth_server}/mcp")
    login = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "auth", "login", "remote", "--no-browser", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert login.stdout is not None
    url = login.stdout.readline().strip()
    assert url.startswith(f"{oauth_server}/authorize?"), login.communicate(timeout=30)
    redirect = httpx2.get(url, follow_redirects=False, timeout=10).headers["location"]
    _, err = login.communicate(input=redirect + "\n", timeout=60)
    assert login.returncode == 0, err
    assert "signed in to remote" in err
    warnings = [line for line in err.splitlines() if line.startswith("breakwater: warning:")]
    assert len(warnings) == 2 and f"{config}: {key}" in warnings[0] and "bad" in warnings[1], err
    assert err.count("fix:") >= 2  # each warning says how to fix its entry

    broken_name = key.split(".")[1]
    for command in (["config", "check"], ["serve"], ["auth", "login", broken_name]):
        refused = subprocess.run(
            [sys.executable, "-m", "breakwater", *command, "--config", str(config)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # A variable not set turns only its server off in `serve` (tests/config/test_unset_variables.py): there the
        # file is refused for its other broken entry.
        said = "mcpServers.bad.url" if command == ["serve"] and write is _json_with_a_broken_entry else key
        assert refused.returncode == 2 and "config error" in refused.stderr and said in refused.stderr, (command, refused.stderr)
    code, _, logout_err = _breakwater(capsys, "auth", "logout", "remote", "--config", str(config))
    assert code == 0 and "signed out of remote" in logout_err


def test_auth_status_without_an_http_server_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed an empty table."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"local": {"command": "x"}}}))
    code, out, _ = _breakwater(capsys, "auth", "status", "--config", str(config))
    assert code == 0 and "no HTTP server in" in out


@pytest.mark.anyio
async def test_a_sign_in_that_cannot_happen_says_what_stopped_it(config_home: Path, tmp_path: Path) -> None:
    """It printed a traceback (a 401 with no OAuth), "MCPError: Server returned an error response" (a 403), and
    "ConnectError: All connection attempts failed" without the address; each is now one line saying what, and where."""
    from breakwater.testing._fleet import free_port
    from breakwater.testing.server import serve_http

    closed = f"http://127.0.0.1:{free_port()}/mcp"
    async with (
        serve_http("--status-first", "1000", "--status", "403") as forbidding,
        serve_http("--status-first", "1000", "--status", "401") as keyed,
    ):
        cases = {
            "closed": (closed, f"nothing answers at {closed}"),
            "forbidding": (forbidding.url, "(HTTP 403)"),
            "keyed": (keyed.url, "put it in the entry's headers"),
        }
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {name: {"type": "http", "url": url} for name, (url, _) in cases.items()}}))
        for name, (_, says) in cases.items():
            argv = [sys.executable, "-m", "breakwater", "auth", "login", name, "--no-browser", "--config", str(config)]
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90, check=False)
            assert done.returncode == 1, done.stderr
            assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
            assert says in done.stderr, done.stderr
