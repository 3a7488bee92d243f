"""`breakwater gateway list|stop` (and the hidden `run`): the user's shared local gateways.

`breakwater serve` over stdio attaches to a shared gateway for its config (`attach_or_none`, called
by `cli/_serve.py`), forking it when none answers (or, once its own loop runs, starting `breakwater
gateway run` detached). `list` shows every
gateway that answers in the user's socket directory, with its sessions; `stop` ends them (sessions
still attached fail over to a new one when they next need it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from breakwater._platform import loop_options, return_large_frees
from breakwater.cli._common import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Parser,
    add_config_flag,
    counted,
    fail,
    load_or_exit,
    show,
)
from breakwater.config import Config, GatewayPolicy

__all__ = ["attach_or_none", "gateway_main", "shared_gateway_info"]


def _policy_from_env() -> GatewayPolicy:
    from breakwater.config._knobs import build_policy, env_layer

    policy: GatewayPolicy = build_policy(GatewayPolicy, [env_layer(GatewayPolicy)])
    return policy


def _spawn_argv(config: Config, fingerprint: str, state: str | None) -> list[str]:
    argv = [sys.executable, "-m", "breakwater", "gateway", "run", "--config", str(config.path), "--fingerprint", fingerprint]
    return argv + (["--state", state] if state is not None else [])


def attach_or_none(config: Config, state: str | None) -> int | None:
    """Serve this stdio session through the shared gateway; None when it cannot be shared (say why, serve directly).

    Up to the first handshake nothing here imports asyncio or anyio: at a cold start the first
    session forks the gateway as soon as it can (`fork_gateway`), and the others wait for its answer
    asleep (`attach_now`) rather than loading their relay on the cores the gateway starts on.
    """
    from breakwater.gateway._share import (
        SPAWN_WAIT_S,
        AttachRefused,
        SessionContext,
        breakwater_version,
        config_fingerprint,
        per_session,
        share_refusal,
        where_gateway,
    )
    from breakwater.gateway._start import attach_now, fork_gateway, relayable

    if (why := share_refusal(config)) is not None:
        if config.gateway.share:  # off on purpose needs no explanation; off for a reason does
            print(f"breakwater: serving this session on its own: {why}", file=sys.stderr, flush=True)
        return None
    if config.path is None or not relayable():
        return None  # a file or /dev/null for stdin or stdout (not what agents give): this session serves itself
    fingerprint = config_fingerprint(config)
    version = breakwater_version()  # once: each look-up reads the installed distributions' metadata
    try:
        paths = where_gateway(config.gateway, fingerprint, version)
    except OSError as exc:
        print(f"breakwater: serving this session on its own: {exc}", file=sys.stderr, flush=True)
        return None
    # A cold start: the gateway is this process, forked before its loop runs (config loaded, no new interpreter).
    forked = fork_gateway(*paths, partial(_serve_forked, config, fingerprint, version, paths[0]))
    hello: dict[str, Any] = {"breakwater": "attach", "fingerprint": fingerprint, "version": version, "pid": os.getpid()}
    if per_session(config):  # the stdio servers the gateway starts for this session start where it runs
        hello["session"] = SessionContext.here().to_json()
    if forked:
        # While its gateway loads the SDK this session has a core to itself: it sets up its loop and relay
        # meanwhile, and attaches from there (set up after the answer, they delayed a cold first answer 0.1-0.3 s).
        return _attached(config, state, hello, paths, None)
    try:
        # None: nobody listens (its start is someone else's)
        first = attach_now(paths[0], _offering(hello), SPAWN_WAIT_S)
    except (AttachRefused, TimeoutError, OSError) as exc:
        print(f"breakwater: serving this session on its own: {exc}", file=sys.stderr, flush=True)
        return None
    return _attached(config, state, hello, paths, first)


def _offering(hello: dict[str, Any]) -> dict[str, Any]:
    """`hello`, offering the gateway this session's stdin and stdout when they can be handed over (`_handoff`)."""
    from breakwater.gateway._handoff import can_offer

    return {**hello, "handoff": True} if can_offer() else hello


