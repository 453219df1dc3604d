"""``GET /v1/findings`` says where triage left each finding, and can leave out what responders closed.

On every backend: a finding listed like a live one after its incident was marked false positive
sent on-call back to re-triage it; the listing now carries the incident's id and status and the
finding's own false-positive mark, and filters on them, one query a page.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import event

from service.auth.keys import Role
from tests.conftest import Api
from tests.incident_traffic import get, leak, patch

pytestmark = pytest.mark.anyio


async def findings(api: Api, **params: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await get(api, "/v1/findings", Role.READ, **params))["items"]
    return items


async def all_pages(api: Api, **params: str) -> list[int]:
    seen: list[int] = []
    cursor = None
    while True:
        page = await get(api, "/v1/findings", Role.READ, **params, **({"cursor": cursor} if cursor else {}))
        seen += [f["id"] for f in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen


async def incident_of(api: Api, finding_id: int) -> int:
    incident_id: int = (await get(api, f"/v1/findings/{finding_id}"))["incident_id"]
    return incident_id


async def test_a_finding_says_its_incident_status_and_false_positive_mark(api: Api) -> None:
    now = time.time()
    await leak(api, "argparse", "acme", "globex", now)  # one incident, two findings
    await leak(api, "csv", "acme", "umbrella", now + 1)
    await leak(api, "json", "hooli", "acme", now, deployment="pd-us-2")  # another incident
    newest, older, oldest = await findings(api)
    assert {f["incident_status"] for f in (newest, older, oldest)} == {"open"}
    assert not any(f["false_positive"] for f in (newest, older, oldest))
    by_deployment = {f["deployment"]: f["incident_id"] for f in (newest, older, oldest)}
    dismissed = by_deployment["pd-eu-1"]
    live = by_deployment["pd-us-2"]

    await patch(api, f"/v1/incidents/{dismissed}", {"status": "false_positive"})
    listed = {f["id"]: (f["incident_id"], f["incident_status"], f["false_positive"]) for f in await findings(api)}
    in_dismissed = sorted(i for i, (incident, _, _) in listed.items() if incident == dismissed)
    assert len(in_dismissed) == 2
    assert {listed[i] for i in in_dismissed} == {(dismissed, "false_positive", True)}
    (in_live,) = [i for i, (incident, _, _) in listed.items() if incident == live]
    assert listed[in_live] == (live, "open", False)
    one = await get(api, f"/v1/findings/{in_dismissed[0]}")
    assert (one["incident_id"], one["incident_status"], one["false_positive"]) == (dismissed, "false_positive", True)

    live_only = await findings(api, incident_status="open,acknowledged", false_positive="false")
    assert [f["id"] for f in live_only] == [in_live]
    assert [f["id"] for f in await findings(api, incident_status="false_positive")] == in_dismissed[::-1]
    assert len(await findings(api, incident_status="resolved")) == 0
    assert len(await findings(api, false_positive="true")) == 2

    # Reopened, the finding marked on its own stays dismissed while its incident is live again.
    await patch(api, f"/v1/incidents/{dismissed}", {"status": "open"})
    await patch(api, f"/v1/incidents/{dismissed}/findings/{in_dismissed[0]}", {"false_positive": True})
    live_only = await findings(api, incident_status="open,acknowledged", false_positive="false")
    assert sorted(f["id"] for f in live_only) == sorted([in_live, in_dismissed[1]])
    marked = await findings(api, incident_status="open", false_positive="true")
    assert [(f["id"], f["incident_status"], f["false_positive"]) for f in marked] == [(in_dismissed[0], "open", True)]


async def test_the_status_filter_refuses_what_is_not_a_status(api: Api) -> None:
    for value in ("closed", "open,", "open,,resolved", "OPEN", "open;resolved", "", "open\n"):
        resp = await api.client.get("/v1/findings", params={"incident_status": value}, headers=api.headers(Role.READ))
        assert resp.status_code == 422, value
        assert resp.json() == {
            "error": "invalid",
            "detail": "query.incident_status: one or more of open, acknowledged, resolved, false_positive, "
            "separated by commas",
        }
    schema = (await api.client.get("/openapi.json")).json()
    (param,) = [p for p in schema["paths"]["/v1/findings"]["get"]["parameters"] if p["name"] == "incident_status"]
    assert "^(open|acknowledged|resolved|false_positive)(,(" in str(param["schema"])
    resp = await api.client.get(
        "/v1/findings", params={"incident_status": "resolved,open,open"}, headers=api.headers(Role.READ)
    )
    assert resp.status_code == 200


async def test_pages_follow_the_filter_in_one_query_each(api: Api) -> None:
    now = time.time()
    for n, text in enumerate(("argparse", "csv", "json", "socket", "http", "difflib", "subprocess")):
        # Two deployments, alternating: two incidents with findings interleaved by id.
        await leak(api, text, "acme", f"t{n}", now + n, deployment="pd-eu-1" if n % 2 else "pd-us-2")
    everything = await all_pages(api, limit="100")
    assert len(everything) == 7
    dismissed = await incident_of(api, everything[0])
    await patch(api, f"/v1/incidents/{dismissed}", {"status": "false_positive"})
    live = [f["id"] for f in await findings(api) if f["incident_id"] != dismissed]
    assert len(live) == 3

    statements: list[str] = []
    app = api.client._transport.app  # type: ignore[attr-defined]
    engine = app.state.deps.engine.sync_engine

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM findings" in statement:
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        paged = await all_pages(api, limit="2", incident_status="open,acknowledged", false_positive="false")
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert paged == live
    assert len(statements) == 2  # two pages (2 + 1), one query each, the incident joined in
    assert all("JOIN incidents" in s for s in statements)
    # The second page bounds the link table as well, so PostgreSQL need not read it down to the cursor.
    assert "incident_findings.finding_id <" in statements[1]
    assert await all_pages(api, limit="1", incident_status="false_positive") == [i for i in everything if i not in live]
