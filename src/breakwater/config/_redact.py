"""Secrets from upstream configs never reach logs, status, journal or errors, in any form.

The rule: no substring of `MIN_FRAGMENT` (8) or more characters of any configured secret value
reaches any output breakwater writes. A secret is
* every `env` value but a filesystem path or a list of them (`PATH=/opt/homebrew/bin:/usr/bin`, a cwd: `env_secrets`),
  and every header value, and the token after an auth scheme (`Bearer X` → `X`);
* the user-info and every query value of a URL (an upstream's, the journal's, the state store's);
* the value of a credential-looking argument: `--api-key X`, `--token=X`, `--password X`,
  `API_KEY=X`, `Authorization: Bearer X` (a name holding key, token, secret, password, passwd,
  pwd, auth or credential), the password of curl's `-u user:X` (`--user`, `--proxy-user`), a bare
  `Bearer X`, and anything shaped as a known kind of key wherever it stands (`ghp_…`, `sk-ant-…`,
  `xoxb-…`, `AKIA…`: `_TOKEN_SHAPED`);
* inside one argument or word, wherever it stands: a credential-named key's value in JSON, YAML, header or query
  spelling (`{"api_key": "X"}`, `'token':'X'`, `X-Api-Key: X`, `…&password=X`), and the credential after an auth
  scheme when it is a whole quoted string (`"Bearer X"`) or looks like a key (`embedded_secrets`);
* the gateway's own `--token`.
An upstream that prints its token without the `Bearer ` prefix, or its key without the `sk-`
prefix, or a fragment of either, is still caught; secrets shorter than 8 characters are matched
whole (from 4). Not caught: a secret re-encoded (base64, hex) or split by other text; inside an argument, the value
of a name that only holds a credential's word (`author: X`, `tokenizer=X`), or after a scheme when it is neither
quoted whole nor key-like (`Bearer abcdefgh more`). Not a secret:
the `scheme://` and `host[:port]` of a secret that is a web URL (`_public`), whose other parts are.

Every text breakwater derives from an upstream (an error message, a stderr line, a URL) passes
through a `Redactor` that knows the config's secret values, URLs are shown without user-info and
query, and `install_log_redaction` scrubs every log record the process writes.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
import traceback
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from breakwater.errors import CallError

__all__ = [
    "MIN_FRAGMENT",
    "REDACTED",
    "SETTING_WORDS",
    "Redactor",
    "arg_secrets",
    "command_line_words",
    "display_url",
    "embedded_secrets",
    "env_secrets",
    "header_secrets",
    "install_log_redaction",
    "is_credential_name",
    "path_like",
    "redact_error",
    "register_secrets",
    "url_secrets",
]

REDACTED = "<redacted>"

#: Any run of this many characters of a secret is redacted wherever it appears.
MIN_FRAGMENT = 8
#: Shorter secrets are redacted whole, from this length (shorter values are flags like "1" or "no").
MIN_SECRET = 4
#: Values that name a setting and are never a credential, matched whole and case-blind: with the env of
#: countless configs (`DEBUG=true`, `LOG_LEVEL=info`, `NODE_ENV=production`) every "true", "info" and
#: "production" in every error and log line read `<redacted>`. Any other value of an env stays secret.
SETTING_WORDS = frozenset(
    {"true", "false", "yes", "no", "on", "off", "enabled", "disabled", "none", "null"}
    | {"trace", "debug", "info", "notice", "warn", "warning", "error", "critical", "fatal", "silent", "verbose", "quiet"}
    | {"production", "development", "staging", "test", "local", "prod", "dev"}
)


def _kept(value: str) -> bool:
    """Whether `value` is redacted at all: long enough to be a secret, and no setting's word."""
    return len(value) >= MIN_SECRET and value.strip().lower() not in SETTING_WORDS


