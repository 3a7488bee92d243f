"""Value checks for what a config names: server names, URLs, command text, headers and tokens.

Each check raises a `ConfigError` that names the key, the offending value and the fix, so a
config that could only fail later (at spawn, at connect, at the first request) is refused when
it is loaded, and `config check`, `status` and `serve` refuse it alike. May import the core
leaves only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import string
import unicodedata
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from breakwater.errors import ConfigError, invisible, visible

__all__ = [
    "DEFAULT_TOOL_NAME_MAX",
    "HASH_TAIL",
    "LOOPBACK_HOSTS",
    "MAX_TOOL_NAME",
    "MIN_TOKEN_CHARS",
    "OFF_WORDS",
    "TOOL_NAME_OK",
    "alike_servers",
    "check_header",
    "check_journal_url",
    "check_listener_token",
    "check_server_name",
    "check_template_for_servers",
    "check_text",
    "check_tool_name_template",
    "check_url",
    "claim",
    "distinct_name",
    "downstream_names",
    "name_affixes",
    "namespaced",
    "namespaced_pattern",
    "route_by_shape",
]

# The spec's tool names (2025-11-25 onwards) are 1-128 characters of A-Z a-z 0-9 _ - . but the model APIs behind
# every client take no "." (Anthropic's `^[a-zA-Z0-9_-]{1,128}$`, OpenAI's likewise), and refuse the whole request,
# every tool of the agent's, for one such name (github/copilot-cli#1879): a "." becomes "_" too.
#: What a downstream tool name may not hold (each such character becomes "_").
TOOL_NAME_OK = re.compile(r"[^A-Za-z0-9_\-]")
MAX_TOOL_NAME = 128
#: The longest downstream tool name by default: the most the Anthropic and OpenAI APIs accept for a
#: tool the model sees (both refuse the whole request when one name is longer), below the spec's 128.
DEFAULT_TOOL_NAME_MAX = 64
#: A cut name ends in "-" and this many characters less one of a hash of the whole name.
HASH_TAIL = 11


def namespaced(template: str, server: str, tool: str, limit: int = MAX_TOOL_NAME) -> str:
    """The downstream name of `tool` on `server`, within the spec's tool-name rules and at most `limit` characters.

    Here, SDK-free, so that a session attached to the shared gateway can name tools without the catalog.
    """
    name = TOOL_NAME_OK.sub("_", template.format(server=server, tool=tool))
    if len(name) > limit:
        # Keep names unique and stable when they must be cut: the tail becomes a hash of the whole.
        digest = hashlib.sha256(name.encode()).hexdigest()[: HASH_TAIL - 1]
        name = f"{name[: limit - HASH_TAIL]}-{digest}"
    return name


def namespaced_pattern(template: str, server: str, pattern: str, limit: int = MAX_TOOL_NAME) -> str:
    """`namespaced` for a name an agent's pattern may write with `*` (a permission rule, a tool switch): each `*`
    stays one; a name without one is the tool's exact downstream name, cut as the gateway cuts it."""
    if "*" not in pattern:
        return namespaced(template, server, pattern, limit)
    return "*".join(TOOL_NAME_OK.sub("_", part) for part in template.format(server=server, tool=pattern).split("*"))


def distinct_name(name: str, server: str, tool: str, limit: int = MAX_TOOL_NAME) -> str:
    """A name for `tool` on `server` when `name`, its namespaced one, is another tool's already.

    Two servers "a b" and "a_b", or "a" with a tool "b__add" beside "a__b" with "add", name a tool
    alike; the one with the weaker `claim` gets a name of its own (its tail a hash of its server and
    tool) instead of being left out of the list unsaid.
    """
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[: HASH_TAIL - 1]
    return f"{name[: limit - HASH_TAIL]}-{digest}"


def name_affixes(template: str, server: str) -> tuple[str, str]:
    """What `namespaced` puts before and after a tool's own name for `server` (characters outside the rules made "_")."""
    prefix, _, suffix = template.format(server=server, tool="\0").partition("\0")
    return TOOL_NAME_OK.sub("_", prefix), TOOL_NAME_OK.sub("_", suffix)


