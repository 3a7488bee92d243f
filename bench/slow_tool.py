"""Slow tool: one tool out of twenty turns 40 s slow mid-run; how long do agent turns take?

20 tools on 4 `breakwater testserver` processes (5 each, read-only, healthy latency lognormal
around `--latency`). Agents run turns of 6 sequential calls to tools drawn at random. After
`--before` seconds, tool t0 turns `--slow` seconds slow (through the servers' `--control-file`)
for `--during` seconds, then heals; the run ends `--after` seconds later.

`--light` is light traffic, one person's agent session: one agent, turns of 3 sequential calls,
one of them to t0 (the slow tool is met once a turn), the other two drawn at random.

Two clients, in the same run, on separate server processes fed the same control file:

* raw: one `mcp.Client` per server, `call_tool(..., read_timeout_seconds=60)`;
* breakwater: `Breakwater` with its defaults (5 s timeout, breakers, retries by class).

Printed: turn time p50/p99 before, during and after; for breakwater also "once open" (turns that
started after t0's breaker first refused a call) split into turns that met a half-open probe and
turns that did not; upstream attempts of t0 cut before the breaker opened; and the ratios the
issue asks for.

    python bench/slow_tool.py                                   # the default: 40 s slow, 60 s incident
    python bench/slow_tool.py --slow 15 --before 8 --during 30 --after 8   # a quick look
    python bench/slow_tool.py --light --slow 15 --before 8 --during 30 --after 8

Breakwater runs with a fresh journal in a temporary directory (so no earlier run's latencies
teach it a timeout); "timeout in force" is t0's timeout as the gate resolves it at each turn's start.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec
from breakwater.config import JournalPolicy
from breakwater.gate._envelope import envelope_of
from breakwater.testing.server import launch_command, read_state, stdio_params

SERVERS = 4
TOOLS_PER_SERVER = 5
CALLS_PER_TURN = 6
LIGHT_CALLS_PER_TURN = 3
SLOW_TOOL = (0, "t0")
RAW_TIMEOUT_S = 60.0


@dataclass
class Turn:
    start: float
    seconds: float
    touched_slow: bool = False
    #: The slow tool was actually sent upstream (not refused by a breaker).
    sent_slow: bool = False
    #: t0's per-attempt timeout in force as the turn started (breakwater only).
    timeout_s: float | None = None


@dataclass
class Run:
    turns: list[Turn] = field(default_factory=list)
    first_refusal: float | None = None
    #: t0's timeout in force (and its source) when the incident started (breakwater only).
    timeout_at_incident: tuple[float, str] | None = None


def tool_names() -> list[tuple[int, str]]:
    return [(s, f"t{s * TOOLS_PER_SERVER + i}") for s in range(SERVERS) for i in range(TOOLS_PER_SERVER)]


def server_flags(index: int, prefix: str, latency: float, control: Path, state: Path, seed: int) -> list[str]:
    flags = [
        "--name",
        f"{prefix}{index}",
        "--seed",
        str(seed + index),
        "--control-file",
        str(control),
        "--state-file",
        str(state),
    ]
    for i in range(TOOLS_PER_SERVER):
        flags += ["--tool", f"t{index * TOOLS_PER_SERVER + i}:latency=lognormal({latency},0.3),readonly"]
    return flags


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def turn_tools(rng: random.Random, light: bool) -> list[tuple[int, str]]:
    """A turn's calls: 6 of the 20 tools at random, or (light) t0 and 2 others, in random order."""
    tools = tool_names()
    if not light:
        return rng.sample(tools, CALLS_PER_TURN)
    picked = [SLOW_TOOL, *rng.sample([t for t in tools if t != SLOW_TOOL], LIGHT_CALLS_PER_TURN - 1)]
    rng.shuffle(picked)
    return picked


