"""`headersHelper`: request headers from a command, as Claude Code runs it.

The entry's `headersHelper` is a shell command line; its standard output must be a JSON object of
header names to string values. Like Claude Code, breakwater runs it in a shell with a 10 s limit,
with `CLAUDE_CODE_MCP_SERVER_NAME` and `CLAUDE_CODE_MCP_SERVER_URL` in its environment (so helpers
written for Claude Code work unchanged), and its headers win over the entry's static ones. It runs
at each connect (the first request of a connection), and again when the server answers 401: the
request is sent once more with the fresh headers. Its output is a secret: every value is registered
for redaction, and no error quotes it (nor its standard error, which may echo a token).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import httpx2
from anyio.abc import Process

from breakwater._clock import Clock
from breakwater.config import ServerSpec
from breakwater.config._checks import check_header
from breakwater.config._redact import header_secrets, register_secrets
from breakwater.connect._environment import without_own_variables
from breakwater.errors import ConfigError

__all__ = ["HELPER_TIMEOUT_S", "HeadersHelperAuth", "HeadersHelperError", "run_headers_helper"]

#: Claude Code's limit for one run of the helper.
HELPER_TIMEOUT_S = 10.0
#: More output than any set of headers: the helper is cut off past it.
_MAX_OUTPUT = 256 * 1024


class HeadersHelperError(Exception):
    """The helper did not produce headers; the message says why, never what it printed."""


def _kill(process: Process) -> None:
    # The shell's children too: `sh -c "slow-tool"` may leave the tool holding the pipe.
    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass


async def _output(command: str, *, env: dict[str, str], cwd: str | None, clock: Clock, timeout_s: float) -> tuple[int, bytes]:
    process = await anyio.open_process(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    out = bytearray()
    try:
        with clock.deadline_scope(clock.monotonic() + timeout_s) as scope:
            assert process.stdout is not None
            async for chunk in process.stdout:
                out += chunk
                if len(out) > _MAX_OUTPUT:
                    raise HeadersHelperError(f"printed more than {_MAX_OUTPUT // 1024} KiB")
            code = await process.wait()
        if scope.cancelled_caught:
            raise HeadersHelperError(f"did not finish within {timeout_s:g} s")
        return code, bytes(out)
    finally:
        if process.returncode is None:
            _kill(process)
        with anyio.CancelScope(shield=True):
            await process.aclose()


async def run_headers_helper(spec: ServerSpec, *, clock: Clock, timeout_s: float = HELPER_TIMEOUT_S) -> dict[str, str]:
    """Run `spec`'s helper once; its headers (each value registered as a secret), or HeadersHelperError."""
    command = spec.headers_helper or ""
    env = without_own_variables(os.environ)  # the gateway's token is not the helper's
    env.update(CLAUDE_CODE_MCP_SERVER_NAME=spec.name, CLAUDE_CODE_MCP_SERVER_URL=spec.url or "")
    # Where Claude Code would run it: the project folder, the one holding the config file.
    cwd = str(Path(spec.source).resolve().parent) if spec.source else None
    fix = f"run it yourself to see why: {command}"
    try:
        code, out = await _output(command, env=env, cwd=cwd, clock=clock, timeout_s=timeout_s)
    except OSError as exc:
        raise HeadersHelperError(f"the headersHelper could not start: {exc.strerror or exc}") from None
    except HeadersHelperError as exc:
        raise HeadersHelperError(f"the headersHelper {exc}; {fix}") from None
    if code != 0:
        raise HeadersHelperError(f"the headersHelper exited with code {code}; {fix}")
    try:
        headers = json.loads(out.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise HeadersHelperError('the headersHelper did not print a JSON object (e.g. {"Authorization": "Bearer ..."})') from None
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise HeadersHelperError("the headersHelper must print a JSON object of header names to string values")
    # Secrets before any check can fail and quote them.
    register_secrets(s for value in headers.values() for s in header_secrets(value))
    for name, value in headers.items():
        try:
            check_header(name, value, path=None, key=name)
        except ConfigError as exc:
            raise HeadersHelperError(f"the headersHelper printed an invalid header: {exc.detail}") from None
    return headers


class HeadersHelperAuth(httpx2.Auth):
    """Sets the helper's headers on every request; on a 401, runs the helper again and resends once.

    Runs the helper lazily, at the first request of a connection; concurrent 401s run it once.
    """

    def __init__(self, spec: ServerSpec, *, clock: Clock) -> None:
        """`clock` bounds each run of the helper."""
        self._spec = spec
        self._clock = clock
        self._headers: dict[str, str] | None = None
        self._generation = 0
        self._lock = anyio.Lock()
        #: How many times the helper ran (for status and tests).
        self.runs = 0

    async def _fresh(self, seen: int) -> tuple[dict[str, str], int]:
        async with self._lock:
            if self._headers is None or self._generation == seen:
                self._headers = await run_headers_helper(self._spec, clock=self._clock)
                self._generation += 1
                self.runs += 1
            return self._headers, self._generation

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """httpx2's hook: the helper's headers on `request`, and one resend with fresh ones after a 401."""
        if self._headers is None:
            headers, generation = await self._fresh(-1)
        else:
            headers, generation = self._headers, self._generation
        request.headers.update(headers)
        response = yield request
        if response.status_code == 401:
            headers, _ = await self._fresh(generation)
            request.headers.update(headers)
            yield request
