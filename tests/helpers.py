"""Helpers the whole suite shares: what the model was told, waiting for a condition, services CI must have."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import pytest

from breakwater.testing._fleet import free_port

if TYPE_CHECKING:
    from mcp.server import Server
    from mcp.types import CallToolResult

    from breakwater.config import ServerSpec
    from breakwater.connect._upstream import Upstream
    from breakwater.gate._gate import CallGate
    from breakwater.testing import FakeClock, ScriptedServer

#: The machine's Redis (or BREAKWATER_TEST_REDIS_URL): the tests' one place for it.
#: The MCP server of the tasks tests (`tests/tasks/tasks_server.py`), as a command line.
TASKS_SERVER = [sys.executable, str(Path(__file__).resolve().parent / "tasks" / "tasks_server.py")]

#: The first lines of a test's own SDK server script: started as a program while the suite's fork server listens, the
#: fork server runs it past the SDK's imports (`breakwater.testing._launcher.fork_script`: 0.9 s of CPU a start).
FORKED_SCRIPT = """if __name__ == "__main__":
    from breakwater.testing._launcher import fork_script

    fork_script(__file__)
"""

REDIS_URL = os.environ.get("BREAKWATER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

__all__ = [
    "REDIS_URL",
    "ResourceUpdates",
    "ask_gateway",
    "called_once_up",
    "chrome",
    "code_of",
    "connected_upstream",
    "envelope_of",
    "eventually",
    "gateway_pids",
    "isolated_env",
    "lingering_server",
    "require",
    "screenshot",
    "serve_on_pipes",
    "share_dir",
]


def isolated_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """This process's environment, with breakwater's caches in `tmp_path` (one test's last-known tools, admission
    locks and learned revisions never reach another's), no start-up jitter, and `more` on top."""
    return dict(
        os.environ,
        BREAKWATER_ADMISSION_DIR=str(tmp_path / "admission"),
        BREAKWATER_CATALOG_DIR=str(tmp_path / "catalog"),
        BREAKWATER_PROTOCOL_MEMORY_DIR=str(tmp_path / "protocols"),
        BREAKWATER_CONNECT_STARTUP_JITTER_S="0",
        **more,
    )


def envelope_of(result: Any) -> dict[str, Any]:
    """The error envelope of a `CallToolResult`: its `structuredContent`, or, for a tool with an output schema the
    envelope does not fit, `_meta["io.breakwater/error"]` (`gateway._passthrough.fitted`); {} when the call succeeded."""
    if not result.is_error:
        return {}
    moved = (result.meta or {}).get("io.breakwater/error")
    sc = moved if isinstance(moved, dict) else result.structured_content
    return sc if isinstance(sc, dict) else {}


@contextmanager
def share_dir(prefix: str) -> Iterator[Path]:
    """A socket directory of a test's own for shared gateways (short: a Unix socket's path must fit in ~100 bytes);
    the gateways that answer in it are stopped, by their pids, and it is removed after.

    SIGTERM first, so each gateway stops its servers as a user's `gateway stop` would: killed at once, it left
    them running with no parent (a session's server still starting, `sleep 600`, outlived the suite's run)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield directory
    finally:
        pids = gateway_pids(directory)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


#: How long a test's shared gateway may take to stop its servers before it is killed.
STOP_GRACE_S = 10.0


def _alive(pid: int) -> bool:
    """Running (a zombie, which nobody may reap here, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def serve_on_pipes(config: Path, env: dict[str, str], errlog: Path) -> subprocess.Popen[bytes]:
    """`breakwater serve --config config` on pipes of the test's own (unbuffered), its stderr in `errlog`."""
    with errlog.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "breakwater", "serve", "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            bufsize=0,
        )


class PipeAgent:
    """A `breakwater serve` session on pipes (`serve_on_pipes`), as an agent drives it: requests written, answers
    collected by id (`arrived` gets each id as its answer comes)."""

    def __init__(self, config: Path, env: dict[str, str], errlog: Path) -> None:
        self.proc = serve_on_pipes(config, env, errlog)
        self.answers: dict[Any, dict[str, Any]] = {}
        self.arrived: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": hello})
        self.wait("init", 60)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            message = json.loads(raw)
            if "id" in message and "method" not in message:
                self.answers[message["id"]] = message
                self.arrived.put(message["id"])

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")

    def call(self, request_id: Any, tool: str) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})

    def wait(self, request_id: Any, seconds: float) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while request_id not in self.answers:
            assert time.monotonic() < deadline, f"no answer to {request_id!r} within {seconds} s"
            time.sleep(0.02)
        return self.answers[request_id]

    def end(self) -> None:
        """Close its input (if still open) and wait for `serve` to exit."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(30)


def lingering_server(pid_file: Path) -> dict[str, Any]:
    """An mcp.json entry for a stdio server that ignores the end of its input, as some real ones do (the npm
    "everything" one with a task's timer pending): a wrapper, its pid in `pid_file`, runs a testserver with a
    `ping` tool, then sleeps on for a minute after the testserver has exited."""

    from breakwater.testing.server import launch_command

    wrapper = (
        "import os, subprocess, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"subprocess.call({launch_command('--tool', 'ping:latency=0')!r})\n"
        "time.sleep(60)\n"
    )
    return {"command": sys.executable, "args": ["-c", wrapper]}


def called_once_up(proc: Any, tool: str) -> dict[str, Any]:
    """On a `breakwater serve` process with piped stdio: initialize, then call `tool` once; its answer (blocking)."""
    stdin, stdout = proc.stdin, proc.stdout

    def ask(message: dict[str, Any]) -> dict[str, Any]:
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()
        while True:
            answer: dict[str, Any] = json.loads(stdout.readline())
            if answer.get("id") == message["id"]:
                return answer

    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    ask({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
    stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    return ask({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": {}}})


#: The handshake a raw stdio client writes first (2025-11-25), then `INITIALIZED`.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def alive(pid: int) -> bool:
    """Whether process `pid` runs: neither reaped nor a zombie (Linux: /proc)."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read (ESRCH)
        return False


def code_of(result: Any) -> str | None:
    """The error code of a `CallToolResult` (its envelope's `code`), or None when the call succeeded."""
    code = envelope_of(result).get("code")
    return code if isinstance(code, str) else None


async def eventually(check: Callable[[], bool], timeout: float = 5.0, *, interval: float = 0.02) -> None:
    """Return as soon as `check()` holds; fail the test if it has not within `timeout` seconds."""
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(interval)


class ResourceUpdates:
    """A client's message handler that records the URIs of `notifications/resources/updated`."""

    def __init__(self) -> None:
        self.uris: list[str] = []

    async def __call__(self, message: Any) -> None:
        from mcp.types import ResourceUpdatedNotification

        if isinstance(message, ResourceUpdatedNotification):
            self.uris.append(str(message.params.uri))

    async def wait_for(self, uri: str) -> None:
        """Return once an update of `uri` arrived; fail the test after 10 s."""
        with anyio.fail_after(10):
            while uri not in self.uris:
                await anyio.sleep(0.02)


def ask_gateway(sock: Path, hello: dict[str, Any]) -> dict[str, Any] | None:
    """One handshake with the shared gateway at `sock`, synchronously (None when nothing answers).

    A gateway that exits (idles out, is stopped) as it is asked answers that it exits (`_share.turn_away`), or, going
    away unannounced, closes the connection unanswered (or the kernel resets it). `gateway list` (`cli/_gateway._ask`)
    reads each as "no gateway there", and so does this.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(str(sock))
        except OSError:
            return None
        try:
            s.sendall(json.dumps(hello).encode() + b"\n")
            line = s.makefile("rb").readline()
        except ConnectionError:  # a timeout is no answer either, but it is a stuck gateway: that fails the test
            return None
        if not line:
            return None
        answer: dict[str, Any] = json.loads(line)
        return None if answer.get("exiting") is True else answer


def gateway_pids(share: Path) -> list[int]:
    """The pids of the shared gateways that answer in the socket directory `share`."""
    infos = [ask_gateway(sock, {"breakwater": "info"}) for sock in share.glob("gw-*.sock")]
    return [int(i["pid"]) for i in infos if i is not None]


@asynccontextmanager
async def connected_upstream(
    spec: ServerSpec, server: ScriptedServer | Server[Any], *, clock: FakeClock, rng: random.Random, ready: bool = True
) -> AsyncIterator[Upstream]:
    """A real `Upstream` connected to an in-process SDK server (a `ScriptedServer`, or any SDK `Server`) on the fake
    clock, and kept running; with `ready=False` it is not waited for (a server whose handshake never ends).

    For tests of the call gate: the transport seam is injected (`in_memory`), so the SDK client, its
    session, cancellation and progress are the real ones; only the clock and the random draws are fakes.
    """
    from breakwater.connect._admission import Admission
    from breakwater.connect._upstream import Upstream
    from breakwater.status import ServerState
    from breakwater.testing import ScriptedServer, in_memory

    sdk_server = server.server if isinstance(server, ScriptedServer) else server
    upstream = Upstream(
        spec, clock=clock, rng=rng, admission=Admission(clock=clock, rng=rng, directory=None), transports=in_memory(sdk_server)
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)

        async def until_ready() -> None:
            while upstream.state is not ServerState.READY:
                await upstream.wait_changed()

        if ready:
            with anyio.fail_after(20):  # real seconds: the connect runs on virtual time
                await clock.run(until_ready)
        yield upstream
        tg.cancel_scope.cancel()


def require(reason: str, *, ci_fix: str = "") -> NoReturn:
    """A service or tool the test needs is missing: skip locally, fail under CI=true, where it is part of the contract."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} — CI=true requires it{f' ({ci_fix})' if ci_fix else ''}")
    pytest.skip(reason)


