"""Findings in the database. Functions flush; the caller's session scope commits."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import Select, and_, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from service import cursors
from service.db import utcnow
from service.findings.draft import FindingDraft
from service.findings.models import Finding
from service.incidents.models import Incident, IncidentFinding

# Draft fields that are the index's business, not the finding's (service/findings/draft.py).
NOT_STORED = ("response_ref", "recipient_ref")
NO_REF = 1 << 62  # a finding stored before source_ref existed yields to an equally strong one that has it


def replaces(new: FindingDraft, old: FindingDraft) -> bool:
    """``upsert``'s ``WHERE``, term for term, for a replay that keeps findings in memory
    (bench/eval/offline.py)."""
    stronger = new.matched_fingerprints > old.matched_fingerprints or new.longest_run_tokens > old.longest_run_tokens
    as_strong = (new.matched_fingerprints, new.longest_run_tokens) == (old.matched_fingerprints, old.longest_run_tokens)
    return stronger or (as_strong and _ref(new) < _ref(old))


def _ref(draft: FindingDraft) -> int:
    return NO_REF if draft.source_ref is None else draft.source_ref


async def upsert(session: AsyncSession, draft: FindingDraft) -> tuple[int, bool] | None:
    """Insert a new finding; replace an existing one only with stronger evidence, or with evidence as
    strong from a source accepted earlier (``source_ref``: the order evaluations run in, which
    differs between replicas and Redis topologies, must not decide which source is named).

    Re-processing a batch, or two replicas evaluating the same response, therefore never
    duplicates a finding, and a finding never loses evidence it had. Returns its id and whether it
    was created, or None when the stored one was as strong (nothing changed).

    Grouping into incidents is the caller's (``service.findings.writer``), in the same session:
    this module only reads incidents, to list findings with their triage state.
    """
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    now = utcnow()
    values = {k: v for k, v in asdict(draft).items() if k not in NOT_STORED} | {"detected_at": now, "updated_at": now}
    stmt = insert(Finding).values(**values)
    changes = {
        k: stmt.excluded[k] for k in values if k not in ("detected_at", "recipient_tenant", "recipient_request_id")
    }
    upsert_stmt = stmt.on_conflict_do_update(
        index_elements=["recipient_tenant", "recipient_request_id"],
        set_=changes,
        where=(stmt.excluded.matched_fingerprints > Finding.matched_fingerprints)
        | (stmt.excluded.longest_run_tokens > Finding.longest_run_tokens)
        | (
            (stmt.excluded.matched_fingerprints == Finding.matched_fingerprints)
            & (stmt.excluded.longest_run_tokens == Finding.longest_run_tokens)
            & (stmt.excluded.source_ref < func.coalesce(Finding.source_ref, NO_REF))
        ),
    ).returning(Finding.id, Finding.detected_at, Finding.updated_at)
    row = (await session.execute(upsert_stmt)).one_or_none()
    if row is None:
        return None
    return row.id, row.detected_at == row.updated_at


@dataclass(frozen=True, slots=True)
class FindingFilter:
    since: datetime | None = None
    until: datetime | None = None
    recipient_tenant: str | None = None
    source_tenant: str | None = None
    model: str | None = None
    severity: str | None = None
    incident_status: tuple[str, ...] | None = None  # any of these; a finding without an incident has none
    false_positive: bool | None = None  # marked by a responder, on its own or with its incident


# The outer joins make the last three null for a finding outside any incident.
Listing = Select[Finding, int, str, bool]


@dataclass(frozen=True, slots=True)
class Triaged:
    """A finding and where triage left it: its incident (None only for findings stored before
    incidents existed) and whether a responder marked it a false positive."""

    finding: Finding
    incident_id: int | None
    incident_status: str | None
    false_positive: bool


def _triaged(before: int | None = None) -> Listing:
    """Findings with their incident link and status, in the same query: a finding is in at most one
    incident (``incident_findings``' key is the finding id), so the join never repeats a finding
    and keyset pagination on ``Finding.id`` stays exact.

    ``before`` (a cursor) bounds both sides: PostgreSQL carries equalities across a join, not
    ``<``, and without the link's own bound a merge join read ``incident_findings`` down from its
    newest row to the cursor on every page (48 ms at 100,000 rows in, not 1 ms)."""
    link = IncidentFinding.finding_id == Finding.id
    q = select(Finding, IncidentFinding.incident_id, Incident.status, IncidentFinding.false_positive)
    if before is not None:
        link = and_(link, IncidentFinding.finding_id < before)
        q = q.where(Finding.id < before)
    return q.outerjoin(IncidentFinding, link).outerjoin(Incident, Incident.id == IncidentFinding.incident_id)


def _row(row: tuple[Finding, int | None, str | None, bool | None]) -> Triaged:
    finding, incident_id, status, false_positive = row
    return Triaged(finding, incident_id, status, bool(false_positive))


def _filtered(f: FindingFilter, before: int | None = None) -> Listing:
    q = _triaged(before)
    if f.since is not None:
        q = q.where(Finding.detected_at >= f.since)
    if f.until is not None:
        q = q.where(Finding.detected_at < f.until)
    for column, value in (
        (Finding.recipient_tenant, f.recipient_tenant),
        (Finding.source_tenant, f.source_tenant),
        (Finding.model, f.model),
        (Finding.severity, f.severity),
    ):
        if value is not None:
            q = q.where(column == value)
    if f.incident_status is not None:
        q = q.where(Incident.status.in_(f.incident_status))
    if f.false_positive is not None:
        # IS NOT TRUE: a finding outside any incident (no link row) is no false positive either.
        q = q.where(
            IncidentFinding.false_positive.is_(True)
            if f.false_positive
            else IncidentFinding.false_positive.is_not(True)
        )
    return q


async def page(
    session: AsyncSession, f: FindingFilter, cursor: str | None, limit: int
) -> tuple[list[Triaged], str | None]:
    """Newest first by id (ids grow with detection time); the cursor is the last id seen. One query a page."""
    q = _filtered(f, None if cursor is None else cursors.decode_id(cursor))
    rows = [_row(r) for r in await session.execute(q.order_by(Finding.id.desc()).limit(limit + 1))]
    next_cursor = cursors.encode_id(rows[limit - 1].finding.id) if len(rows) > limit else None
    return rows[:limit], next_cursor


async def get(session: AsyncSession, finding_id: int) -> Triaged | None:
    row = (await session.execute(_triaged().where(Finding.id == finding_id))).one_or_none()
    return None if row is None else _row(row)
