"""The outbox: a row per notification, written in the transaction of what it notifies about."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from service.db import utcnow
from service.webhooks.models import WebhookDelivery

INCIDENT_OPENED = "incident.opened"


def enqueue(session: AsyncSession, incident_id: int, event: str) -> None:
    now = utcnow()
    session.add(WebhookDelivery(event=event, incident_id=incident_id, created_at=now, attempts=0, next_attempt_at=now))
