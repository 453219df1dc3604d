"""API and workers apart: ``bleedwatch serve`` with BLEEDWATCH_INGEST_WORKERS=0 queues, ``bleedwatch work`` processes.

Real processes on free loopback ports, on the shared Redis (a key prefix of their own) and the
session's PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pydantic
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service import metrics
from service.app import create_app
from service.auth.keys import Role
from service.config import Settings
from service.ingest import worker as worker_module
from service.local_server import free_port
from service.work import create_worker_app
from tests.conftest import REDIS_URL, _create_keys, _drop_prefix
from tests.conftest import _truncate as truncate
from tests.test_end_to_end import assert_the_leak, traffic
from tests.test_shutdown import serve

pytestmark = pytest.mark.anyio


def work(env: dict[str, str], port: int, tmp_path: Path) -> subprocess.Popen[bytes]:
    """``bleedwatch work``, once its /readyz answers."""
    with open(tmp_path / f"work-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "work", "--port", str(port)], env=env, stdout=log, stderr=log
        )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None, (tmp_path / f"work-{port}.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "bleedwatch work did not become ready"
        time.sleep(0.05)


def ingested(metrics_text: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
    return sum(s.value for s in families["bleedwatch_exchanges_ingested"].samples if s.name.endswith("_total"))


def gauge(metrics_text: str, name: str) -> float:
    (family,) = [f for f in text_string_to_metric_families(metrics_text) if f.name == name]
    (sample,) = family.samples
    return sample.value


async def test_an_api_without_workers_queues_and_a_worker_process_finds_the_leak(pg_url: str, tmp_path: Path) -> None:
    truncate(pg_url)
    prefix = f"bwwork{uuid.uuid4().hex[:8]}"
    tokens = await _create_keys(Settings(redis_url=REDIS_URL, database_url=pg_url, key_prefix=prefix))
    env = os.environ | {
        "BLEEDWATCH_REDIS_URL": REDIS_URL,
        "BLEEDWATCH_DATABASE_URL": pg_url,
        "BLEEDWATCH_KEY_PREFIX": prefix,
        "BLEEDWATCH_RATE_LIMIT_PER_SECOND": "0",
        "BLEEDWATCH_LOG_LEVEL": "warning",
    }
    # As in a container whose image sets the variable and that mounts no such directory (a worker
    # pod): one process per command, each with its own registry, whatever the variable says.
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "not-mounted")
    headers = {"Authorization": f"Bearer {tokens[Role.INGEST]}"}
    read = {"Authorization": f"Bearer {tokens[Role.READ]}"}
    api_port, work_port = free_port(), free_port()
    procs = [serve(env | {"BLEEDWATCH_INGEST_WORKERS": "0"}, api_port, tmp_path)]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=30) as client:
            for batch in traffic(time.time()).values():
                resp = await client.post(
                    "/v1/exchanges", json={"exchanges": batch}, headers=headers | {"Prefer": "respond-async"}
                )
                assert resp.status_code == 202, resp.text
                assert resp.json()["processed"] is False
            # Nobody processes yet: the API has no workers, and no worker process runs.
            assert (await client.get("/v1/queue", headers=read)).json()["queued"] == 3
            waiting = (await client.get("/metrics")).text  # what BleedwatchIngestNotProcessed reads
            assert gauge(waiting, "bleedwatch_ingest_queue_batches") == 3

            procs.append(work(env, work_port, tmp_path))
            deadline = time.monotonic() + 30
            while (await client.get("/v1/queue", headers=read)).json()["queued"]:
                assert time.monotonic() < deadline, (tmp_path / f"work-{work_port}.log").read_text()[-2000:]
                await asyncio.sleep(0.05)
            resp = await client.get("/v1/findings", headers=read)
            assert_the_leak(resp.json()["items"])
            api_metrics = (await client.get("/metrics")).text
            worker_metrics = (await client.get(f"http://127.0.0.1:{work_port}/metrics")).text
        assert ingested(worker_metrics) == 4
        assert ingested(api_metrics) == 0
        # The worker is scraped too, and asks Redis itself: a 0 there would page for a Redis that persists.
        persists = "bleedwatch_redis_persistence_ok"
        assert gauge(worker_metrics, persists) == gauge(api_metrics, persists)
        assert gauge(worker_metrics, "bleedwatch_index_items") > 0
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:  # after draining, uvicorn re-raises the signal it caught
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        _drop_prefix(prefix)


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_each_process_sets_the_queue_gauges_once_a_round(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process with workers sets them in their recovery round; its /metrics once set them again
    (the index-stats refresh, which only an API replica without workers needs)."""
    sets: list[str] = []
    monkeypatch.setattr(metrics.INGEST_QUEUE, "set", lambda _: sets.append("batches"))
    monkeypatch.setattr(metrics.INGEST_QUEUE_BYTES, "set", lambda _: sets.append("bytes"))
    monkeypatch.setattr(metrics, "INDEX_STATS", metrics.IndexStatsCache(max_age_seconds=0))  # asked at each scrape
    monkeypatch.setattr(worker_module, "RECOVER_SECONDS", 3600.0)  # one round: the first, at start
    for app in (create_worker_app(settings), create_app(settings)):
        sets.clear()
        async with app.router.lifespan_context(app):
            deadline = time.monotonic() + 30
            while len(sets) < 2:  # the recovery round, started with the workers
                assert time.monotonic() < deadline, sets
                await asyncio.sleep(0.02)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b.test") as client:
                for _ in range(2):
                    scraped = (await client.get("/metrics")).text
                    assert gauge(scraped, "bleedwatch_index_items") >= 0
                    assert "bleedwatch_ingest_queue_batches" in scraped
        assert sets == ["batches", "bytes"], app.title
    # Without workers, the API's scrape is what sets them.
    sets.clear()
    app = create_app(settings.model_copy(update={"ingest_workers": 0}))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://b.test") as c:
        await c.get("/metrics")
    assert sets == ["batches", "bytes"]


def test_a_worker_process_and_an_api_without_workers_need_redis(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="BLEEDWATCH_INGEST_WORKERS=0 needs BLEEDWATCH_REDIS_URL"):
        Settings(redis_url=None, ingest_workers=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLEEDWATCH_")} | {
        "BLEEDWATCH_DATA_DIR": str(tmp_path)
    }
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "work"], env=env, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert b"needs BLEEDWATCH_REDIS_URL" in done.stderr
