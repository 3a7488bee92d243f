"""What the shared local gateway and the sessions that attach to it agree on: where, who, which config.

`breakwater serve` over stdio attaches to one gateway per (user, config) instead of connecting to
every server itself (`breakwater.gateway._attach`); the gateway is `breakwater.gateway._shared`.
They meet on a Unix socket named after the config's fingerprint, in a directory only the user can
enter (0700, socket 0600). The first line on a connection is a handshake, one JSON object each way:

    session → gateway  {"breakwater": "attach", "fingerprint": FP, "version": V, "session": {...}}   (or "info", "stop")
    gateway → session  {"breakwater": "gateway", "ok": true, "pid": ..., "sessions": ..., "version": V, ...}
                       (from a gateway that exits, `"ok": false, "exiting": true`: the session starts the next one)

then MCP's own newline-delimited JSON-RPC, unchanged, for as long as the session lasts. When the
config has stdio servers each session runs for itself (`per_session`), "session" carries what a
`serve` of its own would have given them: its working directory and its environment (of which each
server inherits what `[connect] inherit_env` keeps: all of it by default). They go no further than the
gateway's memory and the processes it starts for that session: never to a log, the journal or an
error (the socket is the user's own, 0600 in a 0700 directory). The gateway
refuses (`"ok": false` and a reason) another fingerprint or another version (each version has a
socket name of its own, so that takes a socket renamed by hand); on Linux both sides
also check the peer's uid (SO_PEERCRED), so a socket that someone else could reach still serves only
its user.

Windows does not share (`_platform.SHARED_SOCKETS`; every session serves itself and says so). What a
named pipe needs, beyond asyncio's `ProactorEventLoop.start_serving_pipe` / `create_pipe_connection`:
(1) the pipe created with a DACL of the user's SID only, `PIPE_REJECT_REMOTE_CLIENTS` and
`FILE_FLAG_FIRST_PIPE_INSTANCE` (asyncio creates it with default security, which lets Everyone
read, and has no way to pass attributes: `CreateNamedPipeW` through ctypes, served on the
Proactor's private `accept_pipe`); (2) the peer check, `GetNamedPipeClientProcessId` and the
client token's user SID instead of SO_PEERCRED; (3) the relay's stdin and stdout, which on Windows
are anonymous pipes the Proactor cannot read: the thread-served handles `_platform` already uses
for stdio servers; (4) a detached start (`DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP` instead of
a new session) and no SIGTERM receiver in the gateway (`gateway stop` already goes through the
handshake). The simulated-Windows test can only show the branch taken; the pipe needs a Windows
runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import stat
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from breakwater import _paths, _platform
from breakwater.config import Config, GatewayPolicy, ServerSpec

__all__ = [
    "ANSWER_LIMIT",
    "ANSWER_WAIT_S",
    "SPAWN_WAIT_S",
    "AttachRefused",
    "GatewayStuck",
    "SessionContext",
    "answer_wait",
    "bind_socket",
    "breakwater_version",
    "check_peer",
    "config_fingerprint",
    "gateway_paths",
    "gateway_pid",
    "handshake_answer",
    "not_answering",
    "peer_uid",
    "per_session",
    "pid_path",
    "share_dir",
    "share_dirs",
    "share_refusal",
    "shared_config",
    "socket_supported",
    "where_gateway",
]

#: The longest answer a session or a command reads from a gateway: an `info` carries the servers' states, with their
#: stderr tails (a cut answer read as "not a breakwater gateway", and `gateway list` removed a live one's socket).
ANSWER_LIMIT = 4 * 1024 * 1024
#: How long a session waits for a gateway to answer (one it started, or one still starting) before it serves on its own.
SPAWN_WAIT_S = 15.0


#: How long a gateway that has run longer than `SPAWN_WAIT_S` may take to answer: one that serves answers a hello
#: at once (a line each way), so only one still starting may take longer; a stuck one held sessions for 16 s, past
#: the start-up limits of agents (Codex: 10 s).
ANSWER_WAIT_S = 3.0


class AttachRefused(Exception):
    """A gateway answered, but will not take this session (another version, another user, a bad handshake)."""


class GatewayExiting(AttachRefused):
    """The gateway answered that it is exiting (idle, or stopped): the session starts the next one (`turn_away`)."""


class GatewayStuck(AttachRefused):
    """A gateway listens but cannot answer: it is stopped (SIGSTOP, a debugger), or it did not within its time."""

    def __init__(self, pid: int | None, reason: str) -> None:
        super().__init__(reason)
        #: The gateway's process id, where the socket says it.
        self.pid = pid


def per_session(config: Config) -> tuple[ServerSpec, ...]:
    """The enabled stdio servers each session runs for itself: neither `"shared": true` nor named in `[gateway] share_stdio`."""
    allowed = {name.strip() for name in config.gateway.share_stdio.split(",") if name.strip()}
    if "*" in allowed:
        return ()
    return tuple(s for s in config.servers if s.enabled and s.transport == "stdio" and not s.shared and s.name not in allowed)


def shared_config(config: Config) -> Config:
    """What the shared gateway itself opens: every server but the per-session ones, first connects spread less.

    The start-up jitter spreads the first connects of many processes started at once (the connect
    storm); the sessions that share a gateway are one process, whose connects the admission caps
    already spread, so its window is `[gateway] share_startup_jitter_s` at most (0.5 s of jitter
    cost a cold start 0.24 s on average in `bench/connect_storm.py`).
    """
    own = {s.name for s in per_session(config)}
    cap = config.gateway.share_startup_jitter_s
    servers = tuple(
        s
        if s.connect.startup_jitter_s <= cap
        else dataclasses.replace(s, connect=dataclasses.replace(s.connect, startup_jitter_s=cap))
        for s in config.servers
        if s.name not in own
    )
    return config.with_servers(servers)


@dataclass(frozen=True, kw_only=True)
class SessionContext:
    """Where one attached session runs: what its own stdio servers are started with, as a `serve` of its own would.

    `env` is the session's environment (each server inherits of it what `[connect] inherit_env` keeps, its entry's
    own `env` on top). Its values may be secrets: `repr` shows the names only.
    """

    cwd: str
    env: Mapping[str, str]

    def __repr__(self) -> str:
        return f"SessionContext(cwd={self.cwd!r}, env=<{', '.join(sorted(self.env))}>)"

    @classmethod
    def here(cls) -> SessionContext:
        """This process's working directory and inherited variables."""
        return cls(cwd=os.getcwd(), env=dict(os.environ))  # what each server inherits of it: `[connect] inherit_env`

    def to_json(self) -> dict[str, Any]:
        """The handshake's "session" object."""
        return {"cwd": self.cwd, "env": dict(self.env)}

    @classmethod
    def from_json(cls, raw: Any) -> SessionContext | None:
        """A handshake's "session" object, or None when it is not one (then the gateway's own are used).

        Only text values are taken (the session is the same user's: its peer uid is checked).
        """
        if not isinstance(raw, dict):
            return None
        cwd, env = raw.get("cwd"), raw.get("env")
        if not isinstance(cwd, str) or not os.path.isabs(cwd) or not isinstance(env, dict):
            return None
        return cls(cwd=cwd, env={k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)})


