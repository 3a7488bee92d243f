"""Secrets from upstream configs never reach logs, status, journal or errors.

Every text breakwater derives from an upstream (an error message, a stderr line, a URL) passes
through a `Redactor` that knows the config's secret values, and URLs are shown without their
user-info and query string, where tokens like to hide.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx2

__all__ = ["REDACTED", "Redactor", "display_url"]

REDACTED = "<redacted>"


class Redactor:
    """Replaces known secret values in text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


def display_url(url: str) -> str:
    """A URL safe to show: no user-info, no query, no fragment."""
    try:
        parsed = httpx2.URL(url)
    except Exception:
        return REDACTED
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"
