"""The mirror a gateway keeps for a session whose stdio it serves (`breakwater.gateway._handoff`): what `serve` learns from it.

The gateway's `Mirror` writes to a real Unix socket through asyncio's transport and rings a real
pipe; the session's `_Pump` reads the other ends as it does when attached. (The whole hand-over, with
real processes, a killed gateway and a killed session, is in `test_shared.py`.)
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import pytest

from breakwater.gateway._attach import Attachment
from breakwater.gateway._handed import Mirror, MirrorSocket
from breakwater.gateway._handoff import MIRROR_FLUSH_S, MirrorParser, answer_id, record
from breakwater.gateway._pump import ToolSafety, _Pump
from breakwater.testing import FakeClock
from helpers import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def call(request_id: Any, tool: str) -> bytes:
    return line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})


def test_records_come_out_whole_however_the_bytes_are_cut() -> None:
    records = [(b"I", b'{"id":1}\n{"id"'), (b"O", b'"a\\"b"'), (b"P", b""), (b"I", bytes(range(256)) * 300), (b"E", b"")]
    data = b"".join(record(kind, payload) for kind, payload in records)
    assert list(MirrorParser().feed(data)) == records
    parser = MirrorParser()
    byte_by_byte = [r for i in range(len(data)) for r in parser.feed(data[i : i + 1])]
    assert byte_by_byte == records


def test_an_answer_is_known_by_its_id_whatever_wrote_it() -> None:
    assert answer_id(b'{"jsonrpc":"2.0","id":12,"result":{}}\n') == b"12"
    assert answer_id(b'{"jsonrpc":"2.0","id":"x\\"y","error":{"code":1,"message":"m"}}\n') == b'"x\\"y"'
    assert answer_id(b'{"id": "k", "jsonrpc": "2.0", "result": {}}\n') == b'"k"'  # another writer's key order
    assert answer_id(b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{}}\n') is None  # a request
    assert answer_id(b'{"jsonrpc":"2.0","method":"notifications/progress"}\n') is None
    assert answer_id(b"not json\n") is None


async def mirrored() -> tuple[Mirror, asyncio.Transport, Attachment, FakeClock]:
    """A gateway's mirror on one end of a socket pair and a bell; the session's attachment on the other ends."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    bell, ringer = os.pipe()
    os.set_blocking(bell, False)
    protocol = MirrorSocket(asyncio.StreamReader())
    transport, _ = await asyncio.get_running_loop().create_unix_connection(lambda: protocol, sock=theirs)
    clock = FakeClock()
    mirror = Mirror(transport, ringer, clock)
    protocol.attach(mirror)
    return mirror, transport, Attachment(ours, {"handoff": True}, bell=bell), clock


async def test_a_session_whose_gateway_died_knows_what_was_in_flight_and_where_its_input_stopped() -> None:
    mirror, transport, attachment, _ = await mirrored()
    pump = _Pump(asyncio.get_running_loop(), ToolSafety())
    first, second, third, fourth = call(1, "a"), call(2, "b"), call(3, "c"), call(4, "d")
    listing = line({"jsonrpc": "2.0", "id": "L", "method": "tools/list"})
    watching = asyncio.create_task(pump.watch(attachment))
    mirror.read(first + second[:10])  # the gateway reads a request and a half
    mirror.read(second[10:] + listing + third[:7])
    mirror.wrote(b'{"jsonrpc":"2.0","id":1,"result":{}}\n', 0)
    tools = [{"name": "peek", "annotations": {"readOnlyHint": True}}, {"name": "order"}]
    mirror.wrote(line({"jsonrpc": "2.0", "id": "L", "result": {"tools": tools}}), 0)  # sent whole, at once
    mirror.wrote(b'{"jsonrpc":"2.0","id":2,"result":{"content":[]}}\n', 4096)  # the agent's pipe is full
    mirror.read(third[7:] + fourth[:20])  # the next chunk takes the answered ids along
    await asyncio.sleep(0.1)
    assert not watching.done()  # asleep: nothing woke it
    transport.abort()  # the gateway dies: the kernel closes its socket and its end of the bell
    mirror.close()
    assert await asyncio.wait_for(watching, 10) is False
    assert set(pump.session.pending) == {"3"}  # 1, 2 and the list were answered
    assert pump.session.safety.safe("peek") and not pump.session.safety.safe("order")
    assert bytes(pump.client.buffer) == fourth[:20]  # the rest of that line is still in the agent's pipe
    written: list[bytes] = []
    pump.stdout = Recorder(written)  # type: ignore[assignment]
    pump.lost()
    assert written[0] == b"\n"  # the answer to 2 may be cut: what follows starts on a line of its own
    assert json.loads(written[1])["id"] == 3 and json.loads(written[1])["result"]["isError"] is True  # OUTCOME_UNKNOWN
    attachment.close()


