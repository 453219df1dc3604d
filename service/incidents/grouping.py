"""Findings into incidents, in the transaction that stores the finding (``service.findings.writer``).

A finding joins the open (or acknowledged) incident of its model and deployment whose span of
leaked responses, widened by the quiet gap on both sides, holds the finding's response time;
otherwise it opens a new incident. Resolved and false-positive incidents are never joined: the
same leak coming back is a new incident, linked by model and deployment.

On PostgreSQL, a transaction-scoped advisory lock per (model, deployment), taken in sorted order
before any finding is written, keeps two replicas from opening two incidents for one leak; on
SQLite the database's single writer does the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import utcnow
from service.findings.severity import SEVERITY_RANK
from service.incidents.models import Incident, IncidentEvent, IncidentFinding, IncidentTenant
from service.logging import current_request_id
from service.webhooks import outbox
from service.webhooks.targets import Route

if TYPE_CHECKING:
    from service.findings.draft import FindingDraft

SYSTEM_ACTOR = "bleedwatch"
ACTIVE = ("open", "acknowledged")
_LOCK_NAMESPACE = b"bleedwatch.incident-group"


@dataclass(frozen=True, slots=True)
class Policy:
    """How findings group and who is paged; built from settings in the lifespan and passed to each caller."""

    quiet_seconds: int = 3600
    # Who hears of incident events (service/webhooks/targets.py); empty = nobody, no outbox rows.
    routes: tuple[Route, ...] = ()


async def notify(session: AsyncSession, incident: Incident, event: str, policy: Policy) -> None:
    """Queue ``event`` for the targets that want it, in this transaction (service/webhooks/outbox.py)."""
    await outbox.enqueue(session, incident.id, incident.severity, event, policy.routes)


def _group_key(model: str, deployment: str | None) -> int:
    digest = hashlib.blake2b(f"{model}\0{deployment or ''}".encode(), digest_size=8, key=_LOCK_NAMESPACE).digest()
    return int.from_bytes(digest, "big", signed=True)


async def lock_groups(session: AsyncSession, drafts: list[FindingDraft]) -> None:
    """Serialise incident grouping per (model, deployment) across replicas until this transaction ends."""
    if session.get_bind().dialect.name != "postgresql":
        return
    for key in sorted({_group_key(d.model, d.deployment) for d in drafts}):
        await session.execute(select(func.pg_advisory_xact_lock(key)))


def event(session: AsyncSession, incident_id: int, actor: str, action: str, **detail: object) -> None:
    session.add(
        IncidentEvent(
            incident_id=incident_id,
            at=utcnow(),
            actor=actor,
            action=action,
            detail=detail,
            request_id=current_request_id(),
        )
    )


async def _joinable(session: AsyncSession, draft: FindingDraft, quiet_seconds: int) -> Incident | None:
    gap = timedelta(seconds=quiet_seconds)
    q = select(Incident).where(
        Incident.model == draft.model,
        Incident.status.in_(ACTIVE),
        Incident.first_seen_at <= draft.response_at + gap,
        Incident.last_seen_at >= draft.response_at - gap,
    )
    q = q.where(Incident.deployment.is_(None) if draft.deployment is None else Incident.deployment == draft.deployment)
    return (await session.scalars(q.order_by(Incident.last_seen_at.desc(), Incident.id.desc()).limit(1))).first()


def _absorb(incident: Incident, draft: FindingDraft) -> None:
    rank = SEVERITY_RANK.get(draft.severity, 1)
    if rank > incident.severity_rank:
        incident.severity, incident.severity_rank = draft.severity, rank
    incident.first_seen_at = min(incident.first_seen_at, draft.response_at)
    incident.last_seen_at = max(incident.last_seen_at, draft.response_at)
    incident.updated_at = utcnow()


def draft_tenants(draft: FindingDraft) -> set[tuple[str, str]]:
    sides = {(draft.recipient_tenant, "recipient"), (draft.source_tenant, "source")}
    for source in draft.evidence.get("sources", ()):
        tenant = source.get("tenant") if isinstance(source, dict) else None
        if isinstance(tenant, str):
            sides.add((tenant, "source"))
    return sides


async def add_tenants(session: AsyncSession, incident_id: int, sides: set[tuple[str, str]]) -> None:
    if not sides:
        return
    rows = [{"incident_id": incident_id, "tenant": t, "side": s} for t, s in sorted(sides)]
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    await session.execute(insert(IncidentTenant).values(rows).on_conflict_do_nothing())


async def attach(session: AsyncSession, finding_id: int, draft: FindingDraft, policy: Policy) -> Incident:
    """Put a created or extended finding into its incident; flushes, the caller's scope commits.

    ``policy`` is passed by the caller (the lifespan builds it from settings) so no session carries hidden state.
    """
    link = await session.get(IncidentFinding, finding_id)
    if link is not None:  # extended with more evidence: the incident may rise in severity
        incident = await session.get(Incident, link.incident_id)
        if incident is not None:
            before = incident.severity
            _absorb(incident, draft)
            event(
                session, incident.id, SYSTEM_ACTOR, "finding_extended", finding_id=finding_id, severity=draft.severity
            )
            if incident.severity != before:
                event(session, incident.id, SYSTEM_ACTOR, "severity", before=before, after=incident.severity)
                await notify(session, incident, outbox.INCIDENT_ESCALATED, policy)
            await add_tenants(session, incident.id, draft_tenants(draft))
            await session.flush()
            return incident
        await session.delete(link)
        await session.flush()
    incident = await _joinable(session, draft, policy.quiet_seconds)
    now = utcnow()
    if incident is None:
        incident = Incident(
            model=draft.model,
            deployment=draft.deployment,
            status="open",
            severity=draft.severity,
            severity_rank=SEVERITY_RANK.get(draft.severity, 1),
            opened_at=now,
            first_seen_at=draft.response_at,
            last_seen_at=draft.response_at,
            updated_at=now,
            finding_count=0,
        )
        session.add(incident)
        await session.flush()
        event(session, incident.id, SYSTEM_ACTOR, "opened", finding_id=finding_id, severity=draft.severity)
        await notify(session, incident, outbox.INCIDENT_OPENED, policy)
    else:
        before = incident.severity
        _absorb(incident, draft)
        if incident.severity != before:
            event(session, incident.id, SYSTEM_ACTOR, "severity", before=before, after=incident.severity)
            await notify(session, incident, outbox.INCIDENT_ESCALATED, policy)
    incident.finding_count += 1
    session.add(IncidentFinding(finding_id=finding_id, incident_id=incident.id, attached_at=now, false_positive=False))
    event(session, incident.id, SYSTEM_ACTOR, "finding_added", finding_id=finding_id, severity=draft.severity)
    await add_tenants(session, incident.id, draft_tenants(draft))
    await session.flush()
    return incident
