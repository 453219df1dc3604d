from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from sqlalchemy.ext.asyncio import AsyncSession

from service import audit, cursors
from service.audit.log import filters
from service.auth.deps import Reader, Triage
from service.auth.keys import Caller
from service.deps import AppDeps, Deps, SessionDep
from service.errors import Conflict, Invalid, NotFound, common_responses, responses
from service.findings.severity import SeverityField
from service.incidents import impact, store
from service.incidents.models import Incident
from service.incidents.schemas import (
    FindingPatch,
    FindingTriage,
    Format,
    ImpactReport,
    IncidentDetail,
    IncidentPage,
    IncidentPatch,
    Order,
    Sort,
    Statuses,
    statuses,
)
from service.wire import Bound

router = APIRouter(prefix="/v1/incidents", tags=["incidents"], responses=common_responses())
IncidentId = Annotated[int, Path(ge=1, lt=2**63)]
CSV: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The impact report; text/csv (Accept: text/csv or ?format=csv) has one row per leaked response.",
        "content": {"text/csv": {"schema": {"type": "string"}}},
    }
}


def _aware(**values: datetime | None) -> None:
    for name, value in values.items():
        if value is not None and value.tzinfo is None:
            raise Invalid(f"{name}: give a timezone, e.g. 2026-12-02T10:00:00Z")


def _prefers_csv(accept: str) -> bool:
    """text/csv when the client's q-values rank it at least as high as JSON; JSON otherwise."""
    weights: dict[str, float] = {}
    for part in accept.lower().split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        weights[kind] = max(weights.get(kind, 0.0), weight)
    csv = weights.get("text/csv", 0.0)
    return csv > 0 and csv >= weights.get("application/json", 0.0)


async def _incident(session: Any, incident_id: int) -> Incident:
    incident = await store.get(session, incident_id)
    if incident is None:
        raise NotFound(f"no incident {incident_id}")
    return incident