async def test_a_mirror_that_backs_up_rings_the_session_which_reads_it_while_the_agents_input_waits() -> None:
    mirror, transport, attachment, _ = await mirrored()
    agent_in, agent_out = os.pipe()
    from_agent = Received()
    loop = asyncio.get_running_loop()
    mirror.input, _ = await loop.connect_read_pipe(lambda: from_agent, os.fdopen(agent_in, "rb", 0))
    pump = _Pump(loop, ToolSafety())
    watching = asyncio.create_task(pump.watch(attachment))
    big = call(1, "x" * (8 * 1024 * 1024))  # far more than a socket's buffer: the rest waits in the gateway
    mirror.read(big)
    assert transport.get_write_buffer_size() > 0
    os.write(agent_out, call(2, "y"))  # the agent's next request waits in its pipe, unread, while the mirror is backed up
    for _ in range(3):  # loop iterations enough for a readable pipe to be read, not for 8 MiB to be drained
        await asyncio.sleep(0)
    assert transport.get_write_buffer_size() > 0 and from_agent.data == b""
    await eventually(lambda: transport.get_write_buffer_size() == 0, timeout=10)  # the session was woken and read it
    await eventually(lambda: from_agent.data == call(2, "y"), timeout=10)  # and the agent's input is read again
    await eventually(lambda: set(pump.session.pending) == {"1"}, timeout=10)  # the last of it is read as it comes
    assert not watching.done()
    mirror.read(call(2, "y"))
    mirror.ended()
    assert await asyncio.wait_for(watching, 10) is True  # the session is over, though the socket is still open
    assert set(pump.session.pending) == {"1", "2"}
    transport.abort()
    attachment.close()
    mirror.input.close()
    os.close(agent_out)


async def test_answered_ids_reach_the_session_within_the_flush_time() -> None:
    mirror, transport, attachment, clock = await mirrored()
    mirror.read(call(1, "a"))
    mirror.wrote(b'{"jsonrpc":"2.0","id":1,"result":{}}\n', 0)
    flushing = asyncio.create_task(mirror.flushing())
    await clock.wait_for_sleepers()
    assert b"".join(_drain(attachment.sock)) == record(b"I", call(1, "a"))  # the id waits for company
    clock.advance(MIRROR_FLUSH_S)  # none comes: the flush sends it on its own
    await eventually(lambda: bool(chunks := _drain(attachment.sock)) and b"".join(chunks) == record(b"O", b"1"), timeout=10)
    flushing.cancel()
    transport.abort()
    mirror.close()
    attachment.close()


def _drain(sock: socket.socket) -> list[bytes]:
    chunks = []
    while True:
        try:
            chunks.append(sock.recv(65536))
        except BlockingIOError:
            return chunks


class Received(asyncio.Protocol):
    """What a read transport delivered."""

    def __init__(self) -> None:
        self.data = b""

    def data_received(self, data: bytes) -> None:
        self.data += data


class Recorder:
    """The pump's stdout: what it writes, in order."""

    def __init__(self, written: list[bytes]) -> None:
        self.written = written

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False
