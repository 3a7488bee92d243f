"""The gateway's downstream stdio transport: the SDK's `stdio_server`, without worker threads.

The SDK reads stdin and writes stdout through `anyio.wrap_file`, a worker-thread hop per line read
and two per line written: about a dozen thread hand-offs per proxied call, which on a busy 2-core
machine cost more than the gateway's own work (see docs/benchmarks.md, proxy overhead). When stdin
and stdout are pipes, sockets or terminals (what every agent launches us with) this transport reads
and writes them with asyncio's non-blocking pipe transports instead; anything else (a regular file,
another event loop) falls back to the SDK's transport. Framing, parsing and serialisation are the
SDK's own, so the bytes on the wire are identical.

Like the SDK, it points fd 0 at the null device and fd 1 at stderr while serving, so a stray print
or a child process cannot corrupt the wire, and restores both on exit.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server as sdk_stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

__all__ = ["stdio_server"]

#: Longest line accepted from the client. The SDK has no limit; a bound keeps one bad client from
#: exhausting memory, and 64 MiB is far above any real MCP message.
MAX_LINE_BYTES = 64 * 1024 * 1024


def _pollable(fd: int) -> bool:
    """Whether asyncio's pipe transports can drive this descriptor (pipe, socket or terminal)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


def _divert(fd: int, open_diversion: Any) -> int:
    """Move `fd`'s stream to a private descriptor (returned) and point `fd` at a harmless stand-in."""
    private = os.dup(fd)
    os.set_inheritable(private, False)
    diversion = open_diversion()
    try:
        os.dup2(diversion, fd)
    finally:
        os.close(diversion)
    return private


def _restore(fd: int, private: int) -> None:
    # The pipe transports made the shared file description non-blocking; hand it back as it was found.
    with suppress(OSError):
        os.set_blocking(private, True)
    with suppress(OSError):
        os.dup2(private, fd)


@asynccontextmanager
async def stdio_server() -> AsyncIterator[tuple[Any, Any]]:
    """Serve MCP over this process's stdin and stdout: `(read_stream, write_stream)` for `Server.run`."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # another event loop (trio)
        loop = None
    if loop is None or not (_pollable(0) and _pollable(1)):
        async with sdk_stdio_server() as streams:
            yield streams
        return

    sys.stdout.flush()
    in_fd = _divert(0, lambda: os.open(os.devnull, os.O_RDONLY))
    out_fd = _divert(1, lambda: os.dup(2))
    # closefd=False: the descriptors are closed below, after the transports let go of them.
    in_file = os.fdopen(in_fd, "rb", buffering=0, closefd=False)
    out_file = os.fdopen(out_fd, "wb", buffering=0, closefd=False)
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), in_file)
    write_transport, write_protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out_file)
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)

    read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_stream_reader = create_context_streams[SessionMessage](0)

    async def stdin_reader() -> None:
        async with read_stream_writer:
            while True:
                try:
                    line = await reader.readline()
                except ValueError as exc:  # a line over MAX_LINE_BYTES: reported, and the rest of it skipped
                    await read_stream_writer.send(exc)
                    continue
                if not line:
                    return
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except Exception as exc:
                    await read_stream_writer.send(exc)
                    continue
                await read_stream_writer.send(SessionMessage(message))

    async def stdout_writer() -> None:
        async with write_stream_reader:
            async for session_message in write_stream_reader:
                data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                writer.write(data.encode() + b"\n")
                await writer.drain()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdin_reader)
            tg.start_soon(stdout_writer)
            yield read_stream, write_stream
            tg.cancel_scope.cancel()
    finally:
        with suppress(ConnectionError, RuntimeError):
            await writer.drain()
        read_transport.close()
        write_transport.close()
        # Let the transports run their close callbacks before the descriptors go.
        await asyncio.sleep(0)
        _restore(0, in_fd)
        _restore(1, out_fd)
        os.close(in_fd)
        os.close(out_fd)