def chrome(chromium: str, chromedriver: str, profile: Path) -> Any:
    """Headless Chromium (Debian's) with its own profile; browser console messages are kept for the error check.

    The flags keep it off the network this machine does not have (background networking, updates, sync).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1440,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Any: selenium's annotations are partial (get_log is untyped).
    return webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)


def screenshot(driver: Any, path: Path, *, copy_env: str) -> Path:
    """A full-page PNG through the DevTools protocol (WebDriver's own stops at the viewport); also copied to
    the directory in the environment variable `copy_env` when it is set."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {path}")
    copy_dir = os.environ.get(copy_env)
    if copy_dir:
        Path(copy_dir).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(copy_dir) / path.name)
    return path


class AttemptRows:
    """An `AttemptObserver` that keeps every attempt the gate hands it: the journal's view of the calls, in memory."""

    def __init__(self, *, record_sizes: bool = False) -> None:
        self.record_sizes = record_sizes
        self.rows: list[Any] = []

    def record(self, record: Any) -> bool:
        self.rows.append(record)
        return True


async def lifespan_answered(scope: Any, receive: Any, send: Any) -> bool:
    """For a bare ASGI app under uvicorn in a test: answer the lifespan's messages; True when `scope` was the lifespan's."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


class OwnRedis:
    """A redis-server of this test's own on a free port, keeping nothing on disk; killable."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            message = "redis-server is not installed"
            require(message)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def pause(self) -> None:
        """SIGSTOP: the server hangs, its port still accepting connections (a stopped process, a black-holed route)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run_breakwater(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m breakwater ARGS` in `env`: its exit code, stdout and stderr as text."""
    argv = [sys.executable, "-m", "breakwater", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)


