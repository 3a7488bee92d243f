"""`@idempotent`: run an MCPServer tool at most once per operation id, and replay what it did.

The wrapper sits between MCPServer and the tool function. MCPServer builds the tool's input and
output schemas from the function's signature, so the wrapper carries the original signature (via
`functools.wraps` and an explicit `__signature__`) and only adds a keyword-only `Context` parameter
when the tool has none; MCPServer hides `Context` parameters from the schema, so `tools/list` is
unchanged.

The wrapper converts the tool's return value to a `CallToolResult` itself, exactly as MCPServer
would, so that the first answer and every replay are the same object on the wire (MCPServer passes
a returned `CallToolResult` through untouched).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar, overload

import anyio
import anyio.to_thread
import pydantic_core
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.server.mcpserver.utilities.func_metadata import func_metadata
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from breakwater._wire import MAX_OPERATION_ID_LEN, OPERATION_ID_META_KEY
from breakwater.idempotency._refusals import (
    envelope_in_meta,
    error_result,
    in_progress,
    mismatch,
    store_unavailable,
    unknown,
)
from breakwater.idempotency._sqlite import SQLiteStore
from breakwater.idempotency._store import (
    DEFAULT_LEASE_S,
    OperationRecord,
    OperationState,
    OperationStore,
    new_owner_id,
)

__all__ = [
    "OPERATION_ID_ARG",
    "OPERATION_ID_META_KEY",
    "OperationStatus",
    "add_operation_tool",
    "current_operation_id",
    "default_store",
    "fingerprint",
    "idempotent",
]

P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])

#: The tool argument read when `_meta` carries no id (for clients that cannot set `_meta`).
OPERATION_ID_ARG = "operationId"
# MAX_OPERATION_ID_LEN (`breakwater._wire`): Stripe's limit; longer keys are refused rather than silently truncated.
#: How long recording an outcome may take after a cancellation before we give up on it.
FINISH_GRACE_S = 10.0

# The name given to the Context parameter the wrapper adds when the tool has none. MCPServer
# refuses parameter names starting with "_", so it is merely unlikely, not private.
_ADDED_CTX = "breakwater_idempotency_ctx"

_log = logging.getLogger("breakwater.idempotency")
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("breakwater_operation_id", default=None)
_default_store: SQLiteStore | None = None


def current_operation_id() -> str | None:
    """The operation id of the idempotent call running in this task, or None.

    Pass it downstream as that API's own idempotency key (`Idempotency-Key` for Stripe), so the
    side effect is deduplicated end to end. Also set inside sync tools (worker threads copy it).
    """
    return _current.get()


def default_store() -> SQLiteStore:
    """The process-wide embedded store used by bare `@idempotent` (created on first use)."""
    global _default_store
    if _default_store is None:
        _default_store = SQLiteStore()
    return _default_store


def fingerprint(tool: str, arguments: dict[str, Any]) -> str:
    """SHA-256 of the tool name and the canonical JSON of its validated arguments.

    Canonical: keys sorted, no whitespace, pydantic models and other values in their JSON form.
    The arguments are the validated ones (defaults filled in), so `{"qty": 1}` and `{}` match when 1
    is the default.
    """
    payload = {"tool": tool, "arguments": pydantic_core.to_jsonable_python(arguments)}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# ---------------------------------------------------------------------------- error results


def _replay(record: OperationRecord, tool_label: str) -> CallToolResult:
    """The stored answer of a final operation: a result, a re-raised error, or `unknown`."""
    outcome = record.outcome or {}
    if record.state is OperationState.COMPLETED:
        return CallToolResult.model_validate(outcome["result"])
    if record.state is OperationState.FAILED:
        error = outcome.get("error", {})
        kind = error.get("kind")
        if kind == "tool_error":
            # Re-raised so MCPServer formats it exactly as it did the first time.
            raise ToolError(error.get("message", ""))
        if kind == "mcp_error":
            raise MCPError(int(error["code"]), str(error["message"]), error.get("data"))
        # A crash: MCPServer showed only this text the first time (details stay in the server log).
        return CallToolResult(content=[TextContent(text=f"Error executing tool {tool_label}")], is_error=True)
    return unknown(record)


# ---------------------------------------------------------------------------- the decorator


@overload
def idempotent(fn: Callable[P, Any], /) -> Callable[P, Coroutine[Any, Any, Any]]: ...


@overload
def idempotent(
    fn: None = None,
    /,
    *,
    store: OperationStore | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    structured_output: bool | None = None,
    release_on: tuple[type[BaseException], ...] = (),
    finish_on_cancel: bool = False,
) -> Callable[[Callable[P, Any]], Callable[P, Coroutine[Any, Any, Any]]]: ...


def idempotent(
    fn: Callable[P, Any] | None = None,
    /,
    *,
    store: OperationStore | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    structured_output: bool | None = None,
    release_on: tuple[type[BaseException], ...] = (),
    finish_on_cancel: bool = False,
) -> Callable[P, Coroutine[Any, Any, Any]] | Callable[[Callable[P, Any]], Callable[P, Coroutine[Any, Any, Any]]]:
    """Make an MCPServer tool run at most once per operation id. Place it under `@mcp.tool()`.

    The operation id comes from `params._meta["io.breakwater/operationId"]`, else from an
    `operationId` argument if the tool declares one. A call without an id runs normally, unrecorded.

    With an id, the first call claims an operation record and runs the tool; a repeat gets the stored
    result (or the stored error re-raised) without running it. A repeat while the first still runs
    gets an `isError` result with code `OPERATION_IN_PROGRESS` and `retry_after_s`; the same id with
    other arguments gets `OPERATION_MISMATCH`; an id whose owner died mid-run gets
    `OPERATION_OUTCOME_UNKNOWN` — it is never re-run.

    Args:
        store: where records live; default: the embedded SQLite store (`default_store()`).
        lease_s: how long a claim survives without a heartbeat; renewed every `lease_s / 3` while
            the tool runs, so it bounds crash detection, not tool duration.
        structured_output: pass the same value as to `@mcp.tool()` if you set it there.
        release_on: exception types that prove nothing happened (e.g. a validation error raised
            before any side effect): the record is deleted so the same id may run again. Every other
            exception is stored as `failed` and replayed.
        finish_on_cancel: let the tool finish and record its outcome when the caller cancels (a
            retry then gets the stored result) instead of interrupting it and recording `unknown`.
            Sync tools always finish: a worker thread cannot be interrupted.
    """
    if lease_s <= 0 or math.isnan(lease_s):
        raise ValueError("lease_s must be positive")

    def decorate(func: Callable[P, Any]) -> Callable[P, Coroutine[Any, Any, Any]]:
        return _wrap(
            func,
            store=store,
            lease_s=lease_s,
            structured_output=structured_output,
            release_on=release_on,
            finish_on_cancel=finish_on_cancel,
        )

    if fn is not None:
        return decorate(fn)
    return decorate


def _wrap(
    func: Callable[P, Any],
    *,
    store: OperationStore | None,
    lease_s: float,
    structured_output: bool | None,
    release_on: tuple[type[BaseException], ...],
    finish_on_cancel: bool,
) -> Callable[P, Coroutine[Any, Any, Any]]:
    if isinstance(func, staticmethod | classmethod):
        raise TypeError("@idempotent must be applied to a plain function, under @mcp.tool()")
    sig = inspect.signature(func, eval_str=True)
    found_ctx = find_context_parameter(func)
    added_ctx = found_ctx is None
    ctx_name = _ADDED_CTX if found_ctx is None else found_ctx
    wrapper_sig = _with_context_parameter(sig, ctx_name) if added_ctx else sig
    is_async = inspect.iscoroutinefunction(inspect.unwrap(func))
    # Output conversion exactly as MCPServer derives it; every parameter is skipped because only the
    # return side is used here (and Context/Resolve parameters must not reach the argument model).
    out_meta = func_metadata(func, skip_names=list(sig.parameters), structured_output=structured_output)
    has_op_arg = OPERATION_ID_ARG in sig.parameters
    default_name = getattr(func, "__name__", "tool")

    target: Callable[..., Any] = func

    async def call(kwargs: dict[str, Any]) -> Any:
        if is_async:
            return await target(**kwargs)
        # A copied context carries current_operation_id() into the worker thread.
        ctx_copy = contextvars.copy_context()
        return await anyio.to_thread.run_sync(functools.partial(ctx_copy.run, target, **kwargs))

    async def answer(*args: P.args, **kwargs: P.kwargs) -> Any:
        if args:
            # MCPServer always calls with keywords; positional calls would bypass the id lookup.
            raise TypeError("an @idempotent tool must be called with keyword arguments")
        ctx = kwargs.pop(ctx_name) if added_ctx else kwargs.get(ctx_name)
        tool_kwargs = {k: v for k, v in kwargs.items() if k != ctx_name}
        meta, tool_name = _request_facts(ctx, default_name)
        try:
            op_id = _operation_id(meta, tool_kwargs.get(OPERATION_ID_ARG) if has_op_arg else None)
        except _InvalidOperationId as exc:
            return error_result("INVALID_OPERATION_ID", str(exc), retryable=False, retry_after_s=None, tool=tool_name)
        if op_id is None:
            # No id: the caller asked for no deduplication, so the tool runs like any other.
            return await call(kwargs)
        the_store = store if store is not None else default_store()
        args_for_fp = {k: v for k, v in tool_kwargs.items() if k != OPERATION_ID_ARG}
        run = _Run(
            store=the_store,
            operation_id=op_id,
            tool=tool_name,
            fingerprint=fingerprint(tool_name, args_for_fp),
            lease_s=lease_s,
            owner=new_owner_id(),
        )
        token = _current.set(op_id)
        try:
            return await run.execute(
                lambda: call(kwargs),
                convert=out_meta.convert_result,
                release_on=release_on,
                # A worker thread cannot be interrupted anyway, so a sync tool always finishes.
                shield=finish_on_cancel or not is_async,
            )
        finally:
            _current.reset(token)

    # A tool with an output schema: its structured content must fit it, even in an error (the TypeScript SDK's clients
    # check it whenever it is there: Claude Code, Cursor and the Inspector showed a schema mismatch, not the refusal).
    # The refusals' envelope goes under `_meta`, where breakwater's own gateway puts its own for the same reason.
    in_meta = out_meta.output_schema is not None

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        result = await answer(*args, **kwargs)
        return envelope_in_meta(result) if in_meta else result

    return _dressed(wrapper, wrapper_sig)


def _dressed(wrapper: Callable[P, Coroutine[Any, Any, Any]], sig: inspect.Signature) -> Callable[P, Coroutine[Any, Any, Any]]:
    """`wrapper` with `sig` as its signature, and its annotations (find_context_parameter reads type hints, so the
    added Context must be in the annotations too)."""
    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    annotations = {name: p.annotation for name, p in sig.parameters.items() if p.annotation is not p.empty}
    if sig.return_annotation is not inspect.Signature.empty:
        annotations["return"] = sig.return_annotation
    wrapper.__annotations__ = annotations
    return wrapper


def _with_context_parameter(sig: inspect.Signature, ctx_name: str) -> inspect.Signature:
    """`sig` with a keyword-only `Context` parameter added, so MCPServer hands the wrapper the request."""
    ctx_param = inspect.Parameter(ctx_name, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    params = list(sig.parameters.values())
    # A keyword-only parameter must come before **kwargs.
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    return sig.replace(parameters=[*params[:at], ctx_param, *params[at:]])


class _InvalidOperationId(ValueError):
    """The call's operation id cannot be used; the message says why."""


