"""Why a connect failed, in words a person can act on: exceptions and exits become `status.Reason` codes.

A failed attempt surfaces as whatever the transport and the SDK raised (often an exception group
several levels deep), plus what the attempt saw on the side: the stdio process's exit code and
stderr tail, the last HTTP error status. `classify` turns that into one `ErrorInfo` whose code says
what to fix (`SPAWN_FAILED`: the command; `AUTH_REQUIRED`: the headers; `REFUSED`: nothing listening).
"""

from __future__ import annotations

import re
import ssl

import httpx2
from mcp import MCPError
from pydantic import ValidationError

from breakwater import _platform
from breakwater._wire import CONNECTION_CLOSED
from breakwater.auth import AuthNote
from breakwater.config import ServerSpec
from breakwater.config._redact import display_url
from breakwater.connect._headers_helper import HeadersHelperError
from breakwater.connect._stdio import StdioProcess
from breakwater.status import ErrorInfo, Reason

__all__ = ["STABLE_AFTER_S", "classify", "crashed_again", "describe", "exited", "lost_error", "repeated_exit", "timeout_error"]


def _leaves(exc: BaseException) -> list[BaseException]:
    """The leaf exceptions of a (possibly nested) exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def describe(exc: BaseException) -> str:
    """`TypeName: first line of the message`, for error messages."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def exited(process: StdioProcess | None) -> ErrorInfo | None:
    """`EXITED`, with the code and stderr tail, if the process ended on its own; else None."""
    code = None if process is None else process.exit_code_before_close
    if process is None or code is None:
        return None
    tail = tuple(process.stderr_tail)
    line = telling_line(tail)
    last = f": {line}" if line else ""
    return ErrorInfo(
        code=Reason.EXITED,
        message=f"the process exited with code {code}{last}",
        exit_code=code,
        stderr_tail=tail[-5:],
    )


def timeout_error(process: StdioProcess | None, timeout: float) -> ErrorInfo:
    """An attempt that ran out of time: a process that died meanwhile explains it better than the timeout, and what
    a live one last wrote on stderr often does too (a token refused, a port taken, "waiting for ...")."""
    gone = exited(process)
    if gone is not None:
        return gone
    tail = () if process is None else tuple(process.stderr_tail)[-5:]
    said = f"; its last line on stderr: {telling_line(tail)}" if tail else ""
    fix = "a server that needs longer to start: raise [connect] attempt_timeout_s"
    message = f"no answer to the handshake within {timeout:g} s{said} ({fix})"
    return ErrorInfo(code=Reason.TIMEOUT, message=message, stderr_tail=tail)


def lost_error(process: StdioProcess | None) -> ErrorInfo:
    """A connection that was ready and then went away."""
    gone = exited(process)
    if gone is not None:
        return ErrorInfo(
            code=Reason.CONNECTION_LOST,
            message=f"connection lost: {gone.message}",
            exit_code=gone.exit_code,
            stderr_tail=gone.stderr_tail,
        )
    return ErrorInfo(code=Reason.CONNECTION_LOST, message="connection lost")


def repeated_exit(previous: ErrorInfo | None, current: ErrorInfo | None) -> bool:
    """Two exits with the same code and telling stderr line, at start or soon after ready: the mark of a crash loop.

    The telling line, not the last: on a loaded host an exit may be seen before the last line of its stderr is read
    (npm's log-path line after its 404), and two exits alike read as different ones (5 attempts, not 3, to `failed`).
    """
    return (
        previous is not None
        and current is not None
        and previous.code in _EXITS
        and current.code in _EXITS
        and current.exit_code is not None
        and (previous.exit_code, _alike((telling_line(previous.stderr_tail),)))
        == (current.exit_code, _alike((telling_line(current.stderr_tail),)))
    )


#: Lines that say nothing of why a process ended: npm's pointer to its log (a new file each run), a stack frame.
_NOISE = re.compile(r"complete log of this run can be found|^\s*at \S|^npm (ERR!|error)\s*$", re.IGNORECASE)
#: What differs between two runs' lines that say the same: numbers (times, pids, ports) and paths.
_RUN_PARTS = re.compile(r"\d+|(?:[A-Za-z]:)?[/\\][^\s:'\"]+")


