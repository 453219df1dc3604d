"""Pruning by age, and purging one tenant. Functions flush; the caller's session scope commits.

``prune`` runs in one transaction per call. On PostgreSQL it first takes a transaction-scoped
advisory lock (``pg_try_advisory_xact_lock``) of its schema: a replica that does not get it skips
this round, so at most one replica prunes at a time, while an installation in another schema of
the same database (a second deployment, a test worker) prunes its own; it also sets
``bleedwatch.retention = 'on'`` for the transaction, the only way past the audit log's append-only
trigger. SQLite is one process.

What is kept how long (days, ``BLEEDWATCH_*_RETENTION_DAYS``):
- findings, by detection time; their incident links go with them;
- closed incidents (resolved, false positive), by last change, with their timeline; open and
  acknowledged incidents are never pruned: someone still has to close them;
- audit entries, by time;
- webhook deliveries, once delivered or given up, after ``OUTBOX_KEEP_DAYS``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import delete, func, or_, select, text, type_coerce
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm.attributes import flag_modified

from service import audit
from service.audit.log import SYSTEM
from service.audit.models import AuditEntry
from service.db import session_scope, utcnow
from service.findings.models import Finding
from service.findings.severity import SEVERITY_RANK
from service.incidents import grouping
from service.incidents.models import Incident, IncidentEvent, IncidentFinding, IncidentTenant
from service.index.base import Index
from service.ingest import envelope
from service.periodic import Periodic
from service.webhooks.models import WebhookDelivery

log = logging.getLogger("bleedwatch.retention")
PRUNE_LOCK_CLASS = 0x6277_0001  # "bw" + 1: the prune job's advisory locks, one per schema
OUTBOX_KEEP_DAYS = 7
CHUNK = 500  # ids per IN (...) list
CLOSED = ("resolved", "false_positive")


@dataclass(frozen=True, slots=True)
class Retention:
    findings_days: int
    incidents_days: int
    audit_days: int


@dataclass(frozen=True, slots=True)
class Pruned:
    findings: int
    incidents: int
    audit_entries: int
    webhook_deliveries: int


def _pg(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _count(result: Any) -> int:
    return int(result.rowcount or 0)


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


async def _delete_incidents(session: AsyncSession, ids: list[int]) -> None:
    """Incidents with their links, tenants, timeline and pending notifications (no FK cascade on SQLite)."""
    for chunk in _chunks(ids):
        for table in (IncidentFinding, IncidentTenant, IncidentEvent):
            await session.execute(delete(table).where(table.incident_id.in_(chunk)))
        await session.execute(delete(WebhookDelivery).where(WebhookDelivery.incident_id.in_(chunk)))
        await session.execute(delete(Incident).where(Incident.id.in_(chunk)))


async def _delete_findings(session: AsyncSession, ids: list[int]) -> None:
    for chunk in _chunks(ids):
        await session.execute(delete(IncidentFinding).where(IncidentFinding.finding_id.in_(chunk)))
        await session.execute(delete(Finding).where(Finding.id.in_(chunk)))


async def prune(
    session: AsyncSession, retention: Retention, now: datetime | None = None, actor: str = SYSTEM
) -> Pruned | None:
    """Delete what is past its retention; None if another replica holds the prune lock. ``actor``: the
    audit log's key id, the retention job's or ``bleedwatch prune``'s."""
    now = now or utcnow()
    if _pg(session):
        lock = func.pg_try_advisory_xact_lock(PRUNE_LOCK_CLASS, func.hashtext(func.current_schema()))
        if not await session.scalar(select(lock)):
            return None
        await session.execute(text("SET LOCAL bleedwatch.retention = 'on'"))
    old_findings = list(
        await session.scalars(
            select(Finding.id).where(Finding.detected_at < now - timedelta(days=retention.findings_days))
        )
    )
    await _delete_findings(session, old_findings)
    old_incidents = list(
        await session.scalars(
            select(Incident.id).where(
                Incident.status.in_(CLOSED), Incident.updated_at < now - timedelta(days=retention.incidents_days)
            )
        )
    )
    await _delete_incidents(session, old_incidents)
    audit_entries = _count(
        await session.execute(delete(AuditEntry).where(AuditEntry.at < now - timedelta(days=retention.audit_days)))
    )
    done_before = now - timedelta(days=OUTBOX_KEEP_DAYS)
    deliveries = _count(
        await session.execute(
            delete(WebhookDelivery).where(
                or_(WebhookDelivery.delivered_at < done_before, WebhookDelivery.failed_at < done_before)
            )
        )
    )
    pruned = Pruned(len(old_findings), len(old_incidents), audit_entries, deliveries)
    await audit.record(session, actor, "retention.prune", "database", asdict(pruned) | asdict(retention))
    return pruned