_CREDENTIAL_NAME = re.compile(r"(key|token|secret|passw|pwd|auth|credential|bearer|cookie|session)", re.IGNORECASE)
#: Credentials that say what they are by their own shape, wherever they stand in an argument (a bare `ghp_...`,
#: `sh -c "... sk-ant-..."`): the published prefixes of GitHub, GitLab, OpenAI and Anthropic, Stripe, Slack, Hugging
#: Face, npm, PyPI, DigitalOcean, Shopify, AWS access key ids and Google API keys, with the key after them.
_TOKEN_SHAPED = re.compile(
    r"(?<![A-Za-z0-9])(?:gh[pousr]_|github_pat_|glpat-|sk-|[spr]k_(?:live|test)_|xox[abposr]-|hf_|npm_|pypi-|dop_v1_"
    r"|shp(?:at|ss|ca|pa)_|AKIA|AIza)[A-Za-z0-9_\-]{8,}"
)
#: An argument that is a whole `Authorization` value (`"Bearer X"`), with no flag or name before it.
_AUTH_VALUE = re.compile(r"^(?:Bearer|Basic|Token|Bot)\s+\S{4,}$", re.IGNORECASE)
_FLAG = re.compile(r"^-{1,2}([A-Za-z0-9][\w.-]*)$")
_ASSIGNMENT = re.compile(r"^-{0,2}([A-Za-z_][\w.-]*)\s*[=:]\s*(.+)$", re.DOTALL)


def is_credential_name(name: str) -> bool:
    """Whether a flag or variable name says its value is a credential (`API_KEY`, `--token`, `GH_PAT` is not)."""
    return _CREDENTIAL_NAME.search(name) is not None


#: One item of a path list: absolute, or from the home directory (`~/x`), or a Windows drive's; no whitespace-free run
#: of a key's alphabet alone would pass `path_like`'s other test.
_PATH_ITEM = re.compile(r"(?:~|[A-Za-z]:)?[\\/][^\s" + re.escape(os.pathsep) + r"]*")
#: Variable names that hold a place: their values are paths, not credentials.
_PATH_NAME = re.compile(r"(PATH|DIR|HOME|ROOT|FILE|FOLDER|PREFIX)$", re.IGNORECASE)


def path_like(value: str, name: str | None = None) -> bool:
    """Whether `value` is a filesystem path or a list of them (`os.pathsep`): a variable that names a place by its name
    (`PATH`, `NODE_PATH`, `DATA_DIR`), or one of whose items is there. Masked as secrets, every `/usr/bin` in every
    other server's error read `<redacted>` after one entry set the README's `PATH` (`/opt/homebrew/bin:/usr/bin:/bin`)."""
    items = [item for item in value.split(os.pathsep) if item]
    if not items or not all(_PATH_ITEM.fullmatch(item) for item in items):
        return False
    if name is not None and _PATH_NAME.search(name):
        return True
    return any(os.path.exists(os.path.expanduser(item)) for item in items)


def env_secrets(env: Mapping[str, str]) -> Iterator[str]:
    """An entry's `env` values that are secrets: all but paths, unless the name says credential (`path_like`)."""
    for name, value in env.items():
        if is_credential_name(name) or not path_like(value, name):
            yield value


def header_secrets(value: str) -> Iterator[str]:
    """A header value, and the credential after its auth scheme (`Bearer X` → `X`)."""
    yield value
    scheme, _, rest = value.strip().partition(" ")
    if rest.strip() and scheme.isalpha():
        yield rest.strip()


def url_secrets(url: str) -> Iterator[str]:
    """The user-info (user and password), every query value, the fragment, and each path segment that looks like a
    key (`_key_like`: Zapier's `/mcp/sk-ak-.../sse`, a UUID in Pipedream's or Composio's URLs) of a URL with a host."""
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:
        return
    # The password; a user name alone only when it is the credential (https://TOKEN@host). A database's user name is
    # no credential (`postgresql://postgres@host`: masked, it turned the scheme of every such URL into "<redacted>ql").
    if password:
        yield password
    elif username and parts.scheme.lower() in _WEB_SCHEMES:
        yield username
    for _, value in parse_qsl(parts.query, keep_blank_values=False):
        yield value
    if parts.fragment:
        yield parts.fragment
    # Only of a URL that names a host: a file's path (a journal at /tmp/pytest-3/test_a_journal0/j.db, sqlite:///...)
    # is where a file is, not a key, and masking its directory made `config check` print the path as "<redacted>".
    if parts.netloc:
        yield from (segment for segment in parts.path.split("/") if _key_like(segment))