def claim(template: str, server: str) -> tuple[int, bool]:
    """How strongly `server` claims a downstream name its affixes fit; the larger claim owns the name.

    The most specific server first ("a__b__x" is a__b's "x", not a's "b__x"), then the one whose name
    needs no character replaced ("a_b__x" is a_b's, not "a b"'s); between equals, the first in config.
    The catalog names tools by it and `route_by_shape` routes by it, so a name means one tool whether
    or not the servers' lists are known yet.
    """
    prefix, suffix = name_affixes(template, server)
    return len(prefix) + len(suffix), TOOL_NAME_OK.search(server) is None


def downstream_names(
    template: str, pairs: Sequence[tuple[str, str]], limit: int = MAX_TOOL_NAME, reserved: frozenset[str] = frozenset()
) -> list[str]:
    """The downstream name of each `(server, name)`: `namespaced`, unless the name is `reserved` (breakwater's own
    tools) or another pair comes out alike and has the stronger `claim`, then a `distinct_name`. Between equal claims,
    a tool whose own name needs no character replaced wins ("get_item" over "get.item": which one a name called
    hung on the order the server listed them in), then the one listed first. A pair listed twice is named alike."""
    plain = [namespaced(template, server, name, limit) for server, name in pairs]
    strength = {server: claim(template, server) for server, _name in pairs}
    first: dict[tuple[str, str], int] = {}
    keys = [(strength[pair[0]], TOOL_NAME_OK.search(pair[1]) is None, -first.setdefault(pair, i)) for i, pair in enumerate(pairs)]
    owner: dict[str, tuple[tuple[int, bool], bool, int]] = {}
    for name, key in zip(plain, keys, strict=True):
        owner[name] = max(owner.get(name, key), key)
    return [
        name if owner[name] == key and name not in reserved else distinct_name(name, server, own, limit)
        for name, key, (server, own) in zip(plain, keys, pairs, strict=True)
    ]


def route_by_shape(template: str, servers: Iterable[str], name: str) -> tuple[str, str] | None:
    """The (server, tool) a downstream `name` has the shape of, for a server whose list is not known yet.

    The strongest `claim` wins. Compared in namespaced form, so a server named "My Server" still owns
    "My_Server__ping" while it connects, and the caller hears "connecting", not "no such tool". A
    template without affixes ("{tool}") says nothing.
    """
    best: tuple[tuple[int, bool], str, str] | None = None
    for server in servers:
        prefix, suffix = name_affixes(template, server)
        fixed = len(prefix) + len(suffix)
        if not (fixed and len(name) > fixed and name.startswith(prefix) and name.endswith(suffix)):
            continue
        strength = claim(template, server)
        if best is None or strength > best[0]:
            best = (strength, server, name[len(prefix) : len(name) - len(suffix)])
    return None if best is None else (best[1], best[2])


def alike_servers(template: str, servers: Iterable[str]) -> list[str]:
    """Notes for servers whose tools `template` names alike ("a b" and "a_b", or "日本" and "中国": both "__").

    Their tools are still listed (`distinct_name`), but a person reads the one set of names as one server's.
    """
    by_affixes: dict[tuple[str, str], list[str]] = {}
    servers_list = list(servers)
    for server in servers_list:
        by_affixes.setdefault(name_affixes(template, server), []).append(server)
    by_look: dict[str, list[str]] = {}
    for server in servers_list:
        by_look.setdefault(unicodedata.normalize("NFKC", server).casefold(), []).append(server)
    return [
        f"servers {', '.join(map(repr, names))} name their tools alike ({prefix}…{suffix}): a clashing tool of all"
        " but one is listed under its name and a hash; rename the servers to tell them apart"
        for (prefix, suffix), names in by_affixes.items()
        if len(names) > 1 and (prefix or suffix)
    ] + [
        f"servers {', '.join(map(ascii, names))} look the same (they differ only in case or in how a character is"
        " encoded): rename one to tell them apart"
        for names in by_look.values()
        if len(names) > 1
    ]


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

#: Shortest bearer token accepted on a listener other machines can reach: 16 characters of a
#: random token are ~96 bits, out of reach of guessing over the network.
MIN_TOKEN_CHARS = 16

# RFC 9110 token characters, what a header name may use.
_HEADER_NAME_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def check_text(
    value: str, *, path: str | None, key: str, what: str = "value", strict: bool = False, secret: bool = False
) -> None:
    """Refuse text a process cannot be given: a NUL anywhere; with `strict`, any control or invisible character.

    Argument and environment values may hold line breaks (a PEM key); a command or a path may not.
    """
    bad = next((c for c in value if (invisible(c) if strict else c == "\x00")), None)
    if bad is not None:
        shown = "" if secret else f" {value!r}"
        raise ConfigError(
            f"the {what}{shown} contains the invisible character U+{ord(bad):04X}",
            path=path,
            key=key,
            fix="remove it",
        )


