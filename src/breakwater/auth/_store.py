"""The token store: one JSON file, only the user can read it, keyed by server URL (and client, see `record_key`).

`oauth-tokens.json` in the user's config directory (`_paths.config_dir()`), mode 0600 in a 0700
directory. Per record it holds the tokens (with the absolute time they expire, which the
SDK's relative `expires_in` loses across restarts), the client registration (dynamic, metadata
document or pre-registered, with its secret), and the discovered authorization-server and
protected-resource metadata, so a gateway started later can refresh without discovering again.

Several processes use it at once (a gateway refreshing, `breakwater auth login` signing in): every
change is a read-modify-write under a lock file, written to a temporary file and renamed over the
old one, so a reader never sees half a file. Every token and secret read from it or written to it
is registered with the redaction rule (`config/_redact.py`) before anything can print it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken, ProtectedResourceMetadata

from breakwater import _platform
from breakwater._clock import Clock, SystemClock
from breakwater._paths import config_dir
from breakwater.config import ServerSpec
from breakwater.config._redact import register_secrets

__all__ = ["TOKEN_FILE_NAME", "ServerTokens", "TokenStore", "record_key"]

log = logging.getLogger("breakwater.auth")

TOKEN_FILE_NAME = "oauth-tokens.json"
_LOCK_TIMEOUT_S = 10.0

Record = dict[str, Any]


def record_key(spec: ServerSpec) -> str:
    """Where an entry's tokens live in the store: its URL for a person's sign-in, its URL and client for a machine's.

    Keyed by URL alone, a client-credentials entry sharing its URL with a person's entry called with
    that person's tokens (and `auth logout` of one signed the other out). A person's sign-in stays
    under the bare URL, so the token files written before keep working; client credentials get a key
    of their own (a space cannot occur in a URL), and only lose a cached access token they can fetch again.
    """
    url = spec.url or ""
    oauth = spec.oauth
    if oauth is not None and oauth.grant_type == "client_credentials":
        return f"{url} client_credentials {oauth.client_id or ''}"
    return url


def _register(record: Record) -> None:
    tokens = record.get("tokens") or {}
    client = record.get("client") or {}
    register_secrets(v for v in (tokens.get("access_token"), tokens.get("refresh_token"), client.get("client_secret")) if v)


class TokenStore:
    """The file of every server's tokens (`path`, by default `oauth-tokens.json` in the config directory)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else config_dir() / TOKEN_FILE_NAME
        self._lock = FileLock(str(self.path) + ".lock", timeout=_LOCK_TIMEOUT_S)
        #: Why the file could not be read at the last look (damaged, unreadable), else None.
        self.problem: str | None = None

    def records(self) -> dict[str, Record]:
        """Every server's record, by `record_key` ({} when there is no file yet, or it cannot be read: see `problem`)."""
        self.problem = None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            self.problem = f"{self.path} is damaged (invalid JSON at line {exc.lineno}, column {exc.colno})"
            return {}
        except (OSError, ValueError) as exc:
            self.problem = f"{self.path} cannot be read ({exc})"
            return {}
        servers = data.get("servers") if isinstance(data, dict) else None
        if not isinstance(servers, dict):
            self.problem = f'{self.path} is damaged (no "servers" object)'
            return {}
        out = {url: rec for url, rec in servers.items() if isinstance(rec, dict)}
        for rec in out.values():
            _register(rec)
        self._keep_private()
        return out

    def _keep_private(self) -> None:
        """Make the file the user's alone again when it is not (a `chmod 644` by hand, a copy from a backup): it stayed
        readable by every user of the machine until the next sign-in rewrote it."""
        if not hasattr(os, "getuid"):
            return
        with contextlib.suppress(OSError):
            info = self.path.stat()
            if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
                self.path.chmod(0o600)
                log.warning("%s was readable by others (mode %o): made 0600", self.path, stat.S_IMODE(info.st_mode))

    def get(self, url: str) -> Record | None:
        """One server's record, or None."""
        return self.records().get(url)

    def update(self, url: str, change: Callable[[Record], Record | None]) -> Record | None:
        """Apply `change` to the server's record ({} if none) under the lock; a None result removes it."""
        with self._locked():
            records = self.records()
            if self.problem is not None:
                self._set_aside()
            new = change(dict(records.get(url) or {}))
            if new is None:
                records.pop(url, None)
            else:
                _register(new)
                records[url] = new
            self._write(records)
            return new

    def remove(self, url: str) -> bool:
        """Forget a server (tokens and client registration); False when there was nothing to forget."""
        existed = self.get(url) is not None
        if existed:
            self.update(url, lambda _: None)
        return existed

    def _set_aside(self) -> None:
        """Keep a file that cannot be read beside the new one, rather than write over the other servers' sign-ins."""
        aside = self.path.with_name(f"{self.path.name}.damaged")
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)
            log.warning("%s; kept as %s, and a new one started (sign in again to the other servers)", self.problem, aside)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        _private_dir(self.path.parent)
        with self._lock:
            yield

    def _write(self, records: dict[str, Record]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": 1, "servers": records}, f, indent=2, sort_keys=True)
        os.replace(tmp, self.path)


def _private_dir(path: Path) -> None:
    """Create the directory only the user may enter (0700); tighten one that is looser."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if _platform.FILE_MODES and path.stat().st_mode & 0o077:
        with contextlib.suppress(OSError):  # not ours (a shared parent): the file's own 0600 still holds
            path.chmod(0o700)


class ServerTokens:
    """One server's slice of the store, as the SDK's `TokenStorage` and a bit more.

    `set_tokens` turns the relative `expires_in` into an absolute `expires_at` on `clock`, so
    `expires_at()` still means something after a restart.
    """

    def __init__(
        self, store: TokenStore, url: str, *, name: str = "", clock: Clock | None = None, key: str | None = None
    ) -> None:
        self.store = store
        self.url = url
        #: The record's key in the store (`record_key`; the URL when not given).
        self.key = key or url
        self.name = name
        self._clock = clock or SystemClock()

    @classmethod
    def for_server(cls, store: TokenStore, spec: ServerSpec, *, clock: Clock | None = None) -> ServerTokens:
        """The slice of `store` that belongs to the entry `spec` (`record_key`)."""
        return cls(store, spec.url or "", name=spec.name, clock=clock, key=record_key(spec))

    def record(self) -> Record:
        """This server's record ({} when it has none)."""
        return self.store.get(self.key) or {}

    def _set(self, **values: Any) -> None:
        def change(rec: Record) -> Record:
            rec.update(values)
            if self.name:
                rec["server"] = self.name
            return rec

        self.store.update(self.key, change)

    # ---- the SDK's TokenStorage ------------------------------------------------------------

    async def get_tokens(self, record: Record | None = None) -> OAuthToken | None:
        """The stored tokens, or None (from `record` when the caller has just read it)."""
        raw = (self.record() if record is None else record).get("tokens")
        return OAuthToken.model_validate(raw) if raw else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Store new tokens, with when they expire on this clock."""
        expires_at = None if tokens.expires_in is None else self._clock.time() + int(tokens.expires_in)
        needed = self.needed_scope()
        covered = needed is None or set(needed.split()) <= set((tokens.scope or "").split())
        self._set(
            tokens=tokens.model_dump(mode="json", exclude_none=True),
            expires_at=expires_at,
            updated_at=self._clock.time(),
            needed_scope=None if covered else needed,
            refresh_refused_at=None,
        )

    async def get_client_info(self, record: Record | None = None) -> OAuthClientInformationFull | None:
        """The stored client registration, or None."""
        raw = (self.record() if record is None else record).get("client")
        return OAuthClientInformationFull.model_validate(raw) if raw else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Store the client registration (its secret included: the file is the user's alone)."""
        self._set(client=client_info.model_dump(mode="json", exclude_none=True))

    # ---- what breakwater keeps besides ----------------------------------------------------

    def expires_at(self, record: Record | None = None) -> float | None:
        """When the stored access token expires (clock time), None if it did not say."""
        value = (self.record() if record is None else record).get("expires_at")
        return float(value) if isinstance(value, int | float) else None

    def metadata(self, record: Record | None = None) -> tuple[OAuthMetadata | None, ProtectedResourceMetadata | None]:
        """The authorization-server and protected-resource metadata found at sign-in."""
        rec = self.record() if record is None else record
        asm = rec.get("metadata")
        prm = rec.get("resource_metadata")
        return (
            OAuthMetadata.model_validate(asm) if asm else None,
            ProtectedResourceMetadata.model_validate(prm) if prm else None,
        )

    def set_metadata(self, asm: OAuthMetadata | None, prm: ProtectedResourceMetadata | None) -> None:
        """Remember discovery's results for the refreshes a later process makes."""
        self._set(
            metadata=None if asm is None else asm.model_dump(mode="json", exclude_none=True),
            resource_metadata=None if prm is None else prm.model_dump(mode="json", exclude_none=True),
        )

    def needed_scope(self, record: Record | None = None) -> str | None:
        """Scopes a server asked for beyond the granted ones (`insufficient_scope`), for the next sign-in."""
        value = (self.record() if record is None else record).get("needed_scope")
        return value if isinstance(value, str) and value else None

    def set_needed_scope(self, scope: str) -> None:
        """Remember the scope a step-up needs; the next `auth login` asks for it."""
        self._set(needed_scope=scope)

    def set_refresh_refused(self) -> None:
        """The authorization server refused the refresh token (revoked, expired): only a new sign-in helps. `auth
        status` said "signed in, refreshable" after it, while every server status said to sign in again."""
        self._set(refresh_refused_at=self._clock.time())

    def forget_tokens(self) -> None:
        """Drop the tokens, keep the client registration (a fresh sign-in reuses it)."""

        def change(rec: Record) -> Record | None:
            for key in ("tokens", "expires_at", "updated_at"):
                rec.pop(key, None)
            return rec or None

        self.store.update(self.key, change)