def _key_like(segment: str) -> bool:
    """A path segment no person named: 16 or more characters, letters and digits among them."""
    return len(segment) >= 16 and any(c.isdigit() for c in segment) and any(c.isalpha() for c in segment)


def command_line_words(command: str) -> list[str]:
    """`command`'s words as a POSIX shell splits them (its whitespace-separated words if its quotes do not close)."""
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def arg_secrets(args: Iterable[str]) -> Iterator[str]:
    """Values of credential-looking arguments: `--api-key X`, `--token=X`, `API_KEY=X`, `Authorization: Bearer X`."""
    expecting = pair = False
    for arg in args:
        if expecting or pair:
            if not arg.startswith("-"):
                yield from _pair_secret(arg) if pair else header_secrets(arg)
                expecting = pair = False
                continue
            expecting = pair = False
        flag = _FLAG.match(arg)
        if flag is not None:
            expecting = bool(_CREDENTIAL_NAME.search(flag.group(1)))
            pair = flag.group(1) in _USER_PASSWORD_FLAGS
            continue
        user_flag = _ASSIGNMENT.match(arg)
        if user_flag is not None and arg.startswith("-") and user_flag.group(1) in _USER_PASSWORD_FLAGS:
            yield from _pair_secret(user_flag.group(2).strip())
        # `--header=Authorization: Bearer X` (mcp-remote's): an assignment whose value is itself a credential's.
        assigned = _ASSIGNMENT.match(arg)
        while assigned is not None:
            if _CREDENTIAL_NAME.search(assigned.group(1)):
                yield from header_secrets(assigned.group(2).strip())
                break
            assigned = _ASSIGNMENT.match(assigned.group(2).strip())
        if "://" in arg:
            yield from url_secrets(arg)
        if _AUTH_VALUE.match(arg.strip()):
            yield from header_secrets(arg.strip())
        yield from embedded_secrets(arg)
        yield from _TOKEN_SHAPED.findall(arg)


#: An auth scheme and the credential after it, anywhere in an argument: `{"Authorization": "Bearer X"}`,
#: `sh -c "curl -H 'X-Auth: Token X' ..."`. The scheme stands at a word's start (`(?<!...)`), the credential ends at
#: white space, a quote, a bracket or a separator.
_AUTH_IN_WORD = re.compile(
    r"(?<![A-Za-z0-9_\-])(?P<open>\\?[\"'`]?)(?:Bearer|Basic|Token|Bot)\s+(?P<value>[^\s\"'`,;(){}\[\]<>\\]{4,})",
    re.IGNORECASE,
)
#: A name and its value anywhere in an argument, in the spellings of JSON and YAML (`"api_key": "X"`, `'token':'X'`,
#: `token: X`), of a header (`X-Api-Key: X`) and of a query or an assignment (`...&password=X`). Only a name that is a
#: credential's (`_credential_key`) makes its value one.
_KEYED_IN_WORD = re.compile(
    r"(?<![\w.-])(?P<q>\\?[\"']?)(?P<name>[A-Za-z_][\w.-]*)(?P=q)\s*[:=]\s*"
    r"(?:(?P<vq>\\?[\"'])(?P<quoted>.*?)(?P=vq)"
    r"|(?P<bare>(?:(?:Bearer|Basic|Token|Bot)\s+)?[^\s\"'`,;&(){}\[\]<>\\]+))",
    re.IGNORECASE | re.DOTALL,
)
#: The words of a name (`X-Api-Key`, `apiKey`, `GITHUB_TOKEN`, `client.secret`).
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: The words of a name that say its value is a credential, inside an argument: a word that is one (`KEY`, `Session`), or
#: a word run together that ends in one (`apikey`, `accesstoken`, `oauth`). The name must say so this plainly there:
#: `author: X`, `tokenizer=X`, `hotkey: X`, `monkeys: X` and `obsession: X` name no credential (`_CREDENTIAL_NAME`, for
#: a whole argument's own name, takes any name that holds one of its stems).
_CREDENTIAL_WORDS = frozenset(
    {"key", "keys", "token", "secret", "secrets", "password", "passwords", "passwd", "pwd", "passphrase", "credential"}
    | {"credentials", "creds", "cookie", "cookies", "auth", "authorization", "bearer", "session", "sessionid", "jwt"}
)
_CREDENTIAL_ENDINGS: tuple[str, ...] = ("token", "secret", "password", "passwd", "pwd", "apikey", "accesskey", "secretkey")
_CREDENTIAL_ENDINGS += ("privatekey", "authkey", "oauth", "cookie", "credentials")