def telling_line(tail: tuple[str, ...] | list[str]) -> str:
    """The stderr line that says why: the last one that is not noise (`_NOISE`), else the last one.

    A misspelt npm package ended on "npm error A complete log of this run can be found in: ...", which is what
    status, the call's error and the model were told; its "npm error 404 ... could not be found" was above it.
    """
    for line in reversed(tail):
        if line.strip() and not _NOISE.search(line):
            return line
    return tail[-1] if tail else ""


def _alike(lines: tuple[str, ...]) -> tuple[str, ...]:
    # npm's log path holds the time of the run: no two of its exits read alike, and a crash loop never ended.
    return tuple(_RUN_PARTS.sub("#", line) for line in lines)


_EXITS = (Reason.EXITED, Reason.CONNECTION_LOST)
#: A connection ready this long was healthy: its drop starts a fresh round (`crashed_again`).
STABLE_AFTER_S = 10.0


def crashed_again(previous: ErrorInfo | None, dropped: ErrorInfo | None, ready_for_s: float) -> bool:
    """Whether a connection that dropped after `ready_for_s` is a crash loop's failed attempt (backed off, counted), not
    a drop to reconnect at once: it was ready a short while and ended as the last one did. A server that exited just
    after its first tools/list was restarted every second, forever, and read as ready."""
    return ready_for_s < STABLE_AFTER_S and repeated_exit(previous, dropped)


def classify(
    exc: BaseException,
    spec: ServerSpec,
    *,
    process: StdioProcess | None,
    http_status: int | None,
    was_ready: bool,
    auth_required: str | None = None,
) -> ErrorInfo:
    """The reason an attempt on `spec` failed with `exc`; checks run from the most specific evidence down.

    `auth_required` is the OAuth client's word that nobody is signed in (or the sign-in ended): it
    explains the failure better than whatever status the last response had.
    """
    leaves = _leaves(exc)
    if auth_required is not None and not was_ready:
        if isinstance(auth_required, AuthNote):
            # The authorization server's own failure is a status to wait out (as its token endpoint unreachable is
            # `refused`), not `auth_required`: that one tells scripts and /readyz that a person must sign in.
            code = Reason.HTTP_STATUS if auth_required.server_trouble else Reason.AUTH_REQUIRED
            return ErrorInfo(code=code, message=str(auth_required), http_status=auth_required.http_status or http_status)
        return ErrorInfo(code=Reason.AUTH_REQUIRED, message=auth_required, http_status=http_status)
    if was_ready:
        return ErrorInfo(code=Reason.CONNECTION_LOST, message=f"connection lost: {describe(leaves[0])}")
    helper = next((leaf for leaf in leaves if isinstance(leaf, HeadersHelperError)), None)
    if helper is not None:
        return ErrorInfo(code=Reason.AUTH_REQUIRED, message=str(helper))
    spawn = _spawn_failure(leaves, spec, process)
    if spawn is not None:
        return spawn
    gone = exited(process)
    if gone is not None:
        return gone
    where = display_url(spec.url) if spec.url else spec.command or ""
    # A request the connection made elsewhere on its way (a sign-in's token endpoint) that failed explains the attempt
    # better than the server's own 401 after it: "check the headers" sent the user to a config that was right.
    elsewhere = _network_failure([leaf for leaf in leaves if _failed_at(leaf, where) != where], where)
    if elsewhere is not None:
        return elsewhere
    if http_status is not None:
        if http_status in (401, 403):
            return ErrorInfo(
                code=Reason.AUTH_REQUIRED,
                message=f"HTTP {http_status}: the server wants credentials (check the headers in the config)",
                http_status=http_status,
            )
        hint = ""
        if http_status == 405 and spec.transport == "http":  # a legacy SSE endpoint takes GET, not the handshake's POST
            hint = '; a legacy SSE endpoint answers so: set "type": "sse"'
        elif http_status in (400, 404, 405, 406) and spec.transport == "sse":
            # The SSE client's GET without a session: a streamable HTTP endpoint refuses it (400 "missing session ID").
            hint = '; a streamable HTTP endpoint answers an SSE client so: try "type": "http"'
        return ErrorInfo(code=Reason.HTTP_STATUS, message=f"HTTP {http_status} from {where}{hint}", http_status=http_status)
    return _network_failure(leaves, where) or _protocol_failure(leaves)


