"""No input breaks it: a wrong config is refused before it runs, with the file, the key, the value and the fix.

Each class of bad input the adversarial pass found (non-finite or absurd numbers, undecodable bytes,
deep nesting, unknown schemes and placeholders, duplicate names, malformed URLs, invisible
characters, missing directories, weak tokens) has a row here, and a property test generates
configs (TOML and JSON, valid and broken) and holds every one to: a clear ConfigError, or a config
whose every policy is in range.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from breakwater.config import Config, load_config
from breakwater.config._checks import check_listener_token
from breakwater.config._knobs import knob_range
from breakwater.config._policies import GLOBAL_SECTIONS, POLICY_SECTIONS, CallPolicy
from breakwater.errors import ConfigError
from helpers import INITIALIZE, INITIALIZED, alive

pytestmark = pytest.mark.long_module(58)

NUMBER_KNOBS = [
    (section, f.name)
    for section, cls in {**POLICY_SECTIONS, **GLOBAL_SECTIONS}.items()
    for f in dataclasses.fields(cls)
    if f.type in ("float", "int", "float | None", "int | None")
]


def test_every_number_knob_has_a_range() -> None:
    """Every number knob declares both ends of its range, so no value is accepted just because nobody bounded it."""
    sections = {**POLICY_SECTIONS, **GLOBAL_SECTIONS}
    assert len(NUMBER_KNOBS) > 40
    missing = [f"{s}.{n}" for s, n in NUMBER_KNOBS if None in knob_range(sections[s], n)]
    assert missing == []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, -5.0])
def test_policies_refuse_out_of_range_values_on_construction(value: float) -> None:
    """Constructing a policy in code checks it as a file would: NaN, infinities and 1e300 are refused."""
    with pytest.raises(ConfigError) as info:
        CallPolicy(timeout_s=value)
    assert info.value.key == "timeout_s" and info.value.fix


def _json(servers: dict[str, Any]) -> str:
    return json.dumps({"mcpServers": servers})


OK = {"command": sys.executable, "args": ["-c", "pass"]}

# (file name, content, what the error must mention)
BAD_CONFIGS: list[tuple[str, str | bytes, str]] = [
    ("nan.toml", "[call]\ntimeout_s = nan\n", "call.timeout_s"),
    ("inf.toml", "[call]\ntimeout_s = inf\n", "call.timeout_s"),
    ("huge.toml", "[call]\ntimeout_s = 1e300\n", "call.timeout_s"),
    ("neg.toml", "[connect]\nbudget_s = -5\n", "connect.budget_s"),
    ("nanstr.toml", '[call]\ntimeout_s = "NaN"\n', "call.timeout_s"),
    ("server-nan.toml", '[servers.a]\ncommand = "x"\n[servers.a.call]\nmax_s = inf\n', "servers.a.call.max_s"),
    ("tool-nan.toml", '[servers.a]\ncommand = "x"\n[servers.a.tools.t]\ntimeout_s = nan\n', "servers.a.tools.t.timeout_s"),
    ("bigint.toml", "[call]\nmax_in_flight = 99999999999999999999\n", "call.max_in_flight"),
    ("latin1.json", b'{"mcpServers": {"caf\xe9": {"command": "x"}}}', "not UTF-8"),
    ("latin1.toml", b'[servers.caf\xe9]\ncommand = "x"\n', "not UTF-8"),
    ("utf16.json", '{"mcpServers": {"a": {"command": "x"}}}'.encode("utf-16"), "UTF-16"),  # what PowerShell's > writes
    ("utf16le.toml", '[servers.a]\ncommand = "x"\n'.encode("utf-16-le"), "UTF-16"),  # the same without a BOM
    ("serverurl.json", _json({"a": {"serverUrl": "ftp://x/mcp"}}), "mcpServers.a.serverUrl"),
    ("disabled-tools.json", _json({"a": {**OK, "disabledTools": [1]}}), "mcpServers.a.disabledTools"),
    (
        "transport-type.json",
        _json({"a": {"url": "https://x.test/mcp", "transportType": "websocket"}}),
        "mcpServers.a.transportType",
    ),
    ("nul.json", b'{"mcpServers": {"a": {"command": "x\x00"}}}', "NUL"),
    ("twice.json", _json({"a": {"url": "http://h.test/mcp", "headers": {"Authorization": "A", "authorization": "B"}}}), "twice"),
    ("port.toml", '[journal]\nurl = "postgresql://u:Pw9@h:99999/db"\n', "port is not a number from 1 to 65535"),
    ("redis-db.toml", '[state]\nurl = "redis://h:6379/notanumber"\n', "database is not a number"),
    ("other-section.toml", "[call]\nmax_attempts = 2\n", "max_attempts is a [retry] key"),
    ("datetime.toml", "[call]\ntimeout_s = 1979-05-27T07:32:00Z\n", "a TOML date or time (1979-05-27T07:32:00+00:00)"),
    ("shell-default.json", _json({"a": {"command": "x", "args": ["${NOPE_Q-fallback}"]}}), "write ${NOPE_Q:-fallback}"),
    # Read as Codex's file (for its [mcp_servers]), its [call] and servers_file were dropped without a word.
    ("mixed.toml", 'servers_file = "x.json"\n[call]\ntimeout_s = 60\n[mcp_servers.b]\ncommand = "x"\n', "servers_file"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested deeper"),
    ("deep2.json", '{"mcpServers": {"a": {"command": "x", "args": ' + "[" * 5000 + "]" * 5000 + "}}}", "nested deeper"),
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested"),
    ("nan.json", '{"mcpServers": {"a": {"command": "x", "args": [NaN]}}}', "NaN"),
    ("mysql.toml", '[journal]\nurl = "mysql://user@db/x"\n', "journal.url"),
    ("template-unknown.toml", '[gateway]\ntool_name_template = "{nope}_{tool}"\n', "gateway.tool_name_template"),
    ("template-server.toml", '[gateway]\ntool_name_template = "{server}"\n', "gateway.tool_name_template"),
    ("template-brace.toml", '[gateway]\ntool_name_template = "{server}_{tool"\n', "gateway.tool_name_template"),
    ("template-attr.toml", '[gateway]\ntool_name_template = "{server.__class__}{tool}"\n', "gateway.tool_name_template"),
    ("template-conv.toml", '[gateway]\ntool_name_template = "{server!r}{tool}"\n', "gateway.tool_name_template"),
    ("dup.json", '{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "appears twice"),
    ("dup-env.json", '{"mcpServers": {"a": {"command": "x", "env": {"K": "1", "K": "2"}}}}', "appears twice"),
    ("bare-url.json", _json({"a": {"type": "http", "url": "http://"}}), "mcpServers.a.url"),
    ("port.json", _json({"a": {"type": "http", "url": "http://127.0.0.1:99999/mcp"}}), "mcpServers.a.url"),
    ("port0.json", _json({"a": {"type": "http", "url": "http://127.0.0.1:0/mcp"}}), "mcpServers.a.url"),
    ("space-url.json", _json({"a": {"type": "http", "url": "http://exa mple.com/mcp"}}), "mcpServers.a.url"),
    ("sse-url.toml", '[servers.a]\ntype = "sse"\nurl = "http:// /sse"\n', "servers.a.url"),
    ("empty-name.json", _json({"": OK}), "empty server name"),
    ("space-name.json", _json({"   ": OK}), "empty server name"),
    ("ctrl-name.json", _json({"a\x1bb": OK}), "U+001B"),
    ("bidi-name.json", _json({"a\u202eb": OK}), "U+202E"),
    ("empty-name.toml", '[servers.""]\ncommand = "x"\n', "empty server name"),
    ("bidi-name.toml", '[servers."x\u2066y"]\ncommand = "x"\n', "U+2066"),
    ("cwd.json", _json({"a": {**OK, "cwd": "/definitely/not/here"}}), "does not exist"),
    ("env-key.json", _json({"a": {**OK, "env": {"A=B": "1"}}}), "environment variable name"),
    ("header.json", _json({"a": {"type": "http", "url": "http://h/mcp", "headers": {"X-A": "1\r\nX-B: 2"}}}), "headers"),
    ("header-name.json", _json({"a": {"type": "http", "url": "http://h/mcp", "headers": {"X A": "1"}}}), "header name"),
    ("state.toml", '[state]\nurl = "mysql://x"\n', "state.url"),
    ("namespace-ctrl.toml", '[state]\nnamespace = "a\\u0007b"\n', "state.namespace"),
    ("ceiling.toml", "[journal]\nlearn_floor_s = 10\nlearn_ceiling_s = 5\n", "journal.learn_ceiling_s"),
    ("bool-arg.json", _json({"a": {"command": "x", "args": [True]}}), "mcpServers.a.args"),
    # A value of the wrong JSON type where a transport's name goes (a list is unhashable: once a TypeError).
    ("type-list.json", _json({"a": {"command": "x", "type": ["stdio"]}}), "mcpServers.a.type"),
    ("transport-obj.json", _json({"a": {"command": "x", "transport": {"x": 1}}}), "mcpServers.a.transport"),
    ("opencode-type.json", json.dumps({"mcp": {"a": {"type": {"k": 1}, "command": ["x"]}}}), "mcp.a.type"),
    ("opencode-case.json", json.dumps({"mcp": {"a": {"type": "Local", "command": ["x"]}}}), "did you mean 'local'"),
    ("two-transports.json", _json({"a": {"command": "x", "type": "stdio", "transport": "sse"}}), "mcpServers.a.transport"),
    # Text no process, header or file name can be given, found once accepted and then crashing `serve`.
    ("surrogate-arg.json", '{"mcpServers": {"a": {"command": "x", "args": ["\\ud83d"]}}}', "mcpServers.a.args[0]"),
    ("surrogate-key.json", '{"mcpServers": {"a": {"command": "x", "env": {"K\\udc00": "1"}}}}', "lone surrogate"),
    ("ipv4.json", _json({"a": {"type": "http", "url": "http://999.999.999.999:9/mcp"}}), "no IPv4 address"),
    ("ipv6.json", _json({"a": {"type": "http", "url": "http://[zz::q]:9/mcp"}}), "mcpServers.a.url"),
    ("idna.json", _json({"a": {"type": "http", "url": "http://\u2603.net/mcp"}}), "internationalised"),
    ("header-ascii.json", _json({"a": {"type": "http", "url": "http://h/mcp", "headers": {"X-A": "\u00e9"}}}), "not ASCII"),
    (
        "header-length.json",
        _json({"a": {"type": "http", "url": "http://h/mcp", "headers": {"Content-Length": "5"}}}),
        "HTTP transport",
    ),
    ("blank-command.json", _json({"a": {"command": "${EMPTY_HERE:-}"}}), "empty once its variables"),
    ("search-tool.toml", '[gateway]\nsearch_tool = "bad name!"\n', "gateway.search_tool"),
    ("same-tools.toml", '[gateway]\nsearch_tool = "x"\nstatus_tool = "x"\n', "gateway.status_tool"),
    # A server or a key read by nobody, which once vanished without a word.
    ("opencode-stray.json", json.dumps({"mcp": {"a": {"type": "local", "command": ["x"]}, "servers": {}}}), "mcp.a"),
    ("opencode-args.json", json.dumps({"mcp": {"a": {"type": "local", "command": ["x"], "args": ["y"]}}}), "mcp.a.args"),
    ("opencode-env.json", json.dumps({"mcp": {"a": {"type": "local", "command": ["x"], "env": {"K": "v"}}}}), "mcp.a.env"),
    ("two-tables.json", json.dumps({"mcpServers": {"a": OK}, "mcp": {"servers": {"b": OK}}}), "mcp.servers"),
    ("enabled-disabled.json", _json({"a": {**OK, "enabled": True, "disabled": True}}), "contradict"),
    ("url-args.json", _json({"a": {"type": "http", "url": "http://h/mcp", "args": ["--x"]}}), "mcpServers.a.args"),
    (
        "codex-two.toml",
        '[mcp_servers.a]\ncommand = "x"\nstartup_timeout_sec = 5\nstartup_timeout_ms = 5000\n',
        "startup_timeout_ms",
    ),
    (
        "env-no-name.json",
        json.dumps({"mcp": {"a": {"type": "local", "command": ["x"], "environment": {"K": "{env:}"}}}}),
        "names no variable",
    ),
    ("dup-path.json", '{"mcpServers": {"a": {"command": "x", "command": "y"}}}', "mcpServers.a.command"),
    ("servers-file-dir.toml", 'servers_file = ""\n', "servers_file"),
    ("inf-arg.json", '{"mcpServers": {"a": {"command": "x", "args": [1e400]}}}', "mcpServers.a.args[0]"),
    ("inf-env.json", '{"mcpServers": {"a": {"command": "x", "env": {"K": -1e400}}}}', "mcpServers.a.env.K"),
]


# A required key absent, present with another JSON type, blank, or (a url) with another scheme: each error says
# which, names the key, and says "add" only when the key is not there. The value is never repeated (it may be a token).
WRONG_REQUIRED: list[tuple[dict[str, Any], str, str]] = [
    ({"args": []}, "mcpServers.a.command", "add "),
    ({"command": 5}, "mcpServers.a.command", "got a number"),
    ({"command": ["npx", "x"]}, "mcpServers.a.command", "got a list"),
    ({"command": None}, "mcpServers.a.command", "got null"),
    ({"command": "  "}, "mcpServers.a.command", "is empty"),
    ({"type": "http"}, "mcpServers.a.url", "add "),
    ({"type": "http", "url": {"href": "http://h/mcp?k=SECRET1"}}, "mcpServers.a.url", "got an object"),
    ({"type": "http", "url": True}, "mcpServers.a.url", "got true/false"),
    ({"type": "http", "url": ""}, "mcpServers.a.url", "is empty"),
    ({"type": "http", "url": "ftp://h/mcp?k=SECRET1"}, "mcpServers.a.url", "scheme is 'ftp'"),
    ({"type": "http", "url": "h:8000/mcp?k=SECRET1"}, "mcpServers.a.url", "does not start with http"),
]


@pytest.mark.parametrize(("entry", "key", "says"), WRONG_REQUIRED)
def test_a_required_key_absent_mistyped_or_blank_is_told_apart(
    tmp_path: Path, entry: dict[str, Any], key: str, says: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(_json({"a": entry}))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    text = str(info.value)
    assert key in text and says in text, text
    assert ("fix: add " in text) == (says == "add "), text
    assert "SECRET1" not in text


@pytest.mark.parametrize(("name", "content", "mentions"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_refused_with_file_key_and_fix(tmp_path: Path, name: str, content: str | bytes, mentions: str) -> None:
    """Each class of wrong config is a ConfigError naming the file, what is wrong (key or cause) and the fix."""
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    text = str(info.value)
    assert str(path) in text and mentions in text and "fix:" in text
    assert len(text) < 600, "the error quotes a whole file"


@pytest.mark.parametrize(
    ("env", "mentions"),
    [
        ({"BREAKWATER_CALL_TIMEOUT_S": "nan"}, "finite"),
        ({"BREAKWATER_CALL_TIMEOUT_S": "1e300"}, "at most"),
        ({"BREAKWATER_CALL_MAX_IN_FLIGHT": "abc"}, "expected a whole number"),
        ({"BREAKWATER_TOOL_NAME_MAX": "47.5"}, "expected a whole number, got '47.5'"),
        ({"BREAKWATER_CALL_TIMEOUT_S": "soon"}, "expected a number, got 'soon'"),
        ({"BREAKWATER_CONNECT_BUDGET_S": "-5"}, "at least 0"),
        ({"BREAKWATER_CALL_RETRY": "often"}, "expected one of"),
        ({"BREAKWATER_SHARE": "maybe"}, "true or false"),
        ({"BREAKWATER_JOURNAL": "a\x01b"}, "control character"),
        ({"BREAKWATER_JOURNAL": "mysql://x"}, "journal URL scheme"),
        ({"BREAKWATER_STATE_URL": "http://:Pw9Pw9Pw9@h:6379/0"}, "state store scheme 'http'"),
    ],
)
def test_bad_environment_values_are_refused(tmp_path: Path, env: dict[str, str], mentions: str) -> None:
    """An environment variable is held to the same range as the file, and the error names the variable the user set."""
    path = tmp_path / "a.json"
    path.write_text(_json({"a": OK}))
    with pytest.raises(ConfigError, match=mentions) as info:
        load_config(path, environ=env)
    (variable,) = env
    assert info.value.path == "environment"
    assert info.value.key == variable, "the error names the variable, not the knob's key in a file"
    assert "Pw9Pw9" not in str(info.value), "a store URL's password was quoted"
    if "scheme" not in mentions:  # the URL checks say what to write instead
        assert info.value.fix is not None and variable in info.value.fix


def test_a_template_without_server_suits_one_server_and_is_refused_for_two(tmp_path: Path) -> None:
    """`{tool}` alone names one server's tools apart (a gateway in front of one server); with two it could not."""
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(_json({"a": OK}))
    two.write_text(_json({"a": OK, "b": OK}))
    env = {"BREAKWATER_TOOL_NAME_TEMPLATE": "{tool}"}
    assert load_config(one, environ=env).gateway.tool_name_template == "{tool}"
    with pytest.raises(ConfigError, match="2 servers") as info:
        load_config(two, environ=env)
    assert info.value.path == str(two) and info.value.key == "gateway.tool_name_template" and "{server}" in (info.value.fix or "")


