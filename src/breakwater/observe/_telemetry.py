"""OpenTelemetry for breakwater: a span per logical call, a child span per attempt, and call metrics.

Optional (`pip install 'mcp-breakwater[otel]'`) and off unless `[telemetry] enabled` is set or a
`Telemetry` is passed to `Breakwater(telemetry=...)`. Off, this module is never imported (nor is
OpenTelemetry's SDK) and the call gate pays one `is None` test per call.

Names follow the OpenTelemetry semantic conventions for MCP and GenAI (development status):

* the logical call: span `execute_tool {tool}` (INTERNAL) with `gen_ai.operation.name`
  (`execute_tool`), `gen_ai.tool.name`, `mcp.method.name` (`tools/call`), and breakwater's own
  `breakwater.server`, `breakwater.operation_id`, `breakwater.attempts`, `breakwater.outcome`;
  on failure `error.type` (the outcome: `timeout`, `tool_error`, `circuit_open`, …) and status
  ERROR. It is the current span while the call runs, so the MCP SDK's own client span nests under
  it and its W3C trace context reaches the server in `params._meta` (the SDK injects it); and the
  call journal's rows carry its trace id.
* each attempt sent: span `tools/call {tool}` (CLIENT), a child of the call's, with the attempt's
  own start and end: `mcp.method.name`, `gen_ai.tool.name`, `gen_ai.operation.name`,
  `network.transport` (`pipe` for stdio, `tcp` for HTTP), `mcp.protocol.version`, `error.type`
  when it failed, `breakwater.attempt`. Refusals (open breaker, full bulkhead, spent budget) send
  nothing: they are events (`breakwater.refused`) on the call span, as is a call settled by asking
  the server (`breakwater.reconciled`).

Metrics: `mcp.client.operation.duration` (histogram, s, the convention's buckets) per attempt sent;
`breakwater.call.duration` (histogram, s, retries and backoff included) per logical call by
outcome; `breakwater.attempts` (counter) per attempt or refusal by outcome;
`breakwater.breaker.opens` (counter); and, read when collected, `breakwater.breaker.state`
(gauge: 0 closed, 1 half-open, 2 open), `breakwater.retry_budget.tokens` (gauge) and
`breakwater.retry_budget.refused` (counter) per server.

Arguments and results are never put on spans (the conventions' `gen_ai.tool.call.arguments` is
opt-in and may hold personal data), nor are error messages: only codes.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from breakwater._clock import Clock, SystemClock
from breakwater.config import TelemetryPolicy
from breakwater.errors import CallError, ConfigError
from breakwater.journal import RECONCILED, REFUSAL_OUTCOMES, TRACE_ID, AttemptRecord, outcome_of

if TYPE_CHECKING:
    from breakwater.gate._gate import CallGate

__all__ = ["OPERATION_DURATION_BUCKETS_S", "Telemetry"]

log = logging.getLogger("breakwater.telemetry")

#: The MCP convention's advice for `mcp.client.operation.duration`.
OPERATION_DURATION_BUCKETS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
_INSTRUMENTATION = "breakwater"
_BREAKER_STATE = {"closed": 0, "half_open": 1, "open": 2}
_REFUSALS = frozenset(REFUSAL_OUTCOMES)
_TRANSPORTS = {"stdio": "pipe", "http": "tcp", "sse": "tcp"}


@dataclass(slots=True, eq=False)
class _Call:
    """One logical call in flight: its span and what was set in the caller's context for it."""

    span: trace.Span
    context: otel_context.Context
    server: str
    tool: str
    started: float
    #: What `call_finished` undoes, in reverse: the OpenTelemetry context, then our own variables.
    otel_token: Any = None
    tokens: tuple[contextvars.Token[Any], ...] = ()
    attempts: int = 0


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("breakwater_telemetry_call", default=None)