def check_server_name(name: str, *, path: str | None, key: str) -> None:
    """A server name is shown and prefixes tool names: not empty, no surrounding spaces, nothing invisible."""
    if not name.strip():
        raise ConfigError(f"empty server name {name!r}", path=path, key=key, fix='name the server, e.g. "github"')
    if name != name.strip():
        raise ConfigError(f"server name {name!r} starts or ends with a space", path=path, key=key, fix="remove the spaces")
    if any(invisible(c) for c in name):
        bad = next(c for c in name if invisible(c))
        raise ConfigError(
            f"server name '{visible(name)}' contains the invisible or bidirectional character U+{ord(bad):04X}",
            path=path,
            key=key,
            fix="use letters, digits, - and _",
        )


def _shown(url: str) -> str:
    """The URL as an error may quote it: its scheme, host and port. User-info (up to the last @, as `urlsplit` reads
    it), path (a webhook's is its credential), query and fragment are where tokens hide, and an error is written
    before the config's secrets are known to the redactor."""
    scheme, slashes, rest = url.partition("//")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = "<redacted>@" + authority.rpartition("@")[2]
    return repr(scheme + slashes + authority + ("<redacted>" if tail.strip("/") else tail))


def check_url(url: str, *, path: str | None, key: str) -> None:
    """An upstream URL: http(s), a host, a port in 1-65535, no spaces or control characters."""
    fix = 'write a full URL, e.g. "http://127.0.0.1:8000/mcp"'
    shown = _shown(url)
    if any(c.isspace() or invisible(c) for c in url):
        raise ConfigError(f"the URL {shown} contains a space or control character", path=path, key=key, fix=fix)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"invalid URL {shown}: {exc}", path=path, key=key, fix=fix) from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"an HTTP server needs an http(s) URL, got {shown}", path=path, key=key, fix=fix)
    if not parts.hostname:
        raise ConfigError(f"the URL {shown} has no host", path=path, key=key, fix=fix)
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"the URL {shown} has port {port}, outside 1-65535", path=path, key=key, fix=fix)
    if (wrong := _wrong_host(parts.hostname)) is not None:
        raise ConfigError(f"the URL {shown} has {wrong}", path=path, key=key, fix=fix)


_IPV4_STYLE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$")


def _wrong_host(host: str) -> str | None:
    """What httpx2, which sends the requests, would refuse in a URL's host (its `_urlparse.encode_host`), else None.

    Checked here so that such a URL is a config error, not a connect that fails (and is retried) for ever.
    """
    if _IPV4_STYLE.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"the host {host!r}, which is no IPv4 address (each of its four numbers is 0-255)"
    elif ":" in host:  # an IPv6 literal, out of its brackets (`urlsplit`'s hostname)
        address, percent, zone = host.partition("%")
        try:
            ipaddress.IPv6Address(address + percent + (zone.removeprefix("25") if len(zone) > 2 else zone))
        except ValueError:
            return "a host in brackets that is no IPv6 address"
    elif not host.isascii():
        import idna  # httpx2's own dependency; only for a name that is not ASCII

        try:
            idna.encode(host.lower())
        except idna.IDNAError:
            return f"the host {host!r}, which is no valid internationalised domain name"
    return None


#: Headers the HTTP client or the MCP transport writes itself: one set by hand would frame the request wrongly or
#: break the session (a `Content-Length` the body does not have, a second `Mcp-Session-Id`).
_TRANSPORT_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer", "proxy-connection"}
    | {"mcp-session-id", "mcp-protocol-version"}
)


def check_header(name: str, value: str, *, path: str | None, key: str) -> None:
    """A header name of token characters and an ASCII value without line breaks or control characters, which the
    HTTP client can send; not one of the headers the client or the transport writes itself."""
    if not name or not set(name) <= _HEADER_NAME_CHARS:
        raise ConfigError(f"invalid header name {name!r}", path=path, key=key, fix="use letters, digits and -")
    if name.lower() in _TRANSPORT_HEADERS:
        raise ConfigError(f"the header {name!r} is written by the HTTP transport itself", path=path, key=key, fix="remove it")
    if not value.isascii():
        raise ConfigError(
            f"the value of header {name!r} is not ASCII, which HTTP cannot send",
            path=path,
            key=key,
            fix="percent-encode or base64-encode it, as the server expects",
        )
    if any(invisible(c) for c in value) or value != value.strip():
        raise ConfigError(
            f"the value of header {name!r} has a control character or surrounding spaces",
            path=path,
            key=key,
            fix="remove them",
        )