@router.get("", response_model=IncidentPage, summary="Incidents, filtered and sorted")
async def list_incidents(
    session: SessionDep,
    caller: Reader,
    status: Annotated[
        Statuses | None, Query(description="Only incidents with one of these statuses, e.g. open,acknowledged.")
    ] = None,
    severity: SeverityField | None = None,
    model: Annotated[str | None, Query(max_length=256)] = None,
    deployment: Annotated[str | None, Query(max_length=256)] = None,
    tenant: Annotated[str | None, Query(max_length=128, description="On either side (source or recipient).")] = None,
    since: Annotated[Bound | None, Query(description="Leaked responses at or after (ISO 8601, timezone).")] = None,
    until: Annotated[Bound | None, Query(description="Leaked responses before.")] = None,
    sort: Sort = "last_seen_at",
    order: Order = "desc",
    cursor: Annotated[str | None, Query(pattern=cursors.KEY_ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> IncidentPage:
    """``status=open,acknowledged`` lists what is still to handle (one or more statuses, as
    ``GET /v1/findings``'s ``incident_status``). Pass ``next_cursor`` back as ``cursor`` (with the
    same sort and order) for the next page."""
    _aware(since=since, until=until)
    wanted = None if status is None else statuses(status)
    f = store.IncidentFilter(wanted, severity, model, deployment, tenant, since, until)
    rows, next_cursor = await store.page(session, f, sort, order, cursor, limit)
    tenants = await store.tenants_of(session, [r.id for r in rows])
    await audit.record(
        session,
        caller,
        "incidents.list",
        "incidents",
        {
            "filters": filters(
                status=",".join(wanted) if wanted else None,
                severity=severity,
                model=model,
                deployment=deployment,
                tenant=tenant,
                since=since,
                until=until,
            ),
            "ids": [r.id for r in rows],
        },
    )
    return IncidentPage(items=[store.to_out(r, tenants[r.id]) for r in rows], next_cursor=next_cursor)


@router.get("/{incident_id}", response_model=IncidentDetail, responses=responses(NotFound), summary="One incident")
async def get_incident(session: SessionDep, caller: Reader, incident_id: IncidentId) -> IncidentDetail:
    """With a summary of each finding and the whole timeline (who changed what, when)."""
    detail = await store.detail(session, await _incident(session, incident_id))
    tenants = audit.about(detail.source_tenants + detail.recipient_tenants)
    await audit.record(session, caller, "incidents.read", f"incident:{incident_id}", tenants)
    return detail


@router.get(
    "/{incident_id}/impact",
    response_model=ImpactReport,
    responses=CSV | responses(NotFound),
    summary="Who must be told: the incident's impact report",
)
async def get_impact(
    request: Request,
    session: SessionDep,
    caller: Reader,
    incident_id: IncidentId,
    format: Annotated[Format | None, Query(description="csv: one row per leaked response.")] = None,
) -> Any:
    """Source and recipient tenants, per pair the responses and their times; models, deployments, nodes;
    prompt lengths; and the deployment's engine integrity signals over the same time range."""
    as_csv = format == "csv" or (format is None and _prefers_csv(request.headers.get("accept", "")))
    incident = await _incident(session, incident_id)
    report = await impact.report(session, incident)
    await audit.record(
        session,
        caller,
        "incidents.impact",
        f"incident:{incident_id}",
        {"format": "csv" if as_csv else "json", "responses": report.response_count}
        | audit.about(report.source_tenants + report.recipient_tenants),
    )
    if as_csv:
        return Response(
            impact.to_csv(report),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="incident-{incident_id}-impact.csv"'},
        )
    return report


@router.patch(
    "/{incident_id}",
    response_model=IncidentDetail,
    responses=responses(NotFound, Conflict),
    summary="Change an incident's status, assignee or notes",
)
async def patch_incident(
    deps: Deps, session: SessionDep, caller: Triage, incident_id: IncidentId, body: IncidentPatch
) -> IncidentDetail:
    """open -> acknowledged -> resolved, or false_positive, which allowlists every finding's matched
    fingerprints (under its key id); back to open revokes those entries. Other steps are 409."""
    return await change(deps, session, caller, incident_id, body)


async def change(
    deps: AppDeps, session: AsyncSession, caller: Caller, incident_id: int, body: IncidentPatch
) -> IncidentDetail:
    """A responder's change, audited, with the allowlist caches told: the API's PATCH and the UI's
    forms (service/ui/routes.py) both go through here, so they cannot drift apart."""
    incident = await _incident(session, incident_id)
    changed = await store.update(session, incident, body, caller.key_id, deps.incident_policy)
    await audit.record(
        session,
        caller,
        "incidents.update",
        f"incident:{incident_id}",
        {"fields": sorted(body.model_fields_set), "status": incident.status},
    )
    result = await store.detail(session, incident)
    await session.commit()  # before the caches and the open-incident gauges reload what changed
    for key_id in changed:
        deps.known.invalidate(key_id)
    await deps.incidents.refresh_quietly()
    return result


@router.patch(
    "/{incident_id}/findings/{finding_id}",
    response_model=FindingTriage,
    responses=responses(NotFound),
    summary="Mark one finding of an incident a false positive, or undo it",
)
async def patch_finding(
    deps: Deps,
    session: SessionDep,
    caller: Triage,
    incident_id: IncidentId,
    finding_id: Annotated[int, Path(ge=1, lt=2**63)],
    body: FindingPatch,
) -> FindingTriage:
    """A false positive adds the fingerprints it matched to the allowlist of its key id (origin
    ``false_positive:finding:<id>``); false again revokes that entry."""
    incident = await _incident(session, incident_id)
    done = await store.set_finding_false_positive(session, incident, finding_id, body.false_positive, caller.key_id)
    if done is None:
        raise NotFound(f"no finding {finding_id} in incident {incident_id}")
    finding, changed = done
    await audit.record(
        session,
        caller,
        "incidents.finding.update",
        f"finding:{finding_id}",
        {"incident_id": incident_id, "false_positive": body.false_positive},
    )
    result = FindingTriage(incident=await store.out(session, incident), finding=finding)
    await session.commit()  # before the allowlist caches reload
    for key_id in changed:
        deps.known.invalidate(key_id)
    return result
