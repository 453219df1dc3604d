"""The ingest queue over several streams (BLEEDWATCH_INGEST_QUEUE_SHARDS), on one Redis and on a cluster.

The done-when test of issue 23: on the real 3-master cluster, a ``bleedwatch work`` process is
SIGKILLed while it holds batches of a 3-shard queue; another one takes them over, and every
accepted exchange is processed exactly once: marked done, its two documents indexed under the
refs it was accepted with and no others, each expected finding there once, nothing left queued
and no dead letter.
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
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from service.auth.keys import Role
from service.config import Settings
from service.index.factory import make_index
from service.index.keys import Keys
from service.index.redis_index import RedisIndex
from service.ingest.schemas import Exchange
from service.ingest.service import _idempotency_key
from service.local_server import free_port
from tests.conftest import _drop_prefix, _truncate, running_api
from tests.redis_servers import RedisClusterServers
from tests.test_work import work
from tests.traffic import TEXTS, exchange, words

pytestmark = pytest.mark.anyio

SHARDS = 3


@pytest.mark.parametrize("settings", ["redis+postgres", "redis-cluster+postgres"], indirect=True)
async def test_a_sharded_queue_spreads_batches_and_keeps_each_guarantee_per_shard(settings: Settings) -> None:
    keys = Keys(settings.key_prefix)
    assert len({key_slot(keys.queue_shard(i).encode()) for i in range(SHARDS)}) == SHARDS  # spread over slots
    assert keys.queue_shard(0) == keys.queue  # one shard is the single stream of before
    index = make_index(settings.model_copy(update={"ingest_queue_shards": SHARDS}))
    try:
        queue = index.queue()
        items = [f"batch {i}".encode() for i in range(6)]
        ids = [await queue.put(item, max_items=6) for item in items]
        assert all(ids)
        assert sorted(i.partition("@")[2] or "0" for i in ids if i) == ["0", "0", "1", "1", "2", "2"]
        assert await queue.put(b"one more", max_items=6) is None  # each shard holds its share of the bound
        assert await queue.size() == 6
        # Lanes start at their home shard and take from the others when it is empty.
        taken = [await queue.take("replica-1", 0.1, lane) for lane in (0, 0, 0, 0, 0, 0)]
        assert sorted(t for t in taken if t) == sorted(zip(ids, items, strict=True))
        assert await queue.take("replica-1", 0.05, 1) is None
        first, second = ids[0], ids[1]
        assert first is not None
        assert second is not None
        await queue.finish(first, b'{"done": 1}')
        assert await queue.result(first) == b'{"done": 1}'
        assert await queue.result(second) is None
        # replica-1 died holding the other five: another replica takes each over, from its own shard.
        await asyncio.sleep(0.02)
        reclaimed = await queue.reclaim("replica-2", min_idle_seconds=0.01, count=10)
        assert sorted((i, item, n) for i, item, n in reclaimed) == sorted(
            (i, item, 2) for i, item in zip(ids[1:], items[1:], strict=True) if i
        )
        assert await queue.hold("replica-2", second)
        for item_id, item, _ in reclaimed:
            await queue.bury(item_id, item, "ValueError: a test")
        assert (await queue.size(), await queue.dead_size()) == (0, 5)
        assert await queue.requeue_dead(3) == 3  # an operator's count holds over all the shards
        assert await queue.requeue_dead(10) == 2
        assert (await queue.size(), await queue.dead_size()) == (5, 0)
    finally:
        await index.close()


def heavy_batches(now: float) -> tuple[list[list[dict[str, Any]]], dict[str, str]]:
    """Batches that each take a while to process (long prompts), each with its own leak."""
    sources = ["argparse", "csv", "difflib", "heapq", "json", "socket"]
    filler = " ".join(" ".join(TEXTS[name]) for name in ("http", "sqlite3", "subprocess", "unittest"))
    out, leaks = [], {}
    for k, name in enumerate(sources):
        batch = [exchange(f"src-{k}", f"a-{k}", words(name), words("unittest", 0, 30), now)]
        batch += [exchange(f"t-{k}-{i}", f"f-{k}-{i}", f"{k} {i} " + filler * 6, "Done.", now) for i in range(60)]
        batch.append(exchange(f"dst-{k}", f"b-{k}", f"question {k}", words(name, 60, 110), now))
        out.append(batch)
        leaks[f"b-{k}"] = f"a-{k}"
    return out, leaks


def pending(client: redis.RedisCluster, keys: Keys) -> dict[str, int]:
    """Batches taken and not finished, by consumer, over every shard."""
    out: dict[str, int] = {}
    for shard in range(SHARDS):
        try:
            summary: Any = client.xpending(keys.queue_shard(shard), "ingest")
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            continue  # no worker has read this shard yet: nothing is pending there
        for c in summary.get("consumers") or []:
            name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
            out[name] = out.get(name, 0) + int(c["pending"])
    return out


async def test_a_worker_killed_in_the_middle_of_a_batch_loses_and_doubles_nothing(
    pg_url: str, redis_cluster: RedisClusterServers, tmp_path: Path
) -> None:
    deadline = time.monotonic() + 55  # the whole story, bounded
    _truncate(pg_url)
    prefix = f"bwkill{uuid.uuid4().hex[:8]}"
    settings = Settings(
        redis_url=redis_cluster.url,
        redis_cluster=True,
        database_url=pg_url,
        key_prefix=prefix,
        data_dir=tmp_path,
        ingest_queue_shards=SHARDS,
        ingest_workers=0,  # the API only queues; worker processes do the rest
    )
    env = os.environ | {
        "BLEEDWATCH_REDIS_URL": redis_cluster.url,
        "BLEEDWATCH_REDIS_CLUSTER": "true",
        "BLEEDWATCH_DATABASE_URL": pg_url,
        "BLEEDWATCH_KEY_PREFIX": prefix,
        "BLEEDWATCH_INGEST_QUEUE_SHARDS": str(SHARDS),
        "BLEEDWATCH_INGEST_WORKERS": "2",
        "BLEEDWATCH_INGEST_RECLAIM_SECONDS": "2",
        "BLEEDWATCH_LOG_LEVEL": "warning",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    keys = Keys(prefix)
    client = redis.RedisCluster.from_url(redis_cluster.url)
    procs: list[subprocess.Popen[bytes]] = []
    nodes: list[redis.Redis] = []
    batches, leaks = heavy_batches(time.time())
    try:
        async with running_api(settings) as api:
            for batch in batches:
                resp = await api.client.post(
                    "/v1/exchanges",
                    json={"exchanges": batch},
                    headers=api.headers(Role.INGEST) | {"Prefer": "respond-async"},
                )
                assert resp.status_code == 202, resp.text
            assert sum(client.xlen(keys.queue_shard(s)) for s in range(SHARDS)) == len(batches)
            assert all(client.xlen(keys.queue_shard(s)) for s in range(SHARDS))  # every shard has some

            nodes += [redis.Redis.from_url(node.url) for node in redis_cluster.nodes]

            def started() -> bool:
                """A worker has written a batch's documents (the first step of processing one)."""
                return any(next(node.scan_iter(match=f"{prefix}:doc:*", count=1000), None) for node in nodes)

            doomed = work(env, free_port(), tmp_path)
            procs.append(doomed)
            while not (pending(client, keys) and started()):  # it holds batches and is at one of them
                assert time.monotonic() < deadline, "the first worker never started a batch"
                await asyncio.sleep(0.01)
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(timeout=10)
            held = pending(client, keys)
            assert sum(held.values()) >= 1, held  # killed holding at least one unfinished batch
            assert started()

            procs.append(work(env, free_port(), tmp_path))
            while sum(client.xlen(keys.queue_shard(s)) for s in range(SHARDS)) or pending(client, keys):
                assert time.monotonic() < deadline, f"still queued: {pending(client, keys)}"
                await asyncio.sleep(0.1)

            queue_state = (await api.client.get("/v1/queue", headers=api.headers(Role.READ))).json()
            assert queue_state == {
                "queued": 0,
                "dead_letters": 0,
                "findings_held": 0,
                "findings_on_hold": 0,
                "findings_dead_letters": 0,
            }
            found = (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).json()["items"]
            assert sorted((f["recipient_request_id"], f["source_request_ids"]) for f in found) == sorted(
                (b, [a]) for b, a in leaks.items()
            )

        # Every accepted exchange marked done, and indexed under exactly the refs it was accepted with:
        # a batch processed twice reuses them, so there is no third document for any exchange.
        exchanges = [Exchange.model_validate(ex) for batch in batches for ex in batch]
        index = make_index(settings)
        assert isinstance(index, RedisIndex)
        try:
            assert all(await index.done([_idempotency_key(ex) for ex in exchanges], time.time()))
        finally:
            await index.close()
        docs = sum(sum(1 for _ in node.scan_iter(match=f"{prefix}:doc:*", count=1000)) for node in nodes)
        assert docs == 2 * len(exchanges)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        client.close()
        for node in redis_cluster.nodes:
            _drop_prefix(prefix, node.url)
        for one in nodes:
            one.close()