def _attached(
    config: Config,
    state: str | None,
    hello: dict[str, Any],
    paths: tuple[Path, Path, Path],
    first_attached: tuple[socket.socket, dict[str, Any], bytes, int | None] | None,
) -> int | None:
    """Relay this session through the gateway (attaching first when `first_attached` is None); None: serve it directly."""
    import anyio

    from breakwater._clock import SystemClock
    from breakwater.gateway._attach import Attachment, AttachRefused, SessionOutdated, open_attachment
    from breakwater.gateway._pump import ToolSafety, attached_session
    from breakwater.gateway._share import breakwater_version

    sock, lock, log = paths
    clock = SystemClock()
    spawn = _spawn_argv(config, str(hello["fingerprint"]), state)
    safety = ToolSafety.of(config)
    attached_before = first_attached is not None

    async def attach() -> Attachment:
        nonlocal attached_before
        # The first attach runs on the version just read; a re-attach asks again (an upgrade under the session).
        if attached_before and (now := breakwater_version()) != hello["version"]:
            # The spawned gateway would be the new version, on another socket: this session cannot follow.
            raise SessionOutdated(
                f"breakwater was upgraded ({hello['version']} -> {now}) while this session ran: "
                "restart this agent session (or its breakwater MCP server) to use the new version"
            )
        # Only the first attach offers this session's stdin and stdout; after a failover the session relays.
        offer = hello if attached_before else _offering(hello)
        attached_before = True
        return await open_attachment(sock, lock, offer, spawn, log, clock)

    async def run() -> int | None:
        if first_attached is not None:
            first = Attachment(*first_attached)
        else:
            try:
                first = await attach()
            except (AttachRefused, TimeoutError, OSError) as exc:
                print(f"breakwater: serving this session on its own: {exc}", file=sys.stderr, flush=True)
                return None
        for warning in first.info.get("warnings", ()):
            print(f"breakwater: the shared gateway says: {warning}", file=sys.stderr, flush=True)
        code: int = await attached_session(first, attach, safety=safety, clock=clock)
        if code == EXIT_INTERRUPTED:  # Ctrl-C ended the session (its calls drained first), as in every command
            print("breakwater: interrupted", file=sys.stderr)
        return code

    result: int | None = anyio.run(run, backend_options=loop_options(config.gateway.event_loop))
    return result


def shared_gateway_info(config: Config) -> dict[str, Any] | None:
    """What the shared gateway for `config` says about itself (with its `status`), or None when none answers."""
    import anyio

    from breakwater.gateway._share import breakwater_version, config_fingerprint, share_refusal, where_gateway

    if share_refusal(config) is not None:
        return None
    try:
        sock = where_gateway(config.gateway, config_fingerprint(config), breakwater_version())[0]
    except OSError:
        return None
    info = anyio.run(_ask, sock, {"breakwater": "info", "sessions": True})
    if info is not None and STUCK in info:
        print(f"breakwater: {info[STUCK]}; connecting from here instead", file=sys.stderr, flush=True)
        return None
    return info


#: The key of what `_ask` says of a gateway that listens but cannot answer (`GatewayStuck`): why.
STUCK = "not_answering"


async def _ask(sock: Path, hello: dict[str, Any]) -> dict[str, Any] | None:
    """The answer of the gateway at `sock`; None when none listens there (or it refused); `{STUCK: why, "pid": ...}`
    when one listens and cannot answer (stopped, or stuck): it held every command that asked it for good."""
    from breakwater.gateway._attach import AttachRefused, connect_gateway
    from breakwater.gateway._share import GatewayStuck

    try:
        attachment = await connect_gateway(sock, hello)
    except GatewayStuck as exc:
        return {STUCK: str(exc), "pid": exc.pid}
    except (AttachRefused, OSError):
        return None
    if attachment is None:
        return None
    attachment.close()
    info: dict[str, Any] = attachment.info
    return info


