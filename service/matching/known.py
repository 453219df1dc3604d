"""Fingerprints the matcher must treat specially: the allowlist and the canaries.

Both live in the database (they are configuration, kept and audited) and are read here into
sorted arrays per key id. Every ``ttl_seconds`` a replica asks the database whether either list
changed (one aggregate over the key id's entries) and re-reads only the one that did: an
allowlist of millions of fingerprints is read when it changes, not every refresh. Every
replica converges on the same lists within ``ttl_seconds``; a replica that changed a list
checks at once. While the database is down the last lists read stay in use.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bleedwatch.fingerprint.encoding import from_signed
from service.allowlist import store as allowlist
from service.canaries.models import Canary, CanaryFingerprint
from service.db import DB_DOWN, session_scope

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


@dataclass(slots=True)
class _Cached:
    checked_until: float  # monotonic time of the next version check
    allowlist_version: allowlist.Version
    canary_version: allowlist.Version
    known: Known


class KnownFingerprints:
    """Per key id, the lists as last read. One check at a time per key id: while one runs (a
    reload of millions of fingerprints takes a second or two), other batches match with the
    lists it is replacing, so a change never costs several copies of them at once."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl_seconds: float) -> None:
        self._sessions = sessions
        self._ttl = ttl_seconds
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._invalidated: set[str] = set()

    def invalidate(self, key_id: str) -> None:
        """Check this key id's lists on the next ``get``: this replica has just changed one."""
        self._invalidated.add(key_id)  # a check already running may have read before the change
        cached = self._cache.get(key_id)
        if cached is not None:
            cached.checked_until = 0.0

    async def get(self, key_id: str) -> Known:
        cached = self._cache.get(key_id)
        if cached is not None and cached.checked_until > time.monotonic():
            return cached.known
        lock = self._locks.setdefault(key_id, asyncio.Lock())
        if cached is not None and lock.locked():
            return cached.known
        async with lock:
            cached = self._cache.get(key_id)
            now = time.monotonic()
            if cached is not None and cached.checked_until > now:
                return cached.known  # checked while this task waited
            self._invalidated.discard(key_id)
            try:
                async with session_scope(self._sessions) as session:
                    fresh = await _read(session, key_id, cached)
            except DB_DOWN:
                if cached is None:
                    raise
                cached.checked_until = now + self._ttl  # stale if error: keep matching with the last lists we read
                return cached.known
            fresh.checked_until = 0.0 if key_id in self._invalidated else now + self._ttl
            self._cache[key_id] = fresh
            return fresh.known


async def _read(session: AsyncSession, key_id: str, cached: _Cached | None) -> _Cached:
    """The key id's lists, re-reading only those whose version moved since ``cached``.

    Versions are read before contents: a change committed in between is read now and, being a
    newer version than the one kept, read once more on the next check; never missed.
    """
    allow_v = await allowlist.version(session, key_id)
    canary_v = await _canary_version(session, key_id)
    if cached is None:
        known = Known(await allowlist.active_values(session, key_id), await _canaries(session, key_id))
        return _Cached(0.0, allow_v, canary_v, known)
    known = cached.known
    if allow_v != cached.allowlist_version:
        known = Known(await allowlist.active_values(session, key_id), known.canaries)
    if canary_v != cached.canary_version:
        known = Known(known.allowlist, await _canaries(session, key_id))
    return _Cached(0.0, allow_v, canary_v, known)


async def _canary_version(session: AsyncSession, key_id: str) -> allowlist.Version:
    active = Canary.revoked_at.is_(None)
    row = (
        await session.execute(
            select(
                func.count(Canary.id).filter(active), func.max(Canary.id).filter(active), func.max(Canary.revoked_at)
            ).where(Canary.key_id == key_id)
        )
    ).one()
    return tuple(row)


async def _canaries(session: AsyncSession, key_id: str) -> CanarySet:
    canaries = list(
        (await session.scalars(select(Canary).where(Canary.key_id == key_id, Canary.revoked_at.is_(None)))).all()
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
