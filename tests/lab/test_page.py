"""`breakwater lab serve`: the JSON API, its security rules, and the page end to end in headless Chromium.

The browser test needs Debian's `chromium` and `chromium-driver` packages and the `selenium` Python
package. Without them it is skipped locally, but fails under `CI=true`, where they must be installed.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from breakwater.lab import LabConfig, get_mission
from breakwater.lab.cli import main as lab_main
from breakwater.lab.web import LabServer, ServeError, make_server
from helpers import chrome, require, screenshot

# -- the API, in process ----------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[LabServer]:
    srv = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _request(
    srv: LabServer, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    hdrs.update(headers or {})
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=hdrs)
    res = conn.getresponse()
    data = res.read()
    conn.close()
    return res.status, {k.lower(): v for k, v in res.getheaders()}, data


def test_page_and_vendored_chart_library_are_served(server: LabServer) -> None:
    """The page, its script and uPlot come from the package, with a strict CSP; nothing else is served."""
    status, headers, body = _request(server, "GET", "/")
    assert status == 200 and b"MCP fleet: sessions, silent streams and rolling deploys" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    for path in ("/static/lab.js", "/static/lab.css", "/static/vendor/uPlot.iife.min.js", "/static/vendor/uPlot.LICENSE"):
        assert _request(server, "GET", path)[0] == 200, path
    assert _request(server, "GET", "/static/../server.py")[0] == 404
    assert _request(server, "GET", "/nope")[0] == 404


def test_api_lab_describes_the_controls_and_missions(server: LabServer) -> None:
    """`GET /api/lab` carries defaults, ranges and the six missions; `GET /api/missions` the missions."""
    status, _, body = _request(server, "GET", "/api/lab")
    info = json.loads(body)
    assert status == 200
    assert info["defaults"] == LabConfig().to_dict()
    assert info["ranges"]["idle_timeout_s"] == [10, 300, 5]
    assert [m["id"] for m in info["missions"]] == [1, 2, 3, 4, 5, 6]
    assert json.loads(_request(server, "GET", "/api/missions")[2]) == info["missions"]


def test_api_run_scores_mission_one(server: LabServer) -> None:
    """M1's set-up scores 0 stars and its fix 3, the same as the library; free play has no stars."""
    mission = get_mission(1)
    status, _, body = _request(server, "POST", "/api/run", {"mission": 1, "config": mission.setup.to_dict()})
    broken = json.loads(body)
    assert status == 200 and broken["stars"] == 0 and broken["exploration"] is False
    assert broken["metrics"]["http_404"] > 0
    assert len(broken["series"]["queue"]) == mission.setup.replicas
    fix = mission.fix.apply(mission.setup).to_dict()
    fixed = json.loads(_request(server, "POST", "/api/run", {"mission": 1, "config": fix})[2])
    assert fixed["stars"] == 3
    free = json.loads(_request(server, "POST", "/api/run", {"mission": None, "config": {"replicas": "2"}})[2])
    assert free["stars"] is None and free["config"]["replicas"] == 2
    other_seed = {**mission.setup.to_dict(), "seed": 7}
    explore = json.loads(_request(server, "POST", "/api/run", {"mission": 1, "config": other_seed})[2])
    assert explore["exploration"] is True and explore["stars"] == 0


def test_api_rejects_bad_input_with_the_control_named(server: LabServer) -> None:
    """Bad controls answer 400 naming the key (with the "did you mean" hint); non-JSON bodies 415; bad missions 400."""
    status, _, body = _request(server, "POST", "/api/run", {"config": {"replicas": 9}})
    assert status == 400 and json.loads(body)["key"] == "replicas"
    status, _, body = _request(server, "POST", "/api/run", {"config": {"replica": 3}})
    error = json.loads(body)
    assert status == 400 and error["key"] == "replica"
    assert error["fix"] == "did you mean 'replicas'?" and "did you mean 'replicas'?" in error["error"]
    assert _request(server, "POST", "/api/run", {"mission": 7, "config": {}})[0] == 400
    assert _request(server, "POST", "/api/run", "x", {"Content-Type": "text/plain"})[0] == 415


def test_new_seed_changes_only_the_seed(server: LabServer) -> None:
    """`POST /api/new-seed` keeps every control and replaces the seed."""
    config = get_mission(4).setup.to_dict()
    got = json.loads(_request(server, "POST", "/api/new-seed", {"config": config})[2])["config"]
    assert {k: v for k, v in got.items() if k != "seed"} == {k: v for k, v in config.items() if k != "seed"}
    assert isinstance(got["seed"], int)


def test_dns_rebinding_and_cross_origin_requests_are_refused(server: LabServer) -> None:
    """A foreign Host header (DNS rebinding) or a foreign Origin is refused; our own origin is fine."""
    port = server.port
    assert _request(server, "GET", "/api/lab", headers={"Host": f"evil.example:{port}"})[0] == 421
    assert _request(server, "GET", "/", headers={"Host": "127.0.0.1:1"})[0] == 421
    assert _request(server, "POST", "/api/run", {}, {"Origin": "http://evil.example"})[0] == 403
    assert _request(server, "POST", "/api/run", {}, {"Origin": "null"})[0] == 403
    own = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
    assert _request(server, "POST", "/api/run", {"config": {}}, own)[0] == 200


