"""Incidents in the database: listing, detail, lifecycle, false positives. Functions flush; the
caller's session scope commits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, and_, exists, or_, select
from sqlalchemy import update as sql_update
from sqlalchemy.ext.asyncio import AsyncSession

from bleedwatch.fingerprint.encoding import from_signed
from service import cursors
from service.allowlist import store as allowlist
from service.db import utcnow
from service.errors import Conflict
from service.findings.models import Finding
from service.incidents import grouping
from service.incidents.models import Incident, IncidentEvent, IncidentFinding, IncidentTenant
from service.incidents.schemas import (
    TRANSITIONS,
    EventOut,
    FindingSummary,
    IncidentDetail,
    IncidentOut,
    IncidentPatch,
    Order,
    Sort,
    Status,
)
from service.webhooks import outbox

CLOSED = (Status.RESOLVED, Status.FALSE_POSITIVE)
# The event a responder's status change sends to paging targets (docs/paging.md).
STATUS_EVENTS = {
    Status.ACKNOWLEDGED: outbox.INCIDENT_ACKNOWLEDGED,
    Status.RESOLVED: outbox.INCIDENT_RESOLVED,
    Status.FALSE_POSITIVE: outbox.INCIDENT_FALSE_POSITIVE,
    Status.OPEN: outbox.INCIDENT_REOPENED,
}
MAX_DETAIL_FINDINGS = 5000
_SORT_COLUMNS = {
    "opened_at": Incident.opened_at,
    "last_seen_at": Incident.last_seen_at,
    "severity": Incident.severity_rank,
}


@dataclass(frozen=True, slots=True)
class IncidentFilter:
    status: tuple[str, ...] | None = None  # any of these
    severity: str | None = None
    model: str | None = None
    deployment: str | None = None
    tenant: str | None = None
    since: datetime | None = None  # incidents whose leaked responses reach past this
    until: datetime | None = None  # ... and start before this


def _filtered(f: IncidentFilter) -> Any:
    q = select(Incident)
    if f.status is not None:
        q = q.where(Incident.status.in_(f.status))
    for column, value in (
        (Incident.severity, f.severity),
        (Incident.model, f.model),
        (Incident.deployment, f.deployment),
    ):
        if value is not None:
            q = q.where(column == value)
    if f.tenant is not None:
        q = q.where(exists().where(IncidentTenant.incident_id == Incident.id, IncidentTenant.tenant == f.tenant))
    if f.since is not None:
        q = q.where(Incident.last_seen_at >= f.since)
    if f.until is not None:
        q = q.where(Incident.first_seen_at < f.until)
    return q


def _cursor_key(incident: Incident, sort: Sort) -> int | datetime:
    value: int | datetime = getattr(incident, "severity_rank" if sort == "severity" else sort)
    return value


async def page(
    session: AsyncSession, f: IncidentFilter, sort: Sort, order: Order, cursor: str | None, limit: int
) -> tuple[list[Incident], str | None]:
    """Keyset pagination on (sort column, id): the cursor is the last row's (sort key, id), read under
    this request's sort, so any cursor the schema admits is a position, never an error."""
    column = _SORT_COLUMNS[sort]
    q = _filtered(f)
    if cursor is not None:
        raw, last_id = cursors.decode_key_id(cursor)
        # Ranks are 1 to 3 in a 32-bit column: any key past them is a position past every rank.
        key = max(-1, min(raw, 4)) if sort == "severity" else cursors.to_time(raw)
        if order == "desc":
            q = q.where(or_(column < key, and_(column == key, Incident.id < last_id)))
        else:
            q = q.where(or_(column > key, and_(column == key, Incident.id > last_id)))
    ordering = (column.desc(), Incident.id.desc()) if order == "desc" else (column.asc(), Incident.id.asc())
    rows = list((await session.scalars(q.order_by(*ordering).limit(limit + 1))).all())
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1]
        next_cursor = cursors.encode_key_id(_cursor_key(last, sort), last.id)
    return rows[:limit], next_cursor


