"""Fingerprints the matcher must treat specially: the allowlist and the canaries.

Both live in the database (they are configuration, kept and audited) and are read here into
sorted arrays per key id, refreshed every ``ttl_seconds`` so every replica converges on the
same lists without a round trip per batch. A replica that changed a list refreshes at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.allowlist.models import AllowlistEntry, AllowlistFingerprint
from service.auth.keys import DB_DOWN
from service.canaries.models import Canary, CanaryFingerprint
from service.db import session_scope
from service.fingerprint.encoding import from_signed

EMPTY = np.empty(0, dtype=np.uint64)


def positions(sorted_values: npt.NDArray[np.uint64], values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """For each of ``values``, its position in ``sorted_values``, or -1: a binary search per value,
    where ``np.isin`` would sort the whole list again on every call."""
    if len(sorted_values) == 0:
        return np.full(len(values), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return np.where(sorted_values[pos] == values, pos, -1)


@dataclass(frozen=True, slots=True)
class CanarySet:
    """Canary fingerprints sorted by value, with the canary and token offset of each."""

    values: npt.NDArray[np.uint64]
    canary_ids: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    tenants: dict[int, str]
    labels: dict[int, str]

    def find(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """For each value, the position of its canary fingerprint here, or -1."""
        return positions(self.values, values)


NO_CANARIES = CanarySet(EMPTY, np.empty(0, np.int64), np.empty(0, np.int64), {}, {})


@dataclass(frozen=True, slots=True)
class Known:
    allowlist: npt.NDArray[np.uint64]  # sorted
    canaries: CanarySet

    def allowed(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        return positions(self.allowlist, values) >= 0


class KnownFingerprints:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl_seconds: float) -> None:
        self._sessions = sessions
        self._ttl = ttl_seconds
        self._cache: dict[str, tuple[float, Known]] = {}

    def invalidate(self, ns: str) -> None:
        self._cache.pop(ns, None)

    async def get(self, ns: str) -> Known:
        now = time.monotonic()
        cached = self._cache.get(ns)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            async with session_scope(self._sessions) as session:
                known = Known(await _allowlist(session, ns), await _canaries(session, ns))
        except DB_DOWN:
            if cached is None:
                raise
            known = cached[1]  # stale if error: keep matching with the last lists we read
        self._cache[ns] = (now + self._ttl, known)
        return known


async def _allowlist(session: AsyncSession, ns: str) -> npt.NDArray[np.uint64]:
    rows = await session.scalars(
        select(AllowlistFingerprint.value)
        .join(AllowlistEntry, AllowlistEntry.id == AllowlistFingerprint.entry_id)
        .where(AllowlistEntry.key_id == ns, AllowlistEntry.revoked_at.is_(None))
    )
    return np.unique(from_signed(list(rows)))


async def _canaries(session: AsyncSession, ns: str) -> CanarySet:
    canaries = list(
        (await session.scalars(select(Canary).where(Canary.key_id == ns, Canary.revoked_at.is_(None)))).all()
    )
    if not canaries:
        return NO_CANARIES
    rows = (
        await session.execute(
            select(CanaryFingerprint.value, CanaryFingerprint.canary_id, CanaryFingerprint.offset).where(
                CanaryFingerprint.canary_id.in_([c.id for c in canaries])
            )
        )
    ).all()
    values = from_signed([r[0] for r in rows])
    order = np.argsort(values, kind="stable")
    return CanarySet(
        values=values[order],
        canary_ids=np.array([r[1] for r in rows], dtype=np.int64)[order],
        offsets=np.array([r[2] for r in rows], dtype=np.int64)[order],
        tenants={c.id: c.tenant for c in canaries},
        labels={c.id: c.label for c in canaries},
    )
