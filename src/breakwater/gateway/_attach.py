"""Finding the shared local gateway for a session: connect and shake hands, or start it and wait for it.

`breakwater serve` over stdio connects to the gateway of its config's fingerprint
(`breakwater.gateway._share`), starting one detached when none answers, under a lock, so sessions
that start together start one gateway. The first session of a cold start forks it before its own
event loop runs (`fork_gateway`: no new interpreter, no second config load); a session whose
gateway died while it ran starts a new `breakwater gateway run` process instead (`open_attachment`:
its loop is running, and a fork must not inherit a running loop). What it then relays is
`breakwater.gateway._pump`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from breakwater._clock import Clock
from breakwater.gateway._share import HANDSHAKE_LIMIT, bind_socket, peer_uid

__all__ = [
    "SPAWN_WAIT_S",
    "AttachRefused",
    "Attachment",
    "SessionOutdated",
    "connect_gateway",
    "fork_gateway",
    "open_attachment",
]

#: How long a session waits for the gateway it started to answer before it serves on its own.
SPAWN_WAIT_S = 15.0
#: Waiting sessions look again after a pause that starts here and grows by half each time, up to
#: `_POLL_MAX_S`: 13 sessions looking 100 times a second while a 14th starts the gateway took a
#: tenth of a core from the gateway's own start-up (its imports are most of the time to ready).
_POLL_S = 0.01
_POLL_MAX_S = 0.1
_POLL_GROWTH = 1.5


class AttachRefused(Exception):
    """A gateway answered, but will not take this session (another version, another user, a bad handshake)."""


class SessionOutdated(Exception):
    """breakwater was upgraded under a running session: no gateway of its version can be started any more."""


@dataclass
class Attachment:
    """An open, handshaken connection to a shared gateway: its socket, and what arrived after the handshake line."""

    sock: socket.socket
    info: dict[str, Any]
    rest: bytes = b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


async def connect_gateway(path: Path, hello: dict[str, Any]) -> Attachment | None:
    """Connect and shake hands; None when nothing listens at `path`, `AttachRefused` when the gateway says no."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    attachment = Attachment(sock, {})
    try:
        try:
            await loop.sock_connect(sock, str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            attachment.close()
            return None
        uid = peer_uid(sock)
        if uid is not None and hasattr(os, "getuid") and uid != os.getuid():
            raise AttachRefused(f"the gateway at {path} runs as uid {uid}, not as this user")
        await loop.sock_sendall(sock, json.dumps(hello).encode() + b"\n")
        received = b""
        while b"\n" not in received and len(received) < HANDSHAKE_LIMIT:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                break
            received += chunk
        line, _, attachment.rest = received.partition(b"\n")
        try:
            info = json.loads(line) if line else None
        except ValueError:
            info = None
        if not isinstance(info, dict) or info.get("breakwater") != "gateway":
            raise AttachRefused(f"what listens at {path} is not a breakwater gateway")
        if not info.get("ok"):
            raise AttachRefused(str(info.get("reason") or "refused"))
        attachment.info = info
        return attachment
    except BaseException:
        attachment.close()
        raise


def fork_gateway(sock_path: Path, lock_path: Path, log_path: Path, serve: Callable[[socket.socket], int]) -> bool:
    """Start the gateway in a fork of this process when none answers at `sock_path`; whether this process started it.

    Call it before any event loop runs here: the child runs `serve(listener)` (the gateway, on a loop
    of its own) and never returns, and a fork of a process whose loop runs would share its epoll set.
    Under the start-up lock, taken without waiting (its holder is starting a gateway; this session
    then waits for it in `open_attachment`), this process binds the socket itself (0600,
    `bind_socket`) and lets the lock go: from then on every session that looks finds a gateway
    listening, and connects, to be answered once it serves. It then forks twice, so the gateway is
    nobody's child (no zombie when it exits first) and leads no session of the agent's (`setsid`),
    with the null device for stdin and its log (0600) for stdout and stderr: it keeps none of the
    agent's pipes, whose ends must close when this session ends. Declined (False, nothing started)
    where there is no fork, or when this process runs other threads, which a fork does not copy.
    """
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    import filelock

    lock = filelock.FileLock(str(lock_path), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    try:
        listener = bind_socket(sock_path)  # None: a live gateway answers there (started since this session looked)
    finally:
        lock.release()  # closes the lock's descriptor too: the fork must not hold the lock
    if listener is None:
        return False
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing buffered here is written twice
    try:
        pid = os.fork()
    except OSError:
        listener.close()
        with contextlib.suppress(OSError):
            sock_path.unlink()
        return False
    if pid == 0:
        _become_gateway(listener, log_path, serve)
    listener.close()  # the gateway's now
    os.waitpid(pid, 0)  # the first child exits as soon as it has forked the gateway
    return True


def _become_gateway(listener: socket.socket, log_path: Path, serve: Callable[[socket.socket], int]) -> NoReturn:
    """In the first child of `fork_gateway`: detach, fork the gateway, and run it; never returns."""
    code = 1
    try:
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        for fd, target in ((0, null), (1, log), (2, log)):
            os.dup2(target, fd)
        os.close(null)
        os.close(log)
        code = serve(listener)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # Not `sys.exit`: the session's `atexit` and `finally` blocks are the session's, not the gateway's.
        os._exit(code)


async def _connect_by(path: Path, hello: dict[str, Any], clock: Clock, deadline: float) -> Attachment | None:
    """`connect_gateway`, its answer awaited until `deadline` (`TimeoutError` after): a gateway that listens but
    never answers (still starting, or stopped) must not hold a session forever."""
    found: Attachment | None = None
    with clock.deadline_scope(deadline) as scope:
        found = await connect_gateway(path, hello)
    if scope.cancelled_caught:
        raise TimeoutError(f"the shared gateway at {path} did not answer within {SPAWN_WAIT_S:g} s")
    return found


async def _lock(path: Path, clock: Clock, deadline: float) -> Any:
    """The start-up lock (a `filelock.FileLock`, held), polled on the clock; None if `deadline` passed first."""
    import filelock

    lock = filelock.FileLock(str(path), mode=0o600)
    pause = _POLL_S
    while True:
        try:
            lock.acquire(timeout=0)
            return lock
        except filelock.Timeout:
            if clock.monotonic() >= deadline:
                return None
            await clock.sleep(pause)
            pause = min(pause * _POLL_GROWTH, _POLL_MAX_S)


async def open_attachment(
    sock_path: Path, lock_path: Path, hello: dict[str, Any], spawn: Sequence[str], log_path: Path, clock: Clock
) -> Attachment:
    """Attach to the gateway at `sock_path`, starting it with `spawn` (detached, logging to `log_path`) if none answers.

    Raises `AttachRefused` when a gateway refuses, `TimeoutError` when the started one never answers.
    """
    deadline = clock.monotonic() + SPAWN_WAIT_S
    found = await _connect_by(sock_path, hello, clock, deadline)
    if found is not None:
        return found
    lock = await _lock(lock_path, clock, deadline)
    try:
        found = await _connect_by(sock_path, hello, clock, deadline)  # started by whoever held the lock
        if found is not None:
            return found
        with log_path.open("ab") as log:
            child = subprocess.Popen(
                list(spawn), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
            )
        pause = _POLL_S
        while clock.monotonic() < deadline:
            found = await _connect_by(sock_path, hello, clock, deadline)
            if found is not None:
                return found
            if child.poll() is not None:
                raise TimeoutError(f"the shared gateway exited with code {child.returncode} (its log: {log_path})")
            await clock.sleep(pause)
            pause = min(pause * _POLL_GROWTH, _POLL_MAX_S / 2)  # the gateway's own start-up is what it waits for
        raise TimeoutError(f"the shared gateway did not answer within {SPAWN_WAIT_S:g} s (its log: {log_path})")
    finally:
        if lock is not None:
            lock.release()
