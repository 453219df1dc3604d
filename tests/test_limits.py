"""Hostile and broken input: rate limits, timestamps, unknown key ids, content types, lengths."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
import pytest

from service import metrics
from service.auth.keys import Role
from service.config import Settings
from tests.conftest import Api, _create_keys, running_api
from tests.incident_traffic import leak_pair
from tests.traffic import KEY, exchange, words

pytestmark = pytest.mark.anyio


# A token a minute: the bucket stays empty however slowly a loaded machine runs the test (at 0.5 a
# second, a second replica that took 2 s to start found a token again).
RATE = 1 / 60


@pytest.fixture
async def strict_api(settings: Settings) -> AsyncIterator[Api]:
    limited = settings.model_copy(
        update={"rate_limit_per_second": RATE, "rate_limit_burst": 3, "accepted_key_ids": frozenset({"0" * 16})}
    )
    async with running_api(limited) as api:
        yield api


async def test_rate_limit_is_per_key_with_retry_after_and_shared_by_replicas(
    strict_api: Api, settings: Settings
) -> None:
    read = strict_api.headers(Role.READ)
    for _ in range(3):
        assert (await strict_api.client.get("/v1/findings", headers=read)).status_code == 200
    limited = await strict_api.client.get("/v1/findings", headers=read)
    assert limited.status_code == 429
    assert limited.json()["error"] == "rate_limited"
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert (await strict_api.client.get("/v1/findings", headers=strict_api.headers(Role.TRIAGE))).status_code == 200
    # An ingest batch is one request, whatever it holds.
    exchanges, _ = leak_pair("argparse", "acme", "globex", time.time())
    bad = {"exchanges": exchanges}  # refused for its key id below, after taking its token
    for _ in range(3):
        assert (
            await strict_api.client.post("/v1/exchanges", json=bad, headers=strict_api.headers(Role.INGEST))
        ).status_code == 422
    refused = await strict_api.client.post("/v1/exchanges", json=bad, headers=strict_api.headers(Role.INGEST))
    assert refused.status_code == 429
    if settings.redis_url is not None:  # another replica on the same Redis draws on the same bucket
        async with running_api(
            settings.model_copy(update={"rate_limit_per_second": RATE, "rate_limit_burst": 3})
        ) as other:
            again = await other.client.get("/v1/findings", headers=read)
            assert again.status_code == 429


async def test_new_tenants_per_ingest_key_are_limited_per_exchange(settings: Settings) -> None:
    """A key inventing tenant names gets each one past the limit rejected alone; known tenants and
    names already counted pass, and the rest of the batch is taken."""
    limited = settings.model_copy(update={"new_tenants_per_key_per_minute": 2})
    async with running_api(limited) as api:
        now = time.time()
        other_key = (await _create_keys(limited))[Role.INGEST]  # introduces "known", on its own budget
        known = {"exchanges": [exchange("known", "k-1", words("csv"), words("json"), now)]}
        resp = await api.client.post("/v1/exchanges", json=known, headers={"Authorization": f"Bearer {other_key}"})
        assert resp.status_code == 202, resp.text
        await api.processed()
        before = metrics.EXCHANGES_REJECTED.labels("too_many_new_tenants")._value.get()
        tenants = ["new-1", "new-1", "new-2", "new-3", "known", "new-3"]
        batch = [exchange(t, f"r-{i}", words("csv"), words("heapq"), now) for i, t in enumerate(tenants)]
        resp = await api.client.post("/v1/exchanges", json={"exchanges": batch}, headers=api.headers(Role.INGEST))
        assert resp.status_code == 202, resp.text
        results = resp.json()["results"]
        assert [r["status"] for r in results] == ["accepted"] * 3 + ["rejected", "accepted", "rejected"]
        assert {results[3]["error"], results[5]["error"]} == {"too_many_new_tenants"}
        assert "BLEEDWATCH_NEW_TENANTS_PER_KEY_PER_MINUTE" in results[3]["detail"]
        assert "new-3" not in results[3]["detail"]  # never echoes tenant data
        # The limit lifts at the next clock minute: the SDK sends them again then (test_sdk_client.py).
        assert all(0 < results[i]["retry_after"] <= 60 for i in (3, 5))
        assert {r["retry_after"] for i, r in enumerate(results) if i not in (3, 5)} == {None}
        assert metrics.EXCHANGES_REJECTED.labels("too_many_new_tenants")._value.get() - before == 2
    one = settings.model_copy(update={"new_tenants_per_key_per_minute": 1})
    async with running_api(one) as api:
        batch = [exchange(f"one-{i}", "r", words("csv"), words("heapq"), time.time()) for i in range(2)]
        resp = await api.client.post("/v1/exchanges", json={"exchanges": batch}, headers=api.headers(Role.INGEST))
        assert "this API key sent more than 1 tenant not seen before" in resp.json()["results"][1]["detail"]
    off = settings.model_copy(update={"new_tenants_per_key_per_minute": 0})
    async with running_api(off) as api:
        batch = [exchange(f"t-{i}", "r", words("csv"), words("heapq"), time.time()) for i in range(5)]
        resp = await api.client.post("/v1/exchanges", json={"exchanges": batch}, headers=api.headers(Role.INGEST))
        assert resp.json()["accepted"] == 5


async def test_unknown_key_ids_and_old_timestamps_are_refused(strict_api: Api, settings: Settings) -> None:
    exchanges, _ = leak_pair("argparse", "acme", "globex", time.time())
    resp = await strict_api.client.post(
        "/v1/exchanges", json={"exchanges": exchanges}, headers=strict_api.headers(Role.INGEST)
    )
    assert resp.status_code == 422
    assert resp.json()["detail"].startswith("exchanges[0].key_id: not one of the fingerprint key ids")
    assert KEY.hex() not in resp.text

    async with running_api(settings.model_copy(update={"max_age_seconds": 3600})) as api:
        old, _ = leak_pair("argparse", "acme", "globex", time.time() - 7200)
        resp = await api.client.post("/v1/exchanges", json={"exchanges": old}, headers=api.headers(Role.INGEST))
        assert resp.status_code == 422
        assert resp.json()["detail"] == (
            "exchanges[0].ts: more than 3600 s in the past (BLEEDWATCH_MAX_AGE_SECONDS); "
            "check the gateway clock, or drop exchanges that old"
        )
        # The default is the findings retention: a finding that old would be pruned at once.
        assert Settings(findings_retention_days=30).effective_max_age_seconds == 30 * 86400


async def test_every_json_endpoint_wants_json_and_bounded_strings(api: Api) -> None:
    admin = api.headers(Role.ADMIN)
    for method, path in (
        ("POST", "/v1/keys"),
        ("POST", "/v1/tenants/purge"),
        ("PATCH", "/v1/incidents/1"),
        ("PUT", "/v1/deployments/pd-1"),
        ("POST", "/v1/allowlist"),
        ("POST", "/v1/allowlist/1/fingerprints"),
        ("POST", "/v1/signals"),
        ("POST", "/v1/exchanges"),
    ):
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"):
            key = api.headers(Role.INGEST) if path in ("/v1/exchanges", "/v1/signals") else admin
            resp = await api.client.request(
                method, path, content=b'{"tenant": "acme"}', headers=key | {"Content-Type": content_type}
            )
            assert resp.status_code == 415, (method, path, resp.text)
            assert resp.json() == {
                "error": "unsupported_media_type",
                "detail": "send the batch as Content-Type: application/json, in UTF-8"
                if path == "/v1/exchanges"
                else "send the request body as Content-Type: application/json, in UTF-8",
            }
    missing = await api.client.post("/v1/tenants/purge", headers=admin)
    assert missing.status_code == 422
    for method, path, body in (
        ("POST", "/v1/keys", {"name": "n" * 129, "role": "read"}),
        ("POST", "/v1/keys", {"name": "a\nb", "role": "read"}),
        ("POST", "/v1/keys", {"name": "n", "role": "root"}),
        ("POST", "/v1/keys", {"name": "n", "role": "ingest", "tenants": ["t" * 129]}),
        ("POST", "/v1/tenants/purge", {"tenant": "t" * 129}),
        ("POST", "/v1/tenants/purge", {"tenant": "acme", "also": 1}),
        ("PATCH", "/v1/incidents/1", {"assignee": "a" * 129}),
    ):
        resp = await api.client.request(
            method, path, content=orjson.dumps(body), headers=admin | {"Content-Type": "application/json"}
        )
        assert resp.status_code == 422, (path, body, resp.text)
        assert "t" * 100 not in resp.text
        assert "n" * 100 not in resp.text
    for params in ({"tenant": "t" * 129}, {"limit": "501"}, {"sort": "tenant"}, {"status": "gone"}):
        resp = await api.client.get("/v1/incidents", params=params, headers=admin)
        assert resp.status_code == 422, params
        assert "t" * 100 not in resp.text
    assert (await api.client.get("/v1/incidents/0", headers=admin)).status_code == 422
    assert (await api.client.get(f"/v1/incidents/{2**63}", headers=admin)).status_code == 422
