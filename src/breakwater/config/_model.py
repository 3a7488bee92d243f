"""The configuration model: `Config`, the `ServerSpec`s it holds, and their `ToolSettings`.

What `load_config` (in `_files.py`) builds; the policies themselves live in `_policies.py`.
May import the core leaves and the rest of `config` only.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from breakwater.config._knobs import Knob, iter_knobs
from breakwater.config._policies import (
    GLOBAL_SECTIONS,
    POLICY_SECTIONS,
    BreakerPolicy,
    CallPolicy,
    ConnectPolicy,
    GatewayPolicy,
    JournalPolicy,
    RetryPolicy,
    StatePolicy,
    TelemetryPolicy,
)
from breakwater.errors import ConfigError

__all__ = ["Config", "OAuthSettings", "ServerSpec", "ToolFilter", "ToolSettings", "Transport", "all_knobs"]

Transport = Literal["stdio", "http", "sse"]

#: How breakwater gets an OAuth token for an HTTP server: a person signs in once
#: (`breakwater auth login NAME`), or the machine-to-machine extension (no person at all).
GrantType = Literal["authorization_code", "client_credentials"]


@dataclass(frozen=True, kw_only=True)
class OAuthSettings:
    """An HTTP server's `oauth` object: Claude Code's keys, and breakwater's for client credentials.

    Claude Code writes `clientId`, `callbackPort`, `authServerMetadataUrl` and `scopes`; breakwater
    also reads `clientSecret`, `clientMetadataUrl`, `grantType`, `privateKey`/`privateKeyFile`,
    `signingAlgorithm` and `issuer` (see `config/_oauth.py`). The secret and the key are secrets:
    excluded from `repr` and every rendering.
    """

    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    #: The loopback redirect is `http://localhost:PORT/callback`; None picks a free port at sign-in.
    callback_port: int | None = None
    #: Authorization-server metadata at this URL instead of discovery from the server's 401.
    auth_server_metadata_url: str | None = None
    #: Space-separated scopes to ask for instead of the ones the server advertises.
    scopes: str | None = None
    #: A client ID metadata document (an https URL) to use as the client ID where the server supports them.
    client_metadata_url: str | None = None
    grant_type: GrantType = "authorization_code"
    #: A PEM private key signing `private_key_jwt` assertions (client credentials without a secret).
    private_key: str | None = field(default=None, repr=False)
    signing_algorithm: str = "RS256"
    #: The authorization server the client credentials belong to (they are sent nowhere else).
    issuer: str | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """The client secret and the private key, when set."""
        return tuple(s for s in (self.client_secret, self.private_key) if s)

    def describe(self) -> dict[str, Any]:
        """What was understood, safe to print (the secret and key appear as `<redacted>`)."""
        out: dict[str, Any] = {"grantType": self.grant_type}
        for key, value in (
            ("clientId", self.client_id),
            ("callbackPort", self.callback_port),
            ("authServerMetadataUrl", self.auth_server_metadata_url),
            ("scopes", self.scopes),
            ("clientMetadataUrl", self.client_metadata_url),
            ("issuer", self.issuer),
        ):
            if value is not None:
                out[key] = value
        if self.client_secret:
            out["clientSecret"] = "<redacted>"
        if self.private_key:
            out["privateKey"] = "<redacted>"
        return out


@dataclass(frozen=True, kw_only=True)
class ToolSettings:
    """One tool's own settings from `[servers.NAME.tools.TOOL]`, layered over its server's."""

    call: CallPolicy
    retry: RetryPolicy
    #: The keys the tool's table set itself (they win over a learned timeout).
    explicit: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class ToolFilter:
    """Which of a server's listed tools the entry serves: an allow-list and a deny-list, named by the keys written.

    Cline's, Roo's and Windsurf's `disabledTools`, Gemini CLI's `includeTools` and `excludeTools`, Codex's
    `enabled_tools` and `disabled_tools`. The deny-list wins over the allow-list, as in both of those clients.
    """

    #: The allow-list; None serves every tool the deny-list leaves.
    only: frozenset[str] | None = None
    only_key: str = "includeTools"
    without: frozenset[str] = frozenset()
    without_key: str = "disabledTools"

    def left_out(self, tool: str) -> str | None:
        """Why `tool` is left out of the list, or None when it is served."""
        if tool in self.without:
            return f"disabled in the config ({self.without_key})"
        if self.only is not None and tool not in self.only:
            return f"not among the config's {self.only_key}"
        return None

    def describe(self) -> dict[str, list[str]]:
        """The lists as written (key -> sorted names), for `config check`."""
        out = {self.without_key: sorted(self.without)} if self.without else {}
        if self.only is not None:
            out[self.only_key] = sorted(self.only)
        return out


#: A `ServerSpec`'s policies when it is given none: each is replaced by its `Config`'s (compared by identity).
_UNSET_CONNECT, _UNSET_CALL, _UNSET_BREAKER, _UNSET_RETRY = ConnectPolicy(), CallPolicy(), BreakerPolicy(), RetryPolicy()
_UNSET: dict[str, Any] = {"connect": _UNSET_CONNECT, "call": _UNSET_CALL, "breaker": _UNSET_BREAKER, "retry": _UNSET_RETRY}
_POLICY_TYPES: dict[str, type] = {"connect": ConnectPolicy, "call": CallPolicy, "breaker": BreakerPolicy, "retry": RetryPolicy}


def _spec_problem(spec: ServerSpec) -> tuple[str, str, str] | None:
    """(key, what is wrong, what to pass) for the first field of `spec` that cannot be used, else None."""
    if spec.transport not in ("stdio", "http", "sse"):
        return "transport", f"expected stdio, http or sse, got {spec.transport!r}", 'transport="stdio"'
    if spec.enabled and spec.transport == "stdio" and not (isinstance(spec.command, str) and spec.command.strip()):
        return "command", "a stdio server needs a command", 'command="npx" (and args)'
    if spec.enabled and spec.transport != "stdio" and not (isinstance(spec.url, str) and spec.url.strip()):
        return "url", "an HTTP server needs a url", 'url="https://host/mcp"'
    if isinstance(spec.args, str) or not all(isinstance(a, str) for a in spec.args):
        return "args", f"expected a sequence of strings, got {spec.args!r}", 'args=("-y", "pkg")'
    for key in ("env", "headers"):
        value = getattr(spec, key)
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return key, "expected a mapping of strings to strings", f'{key}={{"NAME": "value"}}'
    unset = spec.env_unset
    if isinstance(unset, str) or not isinstance(unset, Collection) or not all(isinstance(n, str) and n for n in unset):
        return "env_unset", f"expected a sequence of variable names, got {unset!r}", 'env_unset=("NAME",)'
    if both := sorted(set(unset) & set(spec.env)):
        return "env_unset", f"{both[0]!r} is both set in env and unset", "it in env or in env_unset, not both"
    for key, cls in _POLICY_TYPES.items():
        if not isinstance(getattr(spec, key), cls):
            return key, f"expected a {cls.__name__}", f"{key}={cls.__name__}(...)"
    return None


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    """One upstream MCP server as configured.

    `env` and `headers` hold secrets: they are excluded from `repr` and from every rendering.
    """

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Variables this server does not inherit (VS Code's `"env": {"NAME": null}`): names, no secret.
    env_unset: tuple[str, ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: The entry's `oauth` object (HTTP servers only); None when it has none.
    oauth: OAuthSettings | None = None
    enabled: bool = True
    #: Why a server is not enabled, as `status` says it: the key that turned it off.
    disabled_by: str | None = None
    #: A stdio server that every session attached to the shared local gateway uses (one process for
    #: all), instead of one process per session; see `[gateway] share_stdio`. Meaningless for HTTP,
    #: which is always shared.
    shared: bool = False
    #: Left out, each is the `Config`'s (its `[connect]`, `[call]`, ...): see `Config`.
    connect: ConnectPolicy = field(default=_UNSET_CONNECT)
    call: CallPolicy = field(default=_UNSET_CALL)
    breaker: BreakerPolicy = field(default=_UNSET_BREAKER)
    retry: RetryPolicy = field(default=_UNSET_RETRY)
    #: Keys set in this server's own `[servers.NAME.call]` (they win over a learned timeout).
    call_explicit: frozenset[str] = frozenset()
    #: Keys of `[call]` the config file set for this server anywhere (its own table or the top-level
    #: `[call]`): a value from there is labelled `configured`, not `default` (a learned one still wins
    #: over the top-level table).
    call_configured: frozenset[str] = frozenset()
    #: Per-tool settings, by tool name.
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)
    source: str | None = None
    #: A shell command whose standard output is a JSON object of request headers (Claude Code's
    #: `headersHelper`), run at each connect and on a 401; its output is a secret like any header.
    headers_helper: str | None = field(default=None, repr=False)
    #: Values `${VAR}` expansion put into this entry that are secrets (see `config/_expand.py`).
    expanded_secrets: tuple[str, ...] = field(default=(), repr=False)
    #: What `config check` says about this entry's keys that were kept for sign-in or ignored.
    notes: tuple[str, ...] = ()
    #: The entry names no `type`: its `url` is taken for streamable HTTP and, if the server answers the
    #: handshake's POST 404 or 405, tried over the legacy SSE transport (the spec's backwards compatibility).
    transport_guessed: bool = False
    #: The tools the entry leaves out of the list (`disabledTools`, `includeTools`, ...), named with why in `status`.
    tool_filter: ToolFilter = field(default_factory=ToolFilter)

    def __post_init__(self) -> None:
        # Built in Python, nothing was checked: a transport "pigeon" failed 15 s later as an unsupported URL, a stdio
        # server without a command as an unexpected failure, `args="-v"` ran "-" and "v".
        if not isinstance(self.name, str) or not self.name.strip():
            said = f"a server needs a name (a non-empty string), got {self.name!r}"
            raise ConfigError(said, key="name", fix='pass name="files"')
        where = f"servers.{self.name}"
        problem = _spec_problem(self)
        if problem is not None:
            key, said, fix = problem
            raise ConfigError(said, key=f"{where}.{key}", fix=f"pass {fix}")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env_unset", tuple(self.env_unset))
        # Copies: the caller's dict changed a frozen spec.
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "headers", dict(self.headers))

    @property
    def default_timeout_source(self) -> str:
        """The label of a timeout that comes from `call.timeout_s`: `configured` when the file set it, else `default`."""
        return "configured" if "timeout_s" in self.call_configured else "default"

    def legacy_sse_answer(self, http_status: int | None) -> bool:
        """Whether `http_status`, the answer to the handshake's POST, says this entry's `url` of no stated type is a
        legacy HTTP+SSE endpoint (404 or 405: the spec's backwards compatibility), to be opened as SSE."""
        return self.transport_guessed and http_status in (404, 405)

    def describe(self) -> dict[str, Any]:
        """What was understood, safe to print: secret values are replaced by their key names.

        A secret value that also appears in the command line (`--token` arguments) is masked there too,
        and a URL loses its user-info and query string.
        """
        from breakwater.config._redact import Redactor, display_url

        redact = Redactor(self.secrets)
        out: dict[str, Any] = {"name": self.name, "transport": self.transport, "enabled": self.enabled}
        if self.transport == "stdio":
            out["command"] = redact(self.command or "")
            out["args"] = [redact(a) for a in self.args]
            if self.cwd:
                out["cwd"] = self.cwd
            if self.env:
                out["env"] = {k: "<redacted>" for k in sorted(self.env)}
            if self.env_unset:
                out["env_unset"] = sorted(self.env_unset)
            if self.shared:
                out["shared"] = True
        else:
            out["url"] = redact(display_url(self.url or ""))  # a path may hold an expanded secret
            if self.headers:
                out["headers"] = {k: "<redacted>" for k in sorted(self.headers)}
            if self.oauth is not None:
                out["oauth"] = self.oauth.describe()
            if self.headers_helper:
                out["headersHelper"] = redact(self.headers_helper)
        out.update(self.tool_filter.describe())
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret value this server carries, so writers can scrub them from anything they print.

        Env values but paths, header values (and the token after an auth scheme), a URL's user-info and query
        values, and the values of credential-looking arguments (of the command and of the headersHelper); see
        `config/_redact.py` for the rule.
        """
        from breakwater.config._redact import (
            MIN_SECRET,
            arg_secrets,
            command_line_words,
            env_secrets,
            header_secrets,
            path_like,
            url_secrets,
        )

        found = [*env_secrets(self.env), *(v for v in self.expanded_secrets if not path_like(v))]
        found += [s for v in self.headers.values() for s in header_secrets(v)]
        found += url_secrets(self.url or "")
        # A whole command line written into `command` (Cursor's links) holds its arguments too.
        found += arg_secrets([*command_line_words(self.command or ""), *self.args])
        # So does a headersHelper's (`curl -H "Authorization: Bearer X"`), shown in config check and in its failures.
        found += arg_secrets(command_line_words(self.headers_helper or ""))
        found += self.oauth.secrets if self.oauth is not None else ()
        return tuple(dict.fromkeys(v for v in found if len(v) >= MIN_SECRET))

    def unmatched_tools(self, listed: Collection[str]) -> tuple[str, ...]:
        """What `status` says of each tool name this entry configures that the server, listing `listed`, does not have:
        a `[servers.NAME.tools.T]` table or a tool list naming a typo (or the gateway's name for a tool) sets nothing."""
        named = [(tool, f"servers.{self.name}.tools.{tool}") for tool in self.tools]
        named += [(tool, self.tool_filter.only_key) for tool in sorted(self.tool_filter.only or ())]
        named += [(tool, self.tool_filter.without_key) for tool in sorted(self.tool_filter.without)]
        notes = []
        for tool, key in named:
            if tool in listed:
                continue
            own = next((t for t in listed if tool.endswith(("__" + t, "_" + t, "." + t))), None)
            close = [own] if own else difflib.get_close_matches(tool, sorted(listed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            notes.append(f"{key} names the tool {tool!r}, which the server does not list{hint}")
        return tuple(notes)

    def fingerprint(self) -> str:
        """A stable hash of what defines the connection (secrets included, but only as a hash)."""
        import hashlib

        blob = json.dumps(
            [
                self.transport,
                self.command,
                list(self.args),
                sorted(self.env.items()),
                self.cwd,
                self.url,
                sorted(self.headers.items()),
                *([self.headers_helper] if self.headers_helper else []),
                # Only when set: every fingerprint taken before it was known stays as it was.
                *([{"env_unset": sorted(self.env_unset)}] if self.env_unset else []),
            ],
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything breakwater was told: the servers and the defaults they were built from."""

    servers: tuple[ServerSpec, ...]
    connect: ConnectPolicy = field(default_factory=ConnectPolicy)
    call: CallPolicy = field(default_factory=CallPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    gateway: GatewayPolicy = field(default_factory=lambda: GatewayPolicy())
    journal: JournalPolicy = field(default_factory=lambda: JournalPolicy())
    state: StatePolicy = field(default_factory=StatePolicy)
    telemetry: TelemetryPolicy = field(default_factory=lambda: TelemetryPolicy())
    path: str | None = None
    #: What `config check` says about the file itself: keys beside the servers, entries skipped.
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A server built without its own policies takes these (a file's `[call]` reaches every server the same way):
        # `Config(servers=..., call=CallPolicy(timeout_s=0.5))` left each server at the built-in 5 s, without a word.
        servers = tuple(self.servers) if isinstance(self.servers, list | tuple) else self.servers
        if not isinstance(servers, tuple) or not all(isinstance(s, ServerSpec) for s in servers):
            raise ConfigError("expected a sequence of ServerSpec", key="servers", fix="pass servers=(ServerSpec(...), ...)")
        seen: set[str] = set()
        for spec in servers:
            if spec.name in seen:  # the first one was dropped without a word
                raise ConfigError(f"two servers are named {spec.name!r}", key=f"servers.{spec.name}", fix="pass each name once")
            seen.add(spec.name)
        for key, cls in _POLICY_TYPES.items():
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(f"expected a {cls.__name__}", key=key, fix=f"pass {key}={cls.__name__}(...)")
        object.__setattr__(self, "servers", tuple(self._inherited(spec) for spec in servers))

    def _inherited(self, spec: ServerSpec) -> ServerSpec:
        unset = {key: getattr(self, key) for key, default in _UNSET.items() if getattr(spec, key) is default}
        return replace(spec, **unset) if unset else spec

    def server(self, name: str) -> ServerSpec:
        """The server called `name` (KeyError if none)."""
        for spec in self.servers:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret value in the config: the servers', and the journal's and state store's URL credentials."""
        from breakwater.config._redact import url_secrets

        own = [*url_secrets(self.journal.url), *url_secrets(self.state.url)]
        return tuple(dict.fromkeys([*(s for spec in self.servers for s in spec.secrets), *(s for s in own if len(s) >= 4)]))

    def with_servers(self, servers: tuple[ServerSpec, ...]) -> Config:
        """A copy with another server list."""
        return replace(self, servers=servers)


def all_knobs() -> list[Knob]:
    """Every knob, for the README's generated table."""
    sections = {**POLICY_SECTIONS, **GLOBAL_SECTIONS}
    return [k for section, cls in sections.items() for k in iter_knobs(section, cls)]
