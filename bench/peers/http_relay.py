"""Reference, not a peer: the least an HTTP gateway in front of a stdio server can do (`bench/proxy_overhead.py`'s `http-relay`).

It starts the upstream command given after `--` and serves streamable HTTP on 127.0.0.1 for one
client: each POSTed JSON-RPC message goes to the upstream's stdin as one line, and the upstream's
answer with the same id comes back as a plain `application/json` body (a notification gets 202 and
an empty body; GET gets 405, so the client opens no stream; DELETE gets 200). One `json.loads` per
message, to read the id; no SDK, no validation, no session beyond a fixed `mcp-session-id`, no
checks of any header. On uvloop when it is installed, as `breakwater serve` is.

What it is for: the HTTP rows of the benchmark are bounded below by the client's own work and the
upstream's; this row is that bound with a process in the middle, so a gateway's row (and a target
ratio) can be read against what any gateway could reach on the same machine in the same run.
POSIX only, as the benchmark is.

    python bench/peers/http_relay.py PORT_FILE -- <upstream command...>
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

_SESSION = b"http-relay-0"


class Relay:
    """One upstream process and the answers its callers wait for, by JSON-RPC id."""

    def __init__(self, child: asyncio.subprocess.Process) -> None:
        assert child.stdin is not None and child.stdout is not None
        self._to_child = child.stdin
        self._from_child = child.stdout
        self._waiting: dict[Any, asyncio.Future[bytes]] = {}

    async def pump(self) -> None:
        """Hand each upstream line to whoever waits for its id (the upstream's own requests and notifications are dropped)."""
        while line := await self._from_child.readline():
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if "method" not in message and (waiter := self._waiting.pop(message.get("id"), None)) is not None:
                    waiter.set_result(line.rstrip(b"\n"))

    async def send(self, body: bytes, request_id: Any) -> bytes | None:
        """Write one message; for a request, wait for the line that answers it."""
        waiter = None
        if request_id is not None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting[request_id] = waiter
        # A raw newline in JSON text can only be whitespace between tokens: the message stays one line.
        self._to_child.write(body.replace(b"\r", b"").replace(b"\n", b"") + b"\n")
        return None if waiter is None else await waiter

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One keep-alive HTTP/1.1 connection."""
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.split(b"\r\n")
                method = lines[0].split(b" ", 1)[0]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if method == b"POST":
                    message = json.loads(body)
                    request_id = message.get("id") if "method" in message else None
                    answer = await self.send(body, request_id)
                    if answer is None:
                        writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                    else:
                        writer.write(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: %s\r\n"
                            b"content-length: %d\r\n\r\n%s" % (_SESSION, len(answer), answer)
                        )
                elif method == b"DELETE":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nallow: POST, DELETE\r\ncontent-length: 0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main(port_file: Path, command: list[str]) -> None:
    child = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    relay = Relay(child)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await relay.pump()  # the upstream ended: so does the relay


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        print("usage: http_relay.py PORT_FILE -- <upstream command...>", file=sys.stderr)
        sys.exit(2)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(Path(args[0]), args[2:]))
    else:
        uvloop.run(main(Path(args[0]), args[2:]))