def _credential_key(name: str) -> bool:
    """Whether a name inside an argument says its value is a credential (`api_key`, `X-Api-Key`, `accessToken`,
    `GITHUB_TOKEN`, `Authorization`, `apikey`): one of its words is in `_CREDENTIAL_WORDS` or ends as one of
    `_CREDENTIAL_ENDINGS`."""
    for part in re.split(r"[-_.]+", name):
        for word in _NAME_WORDS.findall(part) or [part]:
            low = word.lower()
            if low in _CREDENTIAL_WORDS or low.endswith(_CREDENTIAL_ENDINGS):
                return True
    return False


def _credential_like(value: str) -> bool:
    """Whether a value after an auth scheme, with more text after it, looks like a key rather than a word of prose
    ("Bearer tokens are supported"): 8 or more characters holding a digit or a capital after a small letter."""
    return len(value) >= MIN_FRAGMENT and (any(c.isdigit() for c in value) or re.search(r"[a-z][A-Z]", value) is not None)


def embedded_secrets(word: str) -> Iterator[str]:
    """Credentials written inside one argument or word of a command line, wherever they stand in it.

    A credential-named key's value in JSON, YAML, header or query spelling (`{"api_key": "X"}`, `'token':'X'`,
    `X-Api-Key: X`, `a=1&password=X`; the token after its auth scheme too), and the credential after an auth scheme:
    a whole quoted string (`"Bearer X"`, `'Token X'`), or one that looks like a key (`_credential_like`) anywhere
    (`... -H "X-Custom: Bearer X" ...`). `echo '{"Authorization": "Bearer X"}'` and mcp-remote's
    `--headers '{"Authorization": "Bearer X"}'` were shown whole.
    """
    for found in _KEYED_IN_WORD.finditer(word):
        if not _credential_key(found.group("name")):
            continue
        value = found.group("quoted") if found.group("vq") is not None else found.group("bare")
        if value and value.strip():
            yield from header_secrets(value.strip())
    for found in _AUTH_IN_WORD.finditer(word):
        value, opened, end = found.group("value"), found.group("open"), found.end()
        # A quoted string that is the scheme and its credential alone, as a header's value is written in JSON.
        whole = bool(opened) and word[end : end + len(opened)] == opened
        if whole or _credential_like(value):
            yield value


#: Flags whose value is `user:password` (curl's `-u`/`--user` and `-U`/`--proxy-user`, wget's `--user`): a failing
#: headersHelper `curl -sf -u deploy:PASSWORD ...` was quoted whole in its error, on the status page.
_USER_PASSWORD_FLAGS = frozenset({"u", "user", "U", "proxy-user"})


def _pair_secret(value: str) -> Iterator[str]:
    """The password of a `user:password` value; else the user part, which an API's key often is (`-u sk_live_...:`)."""
    user, _, password = value.partition(":")
    if password or user:
        yield password or user


#: The schemes of URLs whose user name alone may be a token (`https://TOKEN@host`).
_WEB_SCHEMES = frozenset({"http", "https", "ws", "wss"})

#: The schemes whose URLs name a place: `scheme://host[:port]` says where, not what (see `_public`).
_ADDRESS_SCHEMES = ("http://", "https://", "ws://", "wss://")


