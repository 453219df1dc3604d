"""API keys: ``bw_<id>_<secret>``, stored as SHA-256 of the secret.

The secret is 256 random bits, so a fast hash is enough: there is nothing to brute-force.
Verified keys are cached for ``api_key_cache_seconds`` so ingest does not read the database
per batch. Key ids that are unknown or revoked are cached apart, in a bounded cache of their
own, so a flood of random ids costs one query each at most and never evicts a known key; a
token that cannot be a key (wrong shape) is refused without a query at all.

A revocation is published on Redis (``service/auth/revocations.py``) and every process drops the
key at once. While the database is down a known key is used from the cache, but only for
``api_key_stale_seconds`` past its cache period: a revocation this process missed cannot keep a
key alive for the whole outage. An id refused before an outage stays refused during it.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.models import ApiKey
from service.db import DB_DOWN, session_scope, utcnow


class Role(enum.StrEnum):
    INGEST = "ingest"  # gateways: post exchanges, nothing else
    READ = "read"  # responders: read findings and incidents
    TRIAGE = "triage"  # responders who change incidents
    ADMIN = "admin"  # keys, canaries, deployments, allowlist


@dataclass(frozen=True, slots=True)
class Caller:
    key_id: str
    role: Role
    tenants: frozenset[str] | None  # ingest keys may be limited to the tenants of their gateway


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# What create_key makes: 12 hex digits of id (token_hex(6)), a url-safe secret (which may hold "_").
TOKEN = re.compile(r"^bw_([0-9a-f]{12})_([A-Za-z0-9_-]{1,128})$")
MAX_KNOWN = 100_000  # cached known keys: as many as admins create, bounded all the same
MAX_UNKNOWN = 10_000  # cached unknown or revoked ids: a flood of random ids evicts only its own kind


def _parse(token: str) -> tuple[str, str] | None:
    match = TOKEN.match(token)
    return (match[1], match[2]) if match else None


async def create_key(
    session: AsyncSession, name: str, role: Role, tenants: list[str] | None = None
) -> tuple[ApiKey, str]:
    """Returns the stored key and the full token, which is never retrievable again."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    key = ApiKey(id=key_id, name=name, role=role.value, secret_hash=_hash(secret), tenants=tenants, created_at=utcnow())
    session.add(key)
    await session.flush()
    return key, f"bw_{key_id}_{secret}"


async def list_keys(session: AsyncSession) -> list[ApiKey]:
    return list((await session.scalars(select(ApiKey).order_by(ApiKey.created_at))).all())


async def revoke_key(session: AsyncSession, key_id: str) -> bool:
    result = await session.execute(
        update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class _Known:
    expires: float  # monotonic: reload from the database after this
    stale_until: float  # monotonic: past this, a database outage refuses the key (503) too
    secret_hash: str
    caller: Caller


class KeyVerifier:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], cache_seconds: float, stale_seconds: float = 300.0
    ) -> None:
        self._sessions = sessions
        self._cache_seconds = cache_seconds
        self._stale_seconds = stale_seconds
        self._known: dict[str, _Known] = {}
        self._unknown: dict[str, float] = {}  # key id -> monotonic time to look again
        self._touched: dict[str, float] = {}  # key id -> when last_used_at was last written

    def cached(self, token: str) -> Caller | None:
        """The caller if this token is a key verified here recently, without touching the database."""
        parsed = _parse(token)
        if parsed is None:
            return None
        known = self._known.get(parsed[0])
        if known is None or known.expires < time.monotonic():
            return None
        return known.caller if hmac.compare_digest(known.secret_hash, _hash(parsed[1])) else None

    async def verify(self, token: str) -> Caller | None:
        parsed = _parse(token)
        if parsed is None:
            return None  # not a key's shape: no query
        key_id, secret = parsed
        now = time.monotonic()
        if self._unknown.get(key_id, 0.0) >= now:
            return None
        known = self._known.get(key_id)
        if known is None or known.expires < now:
            try:
                loaded = await self._load(key_id)
            except DB_DOWN:
                if known is None or known.stale_until < now:
                    if key_id in self._unknown:
                        return None  # refused before the outage: stays refused
                    raise
                # Stale if error: a database outage must not stop gateways whose keys we know,
                # up to stale_until, which a failed reload does not move; retried once a period.
                known = replace(known, expires=now + self._cache_seconds)
                self._known[key_id] = known
            else:
                if loaded is None:
                    self._known.pop(key_id, None)
                    _remember(self._unknown, key_id, now + self._cache_seconds, MAX_UNKNOWN)
                    return None
                self._unknown.pop(key_id, None)
                expires = now + self._cache_seconds
                known = _Known(expires, expires + self._stale_seconds, *loaded)
                _remember(self._known, key_id, known, MAX_KNOWN)
        if not hmac.compare_digest(known.secret_hash, _hash(secret)):
            return None
        with contextlib.suppress(*DB_DOWN):
            await self._touch(key_id, now)  # only a correct secret counts as a use
        return known.caller

    def forget(self, key_id: str) -> None:
        """A key was revoked (here, or on another process: a Redis message): refuse it at once,
        during a database outage too."""
        self._known.pop(key_id, None)
        self._touched.pop(key_id, None)
        _remember(self._unknown, key_id, time.monotonic() + self._cache_seconds, MAX_UNKNOWN)

    def expire_all(self) -> None:
        """Revocations may have been missed (the subscription was down): check every key again.

        Stale-if-error still applies, so a database outage at the same time does not stop gateways.
        """
        now = time.monotonic()
        self._known = {k: replace(v, expires=min(v.expires, now)) for k, v in self._known.items()}

    async def _load(self, key_id: str) -> tuple[str, Caller] | None:
        """The key's secret hash and caller; None if there is no such key or it is revoked."""
        async with session_scope(self._sessions) as session:
            key = await session.get(ApiKey, key_id)
            if key is None or key.revoked_at is not None:
                return None
            tenants = frozenset(key.tenants) if key.tenants is not None else None
            return key.secret_hash, Caller(key.id, Role(key.role), tenants)

    async def _touch(self, key_id: str, now: float) -> None:
        """Write last_used_at at most once per cache period per key, not once per request."""
        last = self._touched.get(key_id)
        if last is not None and now - last < max(self._cache_seconds, 1.0):
            return
        if len(self._touched) > 10_000:
            self._touched.clear()
        self._touched[key_id] = now
        async with session_scope(self._sessions) as session:
            await session.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=utcnow()))


def _remember(cache: dict[str, Any], key: str, value: Any, limit: int) -> None:
    """Insert, evicting the oldest entries of this cache (only this one) past ``limit``."""
    cache.pop(key, None)
    while len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value
