"""Orders and payments: a worked example of `breakwater.idempotency`.

`place_order` has two side effects: it charges the customer through a (simulated) payment API and
it writes an order into the order book. A client that times out and retries must not pay twice or
get two orders, so:

- `@idempotent` makes the tool run at most once per operation id and replays its result to retries;
- the payment API gets the SAME operation id as its own idempotency key (as you would pass
  `Idempotency-Key` to Stripe), so even a charge sent by an owner that died mid-call is not repeated
  by anyone who later looks the operation up;
- `get_operation(operation_id)` lets a client that lost an answer ask what happened.

Run it::

    python examples/orders_server.py                        # stdio, embedded SQLite store
    python examples/orders_server.py --http --port 8000     # streamable HTTP on 127.0.0.1:8000/mcp
    python examples/orders_server.py --postgres postgresql://postgres@127.0.0.1/test   # shared store

The order book and the payment API's ledger are JSON-lines files in `--data` (default: a
`orders-data` directory beside the current directory), shared safely by several server processes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from breakwater.idempotency import (
    DEFAULT_LEASE_S,
    OPERATION_ID_META_KEY,
    OperationStore,
    PostgresStore,
    SQLiteStore,
    add_operation_tool,
    current_operation_id,
    idempotent,
)

PRICES_CENTS = {"espresso": 250, "croissant": 320, "beans-1kg": 2400}


class UnknownItem(ToolError):
    """Raised before any side effect, so the operation id may be reused (see `release_on`)."""


class Charge(BaseModel):
    """A payment as the payment API records it."""

    payment_id: str
    customer: str
    amount_cents: int
    idempotency_key: str


class Receipt(BaseModel):
    """What `place_order` returns."""

    order_id: str
    payment_id: str
    item: str
    quantity: int
    amount_cents: int


# ---------------------------------------------------------------------------- the downstream world


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    # Several server replicas share the files; an exclusive lock keeps read-check-append atomic.
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class PaymentAPI:
    """A stand-in for a real payment provider, with the provider's own idempotency keys.

    A repeated key returns the first charge instead of charging again, and a key reused for a
    different amount is refused, as Stripe does. Every request is logged in `requests.jsonl` so a
    test can see how often the API was called, and every real charge in `payments.jsonl`.
    """

    def __init__(self, data_dir: Path, *, delay_s: float = 0.0) -> None:
        self.ledger = data_dir / "payments.jsonl"
        self.requests = data_dir / "payment-requests.jsonl"
        self._lock = data_dir / "payments.lock"
        self.delay_s = delay_s

    async def charge(self, *, customer: str, amount_cents: int, idempotency_key: str) -> Charge:
        """Charge `customer` once per `idempotency_key`."""
        # A slow network hop to the provider: the window in which a client may give up.
        await anyio.sleep(self.delay_s)
        return await anyio.to_thread.run_sync(self._charge, customer, amount_cents, idempotency_key)

    def _charge(self, customer: str, amount_cents: int, key: str) -> Charge:
        with _locked(self._lock):
            _append_line(self.requests, {"time": time.time(), "idempotency_key": key, "pid": os.getpid()})
            for rec in _read_lines(self.ledger):
                if rec["idempotency_key"] == key:
                    if rec["amount_cents"] != amount_cents or rec["customer"] != customer:
                        raise ToolError("the payment API refused a reused idempotency key with different parameters")
                    return Charge.model_validate(rec)
            charge = Charge(
                payment_id=f"pay_{uuid.uuid4().hex[:12]}", customer=customer, amount_cents=amount_cents, idempotency_key=key
            )
            _append_line(self.ledger, charge.model_dump())
            return charge


class OrderBook:
    """The shop's own order table: NOT idempotent by itself, which is what `@idempotent` protects."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "orders.jsonl"
        self._lock = data_dir / "orders.lock"

    async def add(self, record: dict[str, Any]) -> None:
        """Append one order."""

        def write() -> None:
            with _locked(self._lock):
                _append_line(self.path, record)

        await anyio.to_thread.run_sync(write)

    async def get(self, order_id: str) -> dict[str, Any] | None:
        """One order, or None."""
        orders = await anyio.to_thread.run_sync(_read_lines, self.path)
        return next((o for o in orders if o["order_id"] == order_id), None)


# ---------------------------------------------------------------------------- the MCP server