def _operation_id(meta: Mapping[str, Any], arg_id: Any) -> str | None:
    """The call's operation id, from `_meta` or else the `operationId` argument (None: no deduplication)."""
    op_id = meta.get(OPERATION_ID_META_KEY)
    if op_id is None:
        op_id = arg_id
    elif arg_id is not None and arg_id != op_id:
        raise _InvalidOperationId(
            f"The call carries two different operation ids ({op_id!r} in _meta, {arg_id!r} as an argument)."
        )
    if op_id is None:
        return None
    if not isinstance(op_id, str) or not op_id or len(op_id) > MAX_OPERATION_ID_LEN:
        raise _InvalidOperationId(f"An operation id must be a non-empty string of at most {MAX_OPERATION_ID_LEN} characters.")
    return op_id


def _request_facts(ctx: Any, default_name: str) -> tuple[dict[str, Any], str]:
    """The request's `_meta` and the tool's registered name (which `@mcp.tool(name=…)` may change)."""
    if not isinstance(ctx, Context):
        return {}, default_name
    try:
        rc = ctx.request_context
    except ValueError:  # called outside a request, e.g. MCPServer.call_tool() from Python
        return {}, default_name
    meta = dict(rc.meta or {})
    name = (rc.params or {}).get("name")
    return meta, name if isinstance(name, str) else default_name


