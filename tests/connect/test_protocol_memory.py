"""Each server's protocol revision, remembered between starts (`breakwater.connect._protocol_memory`).

The memory itself on disk (fake clock for its age), then real servers in real subprocesses: the SDK's
dual-era test server, the tasks extension's test server, and hand-written servers that speak only one
revision (`broken_upstream.py`). Each "start" is a new `Breakwater` over the same memory directory, as
a user's next session is a new process over the same cache.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import anyio
import mcp.types as types
import pytest

from breakwater import Breakwater, Config, ConnectPolicy, ServerSpec, ServerState
from breakwater.connect._protocol_memory import MEMORY_MAX_AGE_S, ProtocolMemory, Recalled, memory_at, needs_modern
from breakwater.connect._upstream import ClientHooks, Upstream
from breakwater.testing import FakeClock
from breakwater.testing.server import launch_command

pytestmark = pytest.mark.anyio

FAST = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=60, attempt_timeout_s=20)
HERE = Path(__file__).parent
TASKS_SERVER = HERE.parent / "tasks" / "tasks_server.py"
CONFORMANCE_SERVER = HERE.parent / "conformance" / "server.py"
BROKEN = HERE / "broken_upstream.py"


def _spec(name: str, command: list[str], policy: ConnectPolicy = FAST) -> ServerSpec:
    return ServerSpec(name=name, transport="stdio", command=command[0], args=tuple(command[1:]), connect=policy)


def _dual_era(name: str = "shop") -> ServerSpec:
    return _spec(name, launch_command("--name", name, "--tool", "echo"))


def _breakwater(tmp_path: Path, spec: ServerSpec, *, one_client: bool, hooks: ClientHooks | None = None) -> Breakwater:
    return Breakwater(
        Config(servers=(spec,)),
        admission_dir=tmp_path / "admission",
        protocol_memory_dir=tmp_path / "memory",
        one_client=one_client,
        client_hooks=hooks,
    )


async def _ready(bw: Breakwater, spec: ServerSpec) -> Upstream:
    with anyio.fail_after(60):
        while bw.upstream(spec.name).state is not ServerState.READY:
            await bw.wait_changed()
    return bw.upstream(spec.name)


async def _start(
    tmp_path: Path,
    spec: ServerSpec,
    *,
    one_client: bool,
    tool: str = "echo",
    arguments: dict[str, object] | None = None,
    hooks: ClientHooks | None = None,
) -> tuple[str | None, int]:
    """One start: the revision the server was reached in, and the connect attempts it took; a call works."""
    bw = _breakwater(tmp_path, spec, one_client=one_client, hooks=hooks)
    async with bw:
        await _ready(bw, spec)
        result = await bw.call_tool(spec.name, tool, {"text": "hi"} if arguments is None else arguments)
        assert not result.is_error
        snap = bw.upstream(spec.name).snapshot()
        return snap.protocol, snap.attempts


def _remembered(tmp_path: Path, spec: ServerSpec) -> dict[str, object]:
    data: dict[str, object] = json.loads(next((tmp_path / "memory").glob(f"{spec.name}-*.json")).read_text())
    return data


# ---- the memory on disk -------------------------------------------------------------------


def _recalled(**changes: object) -> Recalled:
    fields: dict[str, object] = {
        "protocol": "2026-07-28",
        "discover": {"supportedVersions": ["2026-07-28"], "capabilities": {}, "resultType": "complete"},
        "needs": (),
        "handshake": None,
        "server_version": "1.0",
        "learned_at": 1000.0,
        **changes,
    }
    return Recalled(**fields)  # type: ignore[arg-type]


def test_what_is_kept_is_recalled_until_it_is_a_week_old(tmp_path: Path) -> None:
    memory, spec, clock = ProtocolMemory(tmp_path), _dual_era(), FakeClock(wall_start=1000.0)
    assert memory.recall(spec, clock.time()) is None
    memory.keep(spec, _recalled(learned_at=clock.time()))
    clock.advance(MEMORY_MAX_AGE_S)
    recalled = memory.recall(spec, clock.time())
    assert recalled == _recalled(learned_at=1000.0)
    assert recalled is not None and recalled.prior_discover() == types.DiscoverResult(
        supported_versions=["2026-07-28"], capabilities=types.ServerCapabilities()
    )
    clock.advance(1)
    assert memory.recall(spec, clock.time()) is None, "older than a week: the next start probes again"
    memory.forget(spec)
    assert not list(tmp_path.iterdir())


def test_another_config_of_the_same_name_is_another_server(tmp_path: Path) -> None:
    memory = ProtocolMemory(tmp_path)
    memory.keep(_dual_era(), _recalled())
    moved = ServerSpec(name="shop", transport="stdio", command="other-shop", connect=FAST)
    assert memory.recall(moved, 1000.0) is None


@pytest.mark.parametrize(
    "junk", ["", "not json", "[]", '{"format": 1}', '{"format": 2, "protocol": "2026-07-28", "learned_at": 1}']
)
def test_an_unreadable_memory_is_no_memory(tmp_path: Path, junk: str) -> None:
    memory, spec = ProtocolMemory(tmp_path), _dual_era()
    memory.keep(spec, _recalled())
    next(tmp_path.iterdir()).write_text(junk)
    assert memory.recall(spec, 1000.0) is None


def test_a_memory_that_cannot_be_written_costs_only_the_probe_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    memory = ProtocolMemory(blocker / "memory")  # a directory under a file: every write fails
    memory.keep(_dual_era(), _recalled())
    memory.keep(_dual_era(), _recalled())
    assert memory.recall(_dual_era(), 1000.0) is None
    said = [r.getMessage() for r in caplog.records if "protocol revisions" in r.getMessage()]
    assert said == [
        f"breakwater: cannot keep the servers' protocol revisions in {blocker / 'memory'} (a file is where a directory "
        "should be): each start asks every server which protocol revision it speaks again (fix: set [connect] "
        "protocol_memory_dir (BREAKWATER_PROTOCOL_MEMORY_DIR) to a writable directory, or to off)"
    ]


def test_off_keeps_nothing_and_empty_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for off in ("off", "OFF", " none ", "disabled", "false", "0"):  # the journal's off words: "OFF" was a folder named so
        assert memory_at(off) is None, off
    monkeypatch.setenv("BREAKWATER_PROTOCOL_MEMORY_DIR", str(tmp_path / "from-env"))
    chosen = memory_at("")
    assert chosen is not None and chosen.directory == tmp_path / "from-env"
    named = memory_at(str(tmp_path / "named"))
    assert named is not None and named.directory == tmp_path / "named"
    monkeypatch.setenv("BREAKWATER_PROTOCOL_MEMORY_DIR", "off")
    assert memory_at("") is None


def test_what_only_the_newer_revision_carries() -> None:
    plain = types.Tool(name="echo", input_schema={"type": "object"}, output_schema={"type": "object"})
    listed = types.Tool(name="names", input_schema={"type": "object"}, output_schema={"type": "array"})
    assert needs_modern(types.ServerCapabilities(tools=types.ToolsCapability()), [plain]) == []
    tasks = types.ServerCapabilities(extensions={"io.modelcontextprotocol/tasks": {}})
    assert needs_modern(tasks, [plain, listed]) == [
        "extension io.modelcontextprotocol/tasks",
        "tool names has a non-object output",
    ]


@pytest.mark.parametrize(
    ("recalled", "one_client", "transport", "cheaper"),
    [
        (_recalled(), True, "stdio", True),
        (_recalled(), False, "stdio", True),  # shared by several clients, and it never asked one anything
        (_recalled(asks=True), False, "stdio", False),  # shared, and it asks: only the newer revision ties questions to calls
        (_recalled(asks=True), True, "stdio", True),  # every question a one-client server asks is its client's
        (_recalled(), True, "http", False),
        (_recalled(needs=("extension io.modelcontextprotocol/tasks",)), True, "stdio", False),
        (_recalled(handshake=False), True, "stdio", False),  # it refused the handshake once
        (_recalled(handshake=True), True, "stdio", True),
        (_recalled(protocol="2025-11-25", discover=None), True, "stdio", False),  # already the older one
    ],
)
def test_when_the_older_revision_is_the_better_one(recalled: Recalled, one_client: bool, transport: str, cheaper: bool) -> None:
    assert recalled.handshake_is_cheaper(one_client=one_client, transport=transport) is cheaper


# ---- real servers --------------------------------------------------------------------------


async def test_a_dual_era_server_with_one_client_is_spoken_to_in_the_cheaper_revision_from_the_second_start(
    tmp_path: Path,
) -> None:
    spec = _dual_era()
    assert await _start(tmp_path, spec, one_client=True) == ("2026-07-28", 1)
    kept = _remembered(tmp_path, spec)
    assert (kept["protocol"], kept["needs"], kept["handshake"]) == ("2026-07-28", [], None)
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 1)
    assert _remembered(tmp_path, spec)["handshake"] is True, "the handshake it took is remembered"
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 1)


async def test_a_server_several_clients_share_that_never_asked_is_spoken_to_in_the_cheaper_revision(tmp_path: Path) -> None:
    spec = _dual_era()
    assert await _start(tmp_path, spec, one_client=False) == ("2026-07-28", 1)
    assert await _start(tmp_path, spec, one_client=False) == ("2025-11-25", 1)
    kept = _remembered(tmp_path, spec)
    assert (kept["protocol"], kept["handshake"], kept["asks"]) == ("2026-07-28", True, False)


def _answering(spec: ServerSpec) -> dict[str, object]:
    async def sample(context: object, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="42"), model="m")

    return {"sampling_callback": sample}


async def test_a_shared_server_that_asks_a_client_is_back_on_the_newer_revision_from_its_next_connect(tmp_path: Path) -> None:
    # Only 2026-07-28 ties a question to the call that asked it; a shared server that asks needs that.
    spec = _spec("asker", [sys.executable, str(CONFORMANCE_SERVER)])
    ask = {"tool": "test_sampling", "arguments": {"prompt": "six times seven?"}, "hooks": _answering}
    assert await _start(tmp_path, spec, one_client=False, **ask) == ("2026-07-28", 1)  # type: ignore[arg-type]
    assert _remembered(tmp_path, spec)["asks"] is True, "its question (tied to its call here) is remembered"
    assert await _start(tmp_path, spec, one_client=False, **ask) == ("2026-07-28", 1)  # type: ignore[arg-type]
    # With one client the older revision loses nothing: every question is that client's.
    assert await _start(tmp_path, spec, one_client=True, **ask) == ("2025-11-25", 1)  # type: ignore[arg-type]
    assert _remembered(tmp_path, spec)["asks"] is True


async def test_a_shared_server_on_the_older_revision_that_asks_moves_to_the_newer_one_at_its_next_connect(
    tmp_path: Path,
) -> None:
    spec = _spec("asker", [sys.executable, str(CONFORMANCE_SERVER)])
    assert await _start(tmp_path, spec, one_client=False, tool="test_simple_text", arguments={}) == ("2026-07-28", 1)
    bw = _breakwater(tmp_path, spec, one_client=False, hooks=_answering)
    async with bw:
        upstream = await _ready(bw, spec)
        assert upstream.snapshot().protocol == "2025-11-25", "it never asked: the cheaper revision"
        result = await bw.call_tool(spec.name, "test_sampling", {"prompt": "six times seven?"})
        assert not result.is_error and "42" in str(result.content), "asked and answered on the older revision"
        assert _remembered(tmp_path, spec)["asks"] is True
        upstream.report_lost()  # a reconnect, in the same process
        with anyio.fail_after(60):
            while upstream.state is not ServerState.READY or upstream.snapshot().protocol != "2026-07-28":
                await bw.wait_changed()


def test_that_a_server_asks_outlives_a_later_connect_that_learns_the_rest_again(tmp_path: Path) -> None:
    memory, spec = ProtocolMemory(tmp_path), _dual_era()
    memory.keep(spec, _recalled())
    assert memory.asked(spec, now=1000.0) is True
    assert memory.asked(spec, now=1000.0) is False, "known already: no news, no write"
    memory.keep(spec, _recalled(handshake=True))  # a later connect writes down what it saw
    recalled = memory.recall(spec, now=1000.0)
    assert recalled is not None and (recalled.asks, recalled.handshake) == (True, True)
    memory.forget(spec)  # forgotten (another version of the server): it is learnt again from nothing
    memory.keep(spec, _recalled())
    assert memory.recall(spec, now=1000.0) == _recalled()
    assert memory.asked(spec, now=1000.0 + MEMORY_MAX_AGE_S + 1) is False, "nothing recent enough to add it to"


async def test_a_server_that_offers_tasks_stays_on_the_newer_revision(tmp_path: Path) -> None:
    spec = _spec("studio", [sys.executable, str(TASKS_SERVER)])
    job = {"tool": "long_job", "arguments": {"seconds": 0}}
    assert (await _start(tmp_path, spec, one_client=True, **job))[0] == "2026-07-28"  # type: ignore[arg-type]
    assert _remembered(tmp_path, spec)["needs"] == ["extension io.modelcontextprotocol/tasks"]
    assert (await _start(tmp_path, spec, one_client=True, **job))[0] == "2026-07-28"  # type: ignore[arg-type]


async def test_a_server_that_refuses_the_handshake_is_pinned_to_the_newer_revision_after_one_refusal(tmp_path: Path) -> None:
    spec = _spec("modern", [sys.executable, str(BROKEN), "--modern-only"])
    assert await _start(tmp_path, spec, one_client=True) == ("2026-07-28", 1)
    # The second start offers the handshake (nothing said the server lacks it); the refusal costs one attempt.
    assert await _start(tmp_path, spec, one_client=True) == ("2026-07-28", 2)
    assert _remembered(tmp_path, spec)["handshake"] is False
    assert await _start(tmp_path, spec, one_client=True) == ("2026-07-28", 1)


async def test_a_server_that_swallows_the_probe_is_waited_for_once_not_at_every_start(tmp_path: Path) -> None:
    # A 2025-era server that never answers `server/discover`: the first start's probe lasts the attempt
    # deadline, then the handshake works; later starts shake hands at once.
    policy = ConnectPolicy(startup_jitter_s=0, backoff_base_s=0.1, backoff_cap_s=0.5, budget_s=60, attempt_timeout_s=1.5)
    spec = _spec("quiet", [sys.executable, str(BROKEN), "--swallow-unknown"], policy)
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 2)
    assert _remembered(tmp_path, spec)["protocol"] == "2025-11-25"
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 1)
    # Upgraded (it names another version of itself): the start after the one that sees it probes again.
    path = next((tmp_path / "memory").glob("quiet-*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "server_version": "0.9"}))
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 1)
    assert not path.exists()


async def test_another_version_of_the_server_is_probed_again(tmp_path: Path) -> None:
    spec = _dual_era()
    await _start(tmp_path, spec, one_client=True)
    path = next((tmp_path / "memory").glob("shop-*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "server_version": "0.9"}))
    # Spoken to in the older revision as remembered; the version it gives there is not the probed one.
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 1)
    assert not path.exists(), "forgotten: the next start probes this version"
    assert await _start(tmp_path, spec, one_client=True) == ("2026-07-28", 1)


async def test_a_server_that_no_longer_speaks_the_remembered_revision_is_probed_again_at_once(tmp_path: Path) -> None:
    # The same command now starts a 2025-era server (a downgrade, another package behind `npx -y`): the
    # remembered 2026-07-28 pin fails once, and the next attempt probes.
    spec = _spec("swapped", [sys.executable, str(BROKEN)])
    modern = _recalled(server_version="1", learned_at=time.time(), asks=True)  # pinned: shared, and it asked
    ProtocolMemory(tmp_path / "memory").keep(spec, modern)
    assert await _start(tmp_path, spec, one_client=False) == ("2025-11-25", 2)
    kept = _remembered(tmp_path, spec)
    assert (kept["protocol"], kept["discover"]) == ("2025-11-25", None)
    assert await _start(tmp_path, spec, one_client=False) == ("2025-11-25", 1)


async def test_a_revision_pinned_in_config_is_neither_recalled_nor_kept(tmp_path: Path) -> None:
    spec = _spec("shop", launch_command("--name", "shop", "--tool", "echo"), replace(FAST, protocol="2025-11-25"))
    assert await _start(tmp_path, spec, one_client=True) == ("2025-11-25", 1)
    assert not (tmp_path / "memory").exists()
