"""Revoking a sign-in at the authorization server (RFC 7009) before `breakwater auth logout` forgets it.

Forgetting the tokens here leaves them valid at the authorization server until they expire (a
refresh token often for months): whoever copied the token file keeps the access. When the stored
authorization-server metadata advertises a `revocation_endpoint`, the refresh token (which revokes
the grant at most servers) and the access token are revoked there first, within `REVOKE_TIMEOUT_S`
on the injected clock, with the client authentication the token endpoint gets. A failure is a
warning for the caller to print: the local tokens go regardless. No token or secret is ever part of
a message.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx2

from breakwater._clock import Clock, SystemClock
from breakwater.config._redact import display_url
from breakwater.errors import visible

__all__ = ["REVOKE_TIMEOUT_S", "Revocation", "revoke_sign_in"]

#: The most `auth logout` waits for the revocation endpoint, for every token together.
REVOKE_TIMEOUT_S = 5.0
#: The refresh token first: revoking it ends the grant (RFC 7009 §2.1), and the access token with it at most servers.
_KINDS = ("refresh_token", "access_token")


@dataclass(frozen=True)
class Revocation:
    """What a revocation did: the endpoint (None: the server advertises none), the kinds of token it revoked, and why
    it did not revoke the rest (None: all of them)."""

    endpoint: str | None
    revoked: tuple[str, ...] = ()
    problem: str | None = None


async def revoke_sign_in(record: dict[str, Any], *, clock: Clock | None = None, timeout_s: float | None = None) -> Revocation:
    """Revoke the tokens of one token-store record at its authorization server's `revocation_endpoint`, within
    `timeout_s` (`REVOKE_TIMEOUT_S`)."""
    clock = clock or SystemClock()
    timeout_s = REVOKE_TIMEOUT_S if timeout_s is None else timeout_s
    endpoint = (record.get("metadata") or {}).get("revocation_endpoint")
    tokens = record.get("tokens") or {}
    pending = [(kind, tokens[kind]) for kind in _KINDS if isinstance(tokens.get(kind), str) and tokens[kind]]
    if not isinstance(endpoint, str) or not endpoint or not pending:
        return Revocation(endpoint=None)
    shown = display_url(endpoint)
    client = record.get("client") or {}
    done: list[str] = []
    problem: str | None = None
    with clock.deadline_scope(clock.monotonic() + timeout_s) as scope:
        try:
            async with httpx2.AsyncClient(timeout=timeout_s) as http:
                for kind, token in pending:
                    data, headers = _client_auth({"token": token, "token_type_hint": kind}, client)
                    answer = await http.post(endpoint, data=data, headers=headers)
                    # RFC 7009 §2.2: 200 whether or not the token was still valid; 503 asks to try later.
                    if answer.status_code != 200:
                        problem = f"it answered HTTP {answer.status_code}{_error_code(answer)} for the {kind.replace('_', ' ')}"
                        break
                    done.append(kind)
        except httpx2.HTTPError as exc:
            problem = f"{type(exc).__name__}" + (" (nothing answers there)" if isinstance(exc, httpx2.ConnectError) else "")
        except Exception as exc:
            # An address no request can go to (`InvalidURL`; a port past 65535 fails inside the connection's task
            # group): the metadata's text, or a file edited by hand. The sign-out must still forget the tokens.
            problem = f"no request can go to that address ({type(exc).__name__})"
    if scope.cancelled_caught:
        problem = f"it did not answer within {timeout_s:g} s"
    return Revocation(endpoint=shown, revoked=tuple(done), problem=problem)


def _client_auth(data: dict[str, str], client: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The client's authentication, as the token endpoint gets it (the SDK's `prepare_token_auth`): its id always,
    its secret in HTTP Basic or in the form, as it registered."""
    headers: dict[str, str] = {}
    client_id, secret = client.get("client_id"), client.get("client_secret")
    if isinstance(client_id, str) and client_id:
        data = {**data, "client_id": client_id}
        method = client.get("token_endpoint_auth_method")
        if isinstance(secret, str) and secret and method == "client_secret_basic":
            pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif isinstance(secret, str) and secret and method in (None, "client_secret_post"):
            data["client_secret"] = secret
    return data, headers


def _error_code(answer: httpx2.Response) -> str:
    """`: invalid_client` from an OAuth error body; the server's description is left out (it may quote the request)."""
    try:
        body = answer.json()
    except ValueError:
        return ""
    code = body.get("error") if isinstance(body, dict) else None
    return f": {visible(code)[:60]}" if isinstance(code, str) and code else ""
