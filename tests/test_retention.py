"""Retention (the prune job, one replica at a time) and purging one tenant, on every backend."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest
from sqlalchemy import func, select, update

from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS
from service.audit import tenant_hash
from service.audit.models import AuditEntry
from service.auth.keys import Role
from service.cli import main
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope, utcnow
from service.findings.draft import FindingDraft
from service.findings.models import Finding
from service.findings.severity import Severity
from service.findings.writer import encode_draft
from service.incidents.models import Incident
from service.index.base import DocMeta, Index, Kind
from service.migrate import upgrade
from service.retention.jobs import IndexPurged, Retention, prune, purge_tenant_index
from tests.conftest import ALL_BACKENDS, DATABASE_URL, Api, _with_schema, running_api
from tests.incident_traffic import get, leak, patch, post
from tests.traffic import exchange, words

pytestmark = pytest.mark.anyio
RETENTION = Retention(findings_days=90, incidents_days=365, audit_days=365)
NS = "0123456789abcdef"


async def counts(settings: Settings) -> dict[str, int]:
    engine = make_engine(settings)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            return {
                name: int(await session.scalar(select(func.count()).select_from(model)) or 0)
                for name, model in (("findings", Finding), ("incidents", Incident), ("audit", AuditEntry))
            }
    finally:
        await engine.dispose()


async def test_prune_by_age_keeps_open_incidents_and_runs_on_one_replica(api: Api, settings: Settings) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    await leak(api, "csv", "acme", "globex", now, deployment="pd-us-2")
    resolved, still_open = (await get(api, "/v1/incidents", sort="opened_at", order="asc"))["items"]
    await patch(api, f"/v1/incidents/{resolved['id']}", {"status": "resolved"})
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    try:
        async with session_scope(sessions) as session:
            nothing = await prune(session, RETENTION)
        assert nothing is not None
        assert (nothing.findings, nothing.incidents, nothing.audit_entries) == (0, 0, 0)

        async with session_scope(sessions) as session:
            later = await prune(session, RETENTION, utcnow() + timedelta(days=91))
        assert later is not None
        assert (later.findings, later.incidents) == (2, 0)

        if settings.database_url is not None:  # one replica at a time: the second one skips
            async with session_scope(sessions) as first, session_scope(sessions) as second:
                assert await prune(first, RETENTION, utcnow() + timedelta(days=400)) is not None
                assert await prune(second, RETENTION) is None
        else:
            async with session_scope(sessions) as session:
                await prune(session, RETENTION, utcnow() + timedelta(days=400))
    finally:
        await engine.dispose()
    left = await counts(settings)
    assert (left["findings"], left["incidents"]) == (0, 1)  # the open incident stays until someone closes it
    assert left["audit"] == 1  # everything older went; the last prune's own entry stays
    remaining = await get(api, f"/v1/incidents/{still_open['id']}")
    assert remaining["status"] == "open"


async def test_the_background_job_prunes(settings: Settings) -> None:
    async with running_api(settings.model_copy(update={"prune_interval_seconds": 0.05})) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        engine = make_engine(settings)
        async with session_scope(make_sessionmaker(engine)) as session:
            await session.execute(update(Finding).values(detected_at=utcnow() - timedelta(days=100)))
        await engine.dispose()
        for _ in range(100):
            if (await counts(settings))["findings"] == 0:
                break
            await asyncio.sleep(0.05)
        assert (await counts(settings))["findings"] == 0
        entries = (await get(api, "/v1/audit", role=Role.ADMIN, action="retention.prune"))["items"]
        assert entries[0]["key_id"] == "bleedwatch"
        assert any(e["detail"]["findings"] == 1 for e in entries)


async def test_purge_a_tenant_through_the_api(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)  # acme's content, alone in its incident ...
    await leak(api, "json", "hooli", "acme", now, deployment="pd-us-2")  # ... acme as recipient
    # umbrella's answer carries initech's text (top source) and, less of it, acme's
    src_a = exchange("acme", "s-a2", words("socket"), "ok", now - 2)
    src_i = exchange("initech", "s-i", words("csv"), "ok", now - 2)
    answer = words("csv", 60, 140) + " and also " + words("socket", 60, 100)
    dst = exchange("umbrella", "r-u", words("unittest", 100, 140), answer, now, deployment="pd-eu-9")
    assert (await post(api, [src_a, src_i, dst]))["findings"] == 1
    mixed = (await get(api, "/v1/findings", recipient_tenant="umbrella"))["items"][0]
    assert [s["tenant"] for s in mixed["evidence"]["sources"]] == ["initech", "acme"]

    resp = await api.client.post("/v1/tenants/purge", json={"tenant": "acme"}, headers=api.headers(Role.ADMIN))
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    assert (result["findings_deleted"], result["findings_scrubbed"]) == (2, 1)
    assert (result["incidents_deleted"], result["incidents_updated"]) == (2, 1)
    assert "expire" in result["index"]
    assert "audit entries" in result["not_purged"]

    assert (await get(api, "/v1/incidents", tenant="acme"))["items"] == []
    (left,) = (await get(api, "/v1/incidents"))["items"]
    assert (left["source_tenants"], left["recipient_tenants"]) == (["initech"], ["umbrella"])
    (finding,) = (await get(api, "/v1/findings"))["items"]
    assert "acme" not in str(finding)
    timeline = (await get(api, f"/v1/incidents/{left['id']}"))["timeline"]
    assert timeline[-1]["action"] == "tenant_purged"
    (entry,) = (await get(api, "/v1/audit", role=Role.ADMIN, action="tenants.purge"))["items"]
    assert entry["target"] == f"tenant:{tenant_hash('acme')}"
    assert entry["key_id"] == api.tokens[Role.ADMIN].split("_")[1]
    assert "acme" not in str((await get(api, "/v1/audit", role=Role.ADMIN))["items"])


async def test_purge_and_prune_from_the_cli(
    api: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await leak(api, "argparse", "acme", "globex", time.time())
    if settings.database_url is None:
        monkeypatch.delenv("BLEEDWATCH_DATABASE_URL", raising=False)
        monkeypatch.setenv("BLEEDWATCH_DATA_DIR", str(settings.data_dir))
    else:
        monkeypatch.setenv("BLEEDWATCH_DATABASE_URL", settings.database_url)
        monkeypatch.setenv("BLEEDWATCH_REDIS_URL", str(settings.redis_url))
        monkeypatch.setenv("BLEEDWATCH_KEY_PREFIX", settings.key_prefix)
    purge = await asyncio.to_thread(main, ["tenants", "purge", "globex", "--yes"])
    out = capsys.readouterr()
    if settings.redis_url is None:
        # The index is in the server's process: a database-only purge would leave it naming globex.
        assert purge == 2
        assert "nothing purged" in out.err
        assert "POST /v1/tenants/purge" in out.err
        assert len((await get(api, "/v1/findings", role=Role.READ))["items"]) == 1
        # Told the server is stopped (its index gone with it), the database is all there is to purge.
        assert await asyncio.to_thread(main, ["tenants", "purge", "globex", "--yes", "--database-only"]) == 0
        assert "purged: 1 finding deleted, 0 scrubbed, 1 incident deleted" in capsys.readouterr().out
    else:  # the recipient's prompt and response
        assert purge == 0
        assert "purged: 1 finding deleted, 0 scrubbed, 1 incident deleted, 0 updated" in out.out
        assert "index: 2 documents deleted, 0 queued batches rewritten, 0 held findings removed" in out.out
        deps = api.client._transport.app.state.deps  # type: ignore[attr-defined]
        assert list(await deps.index.purged(["globex", "acme"])) == ["globex"]
    assert await asyncio.to_thread(main, ["prune"]) == 0
    assert "pruned 0 findings (older than 90 days)" in capsys.readouterr().out
    monkeypatch.setenv("BLEEDWATCH_FINDINGS_RETENTION_DAYS", "1")
    assert await asyncio.to_thread(main, ["prune"]) == 0
    assert "pruned 0 findings (older than 1 day), 0 closed incidents (365 days)" in capsys.readouterr().out
    entries = (await get(api, "/v1/audit", role=Role.ADMIN))["items"]
    assert [(e["key_id"], e["action"]) for e in entries][:3] == [
        ("cli", "retention.prune"),
        ("cli", "retention.prune"),
        ("cli", "tenants.purge"),
    ]


def held_draft(recipient: str, source: str, minor: str | None, response_at: float) -> bytes:
    """A finding as the outbox holds it while the database is down (service/findings/writer.py)."""
    sources = [{"tenant": source, "request_id": "s-1"}] + ([{"tenant": minor, "request_id": "s-2"}] if minor else [])
    return encode_draft(
        FindingDraft(
            key_id="0123456789abcdef",
            recipient_tenant=recipient,
            recipient_request_id=f"held-{recipient}",
            source_tenant=source,
            source_request_ids=["s-1"],
            response_at=datetime.fromtimestamp(response_at, UTC),
            model="m-1m",
            deployment="pd-eu-1",
            node="decode-3",
            prompt_tokens=None,
            response_tokens=80,
            matched_fingerprints=40,
            longest_run_tokens=40,
            score=0.5,
            severity=Severity.HIGH,
            evidence={"sources": sources},
        )
    )


def batch_item(*exchanges: dict[str, Any]) -> bytes:
    return b"req-1\n" + orjson.dumps({"exchanges": list(exchanges)})


def tenants_of(item: bytes) -> list[str]:
    return [ex["tenant"] for ex in orjson.loads(item.partition(b"\n")[2])["exchanges"]]


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_purge_reaches_documents_queued_and_dead_batches_and_held_findings(index: Index) -> None:
    """Issue 19: the purge left Redis untouched, and draining the outbox re-created the findings."""
    now = time.time()
    acme = exchange("acme", "a-1", words("argparse"), words("json", 0, 30), now - 5)
    hooli = exchange("hooli", "h-1", words("csv"), words("heapq", 0, 30), now - 5)
    old_ref = (await index.tenant_refs(["acme", "hooli"]))["acme"]
    first = await index.new_doc_refs(4)
    owners = ["acme", "acme", "hooli", "hooli"]
    metas = {
        first + i: DocMeta(t, f"r-{i}", Kind(1 + i % 2), "m", now - 5, 10, {}, DEFAULT_PARAMS)
        for i, t in enumerate(owners)
    }
    await index.put_docs(NS, metas, now)
    queue = index.queue()
    assert await queue.put(batch_item(acme, hooli), 100) is not None
    taken = await queue.take("crashed", 1.0)
    assert taken is not None
    await queue.bury(taken[0], taken[1], "RuntimeError: a bug")  # a dead letter, both tenants
    for item in (batch_item(acme, hooli), batch_item(acme), batch_item(hooli)):
        assert await queue.put(item, 100) is not None
    outbox = index.outbox()
    await outbox.hold([held_draft("acme", "globex", None, now), held_draft("hooli", "globex", "acme", now)])
    await outbox.hold([held_draft("initech", "globex", None, now)])

    done = await purge_tenant_index(index, "acme", now)

    assert done == IndexPurged(documents=2, batches=3, held_findings=2)
    assert sorted(await index.get_docs(NS, list(metas), now)) == [first + 2, first + 3]
    assert await index.purged(["acme", "hooli"]) == {"acme": now}
    assert (await index.tenant_refs(["acme"]))["acme"] != old_ref  # its name is forgotten
    waiting = []
    while (next_item := await queue.take("worker", 0.05)) is not None:
        waiting.append(tenants_of(next_item[1]))
    assert waiting == [["hooli"], ["hooli"]]  # acme's alone is gone, the mixed one rewritten
    assert await queue.requeue_dead(10) == 1
    revived = await queue.take("worker", 1.0)
    assert revived is not None
    assert tenants_of(revived[1]) == ["hooli"]
    drafts = [orjson.loads(raw)["draft"] for _, raw in await outbox.claim("writer", 10, 0)]
    assert sorted((d["recipient_tenant"], [s["tenant"] for s in d["evidence"]["sources"]]) for d in drafts) == [
        ("hooli", ["globex"]),
        ("initech", ["globex"]),
    ]


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_after_a_purge_work_from_before_it_is_refused(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now - 10)
    deps = api.client._transport.app.state.deps  # type: ignore[attr-defined]
    resp = await api.client.post("/v1/tenants/purge", json={"tenant": "acme"}, headers=api.headers(Role.ADMIN))
    assert resp.status_code == 200, resp.text
    assert resp.json()["documents_deleted"] == 2

    # A gateway's retry or spool replay of the tenant's earlier exchange: rejected alone.
    late = exchange("acme", "late", words("socket"), words("csv", 0, 50), now - 5)
    other = exchange("hooli", "h-1", words("heapq"), "fine", now - 5)
    answer = await post(api, [late, other])
    assert [(r["status"], r["error"]) for r in answer["results"]] == [("rejected", "purged"), ("accepted", None)]
    # A batch accepted before the purge and processed after it: the tenant's exchange is not indexed.
    queued = exchange("acme", "queued", words("socket"), words("argparse", 60, 110), now - 4)
    result = await deps.ingestor.process(batch_item(queued, exchange("initech", "i-1", words("json"), "ok", now - 4)))
    assert (result.accepted, result.findings) == (1, 0)
    docs = await deps.index.get_docs(queued["key_id"], list(range(1, 100)), time.time())
    assert sorted({m.tenant for m in docs.values()}) == ["globex", "hooli", "initech"]
    # A finding held for the database before the purge, drained after it: not written back.
    held = [held_draft("acme", "globex", None, now - 5), held_draft("globex", "acme", None, now - 5)]
    await deps.index.outbox().hold(held)
    deadline = time.monotonic() + 30
    while await deps.index.outbox().size():
        assert time.monotonic() < deadline, "the outbox was not drained"
        await asyncio.sleep(0.05)
    assert (await get(api, "/v1/findings"))["items"] == []
    # The tenant may be served again: what happens after the purge is taken.
    fresh = exchange("acme", "after", words("difflib"), "ok", time.time() + 1)
    assert (await post(api, [fresh]))["accepted"] == 1


@pytest.mark.postgres
async def test_the_prune_lock_is_per_schema(pg_url: str) -> None:
    """Another installation in another schema of the same database (a second deployment, a test worker
    beside this one) prunes its own while a replica here holds this schema's lock."""
    schema = f"bw_other_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(DATABASE_URL, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            upgrade(Settings(database_url=_with_schema(DATABASE_URL, schema)))
            engines = [make_engine(Settings(database_url=url)) for url in (pg_url, _with_schema(DATABASE_URL, schema))]
            try:
                here, there = (make_sessionmaker(e) for e in engines)
                async with session_scope(here) as first, session_scope(here) as second, session_scope(there) as other:
                    assert await prune(first, RETENTION) is not None
                    assert await prune(second, RETENTION) is None  # this schema's lock is held
                    assert await prune(other, RETENTION) is not None
            finally:
                for engine in engines:
                    await engine.dispose()
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
