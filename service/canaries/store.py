"""Canaries. Functions flush; the caller's session scope commits."""

from __future__ import annotations

import numpy as np
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from bleedwatch.fingerprint.encoding import to_signed
from service.canaries.models import Canary, CanaryFingerprint
from service.db import utcnow
from service.wire import Decoded


async def add(session: AsyncSession, key_id: str, tenant: str, label: str, text: Decoded, created_by: str) -> Canary:
    values, first = np.unique(text.values, return_index=True)  # a repeated fingerprint keeps its first offset
    canary = Canary(
        key_id=key_id,
        tenant=tenant,
        label=label,
        token_count=text.token_count,
        fingerprint_count=len(values),
        created_at=utcnow(),
        created_by=created_by,
    )
    session.add(canary)
    await session.flush()
    if len(values):
        rows = [
            {"canary_id": canary.id, "value": v, "offset": int(o)}
            for v, o in zip(to_signed(values), text.offsets[first], strict=True)
        ]
        await session.execute(insert(CanaryFingerprint), rows)
    return canary


async def canaries(session: AsyncSession, key_id: str | None = None) -> list[Canary]:
    q = select(Canary).order_by(Canary.id.desc())
    if key_id is not None:
        q = q.where(Canary.key_id == key_id)
    return list((await session.scalars(q)).all())


async def revoke(session: AsyncSession, canary_id: int) -> Canary | None:
    canary = await session.get(Canary, canary_id)
    if canary is not None and canary.revoked_at is None:
        canary.revoked_at = utcnow()
        await session.flush()
    return canary