async def agent(
    run: Run, call: Any, rng: random.Random, stop_at: float, t_zero: float, light: bool, timeout_of: Any = None
) -> None:
    while time.monotonic() < stop_at:
        start = time.monotonic()
        turn = Turn(start=start - t_zero, seconds=0.0, timeout_s=timeout_of() if timeout_of else None)
        for server, tool in turn_tools(rng, light):
            refused = await call(server, tool)
            if tool == "t0":
                turn.touched_slow = True
                turn.sent_slow |= not refused
                if refused and run.first_refusal is None:
                    run.first_refusal = time.monotonic() - t_zero
        turn.seconds = time.monotonic() - start
        run.turns.append(turn)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bw-slow-tool-"))
    control = tmp / "control.json"
    control.write_text(json.dumps({"tools": {}}))
    states = {p: [tmp / f"{p}{i}.state.json" for i in range(SERVERS)] for p in ("raw", "bw")}
    runs = {"raw": Run(), "bw": Run()}
    async with AsyncExitStack() as stack:
        raw_clients = []
        for i in range(SERVERS):
            flags = server_flags(i, "raw", args.latency, control, states["raw"][i], args.seed)
            raw_clients.append(await stack.enter_async_context(Client(stdio_params(*flags))))
        specs = []
        for i in range(SERVERS):
            cmd = launch_command(*server_flags(i, "bw", args.latency, control, states["bw"][i], args.seed))
            specs.append(
                ServerSpec(
                    name=f"s{i}",
                    transport="stdio",
                    command=cmd[0],
                    args=tuple(cmd[1:]),
                    connect=ConnectPolicy(startup_jitter_s=0),
                )
            )
        config = Config(servers=tuple(specs), journal=JournalPolicy(url=str(tmp / "journal.sqlite3")))
        bw = await stack.enter_async_context(Breakwater(config, admission_dir=tmp / "admission", protocol_memory_dir="off"))
        await bw.wait_ready(timeout=60)

        def t0_timeout() -> float | None:
            found = bw.gate.timeout_in_force("s0", "t0")
            return None if found is None else found[0]

        async def raw_call(server: int, tool: str) -> bool:
            with suppress(Exception):
                await raw_clients[server].call_tool(tool, {}, read_timeout_seconds=RAW_TIMEOUT_S)
            return False

        async def bw_call(server: int, tool: str) -> bool:
            result = await bw.call_tool(f"s{server}", tool, {})
            env = envelope_of(result) or {}
            # Refused outright: a breaker said no before any attempt (a probe that failed and was
            # then refused on retry made one attempt, so it counts as sent).
            return env.get("code") in ("CIRCUIT_OPEN", "SERVER_CIRCUIT_OPEN") and env.get("attempt") == 0

        t_zero = time.monotonic()
        incident_at = t_zero + args.before
        heal_at = incident_at + args.during
        stop_at = heal_at + args.after
        agents = 1 if args.light else args.agents
        async with anyio.create_task_group() as tg:
            for a in range(agents):
                rng_raw, rng_bw = random.Random(args.seed * 100 + a), random.Random(args.seed * 100 + a)
                tg.start_soon(agent, runs["raw"], raw_call, rng_raw, stop_at, t_zero, args.light)
                tg.start_soon(agent, runs["bw"], bw_call, rng_bw, stop_at, t_zero, args.light, t0_timeout)
            await anyio.sleep(incident_at - time.monotonic())
            runs["bw"].timeout_at_incident = bw.gate.timeout_in_force("s0", "t0")
            control.write_text(json.dumps({"tools": {"t0": {"latency": args.slow}}}))
            print(f"[{time.monotonic() - t_zero:5.1f} s] t0 is now {args.slow:g} s slow", file=sys.stderr)
            await anyio.sleep(heal_at - time.monotonic())
            control.write_text(json.dumps({"tools": {}}) + " ")
            print(f"[{time.monotonic() - t_zero:5.1f} s] t0 healed", file=sys.stderr)
        cut = read_state(states["bw"][0])["cancelled"]["t0"]
        breaker = next(b for b in bw.gate_status()["breakers"] if b["name"] == "s0/t0")
    return summarize(args, runs, cut, breaker)