def _gateways(policy: GatewayPolicy) -> list[tuple[Path, dict[str, Any]]]:
    """Every gateway that listens in the user's socket directory, with its answer (`_ask`: one that cannot answer says
    why); sockets nobody listens on are removed, and a stuck gateway's is kept (it may be resumed)."""
    import anyio

    from breakwater.gateway._share import share_dirs

    found = []
    for sock in [sock for directory in share_dirs(policy) for sock in sorted(directory.glob("gw-*.sock"))]:
        info = anyio.run(_ask, sock, {"breakwater": "info"})
        if info is None:
            with contextlib.suppress(OSError):
                sock.unlink()
            continue
        found.append((sock, info))
    return found


def _list(policy: GatewayPolicy, as_json: bool) -> int:
    from rich.table import Table

    from breakwater.cli._text import cell  # here: an attaching `serve` imports this module, and must not load Rich

    gateways = _gateways(policy)
    if as_json:
        rows = [
            {k: v for k, v in info.items() if k not in ("breakwater", "ok", "status")} | {"socket": str(s)}
            for s, info in gateways
        ]
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not gateways:
        print("no shared gateway is running")
        return EXIT_OK
    answering = [info for _, info in gateways if STUCK not in info]
    if answering:
        table = Table(title="shared gateways", title_justify="left")
        columns = ("pid", "sessions", "up", "version", "loop", "config")
        for column in columns:
            table.add_column(column, no_wrap=True)
        for info in answering:
            up = max(0.0, time.time() - float(info.get("started") or time.time()))
            shown = {**info, "up": f"{up:.0f} s", "loop": info.get("event_loop")}
            table.add_row(*(cell(str(shown.get(column))) for column in columns))
        show(table)
    for _, info in gateways:
        if STUCK in info:  # a line of its own, whole: what to do about it is the point
            print(f"not answering: {info[STUCK]}")
    return EXIT_OK


def _stop(policy: GatewayPolicy, config: Config | None) -> int:
    import anyio

    from breakwater.gateway._share import config_fingerprint

    wanted = config_fingerprint(config) if config is not None else None
    stopped = 0
    other_settings = 0  # gateways of the same file whose resolved config differs (another environment)
    stuck = 0
    for sock, info in _gateways(policy):
        if STUCK in info:
            stuck += 1
            print(f"cannot stop a shared gateway: {info[STUCK]}")
            continue
        if wanted is not None and info.get("fingerprint") != wanted:
            other_settings += config is not None and _same_file(info.get("config"), config.path)
            continue
        took = anyio.run(_stop_one, sock, policy.drain_s)
        if took is not None:
            stopped += 1
            sessions = counted(info.get("sessions"), "session")
            done = f"stopped the shared gateway pid {info.get('pid')} ({sessions}"
            print(f"{done}, drained in {took:.1f} s; {info.get('config')})" if took >= 0 else f"{done}; still draining)")
    if not stopped and not stuck:
        print("no shared gateway to stop")
        if other_settings:
            # The fingerprint is of the resolved config: an agent that launched serve with other
            # environment variables (BREAKWATER_*, ${VAR}s) runs its own gateway for the same file; so does one
            # started in another directory when the config has a shared stdio server (it inherits the directory).
            print(
                f"{counted(other_settings, 'shared gateway')} of this file run with other settings (another environment, "
                "or another working directory when a stdio server is shared): "
                "`breakwater gateway stop` without --config stops every one"
            )
    return EXIT_OK


async def _stop_one(sock: Path, drain_s: float) -> float | None:
    """Ask the gateway at `sock` to stop and wait for its drain to end (it closes the connection then): the seconds it
    took, -1 if it was still draining after `drain_s` and a grace, None if nothing answered."""
    import asyncio

    from breakwater._clock import SystemClock
    from breakwater.gateway._attach import AttachRefused, connect_gateway

    clock = SystemClock()
    started = clock.monotonic()
    try:
        attachment = await connect_gateway(sock, {"breakwater": "stop"})
    except (AttachRefused, OSError):
        return None
    if attachment is None:
        return None
    try:
        with clock.deadline_scope(started + drain_s + 10.0) as waiting, contextlib.suppress(OSError):
            while await asyncio.get_running_loop().sock_recv(attachment.sock, 4096):
                pass
    finally:
        attachment.close()
    return -1.0 if waiting.cancelled_caught else clock.monotonic() - started


