"""The responder UI in a real browser: Debian's chromium through its chromedriver (Selenium).

A responder signs in with a triage key, opens the incident, assigns it, marks it a false positive,
and the allowlist entry that marking makes is read back through the API. The server is uvicorn on
a loopback port with the embedded backend, over plain http: browsers take Secure and ``__Host-``
cookies from http://127.0.0.1 and localhost, so the cookie is the production one.
``scripts/services`` installs chromium and chromium-driver (Debian packages) when they are
missing; this test skips only where they are not on PATH (apt-get failed or is absent).

``BLEEDWATCH_UI_SCREENSHOT=docs/ui-incident.png`` saves the incident page (the README's picture).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from service.app import create_app
from service.auth.keys import Role, create_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.migrate import upgrade
from tests.incident_traffic import leak_pair
from tests.traffic import exchange, words

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (scripts/services installs them: apt-get install chromium "
    "chromium-driver)",
)
WAIT_SECONDS = 10


@dataclass
class Served:
    url: str
    tokens: dict[Role, str]

    def headers(self, role: Role) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _keys(settings: Settings) -> dict[Role, str]:
    engine = make_engine(settings)
    tokens = {}
    async with session_scope(make_sessionmaker(engine)) as session:
        for role in (Role.INGEST, Role.TRIAGE, Role.ADMIN):
            _, tokens[role] = await create_key(session, f"browser {role.value}", role)
    await engine.dispose()
    return tokens


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """bleedwatch on a loopback port (embedded backend), in a thread of this process."""
    settings = Settings(redis_url=None, database_url=None, data_dir=tmp_path / "data")
    upgrade(settings)
    tokens = asyncio.run(_keys(settings))
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="bleedwatch-ui-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_SECONDS
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Served(f"http://127.0.0.1:{port}", tokens)
    server.should_exit = True
    thread.join(WAIT_SECONDS)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    assert CHROMIUM is not None
    assert CHROMEDRIVER is not None
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
    args = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000")
    for arg in args:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _post(served: Served, exchanges: list[dict[str, Any]]) -> None:
    resp = httpx.post(
        f"{served.url}/v1/exchanges", json={"exchanges": exchanges}, headers=served.headers(Role.INGEST), timeout=30
    )
    assert resp.status_code == 202, resp.text
    assert resp.json()["findings"] == 1, resp.text


def _leak(served: Served, text: str, source: str, recipient: str, ts: float, length: int = 40) -> None:
    _post(served, leak_pair(text, source, recipient, ts, length=length)[0])


def _leak_in_pieces(served: Served, source: str, recipient: str, ts: float) -> None:
    """An answer that carries two stretches of the source's prompt with other text between: two bars."""
    meta: dict[str, Any] = {"deployment": "pd-eu-1", "node": "decode-5", "prompt_tokens": 812_000}
    answer = " ".join(
        ("In short:", words("csv", 5, 60), words("unittest", 0, 50), words("csv", 120, 170), words("unittest", 60, 80))
    )
    src = exchange(source, "s-pieces", words("csv"), "Noted.", ts - 1, **meta)
    dst = exchange(recipient, "r-pieces", words("unittest", 100, 140), answer, ts, **meta)
    for ex in (src, dst):
        ex["model"] = "m-1m"
    _post(served, [src, dst])


def _full_page(browser: webdriver.Chrome, path: Path) -> None:
    """The whole page, not the window: DevTools lays it out at its full height for the capture."""
    height = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]["height"]
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": int(height), "deviceScaleFactor": 1, "mobile": False},
    )
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def test_sign_in_open_an_incident_and_mark_it_a_false_positive(served: Served, browser: webdriver.Chrome) -> None:
    now = time.time()
    _leak(served, "argparse", "acme", "globex", now - 120)
    _leak_in_pieces(served, "initech", "globex", now - 60)
    _leak(served, "json", "acme", "umbrella", now, length=20)
    # A form post replaces the document while a wait may be reading the old one, which Chrome can
    # answer with an inspector error instead of a stale element: keep polling until the timeout.
    wait = WebDriverWait(browser, WAIT_SECONDS, ignored_exceptions=(WebDriverException,))

    browser.get(f"{served.url}/ui")
    wait.until(expected_conditions.url_contains("/ui/signin"))
    browser.find_element(By.ID, "api_key").send_keys(served.tokens[Role.TRIAGE])
    browser.find_element(By.CSS_SELECTOR, "form[action='/ui/signin'] button").click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "table.list")))
    cookie = browser.get_cookie("__Host-bw_ui")
    assert cookie is not None
    assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, True, "Strict", "/")
    # The stylesheet loaded under the CSP (header background from ui.css, not the browser default).
    header = browser.find_element(By.CSS_SELECTOR, "header.top")
    assert header.value_of_css_property("background-color") == "rgba(29, 36, 48, 1)"

    browser.find_element(By.CSS_SELECTOR, "table.list tbody a").click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "svg.evidence rect.match")))
    incident_id = int(browser.current_url.rstrip("/").rsplit("/", 1)[1])
    assert len(browser.find_elements(By.CSS_SELECTOR, "article.finding")) == 3

    assignee = browser.find_element(By.NAME, "assignee")
    assignee.clear()
    assignee.send_keys("oncall-eu")
    browser.find_element(By.CSS_SELECTOR, "form[action$='/assignee'] button").click()
    wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, ".message"), "Assignee saved."))
    if screenshot := os.environ.get("BLEEDWATCH_UI_SCREENSHOT"):
        _full_page(browser, Path(screenshot))

    browser.find_element(By.CSS_SELECTOR, "button[name='status'][value='false_positive']").click()
    wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, ".message"), "Status changed."))
    assert browser.find_element(By.CSS_SELECTOR, "h1 .status").text == "false_positive"
    logs: list[dict[str, Any]] = browser.get_log("browser")  # type: ignore[no-untyped-call]  # untyped in selenium
    violations = [e for e in logs if "Content Security Policy" in e.get("message", "")]
    assert violations == []

    incident = httpx.get(f"{served.url}/v1/incidents/{incident_id}", headers=served.headers(Role.ADMIN)).json()
    assert (incident["status"], incident["assignee"]) == ("false_positive", "oncall-eu")
    entries = httpx.get(f"{served.url}/v1/allowlist", headers=served.headers(Role.ADMIN)).json()["items"]
    origins = {e["origin"] for e in entries if e["revoked_at"] is None}
    assert origins == {f"false_positive:finding:{f['id']}" for f in incident["findings"]}
