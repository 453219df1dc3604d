from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from service import cursors, metrics
from service.auth.deps import Ingest, Reader
from service.deps import Deps, SessionDep
from service.errors import Forbidden, Invalid, PayloadTooLarge, Unauthorized, Unavailable, responses
from service.signals import store
from service.signals.schemas import MAX_EVENTS, SignalBatch, SignalKind, SignalOut, SignalPage, SignalResult
from service.wire import Bound

router = APIRouter(prefix="/v1/signals", tags=["signals"])

for _kind in SignalKind:  # every series exists at 0 before its first event
    metrics.ENGINE_SIGNALS.labels(_kind.value)


@router.post(
    "",
    status_code=202,
    response_model=SignalResult,
    summary="Report engine integrity events",
    responses=responses(Unauthorized, Forbidden, PayloadTooLarge, Invalid, Unavailable),
)
async def post_signals(batch: SignalBatch, deps: Deps, session: SessionDep, caller: Ingest) -> SignalResult:
    """Events an engine noticed itself, per deployment and node. Idempotent on ``event_id``.

    They describe shared infrastructure, not a tenant's traffic, so a key limited to tenants
    may not send them.
    """
    if caller.tenants is not None:
        raise Forbidden("engine signals need an ingest key not limited to tenants")
    if len(batch.events) > MAX_EVENTS:
        raise PayloadTooLarge(f"events: {len(batch.events)} in one batch, more than {MAX_EVENTS}; split the batch")
    horizon = time.time() + deps.settings.max_future_seconds
    for i, event in enumerate(batch.events):
        if event.ts.tzinfo is None:
            raise Invalid(f"events[{i}].ts: give a timezone (e.g. 2026-12-02T10:00:00Z) or epoch seconds")
        if event.ts.timestamp() > horizon:
            raise Invalid(f"events[{i}].ts: more than {deps.settings.max_future_seconds} s in the future")
    stored = await store.insert(session, batch.events, caller.key_id)
    await session.commit()  # counted once stored
    for kind, count in stored:
        metrics.ENGINE_SIGNALS.labels(kind).inc(count)
    return SignalResult(accepted=len(stored), duplicates=len(batch.events) - len(stored))


@router.get("", response_model=SignalPage, responses=responses(Unauthorized, Forbidden, Invalid))
async def list_signals(
    session: SessionDep,
    _: Reader,
    deployment: Annotated[str | None, Query(max_length=256)] = None,
    node: Annotated[str | None, Query(max_length=256)] = None,
    kind: SignalKind | None = None,
    since: Annotated[Bound | None, Query(description="Engine time at or after (ISO 8601 or epoch).")] = None,
    until: Annotated[Bound | None, Query(description="Engine time before.")] = None,
    cursor: Annotated[str | None, Query(pattern=cursors.KEY_ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> SignalPage:
    """Newest first. Pass ``next_cursor`` back as ``cursor`` for the next page."""
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise Invalid(f"{name}: give a timezone, e.g. 2026-12-02T10:00:00Z")
    filters = store.SignalFilter(deployment, node, kind.value if kind else None, since, until)
    rows, next_cursor = await store.page(session, filters, cursor, limit)
    return SignalPage(items=[SignalOut.model_validate(r) for r in rows], next_cursor=next_cursor)
