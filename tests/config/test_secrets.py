"""A planted secret never appears in anything breakwater writes: outputs, errors, logs, caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from breakwater.testing.server import launch_command, serve_http
from helpers import run_breakwater

pytestmark = [pytest.mark.long_module(92), pytest.mark.anyio]

SECRET = "sk-planted-7f3a9c2e1d"


def everything_written(root: Path) -> str:
    """The text of every file under `root`."""
    chunks = []
    for path in root.rglob("*"):
        if path.is_file():
            chunks.append(path.read_bytes().decode("utf-8", errors="replace"))
    return "\n".join(chunks)


async def test_planted_secret_never_leaks(tmp_path: Path) -> None:
    """Secrets in env, headers and a URL's query: not in status, tools, call, config check, gateway results, logs or caches."""
    state_dir = tmp_path / "state"
    env = dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(state_dir / "admission"),
        BREAKWATER_CATALOG_DIR=str(state_dir / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        XDG_CACHE_HOME=str(state_dir / "cache"),
    )
    async with serve_http("--status-first", "100000", "--status", "401") as locked:
        crash = launch_command("--exit-at-start", "1", "--exit-message", f"bad credentials: API_KEY={SECRET}")
        ok = launch_command("--tool", "echo:latency=0")
        servers: dict[str, Any] = {
            "crashy": {"command": crash[0], "args": crash[1:], "env": {"API_KEY": SECRET}},
            "fine": {"command": ok[0], "args": ok[1:], "env": {"API_KEY": SECRET}},
            "locked": {"type": "http", "url": f"{locked.url}?token={SECRET}", "headers": {"Authorization": f"Bearer {SECRET}"}},
        }
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": servers}))
        outputs: list[str] = []
        for command in (
            ["status", "--json", "--wait", "15"],
            ["status", "--wait", "5"],
            ["tools", "--json", "--wait", "5"],
            ["tools", "echo", "--wait", "5"],
            ["call", "fine", "echo", "--wait", "15"],
            ["call", "crashy", "anything", "--wait", "5"],
            ["call", "locked", "anything", "--wait", "5", "--json"],
            ["config", "check"],
            ["config", "check", "--json"],
        ):
            result = subprocess.run(
                [sys.executable, "-m", "breakwater", *command, "--config", str(config)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )
            outputs += [result.stdout, result.stderr]
        # The reasons are there, just not the secret.
        assert any("auth_required" in o for o in outputs) and any("bad credentials" in o for o in outputs)

        stderr_log = tmp_path / "gateway-stderr.log"
        with stderr_log.open("w") as errfile:
            params = StdioServerParameters(
                command=sys.executable, args=["-m", "breakwater", "serve", "--config", str(config)], env=env
            )
            async with Client(stdio_client(params, errlog=errfile)) as client:
                with anyio.fail_after(30):
                    while True:
                        status = await client.call_tool("breakwater_status", {})
                        summary = (status.structured_content or {})["summary"]
                        if summary.get("ready") == 1 and summary.get("failed", 0) + summary.get("retrying", 0) >= 2:
                            break
                        await anyio.sleep(0.2)
                for name, args in (
                    ("crashy__anything", {}),
                    ("locked__anything", {}),
                    ("fine__echo", {"payload": "hello"}),
                    ("breakwater_search_tools", {"query": "anything"}),
                    ("breakwater_status", {}),
                ):
                    outputs.append((await client.call_tool(name, args)).model_dump_json())
        outputs.append(stderr_log.read_text())
    leaks = [
        o[max(0, o.find(SECRET) - 300) : o.find(SECRET) + 50] for o in [*outputs, everything_written(state_dir)] if SECRET in o
    ]
    assert leaks == []


# ---- secrets in every form: no 8-character run of any configured secret reaches an output -------

#: Secrets of several shapes, each planted once in the config and leaked by the upstream in a
#: stripped form (no prefix, no scheme, a fragment) that the old exact-value redaction missed.
PLANTED = {
    "plain": "q7Rv2KxP9mLw4TzA",  # an env value with no recognisable prefix
    "sk": "sk-live-5Jd8Wq2Nf7Hc3Xb1",  # an API key, leaked without its sk- prefix
    "bearer": "tok_9Pz3Lm7Qr2Vx8Kc4",  # a header "Bearer X", leaked as X
    "userinfo": "pw-Hq4Ns8Dv2Yj6Ft",  # a URL's password
    "query": "qs-Mc5Rb9Wk3Gp7Zs",  # a URL's query value
    "flag": "fl-Tx6Bn2Lq8Vd4Hr",  # the value after --api-key in args
    "assign": "as-Ke3Wm7Yp1Jc5Nq",  # API_TOKEN=X in args
}

LEAKY_SERVER = """
import sys
from mcp import MCPError
from mcp.server.mcpserver import MCPServer

LEAKS = sys.argv[1].split(",")
print("starting; credentials in use: " + " ".join(LEAKS), file=sys.stderr, flush=True)
mcp = MCPServer("leaky")


@mcp.tool()
async def leak() -> str:
    \"\"\"Fail with a JSON-RPC error that quotes every credential, stripped.\"\"\"
    raise MCPError(code=-32603, message="backend refused " + " / ".join(LEAKS))


@mcp.tool()
async def leak_tool_error() -> str:
    \"\"\"Fail as the tool's own error, quoting the credentials.\"\"\"
    raise ValueError("bad key " + " ".join(LEAKS))


mcp.run("stdio")
"""


def _fragments(secret: str) -> list[str]:
    return [secret[i : i + 8] for i in range(len(secret) - 7)]


def _leaks(outputs: list[str]) -> list[str]:
    found = []
    for name, secret in PLANTED.items():
        for fragment in _fragments(secret):
            for text in outputs:
                if fragment in text:
                    at = text.find(fragment)
                    found.append(f"{name}: {fragment!r} in ...{text[max(0, at - 80) : at + 40]}...")
    return found


def test_redactor_masks_every_eight_character_run() -> None:
    """A fragment of a secret, with or without its prefix, is masked; unrelated text is left alone."""
    from breakwater.config._redact import Redactor

    redact = Redactor(["sk-live-5Jd8Wq2Nf7Hc3Xb1", "tiny"])
    assert redact("key live-5Jd8Wq2Nf7 ok") == "key <redacted> ok"
    assert redact("Nf7Hc3Xb1") == "<redacted>"
    assert redact("a tiny thing") == "a <redacted> thing"
    assert redact("nothing secret here, live-5J") == "nothing secret here, live-5J"
    assert "5Jd8Wq2N" not in redact("sk-live-5Jd8Wq2Nf7Hc3Xb1sk-live-5Jd8Wq2Nf7Hc3Xb1")


def test_a_database_user_name_is_no_secret_and_its_password_is() -> None:
    """`postgresql://postgres@host/db` made "postgres" a secret: every such URL in a log read "<redacted>ql://..."."""
    from breakwater.config._redact import Redactor, url_secrets

    assert list(url_secrets("postgresql://postgres@127.0.0.1:5439/test")) == []
    assert list(url_secrets("postgresql://app:s3cret-pw@db.example/prod")) == ["s3cret-pw"]
    assert list(url_secrets("https://tok-9Xk2Lm4Qp7@h.example/mcp")) == ["tok-9Xk2Lm4Qp7"]  # a token as the user name
    shown = Redactor(url_secrets("postgresql://postgres@127.0.0.1:5439/test"))("cannot reach postgresql://127.0.0.1:5439/test")
    assert shown == "cannot reach postgresql://127.0.0.1:5439/test"


def test_a_file_path_is_no_url_whose_key_like_segments_are_masked() -> None:
    """A journal at `/tmp/pytest-7/test_config_check0/j.db` was printed by `config check` as `/tmp/pytest-7/<redacted>/j.db`:
    a segment of 16 or more letters and digits looks like a key in a web address (Zapier's), not in a file's path."""
    from breakwater.config._redact import url_secrets

    paths = ("/tmp/pytest-7/test_config_check0/j.db", "sqlite:////srv/a1b2c3d4e5f6a7b8c9d0/j.db", "j2026dec07backup_v1/x.db")
    for path in paths:
        assert list(url_secrets(path)) == [], path
    assert list(url_secrets("https://mcp.example.com/s/a1b2c3d4e5f6a7b8c9d0/sse")) == ["a1b2c3d4e5f6a7b8c9d0"]


def test_config_check_shows_the_journal_and_state_urls_without_their_credentials(tmp_path: Path) -> None:
    """`config check` printed `[journal] url` and `[state] url` as written, passwords and query values included."""
    (tmp_path / ".mcp.json").write_text('{"mcpServers": {"a": {"command": "echo"}}}')
    (tmp_path / "breakwater.toml").write_text(
        'servers_file = ".mcp.json"\n'
        f'[journal]\nurl = "postgresql://bob:{SECRET}@127.0.0.1:5432/test?sslkey=qs-7Hq2Lm9Xw4"\n'
        '[state]\nurl = "redis://127.0.0.1:6379/0"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BREAKWATER_JOURNAL")}  # the file's URL, not the suite's
    env["BREAKWATER_STATE_URL"] = "redis://:rd-4Tz8Kp2Qv6@127.0.0.1:6379/0"
    for extra in ([], ["--json"]):
        result = run_breakwater(env, "config", "check", *extra, "--config", str(tmp_path / "breakwater.toml"))
        assert result.returncode == 0, result.stderr
        assert "postgresql://bob:<redacted>@127.0.0.1:5432/test" in result.stdout  # what was understood, still shown
        assert "redis://:<redacted>@127.0.0.1:6379/0" in result.stdout
        for secret in (SECRET, "qs-7Hq2Lm9Xw4", "rd-4Tz8Kp2Qv6"):
            assert secret not in result.stdout, result.stdout


def test_a_web_address_in_a_secret_is_shown_and_its_credentials_are_not() -> None:
    """A URL-valued setting (`JIRA_URL=https://...`) hides its user-info, path, query and fragment, not its host.

    Masking its every 8-character run masked every `https://` the model read: a page the user had to
    open lost its address ("open <redacted>cal.example/auth?s=1")."""
    from breakwater.config._redact import Redactor

    webhook = "https://hooks.slack.com/services/T0AB12CD/B0EF34GH/x9Y8z7W6v5U4"
    redact = Redactor(["https://me.atlassian.net", webhook, "wss://bot:pw-Hq4Ns8Dv2Yj6@api.example.com:8443/v1?key=Mc5Rb9Wk"])
    for text in (
        "open https://cal.example/auth?s=1",
        "GET https://me.atlassian.net/rest/api failed",
        "wss://api.example.com:8443",
    ):
        assert redact(text) == text
    shown = redact(f"posting to {webhook} failed")
    assert shown.startswith("posting to https://hooks.slack.com") and shown.endswith(" failed")
    assert not any(webhook[i : i + 8] in shown for i in range(len("https://hooks.slack.com"), len(webhook) - 7))
    shown = redact("wss://bot:pw-Hq4Ns8Dv2Yj6@api.example.com:8443/v1?key=Mc5Rb9Wk")
    assert "pw-Hq4Ns" not in shown and "Ns8Dv2Yj" not in shown and "?key=Mc5" not in shown and "Mc5Rb9Wk" not in shown
    assert "%2Fservices%2FT0AB12" not in redact(f"next={webhook.replace('/', '%2F').replace(':', '%3A')}")
    # Not a web URL, only text holding "://": every run of it is masked, as before.
    assert Redactor(["token-for-https://s0.example/mcp"])("see https://docs.example") == "see <redacted>docs<redacted>"


def test_a_settings_word_is_no_secret() -> None:
    """`DEBUG=true`, `LOG_LEVEL=info`, `NODE_ENV=production`: every "true", "info" and "production" in every
    error was `<redacted>`. A setting's word is left alone; any other value, a number included, is not."""
    from breakwater.config._redact import Redactor

    redact = Redactor(["true", "INFO", "production", "3000", "trueblue", "sk-live-5Jd8Wq2Nf7Hc3Xb1"])
    shown = redact("debug is true, level info, NODE_ENV production, port 3000, trueblue, key live-5Jd8Wq2Nf7")
    assert shown == "debug is true, level info, NODE_ENV production, port <redacted>, <redacted>, key <redacted>"


def test_a_path_in_env_is_no_secret_and_a_credential_named_one_is(tmp_path: Path) -> None:
    """The README's macOS `PATH` in one entry masked every `/usr/bin` in every other server's error. A path list, or
    a path that is there, is shown; a variable named like a credential, or a key that merely starts with '/', is not."""
    from breakwater.config import load_config

    here = str(tmp_path)
    env = {"PATH": "/opt/homebrew/bin:/usr/bin:/bin", "WORKDIR": here, "API_KEY_FILE_PATH": here, "SEED": "/dGhpc2lzYXNlY3Jl"}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"s": {"command": "x", "env": env}}}))
    secrets = set(load_config(config, environ={}).server("s").secrets)
    assert "/opt/homebrew/bin:/usr/bin:/bin" not in secrets and here in secrets  # (the credential-named one)
    assert "/dGhpc2lzYXNlY3Jl" in secrets
    assert secrets == {here, "/dGhpc2lzYXNlY3Jl"}


