"""The responder UI over HTTP on every backend: sign-in, pages, actions, CSRF, roles, audit, sign-out.

The client speaks https (in process), so the session cookie is the production one: ``__Host-``,
Secure, HttpOnly, SameSite=Strict. The browser test is ``tests/test_ui_browser.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from service.auth.keys import Role
from service.config import Settings
from service.findings.models import Finding
from service.ui import evidence
from tests.conftest import Api, running_api
from tests.incident_traffic import get, key_id, leak

pytestmark = pytest.mark.anyio
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
COOKIE = "__Host-bw_ui"


@asynccontextmanager
async def browser(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    """A cookie-keeping client of the same app over https, as a browser would be."""
    async with httpx.AsyncClient(transport=api.client._transport, base_url="https://bleedwatch.test") as client:
        yield client


def csrf_of(page: httpx.Response) -> str:
    match = CSRF.search(page.text)
    assert match is not None, page.text
    return match[1]


async def sign_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await client.get("/ui/signin")
    assert form.status_code == 200
    return await client.post("/ui/signin", data={"csrf": csrf_of(form), "api_key": token})


async def signed_in(client: httpx.AsyncClient, api: Api, role: Role) -> str:
    """Signs in with the role's key; returns the session's CSRF token (from the incidents page)."""
    resp = await sign_in(client, api.tokens[role])
    assert (resp.status_code, resp.headers["location"]) == (303, "/ui"), resp.text
    page = await client.get("/ui")
    assert page.status_code == 200
    return csrf_of(page)


async def one_incident(api: Api) -> int:
    """One open incident of one finding (acme's text in globex's answer); read with the admin key,
    so the read and triage keys' audit entries are the UI's alone."""
    await leak(api, "argparse", "acme", "globex", time.time())
    (incident,) = (await get(api, "/v1/incidents", Role.ADMIN))["items"]
    incident_id: int = incident["id"]
    return incident_id


async def audit_of(api: Api, role: Role) -> list[tuple[str, str, dict[str, Any]]]:
    entries = (await get(api, "/v1/audit", Role.ADMIN, key_id=key_id(api, role), limit="500"))["items"]
    return [(e["action"], e["target"], e["detail"]) for e in entries][::-1]


async def test_sign_in_list_and_incident_page_read_like_the_api_and_are_audited(api: Api) -> None:
    incident_id = await one_incident(api)
    async with browser(api) as client:
        assert (await client.get("/ui")).headers["location"] == "/ui/signin"  # not signed in
        resp = await sign_in(client, api.tokens[Role.READ])
        cookie = next(c for c in resp.headers.get_list("set-cookie") if c.startswith(COOKIE + "="))
        assert {"HttpOnly", "Secure", "SameSite=strict", "Path=/"} <= {p.strip() for p in cookie.split(";")}
        assert api.tokens[Role.READ].split("_", 2)[2] not in cookie  # the key's secret never reaches a cookie

        listing = await client.get("/ui", params={"status": "open", "tenant": "globex"})
        assert listing.status_code == 200
        assert f'href="/ui/incidents/{incident_id}"' in listing.text
        assert "acme → globex" in listing.text
        assert "script-src" not in listing.headers["content-security-policy"]  # default-src 'none' forbids scripts
        assert "default-src 'none'" in listing.headers["content-security-policy"]
        assert listing.headers["cache-control"] == "no-store"
        assert "<script" not in listing.text
        assert "No incidents match." in (await client.get("/ui", params={"tenant": "nobody"})).text
        assert (await client.get("/ui", params={"severity": "huge"})).status_code == 400

        page = await client.get(f"/ui/incidents/{incident_id}")
        assert page.status_code == 200
        finding = (await get(api, f"/v1/incidents/{incident_id}", Role.ADMIN))["findings"][0]
        full = await get(api, f"/v1/findings/{finding['id']}", Role.ADMIN)
        (source,) = full["evidence"]["sources"]
        for r in source["ranges"]:  # each matched range drawn along the response, in token units
            start, end = r["response"]
            assert f'<rect class="match" x="{start}" y="0" width="{end - start}"' in page.text
        assert f'viewBox="0 0 {full["response_tokens"]} 10"' in page.text
        assert "finding_added" in page.text  # the timeline
        assert "Download the impact CSV" in page.text
        assert 'action="/ui/incidents/' not in page.text  # a read key gets no action forms

        csv = await client.get(f"/ui/incidents/{incident_id}/impact.csv")
        api_csv = await api.client.get(
            f"/v1/incidents/{incident_id}/impact", params={"format": "csv"}, headers=api.headers(Role.READ)
        )
        assert csv.status_code == 200
        assert csv.headers["content-type"] == "text/csv; charset=utf-8"
        assert csv.text == api_csv.text
        assert (await client.get("/ui/incidents/999999")).status_code == 404
        css = await client.get("/ui/static/ui.css")
        assert css.headers["content-type"].startswith("text/css")

    actions = await audit_of(api, Role.READ)
    assert [(a, t) for a, t, _ in actions] == [
        ("ui.signin", "ui"),
        ("incidents.list", "incidents"),
        ("incidents.list", "incidents"),
        ("incidents.read", f"incident:{incident_id}"),
        ("findings.read", f"finding:{finding['id']}"),
        ("incidents.impact", f"incident:{incident_id}"),
        ("incidents.impact", f"incident:{incident_id}"),  # the UI's CSV
        ("incidents.impact", f"incident:{incident_id}"),  # the API's CSV
    ]
    assert actions[1][2]["ids"] == [incident_id]
    assert set(actions[1][2]["filters"]) == {"status", "tenant"}
    assert "globex" not in str(actions)  # tenants only by hash, as in the API's entries
    assert [d["format"] for a, _, d in actions if a == "incidents.impact"] == ["html", "csv", "csv"]


async def test_actions_change_the_incident_like_patch_and_false_positive_allowlists(api: Api) -> None:
    incident_id = await one_incident(api)
    path = f"/ui/incidents/{incident_id}"
    async with browser(api) as client:
        csrf = await signed_in(client, api, Role.TRIAGE)
        page = await client.get(path)
        assert f'action="{path}/status"' in page.text

        async def act(what: str, **form: str) -> httpx.Response:
            return await client.post(f"{path}/{what}", data={"csrf": csrf, **form})

        resp = await act("status", status="acknowledged")
        assert (resp.status_code, resp.headers["location"]) == (303, f"{path}?done=status")
        assert "Status changed." in (await client.get(resp.headers["location"])).text
        assert (await act("assignee", assignee="oncall-eu")).status_code == 303
        assert (await act("notes", notes="<script>alert(1)</script> paged EU")).status_code == 303
        shown = await client.get(path)
        assert "&lt;script&gt;alert(1)&lt;/script&gt; paged EU" in shown.text  # autoescaped
        assert "<script>" not in shown.text
        assert (await act("assignee", assignee="x" * 129)).status_code == 400
        assert (await act("status", status="closed")).status_code == 400
        assert (await act("status", status="resolved")).status_code == 303
        conflict = await act("status", status="acknowledged")
        assert conflict.status_code == 409
        assert "an incident that is resolved cannot become acknowledged, only false_positive or open" in conflict.text
        assert (await act("status", status="false_positive")).status_code == 303
        missing = await client.post("/ui/incidents/999999/status", data={"csrf": csrf, "status": "open"})
        assert missing.status_code == 404

    incident = await get(api, f"/v1/incidents/{incident_id}")
    assert (incident["status"], incident["assignee"]) == ("false_positive", "oncall-eu")
    assert incident["notes"] == "<script>alert(1)</script> paged EU"
    triage = key_id(api, Role.TRIAGE)
    assert [(e["actor"], e["action"]) for e in incident["timeline"]][2:] == [
        (triage, "status"),
        (triage, "assignee"),
        (triage, "notes"),
        (triage, "status"),
        (triage, "finding_false_positive"),
        (triage, "status"),
    ]
    (finding,) = incident["findings"]
    entries = (await get(api, "/v1/allowlist", Role.ADMIN))["items"]
    (entry,) = [e for e in entries if e["id"] == finding["allowlist_entry_id"]]
    assert (entry["origin"], entry["created_by"]) == (f"false_positive:finding:{finding['id']}", triage)
    updates = [d for a, _, d in await audit_of(api, Role.TRIAGE) if a == "incidents.update"]
    assert [(d["fields"], d["status"]) for d in updates] == [
        (["status"], "acknowledged"),
        (["assignee"], "acknowledged"),
        (["notes"], "acknowledged"),
        (["status"], "resolved"),
        (["status"], "false_positive"),
    ]


async def test_every_post_needs_the_sessions_csrf_token_and_a_triage_role(api: Api) -> None:
    incident_id = await one_incident(api)
    status_path = f"/ui/incidents/{incident_id}/status"
    async with browser(api) as other:
        other_csrf = await signed_in(other, api, Role.ADMIN)
    async with browser(api) as client:
        csrf = await signed_in(client, api, Role.TRIAGE)
        for form in ({"status": "resolved"}, {"csrf": "x" * 64, "status": "resolved"}, {"csrf": other_csrf}):
            refused = await client.post(status_path, data=form)
            assert refused.status_code == 403
            assert "CSRF" in refused.text
        as_json = await client.post(status_path, json={"csrf": csrf, "status": "resolved"})
        assert as_json.status_code == 403  # only a form body carries a token
        refused = await client.post("/ui/signout", data={})
        assert refused.status_code == 403  # sign-out too: no other site signs a responder out
    async with browser(api) as reader:
        read_csrf = await signed_in(reader, api, Role.READ)
        refused = await reader.post(status_path, data={"csrf": read_csrf, "status": "resolved"})
        assert refused.status_code == 403
        assert "changes need triage or admin" in refused.text
    assert (await get(api, f"/v1/incidents/{incident_id}"))["status"] == "open"
    async with browser(api) as nobody:  # no session: to the sign-in page, nothing changed
        resp = await nobody.post(status_path, data={"csrf": csrf, "status": "resolved"})
        assert (resp.status_code, resp.headers["location"]) == (303, "/ui/signin")
    assert (await get(api, f"/v1/incidents/{incident_id}"))["status"] == "open"
    assert not [a for a, _, _ in await audit_of(api, Role.READ) if a == "incidents.update"]


async def test_sign_in_refusals_sign_out_and_revocation(api: Api) -> None:
    async with browser(api) as client:
        form = await client.get("/ui/signin")
        token = csrf_of(form)
        wrong = await client.post("/ui/signin", data={"csrf": token, "api_key": "bw_0123456789ab_nope"})
        assert wrong.status_code == 401
        assert "unknown or revoked" in wrong.text
        ingest = await sign_in(client, api.tokens[Role.INGEST])
        assert ingest.status_code == 403
        assert "cannot read incidents" in ingest.text
        client.cookies.clear()  # the form's double-submit cookie gone: a cross-site form post
        forged = await client.post("/ui/signin", data={"csrf": token, "api_key": api.tokens[Role.READ]})
        assert forged.status_code == 403
        assert not [c for c in forged.headers.get_list("set-cookie") if c.startswith(COOKIE + "=")]

        csrf = await signed_in(client, api, Role.READ)
        assert (await client.get("/ui/signin")).headers["location"] == "/ui"  # signed in already
        session = client.cookies[COOKIE]
        out = await client.post("/ui/signout", data={"csrf": csrf})
        assert (out.status_code, out.headers["location"]) == (303, "/ui/signin")
        assert COOKIE not in client.cookies
        client.cookies.set(COOKIE, session, domain="bleedwatch.test")  # a copy kept: signed out is out
        assert (await client.get("/ui")).headers["location"] == "/ui/signin"

    async with browser(api) as client:
        await signed_in(client, api, Role.TRIAGE)
        resp = await api.client.delete(f"/v1/keys/{key_id(api, Role.TRIAGE)}", headers=api.headers(Role.ADMIN))
        assert resp.status_code == 200, resp.text
        assert (await client.get("/ui")).headers["location"] == "/ui/signin"  # the revoked key's session ends

    signins = [a for a, _, _ in await audit_of(api, Role.READ) if a.startswith("ui.")]
    assert signins == ["ui.signin", "ui.signout"]


async def test_wrong_keys_spend_the_addresss_failure_budget(settings: Settings) -> None:
    """The sign-in form is one more way to guess keys: it takes the API's per-address budget."""
    limited = settings.model_copy(update={"auth_failures_burst": 2, "auth_failures_per_second": 0.001})
    async with running_api(limited) as api, browser(api) as client:
        resp = await client.get("/ui/signin")
        statuses = []
        for i in range(3):  # each answer is the form again, with a fresh token
            resp = await client.post("/ui/signin", data={"csrf": csrf_of(resp), "api_key": f"bw_0123456789a{i}_no"})
            statuses.append(resp.status_code)
        assert statuses == [401, 401, 429]
        refused = await client.post("/ui/signin", data={"csrf": csrf_of(resp), "api_key": api.tokens[Role.READ]})
        assert refused.status_code == 429  # a key this replica has not verified recently waits too
        assert int(refused.headers["retry-after"]) > 0


async def test_the_ui_stays_out_of_the_api_document(api: Api) -> None:
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]


def test_evidence_drawing_skips_what_is_not_a_range() -> None:
    finding = Finding(
        response_tokens=100,
        evidence={
            "sources": [
                {
                    "tenant": "acme",
                    "canary": False,
                    "coverage": 0.3,
                    "ranges": [
                        {"response": [10, 40], "source": [0, 30], "source_request_id": "s-1", "fingerprints": 7},
                        {"response": [90, 130]},  # past the end: clamped
                        {"response": ["a", 3]},
                        {"response": [50, 50]},
                        "nonsense",
                    ],
                },
                "nonsense",
            ]
        },
    )
    drawn = evidence.drawing(finding)
    assert drawn.tokens == 130  # the strip is at least as long as the furthest range
    (strip,) = drawn.strips
    assert [(b.start, b.end, b.fingerprints) for b in strip.bars] == [(10, 40, 7), (90, 130, None)]
    assert evidence.drawing(Finding(response_tokens=0, evidence={})) == evidence.Drawing(1, [])
