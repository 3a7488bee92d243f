"""A call cut while its 401 is being handled, against the real OAuth test server (`oauth_server.py`).

The server refused the call's request (401): the tool did not run. The OAuth flow then gets a new token at the token
endpoint (bounded by `refresh_timeout_s`) before sending the request again. When the call's own timeout, its turn
budget or a cancel cut it meanwhile, the gate read the cut as any cut: OUTCOME_UNKNOWN, "the action may or may not have
happened", for a call that never ran, and the journal counted an unknown outcome. The call must end as the refusal a
failed refresh ends in (SERVER_CONNECTING, "the call was not sent", retryable), and the request must never be sent
after it was reported not sent, even when the token endpoint answers later.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from auth.oauth_server import SHORT_LIFETIME_S, admin_stats, follow
from breakwater import Breakwater
from breakwater.auth import TokenStore
from breakwater.auth._flow import refresh_timeout_s
from breakwater.auth._login import sign_in
from breakwater.config import CallPolicy, Config, ConnectPolicy, ServerSpec
from breakwater.errors import CODE_TO_ERROR, CallRefused, ErrorCode
from breakwater.journal import Journal, SQLiteJournalStore
from helpers import envelope_of

pytestmark = pytest.mark.anyio

#: How long the test server's token endpoint takes in its `slow` mode (`oauth_server.SLOW_TOKEN_S`).
SLOW_TOKEN_S = 2.0
#: The call's own timeout, or its budget: well under the token endpoint's wait and the refresh's bound.
CUT_S = 0.6


@pytest.mark.parametrize(
    ("cut", "token_mode"),
    [
        ("caller_timeout", "slow"),  # the refresh succeeds after the cut: the request must not be sent after all
        ("entry_timeout", "hang"),  # the entry's own timeout, under the refresh's 1 s floor
        ("budget", "slow"),
    ],
)
async def test_a_call_cut_while_its_401_is_refreshed_was_not_sent(
    cut: str, token_mode: str, oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    timeout_s = CUT_S if cut == "entry_timeout" else 15.0
    spec = ServerSpec(
        name="remote",
        transport="http",
        url=f"{oauth_server}/mcp",
        connect=ConnectPolicy(background_retry_s=0.5),
        call=CallPolicy(timeout_s=timeout_s),
    )
    assert refresh_timeout_s(spec) > CUT_S  # the refresh may outlast the call: the case at hand
    await sign_in(spec, TokenStore(), browser=follow)
    journal = Journal(SQLiteJournalStore(tmp_path / "journal.sqlite3"))
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission", journal=journal) as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        httpx2.post(f"{oauth_server}/admin/expire")  # the access token: the next call is refused 401
        httpx2.post(f"{oauth_server}/admin/token-mode", params={"m": token_mode})
        started = time.monotonic()
        if cut == "budget":
            async with bw.budget(seconds=CUT_S):
                result = await bw.call_tool("remote", "whoami", {})
        else:
            # whoami has no hints: a tool that may change things, never repeated once it may have run.
            result = await bw.call_tool("remote", "whoami", {}, timeout=CUT_S if cut == "caller_timeout" else None)
        took = time.monotonic() - started
        if token_mode == "slow":
            await anyio.sleep(SLOW_TOKEN_S + 1.0)  # the token endpoint answered: a resend would have run the tool by now
        ran = admin_stats(oauth_server)["whoami"]
    envelope = envelope_of(result)
    assert envelope.get("code") == "SERVER_CONNECTING", envelope
    assert issubclass(CODE_TO_ERROR[ErrorCode(envelope["code"])], CallRefused)
    assert envelope["retryable"] is True, envelope
    text = envelope["message"]
    assert "HTTP 401" in text and "the call was not sent" in text, text
    assert "remote's token endpoint" in text and "/token" in text, text
    assert "may or may not" not in text, text
    assert took < 5, took  # answered at the cut, not after the token endpoint
    assert ran == 0  # the server refused the request, and it was never sent again
    journal.flush()
    rows = [r for r in journal.store.recent(10) if r.tool == "whoami"]
    assert rows, "the attempt was not journaled"
    for row in rows:
        assert row.outcome not in ("outcome_unknown", "timeout") and row.error_code != "OUTCOME_UNKNOWN", row


async def test_a_call_cancelled_by_its_caller_while_its_401_is_refreshed_is_not_journaled_unknown(
    oauth_server: str, config_home: Path, tmp_path: Path
) -> None:
    """The caller's own cancel (an agent's deadline) during the refresh: no answer to give, but the journal counted the
    call of a tool that changes things as of unknown outcome, and a refresh that succeeded later resent it."""
    spec = ServerSpec(name="remote", transport="http", url=f"{oauth_server}/mcp", call=CallPolicy(timeout_s=15.0))
    await sign_in(spec, TokenStore(), browser=follow)
    journal = Journal(SQLiteJournalStore(tmp_path / "journal.sqlite3"))
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission", journal=journal) as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        httpx2.post(f"{oauth_server}/admin/expire")
        httpx2.post(f"{oauth_server}/admin/token-mode", params={"m": "slow"})
        with anyio.move_on_after(CUT_S) as cancelled:
            await bw.call_tool("remote", "whoami", {})
        assert cancelled.cancelled_caught
        await anyio.sleep(SLOW_TOKEN_S + 1.0)
        ran = admin_stats(oauth_server)["whoami"]
        # The sign-in was refreshed meanwhile: the next call runs, once.
        again = await bw.call_tool("remote", "whoami", {})
        assert not again.is_error, json.dumps(envelope_of(again))
        assert admin_stats(oauth_server)["whoami"] == 1
    assert ran == 0
    journal.flush()
    codes = [r.error_code for r in journal.store.recent(10) if r.tool == "whoami"]
    assert "CANCELLED" in codes and "OUTCOME_UNKNOWN" not in codes, codes


@pytest.mark.parametrize("protocol", ["2026-07-28", "2025-11-25"])
async def test_a_call_cut_while_its_expired_token_is_refreshed_before_sending_was_not_sent(
    protocol: str, oauth_server_short_lived: str, config_home: Path, tmp_path: Path
) -> None:
    """The access token expired (here after 3 s; hourly for most servers), so the flow refreshes it before the call's
    request goes out, and the token endpoint is slow. The call's timeout cut it meanwhile: it was told OUTCOME_UNKNOWN
    ("it may have run") of a request that never left, and on 2025-11-25 (whose POST is not aborted by a cut) the
    request went out after the refresh. It is told it was not sent, and it never is."""
    base = oauth_server_short_lived
    spec = ServerSpec(
        name="remote",
        transport="http",
        url=f"{base}/mcp",
        # No health pings: one would refresh the expired token before the call does.
        connect=ConnectPolicy(background_retry_s=0.5, health_interval_s=0, protocol=protocol),
        call=CallPolicy(timeout_s=15.0),
    )
    await sign_in(spec, TokenStore(), browser=follow)
    journal = Journal(SQLiteJournalStore(tmp_path / "journal.sqlite3"))
    async with Breakwater(Config(servers=(spec,)), admission_dir=tmp_path / "admission", journal=journal) as bw:
        assert (await bw.wait_ready(timeout=20)).all_ready
        httpx2.post(f"{base}/admin/token-mode", params={"m": "slow"})
        await anyio.sleep(SHORT_LIFETIME_S + 0.5)  # whichever token the connection has now, it has expired
        started = time.monotonic()
        result = await bw.call_tool("remote", "whoami", {}, timeout=CUT_S)
        took = time.monotonic() - started
        await anyio.sleep(SLOW_TOKEN_S + 1.0)  # the token endpoint answered: a send after the cut would have run it
        ran = admin_stats(base)["whoami"]
        httpx2.post(f"{base}/admin/token-mode", params={"m": "ok"})
        again = await bw.call_tool("remote", "whoami", {})  # the refresh the cut did not abort kept the sign-in
        assert not again.is_error, json.dumps(envelope_of(again))
    envelope = envelope_of(result)
    assert envelope.get("code") == "SERVER_CONNECTING", envelope
    assert envelope["retryable"] is True, envelope
    text = envelope["message"]
    assert "token had expired" in text and "the call was not sent" in text, text
    assert "remote's token endpoint" in text and "/token" in text, text
    assert took < 5, took
    assert ran == 0  # never sent
    journal.flush()
    codes = [r.error_code for r in journal.store.recent(10) if r.tool == "whoami"]
    assert "OUTCOME_UNKNOWN" not in codes, codes
