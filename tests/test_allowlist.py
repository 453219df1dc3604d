"""The allowlist at scale: entries built from several requests, stored packed, reloaded only on change."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bleedwatch.fingerprint.encoding import U64_LE, encode
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params, key_id
from service.allowlist import routes, store
from service.allowlist.models import AllowlistChunk
from service.allowlist.packed import unpack
from service.auth.keys import Role
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.matching.known import KnownFingerprints
from service.migrate import upgrade
from tests.conftest import Api
from tests.traffic import KEY, fp, words
from tests.traffic import exchange as ex

pytestmark = pytest.mark.anyio

NS = key_id(KEY, DEFAULT_PARAMS)
EVERY = Params(w=1, sample_mod=1)


def values(text: str) -> npt.NDArray[np.uint64]:
    return fp(text, EVERY).values


async def call(api: Api, method: str, path: str, status: int, **kwargs: Any) -> dict[str, Any]:
    resp = await api.client.request(method, path, headers=api.headers(Role.ADMIN), **kwargs)
    assert resp.status_code == status, resp.text
    data: dict[str, Any] = resp.json()
    return data


async def findings(api: Api) -> list[str]:
    resp = await api.client.get("/v1/findings", headers=api.headers(Role.READ))
    return [f["recipient_request_id"] for f in resp.json()["items"]]


async def post(api: Api, *exchanges: dict[str, Any]) -> None:
    resp = await api.client.post("/v1/exchanges", json={"exchanges": list(exchanges)}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202, resp.text


async def test_an_entry_built_from_several_requests_holds_each_value_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = values(words("argparse")), values(words("subprocess"))
    union = len(np.union1d(first, second))
    entry = await call(
        api, "POST", "/v1/allowlist", 201, json={"key_id": NS, "label": "docs", "fingerprints": encode(first, U64_LE)}
    )
    assert entry["fingerprint_count"] == len(np.unique(first))
    more = encode(np.concatenate([second, first[:50]]), U64_LE)  # overlaps what the entry holds
    grown = await call(api, "POST", f"/v1/allowlist/{entry['id']}/fingerprints", 200, json={"fingerprints": more})
    assert (grown["id"], grown["fingerprint_count"]) == (entry["id"], union)
    again = await call(api, "POST", f"/v1/allowlist/{entry['id']}/fingerprints", 200, json={"fingerprints": more})
    assert again["fingerprint_count"] == union  # a retried request adds nothing

    now = time.time()  # both halves of the entry suppress, whichever request brought them
    await post(api, ex("a", "a1", words("argparse") + " " + words("subprocess"), words("json", 0, 30), now))
    await post(api, ex("b", "b1", words("heapq"), words("argparse", 20, 80), now))
    await post(api, ex("b", "b2", words("heapq"), words("subprocess", 20, 80), now))
    assert await findings(api) == []
    audit = await call(api, "GET", "/v1/audit", 200, params={"action": "allowlist.append"})
    assert [e["detail"] for e in audit["items"]] == [
        {"fingerprints": 0},
        {"fingerprints": union - entry["fingerprint_count"]},
    ]

    monkeypatch.setattr(routes, "MAX_FINGERPRINTS", 10)
    too_many = await call(
        api, "POST", f"/v1/allowlist/{entry['id']}/fingerprints", 413, json={"fingerprints": encode(first, U64_LE)}
    )
    assert too_many["error"] == "payload_too_large"
    assert "POST /v1/allowlist/{id}/fingerprints" in too_many["detail"]
    missing = await call(api, "POST", "/v1/allowlist/999/fingerprints", 404, json={"fingerprints": []})
    assert missing == {"error": "not_found", "detail": "no allowlist entry 999"}
    await call(api, "DELETE", f"/v1/allowlist/{entry['id']}", 200)
    revoked = await call(api, "POST", f"/v1/allowlist/{entry['id']}/fingerprints", 409, json={"fingerprints": []})
    assert revoked["error"] == "conflict"
    assert "revoked" in revoked["detail"]


@pytest.fixture
async def sessions(settings: Settings) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    if settings.database_url is None:
        upgrade(settings)
    engine = make_engine(settings)
    yield make_sessionmaker(engine)
    await engine.dispose()


def random_values(count: int, seed: int) -> npt.NDArray[np.uint64]:
    return np.random.default_rng(seed).integers(0, 2**64, size=count, dtype=np.uint64)


async def test_a_fingerprint_written_as_a_float_is_refused(api: Api) -> None:
    """2**63 + 1 as a float is 2**63: a JSON float has lost a u64's low bits before it arrives, so an
    entry would silently allowlist another value. Only JSON integers (and base64) are fingerprints."""
    for bad in ([1.0], [9.223372036854775808e18], ["12"], [True]):
        body = {"key_id": NS, "label": "docs", "fingerprints": bad}
        detail = (await call(api, "POST", "/v1/allowlist", 422, json=body))["detail"]
        assert "give a JSON integer" in str(detail)
    entry = await call(api, "POST", "/v1/allowlist", 201, json={"key_id": NS, "label": "docs", "fingerprints": [12]})
    await call(api, "POST", f"/v1/allowlist/{entry['id']}/fingerprints", 422, json={"fingerprints": [12.0]})


async def test_fingerprints_are_stored_packed_in_sorted_chunks(
    sessions: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "CHUNK_FINGERPRINTS", 1000)
    a, b = random_values(2500, 1), random_values(1500, 2)
    b[:500] = a[:500]
    async with session_scope(sessions) as session:
        entry = await store.add(session, NS, "corpus", "import", np.concatenate([a, a[:10]]), "test")
        before = await store.version(session, NS)
        assert await store.append(session, entry, b) == 1000
        assert await store.version(session, NS) != before
    async with session_scope(sessions) as session:
        chunks = (await session.scalars(select(AllowlistChunk).order_by(AllowlistChunk.seq))).all()
        assert [(c.seq, c.fingerprint_count, len(c.fingerprints)) for c in chunks] == [
            (0, 1000, 8000),
            (1, 1000, 8000),
            (2, 500, 4000),
            (3, 1000, 8000),
        ]
        for c in chunks:
            stored = unpack(c.fingerprints)
            assert bool(np.all(stored[1:] > stored[:-1]))
        loaded = await store.active_values(session, NS)
        assert np.array_equal(loaded, np.union1d(a, b))
        assert len(await store.active_values(session, "0011223344556677")) == 0


async def test_a_revoke_on_one_replica_is_seen_by_another_after_the_refresh(
    sessions: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    real = store.active_values

    async def counted(session: AsyncSession, key_id: str) -> npt.NDArray[np.uint64]:
        nonlocal reads
        reads += 1
        return await real(session, key_id)

    monkeypatch.setattr(store, "active_values", counted)
    text = values(words("argparse"))
    async with session_scope(sessions) as session:
        entry = await store.add(session, NS, "docs", "import", text, "test")
    one, two = KnownFingerprints(sessions, ttl_seconds=0.3), KnownFingerprints(sessions, ttl_seconds=0.3)
    seen = await two.get(NS)
    assert bool(seen.allowed(text).all())
    assert (await one.get(NS)).allowed(text).all()
    assert reads == 2
    await asyncio.sleep(0.35)
    assert await two.get(NS) is seen  # checked, unchanged: nothing re-read
    assert reads == 2

    async with session_scope(sessions) as session:  # replica one revokes
        await store.revoke(session, entry.id, "test")
    one.invalidate(NS)
    assert not (await one.get(NS)).allowed(text).any()  # at once on the replica that changed it
    assert await two.get(NS) is seen  # the other one within its refresh
    await asyncio.sleep(0.35)
    assert not (await two.get(NS)).allowed(text).any()
    assert reads == 4

    more = values(words("subprocess"))
    async with session_scope(sessions) as session:
        grown = await store.add(session, NS, "more docs", "import", text[:10], "test")
    await asyncio.sleep(0.35)
    assert not (await two.get(NS)).allowed(more).any()
    async with session_scope(sessions) as session:  # appending changes neither the count nor the max id
        locked = await store.get_for_update(session, grown.id)
        assert locked is not None
        assert await store.append(session, locked, more) == len(np.unique(more))
    await asyncio.sleep(0.35)
    assert (await two.get(NS)).allowed(more).all()
    assert reads == 6

    async with session_scope(sessions) as session:
        await store.revoke(session, grown.id, "test")
    await asyncio.sleep(0.35)
    # Four batches at once: one reloads, the others match with the lists it replaces meanwhile.
    results = await asyncio.gather(*(two.get(NS) for _ in range(4)))
    assert [bool(r.allowed(more).any()) for r in results] == [False, True, True, True]
    assert not (await two.get(NS)).allowed(more).any()
    assert reads == 7
