"""Allowlist entries. Functions flush; the caller's session scope commits."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.allowlist.models import AllowlistEntry, AllowlistFingerprint
from service.db import utcnow
from service.fingerprint.encoding import to_signed


async def add(
    session: AsyncSession, key_id: str, label: str, origin: str, values: npt.NDArray[np.uint64], created_by: str
) -> AllowlistEntry:
    unique = np.unique(values)
    entry = AllowlistEntry(
        key_id=key_id,
        label=label,
        origin=origin,
        fingerprint_count=len(unique),
        created_at=utcnow(),
        created_by=created_by,
    )
    session.add(entry)
    await session.flush()
    if len(unique):
        await session.execute(
            insert(AllowlistFingerprint), [{"entry_id": entry.id, "value": v} for v in to_signed(unique)]
        )
    return entry


async def entries(session: AsyncSession, key_id: str | None = None) -> list[AllowlistEntry]:
    q = select(AllowlistEntry).order_by(AllowlistEntry.id.desc())
    if key_id is not None:
        q = q.where(AllowlistEntry.key_id == key_id)
    return list((await session.scalars(q)).all())


async def revoke(session: AsyncSession, entry_id: int, by: str) -> AllowlistEntry | None:
    entry = await session.get(AllowlistEntry, entry_id)
    if entry is not None and entry.revoked_at is None:
        entry.revoked_at = utcnow()
        entry.revoked_by = by
        await session.flush()
    return entry
