from __future__ import annotations

import time

from fastapi import APIRouter

from service.auth.deps import Admin
from service.config import Settings
from service.deps import Deps, IndexDep, SessionDep
from service.errors import common_responses
from service.retention import jobs
from service.retention.schemas import PurgeIn, PurgeResult

router = APIRouter(prefix="/v1/tenants", tags=["retention"], responses=common_responses())


def index_note(settings: Settings) -> str:
    kept = settings.generation_seconds * settings.index_generations
    return (
        "its documents, queued batches and held findings are deleted, and a tombstone refuses any exchange "
        "or finding from before the purge (a queued batch, a gateway's retry or spool replay); the "
        "fingerprint index cannot be searched by tenant, so its fingerprints' entries stay, unable to make "
        f"or explain a finding without their documents, and expire at most {kept} s after the tenant's "
        "last exchange (BLEEDWATCH_RETENTION_SECONDS and BLEEDWATCH_INDEX_GENERATIONS)"
    )


NOT_PURGED = (
    "audit entries (they name tenants only by hash), allowlist entries learnt from false positives "
    "(fingerprints under a key id, no tenant), canaries and API keys limited to the tenant (configuration: "
    "revoke them yourself), and responders' free text in incident notes"
)


@router.post("/purge", response_model=PurgeResult, summary="Delete everything held about one tenant")
async def purge(deps: Deps, session: SessionDep, index: IndexDep, caller: Admin, body: PurgeIn) -> PurgeResult:
    """Findings where the tenant is recipient or source, its place in other findings' evidence and in
    incidents (incidents left empty are deleted), and what the index holds about it (first, so that
    nothing in flight writes a finding after the database is purged). Audited, by tenant hash."""
    from_index = await jobs.purge_tenant_index(index, body.tenant, time.time())
    purged = await jobs.purge_tenant(session, body.tenant, caller.key_id)
    await session.commit()  # before the open-incident gauges reload
    await deps.incidents.refresh_quietly()
    return PurgeResult(
        tenant=body.tenant,
        findings_deleted=purged.findings_deleted,
        findings_scrubbed=purged.findings_scrubbed,
        incidents_deleted=purged.incidents_deleted,
        incidents_updated=purged.incidents_updated,
        documents_deleted=from_index.documents,
        batches_rewritten=from_index.batches,
        held_findings_removed=from_index.held_findings,
        index=index_note(deps.settings),
        not_purged=NOT_PURGED,
    )