def _public(secret: str) -> tuple[bool, ...]:
    """Which characters of `secret` are no secret: a web URL's `scheme://` and `host[:port]`; none of any other value.

    An env value is a secret whatever it holds, and many hold an address (`JIRA_URL=https://me.atlassian.net`).
    Every 8-character run of it was masked, so every `https://` in every text the model read was too, a
    page the user must open included ("open <redacted>cal.example/auth?s=1"). The address is shown wherever
    breakwater shows a URL (`display_url`); its user-info, path (a webhook's is the credential), query and
    fragment stay secret, and a run that holds one character of them is masked.
    """
    scheme_end = next((len(p) for p in _ADDRESS_SCHEMES if secret[: len(p)].lower() == p), 0)
    if not scheme_end:
        return (False,) * len(secret)
    end = scheme_end
    while end < len(secret) and secret[end] not in "/?#":
        end += 1
    host_start = max(scheme_end, secret.rfind("@", scheme_end, end) + 1)  # user-info, before the last @, is secret
    return tuple(i < scheme_end or host_start <= i < end for i in range(len(secret)))


def _variants(secret: str) -> Iterator[tuple[str, tuple[bool, ...]]]:
    """`secret` and its percent-encoded form, each with which of its characters are public (`_public`)."""
    public = _public(secret)
    yield secret, public
    pieces = [quote(char, safe="") for char in secret]  # one char's encoding is its part of the whole's
    quoted = "".join(pieces)
    if quoted != secret:
        yield quoted, tuple(flag for piece, flag in zip(pieces, public, strict=True) for _ in piece)


# The process's own secrets (the gateway's token), redacted by every Redactor and every log record.
_registered: set[str] = set()
_lock = threading.Lock()


def register_secrets(secrets: Iterable[str]) -> None:
    """Add secrets every `Redactor` of this process (and its log records) must also scrub."""
    with _lock:
        _registered.update(s for s in secrets if _kept(s))


class Redactor:
    """Replaces every run of 8+ characters of a known secret (and every whole shorter secret) in text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._own = frozenset(s for s in secrets if _kept(s))
        self._built_for: frozenset[str] | None = None
        #: Each masked run, with the part of it that is masked: (first, end) within the run (`_public`'s characters are not).
        self._grams: dict[str, tuple[int, int]] = {}
        self._whole: list[str] = []

    def _tables(self) -> tuple[dict[str, tuple[int, int]], list[str]]:
        everything = self._own | _registered
        if everything != self._built_for:
            self._grams, self._whole = _tables_for(everything)
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


#: Tables built, by the secrets they were built for. Every Redactor of a config holds the registered secrets, so one
#: table serves all of them: built per Redactor, `config check` of 1,000 servers with a secret each took over 30 s.
_built: dict[frozenset[str], tuple[dict[str, tuple[int, int]], list[str]]] = {}
_BUILT_MAX = 16


def _tables_for(secrets: frozenset[str]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Each masked run of `secrets` with the part of it to mask, and the whole short secrets, longest first."""
    with _lock:
        if (found := _built.get(secrets)) is not None:
            return found
    grams: dict[str, tuple[int, int]] = {}
    whole: set[str] = set()
    for secret in secrets:
        for text, public in _variants(secret):
            if len(text) < MIN_FRAGMENT:
                whole.add(text)
                continue
            for i in range(len(text) - MIN_FRAGMENT + 1):
                gram = text[i : i + MIN_FRAGMENT]
                # A run that starts or ends in white space ("Bearer tok..." has " tok...") would swallow the
                # space before a secret in the text; the same characters are covered by their neighbours' runs.
                secret_at = [k for k, flag in enumerate(public[i : i + MIN_FRAGMENT]) if not flag]
                if gram != gram.strip() or not secret_at:
                    continue
                first, end = grams.get(gram, (MIN_FRAGMENT, 0))  # the same run of two secrets: the wider mask
                grams[gram] = (min(first, secret_at[0]), max(end, secret_at[-1] + 1))
    # Longest first, so a secret that contains another is replaced whole.
    tables = (grams, sorted(whole, key=len, reverse=True))
    with _lock:
        if len(_built) >= _BUILT_MAX:
            _built.clear()
        _built[secrets] = tables
    return tables


def _mask_fragments(text: str, grams: Mapping[str, tuple[int, int]]) -> str:
    n = MIN_FRAGMENT
    spans: list[tuple[int, int]] = []
    for i in range(len(text) - n + 1):
        where = grams.get(text[i : i + n])
        if where is not None:
            spans.append((i + where[0], i + where[1]))
    if not spans:
        return text
    spans.sort()
    merged = [list(spans[0])]
    for start, end in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, last = [], 0
    for start, end in merged:
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
