"""Two stateless replicas on one Redis and one PostgreSQL: a leak split across them is one finding."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from service.auth.keys import Role
from service.config import Settings
from tests.conftest import Api, running_api
from tests.traffic import exchange, words

pytestmark = pytest.mark.anyio


async def post(api: Api, *exchanges: dict[str, Any]) -> None:
    resp = await api.client.post("/v1/exchanges", json={"exchanges": list(exchanges)}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202, resp.text


@pytest.mark.parametrize("rounds", [6])
async def test_a_leak_split_across_two_replicas_is_found_exactly_once(settings: Settings, rounds: int) -> None:
    if settings.redis_url is None:
        pytest.skip("the embedded index lives in one process: replicas need Redis")
    async with running_api(settings) as one, running_api(settings) as two:
        now = time.time()
        sources = ["argparse", "subprocess", "socket", "sqlite3", "http", "csv"]
        for i in range(rounds):
            # Each a short answer of its own: the same answer served to two tenants would be a leak too.
            source = exchange(f"src-{i}", f"s-{i}", words(sources[i]), f"Noted, item {i}.", now)
            leak = exchange(f"dst-{i}", f"d-{i}", f"Question {i}: " + words("heapq"), words(sources[i], 40, 90), now)
            # Both sides at once, on different replicas, and each retried on the other replica.
            await asyncio.gather(post(one, source), post(two, leak))
            await asyncio.gather(post(two, source), post(one, leak))
        for api in (one, two):
            resp = await api.client.get("/v1/findings", params={"limit": 100}, headers=api.headers(Role.READ))
            found = sorted((f["source_tenant"], f["recipient_request_id"]) for f in resp.json()["items"])
            assert found == [(f"src-{i}", f"d-{i}") for i in range(rounds)]
