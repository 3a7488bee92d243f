"""Fixtures shared by the whole suite: the asyncio backend, no writes to the user's journal, PostgreSQL, Redis,
HAProxy."""

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import REDIS_URL, OwnRedis, require

POSTGRES_CANDIDATES = [
    os.environ.get("BREAKWATER_TEST_POSTGRES", ""),
    "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3",
    "host=127.0.0.1 port=5432 dbname=test user=root connect_timeout=3",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, by their `long_module(seconds)` mark (a stable sort: the rest keep their order).

    xdist hands modules to workers in collection order (`--dist loadfile --no-loadscope-reorder`; its
    default reorder, by number of tests, put a 150 s module of five tests last), and the run is CPU-bound,
    so a long module collected late is the run's tail, run while the other workers sit idle. Longest
    first is the classic greedy schedule. The seconds are one module's time on the CI host, 2 cores
    (`pytest --junitxml`, docs/benchmarks.md "The test suite's own time"); only their order matters."""

    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long_module")
        return float(mark.args[0]) if mark is not None and mark.args else 0.0

    items.sort(key=lambda item: -seconds(item))


@pytest.fixture
def anyio_backend() -> str:
    """Run `@pytest.mark.anyio` tests on asyncio only: uvicorn and the SDK's HTTP server need it."""
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _no_user_home() -> Iterator[None]:
    """No test writes to the user's own home: caches, shared gateways, admission slots and journals included.

    Setting `BREAKWATER_*` variables is not enough: a child started by an MCP client with the SDK's
    default environment (the Inspector CLI, `mcp.Client` without `env`) gets only `HOME`, `PATH` and a
    few more, so it found the real `~/.cache/breakwater` and left shared gateways and admission slots
    there. Every process of the run gets a home of its own instead; npm keeps the user's download cache.
    """
    # Short, not under pytest's deep temporary tree: a shared gateway's Unix socket path must fit in 107 bytes.
    home = Path(tempfile.mkdtemp(prefix="bw-home-"))
    real_npm_cache = os.environ.get("NPM_CONFIG_CACHE") or str(Path.home() / ".npm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        for name, sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state"),
                          ("XDG_CONFIG_HOME", ".config")):  # fmt: skip
            patch.setenv(name, str(home / sub))
        # Breakwater's runtime files (admission slots, shared gateways' sockets) in the run's own home too: without the
        # variable they would go to the user's /run/user/UID where there is one (`_paths.runtime_dir`).
        (home / "run").mkdir(mode=0o700)
        patch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
        # Nor a policy of this machine's Claude Code (/etc/claude-code/managed-settings.json): it would turn servers off.
        patch.setenv("BREAKWATER_CLAUDE_MANAGED_SETTINGS", str(home / "claude-code" / "managed-settings.json"))
        patch.setenv("NPM_CONFIG_CACHE", real_npm_cache)
        yield
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """One fork server per test worker (`breakwater.testing._fork_server`): the suite's ~300 testservers, ~300
    `python -m breakwater serve` gateways and ~150 SDK server scripts of its own (`helpers.FORKED_SCRIPT`) start as
    forks of a process that imported the SDK once, not as 1 s imports of their own. A test that needs the plain process
    deletes `BREAKWATER_TEST_FORK_SERVER` from its environment (a testserver, a script) or is marked `plain_gateway` (a
    gateway: `_plain_gateway` below). Linux only (fork, and Unix sockets that keep message boundaries): elsewhere they
    start as plain processes."""
    import subprocess
    import sys
    import time

    from breakwater.testing import _launcher

    if sys.platform != "linux":
        yield
        return

    where = Path(tempfile.mkdtemp(prefix="bw-fork-"))  # short: a Unix socket's path must fit in 107 bytes
    path = where / "s"
    with (where / "log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "breakwater.testing._fork_server", str(path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while not path.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not path.exists():
        server.kill()
        raise RuntimeError(f"the testserver fork server did not start: {(where / 'log').read_text()}")
    os.environ[_launcher.ENV] = os.environ[_launcher.SERVE_ENV] = str(path)
    yield
    del os.environ[_launcher.ENV], os.environ[_launcher.SERVE_ENV]
    server.terminate()
    server.wait(10)
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(autouse=True)
def _plain_gateway(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked `plain_gateway` starts `python -m breakwater serve` as a plain process (no fork server)."""
    if request.node.get_closest_marker("plain_gateway") is not None:
        from breakwater.testing import _launcher

        monkeypatch.delenv(_launcher.SERVE_ENV, raising=False)


@pytest.fixture(scope="session")
def _stray_journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stray-journal")


@pytest.fixture(autouse=True)
def _no_user_journal(monkeypatch: pytest.MonkeyPatch, _stray_journal_dir: Path) -> None:
    """Tests never write to the user's real call journal (nor its task table).

    `BREAKWATER_JOURNAL=off` turns it off wherever the environment is read (`load_config`, and every
    `breakwater` subprocess, which inherits it); a `Config()` built in code ignores the environment,
    so its default SQLite file is moved to a temporary directory as well. A test that wants a journal
    sets its own.
    """
    monkeypatch.setenv("BREAKWATER_JOURNAL", "off")
    monkeypatch.setenv("BREAKWATER_JOURNAL_DB", str(_stray_journal_dir / "journal.sqlite3"))
    # The same for the table of upstream task ids (breakwater.gate._tasks), unless a test names its own.
    monkeypatch.setenv("BREAKWATER_TASKS_DB", str(_stray_journal_dir / "tasks.sqlite3"))
    # Every `breakwater serve` a test starts runs its own gateway, as before sharing existed: no detached
    # shared gateway outlives a test. The tests of sharing (tests/gateway/test_shared.py) turn it on.
    monkeypatch.setenv("BREAKWATER_SHARE", "off")


@pytest.fixture(autouse=True)
def _own_registered_secrets() -> Iterator[None]:
    """Each test starts with only the process's secrets of before it (`breakwater.config._redact.register_secrets`).

    Loading a config registers its secrets for the whole process, as a gateway's must be. In a test
    process they outlived the test: a token of tests/config ("token-for-https://s0.example/mcp") then
    masked the "https://" of a later test's error text, and that test failed or passed by the order the
    workers happened to run the modules in (seen on Python 3.12; reproduced on 3.11 by running tests/config first).
    """
    from breakwater.config import _redact

    before = set(_redact._registered)
    yield
    with _redact._lock:
        _redact._registered.intersection_update(before)


@pytest.fixture(autouse=True)
def _own_protocol_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test starts with no server's protocol revision remembered (`breakwater.connect._protocol_memory`).

    The run's processes share one home: without this, a test would go by what an earlier test learned
    of the same fixture server. Within a test, a second start goes by the first's, as a user's does.
    """
    monkeypatch.setenv("BREAKWATER_PROTOCOL_MEMORY_DIR", str(tmp_path / "protocols"))


def _find_postgres() -> tuple[str | None, str]:
    try:
        import psycopg
    except ImportError as exc:
        return None, f"psycopg is not installed ({exc})"
    errors = []
    for conninfo in filter(None, POSTGRES_CANDIDATES):
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return conninfo, ""
        except Exception as exc:
            errors.append(f"{conninfo!r}: {exc}".strip())
    return None, "; ".join(errors)


@pytest.fixture(scope="session")
def pg_conninfo() -> str:
    """A reachable PostgreSQL (127.0.0.1:5432, database `test`), or skip — but fail under CI=true."""
    conninfo, why = _find_postgres()
    if conninfo is None:
        message = f"PostgreSQL on 127.0.0.1:5432 (database 'test') is unreachable: {why}"
        require(message)
    return conninfo


@pytest.fixture
def pg_schema(pg_conninfo: str) -> Iterator[str]:
    """A fresh schema for one test, dropped afterwards."""
    import psycopg

    schema = f"bw_test_{uuid.uuid4().hex[:10]}"
    yield schema
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="session")
def redis_available() -> None:
    """A reachable Redis at REDIS_URL (the machine's, on 127.0.0.1:6379), or skip — but fail under CI=true."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1, socket_connect_timeout=1).ping()
    except Exception as exc:
        message = f"Redis at {REDIS_URL} is unreachable ({type(exc).__name__}: {exc})"
        require(message)


@pytest.fixture
def haproxy() -> str:
    """Debian's haproxy binary, for the fleet tests (or skip — but fail under CI=true)."""
    found = shutil.which("haproxy") or (Path("/usr/sbin/haproxy").exists() and "/usr/sbin/haproxy")
    if not found:
        require("haproxy is not installed", ci_fix="apt-get install -y haproxy; .ci/run does it")
    return str(found)


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    """A redis-server of the test's own on a free port (killable, stoppable, restartable: never the machine's), killed
    after the test."""
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()
