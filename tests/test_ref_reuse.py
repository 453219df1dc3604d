"""Document refs handed out twice never let one exchange's documents replace another's.

The fault drill (bench/faults.py, bench/RESULTS.md 2026-12-05) found it: a power loss with
``appendfsync everysec`` rolls Redis' ref counter back with the rest of its last second, while a
worker still holds a batch accepted in that second; the next batches accepted get the same refs,
and whichever was processed last replaced the other's documents, so a leak of the first one's text
named the second one's request and tenant. Here the rollback is made by hand: the counter is set
back after a source prompt is processed, another tenant's exchange is accepted under the same
refs, and a leak of the source's text must still name the source.
"""

from __future__ import annotations

import time

import pytest
import redis

from service.auth.keys import Role
from service.config import Settings
from service.index.base import Kind
from service.index.factory import make_index
from service.index.keys import Keys
from tests.conftest import running_api
from tests.traffic import exchange, words

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_a_rolled_back_ref_counter_does_not_misname_a_leak(settings: Settings) -> None:
    assert settings.redis_url is not None
    client = redis.Redis.from_url(settings.redis_url)
    seq = Keys(settings.key_prefix).doc_seq
    now = time.time()
    try:
        async with running_api(settings) as api:
            ingest = api.headers(Role.INGEST)

            async def post(*exchanges: dict[str, object]) -> None:
                resp = await api.client.post("/v1/exchanges", json={"exchanges": list(exchanges)}, headers=ingest)
                assert resp.status_code == 202, resp.text
                await api.processed()

            before = client.get(seq)
            await post(exchange("src", "s-1", words("argparse"), "Noted.", now))
            if before is None:
                client.delete(seq)
            else:
                client.set(seq, before)  # what a power loss does to the counter
            await post(exchange("other", "o-1", words("sqlite3"), "Fine.", now))  # given s-1's refs again
            await post(exchange("dst", "d-1", "Question: " + words("heapq"), words("argparse", 40, 90), now))
            resp = await api.client.get("/v1/findings", headers=api.headers(Role.READ))
            found = [
                (f["source_tenant"], f["source_request_ids"], f["recipient_request_id"]) for f in resp.json()["items"]
            ]
            assert found == [("src", ["s-1"], "d-1")]
        index = make_index(settings)
        try:
            docs = await index.get_docs(exchange("x", "x", "a", "b", now)["key_id"], list(range(1, 11)), now)
        finally:
            await index.close()
        by_exchange = sorted((m.tenant, m.request_id, int(m.kind)) for m in docs.values())
        assert by_exchange == sorted(
            [(t, r, int(k)) for t, r in (("src", "s-1"), ("other", "o-1"), ("dst", "d-1")) for k in Kind]
        )
    finally:
        client.close()