def test_non_loopback_needs_a_token_and_the_api_then_demands_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Binding beyond loopback is refused without a token; with one, the API wants the bearer token."""
    with pytest.raises(ServeError, match="token"):
        make_server("0.0.0.0", 0)
    assert lab_main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "non-loopback" in capsys.readouterr().err
    srv = make_server("127.0.0.1", 0, token="s3cret")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        assert srv.url.endswith("/#token=s3cret")
        assert _request(srv, "GET", "/api/lab")[0] == 401
        assert _request(srv, "GET", "/api/lab", headers={"Authorization": "Bearer nope"})[0] == 401
        assert _request(srv, "GET", "/api/lab", headers={"Authorization": "Bearer s3cret"})[0] == 200
        assert _request(srv, "GET", "/")[0] == 200  # the page itself is public; it reads the token from the fragment
    finally:
        srv.shutdown()
        srv.server_close()


# -- the page, end to end in headless Chromium -------------------------------------------------------


def _need(reason: str) -> None:
    """Skip locally; under CI the browser is part of the contract, so fail instead."""
    require(reason, ci_fix="install Debian's chromium and chromium-driver, and the dev extra")


@pytest.fixture
def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver); asked for before the server fixture, so a skip starts nothing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None:
        _need("chromium is not installed (apt-get install chromium chromium-driver)")
    if driver is None:
        _need("chromedriver is not installed (apt-get install chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        _need("the selenium package is not installed (pip install selenium)")
    assert chromium is not None and driver is not None
    return chromium, driver


@pytest.fixture
def served_url(tmp_path: Path) -> Iterator[str]:
    """`breakwater lab serve --port 0` in a subprocess; its first stdout line names the URL."""
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "breakwater", "lab", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log,  # the access log: a file, so a full pipe can never block the server
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "serving on http://127.0.0.1:" in line, line
        yield line.split("serving on ", 1)[1].split()[0]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _set_control(driver: Any, key: str, value: object) -> None:
    """Change one control the way a person would, so the page's own event handlers run."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    if key in ("mode",):
        Select(driver.find_element(By.ID, "c-mode")).select_by_value(str(value))
    elif key == "routing":
        driver.find_element(By.CSS_SELECTOR, f"input[name=routing][value={value}]").click()
    elif key in ("idempotency", "slow_tools", "rolling_deploy", "hot_client"):
        box = driver.find_element(By.ID, f"c-{key}")
        if box.is_selected() != bool(value):
            box.click()
    elif key == "keepalive_s":
        box = driver.find_element(By.ID, "c-keepalive-on")
        if box.is_selected() != (value is not None):
            box.click()
        if value is not None:
            _set_range(driver, "c-keepalive", value)
    else:
        ids = {"replicas": "c-replicas", "idle_timeout_s": "c-idle", "drain_s": "c-drain"}
        _set_range(driver, ids[key], value)


def _set_range(driver: Any, element_id: str, value: object) -> None:
    # WebDriver cannot drag a slider to an exact value; set it and fire the event a drag fires.
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input', {bubbles: true}));",
        element_id,
        str(value),
    )


def _wait_for_stars(driver: Any, stars: int, config: LabConfig, mission: int = 1) -> None:
    """Wait until the page shows the run of `config` as `mission` and its verdict is `stars`."""
    from selenium.webdriver.support.ui import WebDriverWait

    want = [mission, config.to_dict()]

    def ready(d: Any) -> bool:
        state = d.execute_script(
            "return [document.body.dataset.runState, document.body.dataset.renderedKey,"
            " document.getElementById('verdict').dataset.stars]"
        )
        return bool(state[0] == "idle" and state[1] and json.loads(state[1]) == want and state[2] == str(stars))

    WebDriverWait(driver, 30, poll_frequency=0.1).until(ready, f"the page never showed {stars} stars for {want}")


