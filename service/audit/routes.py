from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import String, cast, or_, select

from bleedwatch.names import NAME_PATTERN
from service import cursors
from service.audit import log
from service.audit.models import AuditEntry
from service.audit.schemas import AuditOut, AuditPage
from service.auth.deps import Admin
from service.deps import SessionDep
from service.errors import Invalid, common_responses
from service.wire import Bound

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=common_responses())
Text = Annotated[str | None, Query(max_length=128, pattern=NAME_PATTERN)]


@router.get("", response_model=AuditPage, summary="The audit log, newest first")
async def list_audit(
    session: SessionDep,
    caller: Admin,
    key_id: Annotated[str | None, Query(max_length=32, pattern=r"^[A-Za-z0-9_.:-]+$")] = None,
    action: Annotated[str | None, Query(max_length=48, pattern=r"^[a-z0-9_.]+$")] = None,
    target: Text = None,
    tenant: Annotated[
        str | None, Query(max_length=128, description="Entries about this tenant (matched by hash).")
    ] = None,
    request_id: Annotated[str | None, Query(max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")] = None,
    since: Annotated[Bound | None, Query(description="At or after (ISO 8601 with a timezone).")] = None,
    until: Annotated[Bound | None, Query(description="Before.")] = None,
    cursor: Annotated[str | None, Query(pattern=cursors.ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Every read of findings and incidents and every change, with who, when and the HTTP request id.

    Reading the audit log is itself recorded.
    """
    for name, moment in (("since", since), ("until", until)):
        if moment is not None and moment.tzinfo is None:
            raise Invalid(f"{name}: give a timezone, e.g. 2026-12-02T10:00:00Z")
    q = select(AuditEntry)
    for column, value in (
        (AuditEntry.key_id, key_id),
        (AuditEntry.action, action),
        (AuditEntry.target, target),
        (AuditEntry.request_id, request_id),
    ):
        if value is not None:
            q = q.where(column == value)
    if tenant is not None:
        hashed = log.tenant_hash(tenant)
        q = q.where(or_(AuditEntry.target == f"tenant:{hashed}", cast(AuditEntry.detail, String).contains(hashed)))
    if since is not None:
        q = q.where(AuditEntry.at >= since)
    if until is not None:
        q = q.where(AuditEntry.at < until)
    if cursor is not None:
        q = q.where(AuditEntry.id < cursors.decode_id(cursor))
    rows = list((await session.scalars(q.order_by(AuditEntry.id.desc()).limit(limit + 1))).all())
    await log.record(
        session,
        caller,
        "audit.list",
        "audit",
        {
            "filters": log.filters(
                key_id=key_id,
                action=action,
                target=target,
                tenant=tenant,
                request_id=request_id,
                since=since,
                until=until,
            )
        },
    )
    next_cursor = cursors.encode_id(rows[limit - 1].id) if len(rows) > limit else None
    return AuditPage(items=[AuditOut.model_validate(r) for r in rows[:limit]], next_cursor=next_cursor)
