"""Fingerprint -> ingest -> cross-match -> finding -> REST, on every backend."""

from __future__ import annotations

import time
from typing import Any

import pytest

from service.auth.keys import Role
from tests.conftest import ALL_BACKENDS, Api
from tests.traffic import BOILERPLATE, exchange, totals, words

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)]

LEAK = words("argparse", 60, 100)  # 40 words of tenant A's prompt


def traffic(now: float) -> dict[str, list[dict[str, Any]]]:
    """A leaks 40 words into B's answer; C echoes itself; everyone shares boilerplate."""
    return {
        "source": [exchange("tenant-a", "r-a", BOILERPLATE + " " + words("argparse"), words("json", 0, 120), now)],
        "leak": [
            exchange(
                "tenant-b",
                "r-b",
                BOILERPLATE + " " + words("sqlite3"),
                words("csv", 0, 100) + " " + LEAK + " " + words("heapq", 0, 60),
                now + 1,
                prompt_tokens=700_001,
            )
        ],
        "clean": [
            exchange(
                "tenant-c",
                "r-c",
                BOILERPLATE + " " + words("socket"),
                "As you wrote: " + words("socket", 30, 110),
                now + 2,
            ),
            exchange(
                "tenant-d",
                "r-d",
                BOILERPLATE + " " + words("http"),
                BOILERPLATE + " " + words("difflib", 0, 90),
                now + 3,
            ),
        ],
    }


async def post(api: Api, exchanges: list[dict[str, Any]]) -> dict[str, Any]:
    resp = await api.client.post("/v1/exchanges", json={"exchanges": exchanges}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def findings(api: Api, **params: str) -> list[dict[str, Any]]:
    resp = await api.client.get("/v1/findings", params=params, headers=api.headers(Role.READ))
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


def assert_the_leak(items: list[dict[str, Any]]) -> None:
    assert len(items) == 1, items
    f = items[0]
    assert (f["recipient_tenant"], f["recipient_request_id"]) == ("tenant-b", "r-b")
    assert (f["source_tenant"], f["source_request_ids"]) == ("tenant-a", ["r-a"])
    assert (f["model"], f["deployment"], f["node"], f["prompt_tokens"]) == ("m-1m", "pd-eu-1", "decode-3", 700_001)
    assert f["matched_fingerprints"] >= 5
    assert 40 <= f["longest_run_tokens"] <= 70  # 40 words tokenise to a few more tokens
    assert f["severity"] == "high"
    assert 0 < f["score"] < 1
    (source,) = f["evidence"]["sources"]
    (rng,) = source["ranges"]
    assert rng["source_request_id"] == "r-a"
    assert rng["source_kind"] == "prompt"
    assert rng["response"][1] - rng["response"][0] == f["longest_run_tokens"]


@pytest.mark.parametrize("order", [("source", "leak", "clean"), ("leak", "clean", "source")])
async def test_one_leak_is_one_finding_whatever_the_arrival_order(api: Api, order: tuple[str, ...]) -> None:
    batches = traffic(time.time())
    for name in order:
        await post(api, batches[name])
    assert_the_leak(await findings(api))


async def test_one_batch_with_everything(api: Api) -> None:
    batches = traffic(time.time())
    result = await post(api, batches["clean"] + batches["leak"] + batches["source"])
    assert totals(result) == {"accepted": 4, "duplicates": 0, "findings": 1, "processed": True}
    assert_the_leak(await findings(api))


async def test_retried_batch_counts_once(api: Api) -> None:
    batches = traffic(time.time())
    batch = batches["source"] + batches["leak"]
    assert totals(await post(api, batch)) == {"accepted": 2, "duplicates": 0, "findings": 1, "processed": True}
    assert totals(await post(api, batch)) == {"accepted": 0, "duplicates": 2, "findings": 0, "processed": True}
    assert_the_leak(await findings(api))


async def test_findings_filters_pagination_and_detail(api: Api) -> None:
    now = time.time()
    pairs = [("argparse", "csv"), ("subprocess", "json"), ("socket", "heapq")]
    for i, (source, other) in enumerate(pairs):  # distinct texts: shared ones would become common
        await post(
            api,
            [
                exchange(f"src-{i}", f"s-{i}", words(source), words("difflib", 40 * i, 40 * i + 30), now),
                exchange(f"dst-{i}", f"d-{i}", words(other), words(source, 60, 100), now),
            ],
        )
    everything = await findings(api)
    assert [f["recipient_request_id"] for f in everything] == ["d-2", "d-1", "d-0"]
    assert [f["recipient_tenant"] for f in await findings(api, recipient_tenant="dst-1")] == ["dst-1"]
    assert [f["source_tenant"] for f in await findings(api, source_tenant="src-2")] == ["src-2"]
    assert await findings(api, model="other-model") == []
    assert await findings(api, severity="critical") == []
    for level in ("low", "high"):
        expected = [f["id"] for f in everything if f["severity"] == level]
        assert [f["id"] for f in await findings(api, severity=level)] == expected
    assert len(await findings(api, since="2000-01-01T00:00:00Z", until="2100-01-01T00:00:00Z")) == 3
    assert await findings(api, since="2100-01-01T00:00:00Z") == []

    pages, cursor = [], None
    while True:
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        resp = (await api.client.get("/v1/findings", params=params, headers=api.headers(Role.READ))).json()
        pages.append([f["id"] for f in resp["items"]])
        cursor = resp["next_cursor"]
        if cursor is None:
            break
    assert pages == [[everything[0]["id"], everything[1]["id"]], [everything[2]["id"]]]

    one = await api.client.get(f"/v1/findings/{everything[1]['id']}", headers=api.headers(Role.READ))
    assert one.status_code == 200
    assert one.json() == everything[1]
    missing = await api.client.get("/v1/findings/999999", headers=api.headers(Role.READ))
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found", "detail": "no finding 999999"}


async def test_health_readiness_and_metrics(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200
    assert {k: v for k, v in ready.json().items() if k != "durability"} == {
        "ready": True,
        "checks": {"index": "ok", "database": "ok"},
    }
    assert ready.json()["durability"] in ("in_process", "ok", "no_aof")  # tests/test_redis_durability.py
    batches = traffic(time.time())
    await post(api, batches["source"] + batches["leak"])
    body = (await api.client.get("/metrics")).text
    for name in (
        "bleedwatch_exchanges_ingested_total",
        "bleedwatch_fingerprints_ingested_total",
        'bleedwatch_findings_total{severity="high"}',
        "bleedwatch_ingest_duration_seconds_bucket",
        "bleedwatch_match_duration_seconds_bucket",
    ):
        assert name in body
    assert "tenant-a" not in body
    assert "tenant-b" not in body