def test_sharded_queue_status_from_the_cli_sums_the_shards(redis_cluster: RedisClusterServers) -> None:
    prefix = f"bwcli{uuid.uuid4().hex[:8]}"
    env = os.environ | {
        "BLEEDWATCH_REDIS_URL": redis_cluster.url,
        "BLEEDWATCH_REDIS_CLUSTER": "true",
        "BLEEDWATCH_KEY_PREFIX": prefix,
        "BLEEDWATCH_INGEST_QUEUE_SHARDS": str(SHARDS),
    }
    client = redis.RedisCluster.from_url(redis_cluster.url)
    try:
        for shard in range(SHARDS):
            client.xadd(Keys(prefix).queue_shard(shard), {"b": b"x"})
        client.xadd(Keys(prefix).outbox_dead, {"d": b"held", "id": "1-0", "reason": "IntegrityError"})

        def cli(command: str) -> str:
            return subprocess.run(
                [sys.executable, "-m", "service.cli", "queue", command],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout

        out = cli("status")
        assert "3 batches queued, 0 dead letters" in out
        assert "0 findings held, 1 dead letter, 0 findings on hold\n" in out
        out = cli("requeue-dead")  # the findings outbox's dead letters go back too
        assert "1 held finding put back in the findings outbox" in out
        assert "1 finding held, 0 dead letters" in out
    finally:
        client.close()
        for node in redis_cluster.nodes:
            _drop_prefix(prefix, node.url)
