from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from bleedwatch.names import DEPLOYMENT_ID_PATTERN
from service import audit
from service.auth.deps import Admin, Reader
from service.deployments import store
from service.deployments.models import Deployment
from service.deployments.rules import RuleSet
from service.deployments.schemas import DeploymentConfig, DeploymentOut, DeploymentPage
from service.deps import Deps, SessionDep
from service.errors import Forbidden, Invalid, NotFound, Unauthorized, responses

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])
CREATED: dict[int | str, dict[str, Any]] = {201: {"model": DeploymentOut, "description": "created"}}
DeploymentId = Annotated[str, Path(min_length=1, max_length=256, pattern=DEPLOYMENT_ID_PATTERN)]


def _out(row: Deployment, rules: RuleSet) -> DeploymentOut:
    config = store.config_of(row)
    violations = rules.evaluate(config)
    return DeploymentOut(
        **config.model_dump(),
        id=row.id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        updated_by=row.updated_by,
        at_risk=bool(violations),
        violations=violations,
    )


@router.put(
    "/{deployment_id}",
    response_model=DeploymentOut,
    summary="Report a deployment's serving config",
    responses=CREATED | responses(Unauthorized, Forbidden, Invalid),
)
async def put_deployment(
    deployment_id: DeploymentId,
    config: DeploymentConfig,
    deps: Deps,
    session: SessionDep,
    caller: Admin,
    response: Response,
) -> DeploymentOut:
    """Create (201) or replace (200) the config; the answer lists the risk rules it violates.

    Engines or deploy pipelines call this at every rollout; the risk gauges are recomputed at once.
    """
    row, created = await store.put(session, deployment_id, config, caller.key_id)
    await audit.record(session, caller, "deployments.put", f"deployment:{deployment_id}", {"created": created})
    await session.commit()  # before the risk gauges reload
    response.status_code = 201 if created else 200
    await deps.risk.refresh_quietly()
    return _out(row, deps.risk.rules)


@router.get("", response_model=DeploymentPage, responses=responses(Unauthorized, Forbidden, Invalid, NotFound))
async def list_deployments(
    deps: Deps,
    session: SessionDep,
    _: Reader,
    at_risk: Annotated[bool | None, Query(description="Only deployments violating (or not) some rule.")] = None,
    rule: Annotated[str | None, Query(max_length=64, description="Only deployments violating this rule.")] = None,
    cursor: Annotated[
        str | None, Query(max_length=256, pattern=DEPLOYMENT_ID_PATTERN, description="The last id of the page before.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> DeploymentPage:
    """By id. Pass ``next_cursor`` back as ``cursor`` for the next page."""
    if rule is not None and rule not in deps.risk.rules.names:
        # Not an empty list, which reads as nothing at risk; and not a 422: the rules come from a
        # file, so the schema cannot list them, and any name it admits is a valid question.
        raise NotFound(f"rule: no such rule; the rules are {', '.join(sorted(deps.risk.rules.names))}")
    rows = await store.after(session, cursor)
    items: list[DeploymentOut] = []
    next_cursor = None
    for row in rows:
        out = _out(row, deps.risk.rules)
        if at_risk is not None and out.at_risk != at_risk:
            continue
        if rule is not None and all(v.rule != rule for v in out.violations):
            continue
        if len(items) == limit:
            next_cursor = items[-1].id
            break
        items.append(out)
    return DeploymentPage(items=items, next_cursor=next_cursor)


@router.get("/{deployment_id}", response_model=DeploymentOut, responses=responses(Unauthorized, Forbidden, NotFound))
async def get_deployment(deployment_id: DeploymentId, deps: Deps, session: SessionDep, _: Reader) -> DeploymentOut:
    row = await store.get(session, deployment_id)
    if row is None:
        raise NotFound(f"no deployment {deployment_id}")
    return _out(row, deps.risk.rules)
