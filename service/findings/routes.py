from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from service import audit, cursors
from service.auth.deps import Reader
from service.deps import SessionDep
from service.errors import Forbidden, Invalid, NotFound, Unauthorized, responses
from service.findings import store
from service.findings.schemas import TRIAGE, FindingOut, FindingPage
from service.findings.severity import SeverityField
from service.incidents.schemas import Statuses, statuses
from service.wire import Bound

router = APIRouter(prefix="/v1/findings", tags=["findings"])


@router.get("", response_model=FindingPage, responses=responses(Unauthorized, Forbidden, Invalid))
async def list_findings(
    session: SessionDep,
    caller: Reader,
    since: Annotated[Bound | None, Query(description="Detected at or after (ISO 8601 or epoch seconds).")] = None,
    until: Annotated[Bound | None, Query(description="Detected before.")] = None,
    recipient_tenant: Annotated[str | None, Query(max_length=128)] = None,
    source_tenant: Annotated[str | None, Query(max_length=128)] = None,
    model: Annotated[str | None, Query(max_length=256)] = None,
    severity: SeverityField | None = None,
    incident_status: Annotated[
        Statuses | None,
        Query(description="Only findings whose incident has one of these statuses, e.g. open,acknowledged."),
    ] = None,
    false_positive: Annotated[
        bool | None, Query(description="false: leave out findings a responder marked false positive.")
    ] = None,
    cursor: Annotated[str | None, Query(pattern=cursors.ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> FindingPage:
    """Newest first, each with its incident's id and status and its own false-positive mark.
    ``incident_status=open,acknowledged&false_positive=false`` leaves out what responders closed.
    Pass ``next_cursor`` back as ``cursor`` (with the same filters) for the next page."""
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise Invalid(f"{name}: give a timezone, e.g. 2026-12-02T10:00:00Z")
    wanted = None if incident_status is None else statuses(incident_status)
    filters = store.FindingFilter(
        since, until, recipient_tenant, source_tenant, model, severity, wanted, false_positive
    )
    rows, next_cursor = await store.page(session, filters, cursor, limit)
    recorded = audit.filters(
        since=since,
        until=until,
        recipient_tenant=recipient_tenant,
        source_tenant=source_tenant,
        model=model,
        severity=severity,
        incident_status=",".join(wanted) if wanted else None,
        false_positive=false_positive,
    )
    ids = [r.finding.id for r in rows]
    await audit.record(session, caller, "findings.list", "findings", {"filters": recorded, "ids": ids})
    return FindingPage(items=[_out(r) for r in rows], next_cursor=next_cursor)


@router.get("/{finding_id}", response_model=FindingOut, responses=responses(Unauthorized, Forbidden, NotFound))
async def get_finding(
    session: SessionDep, caller: Reader, finding_id: Annotated[int, Path(ge=1, lt=2**63)]
) -> FindingOut:
    row = await store.get(session, finding_id)
    if row is None:
        raise NotFound(f"no finding {finding_id}")
    tenants = audit.about([row.finding.recipient_tenant, row.finding.source_tenant])
    await audit.record(session, caller, "findings.read", f"finding:{finding_id}", tenants)
    return _out(row)


def _out(row: store.Triaged) -> FindingOut:
    stored = {name: getattr(row.finding, name) for name in FindingOut.model_fields.keys() - TRIAGE}
    return FindingOut(
        **stored, incident_id=row.incident_id, incident_status=row.incident_status, false_positive=row.false_positive
    )