def test_secrets_are_not_quoted_in_config_errors(tmp_path: Path) -> None:
    """A URL refused for its port is quoted without its user-info or query, where tokens hide."""
    path = tmp_path / "a.json"
    path.write_text(_json({"a": {"type": "http", "url": "http://user:pa55w0rd-xyz@h:99999/mcp?key=sekrit-value"}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "pa55w0rd" not in str(info.value) and "sekrit" not in str(info.value)


@pytest.mark.parametrize(
    ("host", "token", "ok"),
    [
        ("0.0.0.0", None, False),
        ("0.0.0.0", "x", False),
        ("0.0.0.0", "short-token", False),
        ("0.0.0.0", " " * 20, False),
        ("0.0.0.0", "abc def ghi jkl mno", False),
        ("0.0.0.0", "7f3a9c2e1d5b4a6f8e0c", True),
        ("127.0.0.1", None, True),
        ("127.0.0.1", "s3cret", True),
        ("127.0.0.1", "   ", False),
    ],
)
def test_listener_token_rules(host: str, token: str | None, ok: bool) -> None:
    """A reachable listener needs a token that cannot be guessed; no listener takes a token that can never match."""
    problem = check_listener_token(host, token)
    assert (problem is None) is ok
    if problem:
        assert "fix:" in problem


# ---- the property: any generated config is a clear error or a config in range ----------------------

_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, 0.0, -1, 1e300, 1e-300, 0.5, 3, 86400, 10**7]),
)
_TEXT = st.text(min_size=0, max_size=12)
_KNOB_VALUE = st.one_of(_NUMBERS, _TEXT, st.booleans(), st.sampled_from(["nan", "inf", "-1", "5", "1e300", "auto", "never"]))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


