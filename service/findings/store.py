"""Findings in the database. Functions flush; the caller's session scope commits."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import Select, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from service import cursors
from service.db import utcnow
from service.findings.draft import FindingDraft
from service.findings.models import Finding

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

    Grouping into incidents is the caller's (``service.findings.writer``), in the same session,
    so this module stays free of incidents.
    """
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    now = utcnow()
    values = asdict(draft) | {"detected_at": now, "updated_at": now}
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


def _filtered(f: FindingFilter) -> Select[Finding]:
    q = select(Finding)
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
    return q


async def page(
    session: AsyncSession, f: FindingFilter, cursor: str | None, limit: int
) -> tuple[list[Finding], str | None]:
    """Newest first by id (ids grow with detection time); the cursor is the last id seen."""
    q = _filtered(f)
    if cursor is not None:
        q = q.where(Finding.id < cursors.decode_id(cursor))
    rows = list((await session.scalars(q.order_by(Finding.id.desc()).limit(limit + 1))).all())
    next_cursor = cursors.encode_id(rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor


async def get(session: AsyncSession, finding_id: int) -> Finding | None:
    return await session.get(Finding, finding_id)
