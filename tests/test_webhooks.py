"""Incident webhooks against a real HTTP receiver on loopback: signed, retried, durable, bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.local_server import free_port, local_server
from service.webhooks.models import WebhookDelivery
from service.webhooks.sender import verify
from tests.conftest import running_api
from tests.incident_traffic import leak
from tests.traffic import words

pytestmark = pytest.mark.anyio
SECRET = "a-long-shared-webhook-secret"


@dataclass
class Receiver:
    url: str = ""
    fail_first: int = 0
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        with self.lock:
            self.received.append((dict(request.headers), body))
            failing = len(self.received) <= self.fail_first
        return Response(status_code=500 if failing else 204)

    async def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} webhooks arrived"
            await asyncio.sleep(0.02)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    with local_server(Starlette(routes=[Route("/hook", r.handle, methods=["POST"])])) as url:
        r.url = f"{url}/hook"
        yield r


def with_webhook(settings: Settings, url: str, **extra: Any) -> Settings:
    update = {
        "webhook_url": url,
        "webhook_secret": SECRET,
        "webhook_backoff_seconds": 0.05,
        "webhook_poll_seconds": 0.05,
        "public_url": "https://bleedwatch.example.net",
    }
    return settings.model_copy(update=update | extra)


async def deliveries(settings: Settings) -> list[WebhookDelivery]:
    engine = make_engine(settings)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            return list((await session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.id))).all())
    finally:
        await engine.dispose()


async def test_a_new_incident_is_signed_retried_and_delivered(settings: Settings, receiver: Receiver) -> None:
    receiver.fail_first = 2
    async with running_api(with_webhook(settings, receiver.url)) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        await leak(api, "csv", "acme", "globex", time.time())  # joins the incident: no second webhook
        await receiver.wait_for(3)
        await asyncio.sleep(0.3)
    assert len(receiver.received) == 3
    (row,) = await deliveries(settings)
    assert (row.attempts, row.last_status, row.failed_at) == (3, 204, None)
    assert row.delivered_at is not None
    for headers, body in receiver.received:
        assert headers["x-bleedwatch-event"] == "incident.opened"
        assert headers["x-bleedwatch-delivery"] == str(row.id)  # the same on every retry
        assert headers["content-type"] == "application/json"
        assert verify(SECRET, headers["x-bleedwatch-timestamp"], body, headers["x-bleedwatch-signature"])
        assert not verify(
            "another-secret-entirely", headers["x-bleedwatch-timestamp"], body, headers["x-bleedwatch-signature"]
        )
        assert not verify(SECRET, headers["x-bleedwatch-timestamp"], body + b" ", headers["x-bleedwatch-signature"])
    payload = orjson.loads(receiver.received[-1][1])
    incident = payload["incident"]
    assert payload["event"] == "incident.opened"
    assert (incident["source_tenants"], incident["recipient_tenants"]) == (["acme"], ["globex"])
    assert incident["finding_count"] == 2  # as the incident is when it is sent
    assert payload["links"]["impact"] == f"https://bleedwatch.example.net/v1/incidents/{incident['id']}/impact"
    raw = receiver.received[-1][1].decode()
    assert words("argparse", 60, 64) not in raw  # never text (bleedwatch has none to send)
    assert "fingerprints" not in raw


async def test_a_restart_does_not_lose_a_notification(settings: Settings, receiver: Receiver) -> None:
    asleep = with_webhook(settings, receiver.url, webhook_poll_seconds=3600)  # the sender never gets to it
    async with running_api(asleep) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        await asyncio.sleep(0.1)
    assert receiver.received == []
    (pending,) = await deliveries(settings)
    assert pending.delivered_at is None
    async with running_api(with_webhook(settings, receiver.url)):  # the restarted service
        await receiver.wait_for(1)
    (row,) = await deliveries(settings)
    assert row.delivered_at is not None


async def test_retries_are_bounded(settings: Settings) -> None:
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: connection refused every time
    async with running_api(with_webhook(settings, dead, webhook_max_attempts=3, webhook_backoff_seconds=0.01)) as api:
        await leak(api, "argparse", "acme", "globex", time.time())
        for _ in range(200):
            (row,) = await deliveries(settings)
            if row.failed_at is not None:
                break
            await asyncio.sleep(0.02)
    assert (row.attempts, row.delivered_at, row.last_error) == (3, None, "ConnectError")
    assert row.failed_at is not None


def test_a_webhook_url_needs_a_secret() -> None:
    with pytest.raises(ValueError, match="BLEEDWATCH_WEBHOOK_SECRET"):
        Settings(webhook_url="https://hooks.example.net/bleedwatch")