async def tenants_of(session: AsyncSession, ids: list[int]) -> dict[int, tuple[list[str], list[str]]]:
    out: dict[int, tuple[list[str], list[str]]] = {i: ([], []) for i in ids}
    if not ids:
        return out
    rows = await session.execute(
        select(IncidentTenant.incident_id, IncidentTenant.tenant, IncidentTenant.side)
        .where(IncidentTenant.incident_id.in_(ids))
        .order_by(IncidentTenant.tenant)
    )
    for incident_id, tenant, side in rows:
        out[incident_id][0 if side == "source" else 1].append(tenant)
    return out


def to_out(incident: Incident, tenants: tuple[list[str], list[str]]) -> IncidentOut:
    return IncidentOut(
        id=incident.id,
        status=Status(incident.status),
        severity=incident.severity,
        model=incident.model,
        deployment=incident.deployment,
        assignee=incident.assignee,
        notes=incident.notes,
        opened_at=incident.opened_at,
        first_seen_at=incident.first_seen_at,
        last_seen_at=incident.last_seen_at,
        updated_at=incident.updated_at,
        closed_at=incident.closed_at,
        finding_count=incident.finding_count,
        source_tenants=tenants[0],
        recipient_tenants=tenants[1],
    )


async def out(session: AsyncSession, incident: Incident) -> IncidentOut:
    return to_out(incident, (await tenants_of(session, [incident.id]))[incident.id])


async def get(session: AsyncSession, incident_id: int) -> Incident | None:
    return await session.get(Incident, incident_id)


async def findings_of(session: AsyncSession, incident_id: int) -> list[tuple[Finding, IncidentFinding]]:
    rows = await session.execute(
        select(Finding, IncidentFinding)
        .join(IncidentFinding, IncidentFinding.finding_id == Finding.id)
        .where(IncidentFinding.incident_id == incident_id)
        .order_by(Finding.response_at, Finding.id)
    )
    return [(f, link) for f, link in rows]


def summary(finding: Finding, link: IncidentFinding) -> FindingSummary:
    return FindingSummary(
        id=finding.id,
        recipient_tenant=finding.recipient_tenant,
        recipient_request_id=finding.recipient_request_id,
        source_tenant=finding.source_tenant,
        response_at=finding.response_at,
        detected_at=finding.detected_at,
        node=finding.node,
        prompt_tokens=finding.prompt_tokens,
        severity=finding.severity,
        matched_fingerprints=finding.matched_fingerprints,
        longest_run_tokens=finding.longest_run_tokens,
        false_positive=link.false_positive,
        allowlist_entry_id=link.allowlist_entry_id,
    )


async def detail(session: AsyncSession, incident: Incident) -> IncidentDetail:
    found = await findings_of(session, incident.id)
    events = (
        await session.scalars(
            select(IncidentEvent).where(IncidentEvent.incident_id == incident.id).order_by(IncidentEvent.id)
        )
    ).all()
    base = await out(session, incident)
    return IncidentDetail(
        **base.model_dump(),
        findings=[summary(f, link) for f, link in found[:MAX_DETAIL_FINDINGS]],
        timeline=[EventOut.model_validate(e) for e in events],
    )


# --- lifecycle and false positives ------------------------------------------------------------


async def _claimed(session: AsyncSession, link: IncidentFinding, false_positive: bool) -> bool:
    """Set the link's mark unless another request did first. The conditional UPDATE waits for the
    row (PostgreSQL) or the database (SQLite) and reads it as committed, so a double click makes one
    allowlist entry, not two of which undoing revokes only the last."""
    result = await session.execute(
        sql_update(IncidentFinding)
        .where(IncidentFinding.finding_id == link.finding_id, IncidentFinding.false_positive != false_positive)
        .values(false_positive=false_positive)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], result).rowcount == 1:
        return True
    await session.refresh(link)
    return False


