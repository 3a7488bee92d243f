"""Starting the shared local gateway at a cold start: forked from the first session, before its event loop runs.

A new interpreter for the gateway (`breakwater gateway run`) costs a process start, the CLI's
imports and a second config load, all on cores that the other sessions of a storm are starting on
(docs/benchmarks.md, issue 20): the session that finds no gateway forks it instead, with its config
already loaded. This module runs in every stdio `serve` before anything else of the attach path, so
it imports neither asyncio nor the SDK: the sooner the first session decides, the sooner the
gateway's own imports start. Sessions that find a gateway starting, and sessions whose gateway died
while they ran, wait for it or start one in `breakwater.gateway._attach`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from breakwater.gateway._handoff import hand_over
from breakwater.gateway._share import (
    ANSWER_LIMIT,
    GatewayExiting,
    answer_wait,
    bind_socket,
    check_peer,
    handshake_answer,
    not_answering,
)

__all__ = ["attach_now", "fork_gateway", "relayable", "reserve_standard_fds"]


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


def attach_now(
    path: Path, hello: dict[str, Any], wait_s: float
) -> tuple[socket.socket, dict[str, Any], bytes, int | None] | None:
    """Connect to the gateway at `path` and shake hands, blocking, before this session's loop exists.

    Returns the connected socket (non-blocking, for the relay), the gateway's answer, what came
    after it and, when the gateway took this session's stdin and stdout, the bell's read end
    (`breakwater.gateway._handoff`); None when nothing listens there (or the gateway there is
    exiting). Raises `AttachRefused` when the gateway says no, `TimeoutError` when it has not
    answered within `wait_s` (one that is starting answers once it serves). The first attach of
    every session runs here, so that a session waiting for a gateway that is starting sleeps in
    `recv` instead of importing asyncio and its relay meanwhile: at a cold start those imports, 13
    sessions' worth, took CPU from the gateway's own imports.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(wait_s)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None
        check_peer(sock, path)
        waiting = answer_wait(path, wait_s)
        sock.settimeout(waiting)
        received = b""
        # Closed before it accepted (or as it did): answered as a close, whether the send or the read finds out; what it
        # wrote before it closed (a gateway that exits says so: `turn_away`) is read even when the send found it closed.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(json.dumps(hello).encode() + b"\n")
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while b"\n" not in received and len(received) < ANSWER_LIMIT:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    raise not_answering(path, waiting) from None
                if not chunk:
                    break
                received += chunk
        try:
            info, rest = handshake_answer(received, path)
        except GatewayExiting:  # it no longer serves: as if nothing listened (the session starts the next one)
            sock.close()
            return None
        # The gateway serves this session on our stdin and stdout from here (`_handoff`).
        bell = hand_over(sock) if info.get("handoff") is True else None
        sock.setblocking(False)
        return sock, info, rest, bell
    except BaseException:
        sock.close()
        raise


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (AttributeError, ValueError, OSError):
        return 65536


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
        # Nor any other descriptor the agent gave its session (as `close_fds` does for a spawned one):
        # nothing of this process's own is open here but the listener.
        keep = listener.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, _max_fd())
        code = serve(listener)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # Not `sys.exit`: the session's `atexit` and `finally` blocks are the session's, not the gateway's.
        os._exit(code)


def reserve_standard_fds() -> None:
    """Open the null device on any of fds 0, 1, 2 that is closed; call before the event loop starts.

    Here, not in `_stdio_server` (which loads the SDK) nor in `_pump` (asyncio), as every stdio serve
    calls it before it attaches.

    A process started with stdin closed (`<&-`) would otherwise get its event loop's epoll
    descriptor as fd 0, and serving stdio would then read from (and divert) the loop itself. A
    closed stdin reads as an immediately ended input: the session ends cleanly.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # a lower one was closed too and has just been filled; keep trying
                os.dup2(opened, fd)
                os.close(opened)


def relayable() -> bool:
    """Whether stdin and stdout can be polled (pipes, sockets, terminals: what agents give); else serve directly."""
    for fd in (0, 1):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return False
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))):
            return False
    return True
