"""The lab page's HTTP server: static assets and a small JSON API over `breakwater.lab`.

Routes (all JSON bodies are UTF-8 objects):

- `GET /` — the page; `GET /static/<name>` — its assets (a fixed allow-list, read once at start).
- `GET /api/lab` — `{"missions": [Mission.to_dict()...], "defaults": LabConfig().to_dict(),
  "modes", "routings", "ranges": {control: [min, max, step]}, "min_replicas_for_stars",
  "parameters": [[name, value], ...]}`: everything the page needs to draw its controls.
- `GET /api/missions` — the missions alone, as a JSON array.
- `POST /api/run` with `{"config": {...}, "mission": N | null}` — `config` is read by
  `LabConfig.from_dict` over the defaults (form strings accepted). Answers `{"config", "mission",
  "stars", "exploration", "verdict", "metrics", "series", "latency_histogram", "elapsed_ms"}`;
  `stars` and `verdict` are null without a mission (`verdict`: `Mission.explain()`). A bad control
  answers 400 `{"error", "key"}`, plus `"fix"` when there is a hint (an unknown control: "did you
  mean 'replicas'?").
- `POST /api/new-seed` with `{"config": {...}}` — `{"config"}` with a seed from OS entropy
  (`new_seed`).

Security by default: the server binds 127.0.0.1. Because a loopback server is still reachable from
any web page through DNS rebinding, every request's Host header must name a loopback address (or
the bound host) with the server's port, and an Origin header, when present, must be that same
origin. POSTs must be `application/json`, which a cross-site form cannot send without a CORS
preflight this server never answers. Binding a non-loopback address requires a token (`--token` or
`BREAKWATER_LAB_TOKEN`); the API then demands `Authorization: Bearer <token>` (the page reads it
from the URL fragment, which browsers never send to a server).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import mimetypes
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Final
from urllib.parse import urlsplit

from breakwater.lab import MISSIONS, LabConfig, LabConfigError, mission_report, new_seed, simulate
from breakwater.lab import config as lab_config
from breakwater.lab._memo import WeightedMemo

__all__ = ["TOKEN_ENV", "LabServer", "ServeError", "make_server", "serve"]

TOKEN_ENV: Final = "BREAKWATER_LAB_TOKEN"
"""Environment variable holding the API token (the alternative to `--token`)."""
MAX_BODY: Final = 64 * 1024
"""A config is a few hundred bytes; anything bigger is not the page talking."""
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})
# Security headers on every answer. uPlot styles elements through the CSSOM, which CSP allows.
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class ServeError(Exception):
    """The server cannot start as asked (e.g. a non-loopback host without a token)."""


def is_loopback(host: str) -> bool:
    """True for `localhost` and any loopback IP literal (127.0.0.0/8, ::1)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every file under `static/` (one level of sub-folders), keyed by its URL path."""
    root = resources.files("breakwater.lab.web") / "static"
    files: dict[str, tuple[bytes, str]] = {}
    # Sorted so the allow-list is the same on every start; no user input ever reaches a file path.
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        children = sorted(entry.iterdir(), key=lambda e: e.name) if entry.is_dir() else [entry]
        for item in children:
            if not item.is_file():
                continue
            rel = item.name if item is entry else f"{entry.name}/{item.name}"
            kind = mimetypes.guess_type(item.name)[0] or "application/octet-stream"
            if kind.startswith("text/") or kind == "application/javascript":
                kind += "; charset=utf-8"
            files[f"/static/{rel}"] = (item.read_bytes(), kind)
    return files


def _lab_info() -> dict[str, object]:
    """What the page needs to draw its controls, from the engine's own constants."""
    c = lab_config
    return {
        "missions": [m.to_dict() for m in MISSIONS],
        "defaults": LabConfig().to_dict(),
        "modes": list(c.MODES),
        "routings": list(c.ROUTINGS),
        "ranges": {
            "replicas": [*c.REPLICAS_RANGE, 1],
            "idle_timeout_s": [*c.IDLE_TIMEOUT_RANGE_S, c.IDLE_TIMEOUT_STEP_S],
            "keepalive_s": [*c.KEEPALIVE_RANGE_S, 1],
            "drain_s": [*c.DRAIN_RANGE_S, 1],
        },
        "min_replicas_for_stars": c.MIN_REPLICAS_FOR_STARS,
        "parameters": [
            ["Arrival window", f"{c.WINDOW_MS // 1000} s"],
            ["Base arrivals", f"Poisson, {c.RATE_PER_S:g} calls/s over {c.CLIENTS} clients"],
            ["Slots per replica", str(c.SLOTS)],
            [
                "Call duration",
                f"log-normal, median {c.DURATION_MEDIAN_S:g} s, σ {c.DURATION_SIGMA:g}, cap {c.DURATION_CAP_MS // 1000} s",
            ],
            [
                "Mutating calls",
                f"{c.MUT_P:.0%}, side effect at {c.MUT_FRAC_LOW:.0%}–{c.MUT_FRAC_HIGH:.0%} of the run",
            ],
            [
                "Slow tools",
                f"{c.SLOW_P:.0%} of calls run {c.SLOW_MIN_MS // 1000}–{c.SLOW_MAX_MS // 1000} s, progress every "
                f"{c.PROGRESS_GAP_MIN_MS // 1000}–{c.PROGRESS_GAP_MAX_MS // 1000} s",
            ],
            ["Hot client", f"client 0 sends an extra {c.HOT_RATE_PER_S:g} calls/s"],
            ["Rolling deploy", f"starts at {c.DEPLOY_START_MS // 1000} s; reboot {c.REBOOT_MS // 1000} s"],
            ["Re-issue budget", f"{c.MAX_REISSUES} (at most {c.MAX_REISSUES + 1} attempts per call)"],
            [
                "Reconnect / re-issue delay",
                f"{c.RECONNECT_DELAY_MS // 1000} s / {c.REISSUE_DELAY_MS // 1000} s",
            ],
            ["Hard stop", f"{c.HARD_STOP_MS // 1000} s; anything pending is unfinished"],
            ["Stars", f"none below {c.MIN_REPLICAS_FOR_STARS} replicas; only at the mission's pinned seed"],
        ],
    }