@st.composite
def _toml_configs(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for section in draw(st.lists(st.sampled_from(sorted({*POLICY_SECTIONS, *GLOBAL_SECTIONS})), max_size=3, unique=True)):
        lines.append(f"[{section}]")
        cls = {**POLICY_SECTIONS, **GLOBAL_SECTIONS}[section]
        names = [f.name for f in dataclasses.fields(cls)]
        for name in draw(st.lists(st.sampled_from([*names, "bogus"]), max_size=3, unique=True)):
            lines.append(f"{name} = {_toml_value(draw(_KNOB_VALUE))}")
    for server in draw(st.lists(st.sampled_from(["a", "b", "", "x y", "\u202e", "ok-1"]), max_size=2, unique=True)):
        lines.append(f"[servers.{json.dumps(server)}]")
        if draw(st.booleans()):
            command = draw(st.sampled_from(["x", "", " ", "a\x00b", sys.executable]))
            lines.append(f"command = {json.dumps(command)}")
        else:
            url = draw(st.sampled_from(["http://", "http://h:99999/", "http://h/mcp", "https://h:1/x", "ftp://h", "http://a b"]))
            lines.append(f"url = {json.dumps(url)}")
        if draw(st.booleans()):
            lines.append(f"[servers.{json.dumps(server)}.call]")
            lines.append(f"timeout_s = {_toml_value(draw(_NUMBERS))}")
    return "\n".join(lines) + "\n"


_ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "command": st.one_of(
            st.sampled_from(["x", "", sys.executable]),
            _TEXT,
            st.integers(),
            st.lists(_TEXT, max_size=2),  # OpenCode's
            st.fixed_dictionaries({}, optional={"path": _TEXT, "args": st.lists(_TEXT, max_size=2), "bogus": _TEXT}),  # Zed's
        ),
        "args": st.one_of(st.lists(st.one_of(_TEXT, st.integers(), st.booleans(), st.just("\ud83d")), max_size=3), _TEXT),
        "env": st.one_of(st.dictionaries(_TEXT, st.one_of(_TEXT, st.integers(), st.none()), max_size=2), _TEXT),
        "url": st.one_of(
            st.sampled_from(["http://", "http://h:99999", "http://127.0.0.1:8/mcp", "https://u:p@h/x?k=v"]),
            st.sampled_from(
                ["http://999.1.1.1/x", "http://[::1]:8/x", "http://[zz]/x", "http://\u2603.net/", "http://xn--a.com/"]
            ),
            _TEXT,
        ),
        "type": st.one_of(
            st.sampled_from(["stdio", "http", "sse", "streamable-http", "bogus", "local", "remote", "Local", "HTTP"]),
            st.lists(st.sampled_from(["stdio", "local"]), max_size=1),
            st.fixed_dictionaries({"k": st.integers()}),
        ),
        "transport": st.one_of(st.sampled_from(["stdio", "sse", "http"]), st.none(), st.integers()),
        "environment": st.one_of(
            st.dictionaries(_TEXT, st.sampled_from(["v", "{env:NOPE}", "{file:nope}", "{env:}"]), max_size=2), _TEXT
        ),
        "source": st.sampled_from(["custom", "extension", "bogus"]),
        "cwd": st.sampled_from([".", "/nope/nope", "", "~"]),
        "headers": st.dictionaries(_TEXT, _TEXT, max_size=2),
        "disabled": st.one_of(st.booleans(), _TEXT),
        # Gemini CLI's keys
        "httpUrl": st.sampled_from(["http://h/mcp", "ftp://h", "", "http://h:99999"]),
        "includeTools": st.one_of(st.lists(st.one_of(_TEXT, st.integers()), max_size=3), _TEXT),
        "excludeTools": st.lists(_TEXT, max_size=3),
        "trust": st.one_of(st.booleans(), _TEXT),
        "oauth": st.fixed_dictionaries(
            {}, optional={"enabled": st.one_of(st.booleans(), _TEXT), "scopes": st.one_of(st.lists(_TEXT, max_size=2), _TEXT)}
        ),
    },
)