# --- purging one tenant -----------------------------------------------------------------------


def _mentions(session: AsyncSession, tenant: str) -> Any:
    """Findings whose evidence lists the tenant as one of its sources."""
    if _pg(session):
        return type_coerce(Finding.evidence, JSONB).contains({"sources": [{"tenant": tenant}]})
    return text(
        "EXISTS (SELECT 1 FROM json_each(findings.evidence, '$.sources') AS s "
        "WHERE json_extract(s.value, '$.tenant') = :purged_tenant)"
    ).bindparams(purged_tenant=tenant)


async def _rebuild(session: AsyncSession, incident: Incident) -> bool:
    """Recompute an incident from the findings it still has; False (and deleted) if it has none."""
    rows = (
        await session.scalars(
            select(Finding)
            .join(IncidentFinding, IncidentFinding.finding_id == Finding.id)
            .where(IncidentFinding.incident_id == incident.id)
        )
    ).all()
    if not rows:
        await _delete_incidents(session, [incident.id])
        return False
    top = max(rows, key=lambda f: SEVERITY_RANK.get(f.severity, 1))
    incident.severity, incident.severity_rank = top.severity, SEVERITY_RANK.get(top.severity, 1)
    incident.first_seen_at = min(f.response_at for f in rows)
    incident.last_seen_at = max(f.response_at for f in rows)
    incident.finding_count = len(rows)
    incident.updated_at = utcnow()
    await session.execute(delete(IncidentTenant).where(IncidentTenant.incident_id == incident.id))
    sides: set[tuple[str, str]] = set()
    for f in rows:
        sides |= {(f.recipient_tenant, "recipient"), (f.source_tenant, "source")}
        sides |= {(s["tenant"], "source") for s in f.evidence.get("sources", ()) if isinstance(s.get("tenant"), str)}
    await grouping.add_tenants(session, incident.id, sides)
    return True


@dataclass(frozen=True, slots=True)
class Purged:
    findings_deleted: int
    findings_scrubbed: int
    incidents_deleted: int
    incidents_updated: int


async def purge_tenant(session: AsyncSession, tenant: str, by: str) -> Purged:
    """Delete every finding where the tenant is recipient or top source, drop it from other findings'
    evidence, and rebuild (or delete, if left empty) every incident that involved it. Audited."""
    direct = list(
        await session.scalars(
            select(Finding.id).where(or_(Finding.recipient_tenant == tenant, Finding.source_tenant == tenant))
        )
    )
    affected: set[int] = set()
    for chunk in _chunks(direct):
        affected |= set(
            await session.scalars(select(IncidentFinding.incident_id).where(IncidentFinding.finding_id.in_(chunk)))
        )
    affected |= set(await session.scalars(select(IncidentTenant.incident_id).where(IncidentTenant.tenant == tenant)))
    await _delete_findings(session, direct)
    scrubbed = 0
    for finding in (await session.scalars(select(Finding).where(_mentions(session, tenant)))).all():
        sources = [s for s in finding.evidence.get("sources", ()) if s.get("tenant") != tenant]
        finding.evidence = {**finding.evidence, "sources": sources}
        flag_modified(finding, "evidence")  # the top source (source_tenant, source_request_ids) is not the tenant
        scrubbed += 1
        link = await session.get(IncidentFinding, finding.id)
        if link is not None:
            affected.add(link.incident_id)
    await session.execute(delete(IncidentTenant).where(IncidentTenant.tenant == tenant))
    deleted = updated = 0
    for incident_id in sorted(affected):
        incident = await session.get(Incident, incident_id)
        if incident is None:
            continue
        if await _rebuild(session, incident):
            updated += 1
            grouping.event(session, incident.id, by, "tenant_purged", findings_left=incident.finding_count)
        else:
            deleted += 1
    await session.flush()
    purged = Purged(len(direct), scrubbed, deleted, updated)
    await audit.record(session, by, "tenants.purge", f"tenant:{audit.tenant_hash(tenant)}", asdict(purged))
    return purged


