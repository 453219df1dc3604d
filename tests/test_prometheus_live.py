"""Dashboards and alert rules against reality: a real Prometheus scraping a running bleedwatch.

bleedwatch runs on the embedded default on a loopback port; Prometheus (the Debian package's
binary) scrapes it every second with the alert rules loaded. After traffic with a leak, every
PromQL expression of the dashboards and rules must parse and evaluate, use only metric names
bleedwatch exports, and the leak alert must fire. Bounded to about 30 seconds.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from service.app import create_app
from service.auth.keys import Role, create_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.local_server import free_port, local_server
from service.migrate import upgrade
from tests.observability import (
    PROMETHEUS_SERIES,
    RULES,
    alert_rules,
    all_expressions,
    exported_names,
    metric_names,
    need,
    substitute,
)
from tests.traffic import BOILERPLATE, exchange, words

DEADLINE_SECONDS = 30.0
T = TypeVar("T")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=5)

    def query(self, expr: str) -> dict[str, Any]:
        resp = self.http.get("/api/v1/query", params={"query": expr})
        body: dict[str, Any] = resp.json()
        return body

    def vector(self, expr: str) -> list[dict[str, Any]]:
        body = self.query(expr)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


LINKS_URL = "https://oncall.example.net/bleedwatch"


def wait_for(what: str, check: Callable[[], T | None], deadline: float) -> T:
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


async def _ingest_key(settings: Settings) -> str:
    engine = make_engine(settings)
    async with session_scope(make_sessionmaker(engine)) as session:
        _, token = await create_key(session, "prometheus test", Role.INGEST)
    await engine.dispose()
    return token


@pytest.fixture
def bleedwatch(tmp_path: Path) -> Iterator[tuple[str, str]]:
    settings = Settings(
        redis_url=None,
        database_url=None,
        data_dir=tmp_path / "data",
        metrics_node_labels=True,
        alert_links_url=LINKS_URL,
    )
    upgrade(settings)
    token = asyncio.run(_ingest_key(settings))
    with local_server(create_app(settings)) as url:
        yield url, token


@pytest.fixture
def prometheus(tmp_path: Path, bleedwatch: tuple[str, str]) -> Iterator[Prometheus]:
    binary = need("prometheus")
    target = bleedwatch[0].removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "bleedwatch", "static_configs": [{"targets": [target]}]}],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}")

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            try:
                return prom.http.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_for("prometheus to be ready", ready, time.monotonic() + 15)
        yield prom
        prom.http.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _traffic(now: float) -> list[dict[str, Any]]:
    source = exchange("tenant-a", "r-a", BOILERPLATE + " " + words("argparse"), words("json", 0, 120), now)
    leak = exchange(
        "tenant-b",
        "r-b",
        BOILERPLATE + " " + words("sqlite3"),
        words("csv", 0, 100) + " " + words("argparse", 60, 100) + " " + words("heapq", 0, 60),
        now + 1,
        prompt_tokens=700_001,
    )
    return [source, leak]


def test_every_dashboard_and_rule_expression_evaluates_against_real_prometheus(
    bleedwatch: tuple[str, str], prometheus: Prometheus
) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    url, token = bleedwatch
    auth = {"Authorization": f"Bearer {token}"}
    # Clean traffic on the model first, scraped before the leak: the leak must show up as an
    # increase of series that already exist, as in production.
    clean = exchange("tenant-c", "r-c", BOILERPLATE + " " + words("socket"), words("difflib", 0, 90), time.time())
    assert httpx.post(f"{url}/v1/exchanges", json={"exchanges": [clean]}, headers=auth).status_code == 202
    wait_for(
        "a scrape with the model's series",
        lambda: (
            prometheus.vector('bleedwatch_findings_by_model_total{job="bleedwatch", model="m-1m"}')
            and prometheus.vector('bleedwatch_findings_by_node_total{job="bleedwatch", deployment="pd-eu-1"}')
        ),
        deadline,
    )
    before = float(
        prometheus.vector('sum(bleedwatch_findings_total{job="bleedwatch", severity="high"})')[0]["value"][1]
    )

    with httpx.Client(base_url=url, timeout=10) as client:
        batch = {"exchanges": _traffic(time.time())}
        resp = client.post("/v1/exchanges", json=batch, headers=auth)
        assert resp.status_code == 202, resp.text
        assert resp.json()["findings"] == 1
        assert client.post("/v1/exchanges", json=batch, headers=auth).json()["duplicates"] == 2  # a retry
        assert client.post("/v1/exchanges", json=batch).status_code == 401
        exposition = client.get("/metrics").text

    def leak_scraped() -> bool:
        found = prometheus.vector('sum(bleedwatch_findings_total{job="bleedwatch", severity="high"})')
        return bool(found) and float(found[0]["value"][1]) > before

    wait_for("the finding to be scraped", leak_scraped, deadline)

    def leak_alert_firing() -> dict[str, Any] | None:
        alerts = prometheus.http.get("/api/v1/alerts").json()["data"]["alerts"]
        firing = [
            a
            for a in alerts
            if a["labels"]["alertname"] == "BleedwatchCrossTenantLeakSuspected" and a["state"] == "firing"
        ]
        return firing[0] if firing else None

    alert = wait_for("BleedwatchCrossTenantLeakSuspected to fire", leak_alert_firing, deadline)
    # What the pager gets: the model and deployment named, links absolute from BLEEDWATCH_ALERT_LINKS_URL.
    annotations = alert["annotations"]
    assert annotations["summary"].endswith("(model: m-1m; deployment: pd-eu-1)"), annotations["summary"]
    assert annotations["runbook_url"] == f"{LINKS_URL}/runbooks/cross-tenant-leak.md"
    assert annotations["dashboard_url"] == f"{LINKS_URL}/d/bleedwatch-leaks"

    exported = exported_names(exposition)
    expressions = all_expressions()
    assert len(expressions) >= 60, "the expression extraction found too little"
    problems = []
    empty = []
    for where, expr in expressions:
        body = prometheus.query(substitute(expr))
        if body["status"] != "success":
            problems.append(f"{where}: {body.get('errorType')}: {body.get('error')}\n    {expr}")
        elif not body["data"]["result"]:
            empty.append(where)
        unknown = metric_names(expr) - exported - PROMETHEUS_SERIES
        if unknown:
            problems.append(f"{where}: metrics bleedwatch does not export: {sorted(unknown)}\n    {expr}")
    assert not problems, "\n".join(problems)
    print(f"{len(expressions)} expressions evaluated, {len(empty)} without data: {empty}")

    # The panels the leak must appear in do show it.
    for panel in (
        "bleedwatch-overview.json: panel 7 'Findings by severity' A",
        "bleedwatch-leaks.json: panel 3 'Findings by model' A",
        "bleedwatch-leaks.json: panel 6 'Findings by recipient prompt length' A",
        "bleedwatch-leaks.json: panel 10 'Findings by deployment' A",
        "bleedwatch-leaks.json: panel 11 'Findings by deployment and node' A",
    ):
        assert panel in {w for w, _ in expressions}, f"no such panel: {panel}"
        assert panel not in empty, f"{panel}: no data after a leak"
    # The 700,001-token prompt of the leak lands above the 655,360 bucket.
    le = {
        r["metric"]["le"]: float(r["value"][1])
        for r in prometheus.vector('sum by (le) (bleedwatch_finding_prompt_tokens_bucket{job="bleedwatch"})')
    }
    assert le["786432.0"] - le["655360.0"] >= 1

    rules = prometheus.http.get("/api/v1/rules").json()["data"]["groups"]
    unhealthy = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] == "err"]
    assert not unhealthy
    assert sum(len(g["rules"]) for g in rules) == len(alert_rules())
