"""Invariants 15, 17, 23 and 24: crafted one-call scenarios and checks on the event log."""

from __future__ import annotations

from hypothesis import given
from labkit import LAB, configs, entries, fresh, quick

from breakwater.lab import CallSpec, LabConfig, run
from breakwater.lab._fleet import P_DEADLINE, P_WORK

_GAPS_45 = (45_000,) * 6


def _call(**overrides: object) -> CallSpec:
    fields: dict[str, object] = {
        "id": 0,
        "client": 0,
        "arrival_ms": 1_000,
        "base_duration_ms": 1_000,
        "mutating": False,
        "mut_frac": 0.5,
        "slow_u": 1.0,
        "slow_duration_ms": 100_000,
        "progress_gaps_ms": _GAPS_45,
    }
    fields.update(overrides)
    return CallSpec(**fields)  # type: ignore[arg-type]


def test_a_byte_exactly_at_the_deadline_does_not_prevent_the_cut() -> None:
    """Invariant 15: progress at last + T is too late; one millisecond earlier saves the stream."""
    config = LabConfig(mode="2026-07-28", idle_timeout_s=60, slow_tools=True, replicas=2)
    late = run(config, [_call(slow_u=0.0, progress_gaps_ms=(60_000, *_GAPS_45[1:]))])
    cuts = list(entries(late, "cut"))
    assert cuts and cuts[0][0] == 1_000 + 60_000
    early = run(config, [_call(slow_u=0.0, progress_gaps_ms=(59_999, *_GAPS_45[1:]))])
    assert early.metrics.stream_cuts == 0
    assert early.metrics.ok == 1


def _deploy_call(mut_frac: float, idempotency: bool, mode: str) -> tuple[LabConfig, CallSpec]:
    # Replica 0 drains at 120 s and is killed at 130 s; the call starts on it at 119 s and would
    # run until 139 s.
    config = LabConfig(
        mode=mode,  # type: ignore[arg-type]
        routing="affinity",
        replicas=2,
        keepalive_s=15,
        drain_s=10,
        rolling_deploy=True,
        idempotency=idempotency,
    )
    return config, _call(arrival_ms=119_000, base_duration_ms=20_000, mutating=True, mut_frac=mut_frac)


def test_kill_before_the_mutation_point_commits_nothing() -> None:
    """Invariant 17: a call killed before its mutation point applies no side effect in that attempt."""
    for mode in ("2025-11-25/memory", "2025-11-25/shared", "2026-07-28"):
        config, call = _deploy_call(0.8, False, mode)
        result = run(config, [call])
        assert [r[4] for r in entries(result, "kill")] == [1]
        assert [r[4] for r in entries(result, "mutation")] == [2]  # only the re-issue mutates
        assert result.metrics.duplicate_side_effects == 0
        assert result.metrics.ok == 1


def test_kill_after_the_mutation_point_duplicates_unless_idempotent() -> None:
    """Invariant 17: killed after mutating and re-issued → 1 duplicate without idempotency, 0 with it."""
    for mode in ("2025-11-25/memory", "2025-11-25/shared", "2026-07-28"):
        config, call = _deploy_call(0.2, False, mode)
        result = run(config, [call])
        assert [r[4] for r in entries(result, "mutation")] == [1, 2]
        assert result.metrics.duplicate_side_effects == 1
        config, call = _deploy_call(0.2, True, mode)
        result = run(config, [call])
        assert result.metrics.duplicate_side_effects == 0
        assert result.metrics.dedup_hits == 1


@LAB
@given(configs())
def test_deadlines_precede_work_at_equal_timestamps(config: LabConfig) -> None:
    """Invariant 23: in the log, phases never go backwards within one instant; cuts and kills are deadlines."""
    result = quick(config)
    previous = (-1, 0)
    for t, phase, kind, *_ in result.log:
        assert (t, phase) >= previous
        previous = (t, phase)
        if kind in ("cut", "kill", "down"):
            assert phase == P_DEADLINE
        if kind in ("mutation", "progress", "finish"):
            assert phase == P_WORK


def _route_checks(config: LabConfig) -> None:
    result = quick(config)
    state = ["up"] * config.replicas
    client_of = {}
    pins: dict[int, int] = {}
    for record in result.log:
        _t, _phase, kind, call, _attempt, replica, detail = record
        if kind == "arrive":
            assert isinstance(detail, int)
            client_of[call] = detail
        elif kind in ("drain", "down", "up"):
            assert replica is not None
            state[replica] = {"drain": "draining", "down": "down", "up": "up"}[kind]
        elif kind == "pin":
            assert replica is not None and isinstance(detail, str)
            client = client_of[call]
            old = pins.get(client)
            # Affinity re-pins only when the pin cannot take traffic.
            assert old is None or state[old] != "up", record
            assert state[replica] == "up"
            pins[client] = replica
        elif kind in ("post", "resume", "init", "reinit"):
            assert replica is not None
            assert state[replica] == "up", record  # never routed to a draining or down replica
            if config.routing == "affinity":
                assert pins[client_of[call]] == replica, record


@LAB
@given(configs(routing="round_robin", rolling_deploy=True))
def test_round_robin_never_routes_to_draining_or_down_replicas(config: LabConfig) -> None:
    """Invariant 24: checked on the event log."""
    _route_checks(config)


@LAB
@given(configs(routing="affinity", rolling_deploy=True))
def test_affinity_repins_only_when_the_pin_is_unroutable(config: LabConfig) -> None:
    """Invariant 24: checked on the event log."""
    _route_checks(config)


def test_a_healthy_fleet_has_a_peak_queue_of_zero() -> None:
    """Calls accepted by a replica with a free slot start at once: they never count as queued."""
    result = fresh(LabConfig())
    assert result.metrics.peak_queue == (0, 0, 0)
    assert all(max(q) == 0 for q in result.series.queue)
