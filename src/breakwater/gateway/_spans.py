"""The SDK's span for each inbound request, opened only when the process has a tracer provider.

The SDK puts `OpenTelemetryMiddleware` first on every server: each request opens a span, extracts
a trace context from `_meta` and sets attributes, whether or not anything records spans. With no
tracer provider set (OpenTelemetry's default, a proxy that hands out no-op tracers) every one of
those spans is dropped unseen, yet it was ~7 % of the gateway's CPU per proxied `tools/call`
(cProfile with a CPU clock of `serve --no-share` under bench/proxy_overhead.py, issue 16). So the
middleware runs only while a provider is set: what `opentelemetry-instrument` or an embedding
application installs (breakwater's own `[telemetry]` exporters build private providers, which the
SDK's spans never reached). The check is made per request, so a provider set after the gateway
started is honoured from then on.
"""

from __future__ import annotations

from typing import Any

from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server

from breakwater.connect._raw_call import sdk_spans_recorded

__all__ = ["spans_only_when_traced"]


class _WhenTraced:
    """The SDK's span middleware, skipped while no tracer provider is set."""

    def __init__(self, inner: OpenTelemetryMiddleware) -> None:
        self._inner = inner

    @property
    def breakwater_for_calls(self) -> bool | str:
        """Skipped by the lanes' kernel while nothing records spans, kept while something does (`_fast_call`)."""
        return True if not sdk_spans_recorded() else "keep"

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if not sdk_spans_recorded():
            return await call_next(ctx)
        return await self._inner(ctx, call_next)


def spans_only_when_traced(server: Server[Any]) -> None:
    """Wrap `server`'s span middleware (the SDK's default first entry) in the check above."""
    server.middleware[:] = [
        _WhenTraced(entry) if isinstance(entry, OpenTelemetryMiddleware) else entry for entry in server.middleware
    ]
