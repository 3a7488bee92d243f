"""Secrets from upstream configs never reach logs, status, journal or errors, in any form.

The rule: no substring of `MIN_FRAGMENT` (8) or more characters of any configured secret value
reaches any output breakwater writes. A secret is
* every `env` value and every header value, and the token after an auth scheme (`Bearer X` → `X`);
* the user-info and every query value of a URL (an upstream's, the journal's, the state store's);
* the value of a credential-looking argument: `--api-key X`, `--token=X`, `--password X`,
  `API_KEY=X`, `Authorization: Bearer X` (a name holding key, token, secret, password, passwd,
  pwd, auth or credential);
* the gateway's own `--token`.
An upstream that prints its token without the `Bearer ` prefix, or its key without the `sk-`
prefix, or a fragment of either, is still caught; secrets shorter than 8 characters are matched
whole (from 4). Not caught: a secret re-encoded (base64, hex) or split by other text.

Every text breakwater derives from an upstream (an error message, a stderr line, a URL) passes
through a `Redactor` that knows the config's secret values, URLs are shown without user-info and
query, and `install_log_redaction` scrubs every log record the process writes.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from breakwater.errors import CallError

__all__ = [
    "MIN_FRAGMENT",
    "REDACTED",
    "Redactor",
    "arg_secrets",
    "display_url",
    "header_secrets",
    "install_log_redaction",
    "is_credential_name",
    "redact_error",
    "register_secrets",
    "url_secrets",
]

REDACTED = "<redacted>"

#: Any run of this many characters of a secret is redacted wherever it appears.
MIN_FRAGMENT = 8
#: Shorter secrets are redacted whole, from this length (shorter values are flags like "1" or "true").
MIN_SECRET = 4

_CREDENTIAL_NAME = re.compile(r"(key|token|secret|passw|pwd|auth|credential|bearer|cookie|session)", re.IGNORECASE)
_FLAG = re.compile(r"^-{1,2}([A-Za-z0-9][\w.-]*)$")
_ASSIGNMENT = re.compile(r"^-{0,2}([A-Za-z_][\w.-]*)\s*[=:]\s*(.+)$", re.DOTALL)


def is_credential_name(name: str) -> bool:
    """Whether a flag or variable name says its value is a credential (`API_KEY`, `--token`, `GH_PAT` is not)."""
    return _CREDENTIAL_NAME.search(name) is not None


def header_secrets(value: str) -> Iterator[str]:
    """A header value, and the credential after its auth scheme (`Bearer X` → `X`)."""
    yield value
    scheme, _, rest = value.strip().partition(" ")
    if rest.strip() and scheme.isalpha():
        yield rest.strip()


def url_secrets(url: str) -> Iterator[str]:
    """The user-info (user and password) and every query value of a URL."""
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:
        return
    # The password; a user name alone only when it is the credential (https://TOKEN@host).
    if password or username:
        yield password or username or ""
    for _, value in parse_qsl(parts.query, keep_blank_values=False):
        yield value
    if parts.fragment:
        yield parts.fragment


def arg_secrets(args: Iterable[str]) -> Iterator[str]:
    """Values of credential-looking arguments: `--api-key X`, `--token=X`, `API_KEY=X`, `Authorization: Bearer X`."""
    expecting = False
    for arg in args:
        if expecting:
            expecting = False
            if not arg.startswith("-"):
                yield from header_secrets(arg)
                continue
        flag = _FLAG.match(arg)
        if flag is not None:
            expecting = bool(_CREDENTIAL_NAME.search(flag.group(1)))
            continue
        assigned = _ASSIGNMENT.match(arg)
        if assigned is not None and _CREDENTIAL_NAME.search(assigned.group(1)):
            yield from header_secrets(assigned.group(2).strip())
        if "://" in arg:
            yield from url_secrets(arg)


def _variants(secret: str) -> Iterator[str]:
    yield secret
    quoted = quote(secret, safe="")
    if quoted != secret:
        yield quoted


# The process's own secrets (the gateway's token), redacted by every Redactor and every log record.
_registered: set[str] = set()
_lock = threading.Lock()


def register_secrets(secrets: Iterable[str]) -> None:
    """Add secrets every `Redactor` of this process (and its log records) must also scrub."""
    with _lock:
        _registered.update(s for s in secrets if s and len(s) >= MIN_SECRET)


class Redactor:
    """Replaces every run of 8+ characters of a known secret (and every whole shorter secret) in text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._own = frozenset(v for s in secrets if s and len(s) >= MIN_SECRET for v in _variants(s))
        self._built_for: frozenset[str] | None = None
        self._grams: frozenset[str] = frozenset()
        self._whole: list[str] = []

    def _tables(self) -> tuple[frozenset[str], list[str]]:
        everything = self._own | frozenset(_registered)
        if everything != self._built_for:
            long = [s for s in everything if len(s) >= MIN_FRAGMENT]
            # A run that starts or ends in white space ("Bearer tok..." has " tok...") would swallow the
            # space before a secret in the text; the same characters are covered by their neighbours' runs.
            grams = (s[i : i + MIN_FRAGMENT] for s in long for i in range(len(s) - MIN_FRAGMENT + 1))
            self._grams = frozenset(g for g in grams if g == g.strip())
            # Longest first, so a secret that contains another is replaced whole.
            self._whole = sorted((s for s in everything if len(s) < MIN_FRAGMENT), key=len, reverse=True)
            self._built_for = everything
        return self._grams, self._whole

    def __call__(self, text: str) -> str:
        grams, whole = self._tables()
        if grams and len(text) >= MIN_FRAGMENT:
            text = _mask_fragments(text, grams)
        for secret in whole:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def scrub(self, value: Any) -> Any:
        """`value` with every string in it (recursively through dicts, lists and tuples) redacted."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.scrub(v) for v in value)
        return value


def _mask_fragments(text: str, grams: frozenset[str]) -> str:
    spans: list[list[int]] = []
    n = MIN_FRAGMENT
    for i in range(len(text) - n + 1):
        if text[i : i + n] in grams:
            if spans and i <= spans[-1][1]:
                spans[-1][1] = i + n
            else:
                spans.append([i, i + n])
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        out += [text[last:start], REDACTED]
        last = end
    out.append(text[last:])
    return "".join(out)


def redact_error(err: CallError, secrets: Iterable[str]) -> CallError:
    """`err` with its message and detail redacted (in place; returned for chaining)."""
    redact = Redactor(secrets)
    err.message = redact(err.message)
    err.detail = redact.scrub(dict(err.detail))
    # A ToolError carries the tool's own words (its content blocks): they reach the model too.
    content = getattr(err, "content", None)
    if isinstance(content, list):
        err.content = [  # type: ignore[attr-defined]
            block.model_copy(update={"text": redact(block.text)}) if isinstance(getattr(block, "text", None), str) else block
            for block in content
        ]
    structured = getattr(err, "upstream_structured_content", None)
    if structured is not None:
        err.upstream_structured_content = redact.scrub(structured)  # type: ignore[attr-defined]
    return err


def install_log_redaction(secrets: Iterable[str]) -> None:
    """Scrub `secrets` (and the registered ones) from every log record this process makes, tracebacks included."""
    register_secrets(secrets)
    factory = logging.getLogRecordFactory()
    if getattr(factory, "_breakwater_redacting", False):
        return
    redact = Redactor(())

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not format: leave it to the handler to report
            return record
        # Records without a secret are left as they were (handlers may group by msg and args).
        if (clean := redact(text)) != text:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            trace = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            if (clean := redact(trace)) != trace:
                record.exc_text = clean
        return record

    redacting_factory._breakwater_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting_factory)


def display_url(url: str) -> str:
    """A URL safe to show: no user-info, no query, no fragment."""
    import httpx2  # here: loading the config (every `serve` start) needs no HTTP client

    try:
        parsed = httpx2.URL(url)
    except Exception:
        return REDACTED
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"