def _same_file(shown: Any, path: str | None) -> bool:
    return bool(shown and path) and os.path.abspath(str(shown)) == os.path.abspath(str(path))


def _log_to_stderr() -> None:
    """The shared gateway logs to its stderr, which is its log file beside its socket."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("breakwater.gateway.shared").setLevel(logging.INFO)


def _serve_forked(config: Config, fingerprint: str, version: str, sock: Path, listener: socket.socket) -> int:
    """The gateway a session forked (`fork_gateway`), on the session's config and on the socket it bound."""
    import anyio

    _log_to_stderr()
    return_large_frees()
    code: int = anyio.run(
        _run_shared, config, fingerprint, sock, listener, version, backend_options=loop_options(config.gateway.event_loop)
    )
    logging.shutdown()
    return code


def _run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import anyio

    from breakwater.gateway._share import breakwater_version, config_fingerprint, gateway_paths, share_dir

    _log_to_stderr()
    config = load_or_exit(args.config)
    if args.state is not None:
        config = replace(config, state=replace(config.state, url=args.state))
    fingerprint = config_fingerprint(config)
    if args.fingerprint and fingerprint != args.fingerprint:
        return fail("the config changed since the session that started this gateway read it; not serving", EXIT_CONFIG)
    try:
        sock = gateway_paths(share_dir(config.gateway), fingerprint, breakwater_version())[0]
    except OSError as exc:  # a share directory that cannot be made, or is not the user's, or is too deep
        return fail(f"cannot run a shared gateway: {exc}", EXIT_CONFIG)
    return_large_frees()
    code: int = anyio.run(_run_shared, config, fingerprint, sock, backend_options=loop_options(config.gateway.event_loop))
    return code


async def _run_shared(
    config: Config, fingerprint: str, sock: Path, bound: socket.socket | None = None, version: str | None = None
) -> int:
    import anyio

    from breakwater._clock import SystemClock
    from breakwater._startup import sdk_imports

    with sdk_imports():
        from breakwater.gateway._hub import SharedGateway, listening
        from breakwater.gateway._open import open_gateway
        from breakwater.gateway._share import breakwater_version, shared_config

    async with listening(sock, bound) as listener:
        if listener is None:
            logging.getLogger("breakwater.gateway.shared").info("another gateway already serves %s", sock)
            return EXIT_OK
        async with open_gateway(shared_config(config)) as gateway:
            hub = SharedGateway(
                gateway,
                config,
                fingerprint=fingerprint,
                version=version or breakwater_version(),
                idle_s=config.gateway.share_idle_s,
                clock=SystemClock(),
            )
            async with anyio.create_task_group() as tg:

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            hub.stop()
                            return

                tg.start_soon(stop_on_signal)
                await hub.serve(listener)
                tg.cancel_scope.cancel()
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="breakwater gateway",
        description="The shared local gateways that stdio `breakwater serve` sessions attach to.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="{list,stop}")
    listing = sub.add_parser("list", help="every running shared gateway: pid, sessions, uptime, version, config")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_config_flag(listing)  # as every command takes it: its [gateway] share_dir says where to look
    stop = sub.add_parser("stop", help="stop the user's shared gateways (all, or the one of --config)")
    add_config_flag(stop)
    run = sub.add_parser("run")  # started by `serve`; not for people
    add_config_flag(run)
    run.add_argument("--fingerprint")
    run.add_argument("--state")
    return parser


def gateway_main(argv: list[str]) -> int:
    """`breakwater gateway list|stop`."""
    args = _parser().parse_args(argv)
    if args.action == "run":
        return _run(args)
    config = load_or_exit(args.config) if getattr(args, "config", None) else None
    policy = config.gateway if config is not None else _policy_from_env()
    try:
        if args.action == "list":
            return _list(policy, args.json)
        return _stop(policy, config)
    except OSError as exc:
        return fail(f"cannot read the shared gateways: {exc}", EXIT_FAILED)