async def _mark(
    session: AsyncSession, incident: Incident, finding: Finding, link: IncidentFinding, by: str, via: str
) -> str | None:
    if not await _claimed(session, link, True):
        return None
    values = from_signed(finding.matched_values or [])
    entry = await allowlist.add(
        session,
        finding.key_id,
        f"false positive: finding {finding.id} (incident {incident.id})",
        f"false_positive:finding:{finding.id}",
        values,
        by,
    )
    link.false_positive, link.false_positive_via, link.allowlist_entry_id = True, via, entry.id
    grouping.event(
        session,
        incident.id,
        by,
        "finding_false_positive",
        finding_id=finding.id,
        allowlist_entry_id=entry.id,
        fingerprints=entry.fingerprint_count,
        via=via,
    )
    return finding.key_id


async def _unmark(
    session: AsyncSession, incident: Incident, finding: Finding, link: IncidentFinding, by: str
) -> str | None:
    if not await _claimed(session, link, False):
        return None
    if link.allowlist_entry_id is not None:
        await allowlist.revoke(session, link.allowlist_entry_id, by)
    grouping.event(
        session, incident.id, by, "finding_restored", finding_id=finding.id, allowlist_entry_id=link.allowlist_entry_id
    )
    link.false_positive, link.false_positive_via, link.allowlist_entry_id = False, None, None
    return finding.key_id


async def set_finding_false_positive(
    session: AsyncSession, incident: Incident, finding_id: int, false_positive: bool, by: str
) -> tuple[FindingSummary, set[str]] | None:
    """Mark or unmark one finding; returns its summary and the key ids whose allowlist changed."""
    for finding, link in await findings_of(session, incident.id):
        if finding.id != finding_id:
            continue
        key_id = None
        if false_positive and not link.false_positive:
            key_id = await _mark(session, incident, finding, link, by, "finding")
        elif not false_positive and link.false_positive:
            key_id = await _unmark(session, incident, finding, link, by)
        changed = set() if key_id is None else {key_id}
        if changed:
            incident.updated_at = utcnow()
        await session.flush()
        return summary(finding, link), changed
    return None


async def update(
    session: AsyncSession, incident: Incident, patch: IncidentPatch, by: str, policy: grouping.Policy
) -> set[str]:
    """Apply a responder's change; returns the key ids whose allowlist changed. 409 on a step not allowed."""
    fields = patch.model_fields_set
    changed: set[str] = set()
    now = utcnow()
    touched = False
    if "status" in fields and patch.status is not None and patch.status != incident.status:
        before, after = Status(incident.status), patch.status
        if after not in TRANSITIONS[before]:
            *others, last = sorted(TRANSITIONS[before])
            allowed = f"{', '.join(others)} or {last}" if others else last
            raise Conflict(f"status: an incident that is {before} cannot become {after}, only {allowed}")
        # Two responders at once: the first to change the row wins, the other is told (before, no
        # step would be checked against what the other had just made of it).
        claimed = await session.execute(
            sql_update(Incident)
            .where(Incident.id == incident.id, Incident.status == before.value)
            .values(status=after.value)
            .execution_options(synchronize_session=False)
        )
        if cast(CursorResult[Any], claimed).rowcount != 1:
            raise Conflict(f"status: the incident changed meanwhile and is no longer {before}; read it again")
        for finding, link in await findings_of(session, incident.id):
            key_id = None
            if after == Status.FALSE_POSITIVE and not link.false_positive:
                key_id = await _mark(session, incident, finding, link, by, "incident")
            elif before == Status.FALSE_POSITIVE and link.false_positive and link.false_positive_via == "incident":
                key_id = await _unmark(session, incident, finding, link, by)
            if key_id is not None:
                changed.add(key_id)
        incident.status = after.value
        incident.closed_at = now if after in CLOSED else None
        grouping.event(session, incident.id, by, "status", before=before.value, after=after.value)
        await grouping.notify(session, incident, STATUS_EVENTS[after], policy)
        touched = True
    if "assignee" in fields and patch.assignee != incident.assignee:
        grouping.event(session, incident.id, by, "assignee", before=incident.assignee, after=patch.assignee)
        incident.assignee = patch.assignee
        touched = True
    if "notes" in fields and patch.notes != incident.notes:
        grouping.event(session, incident.id, by, "notes", notes=patch.notes)
        incident.notes = patch.notes
        touched = True
    if touched:
        incident.updated_at = now
    await session.flush()
    return changed