class _Run:
    """One claimed-or-replayed execution of an idempotent tool."""

    def __init__(
        self, *, store: OperationStore, operation_id: str, tool: str, fingerprint: str, lease_s: float, owner: str
    ) -> None:
        self.store = store
        self.operation_id = operation_id
        self.tool = tool
        self.fingerprint = fingerprint
        self.lease_s = lease_s
        self.owner = owner
        self._outcome: tuple[bool, Any] | None = None

    async def execute(
        self,
        call: Callable[[], Awaitable[Any]],
        *,
        convert: Callable[[Any], CallToolResult | InputRequiredResult],
        release_on: tuple[type[BaseException], ...],
        shield: bool,
    ) -> Any:
        try:
            claim = await self.store.claim(
                self.operation_id, tool=self.tool, fingerprint=self.fingerprint, owner=self.owner, lease_s=self.lease_s
            )
        except Exception:
            # Fail closed: running without a record could repeat a side effect, and nothing has
            # happened yet, so the caller may safely retry.
            _log.exception("operation store unavailable while claiming %s", self.operation_id)
            return store_unavailable(self.tool, self.operation_id)
        record = claim.record
        if record.fingerprint != self.fingerprint:
            return mismatch(record, self.tool)
        if not claim.owned:
            if record.state.is_final:
                return _replay(record, self.tool)
            return in_progress(record, self.store.clock.time())

        try:
            started = await self.store.mark_executing(self.operation_id, owner=self.owner, lease_s=self.lease_s)
        except Exception:
            _log.exception("operation store failed while starting %s", self.operation_id)
            await self._shielded(self.store.release(self.operation_id, owner=self.owner))
            return store_unavailable(self.tool, self.operation_id)
        except BaseException:
            # Cancelled before the tool started: nothing happened, so free the id.
            await self._shielded(self.store.release(self.operation_id, owner=self.owner))
            raise
        if not started:  # our pending lease lapsed and someone else took the id over
            current = await self.store.get(self.operation_id)
            if current is not None and current.state.is_final:
                return _replay(current, self.tool)
            return in_progress(current or record, self.store.clock.time())

        try:
            # With `shield`, a cancellation waits until the tool (and its heartbeat) is done.
            with anyio.CancelScope(shield=shield):
                await self._run_with_heartbeat(call)
        except BaseException:
            if self._outcome is None:
                # Cancelled (or interrupted) while the tool ran: its side effect may have started,
                # so the record says `unknown` and a retry with this id is told so, not re-run.
                outcome = {"reason": "cancelled"}
                await self._shielded(
                    self.store.finish(self.operation_id, owner=self.owner, state=OperationState.UNKNOWN, outcome=outcome)
                )
            else:
                # The tool finished just as the cancellation arrived: keep what it did.
                await self._settle(*self._outcome, convert=convert, release_on=release_on)
            raise
        assert self._outcome is not None
        kind, value = await self._settle(*self._outcome, convert=convert, release_on=release_on)
        if kind == "raise":
            raise value
        return value

    async def _settle(
        self,
        ok: bool,
        value: Any,
        *,
        convert: Callable[[Any], CallToolResult | InputRequiredResult],
        release_on: tuple[type[BaseException], ...],
    ) -> tuple[str, Any]:
        """Store what the tool did; ("return", result) or ("raise", exception) for the caller."""
        if ok:
            try:
                result = convert(value)
            except Exception as exc:
                # The tool ran but its return value does not fit its output schema: a crash, recorded.
                ok, value = False, exc
        if not ok:
            if release_on and isinstance(value, release_on):
                await self._shielded(self.store.release(self.operation_id, owner=self.owner))
            else:
                outcome = _error_outcome(value)
                await self._shielded(
                    self.store.finish(self.operation_id, owner=self.owner, state=OperationState.FAILED, outcome=outcome)
                )
            return "raise", value
        if isinstance(result, InputRequiredResult):
            # Not an outcome: the client answers and calls again with the same id, which must run.
            await self._shielded(self.store.release(self.operation_id, owner=self.owner))
            return "return", result
        stored = {"result": result.model_dump(mode="json", by_alias=True, exclude_none=True)}
        await self._shielded(
            self.store.finish(self.operation_id, owner=self.owner, state=OperationState.COMPLETED, outcome=stored)
        )
        return "return", result

    async def _run_with_heartbeat(self, call: Callable[[], Awaitable[Any]]) -> None:
        """Run the tool while renewing the lease; leaves (True, value) or (False, exception) in `_outcome`."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeat)
            try:
                self._outcome = (True, await call())
            except Exception as exc:  # captured here: a task group would wrap it in an ExceptionGroup
                self._outcome = (False, exc)
            tg.cancel_scope.cancel()

    async def _heartbeat(self) -> None:
        while True:
            await self.store.clock.sleep(self.lease_s / 3)
            try:
                if not await self.store.renew(self.operation_id, owner=self.owner, lease_s=self.lease_s):
                    _log.warning("lost the lease on operation %s; its record now says it was abandoned", self.operation_id)
                    return
            except Exception:
                # A store hiccup: keep the tool running and try again next beat; the lease covers
                # two missed beats.
                _log.warning("could not renew the lease on operation %s", self.operation_id, exc_info=True)

    async def _shielded(self, aw: Awaitable[bool]) -> None:
        """Record an outcome even while being cancelled, and never let a store error mask the tool's."""
        # Real time: runs while being cancelled, and must end even when no one moves a fake clock.
        with anyio.move_on_after(FINISH_GRACE_S, shield=True):  # noqa: TID251 - cleanup bound
            try:
                if not await aw:
                    _log.warning("operation %s was no longer ours when recording its outcome", self.operation_id)
            except Exception:
                # The record stays leased and turns `unknown` when the lease lapses: honest, if vague.
                _log.exception("could not record the outcome of operation %s", self.operation_id)