@dataclass(eq=False)
class Telemetry:
    """Spans and metrics for every call through a `Breakwater` (the gate's `CallTracer` and an `AttemptObserver`).

    ```python
    from opentelemetry.sdk.trace import TracerProvider
    bw = Breakwater(config, telemetry=Telemetry(tracer_provider=TracerProvider(), meter_provider=meter_provider))
    ```

    Without providers, the process's global ones are used (what an application or
    `opentelemetry-instrument` set up). `Telemetry.from_policy` builds its own from `[telemetry]`.
    """

    tracer_provider: trace.TracerProvider | None = None
    meter_provider: metrics.MeterProvider | None = None
    clock: Clock = field(default_factory=SystemClock)
    #: Server name -> configured transport (`stdio`, `http`), for `network.transport`.
    transports: Mapping[str, str] = field(default_factory=dict)
    #: Server name -> negotiated MCP protocol version, for `mcp.protocol.version` (read per attempt).
    protocol_of: Callable[[str], str | None] | None = None
    #: Providers built here (`from_policy`), flushed and shut down by `shutdown()`.
    owned: tuple[Any, ...] = ()

    record_sizes = False

    def __post_init__(self) -> None:
        tp = self.tracer_provider or trace.get_tracer_provider()
        mp = self.meter_provider or metrics.get_meter_provider()
        self._tracer = tp.get_tracer(_INSTRUMENTATION)
        meter = mp.get_meter(_INSTRUMENTATION)
        self._meter = meter
        self._operation_duration = meter.create_histogram(
            "mcp.client.operation.duration",
            unit="s",
            description="Duration of each MCP tools/call attempt, from sending it to its answer (or timeout).",
            explicit_bucket_boundaries_advisory=list(OPERATION_DURATION_BUCKETS_S),
        )
        self._call_duration = meter.create_histogram(
            "breakwater.call.duration",
            unit="s",
            description="Duration of each logical tool call, every attempt, backoff and reconciliation included.",
            explicit_bucket_boundaries_advisory=list(OPERATION_DURATION_BUCKETS_S),
        )
        self._attempts = meter.create_counter(
            "breakwater.attempts", unit="{attempt}", description="Attempts sent and refused, by outcome."
        )
        self._opens = meter.create_counter(
            "breakwater.breaker.opens", unit="{open}", description="Times an attempt's failure opened a breaker."
        )
        self._bound = False

    # ---- construction from config ---------------------------------------------------------

    @classmethod
    def from_policy(cls, policy: TelemetryPolicy, *, clock: Clock | None = None) -> Telemetry:
        """The telemetry `[telemetry]` configures: its own providers for `otlp` and `console`, the global ones for `global`."""
        if policy.exporter == "global":
            return cls(clock=clock or SystemClock())
        try:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
        except ImportError as exc:
            raise ConfigError(
                f"[telemetry] is enabled but OpenTelemetry's SDK is not installed ({exc})",
                key="telemetry.enabled",
                fix="pip install 'mcp-breakwater[otel]'",
            ) from exc
        spans: SpanExporter
        metric_exporter: MetricExporter
        if policy.exporter == "console":
            # stderr: on `breakwater serve` (stdio) stdout is the MCP channel.
            spans, metric_exporter = ConsoleSpanExporter(out=sys.stderr), ConsoleMetricExporter(out=sys.stderr)
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError as exc:
                raise ConfigError(
                    f'[telemetry] exporter = "otlp" needs the OTLP/HTTP exporter ({exc})',
                    key="telemetry.exporter",
                    fix='pip install \'mcp-breakwater[otel]\', or exporter = "console" / "global"',
                ) from exc
            # Endpoint, headers and timeouts come from the standard OTEL_EXPORTER_OTLP_* variables.
            spans, metric_exporter = OTLPSpanExporter(), OTLPMetricExporter()
        resource = Resource.create({"service.name": policy.service_name})
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(spans))
        reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=policy.metric_interval_s * 1000)
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        return cls(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            clock=clock or SystemClock(),
            owned=(tracer_provider, meter_provider),
        )

    def bind(self, gate: CallGate) -> None:
        """Report `gate`'s breaker states and retry budgets as observable metrics (once)."""
        if self._bound:
            return
        self._bound = True

        def breaker_states(_options: CallbackOptions) -> Iterable[Observation]:
            for snap in gate.breaker_snapshots():
                server, _, tool = snap.name.partition("/")
                attributes = {"breakwater.server": server, "breakwater.breaker.scope": "tool" if tool else "server"}
                if tool:
                    attributes["gen_ai.tool.name"] = tool
                yield Observation(_BREAKER_STATE.get(snap.state.value, -1), attributes)

        def budget_tokens(_options: CallbackOptions) -> Iterable[Observation]:
            for server, snap in gate.retry_budget_snapshots().items():
                yield Observation(snap.tokens, {"breakwater.server": server})

        def budget_refused(_options: CallbackOptions) -> Iterable[Observation]:
            for server, snap in gate.retry_budget_snapshots().items():
                yield Observation(snap.retries_refused, {"breakwater.server": server})

        self._meter.create_observable_gauge(
            "breakwater.breaker.state",
            callbacks=[breaker_states],
            unit="1",
            description="Each breaker's state: 0 closed, 1 half-open, 2 open.",
        )
        self._meter.create_observable_gauge(
            "breakwater.retry_budget.tokens",
            callbacks=[budget_tokens],
            unit="{token}",
            description="Retry tokens left in each server's retry budget.",
        )
        self._meter.create_observable_counter(
            "breakwater.retry_budget.refused",
            callbacks=[budget_refused],
            unit="{retry}",
            description="Retries each server's retry budget refused.",
        )

    def shutdown(self) -> None:
        """Flush and stop the providers built by `from_policy` (injected ones are the caller's to stop)."""
        for provider in self.owned:
            try:
                provider.shutdown()
            except Exception as exc:  # an unreachable collector must not fail a shutdown
                log.warning("telemetry shutdown: %s: %s", type(exc).__name__, exc)

    # ---- the gate's CallTracer --------------------------------------------------------------

    def _ns(self, wall_s: float) -> int:
        return int(wall_s * 1e9)

    def call_started(self, server: str, tool: str, operation_id: str | None) -> _Call:
        """Open the call span and make it current in the caller's context."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "mcp.method.name": "tools/call",
            "breakwater.server": server,
        }
        if operation_id is not None:
            attributes["breakwater.operation_id"] = operation_id
        span = self._tracer.start_span(
            f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes=attributes, start_time=self._ns(self.clock.time())
        )
        ctx = trace.set_span_in_context(span)
        call = _Call(span=span, context=ctx, server=server, tool=tool, started=self.clock.monotonic())
        call.otel_token = otel_context.attach(ctx)
        span_context = span.get_span_context()
        if span_context.is_valid:
            call.tokens = (_CURRENT.set(call), TRACE_ID.set(trace.format_trace_id(span_context.trace_id)))
        else:
            call.tokens = (_CURRENT.set(call),)
        return call

    def call_finished(self, handle: _Call, error: BaseException | None) -> None:
        """End the call span with its outcome; restore the caller's context."""
        try:
            if error is None:
                outcome = "completed"
            elif isinstance(error, CallError):
                outcome = outcome_of(error.code)
            else:
                outcome = "cancelled"  # the caller's own cancellation, re-raised by the gate
            span = handle.span
            span.set_attribute("breakwater.outcome", outcome)
            span.set_attribute("breakwater.attempts", handle.attempts)
            attributes = {"breakwater.server": handle.server, "gen_ai.tool.name": handle.tool, "breakwater.outcome": outcome}
            if error is not None:
                span.set_attribute("error.type", outcome)
                span.set_status(Status(StatusCode.ERROR, outcome))
                attributes["error.type"] = outcome
            self._call_duration.record(max(0.0, self.clock.monotonic() - handle.started), attributes)
            span.end(end_time=self._ns(self.clock.time()))
        except Exception as exc:  # telemetry never breaks a call
            log.warning("telemetry: %s: %s", type(exc).__name__, exc)
        finally:
            try:
                for token in reversed(handle.tokens):
                    token.var.reset(token)
                otel_context.detach(handle.otel_token)
            except ValueError as exc:  # a token from another context: a bug here, never the call's failure
                log.warning("telemetry: %s", exc)

    # ---- the AttemptObserver ------------------------------------------------------------------

    def record(self, record: AttemptRecord) -> bool:
        """One attempt (a child span and the attempt metrics) or a refusal / reconciliation (an event)."""
        try:
            self._record(record)
        except Exception as exc:  # telemetry never breaks a call
            log.warning("telemetry: %s: %s", type(exc).__name__, exc)
            return False
        return True

    def _record(self, r: AttemptRecord) -> None:
        call = _CURRENT.get()
        server_attrs = {"breakwater.server": r.server, "gen_ai.tool.name": r.tool}
        self._attempts.add(1, {**server_attrs, "breakwater.outcome": r.outcome})
        if r.breaker_opened:
            self._opens.add(1, server_attrs)
        if r.outcome in _REFUSALS or r.outcome == RECONCILED:
            if call is not None:
                name = "breakwater.reconciled" if r.outcome == RECONCILED else "breakwater.refused"
                event: dict[str, str | int] = {"breakwater.outcome": r.outcome, "breakwater.attempt": r.attempt}
                call.span.add_event(name, event, timestamp=self._ns(r.started_at + r.duration_s))
            return
        if call is not None:
            call.attempts += 1
        attributes: dict[str, Any] = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": r.tool,
            "breakwater.server": r.server,
        }
        transport = _TRANSPORTS.get(self.transports.get(r.server, ""))
        if transport is not None:
            attributes["network.transport"] = transport
        protocol = self.protocol_of(r.server) if self.protocol_of is not None else None
        if protocol:
            attributes["mcp.protocol.version"] = protocol
        failed = r.outcome != "completed"
        if failed:
            attributes["error.type"] = r.outcome
        self._operation_duration.record(r.duration_s, attributes)
        span = self._tracer.start_span(
            f"tools/call {r.tool}",
            context=call.context if call is not None else None,
            kind=SpanKind.CLIENT,
            attributes={**attributes, "breakwater.attempt": r.attempt},
            start_time=self._ns(r.started_at),
        )
        if failed:
            span.set_status(Status(StatusCode.ERROR, r.outcome))
        span.end(end_time=self._ns(r.started_at + r.duration_s))
