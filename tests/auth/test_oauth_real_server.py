"""OAuth against a real protected MCP server (the SDK's server-side auth, `oauth_server.py`, in a subprocess).

Sign-in goes through `auth login`'s code path (`sign_in`), with an HTTP client following the
authorization URL in place of the browser (the server approves without a person); then the gateway
(in this process, an agent's client on it) connects with the stored tokens. What a user would see is
checked: the token file's permissions, that calls keep working when the access token expires
(refresh on the 401, and before expiry), and that a revoked sign-in turns the server `failed` with
`auth_required` and a message naming `breakwater auth login NAME`, which a call repeats, until a new
sign-in heals it without a restart.
"""

from __future__ import annotations

import json
import stat
import time
from dataclasses import replace
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from auth.oauth_server import admin_stats
from breakwater import Breakwater
from breakwater.auth import ServerTokens, TokenStore
from breakwater.auth._login import sign_in
from breakwater.catalog._catalog import Catalog
from breakwater.cli._auth import auth_status
from breakwater.config import Config, ConnectPolicy, GatewayPolicy, JournalPolicy, OAuthSettings, ServerSpec
from breakwater.gateway._server import Gateway
from breakwater.status import Reason, ServerState
from breakwater.testing._fleet import free_port
from breakwater.testing.server import serve_http
from helpers import code_of, envelope_of, eventually

pytestmark = pytest.mark.anyio


