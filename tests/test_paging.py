"""Paging targets against local receivers that check each body the way the real service documents it.

- PagerDuty Events API v2 (developer.pagerduty.com/docs/events-api-v2/trigger-events,
  .../acknowledge-events, .../resolve-events): ``routing_key`` (32 characters), ``event_action``
  trigger/acknowledge/resolve, ``dedup_key`` (at most 255), and on a trigger ``payload.summary``
  (at most 1024), ``payload.source`` and ``payload.severity`` (critical, error, warning, info);
  answered 202 ``{"status": "success", ...}``, or 400 ``invalid event`` as PagerDuty does.
- Slack incoming webhooks (api.slack.com/messaging/webhooks): JSON with ``text`` and/or
  ``blocks``; answered ``ok``, or 400 ``invalid_payload``.
- Standard Webhooks: ``standardwebhooks.Webhook.verify`` over the raw body and headers.

Set ``BLEEDWATCH_PAGING_CAPTURE`` to a directory to keep the PagerDuty trigger and resolve bodies
of the lifecycle test (docs/paging.md shows a pair).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import func, select
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from service.auth.keys import Role
from service.cli import main
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.incidents import grouping
from service.incidents import store as incidents
from service.incidents.schemas import IncidentPatch, Status
from service.local_server import local_server
from service.webhooks import targets as paging
from service.webhooks.formats import Snapshot, summary
from service.webhooks.models import WebhookDelivery
from service.webhooks.sender import paging_routes
from tests.conftest import Api, running_api
from tests.incident_traffic import get, leak, patch
from tests.test_webhooks import deliveries
from tests.traffic import words

pytestmark = pytest.mark.anyio
PD_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"  # PagerDuty integration keys are 32 characters
HOOK_SECRET = "whsec_" + base64.b64encode(b"a-standard-webhooks-secret-32byt").decode()
PD_SEVERITIES = {"critical", "error", "warning", "info"}
PD_ACTIONS = {"trigger", "acknowledge", "resolve"}
PD_TOP_LEVEL = {"routing_key", "event_action", "dedup_key", "payload", "images", "links", "client", "client_url"}
PD_PAYLOAD = {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
SLACK_BLOCKS = {"section", "context", "header", "divider", "actions", "image", "rich_text"}
LEAKED = ("argparse", "csv")  # the texts the leaks carry: never in a notification


@dataclass
class Receiver:
    """A target on loopback: checks each request, keeps what it accepted, refuses what is invalid."""

    check: Callable[[dict[str, str], bytes], str | None]  # the problem with a request, or None
    ok: Callable[[bytes], Response]
    fail_with: int | None = None  # answer every request with this status instead
    url: str = ""
    accepted: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        if self.fail_with is not None:
            return Response(status_code=self.fail_with)
        problem = self.check(headers, body)
        with self.lock:
            if problem is not None:
                self.refused.append(problem)
                return JSONResponse({"status": "invalid event", "message": problem}, status_code=400)
            self.accepted.append((headers, body))
        return self.ok(body)

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [orjson.loads(body) for _, body in self.accepted]

    async def wait_for(self, count: int, seconds: float = 15) -> list[dict[str, Any]]:
        deadline = time.monotonic() + seconds
        while len(self.accepted) < count:
            assert not self.refused, self.refused
            assert time.monotonic() < deadline, f"{len(self.accepted)} of {count} events arrived"
            await asyncio.sleep(0.02)
        assert not self.refused, self.refused
        return self.bodies()


def _json(headers: dict[str, str], body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    if headers.get("content-type") != "application/json":
        return None, "Content-Type must be application/json"
    try:
        parsed = json.loads(body)
    except ValueError:
        return None, "body is not JSON"
    return (parsed, None) if isinstance(parsed, dict) else (None, "body is not a JSON object")


def check_pagerduty(headers: dict[str, str], body: bytes) -> str | None:
    event, problem = _json(headers, body)
    if event is None:
        return problem
    if unknown := set(event) - PD_TOP_LEVEL:
        return f"unknown fields {sorted(unknown)}"
    if not isinstance(event.get("routing_key"), str) or len(event["routing_key"]) != 32:
        return "routing_key must be a 32-character integration key"
    if event.get("event_action") not in PD_ACTIONS:
        return "event_action must be trigger, acknowledge or resolve"
    dedup = event.get("dedup_key")
    if not isinstance(dedup, str) or not 1 <= len(dedup) <= 255:
        return "dedup_key must be a string of at most 255 characters"
    if event["event_action"] != "trigger":
        return None
    payload = event.get("payload")
    if not isinstance(payload, dict):
        return "payload is required for a trigger"
    if unknown := set(payload) - PD_PAYLOAD:
        return f"unknown payload fields {sorted(unknown)}"
    summary = payload.get("summary")
    if not isinstance(summary, str) or not 1 <= len(summary) <= 1024:
        return "payload.summary is required (at most 1024 characters)"
    if not isinstance(payload.get("source"), str) or not payload["source"]:
        return "payload.source is required"
    if payload.get("severity") not in PD_SEVERITIES:
        return "payload.severity must be critical, error, warning or info"
    if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
        return "payload.custom_details must be an object"
    for link in event.get("links", []):
        if not isinstance(link, dict) or not str(link.get("href", "")).startswith("http"):
            return "links need an href"
    return None


def pagerduty_ok(body: bytes) -> Response:
    dedup_key = orjson.loads(body)["dedup_key"]
    return JSONResponse({"status": "success", "message": "Event processed", "dedup_key": dedup_key}, 202)


def check_slack(headers: dict[str, str], body: bytes) -> str | None:
    message, problem = _json(headers, body)
    if message is None:
        return problem
    text, blocks = message.get("text"), message.get("blocks")
    if not (isinstance(text, str) and text) and not (isinstance(blocks, list) and blocks):
        return "no_text: text or blocks is required"
    for block in blocks or []:
        if not isinstance(block, dict) or block.get("type") not in SLACK_BLOCKS:
            return "invalid_blocks: unknown block type"
        inner = [block["text"]] if "text" in block else block.get("elements", [])
        for element in inner:
            if element.get("type") not in ("mrkdwn", "plain_text") or not 0 < len(element.get("text", "")) <= 3000:
                return "invalid_blocks: a text object needs a type and 1 to 3000 characters"
    return None


def slack_ok(body: bytes) -> Response:
    return PlainTextResponse("ok")


def check_standard(headers: dict[str, str], body: bytes) -> str | None:
    try:
        Webhook(HOOK_SECRET).verify(body, headers)
    except WebhookVerificationError as exc:
        return f"signature: {exc}"
    if headers.get("content-type") != "application/json":
        return "Content-Type must be application/json"
    return None


def standard_ok(body: bytes) -> Response:
    return Response(status_code=204)


@pytest.fixture
def receivers() -> Iterator[dict[str, Receiver]]:
    made = {
        "pagerduty": Receiver(check_pagerduty, pagerduty_ok),
        "slack": Receiver(check_slack, slack_ok),
        "hook": Receiver(check_standard, standard_ok),
    }
    app = Starlette(routes=[Route(f"/{name}", r.handle, methods=["POST"]) for name, r in made.items()])
    with local_server(app) as url:
        for name, receiver in made.items():
            receiver.url = f"{url}/{name}"
        yield made


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch, receivers: dict[str, Receiver]) -> None:
    monkeypatch.setenv("TEST_PD_ROUTING_KEY", PD_KEY)
    monkeypatch.setenv("TEST_SLACK_URL", receivers["slack"].url)
    monkeypatch.setenv("TEST_HOOK_SECRET", HOOK_SECRET)


def with_targets(settings: Settings, receivers: dict[str, Receiver], **severity: str) -> Settings:
    targets = [
        {
            "type": "pagerduty",
            "name": "pd",
            "routing_key_env": "TEST_PD_ROUTING_KEY",
            "url": receivers["pagerduty"].url,
            "min_severity": severity.get("pd", "low"),
        },
        {"type": "slack", "name": "ops", "url_env": "TEST_SLACK_URL", "min_severity": severity.get("ops", "low")},
        {
            "type": "webhook",
            "name": "siem",
            "url": receivers["hook"].url,
            "secret_env": "TEST_HOOK_SECRET",
            "min_severity": severity.get("siem", "low"),
        },
    ]
    update = {
        "paging_targets": paging.parse(targets),
        "webhook_backoff_seconds": 0.05,
        "webhook_poll_seconds": 0.05,
        "public_url": "https://bleedwatch.example.net",
    }
    return settings.model_copy(update=update)


async def only_incident(api: Api) -> dict[str, Any]:
    (incident,) = (await get(api, "/v1/incidents"))["items"]
    assert isinstance(incident, dict)
    return incident


def no_tenant_text(receivers: dict[str, Receiver]) -> None:
    for receiver in receivers.values():
        for _, body in receiver.accepted:
            raw = body.decode()
            for text in LEAKED:
                assert words(text, 60, 70) not in raw
            assert "fingerprint" not in raw


def keep(directory: Path, events: dict[str, dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, event in events.items():
        (directory / f"{name}.json").write_bytes(orjson.dumps(event, option=orjson.OPT_INDENT_2))


async def test_open_escalate_acknowledge_resolve_pages_with_one_dedup_key(
    settings: Settings, receivers: dict[str, Receiver]
) -> None:
    pd, slack, hook = receivers["pagerduty"], receivers["slack"], receivers["hook"]
    async with running_api(with_targets(settings, receivers)) as api:
        await leak(api, "argparse", "acme", "globex", time.time(), length=15)  # low: opened
        incident = await only_incident(api)
        assert incident["severity"] == "low"
        # A body is built when it is sent, from the incident as it is then (WebhookDelivery), so
        # every target must have sent "opened" before the escalation for it to read LOW.
        for receiver in (pd, slack, hook):
            await receiver.wait_for(1)
        await leak(api, "csv", "acme", "initech", time.time(), length=40)  # high: escalated
        await pd.wait_for(2)
        path = f"/v1/incidents/{incident['id']}"
        await patch(api, path, {"status": "acknowledged"})
        await pd.wait_for(3)
        await patch(api, path, {"status": "resolved"})
        events = await pd.wait_for(4)
        await slack.wait_for(4)
        await hook.wait_for(4)

    dedup = str(incident["id"])
    assert [(e["event_action"], e["dedup_key"]) for e in events] == [
        ("trigger", dedup),
        ("trigger", dedup),
        ("acknowledge", dedup),
        ("resolve", dedup),
    ]
    opened, escalated, _, resolved = events
    assert (opened["payload"]["severity"], escalated["payload"]["severity"]) == ("warning", "error")
    assert escalated["payload"]["custom_details"]["event"] == "escalated"
    assert escalated["payload"]["custom_details"]["recipient_tenants"] == ["globex", "initech"]
    assert escalated["payload"]["source"] == "m-1m / pd-eu-1"
    assert escalated["links"][0]["href"] == f"https://bleedwatch.example.net/ui/incidents/{incident['id']}"
    assert escalated["client_url"] == escalated["links"][0]["href"]
    assert all(e["routing_key"] == PD_KEY for e in events)
    assert "payload" not in resolved

    texts = [m["text"] for m in slack.bodies()]
    assert [t.split("] ", 1)[0] for t in texts] == ["[LOW", "[HIGH", "[HIGH", "[HIGH"]
    assert "acknowledged" in texts[2]
    assert "resolved" in texts[3]
    page = f"https://bleedwatch.example.net/ui/incidents/{incident['id']}"
    assert all(f"<{page}|Open incident {incident['id']}>" in t for t in texts)

    signed = hook.bodies()
    assert [m["type"] for m in signed] == [
        "incident.opened",
        "incident.escalated",
        "incident.acknowledged",
        "incident.resolved",
    ]
    assert signed[-1]["data"]["incident"]["id"] == incident["id"]
    ids = [headers["webhook-id"] for headers, _ in hook.accepted]
    assert len(set(ids)) == 4  # one message id per event (the same on a retry)
    no_tenant_text(receivers)

    rows = await deliveries(settings)
    assert len(rows) == 12
    assert all(r.delivered_at is not None and r.attempts == 1 for r in rows)
    if capture := os.environ.get("BLEEDWATCH_PAGING_CAPTURE"):
        keep(Path(capture), {"pagerduty-trigger": opened, "pagerduty-resolve": resolved})


async def test_a_false_positive_resolves_the_page(settings: Settings, receivers: dict[str, Receiver]) -> None:
    pd = receivers["pagerduty"]
    async with running_api(with_targets(settings, receivers)) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        incident = await only_incident(api)
        await pd.wait_for(1)
        await patch(api, f"/v1/incidents/{incident['id']}", {"status": "false_positive"})
        events = await pd.wait_for(2)
        await receivers["hook"].wait_for(2)
    assert [(e["event_action"], e["dedup_key"]) for e in events] == [
        ("trigger", str(incident["id"])),
        ("resolve", str(incident["id"])),
    ]
    assert receivers["hook"].bodies()[-1]["type"] == "incident.false_positive"


async def test_routed_by_severity_and_a_failing_target_blocks_no_other(
    settings: Settings, receivers: dict[str, Receiver]
) -> None:
    pd, slack = receivers["pagerduty"], receivers["slack"]
    slack.fail_with = 503  # Slack is down throughout
    routed = with_targets(settings, receivers, pd="high", siem="critical")
    async with running_api(routed) as api:
        await leak(api, "argparse", "acme", "globex", time.time(), length=15)  # low: Slack only
        incident = await only_incident(api)
        await asyncio.sleep(0.3)
        assert pd.accepted == []
        await leak(api, "csv", "acme", "globex", time.time(), length=40)  # high: PagerDuty from here on
        await pd.wait_for(1)
        await patch(api, f"/v1/incidents/{incident['id']}", {"status": "resolved"})
        events = await pd.wait_for(2)
    assert [(e["event_action"], e["payload"]["severity"] if "payload" in e else None) for e in events] == [
        ("trigger", "error"),
        ("resolve", None),
    ]
    assert receivers["hook"].accepted == []  # critical only

    rows = await deliveries(settings)
    by_target = {t: [(r.event, r.delivered_at is not None) for r in rows if r.target == t] for t in ("pd", "ops")}
    assert by_target["pd"] == [("incident.escalated", True), ("incident.resolved", True)]
    assert [event for event, _ in by_target["ops"]] == ["incident.opened", "incident.escalated", "incident.resolved"]
    ops = [r for r in rows if r.target == "ops"]
    assert all(r.delivered_at is None for r in ops)
    assert ops[0].attempts >= 2
    assert ops[0].last_status == 503
    assert ops[1].attempts == 0  # waits for the one before it: Slack gets them in order, when it is back


async def test_a_refused_event_is_given_up_at_once(settings: Settings, receivers: dict[str, Receiver]) -> None:
    receivers["pagerduty"].check = lambda headers, body: "refused for the test"
    async with running_api(with_targets(settings, receivers)) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        await receivers["slack"].wait_for(1)
        for _ in range(200):
            (row,) = [r for r in await deliveries(settings) if r.target == "pd"]
            if row.failed_at is not None:
                break
            await asyncio.sleep(0.02)
    assert (row.attempts, row.last_status, row.last_error) == (1, 400, "HTTP 400")


async def test_no_event_for_a_change_rolled_back(settings: Settings, receivers: dict[str, Receiver]) -> None:
    configured = with_targets(settings, receivers, pd="low")
    async with running_api(configured.model_copy(update={"webhook_poll_seconds": 3600})) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        incident = await only_incident(api)
        await patch(api, f"/v1/incidents/{incident['id']}", {"status": "open"}, Role.TRIAGE)  # no change: no event
        resp = await api.client.patch(
            f"/v1/incidents/{incident['id']}", json={"status": "bogus"}, headers=api.headers(Role.TRIAGE)
        )
        assert resp.status_code == 422
    engine = make_engine(configured)
    sessions = make_sessionmaker(engine)
    try:
        async with sessions() as session:
            row = await incidents.get(session, incident["id"])
            assert row is not None
            await incidents.update(
                session,
                row,
                IncidentPatch(status=Status.RESOLVED),
                "test",
                grouping.Policy(3600, paging_routes(configured)),
            )
            pending = await session.scalar(select(func.count()).select_from(WebhookDelivery))
            assert pending == 6  # three opened, three resolved, inside the transaction
            await session.rollback()
        async with session_scope(sessions) as session:
            count = await session.scalar(select(func.count()).select_from(WebhookDelivery))
            status = await incidents.get(session, incident["id"])
            assert status is not None
            assert status.status == "open"
    finally:
        await engine.dispose()
    assert count == 3  # the opened events only: the resolve went with its transaction


def test_a_summary_without_tenant_names_counts_them_in_words() -> None:
    """Tenant names left out (``include_tenants = false``), one recipient tenant is not "tenants"."""
    now = datetime.now(UTC)
    incident = Snapshot(
        id=7,
        status="open",
        severity="high",
        model="m-1m",
        deployment=None,
        opened_at=now,
        first_seen_at=now,
        last_seen_at=now,
        finding_count=1,
        source_tenants=["acme", "initech"],
        recipient_tenants=["globex"],
        links={},
    )
    assert summary("incident.opened", incident, tenants=False) == (
        "[HIGH] bleedwatch incident 7 cross-tenant leak on m-1m: 1 finding; 2 source, 1 recipient tenant"
    )


def test_targets_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "BLEEDWATCH_PAGING_TARGETS",
        json.dumps(
            [
                {"type": "pagerduty", "name": "pd", "routing_key_env": "TEST_PD_ROUTING_KEY"},
                {"type": "slack", "name": "ops", "url_env": "TEST_SLACK_URL", "events": ["opened", "resolved"]},
            ]
        ),
    )
    monkeypatch.setenv("TEST_SLACK_URL", "https://hooks.slack.com/services/T0/B0/x")
    pd, ops = Settings().paging_targets
    assert isinstance(pd, paging.PagerDutyTarget)
    assert (pd.name, pd.min_severity, pd.url) == ("pd", "high", paging.PAGERDUTY_EVENTS_URL)
    assert (ops.name, ops.min_severity, ops.events) == ("ops", "low", ("opened", "resolved"))
    routes = paging_routes(Settings())
    assert [r.name for r in routes] == ["pd", "ops"]
    assert not routes[1].wants("acknowledged", "critical")
    assert routes[1].wants("opened", "low")
    assert not routes[0].wants("opened", "low")
    assert routes[0].wants("opened", "critical")


@pytest.mark.parametrize(
    ("targets", "env", "message"),
    [
        ("[{", {}, "must be a JSON list of targets"),
        ('[{"type": "opsgenie", "name": "x"}]', {}, r"\[0\] \(opsgenie 'x'\) type: one of pagerduty, slack, webhook"),
        ('[{"type": "pagerduty", "name": "pd"}]', {}, r"\[0\] \(pagerduty 'pd'\) routing_key_env: Field required"),
        (
            '[{"type": "slack", "name": "ops", "url_env": "TEST_SLACK_URL", "min_severity": "urgent"}]',
            {},
            r"min_severity: Input should be 'low', 'high' or 'critical'",
        ),
        (
            '[{"type": "slack", "name": "ops", "url_env": "TEST_SLACK_URL", "url": "https://x"}]',
            {},
            r"\[0\] \(slack 'ops'\) url: Extra inputs are not permitted",
        ),
        (
            '[{"type": "slack", "name": "a", "url_env": "TEST_SLACK_URL"}, '
            '{"type": "slack", "name": "a", "url_env": "TEST_SLACK_URL"}]',
            {},
            r"names must be unique .* \['a'\]",
        ),
        (
            '[{"type": "pagerduty", "name": "pd", "routing_key_env": "NOT_SET_ANYWHERE"}]',
            {},
            r"\[0\] \(pagerduty 'pd'\): the environment variable NOT_SET_ANYWHERE is not set",
        ),
        (
            '[{"type": "pagerduty", "name": "pd", "routing_key_env": "TEST_PD_ROUTING_KEY"}]',
            {"TEST_PD_ROUTING_KEY": "short"},
            "32-character PagerDuty integration key",
        ),
        (
            '[{"type": "slack", "name": "ops", "url_env": "TEST_SLACK_URL"}]',
            {"TEST_SLACK_URL": "http://plain.example.net/"},
            "TEST_SLACK_URL must hold the Slack incoming-webhook https:// URL",
        ),
        (
            '[{"type": "webhook", "name": "siem", "url": "https://siem.example.net", '
            '"secret_env": "TEST_HOOK_SECRET"}]',
            {"TEST_HOOK_SECRET": "not-base64-and-short"},
            "TEST_HOOK_SECRET must hold a Standard Webhooks secret",
        ),
    ],
)
def test_a_bad_target_is_refused_at_start_with_what_to_fix(
    monkeypatch: pytest.MonkeyPatch, targets: str, env: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("BLEEDWATCH_PAGING_TARGETS", targets)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        Settings()


def test_the_legacy_webhook_keeps_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLEEDWATCH_WEBHOOK_URL", "https://hooks.example.net/bleedwatch")
    monkeypatch.setenv("BLEEDWATCH_WEBHOOK_SECRET", "a-long-shared-webhook-secret")
    monkeypatch.setenv(
        "BLEEDWATCH_PAGING_TARGETS", '[{"type": "slack", "name": "webhook", "url_env": "TEST_SLACK_URL"}]'
    )
    monkeypatch.setenv("TEST_SLACK_URL", "https://hooks.slack.com/services/T0/B0/x")
    with pytest.raises(ValueError, match="'webhook' is BLEEDWATCH_WEBHOOK_URL's"):
        Settings()
    monkeypatch.delenv("BLEEDWATCH_PAGING_TARGETS")
    (legacy,) = paging_routes(Settings())
    assert (legacy.name, legacy.events) == ("webhook", frozenset({"opened"}))


def test_the_cli_says_what_to_fix_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BLEEDWATCH_PAGING_TARGETS", '[{"type": "slack", "name": "ops"}]')
    assert main(["serve"]) == 2
    assert (
        capsys.readouterr().err == "bleedwatch: BLEEDWATCH_PAGING_TARGETS: [0] (slack 'ops') url_env: Field required\n"
    )