def _error_outcome(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, MCPError):
        return {"error": {"kind": "mcp_error", "code": exc.code, "message": exc.message, "data": exc.data}}
    if isinstance(exc, ToolError):
        return {"error": {"kind": "tool_error", "message": str(exc)}}
    # The exception's text stays out of the store, as MCPServer keeps it out of the response.
    return {"error": {"kind": "crash", "message": type(exc).__name__}}


# ---------------------------------------------------------------------------- get_operation


class OperationStatus(BaseModel):
    """What `get_operation` reports about one operation id."""

    operation_id: str
    state: str = Field(description="pending, executing, completed, failed, unknown, or not_found")
    tool: str | None = None
    created_at: float | None = Field(default=None, description="Unix time the operation was first claimed")
    updated_at: float | None = Field(default=None, description="Unix time of the last state change")
    expires_at: float | None = Field(
        default=None, description="Unix time after which the record may be deleted (a reused id then runs anew)"
    )
    result: dict[str, Any] | None = Field(default=None, description="The stored CallToolResult when completed")
    error: dict[str, Any] | None = Field(default=None, description="The stored error when failed")
    reason: str | None = Field(default=None, description="Why the outcome is unknown")


def add_operation_tool(
    mcp: MCPServer, store: OperationStore | None = None, *, name: str = "get_operation"
) -> Callable[..., Awaitable[OperationStatus]]:
    """Register a read-only tool `get_operation(operation_id)` that reports an operation's record.

    A client that lost the answer to an idempotent call (timeout, cut stream) can ask what happened
    instead of re-running it. Use the same store as the `@idempotent` tools (default: the embedded one).
    Returns the registered function.
    """

    async def get_operation(operation_id: str) -> OperationStatus:
        """Report what happened to an operation: its state and, once finished, its stored outcome."""
        the_store = store if store is not None else default_store()
        record = await the_store.get(operation_id)
        if record is None:
            return OperationStatus(operation_id=operation_id, state="not_found")
        outcome = record.outcome or {}
        error = outcome.get("error")
        return OperationStatus(
            operation_id=record.operation_id,
            state=record.state.value,
            tool=record.tool,
            created_at=record.created_at,
            updated_at=record.updated_at,
            expires_at=record.updated_at + the_store.retention_s if record.state.is_final else None,
            result=outcome.get("result"),
            error={"kind": error.get("kind"), "message": error.get("message")} if isinstance(error, dict) else None,
            reason=outcome.get("reason"),
        )

    get_operation.__name__ = name
    mcp.add_tool(
        get_operation,
        name=name,
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    return get_operation