async def follow(url: str) -> None:
    """The browser: follow the authorization URL to the redirect (the server approves at once)."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=10) as http:
        await http.get(url)


def _spec(base: str, tmp_path: Path) -> ServerSpec:
    # A signed-out server retries in the background every 0.5 s here (60 s by default).
    return ServerSpec(name="remote", transport="http", url=f"{base}/mcp", connect=ConnectPolicy(background_retry_s=0.5))


async def test_sign_in_refresh_and_revocation(oauth_server: str, config_home: Path, tmp_path: Path) -> None:
    spec = _spec(oauth_server, tmp_path)
    store = TokenStore()
    done = await sign_in(spec, store, browser=follow)
    assert (done.scopes, done.refreshable, done.tools) == ("mcp:tools", True, 2)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_home.stat().st_mode) == 0o700
    record = json.loads(store.path.read_text())["servers"][spec.url]
    assert record["server"] == "remote" and record["metadata"]["token_endpoint"].endswith("/token")

    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    policy = GatewayPolicy()
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        gateway = Gateway(bw, policy, catalog=Catalog(template=policy.tool_name_template, directory=tmp_path / "catalog"))
        async with anyio.create_task_group() as tg, Client(gateway.server, mode="legacy") as agent:
            tg.start_soon(gateway.watch)
            report = await bw.wait_ready(timeout=20)
            assert report.all_ready, report.to_json()
            assert await _whoami(agent) == {"result": "signed in"}

            # Every access token expires at once: the next call is answered after a refresh on the 401.
            httpx2.post(f"{oauth_server}/admin/expire")
            assert await _whoami(agent) == {"result": "signed in"}
            assert admin_stats(oauth_server)["refresh_token"] == 1

            # Revoked: no refresh can help; the server is failed, auth_required, and says what to run.
            httpx2.post(f"{oauth_server}/admin/revoke")
            # The call that meets the revocation is told what the next ones are: nothing ran, sign in again. It read "an
            # internal error, do not repeat this call" (httpx answered with the refused refresh's response).
            first = await agent.call_tool("remote__whoami", {})
            assert code_of(first) == "SERVER_UNAVAILABLE", envelope_of(first)
            assert "breakwater auth login remote" in json.dumps(envelope_of(first))
            await eventually(lambda: bw.status().servers[0].state is ServerState.FAILED, timeout=20)
            status = (await agent.call_tool("breakwater_status", {})).structured_content or {}
            error = status["servers"][0]["error"]
            assert error["code"] == "auth_required" and "breakwater auth login remote" in error["message"]
            refused = await agent.call_tool("remote__whoami", {})
            assert code_of(refused) == "SERVER_UNAVAILABLE"
            assert "breakwater auth login remote" in json.dumps(envelope_of(refused))
            assert not _tokens_in(status, store)
            # `auth status` agrees: it said "signed in, refreshable" after the refresh was refused.
            (row,) = auth_status(config, store)
            assert (row["signed_in"], row["refreshable"], row["refresh_refused"]) == (False, False, True), row

            # A new sign-in is picked up by the running gateway (its next background attempt).
            await sign_in(spec, store, browser=follow)
            (row,) = auth_status(config, store)
            assert (row["signed_in"], row["refresh_refused"]) == (True, False), row
            await eventually(lambda: bw.status().servers[0].state is ServerState.READY, timeout=20)
            assert await _whoami(agent) == {"result": "signed in"}
            tg.cancel_scope.cancel()


async def _whoami(agent: Client) -> object:
    return (await agent.call_tool("remote__whoami", {})).structured_content


def _tokens_in(report: object, store: TokenStore) -> bool:
    text = json.dumps(report)
    secrets = [v for rec in store.records().values() for v in (rec.get("tokens") or {}).values() if isinstance(v, str)]
    return any(len(s) > 8 and s in text for s in secrets)


async def test_an_authorization_server_in_trouble_keeps_the_sign_in_and_says_so(
    oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    """A token endpoint answering 500 read as "the sign-in expired or was revoked: run auth login", and the SDK dropped
    the tokens; refused, "nothing listening at" the MCP URL, which answered. Each now names what failed, and where;
    and neither is `auth_required` (a person must sign in): the 500 is an HTTP status, as unreachable is `refused`."""
    spec = _spec(oauth_server, tmp_path)
    store = TokenStore()
    await sign_in(spec, store, browser=follow)
    httpx2.post(f"{oauth_server}/admin/expire")  # the next request is refused 401: a refresh is needed
    async with serve_http("--status-first", "1000", "--status", "500") as broken:
        cases = (
            (f"{broken.url[:-4]}/token", "HTTP 500 from", Reason.HTTP_STATUS, 500),
            (f"http://127.0.0.1:{free_port()}/token", "", Reason.REFUSED, None),
        )
        for endpoint, says, reason, http_status in cases:
            record = json.loads(store.path.read_text())
            record["servers"][spec.url]["metadata"]["token_endpoint"] = endpoint
            store.path.write_text(json.dumps(record))
            config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
            async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
                await eventually(lambda: bw.status().servers[0].error is not None, timeout=20)
                error = bw.status().servers[0].error
            assert error is not None and endpoint in error.message, (endpoint, error)
            assert says in error.message and "expired or was revoked" not in error.message, error
            assert (error.code, error.http_status) == (reason, http_status), error
    assert json.loads(store.path.read_text())["servers"][spec.url]["tokens"]  # the sign-in is kept


async def test_an_expired_token_is_refreshed_before_it_is_sent(oauth_server: str, config_home: Path, tmp_path: Path) -> None:
    """The stored expiry survives a restart: a process that starts after it passed refreshes first, no 401."""
    spec = _spec(oauth_server, tmp_path)
    store = TokenStore()
    await sign_in(spec, store, browser=follow)
    store.update(spec.url or "", lambda rec: {**rec, "expires_at": time.time() - 1})
    before = admin_stats(oauth_server)["refresh_token"]
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        assert admin_stats(oauth_server)["refresh_token"] == before + 1
        # The OAuth client does not serialize requests: three 1.5 s calls in flight at once take ~1.5 s.
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(bw.call_tool, "remote", "wait", {"seconds": 1.5})
        assert time.monotonic() - started < 3.5
    assert (ServerTokens(store, spec.url or "").expires_at() or 0) > time.time() + 3000


async def test_signed_out_server_is_auth_required_naming_the_command(
    oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    config = Config(servers=(_spec(oauth_server, tmp_path),), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        report = await bw.wait_ready(timeout=20)
    error = report.servers[0].error
    assert error is not None and error.code is Reason.AUTH_REQUIRED
    assert error.message == "not signed in: run `breakwater auth login remote`"
    assert report.servers[0].state is ServerState.FAILED


async def test_auth_server_metadata_url_and_pinned_scopes(oauth_server: str, config_home: Path, tmp_path: Path) -> None:
    """Claude Code's `authServerMetadataUrl` is where the metadata comes from; `scopes` is what is asked for."""
    oauth = OAuthSettings(auth_server_metadata_url=f"{oauth_server}/custom/metadata", scopes="mcp:tools")
    spec = replace(_spec(oauth_server, tmp_path), oauth=oauth)
    seen: list[str] = []

    async def browser(url: str) -> None:
        seen.append(url)
        await follow(url)

    done = await sign_in(spec, TokenStore(), browser=browser)
    assert done.scopes == "mcp:tools" and done.tools == 2
    assert admin_stats(oauth_server)["custom_metadata"] == 1
    assert "scope=mcp%3Atools" in seen[0]