@st.composite
def _json_configs(draw: st.DrawFn) -> str:
    servers = draw(st.dictionaries(_TEXT, _ENTRY, max_size=3))
    top = draw(st.sampled_from(["mcpServers", "servers", "bogus", "context_servers", "mcp"]))
    text = json.dumps({top: servers} if top != "mcp" else {"mcp": draw(st.sampled_from([{"servers": servers}, servers]))})
    if draw(st.booleans()):  # a duplicate key, as a hand-edited file has it
        text = text.replace("{", '{"mcpServers": {}, ', 1)
    return text


def _assert_in_range(config: Config) -> None:
    policies = [getattr(config, s) for s in (*POLICY_SECTIONS, *GLOBAL_SECTIONS)]
    policies += [getattr(spec, s) for spec in config.servers for s in POLICY_SECTIONS]
    for policy in policies:
        for f in dataclasses.fields(policy):
            value = getattr(policy, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                low, high = knob_range(type(policy), f.name)
                assert math.isfinite(value) and low is not None and high is not None and low <= value <= high, f.name
    template = config.gateway.tool_name_template
    assert template.format(server="s", tool="t1") != template.format(server="s", tool="t2")
    for spec in config.servers:
        assert spec.name.strip() and spec.name.isprintable()
        assert spec.cwd is None or Path(spec.cwd).is_dir()
        # Accepted means it can run: every text can be given to a process, every header sent, every URL opened.
        for text in (spec.command or "", *spec.args, *spec.env, *spec.env.values()):
            text.encode()
        assert all(v.isascii() and k.isascii() for k, v in spec.headers.items())
        if spec.url is not None:
            httpx2.URL(spec.url)


_CODEX_VALUE = st.one_of(_KNOB_VALUE, st.lists(st.one_of(_TEXT, st.integers()), max_size=2))
_CODEX_KEYS = [
    *("args", "env_vars", "cwd", "enabled", "tool_timeout_sec", "startup_timeout_sec", "startup_timeout_ms"),
    *("enabled_tools", "disabled_tools", "bearer_token_env_var", "scopes", "required", "bogus"),
]


@st.composite
def _codex_configs(draw: st.DrawFn) -> str:
    """Codex's config.toml: [mcp_servers.NAME] tables with its keys, any value."""
    lines = ['model = "gpt-5"']
    for server in draw(st.lists(st.sampled_from(["a", "b", "", "x y", "\u202e"]), max_size=2, unique=True)):
        lines.append(f"[mcp_servers.{json.dumps(server)}]")
        lines.append(draw(st.sampled_from(['command = "x"', 'url = "http://h/mcp"', 'url = "ftp://h"', "enabled = true"])))
        for key in draw(st.lists(st.sampled_from(_CODEX_KEYS), max_size=4, unique=True)):
            value = draw(_CODEX_VALUE)
            lines.append(f"{key} = {json.dumps(value) if isinstance(value, list) else _toml_value(value)}")
        if draw(st.booleans()):
            lines.append(f"[mcp_servers.{json.dumps(server)}.env_http_headers]")
            lines.append(f'"X-A" = {_toml_value(draw(_KNOB_VALUE))}')
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=st.one_of(_toml_configs(), _json_configs(), _codex_configs()), suffix=st.sampled_from([".toml", ".json"]))
def test_property_any_config_is_a_clear_error_or_in_range(tmp_path: Path, text: str, suffix: str) -> None:
    """Whatever is written, loading it gives a ConfigError naming the file and the fix, or a config in range."""
    path = tmp_path / f"generated{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        config = load_config(path, environ={})
    except ConfigError as exc:
        assert str(path) in str(exc) and "fix:" in str(exc), str(exc)
        return
    _assert_in_range(config)


