"""The outbox: a row per event and target, written in the transaction of the change it tells of.

Callers are the places where an incident's state really changes (service/incidents/grouping.py
opens and escalates, service/incidents/store.py acknowledges, resolves, marks false positive and
reopens), so an event exists exactly when its change committed.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import utcnow
from service.webhooks.models import WebhookDelivery
from service.webhooks.targets import Route

INCIDENT_OPENED = "incident.opened"
INCIDENT_ESCALATED = "incident.escalated"
INCIDENT_ACKNOWLEDGED = "incident.acknowledged"
INCIDENT_RESOLVED = "incident.resolved"
INCIDENT_FALSE_POSITIVE = "incident.false_positive"
INCIDENT_REOPENED = "incident.reopened"
# Events that follow up on a page: a target that heard of the incident hears of these even if its
# severity threshold would not let it (the severity an incident is listed with can fall after a purge).
FOLLOW_UPS = frozenset({INCIDENT_ACKNOWLEDGED, INCIDENT_RESOLVED, INCIDENT_FALSE_POSITIVE, INCIDENT_REOPENED})


def short(event: str) -> str:
    """``incident.opened`` -> ``opened``: the name targets list in their ``events``."""
    return event.removeprefix("incident.")


async def enqueue(
    session: AsyncSession, incident_id: int, severity: str, event: str, routes: tuple[Route, ...]
) -> list[str]:
    """One row per target that wants this event at this severity; returns their names. Flushes nothing:
    the rows go with the caller's transaction."""
    if not routes:
        return []
    wanted = [r.name for r in routes if r.wants(short(event), severity)]
    if event in FOLLOW_UPS:
        told = set(
            (
                await session.scalars(
                    select(WebhookDelivery.target).where(WebhookDelivery.incident_id == incident_id).distinct()
                )
            ).all()
        )
        wanted += [r.name for r in routes if r.name in told and r.name not in wanted and short(event) in r.events]
    now = utcnow()
    for target in wanted:
        session.add(
            WebhookDelivery(
                event=event, target=target, incident_id=incident_id, created_at=now, attempts=0, next_attempt_at=now
            )
        )
    return wanted
