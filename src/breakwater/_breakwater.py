"""`Breakwater`: the library entry point an agent holds for the life of its session."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import random
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread
import mcp.types as types
from anyio.abc import TaskGroup

from breakwater._clock import Clock, SystemClock
from breakwater._wire import operation_id_problem
from breakwater.config import Config, JournalPolicy, ServerSpec, find_config, load_config
from breakwater.config._redact import install_log_redaction
from breakwater.connect._admission import Admission, default_admission_dir
from breakwater.connect._protocol_memory import ProtocolMemory, memory_at
from breakwater.connect._transports import TransportFactory, default_transports
from breakwater.connect._upstream import ClientHooks, Upstream
from breakwater.errors import CallError, ConfigError, ToolError
from breakwater.gate._call import CallerProgressCallback
from breakwater.gate._classify import Classifier
from breakwater.gate._envelope import error_result
from breakwater.gate._gate import CallGate, LearnedTimeout, ProgressCallback
from breakwater.gate._tasks import TaskRuntime, TasksClientExtension
from breakwater.gate._turn_budget import TurnBudgetScope, turn_budget
from breakwater.journal import AttemptObserver, Journal, fan_out
from breakwater.state import MemoryStore, StateStore, open_store
from breakwater.status import ServerState, ServerStatus, StatusReport, ToolTimeout
from breakwater.tasks._store import PendingTask, TaskStore

if TYPE_CHECKING:  # imported only when telemetry is on: OpenTelemetry's SDK stays unloaded otherwise
    from breakwater.observe._telemetry import Telemetry

__all__ = ["Breakwater"]

_JOURNAL_CLOSE_S = 2.0


class Breakwater:
    """Connections to every configured MCP server, supervised, with a truthful status.

    Use as an async context manager: entering starts every connect in the background (it never
    blocks on a slow server); leaving closes them all. Enter and exit in the same task.

    ```python
    async with Breakwater.from_config("mcp.json") as bw:
        await bw.wait_ready(timeout=30)
        print(bw.status().to_json())
    ```
    """

    #: "new" until entered, "open" inside `async with`, "closed" after: one `async with` per instance.
    _life = "new"

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        admission_dir: str | os.PathLike[str] | None = None,
        learned_timeout: LearnedTimeout | None = None,
        classifier: Classifier | None = None,
        journal: Journal | Literal["config"] | None = "config",
        state_store: StateStore | None = None,
        observers: Sequence[AttemptObserver] = (),
        telemetry: Telemetry | Literal["config"] | None = "config",
        task_store: TaskStore | None = None,
        transports: TransportFactory = default_transports,
        client_hooks: ClientHooks | None = None,
        protocol_memory_dir: str | os.PathLike[str] | None = None,
        one_client: bool | Collection[str] = False,
    ) -> None:
        """`learned_timeout(server, tool)` may supply a timeout learned from observed latencies (it
        ranks below per-tool and per-server config, above the default); `classifier` may override
        how an attempt's result or exception is classified (see `breakwater.gate._classify`).

        `journal` records every attempt (see `breakwater.journal`): by default the one `[journal]`
        configures (SQLite in the user's data directory unless `url` says otherwise), None for
        none. Unless `learned_timeout` is given, the journal's learned timeouts are used (when
        `[journal] learn_timeouts` is on). Its writer thread runs while the instance is entered.

        `state_store` keeps breaker and retry-budget state (default: the one `[state]` configures,
        in-process unless `url` names Redis); a shared store lets replicas share it. `observers` are
        handed every attempt too, after the journal (metrics, telemetry); a `Journal` among them, entered
        by its owner, also supplies learned timeouts when `journal` is None.

        `telemetry` emits OpenTelemetry spans and metrics for every call (`breakwater.observe._telemetry`):
        by default the one `[telemetry]` configures (off unless `enabled`; when off, OpenTelemetry's
        SDK is never imported), None for none.

        `task_store` remembers calls that servers turned into tasks, so they can be resumed after a
        restart (`pending_tasks()`, `resume_task()`); default: `$BREAKWATER_TASKS_DB`, else
        `tasks.sqlite3` in the user's data directory, opened only when a task is first met.

        `transports` builds each connect attempt's transport (default: what each server's config
        says; `breakwater.testing.in_memory(server)` reaches in-process servers); `client_hooks(spec)`
        adds `mcp.Client` arguments to every connection (the gateway's relay callbacks).

        `protocol_memory_dir` is where each server's protocol revision is remembered between starts
        (default: `[connect] protocol_memory_dir`, the user cache dir unless set; `"off"` for nowhere,
        `""` for the default; with `transports` given, nowhere unless named here). `one_client` says
        this instance serves one client (an agent, a stdio `serve`), for every server or for those
        named: a remembered 2026-07-28 stdio server that offered nothing only that revision carries is
        then spoken to in the cheaper 2025-11-25 (`connect._protocol_memory`)."""
        self.config = config
        install_log_redaction(config.secrets)  # no log record this process writes carries a secret
        self._clock: Clock = clock or SystemClock()
        #: The call journal, or None when it is off.
        self.journal: Journal | None = Journal.from_policy(config.journal, clock=self._clock) if journal == "config" else journal
        learned_timeout, learning = self._learning(learned_timeout, observers)
        #: OpenTelemetry spans and metrics, or None when off.
        self.telemetry: Telemetry | None = self._configured_telemetry() if telemetry == "config" else telemetry
        telemetry = self.telemetry
        self._rng = rng or random.Random()
        directory = admission_dir or config.connect.admission_dir or default_admission_dir()
        self._admission = Admission(clock=self._clock, rng=self._rng, directory=Path(directory).expanduser())
        self._changed = anyio.Event()
        self._transports = transports
        self._client_hooks = client_hooks
        self._memory = _protocol_memory(config, protocol_memory_dir, custom_transports=transports is not default_transports)
        self._one_client = one_client
        self._upstreams = {spec.name: self._upstream_for(spec) for spec in config.servers}
        self._tg: TaskGroup | None = None
        self._generation = 0
        #: Where breaker and retry-budget state lives (`[state]`); in-process by default.
        self.state_store: StateStore = state_store or open_store(config.state, clock=self._clock, rng=self._rng, path=config.path)
        #: Follows, persists and resumes calls that servers turned into tasks (see `breakwater.gate._tasks`).
        self.tasks = TaskRuntime(clock=self._clock, rng=self._rng, store=task_store or TaskStore())
        if telemetry is not None:
            self._configure_telemetry(telemetry)
        self._gate = self._call_gate(learned_timeout, learning, classifier, observers)
        if telemetry is not None:
            telemetry.bind(self._gate)

    def _call_gate(
        self,
        learned_timeout: LearnedTimeout | None,
        learning: JournalPolicy | None,
        classifier: Classifier | None,
        observers: Sequence[AttemptObserver],
    ) -> CallGate:
        telemetry = self.telemetry
        return CallGate(
            self._upstreams,
            clock=self._clock,
            rng=self._rng,
            learned_timeout=learned_timeout,
            classifier=classifier,
            observer=fan_out([o for o in (self.journal, *observers, telemetry) if o is not None]),
            tasks=self.tasks,
            tracer=telemetry,
            # An in-process store keeps nothing the breakers and budgets do not keep themselves: no overhead.
            state=None if isinstance(self.state_store, MemoryStore) else self.state_store,
            learning=learning,
        )

    def _learning(
        self, given: LearnedTimeout | None, observers: Sequence[AttemptObserver]
    ) -> tuple[LearnedTimeout | None, JournalPolicy | None]:
        """The learned-timeout hook, and the policy the gate learns by until the journal's refresh has a value.

        From this instance's journal, else from a journal among `observers`: a shared gateway's session hands its
        own servers' attempts to the gateway's journal that way, and their learned timeouts never took effect (a tool
        that answered in 0.1 s for an hour was still cut at the 5 s default when it hung)."""
        journal = self.journal or next((o for o in observers if isinstance(o, Journal)), None)
        if given is not None or journal is None or not journal.policy.learn_timeouts:
            return given, None
        return journal.learned_timeout, journal.policy

    @classmethod
    def from_config(cls, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Breakwater:
        """Build from a breakwater.toml or an mcpServers JSON file (default: found in the current directory)."""
        if path is None:
            try:
                path = find_config()
            except ConfigError as exc:
                # Its fix is the command line's ("pass --config PATH"), a flag a library caller has not got.
                fix = "pass the file's path, Breakwater.from_config(PATH), or create .mcp.json with an mcpServers object"
                raise ConfigError(exc.detail, path=exc.path, key=exc.key, fix=fix) from None
        return cls(load_config(path), **kwargs)

    async def __aenter__(self) -> Breakwater:
        if self._life != "new":
            # A second enter started every server again beside the first, and its exit crashed the first's.
            raise RuntimeError(f"this Breakwater was {'entered' if self._life == 'open' else 'closed'} already: make another")
        self._check_event_loop()
        self._life = "open"
        if self.journal is not None:
            # A thread, not a task: the store's I/O never runs on (or waits for) the event loop.
            self.journal.start()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if not isinstance(self.state_store, MemoryStore):
            self._tg.start_soon(self.state_store.run, name="breakwater state store")
            # Bounded: an unreachable store leaves it degraded (local state), it never delays start-up for long.
            await self.state_store.connect()
        for upstream in self._upstreams.values():
            self._tg.start_soon(upstream.run, name=f"breakwater upstream {upstream.spec.name}")
        return self

    def _check_event_loop(self) -> None:
        """Refuse to start stdio servers on an event loop other than asyncio's.

        Breakwater's stdio transport (`connect._stdio`) runs on asyncio's own pipes, for speed: under trio every stdio
        server failed with "protocol error: RuntimeError: no running event loop" and was retried forever, blamed on the
        server. HTTP servers, and transports of the caller's own (`breakwater.testing.in_memory`), run on any backend."""
        library = _async_library()
        if library == "asyncio" or self._transports is not default_transports:
            return
        stdio = [spec.name for spec in self.config.servers if spec.enabled and spec.transport == "stdio"]
        if stdio:
            raise RuntimeError(
                f"breakwater runs stdio servers on asyncio only, not on {library} (stdio servers here: {', '.join(stdio)}): "
                "run your code with `anyio.run(main)` (its default backend is asyncio) or `asyncio.run(main())`"
            )

    def _upstream_for(self, spec: ServerSpec) -> Upstream:
        return Upstream(
            spec,
            clock=self._clock,
            rng=self._rng,
            admission=self._admission,
            on_change=self._note_change,
            extensions=[TasksClientExtension(clock=self._clock)],
            transports=self._transports,
            client_hooks=self._client_hooks,
            memory=self._memory,
            one_client=self._one_client if isinstance(self._one_client, bool) else spec.name in self._one_client,
        )

    def _configured_telemetry(self) -> Telemetry | None:
        if not self.config.telemetry.enabled:
            return None
        from breakwater.observe._telemetry import Telemetry

        return Telemetry.from_policy(self.config.telemetry, clock=self._clock)

    def _configure_telemetry(self, telemetry: Telemetry) -> None:
        if not telemetry.transports:
            telemetry.transports = {spec.name: spec.transport for spec in self.config.servers}
        if telemetry.protocol_of is None:
            upstreams = self._upstreams
            telemetry.protocol_of = lambda name: upstreams[name].protocol if name in upstreams else None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._tg is None:
            # Was a bare AssertionError.
            raise RuntimeError(
                f"this Breakwater was {'closed already' if self._life == 'closed' else 'never entered'}: "
                "leave its `async with` once"
            )
        self._life = "closed"
        # Waiters in `wait_changed` (another task's) wake now and hear it is closed, instead of waiting forever.
        self._changed.set()
        # A call waiting for its server to come back (another task's) ends now, not at its timeout.
        for upstream in self._upstreams.values():
            upstream.close_waits()
        # Tasks still being polled stay running upstream and remembered, for the next start to resume.
        self.tasks.closing = True
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The body's own exception, wrapped by the task group this context entered: raised as it was, so `except
            # CallError` around `async with Breakwater(...)` catches `raise_on_error`'s errors (it got an ExceptionGroup).
            if exc is not None and _only(group, exc):
                raise exc from None
            raise
        finally:
            self._tg = None
            if not isinstance(self.state_store, MemoryStore):
                with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):  # noqa: TID251 - real-time shutdown bound
                    await self.state_store.aclose()
            if self.journal is not None:
                with anyio.CancelScope(shield=True):
                    # Bounded: a wedged store costs at most this at shutdown, and loses its queue.
                    await anyio.to_thread.run_sync(self.journal.close, _JOURNAL_CLOSE_S)
            if self.telemetry is not None and self.telemetry.owned:
                # In a thread: the last export may wait on an unreachable collector (its own timeouts bound it).
                with anyio.CancelScope(shield=True), anyio.move_on_after(_JOURNAL_CLOSE_S):  # noqa: TID251 - real-time shutdown bound
                    await anyio.to_thread.run_sync(self.telemetry.shutdown, abandon_on_cancel=True)

    def _note_change(self, _upstream: Upstream) -> None:
        self._generation += 1
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def generation(self) -> int:
        """A counter that moves on every state or tool-list change of any server (for caches of derived views)."""
        return self._generation

    # ---- status ----------------------------------------------------------------------------

    def status(self) -> StatusReport:
        """Every server's state right now, and the timeout in force for each tool of a ready one.

        Raises RuntimeError after this instance's `async with` ended (it said "ready" for servers it had stopped)."""
        if self._life == "closed":
            self._check_open()
        gate = self._gate
        timeouts = []
        for name, upstream in self._upstreams.items():
            if upstream.state is ServerState.READY:
                for tool in upstream.tools:
                    found = gate.timeout_in_force(name, tool.name)
                    if found is not None:
                        learned_at = gate.learned_at(name, tool.name) if found[1] == "learned" else None
                        timeouts.append(
                            ToolTimeout(server=name, tool=tool.name, timeout_s=found[0], source=found[1], learned_at=learned_at)
                        )
        return StatusReport(servers=tuple(self._snapshot(u) for u in self._upstreams.values()), timeouts=tuple(timeouts))

    @staticmethod
    def _snapshot(upstream: Upstream) -> ServerStatus:
        """`upstream.snapshot()`, with what its entry configures for tools it does not list (a ready one's)."""
        snapshot = upstream.snapshot()
        if upstream.state is not ServerState.READY:
            return snapshot
        listed = {t.name for t in upstream.tools} | {t.name for t in snapshot.rejected_tools}
        unmatched = upstream.spec.unmatched_tools(listed)
        return dataclasses.replace(snapshot, unmatched=unmatched) if unmatched else snapshot

    async def wait_changed(self) -> None:
        """Return at the next state change of any server.

        Raises RuntimeError outside this instance's `async with`, and in a waiter when it ends (it waited forever)."""
        self._check_open()
        await self._changed.wait()
        self._check_open()

    async def wait_ready(self, timeout: float | None = None) -> StatusReport:
        """Wait until every server is ready or not worth waiting for (failed or disabled), or `timeout` passes.

        Returns the status at that moment; never raises for servers that did not connect.
        """
        self._check_open()
        deadline = self._clock.monotonic() + (timeout if timeout is not None else float("inf"))
        with self._clock.deadline_scope(deadline):
            while not all(u.settled for u in self._upstreams.values()):
                await self.wait_changed()
        return self.status()

    # ---- calls -------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        """The clock every timeout and deadline of this instance runs on."""
        return self._clock

    def upstream(self, server: str) -> Upstream:
        """The supervised connection to `server` (KeyError if it is not configured)."""
        return self._upstreams[server]

    async def call_tool(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        progress_callback: CallerProgressCallback | None = None,
        raise_on_error: bool = False,
        operation_id: str | None = None,
    ) -> types.CallToolResult:
        """Call `tool` on `server` through the call gate; see the README's "Calls and errors".

        Returns the tool's `CallToolResult`. Every failure (breakwater's own refusals, timeouts,
        transport errors, the tool's own `isError` result) is also a `CallToolResult` with
        `isError: true` and the error envelope in `structuredContent`, unless `raise_on_error` is
        set: then it is raised as the `CallError` subclass for its code. `timeout` overrides the
        resolved per-attempt timeout for this call; `progress_callback` receives the tool's
        progress notifications. Cancelling the caller cancels the call upstream and is re-raised.
        `operation_id` names the logical call (pass the same one when re-sending a call that may
        have run); by default each call gets a fresh one. It is for tools that change things: a
        read-only tool's calls carry no operation id (one given is ignored).

        Raises RuntimeError outside this instance's `async with`, ValueError for a `timeout` that is no positive
        number of seconds or an `operation_id` that is no non-empty string of at most 255 characters, and TypeError
        for `arguments` that are no mapping or an `operation_id` that is no string, before anything is sent; an
        exception of `progress_callback` (an async or a plain function) cancels the call and is raised as it was.
        """
        self._check_open()
        if operation_id is not None:
            # Was judged by the tool: INVALID_ARGUMENTS for one that changes things, dropped unsaid for a read-only one.
            if not isinstance(operation_id, str):
                raise TypeError(f"operation_id must be a string, got {type(operation_id).__name__}")
            if (problem := operation_id_problem(operation_id)) is not None:
                raise ValueError(problem)
        if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout < math.inf):
            # -1 sent nothing and counted a timeout against the tool: four opened its breaker for every caller.
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise TypeError(f"arguments must be a mapping of the tool's arguments, got {type(arguments).__name__}")
        if progress_callback is None:
            # `CallGate.answer`: `call` and `call_or_raise` in one coroutine, by position (no name matching).
            return await self._gate.answer(server, tool, arguments, timeout, None, operation_id, raise_on_error)
        failure: list[Exception] = []
        with anyio.CancelScope() as scope:
            relay = _guarded(progress_callback, failure, scope)
            return await self._gate.answer(server, tool, arguments, timeout, relay, operation_id, raise_on_error)
        raise failure[0]

    async def gate_call(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None,
        *,
        progress_callback: ProgressCallback | None,
        operation_id: str | None,
    ) -> types.CallToolResult:
        """`call_tool` without its checks of a library caller's input, for the gateway: its arguments were read from
        JSON already, and its progress relay never raises (a per-call guard was a cost on its hot path)."""
        return await self._gate.answer(server, tool, arguments, None, progress_callback, operation_id, False)

    def _check_open(self) -> None:
        if self._life != "open":
            # Before: a call waited 5 s and said "still starting up"; after: "ready" and "connecting" at once.
            when = "before `async with Breakwater(...)` was entered" if self._life == "new" else "after its `async with` ended"
            raise RuntimeError(f"this Breakwater is used {when}: call it inside `async with`")

    def pending_tasks(self) -> list[PendingTask]:
        """Tasks started through breakwater (by this or an earlier process) whose end no one has seen yet."""
        return self.tasks.store.all() if self.tasks.store is not None else []

    async def resume_task(self, task_id: str, *, server: str | None = None, raise_on_error: bool = False) -> types.CallToolResult:
        """Poll a remembered task (see `pending_tasks()`) until it ends, and return its result.

        For a process that restarted while a call it made was running as a task on a server: the
        result comes back as `call_tool` would have returned it (an error envelope on failure, or
        the `CallError` with `raise_on_error`). Its deadline is the one set when it started (and
        the current turn budget, if shorter); when it passes, the task is cancelled upstream. It
        waits for the server to be ready. Not counted by breakers or the bulkhead: the call was
        admitted when it started. Raises `KeyError` for a task id that is not remembered (never
        started here, already resumed, or given up).
        """
        pending = self.tasks.store.get(task_id, server) if self.tasks.store is not None else None
        if pending is None:
            raise KeyError(f"no remembered task {task_id!r}" + (f" on server {server!r}" if server else ""))
        upstream = self._upstreams.get(pending.server)
        if upstream is None:
            raise KeyError(f"task {task_id!r} belongs to server {pending.server!r}, which is not configured here")
        try:
            result = await self.tasks.resume(upstream, pending, poll_timeout_s=upstream.spec.call.timeout_s)
        except CallError as err:
            err.server, err.tool, err.operation_id = pending.server, pending.tool, pending.operation_id
            if raise_on_error:
                raise
            return error_result(err)
        if raise_on_error and result.is_error:
            raise ToolError(
                server=pending.server,
                tool=pending.tool,
                content=result.content,
                upstream_structured_content=result.structured_content,
                operation_id=pending.operation_id,
            )
        return result

    def budget(self, seconds: float | None = None, *, deadline: float | None = None, enforce: bool = False) -> TurnBudgetScope:
        """A whole-turn budget: `async with bw.budget(seconds=60):` bounds every call inside it.

        Each call's deadline is the earlier of its own and the budget's; no attempt starts that the
        budget cannot cover (BUDGET_EXHAUSTED) and retries stop when it runs low. Nested budgets
        keep the earlier deadline; the budget follows the calls into tasks they spawn. `deadline`
        is an absolute time on this instance's clock (`monotonic()`); `enforce=True` also cancels
        the body at the deadline.
        """
        return turn_budget(seconds, clock=self._clock, deadline=deadline, enforce=enforce)

    def gate_status(self) -> dict[str, Any]:
        """Breakers, retry budgets and in-flight counts of the call gate, JSON-ready (for `status`)."""
        return {
            "breakers": [b.as_dict() for b in self._gate.breaker_snapshots()],
            "retry_budgets": {
                name: {"tokens": round(b.tokens, 3), "retries_granted": b.retries_granted, "retries_refused": b.retries_refused}
                for name, b in self._gate.retry_budget_snapshots().items()
            },
            "in_flight": self._gate.in_flight(),
            "state_store": self.state_store_status(),
        }

    def state_store_status(self) -> dict[str, Any]:
        """The state store's backend and health, JSON-ready: `{"backend": "redis", "state": "ok" | "degraded", ...}`.

        "degraded" means the shared store is unreachable or slow and every breaker and budget runs
        on local state; calls are unaffected.
        """
        return self.state_store.status().as_dict()

    @property
    def gate(self) -> CallGate:
        """The call gate itself (breakers, retry budgets, resolved timeouts)."""
        return self._gate


