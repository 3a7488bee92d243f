"""`breakwater auth login|status|logout`: OAuth sign-in for the config's remote HTTP servers.

`login NAME` runs the sign-in (`auth/_login.py`) and stores the tokens in the token store, where a
running gateway finds them at its next attempt (no restart). `status` says, per HTTP server,
whether it is signed in, with which scopes, until when, and whether it can refresh. `logout NAME`
revokes the tokens at the authorization server when it advertises a `revocation_endpoint` (RFC 7009;
a failure is a warning), then forgets them and the client registration. No command prints a token.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
from mcp.client.auth import OAuthFlowError
from rich.table import Table

from breakwater.auth import TokenStore, login_command
from breakwater.auth._login import sign_in
from breakwater.auth._revoke import Revocation, revoke_sign_in
from breakwater.auth._store import record_key
from breakwater.cli._common import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_NOT_READY,
    EXIT_OK,
    Parser,
    add_config_flag,
    did_you_mean,
    fail,
    load_for_server_or_exit,
    load_or_exit,
    show,
)
from breakwater.cli._text import cell
from breakwater.config import Config, ServerSpec

__all__ = ["auth_main", "auth_status"]


def _http_server(config: Config, name: str, *, login: bool = True) -> ServerSpec | int:
    """The named HTTP server, or the exit code after saying why not (a client-credentials one only to log out)."""
    try:
        spec = config.server(name)
    except KeyError:
        hint = did_you_mean(name, [s.name for s in config.servers])
        return fail(f"no server {name!r} in {config.path}{hint}", EXIT_CONFIG)
    if spec.transport == "stdio":
        return fail(f"{name} is a stdio server: there is nothing to sign in to", EXIT_CONFIG)
    if login and spec.oauth is not None and spec.oauth.grant_type == "client_credentials":
        return fail(f"{name} signs in with client credentials from the config: no login needed", EXIT_CONFIG)
    return spec


def _login(args: argparse.Namespace) -> int:
    # Another server's broken entry must not keep the user from signing in to this one (a warning names it).
    config = load_for_server_or_exit(args.config, args.name)
    spec = _http_server(config, args.name)
    if isinstance(spec, int):
        return spec
    # Claude Code's variable for the secret of a pre-registered client; stored with the registration.
    secret = os.environ.get("MCP_CLIENT_SECRET") or None
    # The SDK logs its failures with their traceback ("OAuth flow error"); the one line below says what failed.
    logging.getLogger("mcp.client.auth").addHandler(logging.NullHandler())
    logging.getLogger("mcp.client.auth").propagate = False
    try:
        done = anyio.run(lambda: sign_in(spec, TokenStore(), print_url=args.no_browser, stdin=sys.stdin, client_secret=secret))
    except Exception as exc:
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        said = str(leaf) if isinstance(leaf, OAuthFlowError) else f"{type(leaf).__name__}: {leaf}"
        return fail(f"sign-in to {spec.name} failed: {said}", EXIT_FAILED)
    if done.scopes is None and done.expires_at is None and not done.refreshable:
        print(f"breakwater: {spec.name} did not ask for a sign-in ({done.tools} tools)", file=sys.stderr)
        return EXIT_OK
    until = "" if done.expires_at is None else f", expires {_when(done.expires_at)}"
    scopes = f" with scopes {done.scopes!r}" if done.scopes else ""
    print(f"breakwater: signed in to {spec.name}{scopes}{until}; {done.tools} tools", file=sys.stderr)
    return EXIT_OK


def _when(at: float) -> str:
    left = at - time.time()
    if left <= 0:
        return "now (expired)"
    return f"in {left / 60:.0f} min" if left < 7200 else f"in {left / 3600:.0f} h"


def auth_status(config: Config, store: TokenStore, *, now: float | None = None) -> list[dict[str, Any]]:
    """Per HTTP server: signed in or not, scopes, expiry, refreshable, scope still needed (never a token)."""
    now = time.time() if now is None else now
    records = store.records()
    rows: list[dict[str, Any]] = []
    for spec in config.servers:
        if spec.transport == "stdio":
            continue
        rec = records.get(record_key(spec)) or {}
        tokens = rec.get("tokens") or {}
        expires_at = rec.get("expires_at")
        refused = rec.get("refresh_refused_at") is not None  # the authorization server refused the refresh token
        grant = spec.oauth.grant_type if spec.oauth is not None else "authorization_code"
        rows.append(
            {
                "name": spec.name,
                "url": spec.describe()["url"],  # its address, without user-info, query or a key in its path
                "grant": grant,
                "signed_in": bool(tokens.get("access_token")) and not refused,
                "scopes": tokens.get("scope"),
                "expires_at": expires_at,
                "expired": expires_at is not None and expires_at <= now,
                "refreshable": bool(tokens.get("refresh_token")) and not refused,
                "refresh_refused": refused,
                # Scope a running gateway found missing (`insufficient_scope`); the next login asks for it.
                "needs_scope": rec.get("needed_scope"),
            }
        )
    return rows


def _status(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    store = TokenStore()
    rows = auth_status(config, store)
    # A sign-in the authorization server ended needs `auth login`: exit 1, as `status` for a server not ready.
    # So does a token file that cannot be read: every server in it reads as signed out.
    code = EXIT_NOT_READY if store.problem or any(row["refresh_refused"] for row in rows) else EXIT_OK
    if store.problem:
        why = store.problem.removeprefix(f"{store.path} ")
        fix = "the next `breakwater auth login` keeps it aside as .damaged and starts a new one"
        print(f"breakwater: the token file {why}: {store.path}; {fix}", file=sys.stderr)
    if args.json:
        print(json.dumps({"servers": rows, **({"token_file_problem": store.problem} if store.problem else {})}, indent=2))
        return code
    if not rows:  # an empty table said nothing of why
        print(f"no HTTP server in {config.path}: sign-in is for HTTP servers (a `url`)")
        return EXIT_OK
    table = Table(title="breakwater auth status", title_justify="left")
    for column in ("server", "signed in", "scopes", "expires", "refreshable"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        signed = "yes" if row["signed_in"] else ("client credentials" if row["grant"] == "client_credentials" else "no")
        if row["refresh_refused"]:
            signed = f"no: the sign-in ended; run `{login_command(row['name'])}`"
        elif row["needs_scope"] and row["signed_in"]:  # "yes" alone hid why the server is failed
            signed = f"yes, but it needs more scope ({row['needs_scope']}): run `{login_command(row['name'])}`"
        # A sign-in that ended has no expiry to show ("in 60 min" beside "no: the sign-in ended").
        expires = "" if row["expires_at"] is None or row["refresh_refused"] else _when(row["expires_at"])
        table.add_row(cell(row["name"]), signed, cell(row["scopes"] or ""), expires, "yes" if row["refreshable"] else "no")
    show(table)
    return code


def _logout(args: argparse.Namespace) -> int:
    config = load_for_server_or_exit(args.config, args.name)
    spec = _http_server(config, args.name, login=False)
    if isinstance(spec, int):
        return spec
    key = record_key(spec)
    # Entries at the same URL with the same grant share one sign-in: logging out of one logs out of them all.
    sharing = [s.name for s in config.servers if s.name != spec.name and s.transport != "stdio" and record_key(s) == key]
    also = f"; {', '.join(sharing)} too (the same URL: one sign-in)" if sharing else ""
    store = TokenStore()
    record = store.get(key) or {}
    revoked = Revocation(None)
    if record.get("tokens"):
        # A thread of its own: `main` may be called where an event loop already runs (a script's, a test's).
        with ThreadPoolExecutor(1) as pool:
            asked = _with_client(record, spec)
            revoked = pool.submit(lambda: anyio.run(revoke_sign_in, asked)).result()
    if revoked.problem is not None:
        # The local tokens go all the same: the user asked to sign out, and a server that is down must not keep them.
        print(
            f"breakwater: warning: could not revoke {spec.name}'s tokens at {revoked.endpoint}: {revoked.problem}; they "
            "are forgotten here, but stay valid at the authorization server until they expire",
            file=sys.stderr,
        )
    at = f"; revoked at {revoked.endpoint}" if revoked.revoked and revoked.problem is None else ""
    if not store.remove(key):
        print(f"breakwater: {spec.name} was not signed in", file=sys.stderr)
    elif spec.oauth is not None and spec.oauth.grant_type == "client_credentials":
        print(
            f"breakwater: forgot {spec.name}'s access token{at} (the next connect gets one with its client credentials)",
            file=sys.stderr,
        )
    else:
        print(f"breakwater: signed out of {spec.name} (tokens and client registration forgotten{at}){also}", file=sys.stderr)
    return EXIT_OK


def _with_client(record: dict[str, Any], spec: ServerSpec) -> dict[str, Any]:
    """`record`, with the entry's client credentials when it stored no registration (a client-credentials entry)."""
    oauth = spec.oauth
    if record.get("client") or oauth is None or not oauth.client_id:
        return record
    method = "client_secret_basic" if oauth.client_secret else "none"
    client = {"client_id": oauth.client_id, "client_secret": oauth.client_secret, "token_endpoint_auth_method": method}
    return {**record, "client": client}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="breakwater auth", description="OAuth sign-in for the config's remote HTTP servers.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{login,status,logout}")
    login = sub.add_parser("login", help="sign in to one server (opens the browser) and store its tokens")
    login.add_argument("name", metavar="NAME", help="the server's name in the config")
    login.add_argument(
        "--no-browser",
        action="store_true",
        help="print the authorization URL as the only line on stdout; wait for the redirect or a pasted redirect URL",
    )
    status = sub.add_parser("status", help="per HTTP server: signed in, scopes, expiry, refreshable")
    status.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    logout = sub.add_parser(
        "logout", help="revoke one server's tokens at its authorization server (if it offers that), then forget them"
    )
    logout.add_argument("name", metavar="NAME", help="the server's name in the config")
    for p in (login, status, logout):
        add_config_flag(p)
    return parser


def auth_main(argv: list[str]) -> int:
    """`breakwater auth`: login, status, logout."""
    args = _parser().parse_args(argv)
    command = {"login": _login, "status": _status, "logout": _logout}[args.command]
    return command(args)