def test_spec_secrets_cover_every_form(tmp_path: Path) -> None:
    """Env and header values, the token after the scheme, URL password and query, credential arguments."""
    from breakwater.config import load_config

    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "s": {
                        "command": "x",
                        "args": ["--api-key", "AAAA1111", "--token=BBBB2222", "API_SECRET=CCCC3333", "--verbose", "plain"],
                        "env": {"K": "DDDD4444"},
                    },
                    "h": {
                        "type": "http",
                        "url": "https://user:EEEE5555@h.test/mcp?key=FFFF6666&x=GGGG7777",
                        "headers": {"Authorization": "Bearer HHHH8888"},
                    },
                    # A headersHelper's command line: shown by config check, and quoted when it fails.
                    "k": {
                        "type": "http",
                        "url": "https://k.test/mcp",
                        "headersHelper": 'curl -s -H "Authorization: Bearer IIII9999" --api-key=JJJJ0000 https://t.test/?sig=KKKK1111',
                    },
                }
            }
        )
    )
    loaded = load_config(config, environ={})
    secrets = set(loaded.server("s").secrets) | set(loaded.server("h").secrets) | set(loaded.server("k").secrets)
    planted = ("AAAA1111", "BBBB2222", "CCCC3333", "DDDD4444", "EEEE5555", "FFFF6666", "GGGG7777", "HHHH8888")
    for value in (*planted, "IIII9999", "JJJJ0000", "KKKK1111"):
        assert value in secrets, value
    shown = loaded.server("k").describe()["headersHelper"]
    assert shown == 'curl -s -H "Authorization: <redacted>" --api-key=<redacted> https://t.test/?sig=<redacted>', shown
    assert "plain" not in secrets and "--verbose" not in secrets
    args = loaded.server("s").describe()["args"]
    assert args[:3] == ["--api-key", "<redacted>", "--token=<redacted>"] and args[4:] == ["--verbose", "plain"]


