"""breakwater's upstream side as the client the conformance suite tests (`conformance client --command`).

The suite starts a scenario server and runs `python tests/conformance/client.py URL` with
`MCP_CONFORMANCE_SCENARIO` (and, for some, `MCP_CONFORMANCE_CONTEXT`, e.g. pre-registered client
credentials) set. This program does what a user of breakwater does: it writes an `mcpServers` file
with that one HTTP server (the `oauth` object carrying what the context gives), signs in through
`breakwater auth login`'s code path where the scenario needs it (an HTTP client following the
authorization URL stands in for the browser: the scenario's authorization server approves without
a person), then connects with `Breakwater` on the stored tokens, lists the tools and calls each one.
A server that turns `auth_required` asking for more scope gets one more sign-in, as the message
tells a person to do. Tokens live in a token store under a temporary config directory.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx2

CIMD_URL = "https://conformance-test.local/client-metadata.json"
READY_WAIT_S = 20.0


def _oauth(scenario: str, context: dict[str, Any]) -> dict[str, Any] | None:
    if not scenario.startswith("auth/"):
        return None
    oauth: dict[str, Any] = {}
    if scenario.startswith("auth/client-credentials"):
        oauth = {"grantType": "client_credentials", "clientId": context["client_id"]}
        if "private_key_pem" in context:
            oauth["privateKey"] = context["private_key_pem"]
            oauth["signingAlgorithm"] = context.get("signing_algorithm", "ES256")
        else:
            oauth["clientSecret"] = context["client_secret"]
        return oauth
    if context.get("client_id"):
        oauth["clientId"] = context["client_id"]
        if context.get("client_secret"):
            oauth["clientSecret"] = context["client_secret"]
    if scenario == "auth/basic-cimd":
        oauth["clientMetadataUrl"] = CIMD_URL
    return oauth


async def _browser(url: str) -> None:
    """Follow the authorization URL to the loopback redirect, as a browser would."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=10) as http:
        await http.get(url)


async def _elicit_defaults(_ctx: Any, params: Any) -> Any:
    """Accept an elicitation with every default the requested schema gives."""
    from mcp import types

    schema = getattr(params, "requested_schema", None) or {}
    content = {k: v["default"] for k, v in schema.get("properties", {}).items() if isinstance(v, dict) and "default" in v}
    return types.ElicitResult(action="accept", content=content)


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type", "string") if isinstance(prop, dict) else "string"
        args[name] = 1 if kind in ("number", "integer") else True if kind == "boolean" else "test"
    return args


async def _until_ready(bw: Any) -> bool:
    """Wait for the one server to be ready (a failed one retries in the background); False on time-out."""
    from breakwater.status import ServerState

    with anyio.move_on_after(READY_WAIT_S):
        while bw.status().servers[0].state is not ServerState.READY:
            await bw.wait_changed()
        return True
    return False


async def _use(config: Any, scenario: str) -> int:
    from breakwater import Breakwater
    from breakwater.auth import ServerTokens, TokenStore
    from breakwater.auth._login import sign_in

    spec = config.server("conf")
    tokens = ServerTokens(TokenStore(), spec.url)

    def hooks(_spec: Any) -> dict[str, Any]:
        return {"elicitation_callback": _elicit_defaults}

    async with Breakwater(config, journal=None, client_hooks=hooks) as bw:
        for _ in range(3):
            if not await _until_ready(bw):
                print(f"not ready: {bw.status().servers[0].error}", file=sys.stderr)
                return 1
            step_up = False
            for tool in list(bw.upstream("conf").tools):
                if scenario == "elicitation-sep1034-client-defaults" and "elicit" not in tool.name.lower():
                    continue
                args = {} if scenario in ("sse-retry", "elicitation-sep1034-client-defaults") else _arguments(tool.input_schema)
                result = await bw.call_tool("conf", tool.name, args)
                print(f"{tool.name}: {'error' if result.is_error else 'ok'}", file=sys.stderr)
                if result.is_error and tokens.needed_scope():
                    step_up = True  # the server wants more scope: sign in again, as the status says to
                    break
            if not step_up:
                return 0
            await sign_in(spec, TokenStore(), browser=_browser)
        return 1


async def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    home = Path(tempfile.mkdtemp(prefix="bw-conformance-"))
    os.environ["XDG_CONFIG_HOME"] = str(home / "config")  # a fresh token store for this run
    os.environ.setdefault("BREAKWATER_PROTOCOL", "2025-11-25")  # the revision the scenarios speak
    os.environ["BREAKWATER_CONNECT_STARTUP_JITTER_S"] = "0"
    os.environ["BREAKWATER_CONNECT_BACKGROUND_RETRY_S"] = "0.2"
    os.environ["BREAKWATER_ADMISSION_DIR"] = str(home / "admission")
    entry: dict[str, Any] = {"type": "http", "url": url}
    oauth = _oauth(scenario, context)
    if oauth is not None:
        entry["oauth"] = oauth
    path = home / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"conf": entry}}))

    from breakwater.auth import TokenStore
    from breakwater.auth._login import sign_in
    from breakwater.config import load_config

    config = load_config(path)
    spec = config.server("conf")
    if spec.oauth is not None and spec.oauth.grant_type == "authorization_code":
        done = await sign_in(spec, TokenStore(), browser=_browser)
        print(f"signed in: scopes={done.scopes!r} tools={done.tools}", file=sys.stderr)
    return await _use(config, scenario)


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1]))