BODY_CACHE_BYTES: Final = 32 * 1024 * 1024
"""The answers kept so flipping a control back and forth is free; bounded by their encoded size."""
_BODIES: Final[WeightedMemo[tuple[LabConfig, int | None], bytes]] = WeightedMemo(BODY_CACHE_BYTES, len)
# One simulation at a time: a run is pure Python (threads would not make it faster), and the
# heaviest one holds about 100 MB while it runs, so parallel slider moves must not multiply that.
_RUN_LOCK: Final = threading.Lock()


def _run_body(config: LabConfig, mission_id: int | None) -> bytes:
    """The encoded answer to one run: cached by size, computed without an event log."""
    key = (config, mission_id)
    body = _BODIES.get(key)
    if body is None:
        with _RUN_LOCK:
            body = _BODIES.get(key)
            if body is None:
                body = _compute_body(config, mission_id)
                _BODIES.put(key, body)
    return body


def _compute_body(config: LabConfig, mission_id: int | None) -> bytes:
    start = time.perf_counter()
    verdict: object = None
    if mission_id is None:
        result = simulate(config, keep_log=False).to_dict(log_limit=0)
        stars: object = None
        exploring = False
    else:
        report = mission_report(mission_id, config, log_limit=0)
        result = report["result"]  # type: ignore[assignment]
        stars = report["stars"]
        exploring = bool(report["exploration"])
        verdict = report["verdict"]
    body = {
        "config": config.to_dict(),
        "mission": mission_id,
        "stars": stars,
        "exploration": exploring,
        "verdict": verdict,
        "metrics": result["metrics"],
        "series": result["series"],
        "latency_histogram": result["latency_histogram"],
        "elapsed_ms": round((time.perf_counter() - start) * 1000, 1),
    }
    return json.dumps(body, separators=(",", ":")).encode()


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str, key: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.key = key
        self.fix = fix


class LabServer(ThreadingHTTPServer):
    """A threaded HTTP server for the lab page; `url` is where a browser should go."""

    daemon_threads = True
    # The page re-runs on every slider move; refuse nothing for lack of a backlog.
    request_queue_size = 64

    def __init__(self, host: str, port: int, *, token: str | None = None, quiet: bool = True) -> None:
        if ":" in host.strip("[]"):
            self.address_family = socket.AF_INET6
        self.bind_host = host.strip("[]")
        self.token = token or None
        self.quiet = quiet
        self.static = _static_files()
        self.lab_info = json.dumps(_lab_info(), separators=(",", ":")).encode()
        self.missions = json.dumps([m.to_dict() for m in MISSIONS], separators=(",", ":")).encode()
        super().__init__((self.bind_host, port), _Handler)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """The page's URL; with a token, the token rides in the fragment, never sent to the server."""
        host = self.bind_host
        if host in _WILDCARDS:
            host = "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        fragment = f"#token={self.token}" if self.token else ""
        return f"http://{shown}:{self.port}/{fragment}"

    def host_allowed(self, header: str | None) -> bool:
        """The Host header names this server: a loopback name or the bound host, with our port."""
        if not header:
            return False
        try:
            parts = urlsplit(f"//{header}")
            port = parts.port
            name = (parts.hostname or "").lower()
        except ValueError:
            return False
        if port != self.port:
            return False
        if name in _LOOPBACK_NAMES or is_loopback(name):
            return True
        if self.bind_host in _WILDCARDS:
            # Any address of this machine may be in the Host header; the token (required) guards it.
            return self.token is not None
        return name == self.bind_host.lower()

    def token_ok(self, header: str | None) -> bool:
        """No token configured, or `Authorization: Bearer <token>` matches it (constant time)."""
        if self.token is None:
            return True
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self.token.encode())


