"""One upstream server, supervised: connect through admission, keep it ready, reconnect when it drops.

Each upstream owns one `mcp.Client` inside its own task (the SDK requires a client to be entered
and exited in the same task, and its transport failures surface as exception groups that would
otherwise cancel unrelated work). Callers in other tasks use the client while the state is
`ready`; a call that sees the connection die reports it here with `report_lost()`.

The connect loop:

    pending --jitter--> connecting --ok--> ready --drop--> retrying (new round, full budget)
                           |  ^
                      fail |  | backoff (full jitter) while the round's budget lasts
                           v  |
                        retrying --budget spent--> failed --slow background cadence--> connecting
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import anyio
import httpx2
import mcp.types as types
from mcp import Client
from mcp.client.extension import ClientExtension
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from breakwater._backoff import Backoff
from breakwater._clock import Clock
from breakwater.config import ServerSpec
from breakwater.config._redact import Redactor
from breakwater.connect._admission import Admission, Slot
from breakwater.connect._failures import classify, crashed_again, describe, lost_error, repeated_exit, timeout_error
from breakwater.connect._lines import UPSTREAM_NAME, quiet_sdk_junk_logs
from breakwater.connect._protocol_memory import (
    ProtocolMemory,
    Recalled,
    lift_sdk_probe_timeout,
    needs_modern,
    noting_questions,
)
from breakwater.connect._stdio import StdioProcess
from breakwater.connect._tool_list import list_all_tools
from breakwater.connect._transports import OpenedTransport, TransportFactory, default_transports
from breakwater.status import PERSISTENT_REASONS, ErrorInfo, Reason, RejectedTool, ServerState, ServerStatus

__all__ = ["ClientHooks", "Upstream"]

#: Given a server's spec, extra keyword arguments for its `mcp.Client` (callbacks, log level).
ClientHooks = Callable[[ServerSpec], Mapping[str, Any]]

logger = logging.getLogger("breakwater.upstream")

CLIENT_NAME = "breakwater"
UNSUPPORTED_PROTOCOL_VERSION = -32022
BACKGROUND_JITTER = 0.5  # background attempts are spread over mean * [1 - j, 1 + j]
CRASH_LOOP_EXITS = 3  # identical exits in a row that make a server `failed` before its budget is spent


class Upstream:
    """A supervised connection to one server, with a truthful state."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        clock: Clock,
        rng: random.Random,
        admission: Admission,
        on_change: Callable[[Upstream], None] = lambda _u: None,
        extensions: Sequence[ClientExtension] = (),
        transports: TransportFactory = default_transports,
        client_hooks: ClientHooks | None = None,
        memory: ProtocolMemory | None = None,
        one_client: bool = False,
    ) -> None:
        """`extensions` are the SDK client extensions every connection carries (the gate's tasks
        extension, so a 2026-07-28 server may answer a call with a task handle). `transports`
        builds each attempt's transport (default: what the spec's `transport` says; tests pass an
        in-process server, see `breakwater.testing.in_memory`). `client_hooks` adds `mcp.Client`
        arguments for each connection (the gateway's relay callbacks). `memory` keeps the server's
        protocol revision between starts; `one_client` says the server serves one client, which lets
        a remembered 2026-07-28 server be spoken to in the cheaper 2025-11-25 (`connect._protocol_memory`)."""
        lift_sdk_probe_timeout()
        quiet_sdk_junk_logs()
        self._transports = transports
        self._extensions = list(extensions)
        self.spec = spec
        self._clock = clock
        self._rng = rng
        self._admission = admission
        self._on_change = on_change
        policy = spec.connect
        self._backoff = Backoff(base_s=policy.backoff_base_s, cap_s=max(policy.backoff_cap_s, policy.backoff_base_s))
        self.state = ServerState.DISABLED if not spec.enabled else ServerState.PENDING
        self.attempts = 0
        self.round_attempt = 0
        self.phase: str | None = None
        self.connect_ms: int | None = None
        self.next_retry_at: float | None = None
        self.error: ErrorInfo | None = None
        self.failing_since: float | None = None  # wall time of the first failure since last ready
        self.attempt_started_at: float | None = None  # wall time the latest attempt's handshake began
        self.last_drop: ErrorInfo | None = None
        self.last_drop_at: float | None = None
        self._ready_at = 0.0  # monotonic time the server was last ready
        self.protocol: str | None = None
        self.tools: list[types.Tool] = []
        #: Tools the server listed with an invalid definition, left out of `tools` (see `_tool_list.py`).
        self.rejected_tools: list[RejectedTool] = []
        self.client: Client | None = None
        #: The stdio process behind `client`, while it is connected (None for HTTP and in-memory servers).
        self.process: StdioProcess | None = None
        self._era: str | None = None
        self._prior_discover: Any = None
        self._memory = memory
        self._one_client = one_client
        #: What an earlier start knew of the server, while this process goes by it (None: probing, or pinned in config).
        self._recalled: Recalled | None = None
        self._recall_tried = False  # memory is consulted once, by a start's first attempt
        #: A `url` of no stated type that refused streamable HTTP (404, 405): attempts go over legacy SSE.
        self._legacy_sse = False
        self._lost = anyio.Event()
        self._relist = anyio.Event()  # the server said its tools changed (notifications/tools/list_changed)
        #: Moves when the server says its prompts or resources changed: the gateway tells its clients to list again.
        self.lists_version = 0
        self._listing = anyio.Lock()  # one tools/list at a time: the health check's or a change's
        self.ready_event = anyio.Event()
        self._changed = anyio.Event()  # set (and replaced) at every state change
        self.closing = False  # its `Breakwater` closed: nothing comes back after that
        self._redact = Redactor(spec.secrets)
        #: Extra `mcp.Client` arguments for this server's next connections: the gateway's relay callbacks
        #: (sampling, elicitation, log messages, resource updates). None: the SDK's defaults. Read at
        #: each connect, so a gateway built after the connects began still reaches every connection.
        self.client_hooks = client_hooks

    def snapshot(self) -> ServerStatus:
        """The state as of now."""
        ready = self.state is ServerState.READY
        return ServerStatus(
            name=self.spec.name,
            transport="sse" if self._legacy_sse else self.spec.transport,
            state=self.state,
            protocol=self.protocol,
            tools=len(self.tools) if ready else None,
            attempts=self.attempts,
            attempt=self.round_attempt,
            phase=self.phase,
            connect_ms=self.connect_ms,
            next_retry_at=self.next_retry_at,
            error=None if self.error is None else self._redacted(self.error),
            failing_since=self.failing_since,
            rejected_tools=tuple(replace(t, reason=self._redact(t.reason)) for t in self.rejected_tools) if ready else (),
            disabled_by=self.spec.disabled_by if self.state is ServerState.DISABLED else None,
            last_drop=None if self.last_drop is None else self._redacted(self.last_drop),
            last_drop_at=self.last_drop_at,
            attempt_started_at=self.attempt_started_at if self.phase == "handshake" else None,  # only ever while connecting
        )

    def _redacted(self, error: ErrorInfo) -> ErrorInfo:
        tail = tuple(self._redact(line) for line in error.stderr_tail)
        return replace(error, message=self._redact(error.message), stderr_tail=tail)

    def close_waits(self) -> None:
        """Its `Breakwater` is closing: a call waiting for it to come back (`wait_until_ready`) stops waiting."""
        self.closing = True
        self._set(self.state)

    async def wait_changed(self) -> None:
        """Return at this server's next state change (or phase change while connecting)."""
        await self._changed.wait()

    def report_lost(self) -> None:
        """A caller saw the connection die (e.g. MCPError -32000): reconnect."""
        self._drop()

    def _drop(self) -> None:
        """The connection is gone: say so at once, then let the supervisor tear it down and reconnect.

        Tearing down (stopping a process, closing streams) takes a while; the state stayed `ready` with the dead
        client meanwhile, so a caller's retry in that window was sent on it and failed at once, every attempt of it."""
        if self.state is ServerState.READY:
            self._set(ServerState.CONNECTING, client=None, phase=None)
        self._lost.set()

    @property
    def settled(self) -> bool:
        """Ready, disabled, or failed: nothing more will happen soon without a background retry."""
        return self.state in (ServerState.READY, ServerState.DISABLED, ServerState.FAILED)

    def _set(self, state: ServerState, **changes: Any) -> None:
        self.state = state
        for key, value in changes.items():
            setattr(self, key, value)
        if state is ServerState.READY:
            self.failing_since, self._ready_at = None, self._clock.monotonic()
            self.ready_event.set()
        elif self.ready_event.is_set():
            self.ready_event = anyio.Event()
        self._changed.set()
        self._changed = anyio.Event()
        self._on_change(self)

    # ---- the supervisor ---------------------------------------------------------------------

    async def run(self) -> None:
        """Connect and stay connected until cancelled (in a task of its own: `UPSTREAM_NAME` is this task's)."""
        UPSTREAM_NAME.set(self.spec.name)
        if not self.spec.enabled:
            self._set(ServerState.DISABLED)
            return
        policy = self.spec.connect
        await self._clock.sleep(self._rng.uniform(0.0, policy.startup_jitter_s))
        round_started = self._clock.monotonic()
        self.round_attempt = 0
        failed = False
        same_exit = 0
        while True:
            previous = self.error
            connected = await self._attempt()
            if not connected and self._switch_transport():
                continue  # the same URL over the other transport, at once: no failure of the server's yet
            if connected and not crashed_again(previous, self.error, self._clock.monotonic() - self._ready_at):
                # A drop starts a fresh round with the full budget: the server was healthy a moment ago.
                round_started = self._clock.monotonic()
                self.round_attempt = 0
                failed = False
                same_exit = 0
                continue
            assert self.error is not None
            if self.failing_since is None:
                self.failing_since = self._clock.time()
            same_exit = same_exit + 1 if repeated_exit(previous, self.error) else 0
            now = self._clock.monotonic()
            # A process that exits the same way again and again is a crash loop, not a slow start.
            if failed or self.error.code in PERSISTENT_REASONS or same_exit + 1 >= CRASH_LOOP_EXITS:
                failed = True
            else:
                delay = self._backoff.delay(self.round_attempt - 1, self._rng)
                failed = now + delay - round_started > policy.budget_s
            if failed:
                mean = policy.background_retry_s
                delay = self._rng.uniform(mean * (1 - BACKGROUND_JITTER), mean * (1 + BACKGROUND_JITTER))
            self._set(
                ServerState.FAILED if failed else ServerState.RETRYING,
                next_retry_at=self._clock.time() + delay,
                phase=None,
            )
            await self._clock.sleep(delay)

    def _switch_transport(self) -> bool:
        """After a failed attempt to a `url` of no stated type: whether to try legacy SSE now. A streamable HTTP server
        answers the handshake's POST; a legacy HTTP+SSE endpoint answers it 404 or 405. The spec's backwards
        compatibility: on such a 4xx, open the same URL as SSE; if refused alike, the next attempt is streamable HTTP."""
        error = self.error
        if error is None or error.code is not Reason.HTTP_STATUS or not self.spec.legacy_sse_answer(error.http_status):
            return False
        self._legacy_sse = not self._legacy_sse
        return self._legacy_sse

    def _slots(self) -> list[Slot]:
        policy = self.spec.connect
        if self.spec.transport == "stdio":
            identity = Admission.key_for("stdio", self.spec.command or "", *self.spec.args, self.spec.cwd or "")
            return [
                Slot("stdio", policy.max_stdio_connects),
                Slot(f"server-{identity}", policy.max_per_server_connects),
            ]
        origin = httpx2.URL(self.spec.url or "")
        identity = Admission.key_for("http", f"{origin.scheme}://{origin.host}:{origin.port}")
        return [
            Slot("http", policy.max_http_connects, shared=False),
            Slot(f"server-{identity}", policy.max_per_server_connects),
        ]

    async def _attempt(self) -> bool:
        """One connect attempt; returns True if it got to `ready` (and has since dropped)."""
        self.attempts += 1
        self.round_attempt += 1
        self._set(ServerState.CONNECTING, phase="queued", next_retry_at=None)
        ticket = await self._admission.acquire(self._slots())
        self._set(ServerState.CONNECTING, phase="handshake", attempt_started_at=self._clock.time())
        policy = self.spec.connect
        started = self._clock.monotonic()
        self._lost = anyio.Event()
        opened: OpenedTransport | None = None
        reached_ready = False
        spec = replace(self.spec, transport="sse") if self._legacy_sse else self.spec
        try:
            with self._clock.deadline_scope(started + policy.attempt_timeout_s) as scope:
                async with AsyncExitStack() as stack:
                    opened = await self._transports(spec, stack, report_lost=self.report_lost)
                    mode = self._mode_kwargs()
                    hooks = dict(self.client_hooks(self.spec)) if self.client_hooks is not None else {}
                    hooks["message_handler"] = self._hear_list_changes(hooks.get("message_handler"))
                    if self._memory is not None and self.spec.connect.protocol == "auto":
                        hooks = noting_questions(hooks, self._asked)
                    self._relist = anyio.Event()
                    client = Client(
                        opened.target,
                        cache=None,
                        client_info=_client_info(),
                        extensions=self._extensions,
                        **mode,
                        **hooks,
                    )
                    await stack.enter_async_context(client)
                    if mode["mode"] == "2026-07-28" and mode.get("prior_discover") is None:
                        # A version pin makes the SDK adopt a made-up discover result with no
                        # capabilities, which would hide the server's prompts and resources: ask.
                        raw = await client.session.send_discover("2026-07-28")
                        client.session.adopt(types.DiscoverResult.model_validate(raw))
                    tools, self.rejected_tools = await list_all_tools(client, self.spec.tool_filter)
                    # Connected: lift the attempt deadline for the life of the connection, and give
                    # the admission slot back now, not when the connection ends.
                    scope.deadline = math.inf
                    opened.ready()
                    ticket.release()
                    self._remember_era(client, tools)
                    self.client = client
                    self.process = opened.process
                    reached_ready = True
                    self._set(
                        ServerState.READY,
                        tools=tools,
                        protocol=client.protocol_version,
                        connect_ms=round((self._clock.monotonic() - started) * 1000),
                        error=None,
                        phase=None,
                    )
                    await self._serve(client, opened)
            if scope.cancelled_caught and not reached_ready:
                self.error = timeout_error(_process(opened), policy.attempt_timeout_s)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception | BaseExceptionGroup):
                raise
            self.error = classify(
                exc,
                spec,
                process=_process(opened),
                http_status=None if opened is None else opened.http_status,
                was_ready=reached_ready,
                auth_required=None if opened is None else opened.auth_required,
            )
        finally:
            ticket.release()
            self.client = None
            self.process = None
            self.tools = [] if not reached_ready else self.tools
        return self._after_attempt(reached_ready, _process(opened))

    def _after_attempt(self, reached_ready: bool, process: StdioProcess | None) -> bool:
        """Settle the error an attempt ended with, and the protocol revision to try next."""
        if reached_ready:
            if self.error is None or self.error.code not in (Reason.CONNECTION_LOST, Reason.UNHEALTHY):
                self.error = lost_error(process)
            self.last_drop, self.last_drop_at = self.error, self._clock.time()  # kept past the next ready
            return True
        if self.error is None:  # pragma: no cover - every path above sets it
            self.error = ErrorInfo(code=Reason.PROTOCOL_ERROR, message="the connection ended during the handshake")
        if self._recalled is not None:
            # A connect that went by what an earlier start learned did not get there (the server may be
            # another one now): the next attempt goes by what this one proved, not by the memory.
            self._distrust_memory(refused=self.error.code is Reason.PROTOCOL_ERROR)
        elif self.error.code is Reason.PROTOCOL_ERROR:
            self._next_era_after_protocol_error()
        elif self.error.code is Reason.TIMEOUT and self._era is None and self.spec.connect.protocol == "auto":
            # A server that never answered the server/discover probe may be one that swallows unknown
            # methods; the initialize handshake works with every server of either era.
            self._era = "legacy"
        return False

    async def _serve(self, client: Client, opened: OpenedTransport) -> None:
        """Hold the connection until it is lost (process exit, failed health check, caller report)."""
        async with anyio.create_task_group() as tg:
            if (stdio := opened.process) is not None:

                async def watch_exit() -> None:
                    await stdio.exited.wait()
                    self._drop()

                tg.start_soon(watch_exit)
            if (interval := self.spec.connect.health_interval_s) > 0:
                tg.start_soon(self._health_loop, client, interval)
            tg.start_soon(self._follow_list_changes, client)
            await self._lost.wait()
            tg.cancel_scope.cancel()
        await opened.settle(self._clock, self.spec.call.timeout_s)

    def _hear_list_changes(self, then: Callable[[Any], Awaitable[None]] | None) -> Callable[[Any], Awaitable[None]]:
        """The client's message handler: note a `notifications/tools/list_changed`, then hand every message to `then`."""

        async def handle(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                self._relist.set()
            elif isinstance(message, types.PromptListChangedNotification | types.ResourceListChangedNotification):
                self._lists_changed()
            if then is not None:
                await then(message)

        return handle

    async def _follow_list_changes(self, client: Client) -> None:
        """List the tools again as soon as the server says they changed.

        A server may add tools while it runs (GitHub's dynamic toolsets, a tool that unlocks others) and
        says so with `notifications/tools/list_changed`; until the next health check (every
        `health_interval_s`, 30 s by default) the gateway would list them nowhere, and the model would
        take a tool it was just offered for one that does not exist. Changes that come while a list is
        under way are taken by one more list after it. A 2026-07-28 server that offers the notification
        sends it on a `subscriptions/listen` stream, which is held open for it.
        """
        async with anyio.create_task_group() as tg:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                caps = client.server_capabilities
                offered = {
                    kind: bool(getattr(getattr(caps, kind, None), "list_changed", False))
                    for kind in ("tools", "prompts", "resources")
                }
                if any(offered.values()):
                    tg.start_soon(self._listen_for_list_changes, client, offered)
            while True:
                await self._relist.wait()
                self._relist = anyio.Event()
                if not await self._list_again(client, "re-listing after the server's tools/list_changed"):
                    tg.cancel_scope.cancel()
                    return

    def _lists_changed(self) -> None:
        self.lists_version += 1
        self._on_change(self)

    async def _listen_for_list_changes(self, client: Client, offered: Mapping[str, bool]) -> None:
        """On 2026-07-28 a server says its lists changed only on a `subscriptions/listen` stream: hold one open.

        Its frames also reach the client's message handler (`_hear_list_changes`), which acts on them; the
        events are only drained here."""
        try:
            async with client.listen(
                tools_list_changed=offered["tools"],
                prompts_list_changed=offered["prompts"],
                resources_list_changed=offered["resources"],
            ) as changes:
                async for _ in changes:
                    pass
        except Exception as exc:  # refused, or the stream dropped: the health check still finds changes, later
            logger.debug("%s: no tools/list_changed stream (%s); the health check finds changes", self.spec.name, describe(exc))

    async def _health_loop(self, client: Client, interval: float) -> None:
        while True:
            await self._clock.sleep(interval * self._rng.uniform(0.8, 1.2))
            if not await self._list_again(client, "health check"):
                return

    async def _list_again(self, client: Client, why: str) -> bool:
        """List the server's tools again and take any change (names or definitions); False when that failed
        (the connection is dropped as unhealthy)."""
        async with self._listing:
            deadline = self._clock.monotonic() + self.spec.connect.attempt_timeout_s
            try:
                with self._clock.deadline_scope(deadline) as scope:
                    tools, rejected = await list_all_tools(client, self.spec.tool_filter)
            except Exception as exc:
                self.error = ErrorInfo(code=Reason.UNHEALTHY, message=f"{why} failed: {describe(exc)}")
                self._drop()
                return False
            if scope.cancelled_caught:
                self.error = ErrorInfo(
                    code=Reason.UNHEALTHY, message=f"{why} (tools/list) did not answer within the attempt timeout"
                )
                self._drop()
                return False
            # Whole definitions, not names: a changed description or schema is drift the gateway must see.
            if tools != self.tools or rejected != self.rejected_tools:
                self.tools, self.rejected_tools = tools, rejected
                self._on_change(self)
            return True

    # ---- protocol revision memory -----------------------------------------------------------

    def _mode_kwargs(self) -> dict[str, Any]:
        wanted = self.spec.connect.protocol
        if self.spec.transport == "sse" or wanted == "2025-11-25":
            return {"mode": "legacy"}
        if wanted == "2026-07-28":
            return {"mode": "2026-07-28"}
        if self._era is None and self._memory is not None and not self._recall_tried:
            self._recall()
        if self._era == "legacy":
            return {"mode": "legacy"}
        if self._era == "modern":
            return {"mode": "2026-07-28", "prior_discover": self._prior_discover}
        return {"mode": "auto"}

    def _recall(self) -> None:
        """Go by what an earlier start learned of the server, if anything (`connect._protocol_memory`)."""
        assert self._memory is not None
        self._recall_tried = True
        recalled = self._recalled = self._memory.recall(self.spec, self._clock.time())
        if recalled is None:
            return
        if not recalled.modern or recalled.handshake_is_cheaper(one_client=self._one_client, transport=self.spec.transport):
            self._era = "legacy"
        elif (prior := recalled.prior_discover()) is not None:
            self._era, self._prior_discover = "modern", prior
        else:
            self._recalled = None

    def _next_era_after_protocol_error(self) -> None:
        """Choose the revision to try next after a handshake the peer did not accept.

        The SDK's auto mode probes `server/discover` for a fixed 10 s and then sends `initialize` on
        the same connection; a server slower than that has already locked the connection to
        2026-07-28 and refuses the `initialize`. That refusal is proof the server is modern, so pin
        it; otherwise cycle: auto -> 2026-07-28 -> 2025-11-25 -> auto.
        """
        assert self.error is not None
        modern_evidence = "2026-07-28" in self.error.message or str(UNSUPPORTED_PROTOCOL_VERSION) in self.error.message
        if self._era is None:
            self._era = "modern" if modern_evidence else "legacy"
        elif self._era == "modern":
            self._era = "legacy"
        else:
            self._era = None
        self._prior_discover = None

    def _distrust_memory(self, *, refused: bool) -> None:
        """A connect in the remembered revision failed (`refused`: on the protocol): forget it, unless the failure
        was the 2025-11-25 handshake offered to a remembered 2026-07-28 server, which pins that server."""
        assert self._memory is not None and self._recalled is not None
        recalled, self._recalled = self._recalled, None
        if refused and recalled.modern and self._era == "legacy":
            # The 2025-11-25 handshake offered to a 2026-07-28 server was refused: it speaks only the newer one.
            self._recalled = replace(recalled, handshake=False)
            self._memory.keep(self.spec, self._recalled)
            self._era, self._prior_discover = "modern", recalled.prior_discover()
        else:
            self._memory.forget(self.spec)
            self._era, self._prior_discover = None, None

    def _asked(self) -> None:
        # Only 2026-07-28 ties a shared server's question to its call: the next connect goes by the memory, which says so.
        if self._memory is not None and self._memory.asked(self.spec, self._clock.time()) and not self._one_client:
            self._era, self._recall_tried = None, False

    def _remember_era(self, client: Client, tools: Sequence[types.Tool]) -> None:
        version = client.protocol_version or ""
        if version >= "2026":
            self._era = "modern"
            self._prior_discover = getattr(client.session, "discover_result", None)
        else:
            self._era = "legacy"
        if self._memory is not None and self.spec.connect.protocol == "auto":
            self._keep_memory(client, version, tools)

    def _keep_memory(self, client: Client, version: str, tools: Sequence[types.Tool]) -> None:
        """Write down what this connect showed of the server, for the next start."""
        assert self._memory is not None
        recalled = self._recalled
        info = client.server_info
        server_version = info.version if info is not None else ""
        if recalled is not None and info is not None and server_version != recalled.server_version:
            # Another version of the server than the one probed (an upgrade): what the probe showed may no
            # longer hold, so the next start probes again.
            self._memory.forget(self.spec)
            return
        if recalled is not None and recalled.modern and version not in MODERN_PROTOCOL_VERSIONS:
            if recalled.handshake is not True:  # a remembered 2026-07-28 server took the 2025-11-25 handshake
                self._memory.keep(self.spec, replace(recalled, handshake=True))
            return
        discover = self._prior_discover if version in MODERN_PROTOCOL_VERSIONS else None
        learned = Recalled(
            protocol=version,
            discover=None if discover is None else discover.model_dump(mode="json", by_alias=True, exclude_none=True),
            needs=tuple(needs_modern(client.server_capabilities, tools)) if discover is not None else (),
            handshake=recalled.handshake if recalled is not None else None,
            server_version=server_version,
            learned_at=recalled.learned_at if recalled is not None and recalled.protocol == version else self._clock.time(),
        )
        if learned != recalled:
            self._memory.keep(self.spec, learned)


def _process(opened: OpenedTransport | None) -> StdioProcess | None:
    return None if opened is None else opened.process


def _client_info() -> types.Implementation:
    from importlib.metadata import version

    return types.Implementation(name=CLIENT_NAME, version=version("mcp-breakwater"))
