"""OpenTelemetry: the spans and metrics of calls through a real testserver, read back with the real
OpenTelemetry SDK's in-memory exporter and reader; `[telemetry]` config; and, off, no SDK import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from breakwater import Breakwater
from breakwater.config import TelemetryPolicy, load_config
from breakwater.errors import ConfigError
from breakwater.observe._telemetry import Telemetry
from breakwater.testing.server import launch_command
from helpers import AttemptRows

pytestmark = pytest.mark.anyio


@pytest.fixture
def otel() -> Iterator[tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider), spans, reader
    tracer_provider.shutdown()
    meter_provider.shutdown()


def write_config(tmp_path: Path) -> Path:
    cmd = launch_command(
        "--seed",
        "3",
        "--tool",
        "flaky:retryable_error=0.5,readonly",
        "--tool",
        "hang:hang=1,readonly",
        "--tool",
        "echo:latency=0",
    )
    config = tmp_path / "breakwater.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [servers.ts]
            command = {json.dumps(cmd[0])}
            args = {json.dumps(cmd[1:])}
            [servers.ts.retry]
            max_attempts = 2
            retry_timeouts = true
            backoff_base_s = 0.01
            backoff_cap_s = 0.02
            [servers.ts.breaker]
            consecutive_failures = 2
            open_base_s = 60
            [servers.ts.tools.hang]
            timeout_s = 0.3
            """
        )
    )
    return config


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id), key=lambda s: s.start_time or 0
    )


async def test_spans_and_metrics_of_calls_through_a_real_testserver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, otel: tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    """A call retried once (error, then success), a call whose two attempts timed out and opened the
    tool's breaker, and a call that breaker refused: one call span each, one child per attempt sent,
    the conventions' attributes, and metrics that count the same attempts the journal saw."""
    monkeypatch.setenv("BREAKWATER_CONNECT_STARTUP_JITTER_S", "0")
    telemetry, exporter, reader = otel
    recorder = AttemptRows()
    bw = Breakwater(
        load_config(write_config(tmp_path)),
        admission_dir=tmp_path / "adm",
        journal=None,
        observers=[recorder],
        telemetry=telemetry,
    )
    async with bw:
        await bw.wait_ready(timeout=30)
        retried = None
        for _ in range(20):
            before = len(recorder.rows)
            result = await bw.call_tool("ts", "flaky", {})
            mine = recorder.rows[before:]
            if not result.is_error and len(mine) == 2:
                retried = mine
                break
        assert retried is not None, "no call of the flaky tool failed once and then succeeded"
        timed_out = await bw.call_tool("ts", "hang", {})
        refused = await bw.call_tool("ts", "hang", {})
    assert (timed_out.structured_content or {})["code"] == "TIMEOUT"
    assert (refused.structured_content or {})["code"] == "CIRCUIT_OPEN"

    spans = list(exporter.get_finished_spans())
    calls = [s for s in spans if s.name.startswith("execute_tool ")]
    attempts = [s for s in spans if s.name.startswith("tools/call ")]
    assert len(attempts) == sum(1 for r in recorder.rows if r.outcome not in ("circuit_open",))
    assert all(s.kind is SpanKind.CLIENT for s in attempts) and all(s.kind is SpanKind.INTERNAL for s in calls)
    assert all(s.parent is not None for s in attempts)  # every attempt belongs to a call

    # The retried call: two children on one trace, in order, inside their parent; the journal's rows carry that trace.
    call = next(s for s in calls if s.context is not None and s.context.trace_id == int(retried[0].trace_id or "0", 16))
    first, second = children(spans, call)
    assert call.attributes is not None and first.attributes is not None and second.attributes is not None
    assert call.name == "execute_tool flaky" and first.name == second.name == "tools/call flaky"
    assert dict(call.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "flaky",
        "mcp.method.name": "tools/call",
        "breakwater.server": "ts",
        "breakwater.outcome": "completed",
        "breakwater.attempts": 2,
    }
    assert call.status.status_code is StatusCode.UNSET
    assert first.attributes["error.type"] == retried[0].outcome and first.status.status_code is StatusCode.ERROR
    assert "error.type" not in second.attributes and second.status.status_code is StatusCode.UNSET
    for attempt, row in ((first, retried[0]), (second, retried[1])):
        assert attempt.attributes is not None
        assert attempt.attributes["mcp.method.name"] == "tools/call"
        assert attempt.attributes["gen_ai.tool.name"] == "flaky"
        assert attempt.attributes["network.transport"] == "pipe"
        assert attempt.attributes["mcp.protocol.version"] == bw.upstream("ts").protocol
        assert attempt.attributes["breakwater.attempt"] == row.attempt
        assert attempt.context is not None and call.context is not None and attempt.context.trace_id == call.context.trace_id
    assert call.start_time is not None and call.end_time is not None
    assert first.start_time is not None and first.end_time is not None and second.start_time is not None
    assert second.end_time is not None
    assert call.start_time <= first.start_time < first.end_time <= second.start_time < second.end_time <= call.end_time

    # The timed-out call: both attempts failed by timeout, the call span says so.
    hang_calls = [s for s in calls if s.name == "execute_tool hang"]
    assert len(hang_calls) == 2
    cut, denied = sorted(hang_calls, key=lambda s: s.start_time or 0)
    assert cut.attributes is not None and denied.attributes is not None
    assert (cut.attributes["breakwater.outcome"], cut.attributes["error.type"], cut.attributes["breakwater.attempts"]) == (
        "timeout",
        "timeout",
        2,
    )
    assert cut.status.status_code is StatusCode.ERROR
    assert [s.attributes and s.attributes["error.type"] for s in children(spans, cut)] == ["timeout", "timeout"]
    for s in children(spans, cut):
        assert s.start_time is not None and s.end_time is not None
        assert 0.3 <= (s.end_time - s.start_time) / 1e9 < 1.5
    # The refused call sent nothing: no child, an event, and its outcome.
    assert children(spans, denied) == []
    assert (denied.attributes["breakwater.outcome"], denied.attributes["breakwater.attempts"]) == ("circuit_open", 0)
    assert [(e.name, dict(e.attributes or {})) for e in denied.events] == [
        ("breakwater.refused", {"breakwater.outcome": "circuit_open", "breakwater.attempt": 1})
    ]

    points = metric_points(reader)
    # One duration sample per attempt sent, one per logical call; outcomes counted as the journal counts them.
    assert sum(p.count for p in points["mcp.client.operation.duration"]) == len(attempts)
    assert sum(p.count for p in points["breakwater.call.duration"]) == len(calls)
    counted = {
        (p.attributes["gen_ai.tool.name"], p.attributes["breakwater.outcome"]): p.value for p in points["breakwater.attempts"]
    }
    expected: dict[tuple[str, str], int] = {}
    for r in recorder.rows:
        expected[(r.tool, r.outcome)] = expected.get((r.tool, r.outcome), 0) + 1
    assert counted == expected
    timeouts = [p for p in points["mcp.client.operation.duration"] if p.attributes.get("error.type") == "timeout"]
    assert sum(p.count for p in timeouts) == 2 and all(p.min >= 0.3 for p in timeouts)
    assert sum(p.value for p in points["breakwater.breaker.opens"]) == 1
    states = {
        (p.attributes["breakwater.breaker.scope"], p.attributes.get("gen_ai.tool.name")): p.value
        for p in points["breakwater.breaker.state"]
    }
    assert states[("tool", "hang")] == 2 and states[("tool", "flaky")] == 0 and states[("server", None)] == 0
    (tokens,) = points["breakwater.retry_budget.tokens"]
    assert tokens.attributes == {"breakwater.server": "ts"} and tokens.value >= 0
    assert [p.value for p in points["breakwater.retry_budget.refused"]] == [
        bw.gate.retry_budget_snapshots()["ts"].retries_refused
    ]