# --- purging one tenant from the index (Redis, or the embedded one) ----------------------------


@dataclass(frozen=True, slots=True)
class IndexPurged:
    documents: int  # metadata of its prompts and responses
    batches: int  # queued or dead-lettered batches that carried its exchanges (rewritten without them)
    held_findings: int  # findings waiting in the outbox that involved it (dropped, or scrubbed of it)


def without_tenant_exchanges(tenant: str, item: bytes) -> bytes | None:
    """A queue item (service/ingest/envelope.py) without the tenant's exchanges, the others keeping
    their refs; None if nothing is left."""
    request_id, refs, body = envelope.unwrap(item)
    try:
        batch = orjson.loads(body)
        exchanges = batch["exchanges"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return item  # not a batch: nothing of a tenant to find in it
    keep = [i for i, ex in enumerate(exchanges) if not (isinstance(ex, dict) and ex.get("tenant") == tenant)]
    if len(keep) == len(exchanges):
        return item
    if not keep:
        return None
    kept_refs = None if refs is None or len(refs) != len(exchanges) else [refs[i] for i in keep]
    return envelope.wrap(request_id, kept_refs, orjson.dumps({**batch, "exchanges": [exchanges[i] for i in keep]}))


def without_tenant_finding(tenant: str, item: bytes) -> bytes | None:
    """A held finding (service/findings/writer.py) without the tenant: dropped where it is recipient or
    top source, its evidence scrubbed where it is one more source (as ``purge_tenant`` does)."""
    try:
        held = orjson.loads(item)
        draft = held["draft"]
        sources = draft.get("evidence", {}).get("sources", [])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return item
    if tenant in (draft.get("recipient_tenant"), draft.get("source_tenant")):
        return None
    kept = [s for s in sources if not (isinstance(s, dict) and s.get("tenant") == tenant)]
    if len(kept) == len(sources):
        return item
    draft["evidence"] = {**draft["evidence"], "sources": kept}
    return orjson.dumps(held)


async def purge_tenant_index(index: Index, tenant: str, now: float) -> IndexPurged:
    """What the index holds about the tenant: tombstoned first (``Index.purged``), so that from then
    on any work about its past is refused (a batch a worker holds, a gateway's late retry or spool
    replay, a finding held for the database); then its documents, queued batches and held findings.
    Run before the database purge, so that no finding is written after it."""
    documents = await index.purge_tenant(tenant, now)
    batches = await index.queue().rewrite(functools.partial(without_tenant_exchanges, tenant))
    held = await index.outbox().rewrite(functools.partial(without_tenant_finding, tenant))
    log.info("tenant_purged_from_index", extra={"documents": documents, "batches": batches, "held_findings": held})
    return IndexPurged(documents, batches, held)


class RetentionJob:
    """Prunes every ``interval_seconds`` (first run after at most a minute), on every replica that
    gets the lock; a failed round is logged and retried next time."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], retention: Retention, interval_seconds: float
    ) -> None:
        self._sessions = sessions
        self._retention = retention
        self._loop = Periodic("retention", self.run_once, interval_seconds, first_delay=min(interval_seconds, 60.0))

    async def run_once(self) -> Pruned | None:
        async with session_scope(self._sessions) as session:
            pruned = await prune(session, self._retention)
        if pruned is not None:
            log.info("retention_pruned", extra=asdict(pruned))
        return pruned

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
