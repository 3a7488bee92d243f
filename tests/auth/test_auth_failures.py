"""What a user is told when the authorization server fails, refuses or is not there, against the real OAuth test
server (`oauth_server.py`): one line naming what failed and where, never a traceback; the browser's page saying
what happened; a status that tells "a person must sign in" from "the authorization server is in trouble"."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from mcp.client.auth import OAuthFlowError

from auth.oauth_server import M2M_ID
from breakwater import Breakwater
from breakwater.auth import TokenStore
from breakwater.auth._login import Browser, sign_in
from breakwater.cli import main
from breakwater.config import Config, ConnectPolicy, JournalPolicy, ServerSpec
from breakwater.status import Reason, ServerState
from breakwater.testing._fleet import free_port
from helpers import eventually

pytestmark = pytest.mark.anyio


def _spec(base: str) -> ServerSpec:
    return ServerSpec(name="remote", transport="http", url=f"{base}/mcp", connect=ConnectPolicy(background_retry_s=0.5))


async def _failure(spec: ServerSpec, browser: Browser) -> str:
    """Why the sign-in failed (the leaf of the task group's exception group), as `auth login` prints it."""
    try:
        await sign_in(spec, TokenStore(), browser=browser)
    except Exception as exc:
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        assert isinstance(leaf, OAuthFlowError), leaf
        return str(leaf)
    raise AssertionError("the sign-in succeeded")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "breakwater", *argv]
    return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90, check=False)


async def test_refused_client_credentials_print_no_traceback_in_any_command(
    oauth_server: str, config_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`call` and `status` printed the SDK's "OAuth flow error" with its traceback (only `auth` silenced it)."""
    monkeypatch.setenv("BW_TEST_M2M_SECRET", "not-the-secret")
    oauth = {"grantType": "client_credentials", "clientId": M2M_ID, "clientSecret": "${BW_TEST_M2M_SECRET}"}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"bot": {"type": "http", "url": f"{oauth_server}/mcp", "oauth": oauth}}}))
    for argv in (["call", "bot", "whoami", "{}"], ["status"]):
        done = await anyio.to_thread.run_sync(functools.partial(_run, *argv, "--config", str(config)))
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and "OAuth flow error" not in done.stderr, (argv, done.stderr)
    assert "the sign-in failed" in _run("call", "bot", "whoami", "{}", "--config", str(config)).stderr


async def test_a_login_whose_authorization_server_is_down_names_it_without_a_traceback(
    oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    """ "Task exception was never retrieved ... not holding this lock", and the message blamed the MCP server (up)."""
    down = f"http://127.0.0.1:{free_port()}/.well-known/oauth-authorization-server"
    entry = {"type": "http", "url": f"{oauth_server}/mcp", "oauth": {"authServerMetadataUrl": down}}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"remote": entry}}))
    done = await anyio.to_thread.run_sync(lambda: _run("auth", "login", "remote", "--no-browser", "--config", str(config)))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr
    assert f"the authorization server does not answer: nothing answers at {down}" in done.stderr, done.stderr


async def test_a_failing_token_endpoint_is_named_not_the_server(oauth_server: str, config_home: Path) -> None:
    httpx2.post(f"{oauth_server}/admin/token-mode", params={"m": "500"})

    async def browser(url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=True, timeout=30) as http:
            await http.get(url)

    said = await _failure(_spec(oauth_server), browser)
    assert f"{oauth_server}/token answered HTTP 500" in said, said


async def test_the_callback_page_says_what_happened_and_a_stray_redirect_is_ignored(oauth_server: str, config_home: Path) -> None:
    """Every page said "Signed in", and one redirect with a wrong state ended the sign-in."""
    pages: list[tuple[int, str]] = []

    def browser_that(deny: bool) -> Browser:
        def visit(url: str) -> None:
            query = parse_qs(urlsplit(url).query)
            callback, state = query["redirect_uri"][0], query["state"][0]
            with httpx2.Client(follow_redirects=True, timeout=30) as http:
                stray = http.get(callback, params={"code": "stolen", "state": "forged"})
                pages.append((stray.status_code, stray.text))
                if deny:
                    refused = http.get(callback, params={"error": "access_denied", "state": state})
                    pages.append((refused.status_code, refused.text))
                    return
                final = http.get(url)  # the real redirect: its page comes when the sign-in ended
                pages.append((final.status_code, final.text))

        async def browser(url: str) -> None:
            # A thread the sign-in's end does not cancel, as it does not close a real browser.
            await anyio.to_thread.run_sync(visit, url)

        return browser

    assert "access_denied" in await _failure(_spec(oauth_server), browser_that(deny=True))
    assert pages[0][0] == 400 and "ignored" in pages[0][1]
    assert "refused: access_denied" in pages[1][1] and "Signed in" not in pages[1][1]

    pages.clear()
    done = await sign_in(_spec(oauth_server), TokenStore(), browser=browser_that(deny=False))
    assert done.tools == 2  # the stray redirect did not end the sign-in
    assert pages[0][0] == 400 and "Signed in to remote" in pages[1][1]

    pages.clear()
    httpx2.post(f"{oauth_server}/admin/token-mode", params={"m": "500"})
    assert "HTTP 500" in await _failure(_spec(oauth_server), browser_that(deny=False))
    assert "did not finish" in pages[1][1] and "Signed in" not in pages[1][1]


async def test_a_step_up_is_reported_as_the_403_it_was_and_auth_status_says_what_to_run(
    oauth_server: str, config_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status said http_status 401 for a 403 `insufficient_scope`; `auth status` said "yes" and nothing more. (The
    first call's own answer races the connection's teardown the refused sign-in starts: `test_classify`'s table holds
    how a step-up's 403 is read; here, the calls after it.)"""

    async def follow(url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=True, timeout=10) as http:
            await http.get(url)

    spec = _spec(oauth_server)
    await sign_in(spec, TokenStore(), browser=follow)
    async with Breakwater(Config(servers=(spec,), journal=JournalPolicy(url="off")), admission_dir=tmp_path / "a") as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        httpx2.post(f"{oauth_server}/admin/require-scope", params={"s": "extra"})
        await bw.call_tool("remote", "whoami", {}, timeout=30)
        await eventually(lambda: bw.status().servers[0].state is ServerState.FAILED, timeout=20)
        error = bw.status().servers[0].error
        after = (await bw.call_tool("remote", "whoami", {})).structured_content or {}
    assert error is not None and (error.code, error.http_status) == (Reason.AUTH_REQUIRED, 403), error
    assert after.get("code") == "SERVER_UNAVAILABLE" and "breakwater auth login remote" in after["message"], after
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"remote": {"type": "http", "url": spec.url}}}))
    monkeypatch.setenv("COLUMNS", "200")
    main(["auth", "status", "--config", str(config)])
    assert "needs more scope" in capsys.readouterr().out