@asynccontextmanager
async def running(cmd: list[str], port_file: Path, env: dict[str, str]) -> AsyncIterator[str]:
    """A server process that writes its port to `port_file` (a `serve --http`, a testserver); its base URL. Terminated
    after (killed if it does not end within 15 s)."""
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        with anyio.fail_after(60):
            while not port_file.exists() or not port_file.read_text().strip():
                assert proc.poll() is None, "exited"
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, as a user's Ctrl-C or a service manager stops it, then SIGKILL if it is not gone within 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def http_tasks_server(*flags: str) -> Iterator[str]:
    """The tasks server on a real 127.0.0.1 port, for as long as the block runs; yields its URL."""
    port = free_port()
    proc = subprocess.Popen([*TASKS_SERVER, "--http", str(port), *flags], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the tasks server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def gateway_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """A gateway's environment for the tasks tests: its files in `tmp_path`, its task table there too."""
    return isolated_env(tmp_path, BREAKWATER_TASKS_DB=str(tmp_path / "gateway-tasks.sqlite3"), **more)


@asynccontextmanager
async def gateway_http(tmp_path: Path, config: Path, tag: str) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """`breakwater serve --http` of `config` on a free 127.0.0.1 port: its MCP URL and its process."""
    port_file = tmp_path / f"port-{tag}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "breakwater",
            "serve",
            "--config",
            str(config),
            "--http",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
        ],
        env=gateway_env(tmp_path),
        stderr=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text():
                assert proc.poll() is None, "the gateway exited"
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/mcp", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)


async def timed_gate_call(clock: FakeClock, gate: CallGate, timeout: float | None = None) -> tuple[CallToolResult, float]:
    """`gate.call("s", "t", timeout=timeout)` on the fake clock: its result and the virtual seconds it took."""

    async def call() -> tuple[CallToolResult, float]:
        start = clock.monotonic()
        result = await gate.call("s", "t", timeout=timeout)
        return result, clock.monotonic() - start

    got: tuple[CallToolResult, float] = await clock.run(call)
    return got
