"""A call that meets a 401 mid-session, whose refresh then fails, against the real OAuth test server (`oauth_server.py`).

The 401 means the server refused the request: the tool did not run, whatever the refresh does next. A token endpoint
that hangs held the call until its deadline cut it, and the model read OUTCOME_UNKNOWN ("it may have run"). Every way
the refresh can fail (a hang, nothing listening, a 5xx, a 200 that is no token response, invalid_grant) must end the
call as a refusal (nothing ran) that names the server and what to run, within the call's timeout.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import anyio
import httpx2
import pytest

from auth.oauth_server import admin_stats, follow
from breakwater import Breakwater
from breakwater.auth import TokenStore
from breakwater.auth._flow import refresh_timeout_s
from breakwater.auth._login import sign_in
from breakwater.config import CallPolicy, Config, ConnectPolicy, JournalPolicy, ServerSpec
from breakwater.errors import CallRefused
from breakwater.testing._fleet import free_port
from helpers import envelope_of

pytestmark = pytest.mark.anyio


def _spec(base: str) -> ServerSpec:
    # A 15 s call timeout: on a loaded CI host the refused call's way through the refresh and the reconnect took more
    # than the 5 s default, and the timeout cut it first (OUTCOME_UNKNOWN), which is not what this test is about.
    return ServerSpec(
        name="remote",
        transport="http",
        url=f"{base}/mcp",
        # No health pings: one sent beside the call met the revoked token first, its failed refresh closed the
        # connection under the call in flight, and the call read "connection closed" (OUTCOME_UNKNOWN) — another story.
        connect=ConnectPolicy(background_retry_s=0.5, health_interval_s=0),
        call=CallPolicy(timeout_s=15.0),
    )


@pytest.mark.parametrize("failure", ["hang", "refused", "500", "garbage", "invalid_grant"])
async def test_a_401_whose_refresh_fails_is_a_refusal_not_an_unknown_outcome(
    failure: str, oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    spec = _spec(oauth_server)
    store = TokenStore()
    await sign_in(spec, store, browser=follow)
    if failure == "refused":  # the sign-in's metadata names a token endpoint where nothing listens
        record = json.loads(store.path.read_text())
        record["servers"][spec.url]["metadata"]["token_endpoint"] = f"http://127.0.0.1:{free_port()}/token"
        store.path.write_text(json.dumps(record))
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        if failure == "invalid_grant":
            httpx2.post(f"{oauth_server}/admin/revoke")  # the refresh token too: the token endpoint answers 400
        else:
            httpx2.post(f"{oauth_server}/admin/expire")  # the access token: the next call is refused 401
            httpx2.post(f"{oauth_server}/admin/token-mode", params={"m": failure})
        started = time.monotonic()
        result = await bw.call_tool("remote", "whoami", {})  # a tool with no hints: never repeated once it may have run
        took = time.monotonic() - started
    envelope = envelope_of(result)
    code = envelope.get("code")
    assert code in ("SERVER_UNAVAILABLE", "SERVER_CONNECTING"), envelope
    assert issubclass(_error_class(code), CallRefused)  # the tool did not run: safe to repeat once signed in again
    text = json.dumps(envelope)
    if failure == "refused":  # the reconnect meets it first: the connect's own words name the endpoint
        assert "nothing listening at http://127.0.0.1:" in text and "/token" in text, text
    else:
        assert "breakwater auth login remote" in text, text
    if failure == "hang":
        assert "remote's token endpoint" in text and f"/token did not answer within {refresh_timeout_s(spec):g} s" in text, text
    if failure == "garbage":
        assert "no token response" in text, text
    assert took < 20, took  # within the call's 15 s timeout, and one wait for the reconnect


def _error_class(code: object) -> type:
    from breakwater.errors import CODE_TO_ERROR, ErrorCode

    return CODE_TO_ERROR[ErrorCode(str(code))]


@pytest.mark.parametrize("protocol", ["2026-07-28", "2025-11-25"])
async def test_a_call_in_flight_when_the_sign_in_ends_gets_its_answer(
    protocol: str, oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    """The sign-in ends (every token revoked) while a call the server took is running; another call then meets the
    401, its refresh is refused, and the connection is closed to be opened again. Closed at once, it cut the running
    call, whose model read OUTCOME_UNKNOWN; it now closes once that call has its answer (and on a loaded host the
    `subscriptions/listen` stream, meeting the revoked token first, closed it under a call the server was refusing)."""
    spec = _spec(oauth_server)
    spec = replace(spec, connect=replace(spec.connect, protocol=protocol))
    await sign_in(spec, TokenStore(), browser=follow)
    config = Config(servers=(spec,), journal=JournalPolicy(url="off"))
    answers: dict[str, object] = {}
    async with Breakwater(config, admission_dir=tmp_path / "admission") as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready

        async def running() -> None:
            answers["wait"] = await bw.call_tool("remote", "wait", {"seconds": 3})

        async with anyio.create_task_group() as tg:
            tg.start_soon(running)
            with anyio.fail_after(10):  # until the server has begun the call
                while admin_stats(oauth_server)["waits_begun"] < 1:
                    await anyio.sleep(0.05)
            httpx2.post(f"{oauth_server}/admin/revoke")
            started = time.monotonic()
            answers["whoami"] = await bw.call_tool("remote", "whoami", {})
            took = time.monotonic() - started
    refused = envelope_of(answers["whoami"])
    assert refused.get("code") in ("SERVER_UNAVAILABLE", "SERVER_CONNECTING"), refused
    assert "breakwater auth login remote" in json.dumps(refused), refused
    # Refused once the running call had its answer and the reconnect failed, not after a wait for the listen stream,
    # which never ends (the close would have waited the whole call timeout of 15 s).
    assert took < 10, took
    waited = answers["wait"]
    assert getattr(waited, "is_error", None) is False, waited
    assert [block.text for block in waited.content] == ["waited"], waited  # type: ignore[attr-defined]
