"""`HandOffReader`: whole lines handed over as they arrive, never ahead of a line the reading task has not read.

The hot path's two hand-offs (the downstream calls to the fast lane, the upstream's answers to the
raw calls waiting for them) rest on this: a line is taken from the pipe's callback only while the
reading task waits with nothing unread, and the first line not taken keeps everything behind it.
"""

from __future__ import annotations

import sys

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from breakwater.connect._lines import HandOffReader
from breakwater.connect._stdio import StdioProcess, _DirectFeed

pytestmark = pytest.mark.anyio

CALL = b'{"method":"tools/call","id":1}\n'
PING = b'{"method":"ping","id":2}\n'


class Taker:
    """Takes every line naming `tools/call`, as a ready lane (or a raw call's waiter) takes its own."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []

    def __call__(self, data: bytes) -> int:
        taken = 0
        while (end := data.find(b"\n", taken) + 1) > 0 and b'"tools/call"' in data[taken:end]:
            self.taken.append(data[taken:end])
            taken = end
        return taken


async def test_lines_are_handed_over_only_between_lines_the_task_has_read() -> None:
    taker = Taker()
    reader = HandOffReader()
    reader.hand_off = taker
    lines: list[bytes] = []

    async def read(count: int) -> None:
        for _ in range(count):
            lines.append(await reader.readuntil(b"\n"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(read, 4)
        await wait_all_tasks_blocked()  # the reading task is parked in readuntil, nothing unread
        reader.feed_data(CALL + CALL)  # both taken; the task is not woken
        await wait_all_tasks_blocked()
        assert taker.taken == [CALL, CALL] and lines == []
        reader.feed_data(PING + CALL)  # the ping is the task's, and so is the call behind it
        reader.feed_data(CALL[:5])  # unread data is waiting: a whole call after it waits its turn too
        reader.feed_data(CALL[5:] + CALL)
    assert taker.taken == [CALL, CALL]
    assert lines == [PING, CALL, CALL, CALL]


async def test_nothing_is_handed_over_while_the_task_is_busy_or_without_a_taker() -> None:
    taker = Taker()
    reader = HandOffReader()
    reader.hand_off = taker
    reader.feed_data(CALL)  # no task waits for it: the task reads it when it comes
    assert await reader.readuntil(b"\n") == CALL
    reader.hand_off = None
    async with anyio.create_task_group() as tg:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await reader.readuntil(b"\n"))

        tg.start_soon(read)
        await wait_all_tasks_blocked()
        reader.feed_data(CALL)
    assert got == [CALL] and taker.taken == []


async def test_a_real_upstreams_stdout_arrives_whole_and_in_order_then_ends() -> None:
    """The stdout pipe feeds its buffer from its own callback (`_stdio._feed_directly`): nothing lost or reordered.

    The child writes 3,000 messages in chunks of every size, as fast as it can, then exits: the
    session reads every one of them, in order, then the end of the stream."""
    line = '{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":%d}}\\n'
    script = (
        "import sys\n"
        f"blob = ''.join('{line}' % i for i in range(3000)).encode()\n"
        "i = 0\n"
        "for size in range(1, 10**9):\n"
        "    if i >= len(blob): break\n"
        "    sys.stdout.buffer.write(blob[i:i + size * 7]); sys.stdout.buffer.flush(); i += size * 7\n"
    )
    upstream = StdioProcess(sys.executable, ("-c", script))
    seen: list[int] = []
    with anyio.fail_after(60):
        async with upstream.open() as (read_stream, _write_stream):
            assert upstream.process is not None
            buffer = upstream.process.stdout._stream  # type: ignore[union-attr]
            assert isinstance(buffer._transport.get_protocol(), _DirectFeed)
            async for message in read_stream:
                seen.append(message.message.params["data"])
    assert seen == list(range(3000))


async def test_lines_written_in_one_turn_go_out_together_whole_and_in_order() -> None:
    """`StdinWriter`: the first line of a turn of the loop goes out at once, the rest in one write at its end.

    A burst of 50 concurrent calls is 50 lines written by 50 tasks in one turn; a child that echoes
    its stdin gets every one of them, whole and in the order they were written, from 2 writes."""
    script = "import sys\nfor line in sys.stdin.buffer: sys.stdout.buffer.write(line); sys.stdout.buffer.flush()\n"
    upstream = StdioProcess(sys.executable, ("-u", "-c", script))
    lines = [b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":%d}}\n' % i for i in range(50)]
    seen: list[int] = []
    with anyio.fail_after(60):
        async with upstream.open() as (read_stream, write_stream):
            assert upstream.process is not None
            transport = upstream.process.stdin._stream.transport  # type: ignore[union-attr]
            writes: list[bytes] = []
            real_write = transport.write

            def counted(data: bytes) -> None:
                writes.append(bytes(data))
                real_write(data)

            transport.write = counted
            async with anyio.create_task_group() as tg:
                for line in lines:
                    tg.start_soon(write_stream.write_line, line)
            await wait_all_tasks_blocked()
            assert writes == [lines[0], b"".join(lines[1:])]
            async for message in read_stream:
                seen.append(message.message.params["data"])
                if len(seen) == len(lines):
                    break
            # A lone line in a later turn goes out at once again.
            await write_stream.write_line(lines[0])
            assert writes[-1] == lines[0] and len(writes) == 3
    assert seen == list(range(50))
