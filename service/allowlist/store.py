"""Allowlist entries and their packed fingerprints. Functions flush; the caller's session scope commits.

An entry's fingerprints are chunks of sorted, distinct little-endian uint64 (``AllowlistChunk``):
8 bytes a fingerprint in the table and in every replica's memory. Appending to an entry stores
only values none of its chunks holds yet, so re-sending a chunk (a retried request, a resumed
import) changes nothing and the entry's count stays exact.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.allowlist.models import AllowlistChunk, AllowlistEntry
from service.allowlist.packed import pack, sorted_unique, unpack, without
from service.db import utcnow

CHUNK_FINGERPRINTS = 1 << 20  # 8 MiB a row: PostgreSQL TOASTs it out of line, SQLite takes it as one blob

# What changes whenever the fingerprints a key id allowlists change: a replica compares it
# before re-reading them. Adding raises the max id, appending the sum, revoking lowers the count.
Version = tuple[object, ...]


async def add(
    session: AsyncSession, key_id: str, label: str, origin: str, values: npt.NDArray[np.uint64], created_by: str
) -> AllowlistEntry:
    entry = AllowlistEntry(
        key_id=key_id,
        label=label,
        origin=origin,
        fingerprint_count=0,
        created_at=utcnow(),
        created_by=created_by,
    )
    session.add(entry)
    await session.flush()
    await _store(session, entry, sorted_unique([values]), first_seq=0)
    return entry


async def get_for_update(session: AsyncSession, entry_id: int) -> AllowlistEntry | None:
    """The entry, locked until the transaction ends (PostgreSQL), so appends to it take turns."""
    entry: AllowlistEntry | None = await session.scalar(
        select(AllowlistEntry).where(AllowlistEntry.id == entry_id).with_for_update()
    )
    return entry


async def append(session: AsyncSession, entry: AllowlistEntry, values: npt.NDArray[np.uint64]) -> int:
    """Add the values the entry does not hold yet; returns how many that was. Lock it first."""
    seqs = list((await session.scalars(select(AllowlistChunk.seq).where(AllowlistChunk.entry_id == entry.id))).all())
    new = sorted_unique([values])
    chunk = select(AllowlistChunk.fingerprints).where(AllowlistChunk.entry_id == entry.id)
    for seq in seqs:  # one stored chunk in memory at a time
        if len(new):
            new = without(new, [unpack(await session.scalar(chunk.where(AllowlistChunk.seq == seq)) or b"")])
    return await _store(session, entry, new, first_seq=max(seqs, default=-1) + 1)


async def _store(session: AsyncSession, entry: AllowlistEntry, new: npt.NDArray[np.uint64], first_seq: int) -> int:
    for i, start in enumerate(range(0, len(new), CHUNK_FINGERPRINTS)):
        part = new[start : start + CHUNK_FINGERPRINTS]
        session.add(
            AllowlistChunk(entry_id=entry.id, seq=first_seq + i, fingerprint_count=len(part), fingerprints=pack(part))
        )
    entry.fingerprint_count += len(new)
    await session.flush()
    return len(new)


async def entries(session: AsyncSession, key_id: str | None = None, label: str | None = None) -> list[AllowlistEntry]:
    q = select(AllowlistEntry).order_by(AllowlistEntry.id.desc())
    if key_id is not None:
        q = q.where(AllowlistEntry.key_id == key_id)
    if label is not None:
        q = q.where(AllowlistEntry.label == label)
    return list((await session.scalars(q)).all())


async def revoke(session: AsyncSession, entry_id: int, by: str) -> AllowlistEntry | None:
    entry = await session.get(AllowlistEntry, entry_id)
    if entry is not None and entry.revoked_at is None:
        entry.revoked_at = utcnow()
        entry.revoked_by = by
        await session.flush()
    return entry


async def version(session: AsyncSession, key_id: str) -> Version:
    """One indexed aggregate over the key id's entries: cheap enough to run every few seconds."""
    active = AllowlistEntry.revoked_at.is_(None)
    row = (
        await session.execute(
            select(
                func.count(AllowlistEntry.id).filter(active),
                func.max(AllowlistEntry.id).filter(active),
                func.sum(AllowlistEntry.fingerprint_count).filter(active),
                func.max(AllowlistEntry.revoked_at),
            ).where(AllowlistEntry.key_id == key_id)
        )
    ).one()
    return tuple(row)


async def active_values(session: AsyncSession, key_id: str) -> npt.NDArray[np.uint64]:
    """Every fingerprint the key id's unrevoked entries allowlist, sorted and distinct.

    Chunks are streamed into one array sized by the first row (one statement, so the size and
    the rows agree), then sorted in place: at peak about 9 bytes a fingerprint and one chunk,
    17 if entries overlap, instead of every chunk's bytes besides two copies of the values.
    """
    query = (
        select(AllowlistChunk.fingerprints, func.sum(AllowlistChunk.fingerprint_count).over())
        .join(AllowlistEntry, AllowlistEntry.id == AllowlistChunk.entry_id)
        .where(AllowlistEntry.key_id == key_id, AllowlistEntry.revoked_at.is_(None))
        .execution_options(yield_per=1)
    )
    values = np.empty(0, dtype=np.uint64)
    filled = 0
    async for data, total in await session.stream(query):
        if not len(values):
            values = np.empty(int(total), dtype=np.uint64)
        part = unpack(data)
        values[filled : filled + len(part)] = part
        filled += len(part)
    return await asyncio.to_thread(_sorted_distinct, values[:filled])  # numpy sorts without the GIL


def _sorted_distinct(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    values.sort()
    if len(values) > 1 and bool((values[1:] == values[:-1]).any()):
        return sorted_unique([values])
    return values
