"""Ingest is answered once a batch is durably queued, and every queued batch is processed.

- The queue contract, on every index backend.
- ``Prefer: respond-async``: the answer comes before processing; the finding follows.
- A full queue refuses with 503 and Retry-After, and keeps nothing.
- A batch held by a replica that died is taken over and processed by another; one its live worker is
  still at is not, however long it takes.
- A batch whose processing keeps failing is moved to the dead letters after MAX_DELIVERIES, and counted;
  put back, it is processed.
- A batch whose backend blinks during processing is retried by its worker: no failure, no dead letter.
- A worker outlives an error of the queue that is no outage (redis-py lets some resets out as AttributeError).
- Dead letters (of the queue and of the findings outbox) expire after their retention, counted;
  those within it are still requeued.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import httpx
import orjson
import pytest
import redis.exceptions
import sqlalchemy.exc

from service import metrics
from service.auth.keys import Role
from service.config import Settings
from service.findings.writer import FindingsWriter
from service.index.base import Index, Queue
from service.ingest import envelope
from service.ingest import worker as worker_module
from service.ingest.service import Ingestor
from service.queue_cli import queue_command
from tests.conftest import ALL_BACKENDS, BACKENDS, Api, running_api
from tests.test_end_to_end import assert_the_leak, findings, traffic
from tests.traffic import totals

pytestmark = pytest.mark.anyio


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)


def deps(api: Api) -> Any:
    return api.client._transport.app.state.deps  # type: ignore[attr-defined]


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_the_queue_hands_each_batch_to_one_worker_until_it_is_finished(index: Index) -> None:
    queue = index.queue()
    first = await queue.put(b"one", max_items=2)
    second = await queue.put(b"two", max_items=2)
    assert first is not None
    assert second is not None
    assert await queue.put(b"three", max_items=2) is None  # full: refused, not kept
    assert await queue.size() == 2
    assert await queue.take("replica-1", block_seconds=0.1) == (first, b"one")
    assert await queue.take("replica-2", block_seconds=0.1) == (second, b"two")
    assert await queue.take("replica-2", block_seconds=0.05) is None  # nothing new: both are held
    assert await queue.result(first) is None
    await queue.finish(first, b'{"done": 1}')
    assert await queue.result(first) == b'{"done": 1}'
    assert await queue.reclaim("replica-3", min_idle_seconds=60, count=10) == []  # replica-2 is not idle yet
    # replica-2 died holding "two": once idle long enough, another replica takes it over.
    await asyncio.sleep(0.02)
    assert await queue.reclaim("replica-3", min_idle_seconds=0.01, count=10) == [(second, b"two", 2)]
    await queue.bury(second, b"two", "ValueError: a test")
    assert (await queue.size(), await queue.dead_size()) == (0, 1)
    assert await queue.reclaim("replica-3", min_idle_seconds=0, count=10) == []
    # The bug fixed, an operator puts the dead letters back (bleedwatch queue requeue-dead).
    assert await queue.requeue_dead(10) == 1
    assert (await queue.size(), await queue.dead_size()) == (1, 0)
    taken = await queue.take("replica-3", block_seconds=0.1)
    assert taken is not None
    assert taken[1] == b"two"


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_a_batch_held_by_its_worker_is_not_reclaimed_however_long_it_takes(index: Index) -> None:
    queue = index.queue()
    item_id = await queue.put(b"slow", max_items=10)
    assert item_id is not None
    assert await queue.take("replica-1", block_seconds=0.1) == (item_id, b"slow")
    await asyncio.sleep(2.0)
    assert await queue.hold("replica-1", item_id)
    # Idle for 2 s, but held just now (the margin is for a loaded machine's Redis round trips).
    assert await queue.reclaim("replica-2", min_idle_seconds=1.0, count=10) == []
    await asyncio.sleep(1.0)
    # Silent for longer than that: taken over, with the delivery the hold did not count.
    assert await queue.reclaim("replica-2", min_idle_seconds=1.0, count=10) == [(item_id, b"slow", 2)]
    assert not await queue.hold("replica-1", item_id)  # replica-2's now: its first worker cannot take it back
    assert await queue.hold("replica-2", item_id)
    await queue.finish(item_id, b"{}")
    assert not await queue.hold("replica-2", item_id)


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_an_async_answer_comes_before_processing_and_the_finding_follows(api: Api) -> None:
    batches = traffic(time.time())
    resp = await api.client.post(
        "/v1/exchanges",
        json={"exchanges": batches["source"] + batches["leak"]},
        headers=api.headers(Role.INGEST) | {"Prefer": "respond-async"},
    )
    assert resp.status_code == 202, resp.text
    assert resp.headers["preference-applied"] == "respond-async"
    assert totals(resp.json()) == {"accepted": 2, "duplicates": 0, "findings": None, "processed": False}

    async def found() -> bool:
        return len(await findings(api)) == 1

    await eventually(found)
    assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_full_queue_refuses_with_503_and_keeps_nothing(api: Api) -> None:
    ingestor: Ingestor = deps(api).ingestor
    ingestor.queue_max_batches, ingestor.queue_max_bytes = 0, 1
    resp = await api.client.post(
        "/v1/exchanges", json={"exchanges": traffic(time.time())["source"]}, headers=api.headers(Role.INGEST)
    )
    assert resp.status_code == 503
    assert resp.headers["retry-after"]
    assert "the ingest queue is full (at most 0 batches or 1 byte wait" in resp.json()["detail"]
    assert await deps(api).index.queue().size() == 0


@pytest.mark.parametrize("settings", ["redis+postgres", "redis-cluster+postgres"], indirect=True)
async def test_a_batch_held_by_a_replica_that_died_is_processed_by_another(settings: Settings, index: Index) -> None:
    batches = traffic(time.time())
    body = b"req-of-the-dead-replica\n" + orjson.dumps({"exchanges": batches["source"] + batches["leak"]})
    queue = index.queue()
    item_id = await queue.put(body, max_items=10)
    assert await queue.take("replica-that-dies", block_seconds=0.5) == (item_id, body)
    async with running_api(settings.model_copy(update={"ingest_reclaim_seconds": 0.2})) as api:

        async def found() -> bool:
            return len(await findings(api)) == 1

        await eventually(found)
        assert_the_leak(await findings(api))
        assert await queue.size() == 0


async def queue_the_leak(api: Api) -> httpx.Response:
    """The source and the leak in one batch, answered once queued."""
    return await api.client.post(
        "/v1/exchanges",
        json={"exchanges": traffic(time.time())["source"] + traffic(time.time())["leak"]},
        headers=api.headers(Role.INGEST) | {"Prefer": "respond-async"},
    )


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_batch_slower_than_the_reclaim_time_is_processed_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    processed = []
    real = Ingestor.process

    async def slow(self: Ingestor, body: bytes) -> Any:
        processed.append(body)
        await asyncio.sleep(3.0)  # three times the reclaim time: a long-context batch on a loaded Redis
        return await real(self, body)

    monkeypatch.setattr(Ingestor, "process", slow)
    monkeypatch.setattr(worker_module, "RECOVER_SECONDS", 0.05)
    async with running_api(settings.model_copy(update={"ingest_reclaim_seconds": 1.0})) as api:
        resp = await queue_the_leak(api)
        assert resp.status_code == 202
        queue: Queue = deps(api).index.queue()

        async def done() -> bool:
            return await queue.size() == 0

        await eventually(done)
        assert len(processed) == 1
        assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_an_idle_worker_stops_at_once_and_a_batch_queued_as_it_stops_is_still_processed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Takes that block an hour: stopping must not wait them out (a restart, every test's teardown).
    monkeypatch.setattr(worker_module, "TAKE_BLOCK_SECONDS", 3600.0)
    monkeypatch.setattr(worker_module, "RECOVER_SECONDS", 0.05)
    async with running_api(settings.model_copy(update={"ingest_workers": 0})) as api:
        queue: Queue = deps(api).index.queue()
        worker = worker_module.IngestWorker(deps(api).ingestor, queue, 2, 30.0)
        worker.start()
        await asyncio.sleep(0.2)  # both blocked in take
        await asyncio.wait_for(worker.stop(), 30)
        # A batch arrives as the worker stops: it may wake a take that stop then cancels.
        worker.start()
        await asyncio.sleep(0.2)
        batches = traffic(time.time())
        await queue.put(b"req-as-it-stops\n" + orjson.dumps({"exchanges": batches["source"] + batches["leak"]}), 10)
        await asyncio.wait_for(worker.stop(), 30)
        # Processed before it stopped (the embedded queue's), or pending and reclaimed (Redis').
        other = worker_module.IngestWorker(deps(api).ingestor, queue, 1, 0.2)
        other.start()

        async def done() -> bool:
            return await queue.size() == 0

        await eventually(done)
        await asyncio.wait_for(other.stop(), 30)
        assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
async def test_a_batch_queued_before_the_wire_was_strict_is_still_processed(settings: Settings) -> None:
    """Replicas once took numeric strings for ts and 60.0 for an integer, and queued the body as it came;
    the wire refuses them now, but nothing after acceptance refuses an exchange (a rolling upgrade)."""
    async with running_api(settings.model_copy(update={"ingest_workers": 0})) as api:
        batches = traffic(time.time())
        exchanges = batches["source"] + batches["leak"]
        for ex in exchanges:
            ex["ts"] = str(datetime.fromisoformat(ex["ts"]).timestamp())
            ex["scheme"]["n"] = float(ex["scheme"]["n"])
            ex["prompt"]["token_count"] = float(ex["prompt"]["token_count"])
        body = orjson.dumps({"exchanges": exchanges})
        headers = api.headers(Role.INGEST) | {"Content-Type": "application/json"}
        refused = await api.client.post("/v1/exchanges", content=body, headers=headers)
        assert refused.status_code == 422, refused.text  # no longer accepted
        item = b"req-before\n" + body
        assert len(Ingestor.split(item)) == 2
        result = await deps(api).ingestor.process(item)
        assert (result.accepted, result.findings) == (2, 1)
        assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_batch_that_keeps_failing_goes_to_the_dead_letters_and_back_once_fixed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def broken(self: Ingestor, body: bytes) -> Any:
        raise RuntimeError("a bug in processing")

    fixed = Ingestor.process
    monkeypatch.setattr(Ingestor, "process", broken)
    monkeypatch.setattr(worker_module, "RECOVER_SECONDS", 0.05)
    dead_before = metrics.INGEST_DEAD_LETTERS._value.get()
    failures_before = metrics.INGEST_FAILURES._value.get()
    async with running_api(settings.model_copy(update={"ingest_reclaim_seconds": 0.05})) as api:
        resp = await queue_the_leak(api)
        assert resp.status_code == 202
        queue = deps(api).index.queue()

        # The batch of two is split at its first failure; each exchange then fails on its own.
        async def buried() -> bool:  # the counter moves after the queue's transaction: wait for both
            return bool(await queue.size() == 0 and metrics.INGEST_DEAD_LETTERS._value.get() == dead_before + 2)

        await eventually(buried)
        assert metrics.INGEST_FAILURES._value.get() == failures_before + 1 + 2 * worker_module.MAX_DELIVERIES
        if settings.redis_url is None:
            dead = [(item, reason) for _, item, reason in queue.dead]
        else:
            entries = await deps(api).index.client.xrange(deps(api).index.keys.dead_letters)
            dead = [(f[b"b"], f[b"reason"].decode()) for _, f in entries]
        batch = resp.headers["x-request-id"].encode() + b"\n" + resp.request.content
        # Each exchange keeps the doc refs it was given at acceptance; otherwise it is the batch's own.
        alone = [(rid, body) for rid, _, body in (envelope.unwrap(item) for item, _ in dead)]
        assert sorted(alone) == sorted(tuple(item.split(b"\n", 1)) for item in Ingestor.split(batch))
        assert {reason for _, reason in dead} == {"RuntimeError: a bug in processing"}
        assert await findings(api) == []

        monkeypatch.setattr(Ingestor, "process", fixed)
        if settings.redis_url is None:
            assert await queue.requeue_dead(10) == 2
        else:
            monkeypatch.setenv("BLEEDWATCH_REDIS_URL", settings.redis_url)
            monkeypatch.setenv("BLEEDWATCH_KEY_PREFIX", settings.key_prefix)
            assert await queue_command("requeue-dead") == 0
            assert capsys.readouterr().out.startswith("2 dead letters put back in the queue")

        async def found() -> bool:
            return len(await findings(api)) == 1

        await eventually(found)
        assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_an_exchange_processing_trips_on_goes_alone_to_the_dead_letters(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Ingestor.process

    async def tripped(self: Ingestor, item: bytes) -> Any:
        if b'"tenant":"hostile"' in item:
            raise RecursionError("maximum recursion depth exceeded")
        return await real(self, item)

    monkeypatch.setattr(Ingestor, "process", tripped)
    monkeypatch.setattr(worker_module, "RECOVER_SECONDS", 0.05)
    async with running_api(settings.model_copy(update={"ingest_reclaim_seconds": 0.05})) as api:
        batch = traffic(time.time())
        hostile = {**batch["leak"][0], "tenant": "hostile", "request_id": "h-1"}
        resp = await api.client.post(
            "/v1/exchanges",
            json={"exchanges": [*batch["source"], hostile, *batch["leak"]]},
            headers=api.headers(Role.INGEST) | {"Prefer": "respond-async"},
        )
        assert resp.status_code == 202
        queue = deps(api).index.queue()

        async def settled() -> bool:
            return bool(await queue.size() == 0 and await queue.dead_size() == 1)

        await eventually(settled)
        assert_the_leak(await findings(api))  # the other tenants' exchanges were processed


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_batch_is_retried_by_its_worker_while_a_backend_is_unreachable(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Ingestor.process
    # Between acceptance and processing, Redis, then the database, then Redis again are unreachable.
    outages: list[Exception] = [
        redis.exceptions.ConnectionError("down"),
        sqlalchemy.exc.OperationalError("SELECT 1", None, OSError("down")),
        redis.exceptions.TimeoutError("slow"),
    ]

    async def flaky(self: Ingestor, item: bytes) -> Any:
        if outages:
            raise outages.pop(0)
        return await real(self, item)

    monkeypatch.setattr(Ingestor, "process", flaky)
    failures_before = metrics.INGEST_FAILURES._value.get()
    async with running_api(settings) as api:
        batches = traffic(time.time())
        resp = await api.client.post(
            "/v1/exchanges", json={"exchanges": batches["source"] + batches["leak"]}, headers=api.headers(Role.INGEST)
        )
        assert totals(resp.json()) == {"accepted": 2, "duplicates": 0, "findings": 1, "processed": True}
        assert outages == []
        assert metrics.INGEST_FAILURES._value.get() == failures_before  # an outage is no failure
        assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_worker_outlives_an_error_that_is_no_outage(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py lets some connection resets out as AttributeError (redis/redis-py#4287); with one
    # worker, a worker that died of it would leave the batch unprocessed and its replica idle.
    async with running_api(settings.model_copy(update={"ingest_workers": 1})) as api:
        queue = deps(api).index.queue()
        real = type(queue).take
        errors = [AttributeError("'NoneType' object has no attribute 'writelines'")]

        async def flaky(self: Any, consumer: str, block_seconds: float, lane: int = 0) -> Any:
            if errors:
                raise errors.pop(0)
            return await real(self, consumer, block_seconds, lane)

        monkeypatch.setattr(type(queue), "take", flaky)

        async def thrown() -> bool:
            return not errors

        await eventually(thrown)
        batches = traffic(time.time())
        resp = await api.client.post(
            "/v1/exchanges", json={"exchanges": batches["source"] + batches["leak"]}, headers=api.headers(Role.INGEST)
        )
        assert totals(resp.json()) == {"accepted": 2, "duplicates": 0, "findings": 1, "processed": True}
        assert_the_leak(await findings(api))


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_dead_letters_expire_and_the_unexpired_are_still_requeued(settings: Settings, index: Index) -> None:
    """Dead letters of the ingest queue and of the findings outbox are kept for the retention, then
    deleted and counted; `requeue-dead` still puts back those within it."""
    queue, box = index.queue(), index.outbox()

    async def bury(body: bytes) -> None:
        item_id = await queue.put(body, max_items=10)
        assert item_id is not None
        assert await queue.take("replica", block_seconds=0.5) == (item_id, body)
        await queue.bury(item_id, body, "RuntimeError: a bug")
        await box.hold([b"held-" + body])
        ((held_id, held),) = await box.claim("replica", 10, min_idle_seconds=60)
        await box.bury(held_id, held, "IntegrityError: a bug")

    await bury(b"old")
    await asyncio.sleep(0.01)  # burials on either side of `middle`, to the millisecond of a stream id
    middle = time.time()
    await asyncio.sleep(0.01)
    await bury(b"new")
    expired = {q: metrics.DEAD_LETTERS_EXPIRED.labels(q)._value.get() for q in ("ingest", "findings")}
    async with running_api(settings) as api:
        worker = worker_module.IngestWorker(deps(api).ingestor, queue, 0, 30.0, dead_letter_seconds=3600)
        writer = FindingsWriter(deps(api).sessions, box, dead_letter_seconds=3600)
        assert await worker.expire_dead(middle + 3600 - 60) == 0  # both younger than the retention
        assert await writer.expire_dead(middle + 3600 - 60) == 0
        assert await worker.expire_dead(middle + 3600) == 1
        assert await writer.expire_dead(middle + 3600) == 1
    assert metrics.DEAD_LETTERS_EXPIRED.labels("ingest")._value.get() - expired["ingest"] == 1
    assert metrics.DEAD_LETTERS_EXPIRED.labels("findings")._value.get() - expired["findings"] == 1
    assert (await queue.dead_size(), await box.dead_size()) == (1, 1)
    assert await queue.requeue_dead(10) == 1
    taken = await queue.take("replica", block_seconds=0.5)
    assert taken is not None
    assert taken[1] == b"new"
    assert await box.requeue_dead(10) == 1
    assert [item for _, item in await box.claim("replica", 10, min_idle_seconds=60)] == [b"held-new"]


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_the_queue_is_bounded_in_bytes_and_counts_each_item_out_once(index: Index) -> None:
    queue = index.queue()
    assert await queue.put(b"a" * 700, max_items=10, max_bytes=1000) is not None  # empty: any item goes
    assert await queue.put(b"b" * 400, max_items=10, max_bytes=1000) is None  # 1,100 bytes: refused
    second = await queue.put(b"c" * 300, max_items=10, max_bytes=1000)
    assert second is not None
    assert await queue.byte_size() == 1000
    first = await queue.take("replica", block_seconds=0.5)
    assert first is not None
    await queue.finish(first[0], b"{}")
    await queue.finish(first[0], b"{}")  # at least once: a second finish subtracts nothing
    assert await queue.byte_size() == 300
    taken = await queue.take("replica", block_seconds=0.5)
    assert taken is not None
    await queue.bury(taken[0], taken[1], "RuntimeError: a bug")  # dead letters are bounded by expiry, not here
    assert await queue.byte_size() == 0
    assert await queue.requeue_dead(10) == 1
    assert await queue.byte_size() == 300
    assert await queue.rewrite(lambda item: item[:100]) == 1  # a purge's rewrite keeps the count true
    assert await queue.byte_size() == 100
    assert await queue.rewrite(lambda item: None) == 1
    assert await queue.byte_size() == 0
    assert await queue.put(b"d" * 5000, max_items=10, max_bytes=1000) is not None  # larger than the bound, alone


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_a_queue_full_in_bytes_refuses_with_503_and_keeps_nothing(settings: Settings) -> None:
    """API replicas only (no worker here), so what is queued stays: the second batch passes the byte bound."""
    before = metrics.INGEST_QUEUE_FULL._value.get()
    async with running_api(settings.model_copy(update={"ingest_workers": 0, "ingest_queue_max_bytes": 1024})) as api:
        queue = deps(api).index.queue()
        batches = traffic(time.time())
        first = await api.client.post(
            "/v1/exchanges",
            json={"exchanges": batches["source"]},
            headers=api.headers(Role.INGEST) | {"Prefer": "respond-async"},
        )
        assert first.status_code == 202, first.text
        queued = await queue.byte_size()
        assert queued > 1024
        resp = await api.client.post(
            "/v1/exchanges", json={"exchanges": batches["leak"]}, headers=api.headers(Role.INGEST)
        )
        assert resp.status_code == 503
        assert resp.headers["retry-after"]
        assert "BLEEDWATCH_INGEST_QUEUE_MAX_BYTES" in resp.json()["detail"]
        assert (await queue.size(), await queue.byte_size()) == (1, queued)
        assert metrics.INGEST_QUEUE_FULL._value.get() - before == 1
