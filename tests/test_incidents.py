"""Incidents on every backend: grouping, lifecycle, listing, the impact report, false positives."""

from __future__ import annotations

import asyncio
import csv
import io
import itertools
import time
from datetime import UTC, datetime

import pytest

from service.auth.keys import Role
from service.config import Settings
from tests.conftest import Api, running_api
from tests.incident_traffic import get, key_id, leak, leak_pair, patch, post

pytestmark = pytest.mark.anyio


async def incidents(api: Api, **params: str) -> list[dict[str, object]]:
    items: list[dict[str, object]] = (await get(api, "/v1/incidents", Role.READ, **params))["items"]
    return items


async def test_findings_group_by_model_deployment_and_quiet_gap(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    await leak(api, "csv", "initech", "umbrella", now + 5, length=15)  # same model+deployment: joins
    await leak(api, "json", "acme", "globex", now, deployment="pd-us-2")  # another deployment
    await leak(api, "socket", "hooli", "globex", now, model="m-other")  # another model
    await leak(api, "http", "acme", "umbrella", now - 3 * 3600)  # same group, hours before: outside the gap

    items = await incidents(api, sort="opened_at", order="asc")
    assert [(i["model"], i["deployment"], i["finding_count"]) for i in items] == [
        ("m-1m", "pd-eu-1", 2),
        ("m-1m", "pd-us-2", 1),
        ("m-other", "pd-eu-1", 1),
        ("m-1m", "pd-eu-1", 1),
    ]
    first = items[0]
    assert first["status"] == "open"
    assert first["severity"] == "high"  # max of high and low
    assert first["source_tenants"] == ["acme", "initech"]
    assert first["recipient_tenants"] == ["globex", "umbrella"]
    assert (await get(api, f"/v1/incidents/{first['id']}"))["findings"][1]["severity"] == "low"

    # A late finding inside the gap of the older incident's span joins it, not the newer one.
    await leak(api, "subprocess", "acme", "umbrella", now - 3 * 3600 + 600)
    assert (await get(api, f"/v1/incidents/{items[3]['id']}"))["finding_count"] == 2


async def test_lifecycle_timeline_and_invalid_steps(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    (incident,) = await incidents(api)
    path = f"/v1/incidents/{incident['id']}"
    triage = key_id(api, Role.TRIAGE)

    acked = await patch(api, path, {"status": "acknowledged", "assignee": "oncall-eu", "notes": "looking"})
    assert (acked["status"], acked["assignee"], acked["notes"]) == ("acknowledged", "oncall-eu", "looking")
    body = await patch(api, path, {"status": "open"}, status=200)
    assert body["status"] == "open"
    resolved = await patch(api, path, {"status": "resolved"})
    assert resolved["closed_at"] is not None
    conflict = await patch(api, path, {"status": "acknowledged"}, status=409)
    assert conflict == {
        "error": "conflict",
        "detail": "status: an incident that is resolved cannot become acknowledged, only false_positive or open",
    }
    await patch(api, path, {"assignee": None})
    await patch(api, path, {}, status=422)
    await patch(api, path, {"status": None}, status=422)
    closed = await patch(api, path, {"status": "closed"}, status=422)
    # Not the union pydantic sees (the status's enum, or null): null is refused, so it is not offered.
    assert closed["detail"] == "status: Input should be 'open', 'acknowledged', 'resolved' or 'false_positive'"
    broken = await api.client.patch(
        path, content=b'{"status": ', headers=api.headers(Role.TRIAGE) | {"Content-Type": "application/json"}
    )
    assert (broken.status_code, broken.json()["detail"]) == (422, "body: not JSON; send the request body as UTF-8 JSON")
    await patch(api, path, {"notes": "x" * 10_001}, status=422)
    await patch(api, path, {"status": "open"}, role=Role.READ, status=403)
    await patch(api, "/v1/incidents/999999", {"status": "open"}, status=404)

    timeline = (await get(api, path))["timeline"]
    assert [(e["actor"], e["action"]) for e in timeline] == [
        ("bleedwatch", "opened"),
        ("bleedwatch", "finding_added"),
        (triage, "status"),
        (triage, "assignee"),
        (triage, "notes"),
        (triage, "status"),
        (triage, "status"),
        (triage, "assignee"),
    ]
    assert timeline[2]["detail"] == {"before": "open", "after": "acknowledged"}
    assert timeline[-1]["detail"] == {"before": "oncall-eu", "after": None}
    assert all(e["request_id"] for e in timeline)

    # Resolved incidents are never joined: the same leak again is a new incident.
    await leak(api, "csv", "acme", "globex", now + 10)
    assert [i["status"] for i in await incidents(api, sort="opened_at", order="asc")] == ["resolved", "open"]


async def test_listing_filters_sorting_and_cursor(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now - 40_000, length=15)  # low
    await leak(api, "csv", "initech", "umbrella", now - 20_000)  # high
    await leak(api, "json", "hooli", "acme", now, deployment="pd-us-2")  # high, acme is the recipient
    all_ = await incidents(api)
    assert len(all_) == 3
    ids_by_seen = [i["id"] for i in all_]  # default: last_seen_at desc
    assert [i["id"] for i in await incidents(api, sort="last_seen_at", order="asc")] == ids_by_seen[::-1]
    by_severity = await incidents(api, sort="severity", order="desc")
    assert [i["severity"] for i in by_severity] == ["high", "high", "low"]
    assert [i["severity"] for i in await incidents(api, sort="severity", order="asc")] == ["low", "high", "high"]

    assert {i["deployment"] for i in await incidents(api, tenant="acme")} == {"pd-eu-1", "pd-us-2"}
    assert await incidents(api, tenant="nobody") == []
    assert [i["severity"] for i in await incidents(api, severity="low")] == ["low"]
    assert len(await incidents(api, deployment="pd-us-2")) == 1
    assert len(await incidents(api, model="m-1m")) == 3
    assert await incidents(api, model="m-2") == []
    assert len(await incidents(api, status="open")) == 3
    assert await incidents(api, status="resolved") == []
    since = datetime.fromtimestamp(now - 30_000, UTC).isoformat()
    assert len(await incidents(api, since=since)) == 2
    until = datetime.fromtimestamp(now - 30_000, UTC).isoformat()
    assert len(await incidents(api, until=until)) == 1

    for sort in ("opened_at", "last_seen_at", "severity"):
        for order in ("asc", "desc"):
            seen, cursor = [], None
            while True:
                params = {"sort": sort, "order": order, "limit": "2"} | ({"cursor": cursor} if cursor else {})
                page = await get(api, "/v1/incidents", Role.READ, **params)
                seen += [i["id"] for i in page["items"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert seen == [i["id"] for i in await incidents(api, sort=sort, order=order)]
    # A cursor is a (sort key, id) position: any the schema admits gives a page, even under another sort.
    page = await get(api, "/v1/incidents", sort="severity", limit="1")
    other = await api.client.get(
        "/v1/incidents", params={"sort": "opened_at", "cursor": page["next_cursor"]}, headers=api.headers(Role.READ)
    )
    assert other.status_code == 200
    for order in ("asc", "desc"):  # a severity past a 32-bit column's range is still a position
        params = {"sort": "severity", "order": order, "cursor": "-9999999999999999.1"}
        far = await api.client.get("/v1/incidents", params=params, headers=api.headers(Role.READ))
        assert far.status_code == 200
        assert len(far.json()["items"]) == (3 if order == "asc" else 0)
        params["cursor"] = "2147483648.1"
        far = await api.client.get("/v1/incidents", params=params, headers=api.headers(Role.READ))
        assert far.status_code == 200
        assert len(far.json()["items"]) == (0 if order == "asc" else 3)
    for name, moment in (("since", "0001-01-01T00:00:00+01:00"), ("until", "9999-12-31T23:59:59-01:00")):
        for path in ("/v1/incidents", "/v1/findings"):  # out of what UTC times Python holds: not a 500
            far = await api.client.get(path, params={name: moment}, headers=api.headers(Role.READ))
            assert far.status_code == 200, far.text
            assert len(far.json()["items"]) == 3
    garbage = await api.client.get("/v1/incidents", params={"cursor": "!!"}, headers=api.headers(Role.READ))
    assert garbage.status_code == 422
    naive = await api.client.get(
        "/v1/incidents", params={"since": "2026-01-01T00:00:00"}, headers=api.headers(Role.READ)
    )
    assert naive.status_code == 422


async def test_the_status_filter_takes_one_or_more_statuses(api: Api) -> None:
    """``status=open,acknowledged``, as ``GET /v1/findings``'s ``incident_status``: the same pattern
    and the same refusal; one status filters as it did."""
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now - 300)
    await leak(api, "csv", "initech", "umbrella", now - 200, deployment="pd-us-2")
    await leak(api, "json", "hooli", "acme", now, deployment="pd-ap-3")
    newest, middle, oldest = [i["id"] for i in await incidents(api)]
    await patch(api, f"/v1/incidents/{middle}", {"status": "acknowledged"})
    await patch(api, f"/v1/incidents/{oldest}", {"status": "resolved"})

    async def ids(**params: str) -> list[object]:
        return [i["id"] for i in await incidents(api, **params)]

    assert await ids(status="open") == [newest]
    assert await ids(status="acknowledged") == [middle]
    assert await ids(status="open,acknowledged") == [newest, middle]
    assert await ids(status="acknowledged,open,open") == [newest, middle]
    assert await ids(status="resolved,false_positive") == [oldest]
    assert await ids(status="false_positive") == []
    first = await get(api, "/v1/incidents", status="open,acknowledged", limit="1")
    rest = await get(api, "/v1/incidents", status="open,acknowledged", limit="1", cursor=first["next_cursor"])
    assert [i["id"] for i in first["items"] + rest["items"]] == [newest, middle]
    assert rest["next_cursor"] is None
    listed = (await get(api, "/v1/audit", role=Role.ADMIN, action="incidents.list", limit="1"))["items"][0]
    assert listed["detail"]["filters"] == {"status": "open,acknowledged"}

    for value in ("closed", "open,", "open,,resolved", "OPEN", "open;resolved", "", "open\n"):
        resp = await api.client.get("/v1/incidents", params={"status": value}, headers=api.headers(Role.READ))
        assert resp.status_code == 422, value
        assert resp.json() == {
            "error": "invalid",
            "detail": "query.status: one or more of open, acknowledged, resolved, false_positive, separated by commas",
        }
    schema = (await api.client.get("/openapi.json")).json()
    (param,) = [p for p in schema["paths"]["/v1/incidents"]["get"]["parameters"] if p["name"] == "status"]
    assert "^(open|acknowledged|resolved|false_positive)(,(" in str(param["schema"])
    assert "open,acknowledged" in param["description"]


async def test_impact_report_json_and_csv(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now - 100, prompt_tokens=700_001, node="decode-3")
    await leak(api, "csv", "acme", "globex", now - 50, prompt_tokens=20_000, node="decode-4")
    await leak(api, "json", "=cmd|' /C calc'!A0", "umbrella", now, prompt_tokens=1_500_000)
    signals = {
        "events": [
            {"kind": "kv_transfer_short", "deployment": "pd-eu-1", "node": "decode-3", "ts": now - 90, "count": 3},
            {"kind": "kv_transfer_short", "deployment": "pd-eu-1", "node": "decode-4", "ts": now - 40},
            {"kind": "foreign_request_metadata", "deployment": "pd-eu-1", "node": "decode-3", "ts": now},
            {"kind": "kv_transfer_short", "deployment": "pd-eu-1", "node": "decode-3", "ts": now - 7200},  # outside
            {"kind": "kv_transfer_short", "deployment": "pd-us-2", "node": "decode-3", "ts": now},  # elsewhere
        ]
    }
    resp = await api.client.post("/v1/signals", json=signals, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202, resp.text
    (incident,) = await incidents(api)
    report = await get(api, f"/v1/incidents/{incident['id']}/impact")

    assert report["source_tenants"] == ["=cmd|' /C calc'!A0", "acme"]
    assert report["recipient_tenants"] == ["globex", "umbrella"]
    assert report["response_count"] == 3
    assert report["models"] == ["m-1m"]
    assert report["deployments"] == ["pd-eu-1"]
    assert report["nodes"] == ["decode-3", "decode-4"]
    pairs = {(p["source_tenant"], p["recipient_tenant"]): p for p in report["pairs"]}
    acme = pairs[("acme", "globex")]
    assert acme["response_count"] == 2
    assert acme["canary"] is False
    assert [r["prompt_tokens"] for r in acme["responses"]] == [700_001, 20_000]
    assert acme["first_seen_at"] < acme["last_seen_at"]
    assert all(r["source_request_ids"] and r["recipient_request_id"] for r in acme["responses"])
    lengths = report["prompt_tokens"]
    assert (lengths["known"], lengths["unknown"], lengths["min"], lengths["max"]) == (3, 0, 20_000, 1_500_000)
    assert lengths["median"] == 700_001
    assert {b["label"]: b["count"] for b in lengths["buckets"]} == {
        "<32k": 1,
        "32k-128k": 0,
        "128k-512k": 0,
        "512k-1M": 1,
        ">1M": 1,
    }
    side = report["signals"]
    assert side["deployment"] == "pd-eu-1"
    assert side["total"] == 3
    assert side["by_kind"] == {"foreign_request_metadata": 1, "kv_transfer_short": 4}
    assert {s["node"] for s in side["items"]} == {"decode-3", "decode-4"}
    assert side["truncated"] is False

    for headers, params in (({"Accept": "text/csv"}, {}), ({}, {"format": "csv"})):
        resp = await api.client.get(
            f"/v1/incidents/{incident['id']}/impact", params=params, headers=api.headers(Role.READ) | headers
        )
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(resp.text)))
        assert len(rows) == 3
        assert {r["source_tenant"] for r in rows} == {"acme", "'=cmd|' /C calc'!A0"}  # no formula runs
        assert {r["recipient_request_id"] for r in rows} == {
            r["recipient_request_id"] for p in report["pairs"] for r in p["responses"]
        }
        # Times as the JSON report writes them (...Z), not Python's ...+00:00.
        assert {(r["response_at"], r["detected_at"]) for r in rows} == {
            (r["response_at"], r["detected_at"]) for p in report["pairs"] for r in p["responses"]
        }
    for accept, kind in (
        ("text/csv;q=0, application/json", "application/json"),  # refused outright
        ("application/json, text/csv;q=0.5", "application/json"),
        ("application/json;q=0.5, text/csv", "text/csv"),
        ("*/*", "application/json"),
    ):
        resp = await api.client.get(
            f"/v1/incidents/{incident['id']}/impact", headers=api.headers(Role.READ) | {"Accept": accept}
        )
        assert resp.headers["content-type"].startswith(kind), accept
    missing = await api.client.get("/v1/incidents/424242/impact", headers=api.headers(Role.READ))
    assert missing.status_code == 404


async def test_false_positive_teaches_the_allowlist_and_reverting_unlearns(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    (incident,) = await incidents(api)
    path = f"/v1/incidents/{incident['id']}"
    (finding,) = (await get(api, path))["findings"]

    marked = await patch(api, f"{path}/findings/{finding['id']}", {"false_positive": True})
    entry_id = marked["finding"]["allowlist_entry_id"]
    assert marked["finding"]["false_positive"] is True
    entries = (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"]
    (entry,) = [e for e in entries if e["id"] == entry_id]
    assert entry["origin"] == f"false_positive:finding:{finding['id']}"
    assert entry["fingerprint_count"] >= 2
    assert entry["created_by"] == key_id(api, Role.TRIAGE)
    full = await get(api, f"/v1/findings/{finding['id']}")
    assert entry["key_id"] == full["key_id"]

    # The same text reaching another answer is no finding any more ...
    exchanges, _ = leak_pair("argparse", "acme", "hooli", now + 1)
    assert (await post(api, exchanges))["findings"] == 0
    report = await get(api, f"{path}/impact")
    assert (report["response_count"], report["false_positive_findings"]) == (0, 1)

    # ... until the marking is reverted, which revokes the entry.
    restored = await patch(api, f"{path}/findings/{finding['id']}", {"false_positive": False})
    assert restored["finding"]["false_positive"] is False
    entries = (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"]
    assert next(e for e in entries if e["id"] == entry_id)["revoked_by"] == key_id(api, Role.TRIAGE)
    exchanges, _ = leak_pair("argparse", "acme", "initech", now + 2)
    # initech's answer. hooli's is not judged again: nothing new arrived for it (acme's prompt had
    # the text already), and a revoked entry, like a new one, applies from now on.
    assert (await post(api, exchanges))["findings"] == 1
    await patch(api, f"{path}/findings/999999", {"false_positive": True}, status=404)


async def test_incident_false_positive_marks_every_finding_and_reverts_only_its_own(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    await leak(api, "csv", "acme", "umbrella", now + 1)
    (incident,) = await incidents(api)
    path = f"/v1/incidents/{incident['id']}"
    first, second = (await get(api, path))["findings"]
    await patch(api, f"{path}/findings/{first['id']}", {"false_positive": True})  # on its own first

    fp = await patch(api, path, {"status": "false_positive"})
    assert fp["status"] == "false_positive"
    assert all(f["false_positive"] for f in fp["findings"])
    origins = {e["origin"] for e in (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"] if not e["revoked_at"]}
    assert origins == {f"false_positive:finding:{first['id']}", f"false_positive:finding:{second['id']}"}

    reopened = await patch(api, path, {"status": "open"})
    assert {f["id"]: f["false_positive"] for f in reopened["findings"]} == {first["id"]: True, second["id"]: False}
    active = [e for e in (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"] if not e["revoked_at"]]
    assert [e["origin"] for e in active] == [f"false_positive:finding:{first['id']}"]
    actions = [e["action"] for e in reopened["timeline"]]
    assert actions.count("finding_false_positive") == 2
    assert actions.count("finding_restored") == 1


async def test_changes_at_once_take_turns(api: Api) -> None:
    """Two responders at once, or a double click: one change of status wins and the others get 409
    (none is checked against a status the other has just replaced), and a finding marked twice at
    once has one allowlist entry, so undoing it leaves none."""
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    (incident,) = await incidents(api)
    path = f"/v1/incidents/{incident['id']}"
    (finding,) = (await get(api, path))["findings"]

    def active() -> list[str]:
        return [e["origin"] for e in entries if not e["revoked_at"]]

    await asyncio.gather(*(patch(api, f"{path}/findings/{finding['id']}", {"false_positive": True}) for _ in range(4)))
    entries = (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"]
    assert active() == [f"false_positive:finding:{finding['id']}"]
    await patch(api, f"{path}/findings/{finding['id']}", {"false_positive": False})
    entries = (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"]
    assert active() == []

    steps = ["acknowledged", "resolved", "false_positive"] * 3
    answers = await asyncio.gather(
        *(api.client.patch(path, json={"status": s}, headers=api.headers(Role.TRIAGE)) for s in steps)
    )
    codes = sorted(a.status_code for a in answers)
    assert set(codes) <= {200, 409}, [a.text for a in answers]
    timeline = (await get(api, path))["timeline"]
    changes = [(e["detail"]["before"], e["detail"]["after"]) for e in timeline if e["action"] == "status"]
    assert all(a == b for (_, a), (b, _) in itertools.pairwise(changes)), changes  # a chain
    assert 1 <= len(changes) <= codes.count(200)  # setting the status it has is a 200 that changes nothing
    entries = (await get(api, "/v1/allowlist", role=Role.ADMIN))["items"]
    assert len(active()) == (1 if changes[-1][1] == "false_positive" else 0)


async def test_reads_and_changes_are_audited(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    (incident,) = await incidents(api)
    await get(api, f"/v1/incidents/{incident['id']}")
    await get(api, f"/v1/incidents/{incident['id']}/impact")
    await patch(api, f"/v1/incidents/{incident['id']}", {"status": "acknowledged"})
    findings = (await get(api, "/v1/findings", recipient_tenant="globex"))["items"]
    await get(api, f"/v1/findings/{findings[0]['id']}")

    entries = (await get(api, "/v1/audit", role=Role.ADMIN))["items"]
    reader, triage = key_id(api, Role.READ), key_id(api, Role.TRIAGE)
    assert [(e["key_id"], e["action"], e["target"]) for e in entries][::-1] == [
        (reader, "incidents.list", "incidents"),
        (reader, "incidents.read", f"incident:{incident['id']}"),
        (reader, "incidents.impact", f"incident:{incident['id']}"),
        (triage, "incidents.update", f"incident:{incident['id']}"),
        (reader, "findings.list", "findings"),
        (reader, "findings.read", f"finding:{findings[0]['id']}"),
    ]
    assert all(e["request_id"] for e in entries)
    listing = next(e for e in entries if e["action"] == "findings.list")
    assert listing["detail"]["ids"] == [findings[0]["id"]]
    assert "globex" not in str(entries)  # tenants only by hash
    by_tenant = (await get(api, "/v1/audit", role=Role.ADMIN, tenant="globex"))["items"]
    # What showed globex's data, and the listing filtered by it; not the change of status.
    assert [e["action"] for e in by_tenant][::-1] == [
        "incidents.read",
        "incidents.impact",
        "findings.list",
        "findings.read",
    ]
    mine = (await get(api, "/v1/audit", role=Role.ADMIN, key_id=triage))["items"]
    assert [e["action"] for e in mine] == ["incidents.update"]
    page = await get(api, "/v1/audit", role=Role.ADMIN, limit="2")
    rest = await get(api, "/v1/audit", role=Role.ADMIN, cursor=page["next_cursor"], limit="100")
    assert page["items"][-1]["id"] > rest["items"][0]["id"]
    assert (await get(api, "/v1/audit", role=Role.ADMIN, action="audit.list", limit="1"))["items"][0]["key_id"] == (
        key_id(api, Role.ADMIN)
    )


async def test_open_incident_gauge(api: Api) -> None:
    from prometheus_client import REGISTRY

    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)
    await leak(api, "csv", "acme", "globex", now, deployment="pd-us-2", length=15)
    (high, low) = await incidents(api, sort="severity")
    await patch(api, f"/v1/incidents/{low['id']}", {"status": "acknowledged"})  # refreshes the gauge

    def gauge(severity: str) -> float | None:
        return REGISTRY.get_sample_value("bleedwatch_open_incidents", {"severity": severity})

    assert (gauge("high"), gauge("low"), gauge("critical")) == (1, 1, 0)
    await patch(api, f"/v1/incidents/{high['id']}", {"status": "resolved"})
    assert (gauge("high"), gauge("low")) == (0, 1)


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_two_replicas_open_one_incident_for_one_leak(api: Api, settings: Settings) -> None:
    async with running_api(settings) as other:
        now = time.time()
        batches = [leak_pair(text, "acme", f"victim-{text}", now)[0] for text in ("argparse", "csv", "json", "socket")]
        results = await asyncio.gather(
            *(post(replica, b) for replica, b in zip([api, other] * 2, batches, strict=True))
        )
    assert sum(r["findings"] for r in results) == 4
    (incident,) = await incidents(api)
    assert incident["finding_count"] == 4
