"""The same traffic gives the same findings on a single Redis and on a Redis Cluster.

On a cluster each node runs its shards' scripts in its own order: two batches processed at once
reach one node in one order and another node in the other, and a batch may be processed after
one accepted later. So findings must not depend on the order in which batches are processed.
This test accepts one traffic in one order on both topologies, and processes it in acceptance
order on the single Redis and in reverse on the cluster (what a cluster can do to any pair of
batches), then compares every finding field by field. The traffic has a source that resent its
text in a later request, two tenants that sent the same text, and an answer copied from an
earlier answer.

Also: ``/metrics`` answers on a cluster (the index's memory is every primary's).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from service import metrics
from service.app import create_app
from service.auth.keys import Role
from service.config import Settings
from service.deps import AppDeps
from tests.conftest import REDIS_URL, RUN_ID, Api, _create_keys, _drop_prefix, _truncate
from tests.redis_servers import RedisClusterServers
from tests.traffic import BOILERPLATE, exchange, words

pytestmark = pytest.mark.anyio


def traffic(now: float) -> list[list[dict[str, Any]]]:
    """Four batches, in acceptance order."""
    tie = words("heapq", 0, 150)
    return [
        [
            exchange("tenant-x", "x-1", BOILERPLATE + " " + words("argparse", 0, 200), words("json", 0, 100), now),
            exchange("tenant-p", "p-1", tie, words("csv", 200, 300), now + 1),
        ],
        [
            exchange("tenant-q", "q-1", tie + " " + words("socket", 0, 50), words("difflib", 0, 60), now + 2),
            exchange(
                "tenant-y",
                "y-1",
                words("sqlite3"),
                words("csv", 0, 80) + " " + words("argparse", 60, 110) + " " + words("http", 0, 60),
                now + 3,
            ),
        ],
        [
            # tenant-x resends its earlier text: the leak above came from x-1, which sent it first.
            exchange(
                "tenant-x", "x-2", words("argparse", 0, 200) + " " + words("subprocess", 0, 100), "Done.", now + 4
            ),
        ],
        [
            # An earlier answer served to tenant-x, in tenant-v's answer.
            exchange(
                "tenant-v",
                "v-1",
                words("sqlite3", 0, 60),
                words("unittest", 100, 160) + " " + words("json", 10, 60),
                now + 6,
            ),
        ],
    ]


@asynccontextmanager
async def app_without_workers(settings: Settings) -> AsyncIterator[tuple[Api, AppDeps]]:
    """The app with no ingest workers: the test processes the queue itself, in the order it chooses."""
    settings = settings.model_copy(update={"ingest_workers": 0})
    tokens = await _create_keys(settings)
    app: FastAPI = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bleedwatch.test") as client:
            yield Api(client, tokens, app), app.state.deps


async def replay(settings: Settings, reverse: bool) -> list[dict[str, Any]]:
    """Findings of the traffic accepted in order and processed in order, or in reverse."""
    now = time.time() - 60
    async with app_without_workers(settings) as (api, deps):
        for batch in traffic(now):
            resp = await api.client.post(
                "/v1/exchanges",
                json={"exchanges": batch},
                headers=api.headers(Role.INGEST) | {"Prefer": "respond-async"},
            )
            assert resp.status_code == 202, resp.text
        queue = deps.index.queue()
        taken = []
        while (next_item := await queue.take("replay", 0.05)) is not None:
            taken.append(next_item)
        assert len(taken) == 4
        for item_id, item in reversed(taken) if reverse else taken:
            result = await deps.ingestor.process(item)
            await queue.finish(item_id, result.model_dump_json().encode())
        resp = await api.client.get("/v1/findings", headers=api.headers(Role.READ))
        assert resp.status_code == 200, resp.text
        items: list[dict[str, Any]] = resp.json()["items"]
    for f in items:
        for moving in ("id", "detected_at", "updated_at", "response_at"):
            f.pop(moving)
    return sorted(items, key=lambda f: f["recipient_request_id"])


def attribution(findings: list[dict[str, Any]]) -> dict[str, tuple[str, list[str]]]:
    return {f["recipient_request_id"]: (f["source_tenant"], f["source_request_ids"]) for f in findings}


async def test_one_traffic_gives_the_same_findings_on_a_single_redis_and_on_a_cluster(
    pg_url: str, redis_ok: None, redis_cluster: RedisClusterServers, tmp_path: Path
) -> None:
    single = Settings(redis_url=REDIS_URL, database_url=pg_url, key_prefix=f"bwt{RUN_ID}topo1", data_dir=tmp_path)
    cluster = Settings(
        redis_url=redis_cluster.url,
        redis_cluster=True,
        database_url=pg_url,
        key_prefix=f"bwt{RUN_ID}topo2",
        data_dir=tmp_path,
    )
    try:
        _truncate(pg_url)
        on_single = await replay(single, reverse=False)
        _truncate(pg_url)
        on_cluster = await replay(cluster, reverse=True)
    finally:
        _drop_prefix(single.key_prefix)
        for node in redis_cluster.nodes:
            _drop_prefix(cluster.key_prefix, node.url)
    assert attribution(on_single) == {
        "y-1": ("tenant-x", ["x-1"]),
        "v-1": ("tenant-x", ["x-1"]),
    }, on_single
    assert attribution(on_cluster) == attribution(on_single)
    assert on_cluster == on_single  # every field: scores, evidence ranges, severities


@pytest.mark.parametrize("settings", ["redis-cluster+postgres"], indirect=True)
async def test_metrics_answer_on_a_cluster_with_every_primarys_memory(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics.INDEX_STATS, "max_age_seconds", 0.0)  # asked now, not cached from another test
    resp = await api.client.post(
        "/v1/exchanges",
        json={"exchanges": traffic(time.time() - 60)[0]},
        headers=api.headers(Role.INGEST),
    )
    assert resp.status_code == 202, resp.text
    resp = await api.client.get("/metrics")
    assert resp.status_code == 200, resp.text
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    (memory,) = families["bleedwatch_index_memory_bytes"].samples
    (items,) = families["bleedwatch_index_items"].samples
    (limit,) = families["bleedwatch_index_memory_max_bytes"].samples  # the test cluster's masters have none
    assert memory.value > 0
    assert limit.value == 0
    assert items.value > 0