def summarize(args: argparse.Namespace, runs: dict[str, Run], cut: int, breaker: dict[str, Any]) -> dict[str, Any]:
    incident = (args.before, args.before + args.during)
    out: dict[str, Any] = {"params": vars(args)}
    for mode, run in runs.items():
        phases = {
            "before": [t.seconds for t in run.turns if t.start < incident[0]],
            "during": [t.seconds for t in run.turns if incident[0] <= t.start < incident[1]],
            "after": [t.seconds for t in run.turns if t.start >= incident[1]],
        }
        row: dict[str, Any] = {}
        for name, values in phases.items():
            row[name] = {"turns": len(values), "p50": pct(values, 50), "p99": pct(values, 99), "mean": _mean(values)}
        if mode == "bw" and run.first_refusal is not None:
            opened = [t for t in run.turns if run.first_refusal <= t.start < incident[1]]
            not_probe = [t.seconds for t in opened if not t.sent_slow]
            row["once_open"] = {
                "turns": len(opened),
                "p50": pct([t.seconds for t in opened], 50),
                "p99": pct([t.seconds for t in opened], 99),
            }
            row["once_open_no_probe"] = {"turns": len(not_probe), "p50": pct(not_probe, 50), "p99": pct(not_probe, 99)}
            row["probe_turns"] = sum(t.sent_slow for t in opened)
            row["first_refusal_s"] = run.first_refusal
        if mode == "bw":
            row["max_turn_over_timeout"] = max((t.seconds / t.timeout_s for t in run.turns if t.timeout_s), default=None)
            if run.timeout_at_incident is not None:
                row["timeout_at_incident_s"], row["timeout_source"] = run.timeout_at_incident
                if run.first_refusal is not None:
                    row["first_refusal_in_timeouts"] = (run.first_refusal - incident[0]) / run.timeout_at_incident[0]
        out[mode] = row
    bw, raw = out["bw"], out["raw"]
    healthy_p99 = bw["before"]["p99"]
    out["slow_calls_cut_total"] = cut
    out["breaker"] = breaker
    if "once_open" in bw:
        out["ratios"] = {
            "bw_once_open_p99_over_healthy_p99": bw["once_open"]["p99"] / healthy_p99,
            "bw_once_open_no_probe_p99_over_healthy_p99": bw["once_open_no_probe"]["p99"] / healthy_p99,
            "raw_during_p99_over_bw_once_open_p99": raw["during"]["p99"] / bw["once_open"]["p99"],
            "raw_during_p99_over_bw_during_p99": raw["during"]["p99"] / bw["during"]["p99"],
            "raw_during_mean_over_bw_during_mean": raw["during"]["mean"] / bw["during"]["mean"],
        }
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def print_report(out: dict[str, Any]) -> None:
    print(f"{'client':<11}{'phase':<20}{'turns':>6}{'p50 s':>9}{'p99 s':>9}")
    for mode in ("raw", "bw"):
        for phase in ("before", "during", "once_open", "once_open_no_probe", "after"):
            row = out[mode].get(phase)
            if row:
                print(f"{mode:<11}{phase:<20}{row['turns']:>6}{row['p50']:>9.3f}{row['p99']:>9.3f}")
    bw = out["bw"]
    first = bw.get("first_refusal_s", float("nan"))
    print(f"breakwater: t0 refused first at {first:.1f} s; turns that met a probe while open: {bw.get('probe_turns')}")
    if "timeout_at_incident_s" in bw:
        print(f"breakwater: t0's timeout at the incident's start {bw['timeout_at_incident_s']:.3g} s ({bw['timeout_source']})")
    if bw.get("first_refusal_in_timeouts") is not None:
        print(f"breakwater: first refusal {bw['first_refusal_in_timeouts']:.2f} timeouts after the incident started")
    if bw.get("max_turn_over_timeout") is not None:
        print(f"breakwater: longest turn / timeout in force: {bw['max_turn_over_timeout']:.2f}")
    print(f"upstream t0 attempts cut by breakwater (whole run): {out['slow_calls_cut_total']}")
    for name, value in out.get("ratios", {}).items():
        print(f"{name}: {value:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slow", type=float, default=40.0, help="t0's latency during the incident, s (40)")
    p.add_argument("--latency", type=float, default=0.02, help="median healthy tool latency, s (0.02)")
    p.add_argument("--before", type=float, default=20.0, help="healthy seconds before the incident (20)")
    p.add_argument("--during", type=float, default=60.0, help="incident seconds (60)")
    p.add_argument("--after", type=float, default=20.0, help="seconds after t0 heals (20)")
    p.add_argument("--agents", type=int, default=1, help="agents per client, each running turns back to back (1)")
    p.add_argument("--light", action="store_true", help="light traffic: one agent, turns of 3 calls, t0 in every turn")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args()
    out = anyio.run(main_async, args)
    print_report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
