"""What the shared local gateway and the sessions that attach to it agree on: where, who, which config.

`breakwater serve` over stdio attaches to one gateway per (user, config) instead of connecting to
every server itself (`breakwater.gateway._attach`); the gateway is `breakwater.gateway._shared`.
They meet on a Unix socket named after the config's fingerprint, in a directory only the user can
enter (0700, socket 0600). The first line on a connection is a handshake, one JSON object each way:

    session → gateway  {"breakwater": "attach", "fingerprint": FP, "version": V}   (or "info", "stop")
    gateway → session  {"breakwater": "gateway", "ok": true, "pid": ..., "sessions": ..., "version": V, ...}

then MCP's own newline-delimited JSON-RPC, unchanged, for as long as the session lasts. The gateway
refuses (`"ok": false` and a reason) another fingerprint or another version (each version has a
socket name of its own, so that takes a socket renamed by hand); on Linux both sides
also check the peer's uid (SO_PEERCRED), so a socket that someone else could reach still serves only
its user.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from breakwater import _paths, _platform
from breakwater.config import Config, GatewayPolicy

__all__ = [
    "HANDSHAKE_LIMIT",
    "breakwater_version",
    "config_fingerprint",
    "gateway_paths",
    "peer_uid",
    "share_dir",
    "share_refusal",
    "socket_supported",
]

#: The longest handshake line either side reads; anything longer is no handshake.
HANDSHAKE_LIMIT = 64 * 1024


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
    only when a stdio server would inherit it. The version is checked in the handshake instead, so an
    old gateway is found and named rather than silently run beside.
    """
    data = _canonical(dataclasses.replace(config, path=None))
    stdio = any(s.transport == "stdio" and s.enabled for s in config.servers)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    blob = json.dumps({"config": data, "uid": uid, "cwd": (cwd or os.getcwd()) if stdio else None}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def share_dir(policy: GatewayPolicy) -> Path:
    """The directory of the user's shared-gateway sockets, created 0700 (and refused if it is not the user's)."""
    directory = Path(policy.share_dir) if policy.share_dir else _paths.runtime_dir() / "gateways"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to uid {info.st_uid}, not to this user: not sharing a gateway there")
    if stat.S_IMODE(info.st_mode) != 0o700:
        directory.chmod(0o700)
    return directory


def gateway_paths(directory: Path, fingerprint: str, version: str) -> tuple[Path, Path, Path]:
    """The gateway's socket, its start-up lock and its log, for one fingerprint and one breakwater version.

    The version is in the name so that, after an upgrade, new sessions start and share a gateway of
    their own version while the old one serves its sessions until it idles out.
    """
    tag = hashlib.sha256(version.encode()).hexdigest()[:6]
    stem = directory / f"gw-{fingerprint[:16]}-{tag}"
    return stem.with_suffix(".sock"), stem.with_suffix(".lock"), stem.with_suffix(".log")


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


def share_refusal(config: Config) -> str | None:
    """Why this config's sessions cannot share a gateway (None when they can)."""
    if not config.gateway.share:
        return "sharing is off ([gateway] share = false)"
    if not socket_supported():
        return "sharing a gateway needs Unix sockets; on Windows each session runs its own gateway for now"
    return None