def build_server(
    store: OperationStore,
    data_dir: Path,
    *,
    lease_s: float = DEFAULT_LEASE_S,
    payment_delay_s: float = 0.0,
    finish_on_cancel: bool = False,
    idempotency: bool = True,
) -> MCPServer:
    """The orders server with its operation store, data directory and knobs.

    `idempotency=False` registers `place_order` without `@idempotent` (and with a fresh payment key
    per execution), as a server that ignores operation ids would be: the chaos benchmark's baseline.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    payments = PaymentAPI(data_dir, delay_s=payment_delay_s)
    orders = OrderBook(data_dir)
    mcp = MCPServer("orders", instructions="Place coffee orders. Send io.breakwater/operationId in _meta.")

    async def place(customer: str, item: str, quantity: int, operation_id: str | None, *, dedup: bool) -> Receipt:
        if item not in PRICES_CENTS or quantity < 1:
            raise UnknownItem(f"cannot sell {quantity} x {item!r}; the menu is {sorted(PRICES_CENTS)}")
        amount = PRICES_CENTS[item] * quantity
        # The same operation id is the payment API's idempotency key: one logical call, one charge,
        # end to end. Without deduplication every execution is a new charge.
        key = operation_id if dedup and operation_id else f"adhoc-{uuid.uuid4()}"
        charge = await payments.charge(customer=customer, amount_cents=amount, idempotency_key=key)
        receipt = Receipt(
            order_id=f"ord_{uuid.uuid4().hex[:12]}",
            payment_id=charge.payment_id,
            item=item,
            quantity=quantity,
            amount_cents=amount,
        )
        await orders.add({**receipt.model_dump(), "customer": customer, "operation_id": operation_id})
        return receipt

    annotations = ToolAnnotations(destructive_hint=False, idempotent_hint=True)
    if idempotency:

        @mcp.tool(annotations=annotations)
        @idempotent(store=store, lease_s=lease_s, release_on=(UnknownItem,), finish_on_cancel=finish_on_cancel)
        async def place_order(customer: str, item: str, quantity: int = 1) -> Receipt:
            """Charge the customer and place an order. Runs once per operation id."""
            return await place(customer, item, quantity, current_operation_id(), dedup=True)

    else:

        @mcp.tool(name="place_order", annotations=annotations)
        async def place_order_every_time(ctx: Context, customer: str, item: str, quantity: int = 1) -> Receipt:
            """Charge the customer and place an order (every call runs: no deduplication)."""
            # The id is read only to label the order, so duplicates can be counted.
            meta = ctx.request_context.meta or {}
            op_id = meta.get(OPERATION_ID_META_KEY)
            return await place(customer, item, quantity, op_id if isinstance(op_id, str) else None, dedup=False)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order by id."""
        order = await orders.get(order_id)
        if order is None:
            raise ToolError(f"no order {order_id!r}")
        return order

    add_operation_tool(mcp, store)
    return mcp


def main(argv: list[str] | None = None) -> None:
    """Command line: choose the transport, the operation store and the knobs."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--data", type=Path, default=Path("orders-data"), help="order book and payment ledger directory")
    p.add_argument("--db", type=Path, default=None, help="SQLite operation store (default: the user data dir)")
    p.add_argument("--postgres", default=None, help="PostgreSQL conninfo for a store shared by replicas")
    p.add_argument("--pg-schema", default=None, help="PostgreSQL schema of the operations table")
    p.add_argument("--lease-s", type=float, default=DEFAULT_LEASE_S, help="claim lease (renewed while a tool runs)")
    p.add_argument("--payment-delay-s", type=float, default=0.0, help="simulated latency of the payment API")
    p.add_argument(
        "--finish-on-cancel", action="store_true", help="let place_order finish (and record its outcome) when the caller cancels"
    )
    p.add_argument("--no-idempotency", action="store_true", help="ignore operation ids (a baseline: every call runs)")
    ns = p.parse_args(argv)

    store: OperationStore = PostgresStore(ns.postgres, schema=ns.pg_schema) if ns.postgres else SQLiteStore(ns.db)
    mcp = build_server(
        store,
        ns.data,
        lease_s=ns.lease_s,
        payment_delay_s=ns.payment_delay_s,
        finish_on_cancel=ns.finish_on_cancel,
        idempotency=not ns.no_idempotency,
    )
    print(f"orders server: store={store!r} data={ns.data}", file=sys.stderr)
    if ns.http:
        mcp.run("streamable-http", host=ns.host, port=ns.port)
    else:
        mcp.run("stdio")


if __name__ == "__main__":
    main()