def _spawn_failure(leaves: list[BaseException], spec: ServerSpec, process: StdioProcess | None) -> ErrorInfo | None:
    if process is None or process.process is not None:
        return None  # not stdio, or the process did start: whatever failed, it was not the spawn
    command = spec.command or ""
    for leaf in leaves:
        if isinstance(leaf, FileNotFoundError):
            advice = _platform.not_found_advice(command)
            return ErrorInfo(code=Reason.SPAWN_FAILED, message=f"command not found: {command}; {advice}")
        if isinstance(leaf, PermissionError):
            return ErrorInfo(code=Reason.SPAWN_FAILED, message=f"not executable: {command}")
        if isinstance(leaf, OSError):
            return ErrorInfo(code=Reason.SPAWN_FAILED, message=f"cannot start {command}: {leaf.strerror or leaf}")
    return None


def _network_failure(leaves: list[BaseException], where: str) -> ErrorInfo | None:
    for leaf in leaves:
        for link in _chain(leaf):
            if isinstance(link, ssl.SSLError) or "CERTIFICATE" in str(link).upper():
                return ErrorInfo(code=Reason.TLS, message=f"TLS failed: {link}")
    server = where
    for leaf in leaves:
        where = _failed_at(leaf, server)
        chain = _chain(leaf)
        text = " ".join(str(link) for link in chain).lower()
        if any(isinstance(link, ConnectionRefusedError) for link in chain) or "refused" in text:
            return ErrorInfo(code=Reason.REFUSED, message=f"connection refused: nothing listening at {where}")
        if "name or service not known" in text or "nodename nor servname" in text or "unreachable" in text:
            return ErrorInfo(code=Reason.UNREACHABLE, message=f"cannot reach {where}: {leaf}")
        if isinstance(leaf, httpx2.TimeoutException):
            return ErrorInfo(code=Reason.TIMEOUT, message=f"HTTP timeout: {describe(leaf)}")
        if isinstance(leaf, httpx2.ConnectError) and "all connection attempts failed" in text:
            return ErrorInfo(code=Reason.REFUSED, message=f"connection refused: nothing listening at {where}")
        if (
            isinstance(leaf, httpx2.RemoteProtocolError | httpx2.ReadError | httpx2.WriteError | ConnectionResetError)
            or any(isinstance(link, ConnectionResetError) for link in chain)
            or "disconnected" in text
            or "reset" in text
        ):
            return ErrorInfo(code=Reason.RESET, message=f"connection reset by the server: {describe(leaf)}")
    return None


def _failed_at(leaf: BaseException, server: str) -> str:
    """Where `leaf` failed: the server's URL, or another one the connection asked on its way (a sign-in's token
    endpoint, refreshing an expired token): "nothing listening at" the MCP URL, which answered, sent the user there."""
    try:
        request = leaf.request if isinstance(leaf, httpx2.RequestError) else None
    except RuntimeError:  # an httpx error raised without its request
        request = None
    if request is None:
        return server
    url = display_url(str(request.url))
    return server if url.split("/")[:3] == server.split("/")[:3] else f"{url} (asked on the way to {server})"


def _protocol_failure(leaves: list[BaseException]) -> ErrorInfo:
    for leaf in leaves:
        if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
            return ErrorInfo(code=Reason.RESET, message=f"the connection closed during the handshake: {leaf.message}")
        if isinstance(leaf, MCPError | ValidationError | RuntimeError):
            code = f" ({leaf.code})" if isinstance(leaf, MCPError) else ""
            return ErrorInfo(code=Reason.PROTOCOL_ERROR, message=f"protocol error{code}: {describe(leaf)}")
    return ErrorInfo(code=Reason.PROTOCOL_ERROR, message=f"unexpected failure: {describe(leaves[0])}")