def _clickable(driver: Any, element_id: str) -> Any:
    """The element, once the page's script has drawn it and it can be clicked (the page starts async)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 30).until(expected_conditions.element_to_be_clickable((By.ID, element_id)))


def _chrome(chromium: str, chromedriver: str, tmp_path: Path) -> Any:
    """Headless Chromium with its own profile (see `helpers.chrome`)."""
    return chrome(chromium, chromedriver, tmp_path / "profile")


@pytest.mark.timeout(120)
def test_page_mission_one_end_to_end_in_chromium(browser_paths: tuple[str, str], served_url: str, tmp_path: Path) -> None:
    """Load mission 1, see 0 stars, apply the fix, see 3 stars; progress survives a reload; screenshot."""
    chromium, chromedriver = browser_paths
    from selenium.webdriver.common.by import By

    driver: Any = _chrome(chromium, chromedriver, tmp_path)
    try:
        driver.get(served_url)
        mission = get_mission(1)
        _clickable(driver, "mission-1").click()
        driver.find_element(By.ID, "load-setup").click()
        _wait_for_stars(driver, 0, mission.setup)
        assert "Goal not met" in driver.find_element(By.ID, "verdict-text").text
        assert "bad" in (driver.find_element(By.CSS_SELECTOR, "[data-metric=http_404]").get_attribute("class") or "")
        assert driver.find_element(By.ID, "mission-2").get_attribute("disabled") is not None
        screenshot(driver, tmp_path / "lab-m1-setup.png", copy_env="BREAKWATER_LAB_SCREENSHOT_DIR")

        fixed = mission.fix.apply(mission.setup)
        for key, value in mission.fix.changes.items():
            _set_control(driver, key, value)
        _wait_for_stars(driver, 3, fixed)
        assert driver.find_element(By.ID, "verdict-stars").text == "★★★"
        assert driver.find_element(By.CSS_SELECTOR, "#mission-1 .m-stars").text == "★★★"
        assert driver.find_element(By.ID, "mission-2").get_attribute("disabled") is None
        progress = json.loads(driver.execute_script("return localStorage.getItem('breakwater.lab.progress.v1')"))
        assert progress["best"][:2] == [3, 0]

        # A slider dragged fast: runs are single-flight, and the page ends on the last position.
        for seconds in (65, 120, 200, 300, 10, 60):
            _set_control(driver, "idle_timeout_s", seconds)
        _wait_for_stars(driver, 3, fixed)

        # Stars are kept: a reload restores the mission, the controls and the best stars.
        driver.refresh()
        _wait_for_stars(driver, 3, fixed)
        assert driver.find_element(By.CSS_SELECTOR, "#mission-1 .m-stars").text == "★★★"
        for chart in ("ch-inflight", "ch-queue", "ch-failures", "ch-404", "ch-cuts", "ch-dups", "ch-latency"):
            assert driver.find_elements(By.CSS_SELECTOR, f"#{chart} canvas"), chart
        shot = screenshot(driver, tmp_path / "lab-m1-fixed.png", copy_env="BREAKWATER_LAB_SCREENSHOT_DIR")
        assert shot.stat().st_size > 10_000
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()


@pytest.mark.timeout(120)
def test_page_explains_a_failed_verdict_and_a_trap(browser_paths: tuple[str, str], served_url: str, tmp_path: Path) -> None:
    """M4's set-up: the verdict names the p95 condition and its miss, the p95 tile is red, the framing is on the
    page; trying the "affinity with 6 replicas" trap shows why it fails and keeps it under "traps you have tried"."""
    chromium, chromedriver = browser_paths
    from selenium.webdriver.common.by import By

    driver: Any = _chrome(chromium, chromedriver, tmp_path)
    try:
        driver.get(served_url)
        # Missions 1-3 done: mission 4 is open.
        driver.execute_script("localStorage.setItem('breakwater.lab.progress.v1', JSON.stringify({best: [3, 3, 3, 0, 0, 0]}))")
        driver.refresh()
        mission = get_mission(4)
        _clickable(driver, "mission-4").click()
        _wait_for_stars(driver, 0, mission.setup, mission=4)
        missed = driver.find_elements(By.CSS_SELECTOR, "#verdict-conditions li.missed")
        assert [li.get_attribute("data-key") for li in missed] == ["p95_ms"]
        assert "p95 latency ≤ 10 s" in missed[0].text and "over the limit of 10 s" in missed[0].text
        assert "missed p95 latency ≤ 10 s" in driver.find_element(By.ID, "verdict-text").text
        tile = driver.find_element(By.CSS_SELECTOR, "[data-metric=p95_ms]")
        assert "bad" in (tile.get_attribute("class") or "")
        assert "bad" not in (driver.find_element(By.CSS_SELECTOR, "[data-metric=failed]").get_attribute("class") or "")
        page = driver.find_element(By.TAG_NAME, "body").text
        assert "deterministic synthetic model" in page and "calculated estimate" in page
        for heading in ("How to play", "What it cannot tell you"):
            assert heading in page, heading
        assert driver.find_element(By.ID, "assumptions").find_element(By.TAG_NAME, "summary").text == "What the model assumes"
        assert driver.find_element(By.ID, "trap-why").is_displayed() is False
        screenshot(driver, tmp_path / "lab-failed-verdict.png", copy_env="BREAKWATER_LAB_SCREENSHOT_DIR")

        trap = mission.variant("affinity6")
        _set_control(driver, "replicas", 6)
        _wait_for_stars(driver, 0, trap.apply(mission.setup), mission=4)
        why = driver.find_element(By.ID, "trap-why")
        assert why.is_displayed() and trap.why in why.text
        _set_control(driver, "replicas", 3)
        _wait_for_stars(driver, 0, mission.setup, mission=4)
        assert not why.is_displayed()
        found = driver.find_element(By.ID, "traps-found")
        assert found.is_displayed()
        found.click()
        assert trap.label in found.text and trap.why in found.text
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