def _async_library() -> str:
    """The async library running the current task ("asyncio", "trio"), as sniffio names it (trio requires sniffio)."""
    try:
        import sniffio
    except ImportError:  # not installed: no trio either, so asyncio
        return "asyncio"
    return sniffio.current_async_library()


def _guarded(callback: CallerProgressCallback, failure: list[Exception], scope: anyio.CancelScope) -> ProgressCallback:
    """A library caller's progress callback, as the gate calls it: its exception is the caller's.

    An exception of `callback` was read as the server's failure (UPSTREAM_ERROR, "the connection failed"), and four
    opened the tool's breaker for every caller. Now the first one is kept in `failure` and `scope` is cancelled (the call
    with it, upstream too); `call_tool` raises it. A plain (not async) function is taken too.
    """

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        try:
            said = callback(progress, total, message)
            if inspect.isawaitable(said):
                await said
        except Exception as exc:
            if not failure:
                failure.append(exc)
                scope.cancel()

    return relay


def _only(group: BaseExceptionGroup[BaseException], exc: BaseException) -> bool:
    """Whether `exc` is all `group` holds, beside the cancellations of the tasks it ended."""
    rest = group.split(lambda e: e is exc or isinstance(e, anyio.get_cancelled_exc_class()))[1]
    return rest is None and any(e is exc for e in _leaves(group))


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [leaf for e in group.exceptions for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]


def _protocol_memory(
    config: Config, directory: str | os.PathLike[str] | None, *, custom_transports: bool
) -> ProtocolMemory | None:
    """Where servers' protocol revisions are remembered (`Breakwater(protocol_memory_dir=...)`), or None for nowhere.

    Servers reached through transports of the caller's own (in-process fixtures, the fleet lab) are not
    the configured ones, and a lab run must not depend on what an earlier run learned: nothing, unless named.
    """
    if directory is not None:
        return memory_at(os.fspath(directory))
    return None if custom_transports else memory_at(config.connect.protocol_memory_dir)
