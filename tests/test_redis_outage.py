"""Redis goes away during ingest: 503 with Retry-After, readiness fails, nothing is lost.

Against a redis-server of our own (with an append-only file, like a production Redis that
restarts with its data), never the shared one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bleedwatch.client import BleedwatchClient
from service.auth.keys import Role
from service.config import Settings
from tests.conftest import _truncate as truncate
from tests.conftest import running_api
from tests.redis_servers import RedisServer
from tests.traffic import exchange, totals, words

pytestmark = pytest.mark.anyio


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", durable=True)
    server.start()
    yield server
    server.kill()


async def test_ingest_during_a_redis_outage_loses_nothing(own_redis: RedisServer, pg_url: str, tmp_path: Path) -> None:
    truncate(pg_url)
    settings = Settings(redis_url=own_redis.url, database_url=pg_url, key_prefix="outage", data_dir=tmp_path)
    now = time.time()
    source = exchange("a", "r-a", words("argparse"), words("json", 0, 30), now)
    leak = exchange("b", "r-b", words("csv"), words("argparse", 60, 110), now)
    async with running_api(settings) as api:
        ingest = api.headers(Role.INGEST)
        assert (await api.client.post("/v1/exchanges", json={"exchanges": [source]}, headers=ingest)).status_code == 202

        own_redis.kill()
        refused = await api.client.post("/v1/exchanges", json={"exchanges": [leak]}, headers=ingest)
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert refused.json()["error"] == "unavailable"
        ready = await api.client.get("/readyz")
        assert (ready.status_code, ready.json()["checks"]["index"]) == (503, "unreachable")

        # The gateway's SDK keeps retrying as told; Redis comes back while it waits.
        transport = api.client._transport  # the same in-process app
        client = BleedwatchClient(
            "http://bleedwatch.test", api.tokens[Role.INGEST], transport=transport, wait_for_processing=True
        )
        sending = asyncio.create_task(client.send([leak, exchange("c", "r-c", words("heapq"), "ok", now)]))
        await asyncio.sleep(1.0)
        assert not sending.done()
        own_redis.start()
        result: dict[str, Any] = await asyncio.wait_for(sending, timeout=60)
        await client.aclose()
        assert totals(result) == {"accepted": 2, "duplicates": 0, "findings": 1, "processed": True}

        again = await api.client.post("/v1/exchanges", json={"exchanges": [source, leak]}, headers=ingest)
        assert totals(again.json()) == {"accepted": 0, "duplicates": 2, "findings": 0, "processed": True}
        assert (await api.client.get("/readyz")).status_code == 200
        found = (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).json()["items"]
        assert [(f["source_tenant"], f["recipient_request_id"]) for f in found] == [("a", "r-b")]