def breakwater_version() -> str:
    """The installed breakwater's version ("unknown" from a source tree never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp-breakwater")
    except PackageNotFoundError:
        return "unknown"


def socket_supported() -> bool:
    """Whether this platform can share a gateway: Unix sockets with file permissions (not Windows, for now)."""
    return _platform.SHARED_SOCKETS and hasattr(socket, "AF_UNIX")


def _canonical(value: Any) -> Any:
    """`value` as plain JSON data in one order, secrets included (they are hashed, never shown)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (set, frozenset)):
        return sorted(str(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def config_fingerprint(config: Config, *, cwd: str | None = None) -> str:
    """What two sessions must have in common to share a gateway: the resolved config, the user, the directory.

    The resolved config (after the environment's knobs, with every server's headers and env) decides
    what the gateway connects to and how; the uid keeps users apart; the working directory counts
    only when a stdio server the gateway shares would inherit it (each session's own stdio servers
    start in the session's directory, `SessionContext`). The version is checked in the handshake
    instead, so an old gateway is found and named rather than silently run beside.
    """
    # Where the config and each server were read from is how it was spelled (`--config mcp.json`,
    # `./mcp.json`, an absolute path), not what it says: two spellings of one file share a gateway.
    unsourced = tuple(dataclasses.replace(s, source=None) for s in config.servers)
    data = _canonical(dataclasses.replace(config, path=None, servers=unsourced))
    own = {s.name for s in per_session(config)}
    stdio = any(s.transport == "stdio" and s.enabled and s.name not in own for s in config.servers)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    blob = json.dumps({"config": data, "uid": uid, "cwd": (cwd or os.getcwd()) if stdio else None}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def share_dir(policy: GatewayPolicy) -> Path:
    """The directory of the user's shared-gateway sockets, created 0700 (and refused if it is not the user's)."""
    directory = Path(policy.share_dir).expanduser() if policy.share_dir else _paths.runtime_dir() / "gateways"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.stat()
    except OSError as exc:
        # `[Errno 17] File exists: '/home/me/notes.txt'` said neither what the path was for nor what to do.
        if directory.is_file() or isinstance(exc, FileExistsError):
            what = "it is a file"
        else:
            what = "a part of its path is a file" if isinstance(exc, NotADirectoryError) else exc.strerror or str(exc)
        raise OSError(
            f"the shared gateway's directory {directory} cannot be used ({what}): set [gateway] share_dir "
            "(BREAKWATER_SHARE_DIR) to a directory of your own",
        ) from exc
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to uid {info.st_uid}, not to this user: not sharing a gateway there")
    if stat.S_IMODE(info.st_mode) != 0o700:
        directory.chmod(0o700)
    return directory


def share_dirs(policy: GatewayPolicy) -> list[Path]:
    """`share_dir(policy)`, then those a session started with another environment uses, that exist
    (`_paths.runtime_dirs_elsewhere`: an agent's minimal environment), where its gateway is found as well."""
    directories = [share_dir(policy)]
    if not policy.share_dir:
        directories += [d / "gateways" for d in _paths.runtime_dirs_elsewhere() if (d / "gateways").is_dir()]
    return directories


def where_gateway(policy: GatewayPolicy, fingerprint: str, version: str) -> tuple[Path, Path, Path]:
    """`gateway_paths` in the first of `share_dirs` where this gateway's socket is, else in `share_dir`."""
    directories = share_dirs(policy)
    for directory in directories:
        with contextlib.suppress(OSError):  # too deep for a socket: said below, if it is the one to start in
            paths = gateway_paths(directory, fingerprint, version)
            if paths[0].exists():
                return paths
    return gateway_paths(directories[0], fingerprint, version)


def gateway_paths(directory: Path, fingerprint: str, version: str) -> tuple[Path, Path, Path]:
    """The gateway's socket, its start-up lock and its log, for one fingerprint and one breakwater version.

    The version is in the name so that, after an upgrade, new sessions start and share a gateway of
    their own version while the old one serves its sessions until it idles out.
    """
    tag = hashlib.sha256(version.encode()).hexdigest()[:6]
    stem = directory / f"gw-{fingerprint[:16]}-{tag}"
    sock = stem.with_suffix(".sock")
    if len(os.fsencode(sock)) > _platform.UNIX_SOCKET_PATH_MAX:
        # A deep XDG_RUNTIME_DIR or share_dir: the bind would fail; the session serves itself and says why.
        raise OSError(
            f"the shared gateway's socket path {sock} is {len(os.fsencode(sock))} bytes, more than the "
            f"{_platform.UNIX_SOCKET_PATH_MAX} a Unix socket allows: set [gateway] share_dir "
            "(BREAKWATER_SHARE_DIR) to a shorter directory"
        )
    return sock, stem.with_suffix(".lock"), stem.with_suffix(".log")


def bind_socket(path: Path) -> socket.socket | None:
    """Listen on `path` (0600); None when a live gateway already answers there. A stale socket file is replaced.

    Here, not in `_hub`, so that the session that starts the gateway can bind it without the SDK.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        return None  # someone else won the race: attach to theirs
    finally:
        probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # born 0600: no window in which another user could connect
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    path.chmod(0o600)
    listener.listen(128)
    listener.setblocking(False)
    return listener


#: What a gateway that no longer accepts answers the connections that were already queued (`turn_away`).
_EXITING = json.dumps({"breakwater": "gateway", "ok": False, "exiting": True, "reason": "the gateway is exiting"}).encode()


def turn_away(listener: socket.socket) -> int:
    """Before a gateway closes its listener: its socket file (and pid file) removed, so that no session finds it any
    more, then every connection already queued answered that it exits (`GatewayExiting`); how many were.

    Why. Closing a listener resets the connections queued on it, unaccepted, and a session read that as a gateway
    that died starting: it served itself, unshared, telling its user the gateway "closed the connection before
    answering". Told it exits, the session starts the next gateway, as one that finds no socket does. The files go
    first: a connection that arrives after them finds nothing, and the next gateway may bind the path at once (the pid
    file goes before the socket, so it cannot be the next gateway's).
    """
    name = listener.getsockname()
    if isinstance(name, str) and name:
        path = Path(name)
        for stale in (pid_path(path), path):
            with contextlib.suppress(OSError):
                stale.unlink()
    turned = 0
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # BlockingIOError: the queue is empty
            return turned
        with conn, contextlib.suppress(OSError):
            conn.send(_EXITING + b"\n", socket.MSG_DONTWAIT)  # a line in an empty buffer: never blocks
        turned += 1


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (Linux; None where it cannot be asked cheaply)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def check_peer(sock: socket.socket, path: Path) -> None:
    """`AttachRefused` when the process listening at `path` (on `sock`) runs as another user; `GatewayStuck` when the
    gateway is stopped and cannot answer (asked, it held every command and session that asked it for good)."""
    uid = peer_uid(sock)
    if uid is not None and hasattr(os, "getuid") and uid != os.getuid():
        raise AttachRefused(f"the gateway at {path} runs as uid {uid}, not as this user")
    pid = gateway_pid(path)
    if pid is not None and _platform.stopped(pid):
        raise GatewayStuck(
            pid,
            f"the shared gateway (pid {pid}) is stopped (SIGSTOP, or a debugger) and cannot answer; "
            f"resume it with `kill -CONT {pid}`, or end it with `kill -KILL {pid}`",
        )


def pid_path(sock: Path) -> Path:
    """Where the gateway listening at `sock` writes its pid (the socket's own peer is the session that bound it)."""
    return sock.with_suffix(".pid")


def gateway_pid(sock: Path) -> int | None:
    """The pid the gateway at `sock` wrote (`pid_path`), if it did."""
    try:
        return int(pid_path(sock).read_text(encoding="ascii").strip()) or None
    except (OSError, ValueError):
        return None


def answer_wait(sock: Path, wait_s: float) -> float:
    """How long to wait for the answer of the gateway at `sock`: `wait_s` while it may still be starting, and
    `ANSWER_WAIT_S` once it has listened longer than that (its socket file is as old as it)."""
    try:
        listened_s = time.time() - sock.stat().st_mtime
    except OSError:
        return wait_s
    return ANSWER_WAIT_S if listened_s > wait_s else wait_s


def not_answering(sock: Path, waited_s: float) -> GatewayStuck:
    """The error for the gateway at `sock`, which listens and did not answer within `waited_s`."""
    pid = gateway_pid(sock)
    who = f"the shared gateway (pid {pid})" if pid is not None else f"the shared gateway at {sock}"
    return GatewayStuck(pid, f"{who} did not answer within {waited_s:g} s")


def handshake_answer(received: bytes, path: Path) -> tuple[dict[str, Any], bytes]:
    """The gateway's answer line in `received` (and what came after it); `AttachRefused` unless it says yes."""
    if not received:  # it listened, then closed: it died starting (or was stopped) before it served
        raise AttachRefused(f"the gateway at {path} closed the connection before answering (its log: {path.with_suffix('.log')})")
    line, _, rest = received.partition(b"\n")
    try:
        info = json.loads(line) if line else None
    except ValueError:
        info = None
    if not isinstance(info, dict) or info.get("breakwater") != "gateway":
        raise AttachRefused(f"what listens at {path} is not a breakwater gateway")
    if info.get("exiting") is True:
        raise GatewayExiting(str(info.get("reason") or "exiting"))
    if not info.get("ok"):
        raise AttachRefused(str(info.get("reason") or "refused"))
    return info, rest


def share_refusal(config: Config) -> str | None:
    """Why this config's sessions cannot share a gateway (None when they can)."""
    if not config.gateway.share:
        return "sharing is off ([gateway] share = false)"
    if not socket_supported():
        return "sharing a gateway needs Unix sockets; on Windows each session runs its own gateway for now"
    return None