def check_listener_token(host: str, token: str | None) -> str | None:
    """What is wrong with serving HTTP on `host` with `token`, as a message for the operator; None if nothing.

    A listener other machines can reach needs a token, and one that cannot be guessed; a token
    with spaces or control characters could never match an `Authorization` header.
    """
    if token is not None and (not token.strip() or any(c.isspace() or invisible(c) for c in token)):
        return (
            "breakwater: the token is empty or contains spaces or control characters\n"
            "  fix: use a random token, e.g. `openssl rand -hex 24`"
        )
    if host in LOOPBACK_HOSTS:
        return None
    if not token:
        return (
            f"breakwater: refusing to listen on {host} without a token: anyone who can reach it could call "
            f"your tools.\n  fix: pass --token (or set BREAKWATER_TOKEN), or listen on 127.0.0.1"
        )
    if len(token) < MIN_TOKEN_CHARS:
        return (
            f"breakwater: refusing to listen on {host} with a {len(token)}-character token: it could be guessed.\n"
            f"  fix: use at least {MIN_TOKEN_CHARS} random characters (e.g. `openssl rand -hex 24`), or listen on 127.0.0.1"
        )
    return None


#: The words that turn a store or directory setting off (`[journal] url`, `protocol_memory_dir`), in any case.
OFF_WORDS = frozenset({"off", "none", "false", "0", "disabled"})
# The spellings `open_journal_store` understands (journal/_writer.py); checked here so a typo is a
# config error before anything runs, not a JournalError when the journal first opens.
_JOURNAL_SCHEMES = ("postgresql://", "postgres://", "sqlite:///")


def check_journal_url(url: str) -> None:
    """Refuse a `[journal] url` the journal could not open (an unknown scheme such as mysql://, a port out of range)."""
    text = url.strip()
    if not text or text.lower() in OFF_WORDS or "://" not in text:
        return
    if text.startswith(_JOURNAL_SCHEMES):
        check_url_port(text, "url")
        return
    raise ConfigError(
        f"unsupported journal URL scheme {text.split('://')[0]!r}",
        key="url",
        fix='use a file path, "sqlite:///PATH", "postgresql://..." or "off"',
    )


def check_url_port(url: str, key: str) -> None:
    """Refuse a store URL whose port is no port (`:99999`, `:abc`): it passed `config check`, and the store then
    failed to open at every start, with calls going on unrecorded. Quotes no part of the URL (its password)."""
    try:
        urlsplit(url).port  # noqa: B018 - read for its ValueError
    except ValueError:
        raise ConfigError("the URL's port is not a number from 1 to 65535", key=key, fix="fix the port in the URL") from None


def check_tool_name_template(template: str) -> None:
    """Refuse a `tool_name_template` that cannot name a server's tools apart: only {server} and {tool}, {tool} present.

    Whether it must also hold {server} depends on how many servers there are: `check_template_for_servers`.
    """
    fix = 'use {server} and {tool} once each, e.g. "{server}__{tool}" (write {{ and }} for literal braces)'
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"invalid template {template!r}: {exc}", key="tool_name_template", fix=fix) from None
    seen: list[str] = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in ("server", "tool") or spec or conversion:
            raise ConfigError(f"unknown placeholder {{{name}}} in {template!r}", key="tool_name_template", fix=fix)
        seen.append(name)
    if "tool" not in seen:
        raise ConfigError(
            f"{template!r} must contain {{tool}}, or two tools of one server could get the same name",
            key="tool_name_template",
            fix=fix,
        )


def check_template_for_servers(template: str, servers: int) -> None:
    """With more than one server the template must say which one: tools of two servers could collide otherwise."""
    if servers > 1 and "{server}" not in template:
        raise ConfigError(
            f"{template!r} has no {{server}}, and there are {servers} servers: two of them could list a tool of the same name",
            key="gateway.tool_name_template",
            fix='add {server}, e.g. "{server}__{tool}" ("{tool}" alone suits a gateway in front of one server)',
        )