async def test_secrets_of_every_shape_never_leak(tmp_path: Path) -> None:
    """Planted secrets of seven shapes, leaked stripped by the upstream: no 8-character run in any output."""
    from breakwater import Breakwater
    from breakwater.config import load_config

    state_dir = tmp_path / "state"
    env = dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(state_dir / "admission"),
        BREAKWATER_CATALOG_DIR=str(state_dir / "catalog"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        XDG_CACHE_HOME=str(state_dir / "cache"),
    )
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY_SERVER)
    # What the upstream prints: each secret without its prefix, scheme or first characters.
    leaked = ",".join(
        ["q7Rv2KxP9mLw", "live-5Jd8Wq2Nf7", "9Pz3Lm7Qr2Vx8Kc4", "Hq4Ns8Dv2Yj6", "Mc5Rb9Wk3Gp7", "Tx6Bn2Lq8Vd4", "Ke3Wm7Yp1Jc5"]
    )
    crash = launch_command("--exit-at-start", "1", "--exit-message", f"auth failed for {leaked}")
    async with serve_http("--status-first", "100000", "--status", "401") as locked:
        servers: dict[str, Any] = {
            "leaky": {
                "command": sys.executable,
                "args": [str(script), leaked, "--api-key", PLANTED["flag"], f"API_TOKEN={PLANTED['assign']}"],
                "env": {"PLAIN": PLANTED["plain"], "OPENAI_API_KEY": PLANTED["sk"]},
            },
            "crashy": {"command": crash[0], "args": [*crash[1:], "--api-key", PLANTED["flag"]], "env": {"K": PLANTED["sk"]}},
            "locked": {
                "type": "http",
                "url": f"http://u:{PLANTED['userinfo']}@{locked.url.split('://')[1]}?key={PLANTED['query']}",
                "headers": {"Authorization": f"Bearer {PLANTED['bearer']}"},
            },
        }
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": servers}))
        outputs: list[str] = []
        commands = (["config", "check"], ["config", "check", "--json"], ["status", "--json", "--wait", "10"], ["tools", "--json"])
        for command in commands:
            result = subprocess.run(
                [sys.executable, "-m", "breakwater", *command, "--config", str(config)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )
            outputs += [result.stdout, result.stderr]
        assert any("auth failed" in o for o in outputs), "the reason is shown, only the secret is not"

        loaded = load_config(config, environ={"BREAKWATER_CONNECT_STARTUP_JITTER_S": "0", "BREAKWATER_JOURNAL": "off"})
        async with Breakwater(loaded, admission_dir=str(state_dir / "admission")) as bw:
            await bw.wait_ready(timeout=20)
            for server, tool in (("leaky", "leak"), ("leaky", "leak_tool_error"), ("crashy", "x"), ("locked", "x")):
                outputs.append((await bw.call_tool(server, tool, {})).model_dump_json())
            outputs.append(json.dumps(bw.status().to_json()))
    assert any("backend refused" in o for o in outputs)
    assert _leaks(outputs) == []


def test_keys_known_by_their_shape_are_secrets_wherever_they_stand(tmp_path: Path) -> None:
    """A GitHub token, an Anthropic key or a bare "Bearer X" in args was shown whole by `config check`."""
    config = tmp_path / "mcp.json"
    args = [
        "ghp_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2",
        "Bearer Zz9Yy8Xx7Ww6",
        "-c",
        "exec server --key-file=/k sk-ant-api03-Qq1Rr2Ss3Tt4",
        "AKIAIOSFODNN7EXAMPL3",
        "--verbose",
        "desk-management-console",
        "task-runner",
    ]
    config.write_text(json.dumps({"mcpServers": {"s": {"command": "x", "args": args}}}))
    from breakwater.config import load_config

    loaded = load_config(config, environ={})
    shown = " ".join(loaded.server("s").describe()["args"])
    for secret in ("Ab1Cd2Ef3Gh4", "Zz9Yy8Xx7Ww6", "Qq1Rr2Ss3Tt4", "IOSFODNN7EXAMPL3"):
        assert secret not in shown, shown
    assert "--verbose" in shown and "desk-management-console" in shown and "task-runner" in shown


#: Credentials written inside one argument or word, as JSON, YAML, a header, a query or after an auth scheme: each
#: command line (split as a shell splits it) and the secret in it.
EMBEDDED = {
    'echo \'{"Authorization": "Bearer Pt1Pt2Pt3Pt4Pt5"}\'; exit 3': "Pt1Pt2Pt3Pt4Pt5",
    'mcp-remote https://h.test/mcp --headers \'{"Authorization":"Bearer Aj1Aj2Aj3Aj4"}\'': "Aj1Aj2Aj3Aj4",
    "tool --cfg {'token':'Tk1Tk2Tk3Tk4'}": "Tk1Tk2Tk3Tk4",
    'tool \'{"api_key": "Ak1Ak2Ak3Ak4"}\'': "Ak1Ak2Ak3Ak4",
    'tool \'{"X-Custom": "Bearer lowercaseonlytoken"}\'': "lowercaseonlytoken",  # a whole quoted "Scheme X"
    "tool 'x-api-key: Xk1Xk2Xk3Xk4'": "Xk1Xk2Xk3Xk4",
    "tool --yaml 'server:\n  clientSecret: Cs1Cs2Cs3Cs4\n'": "Cs1Cs2Cs3Cs4",
    "sh -c \"curl -H 'X-Auth: Token Tt9Tt8Tt7Tt6' https://h.test/x\"": "Tt9Tt8Tt7Tt6",
    "sh -c 'connect --dsn host=db.test&password=Pw1Pw2Pw3Pw4&db=x'": "Pw1Pw2Pw3Pw4",
    "run 'login with passwd=Pd1Pd2Pd3Pd4 then'": "Pd1Pd2Pd3Pd4",
    "run 'Authorization:basic dXNlcjpwYXNzMTIz'": "dXNlcjpwYXNzMTIz",
    'tool "{\\"accessToken\\": \\"Ac1Ac2Ac3Ac4\\"}"': "Ac1Ac2Ac3Ac4",
}


@pytest.mark.parametrize("command", list(EMBEDDED))
def test_a_credential_inside_one_argument_is_a_secret(command: str) -> None:
    """`echo '{"Authorization": "Bearer X"}'` in a headersHelper and mcp-remote's `--headers {"Authorization": ...}`
    were shown whole: an auth scheme was looked for only as a whole argument, a credential's name only at its start."""
    from breakwater.config._redact import Redactor, arg_secrets, command_line_words

    secret = EMBEDDED[command]
    found = set(arg_secrets(command_line_words(command)))
    assert secret in found, found
    assert secret[:8] not in Redactor(found)(command)


def test_ordinary_text_inside_an_argument_is_no_secret() -> None:
    """A scheme's name or a credential-like word in prose, and names that only hold such a word, make no secret."""
    from breakwater.config._redact import embedded_secrets

    words = [
        "Use Token auth for basic things",
        "Bearer tokens are supported; see the docs",
        "mode: Basic usage",
        '{"keyboard": "us", "tokenizer": "gpt2", "monkeys": "many", "authors": "Jane Doe"}',
        "description: the session ends after an hour",
        "tool --hotkey=Ctrl+Space --author='Jane Doe'",
    ]
    found = {word: [s for s in embedded_secrets(word) if len(s) >= 4] for word in words}
    assert found == {word: [] for word in words}, found


def test_a_json_header_in_a_headers_helper_or_an_argument_never_leaks(tmp_path: Path) -> None:
    """The user's reproduction: `config check`, `config check --json` and `status` showed the bearer token whole."""
    config = tmp_path / "mcp.json"
    servers = {
        "h6": {
            "type": "http",
            "url": "http://127.0.0.1:9/mcp",
            "headersHelper": 'echo \'{"Authorization": "Bearer Pl4intok5678Zq"}\'; exit 3',
        },
        "s7": {
            "command": str(tmp_path / "no-such-mcp-remote"),
            "args": ["http://example.test/mcp", "--headers", '{"Authorization": "Bearer Ar9jsontok8765"}'],
        },
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    env = dict(os.environ, BREAKWATER_CONNECT_STARTUP_JITTER_S="0", XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["BREAKWATER_ADMISSION_DIR"] = str(tmp_path / "admission")
    outputs = []
    for command in (["config", "check"], ["config", "check", "--json"], ["status", "--wait", "3"], ["status", "--json"]):
        result = run_breakwater(env, *command, "--config", str(config), timeout=90)
        outputs += [result.stdout, result.stderr]
    shown = "\n".join(outputs)
    assert "exited with code 3" in shown, "the failure is still said"
    for secret in ("Pl4intok5678Zq", "Ar9jsontok8765"):
        assert not any(secret[i : i + 8] in shown for i in range(len(secret) - 7)), shown