async def test_a_url_of_no_stated_type_signs_in_over_sse_when_the_server_is_a_legacy_sse_one(
    oauth_sse_server: str, config_home: Path, tmp_path: Path
) -> None:
    """`{"url": ".../sse"}` with no type: the sign-in's streamable HTTP POST is refused (after the 401 and the
    browser's round), so `auth login` finishes over SSE, as connects do; the server is then ready over SSE."""
    spec = replace(_spec(oauth_sse_server, tmp_path), url=f"{oauth_sse_server}/sse", transport_guessed=True)
    done = await sign_in(spec, TokenStore(), browser=follow)
    assert (done.scopes, done.tools) == ("mcp:tools", 2)
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        assert bw.status().servers[0].transport == "sse"
        assert (await bw.call_tool("remote", "whoami", {})).structured_content == {"result": "signed in"}


async def test_an_sse_server_signs_in_refreshes_and_reports_auth_required(
    oauth_sse_server: str, config_home: Path, tmp_path: Path
) -> None:
    """The legacy `"type": "sse"` transport gets the same OAuth client as streamable HTTP: signed out it is failed with
    auth_required naming the command, not a bare 401; `auth login`'s sign-in works over SSE; calls go through, and
    through an expired access token (a refresh); a revocation turns it auth_required again."""
    spec = replace(_spec(oauth_sse_server, tmp_path), transport="sse", url=f"{oauth_sse_server}/sse")
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        signed_out = (await bw.wait_ready(timeout=20)).servers[0]
    assert signed_out.error is not None and signed_out.error.code is Reason.AUTH_REQUIRED, signed_out
    assert signed_out.error.message == "not signed in: run `breakwater auth login remote`"

    done = await sign_in(spec, TokenStore(), browser=follow)
    assert (done.scopes, done.refreshable, done.tools) == ("mcp:tools", True, 2)
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        assert (await bw.call_tool("remote", "whoami", {})).structured_content == {"result": "signed in"}
        # The access token expires under the open stream: the next call's POST gets a 401, the client refreshes.
        httpx2.post(f"{oauth_sse_server}/admin/expire")
        assert (await bw.call_tool("remote", "whoami", {})).structured_content == {"result": "signed in"}
        assert admin_stats(oauth_sse_server)["refresh_token"] == 1
        httpx2.post(f"{oauth_sse_server}/admin/revoke")
        await bw.call_tool("remote", "whoami", {})
        await eventually(lambda: bw.status().servers[0].state is ServerState.FAILED, timeout=20)
        error = bw.status().servers[0].error
        assert error is not None and error.code is Reason.AUTH_REQUIRED and "breakwater auth login remote" in error.message
