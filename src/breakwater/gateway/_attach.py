"""Finding the shared local gateway for a session: connect and shake hands, or start it and wait for it.

`breakwater serve` over stdio connects to the gateway of its config's fingerprint
(`breakwater.gateway._share`), starting one detached when none answers, under a lock, so sessions
that start together start one gateway. The first session of a cold start has forked it before its
own event loop ran (`breakwater.gateway._start`); a session whose gateway died while it ran starts
a new `breakwater gateway run` process here instead (its loop runs, and a fork must not inherit a
running loop). What it then relays is `breakwater.gateway._pump`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from breakwater._clock import Clock
from breakwater.gateway._handoff import hand_over
from breakwater.gateway._share import (
    ANSWER_LIMIT,
    SPAWN_WAIT_S,
    AttachRefused,
    GatewayExiting,
    answer_wait,
    check_peer,
    handshake_answer,
    not_answering,
)

__all__ = [
    "SPAWN_WAIT_S",
    "AttachRefused",
    "Attachment",
    "SessionOutdated",
    "connect_gateway",
    "open_attachment",
]

#: Waiting sessions look again after a pause that starts here and grows by half each time, up to
#: `_POLL_MAX_S`: 13 sessions looking 100 times a second while a 14th starts the gateway took a
#: tenth of a core from the gateway's own start-up (its imports are most of the time to ready).
_POLL_S = 0.01
_POLL_MAX_S = 0.1
_POLL_GROWTH = 1.5


class SessionOutdated(Exception):
    """breakwater was upgraded under a running session: no gateway of its version can be started any more."""


@dataclass
class Attachment:
    """An open, handshaken connection to a shared gateway: its socket, and what arrived after the handshake line."""

    sock: socket.socket
    info: dict[str, Any]
    rest: bytes = b""
    #: The bell's read end when the gateway serves this session on its stdin and stdout (`breakwater.gateway._handoff`).
    bell: int | None = None

    @property
    def handed_off(self) -> bool:
        """Whether the gateway serves this session on its stdin and stdout."""
        return self.bell is not None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.bell is not None:
            with contextlib.suppress(OSError):
                os.close(self.bell)
            self.bell = None


async def connect_gateway(path: Path, hello: dict[str, Any]) -> Attachment | None:
    """Connect and shake hands; None when nothing listens at `path` (or the gateway there is exiting), `AttachRefused`
    when the gateway says no."""
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
        check_peer(sock, path)
        received = b""
        # A gateway that has run a while answers at once; one still starting gets the callers' own deadline.
        waiting = answer_wait(path, SPAWN_WAIT_S)
        # Closed before it accepted (or as it did): answered as a close, whether the send or the read finds out; what it
        # wrote before it closed (a gateway that exits says so: `turn_away`) is read even when the send found it closed.
        try:
            async with asyncio.timeout(waiting):  # a real process's answer, in real time
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    await loop.sock_sendall(sock, json.dumps(hello).encode() + b"\n")
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    while b"\n" not in received and len(received) < ANSWER_LIMIT:
                        chunk = await loop.sock_recv(sock, 65536)
                        if not chunk:
                            break
                        received += chunk
        except TimeoutError:
            raise not_answering(path, waiting) from None
        try:
            attachment.info, attachment.rest = handshake_answer(received, path)
        except GatewayExiting:  # it no longer serves: as if nothing listened (the caller starts the next one)
            attachment.close()
            return None
        if attachment.info.get("handoff") is True:
            attachment.bell = hand_over(sock)  # the gateway serves this session on our stdin and stdout from here
        return attachment
    except BaseException:
        attachment.close()
        raise


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
