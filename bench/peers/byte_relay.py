"""Reference, not a peer: a stdio process in the middle that parses nothing (`bench/proxy_overhead.py`'s `byte-relay`).

It starts the upstream command given after `--` and copies bytes both ways in one `select` loop:
the client's stdin to the upstream's stdin, the upstream's stdout to its own stdout. No JSON, no
asyncio, no SDK: what one more process on the path costs by itself (its wake-ups, its two pipe
crossings each way, its place on the machine's cores), so a gateway's row can be read against the
floor that any stdio gateway starts from. POSIX only, as the benchmark is.

    python bench/peers/byte_relay.py -- <upstream command...>
"""

from __future__ import annotations

import os
import select
import subprocess
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: byte_relay.py -- <upstream command...>", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1 :]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert child.stdin is not None and child.stdout is not None
    to_child, from_child = child.stdin.fileno(), child.stdout.fileno()
    reading = [0, from_child]
    while from_child in reading:
        ready, _, _ = select.select(reading, [], [])
        for fd in ready:
            data = os.read(fd, 1 << 20)
            if fd == 0:
                if data:
                    _write_all(to_child, data)
                else:  # the client ended: so does the upstream's input, and the relay once its output ends
                    reading.remove(0)
                    child.stdin.close()
            elif data:
                _write_all(1, data)
            else:
                reading.remove(from_child)
    return child.wait()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