# ---- the CLI: config check, status and serve alike: exit 2, one clear error, no traceback -----------

CLI_CASES = ["nan.toml", "mysql.toml", "template-unknown.toml", "latin1.json", "dup.json"]


def _breakwater(tmp_path: Path, config: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    """`breakwater COMMAND --config CONFIG`, piped, its files in `tmp_path`."""
    env = {**os.environ, "BREAKWATER_ADMISSION_DIR": str(tmp_path / "adm"), "XDG_CACHE_HOME": str(tmp_path / "c")}
    env.pop("BREAKWATER_JOURNAL", None)  # the test session turns the journal off; here the file's url must count
    return subprocess.run(
        [sys.executable, "-m", "breakwater", *command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_refuses_bad_config_with_exit_2(tmp_path: Path, name: str) -> None:
    """`config check`, `status` and `serve` refuse the same file the same way: exit 2, the error, no traceback."""
    content = next(c for n, c, _ in BAD_CONFIGS if n == name)
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for command in (["config", "check"], ["status", "--wait", "1"], ["serve"]):
        result = _breakwater(tmp_path, path, command)
        assert result.returncode == 2, (command, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == ""
        lines = result.stderr.strip().splitlines()
        # One error line (file, key, value), then its fix.
        assert len(lines) == 2 and lines[0].startswith("breakwater: config error: ") and lines[1].lstrip().startswith("fix:")
        assert str(path) in lines[0]


# What a store's client refuses in its URL, found as the store opens (and by `config check`): reading the config does
# not load the clients (~0.1 s each, for every command and attaching session).
STORE_URLS = [
    ("state", "redis://127.0.0.1:9/0?socket_timeout=abc", "Invalid value for 'socket_timeout'"),  # a traceback out of serve
    ("state", "redis://127.0.0.1:9/0?foo=bar", "option 'foo' is not one the client reads"),  # degraded for good
    ("state", "unix:///tmp/r.sock?db=abc", "Invalid value for 'db'"),
    ("journal", "postgresql://u:Pw9xQ@127.0.0.1:9/db?foo=1", 'invalid URI query parameter: "foo"'),  # unrecorded for good
]


@pytest.mark.parametrize(("section", "url", "said"), STORE_URLS, ids=[u for _, u, _ in STORE_URLS])
def test_a_store_url_its_client_refuses_is_a_config_error(tmp_path: Path, section: str, url: str, said: str) -> None:
    """`config check` exits 2 naming the file, the key and the fix; `serve` and `status` too for the state store, which
    the gateway cannot run without as configured; the journal is optional: calls go on, and its trouble names the fix."""
    path = tmp_path / "breakwater.toml"
    path.write_text(f'[{section}]\nurl = "{url}"\n[servers.a]\ncommand = "true"\n')
    commands = [["config", "check"]] + ([["status", "--wait", "1"], ["serve", "--no-share"]] if section == "state" else [])
    for command in commands:
        result = _breakwater(tmp_path, path, command)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (command, result.stderr)
        first, fix = result.stderr.strip().splitlines()[-2:]
        assert first.startswith(f"breakwater: config error: {path}: {section}.url") and said in first, (command, first)
        assert fix.lstrip().startswith("fix:") and "Pw9xQ" not in result.stderr, (command, result.stderr)


def test_serve_refuses_weak_token_on_reachable_listener(tmp_path: Path) -> None:
    """A one-character token on 0.0.0.0 is refused before anything listens, exit 2."""
    path = tmp_path / "a.json"
    path.write_text(_json({"a": OK}))
    result = subprocess.run(
        [sys.executable, "-m", "breakwater", "serve", "--config", str(path), "--http", "0.0.0.0:0", "--token", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert result.returncode == 2 and "could be guessed" in result.stderr and "Traceback" not in result.stderr


# ---- launch modes: whatever stdin is, serve ends cleanly at its end; signals stop it, upstreams too ----


def _serve_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "BREAKWATER_ADMISSION_DIR": str(tmp_path / "adm"),
        "BREAKWATER_CATALOG_DIR": str(tmp_path / "catalog"),
        "BREAKWATER_CONNECT_STARTUP_JITTER_S": "0",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


def _serve_config(tmp_path: Path) -> Path:
    from breakwater.testing.server import launch_command

    command = launch_command("--tool", "echo:latency=0", "--state-file", str(tmp_path / "upstream.json"))
    path = tmp_path / "mcp.json"
    path.write_text(_json({"t": {"command": command[0], "args": command[1:]}}))
    return path


def _upstream_pid(tmp_path: Path, timeout: float = 30.0) -> int:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(json.loads((tmp_path / "upstream.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise AssertionError("the upstream never started")


def _serve_with_stdin(tmp_path: Path, stdin: Any, *, pass_fds: tuple[int, ...] = (), preexec: Any = None) -> tuple[int, str, str]:
    result = subprocess.run(
        [sys.executable, "-m", "breakwater", "serve", "--config", str(_serve_config(tmp_path))],
        stdin=stdin,
        capture_output=True,
        timeout=60,
        env=_serve_env(tmp_path),
        pass_fds=pass_fds,
        preexec_fn=preexec,
        check=False,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def test_serve_with_stdin_dev_null_ends_cleanly(tmp_path: Path) -> None:
    """`breakwater serve </dev/null | cat`: no hang, no traceback, exit 0 (systemd, containers without -i, CI)."""
    code, out, err = _serve_with_stdin(tmp_path, subprocess.DEVNULL)
    assert code == 0 and "Traceback" not in err and out == ""


def test_serve_with_stdin_a_regular_file_answers_then_ends(tmp_path: Path) -> None:
    """A file of requests (`serve <requests.jsonl`, as `nohup` gives) is read and served, and its end ends the session.

    The end of input is the MCP stdio shutdown, so requests still in flight then are not waited for;
    initialize is answered at once.
    """
    requests = tmp_path / "requests.jsonl"
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    requests.write_text("".join(json.dumps(m) + "\n" for m in (INITIALIZE, INITIALIZED, tools_list)))
    with requests.open("rb") as f:
        code, out, err = _serve_with_stdin(tmp_path, f)
    assert code == 0 and "Traceback" not in err
    ids = [json.loads(line).get("id") for line in out.splitlines()]
    assert 1 in ids


def test_serve_with_stdin_closed_ends_cleanly(tmp_path: Path) -> None:
    """A closed stdin (`serve <&-`) reads as an ended input: exit 0, no traceback."""
    code, _, err = _serve_with_stdin(tmp_path, None, preexec=lambda: os.close(0))
    assert code == 0 and "Traceback" not in err


def test_serve_on_a_tty_answers_and_ends_at_eof(tmp_path: Path) -> None:
    """On a terminal, requests are answered and Ctrl-D (end of input) ends the session with exit 0."""
    import pty
    import termios
    import time

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO  # no echo: the terminal's output is not under test
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "serve", "--config", str(_serve_config(tmp_path))],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_serve_env(tmp_path),
    )
    os.close(slave)
    try:
        os.write(master, (json.dumps(INITIALIZE) + "\n").encode())
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert json.loads(first)["id"] == 1
        time.sleep(0.2)
        os.write(master, b"\x04")  # Ctrl-D on an empty line: end of input
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_signal_ends_serve_cleanly_and_stops_upstreams(tmp_path: Path, signum: str) -> None:
    """SIGTERM (exit 0) or SIGINT (exit 130, as a Ctrl-C anywhere) mid-session: no traceback, the upstream process is gone."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "serve", "--config", str(_serve_config(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_serve_env(tmp_path),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        upstream = _upstream_pid(tmp_path)
        proc.send_signal(getattr(signal, signum))
        assert proc.wait(timeout=30) == (130 if signum == "SIGINT" else 0)
        assert b"Traceback" not in proc.stderr.read()
        import time

        deadline = time.monotonic() + 10
        while alive(upstream) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(upstream), "the upstream outlived the gateway"
    finally:
        if proc.poll() is None:
            proc.kill()


# ---- every request with an id gets an answer: the JSON-RPC error the spec names, and the session goes on ----

TOOLS_CALL = {"name": "t__echo", "arguments": {}}


def _call(request_id: int | str, params: bytes) -> bytes:
    """A tools/call of t__echo, written by hand (json.dumps cannot write what JSON does not have)."""
    head = b'{"jsonrpc":"2.0","id":%s,"method":"tools/call",' % json.dumps(request_id).encode()
    return head + b'"params":{"name":"t__echo",' + params + b"}}"


# (what is sent, the id the answer must carry, the error code, a word the message must hold)
FRAMES: list[tuple[str, bytes, Any, int, str]] = [
    ("before-initialize", b'{"jsonrpc":"2.0","id":"early","method":"tools/list"}', "early", -32602, "initialize"),
    ("batch", b'[{"jsonrpc":"2.0","id":10,"method":"ping"}]', None, -32600, "batch"),
    ("no-jsonrpc", b'{"id":11,"method":"ping"}', 11, -32600, "jsonrpc"),
    ("jsonrpc-1.0", b'{"jsonrpc":"1.0","id":12,"method":"ping"}', 12, -32600, "2.0"),
    ("params-string", b'{"jsonrpc":"2.0","id":13,"method":"tools/list","params":"abc"}', 13, -32602, "object"),
    ("float-id", b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', None, -32600, "id"),
    ("null-id", b'{"jsonrpc":"2.0","id":null,"method":"ping"}', None, -32600, "id"),
    ("bool-id", b'{"jsonrpc":"2.0","id":true,"method":"ping"}', None, -32600, "id"),
    ("invalid-utf8", b'{"jsonrpc":"2.0","id":15,"method":"ping","params":{"x":"\xff\xfe"}}', None, -32700, "UTF-8"),
    ("not-json", b"{not json", None, -32700, "JSON"),
    ("scalar", b"5", None, -32600, "object"),
    # JSON has no NaN or Infinity, though Python's and pydantic's parsers take them: a parse error, with the id.
    ("nan", _call(30, b'"arguments":{"x":NaN}'), 30, -32700, "NaN"),
    ("infinity", _call("31", b'"arguments":{"x":[1,Infinity]}'), "31", -32700, "Infinity"),
    ("minus-infinity", b'{"jsonrpc":"2.0","id":32,"method":"ping","params":{"_meta":{"x":-Infinity}}}', 32, -32700, "-Infinity"),
    ("nan-deadline", _call(33, b'"_meta":{"io.breakwater/deadlineMs":NaN}'), 33, -32700, "NaN"),
    ("nan-and-bad", b'{"jsonrpc":"1.0","id":34,"method":"ping","params":{"x":NaN}}', 34, -32700, "NaN"),
    ("method-number", b'{"jsonrpc":"2.0","id":21,"method":5}', 21, -32600, "method"),
    ("unknown-method", b'{"jsonrpc":"2.0","id":17,"method":"nope/x"}', 17, -32601, "not found"),
    ("bad-params", b'{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":5}}', 18, -32602, "name"),
    ("missing-param", b'{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{}}', 23, -32602, "name"),
    (
        "deep",
        b'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"t__echo","arguments":{"a":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}}",
        None,
        -32600,
        "nested",
    ),
]


_UNREAD: weakref.WeakKeyDictionary[subprocess.Popen[bytes], bytearray] = weakref.WeakKeyDictionary()


def _read_answer(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> dict[str, Any]:
    """The next answer on `serve`'s stdout; the gateway's own notifications (its lists changed) may come between."""
    import select

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    unread = _UNREAD.setdefault(proc, bytearray())
    deadline = time.monotonic() + timeout
    while True:
        while (end := unread.find(b"\n")) < 0:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "no answer: the request was dropped"
            chunk = os.read(fd, 1 << 20)
            assert chunk, "the session ended"
            unread += chunk
        message: dict[str, Any] = json.loads(bytes(unread[:end]))
        del unread[: end + 1]
        if "id" in message or "method" not in message:
            return message


def test_every_request_gets_the_json_rpc_error_the_spec_names(tmp_path: Path) -> None:
    """Raw bytes on `breakwater serve`'s stdin: each malformed request is answered with its code and a reason."""
    from breakwater._wire import DEADLINE_META_KEY

    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "serve", "--config", str(_serve_config(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_serve_env(tmp_path),
    )
    assert proc.stdin is not None and proc.stderr is not None

    def send(data: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(data + b"\n")
        proc.stdin.flush()

    try:
        first, *rest = FRAMES
        wrong: list[str] = []
        for name, data, request_id, code, word in [first, ("init", json.dumps(INITIALIZE).encode(), 1, 0, ""), *rest]:
            send(data)
            if name == "init":
                assert "result" in _read_answer(proc)
                send(json.dumps(INITIALIZED).encode())
                continue
            answer = _read_answer(proc)
            error = answer.get("error", {})
            explained = word.lower() in error.get("message", "").lower()
            if answer.get("id") != request_id or error.get("code") != code or not explained:
                wrong.append(f"{name}: {answer}")
        # Over the 64 MiB line cap: an error, not silence, and the rest of the line is skipped.
        send(b'{"jsonrpc":"2.0","id":24,"method":"ping","params":{"x":"' + b"a" * (65 * 1024 * 1024) + b'"}}')
        oversized = _read_answer(proc, timeout=60)
        assert oversized["error"]["code"] == -32600 and "bytes" in oversized["error"]["message"]
        # Invalid _meta deadlines are refused as invalid arguments, not ignored.
        for i, deadline in enumerate([-5, "abc", 1e300]):
            params: dict[str, Any] = {**TOOLS_CALL, "_meta": {DEADLINE_META_KEY: deadline}}
            send(json.dumps({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call", "params": params}).encode())
            result = _read_answer(proc, timeout=30)["result"]
            if not (result.get("isError") and result["structuredContent"]["code"] == "INVALID_ARGUMENTS"):
                wrong.append(f"deadline {deadline!r}: {result}")
        # 1e999 is JSON, but no double holds it (it parses as infinity): refused as an argument, naming it.
        send(_call(111, b'"arguments":{"x":{"y":[1e999]}}'))
        overflow = _read_answer(proc, timeout=30)
        body = overflow.get("result", {}).get("structuredContent", {})
        if (overflow.get("id"), body.get("code"), body.get("field")) != (111, "INVALID_ARGUMENTS", "x.y[0]"):
            wrong.append(f"1e999: {overflow}")
        # A notification holding NaN is dropped (JSON-RPC answers none); the words NaN and Infinity in a string pass.
        send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":NaN}}')
        words = {**TOOLS_CALL, "arguments": {"text": "NaN, Infinity and -Infinity"}}
        send(json.dumps({"jsonrpc": "2.0", "id": 110, "method": "tools/call", "params": words}).encode())
        echoed = _read_answer(proc, timeout=30)
        if echoed.get("id") != 110 or echoed["result"].get("isError"):
            wrong.append(f"NaN in a string: {echoed}")
        # The session survived all of it.
        send(b'{"jsonrpc":"2.0","id":99,"method":"ping"}')
        assert _read_answer(proc) == {"jsonrpc": "2.0", "id": 99, "result": {}}
        assert wrong == []
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


# ---- HTTP: an Origin on another port of this host is refused; the bearer scheme is case-insensitive ----


@pytest.mark.anyio
async def test_http_origin_port_and_bearer_scheme_case(tmp_path: Path) -> None:
    """`Origin: http://127.0.0.1:1` is refused (403) though the host is loopback; `bearer` in lower case is accepted;
    the malformed requests stdio answers get the same JSON-RPC errors over HTTP (400, 413), and the session goes on."""
    import anyio
    import httpx2

    path = tmp_path / "mcp.json"
    path.write_text(_json({}))
    port_file = tmp_path / "port"
    token = "7f3a9c2e1d5b4a6f8e0c"
    serve = [sys.executable, "-m", "breakwater", "serve", "--config", str(path), "--http", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*serve, "--port-file", str(port_file), "--token", token],
        env=_serve_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text():
                await anyio.sleep(0.1)
        port = int(port_file.read_text())
        url = f"http://127.0.0.1:{port}/mcp"
        async with httpx2.AsyncClient() as http:
            auth = {"authorization": f"Bearer {token}"}
            for origin in ("http://127.0.0.1:1", f"http://localhost:{port + 1}", "http://[::1]:1"):
                refused = await http.post(url, json=body, headers={**headers, **auth, "origin": origin})
                assert refused.status_code == 403, origin
            same = await http.post(url, json=body, headers={**headers, **auth, "origin": f"http://127.0.0.1:{port}"})
            assert same.status_code != 403
            for scheme in ("bearer", "BEARER", "Bearer ", "bEaReR"):
                answer = await http.post(url, json=body, headers={**headers, "authorization": f"{scheme} {token}"})
                assert answer.status_code != 401, scheme
            wrong = await http.post(url, json=body, headers={**headers, "authorization": f"bearer {token}x"})
            assert wrong.status_code == 401
            page = await http.get(f"http://127.0.0.1:{port}/api/status", headers={"authorization": f"bearer {token}"})
            assert page.status_code == 200
            await _http_frames_get_their_errors(http, url, {**headers, "authorization": f"Bearer {token}"})
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _http_answer(response: Any) -> dict[str, Any]:
    """The JSON-RPC message of a response: a JSON body, or the one `data:` line of an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = next(line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip())
        answer: dict[str, Any] = json.loads(data)
        return answer
    answer = response.json()
    return answer


async def _http_frames_get_their_errors(http: Any, url: str, headers: dict[str, str]) -> None:
    init = await http.post(url, content=json.dumps(INITIALIZE), headers=headers)
    session = {**headers, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, content=json.dumps(INITIALIZED), headers=session)
    # In the session, tools/call's own refusals come from the handler (200); framing errors are the spec's 400.
    handled = {"unknown-method", "bad-params", "missing-param"}
    wrong: list[str] = []
    for name, data, request_id, code, word in FRAMES[1:]:
        response = await http.post(url, content=data, headers=session)
        error = _http_answer(response).get("error", {})
        expected_status = 200 if name in handled else 400
        explained = word.lower() in error.get("message", "").lower()
        if (response.status_code, _http_answer(response).get("id"), error.get("code"), explained) != (
            expected_status,
            request_id,
            code,
            True,
        ):
            wrong.append(f"{name}: {response.status_code} {response.text[:200]}")
    oversized = await http.post(
        url, content=b'{"jsonrpc":"2.0","id":7,"method":"ping","x":"' + b"a" * (5 << 20) + b'"}', headers=session
    )
    answer = oversized.json()
    assert oversized.status_code == 413 and answer["error"]["code"] == -32600 and "byte" in answer["error"]["message"]
    after = await http.post(url, content=b'{"jsonrpc":"2.0","id":99,"method":"ping"}', headers=session)
    assert _http_answer(after) == {"jsonrpc": "2.0", "id": 99, "result": {}}
    assert wrong == []


@pytest.mark.parametrize(
    ("top", "meant"),
    [
        ('{"mcpServer": {"a": {"command": "x"}}}', ("mcpServer", "mcpServers")),
        ('{"MCPServers": {"a": {"command": "x"}}}', ("MCPServers", "mcpServers")),
        ('{"mcp_servers": {"a": {"command": "x"}}}', ("mcp_servers", "mcpServers")),
        ('{"server": {"a": {"command": "x"}}}', ("server", "servers")),
        ('{"contextServers": {"a": {"command": "x"}}}', ("contextServers", "context_servers")),
        ('{"mcp": {"server": {"a": {"command": "x"}}}}', ("mcp.server", "mcp.servers")),
    ],
)
def test_a_misspelt_table_of_servers_is_named_with_the_one_it_meant(tmp_path: Path, top: str, meant: tuple[str, str]) -> None:
    """`{"mcpServer": ...}` was told only `no "mcpServers" object`, as though the file held no servers."""
    path = tmp_path / "mcp.json"
    path.write_text(top)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    written, table = meant
    assert info.value.key == written and f'did you mean "{table}"?' in (info.value.fix or ""), info.value
    assert 'no "mcpServers" object' in info.value.detail and written in info.value.detail


def test_a_misspelt_table_of_a_toml_file_offers_codexs_too(tmp_path: Path) -> None:
    """`[mcp_server.x]` was offered breakwater's `servers` alone; Codex's `mcp_servers` is the nearer."""
    path = tmp_path / "config.toml"
    path.write_text('[mcp_server.a]\ncommand = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.key == "mcp_server" and info.value.fix == "did you mean 'mcp_servers'?"


@pytest.mark.parametrize(
    ("toml", "env", "path", "key", "says"),
    [
        ("", {"BREAKWATER_SEARCH_TOOL": "breakwater_status"}, "environment", "BREAKWATER_SEARCH_TOOL", "status_tool: the same"),
        ('[gateway]\nsearch_tool = "breakwater_status"\n', {}, "FILE", "gateway.search_tool", "status_tool: the same"),
        (
            '[gateway]\nstatus_tool = "breakwater_search_tools"\n',
            {"BREAKWATER_SEARCH_TOOL": "breakwater_search_tools"},
            "FILE",
            "gateway.status_tool",
            "search_tool is set by BREAKWATER_SEARCH_TOOL",
        ),
        ("", {"BREAKWATER_BREAKER_OPEN_BASE_S": "1000"}, "environment", "BREAKWATER_BREAKER_OPEN_BASE_S", "open_max_s (300"),
        (
            "[breaker]\nopen_base_s = 100\n",
            {"BREAKWATER_BREAKER_OPEN_MAX_S": "50"},
            "environment",
            "BREAKWATER_BREAKER_OPEN_MAX_S",
            "open_base_s is set by breaker.open_base_s in FILE",
        ),
    ],
)
def test_a_check_across_knobs_names_where_each_value_was_set(
    tmp_path: Path, toml: str, env: dict[str, str], path: str, key: str, says: str
) -> None:
    """`BREAKWATER_SEARCH_TOOL=breakwater_status` was `config error: status_tool: the same name as search_tool`: the
    checked knob, which nobody set, and neither the variable nor the file that made it so."""
    file = tmp_path / "breakwater.toml"
    file.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(file, environ=env)
    assert info.value.path == path.replace("FILE", str(file)) and info.value.key == key, info.value
    assert says.replace("FILE", str(file)) in info.value.detail, info.value
