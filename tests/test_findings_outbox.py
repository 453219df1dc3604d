"""Findings are never lost between the index and the database, and never doubled.

- The outbox contract, on every index backend.
- PostgreSQL unreachable (a loopback proxy we cut, never the shared server): ingest and matching
  go on, findings wait in the outbox and are written once it is back.
- A crash between indexing and writing a finding (the write fails once): the retried batch is
  processed again, because its idempotency marks are written last, and the finding is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
import pytest
from sqlalchemy import select

from bleedwatch.client import BleedwatchClient
from service import metrics
from service.auth.keys import Role
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.findings import store as findings_store
from service.findings.draft import FindingDraft
from service.findings.models import Finding
from service.findings.severity import Severity
from service.findings.writer import FindingsWriter, decode_draft, encode_draft
from service.index.base import Index
from service.migrate import upgrade
from tests.conftest import ALL_BACKENDS, BACKENDS, Api, running_api
from tests.conftest import _truncate as truncate
from tests.tcp_proxy import tcp_proxy
from tests.traffic import exchange, totals, words

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_the_outbox_hands_each_item_to_one_writer_until_it_is_released(index: Index) -> None:
    box = index.outbox()
    await box.hold([b"one", b"two", b"three"])
    assert await box.size() == 3
    first = await box.claim("replica-1", 2, min_idle_seconds=60)
    assert [item for _, item in first] == [b"one", b"two"]
    again = await box.claim("replica-1", 10, min_idle_seconds=60)  # unreleased: its own come back first
    assert [item for _, item in again] == [b"one", b"two"]
    assert [item for _, item in await box.claim("replica-2", 10, min_idle_seconds=60)] == [b"three"]
    await box.release([item_id for item_id, _ in first])
    assert await box.size() == 1
    # replica-2 died holding "three": after the idle time anyone may take it over.
    taken = await box.claim("replica-3", 10, min_idle_seconds=0)
    assert [item for _, item in taken] == [b"three"]
    await box.release([item_id for item_id, _ in taken])
    assert await box.size() == 0
    assert await box.claim("replica-3", 10, min_idle_seconds=0) == []


def test_drafts_round_trip_through_the_outbox_encoding() -> None:
    draft = FindingDraft(
        key_id="00112233445566aa",
        recipient_tenant="b",
        recipient_request_id="r-b",
        source_tenant="a",
        source_request_ids=["r-a"],
        response_at=datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
        model="m",
        deployment="d",
        node=None,
        prompt_tokens=700_001,
        response_tokens=120,
        matched_fingerprints=9,
        longest_run_tokens=44,
        score=0.31,
        severity=Severity.HIGH,
        evidence={"sources": [{"tenant": "a", "ranges": [{"response": [1, 45]}]}]},
    )
    decoded = decode_draft(encode_draft(draft))
    assert decoded == draft
    assert type(decoded.severity) is Severity


def test_a_draft_held_before_longest_run_tokens_was_named_so_still_decodes() -> None:
    draft = dataclasses.replace(_draft("r-old"), evidence={"sources": [{"tenant": "a", "longest_run_tokens": 44}]})
    held = orjson.loads(encode_draft(draft))
    held["draft"]["longest_run_words"] = held["draft"].pop("longest_run_tokens")
    source = held["draft"]["evidence"]["sources"][0]
    source["longest_run_words"] = source.pop("longest_run_tokens")
    assert decode_draft(orjson.dumps(held)) == draft


def _draft(recipient_request_id: str) -> FindingDraft:
    return FindingDraft(
        key_id="00112233445566aa",
        recipient_tenant="b",
        recipient_request_id=recipient_request_id,
        source_tenant="a",
        source_request_ids=["r-a"],
        response_at=datetime.now(UTC),
        model="m",
        deployment="d",
        node=None,
        prompt_tokens=100,
        response_tokens=120,
        matched_fingerprints=9,
        longest_run_tokens=44,
        score=0.31,
        severity=Severity.HIGH,
        evidence={"sources": [{"tenant": "a", "ranges": [{"response": [1, 45]}]}]},
    )


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_the_database_keeps_the_draft_that_replaces_says(settings: Settings) -> None:
    # bench/eval/offline.py keeps findings in memory by store.replaces: it must be upsert's rule.
    if settings.database_url is None:
        upgrade(settings)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    strengths = [(9, 20, 5), (9, 20, 3), (9, 20, None), (10, 20, 9), (9, 21, 9), (8, 30, 1), (12, 10, 1)]
    for i, old in enumerate(strengths):
        for j, new in enumerate(strengths):
            drafts = [
                dataclasses.replace(
                    _draft(f"r-{i}-{j}"),
                    source_tenant=name,
                    matched_fingerprints=m,
                    longest_run_tokens=r,
                    source_ref=ref,
                )
                for name, (m, r, ref) in (("old", old), ("new", new))
            ]
            for draft in drafts:
                async with session_scope(sessions) as session:
                    await findings_store.upsert(session, draft)
            async with session_scope(sessions) as session:
                kept = await session.scalar(
                    select(Finding.source_tenant).where(Finding.recipient_request_id == f"r-{i}-{j}")
                )
            assert (kept == "new") == findings_store.replaces(drafts[1], drafts[0]), (old, new)
    await engine.dispose()


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_held_finding_that_keeps_failing_is_moved_aside_and_can_be_put_back(
    settings: Settings, index: Index
) -> None:
    """A finding the database refuses (here: no key id, NOT NULL) never holds back the others, and is
    moved to the dead letters after max_attempts failed writes instead of being retried first forever."""
    if settings.database_url is None:
        upgrade(settings)
    engine = make_engine(settings)
    box = index.outbox()
    writer = FindingsWriter(make_sessionmaker(engine), box, index.purged, max_attempts=3)
    poison = orjson.loads(encode_draft(_draft("r-poison")))
    poison["draft"]["key_id"] = None
    await box.hold([orjson.dumps(poison), encode_draft(_draft("r-good"))])
    failures = metrics.FINDINGS_OUTBOX_FAILURES._value.get()
    dead = metrics.FINDINGS_DEAD_LETTERS._value.get()
    try:
        assert await writer.drain() == 1  # the good one is written despite its neighbour
        assert await box.size() == 1
        assert await writer.drain() == 0
        assert (await box.size(), await box.dead_size()) == (1, 0)
        assert await writer.drain() == 0  # the third failure: moved aside
        assert (await box.size(), await box.dead_size()) == (0, 1)
        assert metrics.FINDINGS_OUTBOX_FAILURES._value.get() - failures == 3
        assert metrics.FINDINGS_DEAD_LETTERS._value.get() - dead == 1
        await box.hold([encode_draft(_draft("r-later"))])
        assert await writer.drain() == 1  # nothing stands in front of later findings
        assert await box.requeue_dead(10) == 1  # once the cause is fixed, `bleedwatch queue requeue-dead`
        assert (await box.size(), await box.dead_size()) == (1, 0)
        async with session_scope(make_sessionmaker(engine)) as session:
            rows, _ = await findings_store.page(session, findings_store.FindingFilter(), None, 10)
        assert {r.finding.recipient_request_id for r in rows} == {"r-good", "r-later"}
    finally:
        await engine.dispose()


async def post(api: Api, *exchanges: dict[str, Any]) -> httpx.Response:
    return await api.client.post("/v1/exchanges", json={"exchanges": list(exchanges)}, headers=api.headers(Role.INGEST))


async def findings(api: Api) -> list[dict[str, Any]]:
    resp = await api.client.get("/v1/findings", headers=api.headers(Role.READ))
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


async def eventually(check: Callable[[], Awaitable[Any]], seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            result = await check()
            if result:
                return result
        except (httpx.HTTPError, AssertionError):
            pass
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.2)


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)
    netloc = (host[0] + "@" if len(host) == 2 else "") + f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_findings_made_while_postgres_is_down_are_written_when_it_is_back(settings: Settings) -> None:
    assert settings.database_url is not None
    target = urlsplit(settings.database_url)
    with tcp_proxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy:
        via_proxy = settings.model_copy(update={"database_url": through(settings.database_url, proxy.port)})
        now = time.time()
        source = exchange("tenant-a", "r-a", words("argparse"), words("json", 0, 30), now)
        leak = exchange("tenant-b", "r-b", words("csv"), words("heapq", 0, 30) + " " + words("argparse", 60, 110), now)
        more = exchange("tenant-a", "r-a2", words("argparse", 50, 130), words("json", 30, 60), now)
        async with running_api(via_proxy) as api:
            assert (await post(api, source)).status_code == 202
            assert (await api.client.get("/v1/queue", headers=api.headers(Role.READ))).status_code == 200

            proxy.cut()  # PostgreSQL goes away; Redis stays
            answer = await post(api, leak)
            assert answer.status_code == 202, answer.text
            assert totals(answer.json()) == {"accepted": 1, "duplicates": 0, "findings": 1, "processed": True}
            # More of the source arrives: the same response is evaluated again, held again.
            assert (await post(api, more)).status_code == 202
            assert (await post(api, leak)).json()["duplicates"] == 1
            outbox = api.client._transport.app.state.deps.index.outbox()  # type: ignore[attr-defined]
            assert await outbox.size() >= 1
            state = (await api.client.get("/v1/queue", headers=api.headers(Role.READ))).json()  # a known key
            assert (state["queued"], state["findings_held"] >= 1, state["findings_dead_letters"]) == (0, True, 0)
            ready = await api.client.get("/readyz")
            assert (ready.status_code, ready.json()["checks"]["database"]) == (503, "unreachable")
            assert (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).status_code == 503

            proxy.restore()
            found = await eventually(lambda: findings(api))
            assert [(f["source_tenant"], f["recipient_request_id"]) for f in found] == [("tenant-a", "r-b")]
            await eventually(lambda: _empty(outbox))
            assert len(await findings(api)) == 1  # written twice (two held evaluations), one row


async def _empty(box: Any) -> bool:
    return bool(await box.size() == 0)


@pytest.mark.parametrize("settings", ["embedded", "redis+postgres"], indirect=True)
async def test_a_crash_before_the_finding_is_written_is_made_good_by_processing_the_batch_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_upsert = findings_store.upsert  # what the outbox writes findings with
    failures: list[int] = []

    async def crash_once(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            raise RuntimeError("the replica dies between indexing and writing the finding")
        return await real_upsert(*args, **kwargs)

    monkeypatch.setattr(findings_store, "upsert", crash_once)
    if settings.database_url is not None:
        truncate(settings.database_url)
    now = time.time()
    source = exchange("tenant-a", "r-a", words("argparse"), words("json", 0, 30), now)
    leak = exchange("tenant-b", "r-b", words("csv"), words("argparse", 60, 110), now)
    # The batch stays in the queue, held by its worker, and is taken over once idle this long.
    settings = settings.model_copy(update={"ingest_reclaim_seconds": 0.2})
    async with running_api(settings) as api:
        app = api.client._transport.app  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)
        async with BleedwatchClient(
            "http://bleedwatch.test", api.tokens[Role.INGEST], transport=transport, wait_for_processing=True
        ) as client:
            result = await client.send([source, leak])
        assert failures == [1]
        # The first delivery indexed everything but wrote no finding and no idempotency mark; the
        # batch was then split, each exchange queued alone (the worker's isolation of a failure),
        # and the caller told it was accepted, not yet processed.
        assert totals(result) == {"accepted": 2, "duplicates": 0, "findings": None, "processed": False}
        deadline = time.monotonic() + 20
        while not (found := await findings(api)):
            assert time.monotonic() < deadline, "the finding was not made good"
            await asyncio.sleep(0.05)
        assert [(f["source_tenant"], f["recipient_request_id"]) for f in found] == [("tenant-a", "r-b")]
        await api.processed()
        assert totals((await post(api, source, leak)).json()) == {
            "accepted": 0,
            "duplicates": 2,
            "findings": 0,
            "processed": True,
        }
