"""Engine integrity signals: accepted per deployment and node, counted, stored and listed."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.auth.keys import Role, create_key
from service.db import make_engine, make_sessionmaker, session_scope
from service.signals.schemas import SignalKind
from tests.conftest import Api

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 8, 27, 12, 0, tzinfo=UTC)


def event(kind: str = "kv_transfer_short", node: str = "decode-7", minutes: int = 0, **extra: Any) -> dict[str, Any]:
    ts = (T0 + timedelta(minutes=minutes)).isoformat()
    return {"kind": kind, "deployment": "pd-eu-1", "node": node, "ts": ts} | extra


async def post(api: Api, events: list[dict[str, Any]], role: Role | None = Role.INGEST) -> Any:
    return await api.client.post("/v1/signals", json={"events": events}, headers=api.headers(role))


async def listing(api: Api, **params: str) -> dict[str, Any]:
    resp = await api.client.get("/v1/signals", params=params, headers=api.headers(Role.READ))
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def counter(text: str, kind: str) -> float:
    match = re.search(rf'^bleedwatch_engine_signals_total\{{kind="{kind}"\}} (\S+)$', text, re.M)
    assert match, kind
    return float(match.group(1))


async def test_signals_are_stored_counted_and_listed(api: Api) -> None:
    before = (await api.client.get("/metrics")).text
    resp = await post(
        api,
        [
            event(request_id="req-1", event_id="e-1"),
            event("kv_transfer_checksum_mismatch", "decode-8", 1, count=3),
            event("foreign_request_metadata", "decode-7", 2, request_id="req-2"),
        ],
    )
    assert resp.status_code == 202, resp.text
    assert resp.json() == {"accepted": 3, "duplicates": 0}
    after = (await api.client.get("/metrics")).text
    assert counter(after, "kv_transfer_checksum_mismatch") - counter(before, "kv_transfer_checksum_mismatch") == 3
    assert counter(after, "kv_transfer_short") - counter(before, "kv_transfer_short") == 1
    for kind in SignalKind:
        counter(after, kind.value)  # every kind exists, at 0 until its first event
    ours = [line for line in after.splitlines() if line.startswith("bleedwatch_engine_signals_total{")]
    assert all(re.fullmatch(r'bleedwatch_engine_signals_total\{kind="\w+"\} \S+', line) for line in ours), ours

    items = (await listing(api))["items"]
    assert [(s["kind"], s["node"], s["count"]) for s in items] == [
        ("foreign_request_metadata", "decode-7", 1),
        ("kv_transfer_checksum_mismatch", "decode-8", 3),
        ("kv_transfer_short", "decode-7", 1),
    ]
    assert items[2]["request_id"] == "req-1"
    assert items[2]["event_id"] == "e-1"
    assert datetime.fromisoformat(items[2]["ts"]) == T0
    assert [s["kind"] for s in (await listing(api, node="decode-8"))["items"]] == ["kv_transfer_checksum_mismatch"]
    assert (await listing(api, deployment="pd-us-1"))["items"] == []
    assert len((await listing(api, kind="kv_transfer_short"))["items"]) == 1
    since, until = (T0 + timedelta(minutes=1)).isoformat(), (T0 + timedelta(minutes=2)).isoformat()
    window = await listing(api, since=since, until=until)
    assert [s["kind"] for s in window["items"]] == ["kv_transfer_checksum_mismatch"]


async def test_a_retried_event_is_kept_once(api: Api) -> None:
    batch = [event(event_id="e-1"), event(event_id="e-2"), event()]
    assert (await post(api, batch)).json() == {"accepted": 3, "duplicates": 0}
    assert (await post(api, batch)).json() == {"accepted": 1, "duplicates": 2}  # no event_id: no dedupe
    assert (await post(api, [event(node="decode-8", event_id="e-1")])).json()["accepted"] == 1  # per node
    assert (await post(api, [event(event_id="e-9"), event(event_id="e-9")])).json() == {"accepted": 1, "duplicates": 1}
    assert len((await listing(api))["items"]) == 6


async def test_pages_follow_the_engines_clock(api: Api) -> None:
    # Stored out of order: the listing is by the engine's timestamp, ties by arrival.
    await post(api, [event(minutes=m, request_id=f"r{m}") for m in (3, 1, 4, 1, 5)])
    pages, cursor = [], None
    while True:
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = await listing(api, **params)
        pages.append([s["request_id"] for s in page["items"]])
        if (cursor := page["next_cursor"]) is None:
            break
    assert pages == [["r5", "r4"], ["r3", "r1"], ["r1"]]
    # The earliest time taken still makes a cursor the listing takes back.
    await post(api, [event(request_id=f"old{i}") | {"ts": -(10**10) + 1} for i in range(2)])
    seen, cursor = [], None
    while True:
        page = await listing(api, limit="1", until="1700-01-01T00:00:00Z", **({"cursor": cursor} if cursor else {}))
        seen += [s["request_id"] for s in page["items"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert sorted(seen) == ["old0", "old1"]
    bad = await api.client.get("/v1/signals", params={"cursor": "bm9wZQ"}, headers=api.headers(Role.READ))
    assert (bad.status_code, bad.json()["error"]) == (422, "invalid")


async def test_bad_events_are_refused_with_the_field(api: Api) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    cases = [
        ([event("kv_cache_on_fire")], "events[0].kind"),
        ([event(count=0)], "events[0].count"),
        ([{k: v for k, v in event().items() if k != "node"}], "events[0].node"),
        ([event(extra="x")], "events[0].extra"),
        ([event(), event() | {"ts": "2026-08-27T12:00:00"}], "events[1].ts: give a timezone"),
        ([event() | {"ts": future.isoformat()}], "events[0].ts: more than"),
        ([event() | {"ts": "0001-01-01T00:00:00+05:00"}], "events[0].ts: give a time between the years"),
        ([event() | {"ts": "1000-01-01T00:00:00Z"}], "events[0].ts: give a time between the years"),
        # Engines send numbers: a numeric string or an integral float is a client's bug, not coerced.
        ([event() | {"ts": str(int(T0.timestamp()))}], "events[0].ts: give epoch seconds as a JSON number"),
        ([event(count=2.0)], "events[0].count: give a JSON integer"),
        ([event(count="2")], "events[0].count: give a JSON integer"),
        ([], "events"),
    ]
    for events, message in cases:
        resp = await post(api, events)
        assert resp.status_code == 422, events
        assert message in resp.json()["detail"], resp.json()
    too_many = await post(api, [event()] * 1001)
    assert too_many.status_code == 413
    naive = await api.client.get("/v1/signals", params={"since": "2026-08-27T12:00:00"}, headers=api.headers(Role.READ))
    assert naive.status_code == 422
    assert (await listing(api))["items"] == []


async def test_roles(api: Api, settings: Any) -> None:
    for role, status in ((None, 401), (Role.READ, 403), (Role.TRIAGE, 403), (Role.ADMIN, 403), (Role.INGEST, 202)):
        assert (await post(api, [event()], role)).status_code == status, role
    for role, status in ((None, 401), (Role.INGEST, 403), (Role.READ, 200), (Role.TRIAGE, 200), (Role.ADMIN, 200)):
        assert (await api.client.get("/v1/signals", headers=api.headers(role))).status_code == status, role
    # A gateway key limited to some tenants reports for them, not for the shared engines.
    engine = make_engine(settings)
    async with session_scope(make_sessionmaker(engine)) as session:
        _, limited = await create_key(session, "tenant gateway", Role.INGEST, ["acme"])
    await engine.dispose()
    resp = await api.client.post(
        "/v1/signals", json={"events": [event()]}, headers={"Authorization": f"Bearer {limited}"}
    )
    assert (resp.status_code, resp.json()["error"]) == (403, "forbidden")
