"""OAuth for remote HTTP servers: the token store, the SDK's OAuth client wired to it, and sign-in.

`TokenStore` (`_store.py`) is the one file of tokens; `build_provider` (`_provider.py`) makes the
`httpx2.Auth` an HTTP connect uses (stored tokens, refresh, `auth_required` with the command to
run, never a browser); `sign_in` (`_login.py`) is `breakwater auth login`: the authorization-code
flow with PKCE and a loopback callback. At the connect layer: may import the core leaves and
`config` only (`connect/_transports.py` imports this package).
"""

from __future__ import annotations

from breakwater.auth._flow import AuthNote, AuthRequiredNote, login_command
from breakwater.auth._provider import LoginHandlers, build_provider, redirect_uri
from breakwater.auth._store import ServerTokens, TokenStore

__all__ = [
    "AuthNote",
    "AuthRequiredNote",
    "LoginHandlers",
    "ServerTokens",
    "TokenStore",
    "build_provider",
    "login_command",
    "redirect_uri",
]
