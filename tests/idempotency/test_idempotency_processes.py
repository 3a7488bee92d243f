"""`examples/orders_server.py` as real server processes: restarts, a crash mid-call, and two replicas
racing on one operation id through a shared PostgreSQL store.

Side effects are counted in the example's own files: `orders.jsonl` (one line per execution of
`place_order`) and `payment-requests.jsonl` (one line per request reaching the payment API).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, RequestParamsMeta

from breakwater.idempotency import OPERATION_ID_META_KEY, OperationState, SQLiteStore
from helpers import code_of

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_server.py"
ORDER = {"customer": "ann", "item": "espresso", "quantity": 2}


def op_meta(operation_id: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {OPERATION_ID_META_KEY: operation_id})


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stdio_example(*flags: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(EXAMPLE), *flags])


@asynccontextmanager
async def http_example(*flags: str) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """An example server process on a free port; yields (url, process); killed on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--http", "--port", str(port), *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(20):
            while True:
                assert proc.poll() is None, "the example server exited during start-up"
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def test_stored_result_survives_a_server_restart(tmp_path: Path) -> None:
    """Same id on two separate stdio server processes: the second replays from the SQLite file."""
    flags = ("--data", str(tmp_path / "data"), "--db", str(tmp_path / "ops.sqlite3"))
    op = str(uuid.uuid4())
    results = []
    for _ in range(2):
        async with Client(stdio_example(*flags)) as client:
            results.append(await client.call_tool("place_order", ORDER, meta=op_meta(op)))
    assert not results[0].is_error
    assert results[1].structured_content == results[0].structured_content
    assert len(lines(tmp_path / "data" / "orders.jsonl")) == 1
    charges = lines(tmp_path / "data" / "payments.jsonl")
    assert [c["idempotency_key"] for c in charges] == [op]  # the downstream key is the operation id


async def test_a_killed_owner_leaves_an_unknown_outcome_not_a_rerun(tmp_path: Path) -> None:
    """kill -9 the server mid-call; its replacement reports in-progress, then unknown, never re-runs."""
    data, db = tmp_path / "data", tmp_path / "ops.sqlite3"
    lease = 1.0
    flags = ("--data", str(data), "--db", str(db), "--lease-s", str(lease))
    op = str(uuid.uuid4())
    observer = SQLiteStore(db)
    try:
        async with http_example(*flags, "--payment-delay-s", "30") as (url, proc), anyio.create_task_group() as tg:

            async def doomed_call() -> None:
                try:
                    async with Client(url) as client:
                        await client.call_tool("place_order", ORDER, meta=op_meta(op))
                except Exception:
                    pass  # the server dies under it

            tg.start_soon(doomed_call)
            with anyio.fail_after(20):
                while (rec := await observer.get(op)) is None or rec.state is not OperationState.EXECUTING:
                    await anyio.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
            tg.cancel_scope.cancel()
        async with http_example(*flags) as (url, _), Client(url) as client:
            first = await client.call_tool("place_order", ORDER, meta=op_meta(op))
            await anyio.sleep(lease + 0.3)
            after_lease = await client.call_tool("place_order", ORDER, meta=op_meta(op))
            status = await client.call_tool("get_operation", {"operation_id": op})
    finally:
        await observer.aclose()
    # Right after the crash the lease may still run; either way the tool is not run again.
    assert code_of(first) in {"OPERATION_IN_PROGRESS", "OPERATION_OUTCOME_UNKNOWN"}
    assert code_of(after_lease) == "OPERATION_OUTCOME_UNKNOWN"
    assert status.structured_content is not None and status.structured_content["state"] == "unknown"
    assert lines(data / "orders.jsonl") == []
    assert lines(data / "payment-requests.jsonl") == []  # the dead owner never reached the payment API


async def test_two_replicas_on_one_postgres_store_execute_each_id_once(tmp_path: Path, pg_conninfo: str, pg_schema: str) -> None:
    """Two server processes, one PostgreSQL store: 10 ids, each sent 3 times to each replica at once."""
    data = tmp_path / "data"
    flags = ("--data", str(data), "--postgres", pg_conninfo, "--pg-schema", pg_schema, "--payment-delay-s", "0.2")
    ops = [str(uuid.uuid4()) for _ in range(10)]
    results: dict[str, list[CallToolResult]] = {op: [] for op in ops}
    async with http_example(*flags) as (url_a, _), http_example(*flags) as (url_b, _):
        async with Client(url_a) as a, Client(url_b) as b, anyio.create_task_group() as tg:
            for op in ops:
                for client in (a, b, a, b, a, b):

                    async def call(client: Client = client, op: str = op) -> None:
                        results[op].append(await client.call_tool("place_order", ORDER, meta=op_meta(op)))

                    tg.start_soon(call)
        # Afterwards every id answers with its one stored receipt, from either replica.
        async with Client(url_a) as a, Client(url_b) as b:
            for op in ops:
                ra = await a.call_tool("place_order", ORDER, meta=op_meta(op))
                rb = await b.call_tool("place_order", ORDER, meta=op_meta(op))
                assert not ra.is_error and ra.structured_content == rb.structured_content
                results[op].append(ra)
    orders = lines(data / "orders.jsonl")
    assert sorted(o["operation_id"] for o in orders) == sorted(ops)  # exactly one execution per id
    assert sorted(r["idempotency_key"] for r in lines(data / "payment-requests.jsonl")) == sorted(ops)
    for op in ops:
        receipts = {json.dumps(r.structured_content, sort_keys=True) for r in results[op] if not r.is_error}
        assert len(receipts) == 1
        assert all(code_of(r) == "OPERATION_IN_PROGRESS" for r in results[op] if r.is_error)
