"""Side effects done once: operation ids and an operation store for MCP server authors.

Put `@idempotent` under `@mcp.tool()` on a tool of an SDK `MCPServer`::

    from mcp.server.mcpserver import MCPServer
    from breakwater.idempotency import add_operation_tool, idempotent

    mcp = MCPServer("orders")

    @mcp.tool()
    @idempotent
    async def create_order(item: str, quantity: int) -> Order: ...

    add_operation_tool(mcp)   # get_operation(operation_id): what happened to a call

A client sends one operation id per logical call in `params._meta["io.breakwater/operationId"]`
(or an `operationId` argument) and reuses it on every retry; the tool then runs at most once per id
and repeats get the stored outcome. See docs/idempotency.md.
"""

from breakwater.idempotency._decorator import (
    OPERATION_ID_ARG,
    OPERATION_ID_META_KEY,
    OperationStatus,
    add_operation_tool,
    current_operation_id,
    default_store,
    fingerprint,
    idempotent,
)
from breakwater.idempotency._postgres import PostgresStore
from breakwater.idempotency._sqlite import SQLiteStore
from breakwater.idempotency._store import (
    DB_PATH_ENV,
    DEFAULT_LEASE_S,
    DEFAULT_PURGE_INTERVAL_S,
    DEFAULT_RETENTION_S,
    ClaimResult,
    OperationRecord,
    OperationState,
    OperationStore,
    default_db_path,
)

__all__ = [
    "DB_PATH_ENV",
    "DEFAULT_LEASE_S",
    "DEFAULT_PURGE_INTERVAL_S",
    "DEFAULT_RETENTION_S",
    "OPERATION_ID_ARG",
    "OPERATION_ID_META_KEY",
    "ClaimResult",
    "OperationRecord",
    "OperationState",
    "OperationStatus",
    "OperationStore",
    "PostgresStore",
    "SQLiteStore",
    "add_operation_tool",
    "current_operation_id",
    "default_db_path",
    "default_store",
    "fingerprint",
    "idempotent",
]
