from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from service import audit, metrics
from service.auth.deps import Admin
from service.canaries import store
from service.canaries.schemas import CanaryIn, CanaryOut, CanaryPage
from service.deps import Deps, SessionDep
from service.errors import Forbidden, Invalid, NotFound, PayloadTooLarge, Unauthorized, responses
from service.wire import decode_text

router = APIRouter(prefix="/v1/canaries", tags=["canaries"])


@router.post(
    "",
    status_code=201,
    response_model=CanaryOut,
    responses=responses(Unauthorized, Forbidden, PayloadTooLarge, Invalid),
)
async def register(deps: Deps, session: SessionDep, caller: Admin, body: CanaryIn) -> CanaryOut:
    """From now on, any other tenant's response containing this text is a critical finding.

    Canary text never counts as common and outlives the retention window until revoked.
    """
    text = decode_text(body.text, "text", deps.ingestor.limits.max_fingerprints)
    canary = await store.add(session, body.key_id, body.tenant, body.label, text, caller.key_id)
    await audit.record(
        session, caller, "canaries.register", f"canary:{canary.id}", {"tenant": audit.tenant_hash(body.tenant)}
    )
    await session.commit()  # before the canary cache reloads
    deps.known.invalidate(body.key_id)
    metrics.CANARY_PROBES.inc()
    return CanaryOut.model_validate(canary)


@router.get("", response_model=CanaryPage, responses=responses(Unauthorized, Forbidden))
async def list_canaries(
    session: SessionDep, _: Admin, key_id: Annotated[str | None, Query(pattern=r"^[0-9a-f]{16}$")] = None
) -> CanaryPage:
    return CanaryPage(items=[CanaryOut.model_validate(c) for c in await store.canaries(session, key_id)])


@router.delete("/{canary_id}", response_model=CanaryOut, responses=responses(Unauthorized, Forbidden, NotFound))
async def revoke(
    deps: Deps, session: SessionDep, caller: Admin, canary_id: Annotated[int, Path(ge=1, lt=2**63)]
) -> CanaryOut:
    canary = await store.revoke(session, canary_id)
    if canary is None:
        raise NotFound(f"no canary {canary_id}")
    await audit.record(session, caller, "canaries.revoke", f"canary:{canary_id}")
    out = CanaryOut.model_validate(canary)
    await session.commit()  # before the canary cache reloads
    deps.known.invalidate(out.key_id)
    return out