def test_telemetry_section_in_toml_and_environment(tmp_path: Path) -> None:
    toml = tmp_path / "breakwater.toml"
    toml.write_text(
        '[telemetry]\nenabled = true\nexporter = "console"\nservice_name = "agent-7"\n[servers.a]\ncommand = "true"\n'
    )
    config = load_config(toml, environ={"BREAKWATER_TELEMETRY_METRIC_INTERVAL_S": "5"})
    assert config.telemetry == TelemetryPolicy(enabled=True, exporter="console", service_name="agent-7", metric_interval_s=5)
    assert load_config(toml, environ={"BREAKWATER_TELEMETRY_ENABLED": "false"}).telemetry.enabled is False
    toml.write_text('[telemetry]\nexporter = "zipkin"\n[servers.a]\ncommand = "true"\n')
    with pytest.raises(ConfigError, match="exporter"):
        load_config(toml)
    json_file = tmp_path / ".mcp.json"
    json_file.write_text('{"mcpServers": {}}')
    assert load_config(json_file, environ={"BREAKWATER_TELEMETRY_ENABLED": "1"}).telemetry.enabled is True
    off = TelemetryPolicy()
    assert (off.enabled, off.exporter) == (False, "otlp")


PROBE = """
import anyio, sys
from breakwater import Breakwater
from breakwater.config import load_config

async def main():
    async with Breakwater(load_config(sys.argv[1]), admission_dir=sys.argv[2], journal=None) as bw:
        await bw.wait_ready(timeout=30)
        result = await bw.call_tool("ts", "echo", {"payload": "x"})
        assert not result.is_error, result
    loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "breakwater.observe._telemetry")))
    print("LOADED", " ".join(loaded))

anyio.run(main)
"""


def run_probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(write_config(tmp_path)), str(tmp_path / "adm")],
        capture_output=True,
        text=True,
        timeout=90,
        env=dict(os.environ, BREAKWATER_CONNECT_STARTUP_JITTER_S="0", **env),
    )


def test_off_by_default_and_then_the_sdk_is_never_imported(tmp_path: Path) -> None:
    """A fresh process making a real call with telemetry off loads neither OpenTelemetry's SDK nor
    breakwater's telemetry module (the MCP SDK itself imports only the OpenTelemetry API)."""
    off = run_probe(tmp_path)
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "LOADED"
    assert "execute_tool" not in off.stderr


def test_enabled_in_config_with_the_console_exporter(tmp_path: Path) -> None:
    """`[telemetry] enabled` from the environment, console exporter: the call's spans reach stderr
    (never stdout, which a stdio gateway speaks MCP on) when the instance closes."""
    on = run_probe(tmp_path, BREAKWATER_TELEMETRY_ENABLED="true", BREAKWATER_TELEMETRY_EXPORTER="console")
    assert on.returncode == 0, on.stderr
    assert "opentelemetry.sdk.trace" in on.stdout and "breakwater.observe._telemetry" in on.stdout
    assert '"name": "execute_tool echo"' in on.stderr and '"name": "tools/call echo"' in on.stderr
    assert '"service.name": "breakwater"' in on.stderr
    assert "execute_tool" not in on.stdout