class _Handler(BaseHTTPRequestHandler):
    server: LabServer
    server_version = "breakwater-lab"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Every slider move is a request: log only the refused ones, which are worth a look.
        if isinstance(code, int) and code < 400:
            return
        super().log_request(code, size)

    # -- plumbing ------------------------------------------------------------------------------

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, *, cache: bool = False, close: bool = False) -> None:
        self.send_response(status)
        if close:
            # A request refused before its body was read leaves that body on the socket, where
            # keep-alive would parse it as the next request.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        for name, value in _SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: HTTPStatus, value: object, *, close: bool = False) -> None:
        self._send(status, json.dumps(value, separators=(",", ":")).encode(), "application/json", close=close)

    def _error(self, exc: _BadRequest) -> None:
        body: dict[str, object] = {"error": str(exc)}
        if exc.key is not None:
            body["key"] = exc.key
        if exc.fix is not None:
            # The hint ("did you mean 'replicas'?") rides in the message too, for clients that show only it.
            body["error"] = f"{exc}; {exc.fix}"
            body["fix"] = exc.fix
        self._json(exc.status, body, close=True)

    def _check_origin(self) -> None:
        if not self.server.host_allowed(self.headers.get("Host")):
            raise _BadRequest(HTTPStatus.MISDIRECTED_REQUEST, "unexpected Host header (DNS rebinding guard)")
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{self.headers.get('Host')}":
            raise _BadRequest(HTTPStatus.FORBIDDEN, "cross-origin requests are not allowed")

    def _check_api(self) -> None:
        if not self.server.token_ok(self.headers.get("Authorization")):
            raise _BadRequest(HTTPStatus.UNAUTHORIZED, "missing or wrong token")

    def _read_json(self) -> Mapping[str, object]:
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _BadRequest(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if not 0 <= length <= MAX_BODY:
            raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        try:
            data = json.loads(self.rfile.read(length) or b"{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "body is not JSON") from None
        if not isinstance(data, dict):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return data

    @staticmethod
    def _config(data: Mapping[str, object]) -> LabConfig:
        raw = data.get("config", {})
        if not isinstance(raw, dict):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "config must be an object", "config")
        try:
            return LabConfig.from_dict(raw)
        except LabConfigError as exc:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, exc.detail, exc.key, exc.fix) from None

    # -- routes --------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            self._check_origin()
            path = urlsplit(self.path).path
            if path in ("/", "/index.html"):
                body, kind = self.server.static["/static/index.html"]
                self._send(HTTPStatus.OK, body, kind)
            elif path in self.server.static:
                body, kind = self.server.static[path]
                self._send(HTTPStatus.OK, body, kind, cache=True)
            elif path == "/api/lab":
                self._check_api()
                self._send(HTTPStatus.OK, self.server.lab_info, "application/json")
            elif path == "/api/missions":
                self._check_api()
                self._send(HTTPStatus.OK, self.server.missions, "application/json")
            else:
                raise _BadRequest(HTTPStatus.NOT_FOUND, "not found")
        except _BadRequest as exc:
            self._error(exc)

    def do_POST(self) -> None:
        try:
            self._check_origin()
            self._check_api()
            path = urlsplit(self.path).path
            if path == "/api/run":
                data = self._read_json()
                config = self._config(data)
                mission = data.get("mission")
                if mission is not None and (
                    isinstance(mission, bool) or not isinstance(mission, int) or not 1 <= mission <= len(MISSIONS)
                ):
                    raise _BadRequest(HTTPStatus.BAD_REQUEST, f"mission must be 1–{len(MISSIONS)} or null", "mission")
                self._send(HTTPStatus.OK, _run_body(config, mission), "application/json")
            elif path == "/api/new-seed":
                config = self._config(self._read_json())
                self._json(HTTPStatus.OK, {"config": new_seed(config).to_dict()})
            else:
                raise _BadRequest(HTTPStatus.NOT_FOUND, "not found")
        except _BadRequest as exc:
            self._error(exc)


def make_server(host: str = "127.0.0.1", port: int = 0, *, token: str | None = None, quiet: bool = True) -> LabServer:
    """A bound, not yet serving `LabServer`; refuses a non-loopback host without a token.

    Raises `ServeError` for a refused host and `OSError` when the address cannot be bound.
    """
    if not is_loopback(host) and not token:
        raise ServeError(
            f"refusing to serve the lab on non-loopback host {host!r} without a token: "
            f"pass --token or set {TOKEN_ENV} (anyone who can reach the port could use it)"
        )
    return LabServer(host, port, token=token, quiet=quiet)


def serve(host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None, open_browser: bool = False) -> int:
    """Serve the lab page until interrupted; prints the URL first. Returns an exit code."""
    try:
        server = make_server(host, port, token=token, quiet=False)
    except ServeError as exc:
        print(f"breakwater lab serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the code `serve --http` gives a port in use or an address not this machine's
        print(f"breakwater lab serve: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 3
    # The first stdout line is the URL: scripts and tests read it to learn the port when asked for 0.
    print(f"breakwater lab: serving on {server.url} (Ctrl-C to stop)", flush=True)
    if open_browser:
        threading.Thread(target=webbrowser.open, args=(server.url,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
