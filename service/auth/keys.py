"""API keys: ``bw_<id>_<secret>``, stored as SHA-256 of the secret.

The secret is 256 random bits, so a fast hash is enough: there is nothing to brute-force.
Verified keys are cached for ``api_key_cache_seconds`` so ingest does not read the database
per batch; that is also the longest a revoked key keeps working on a replica.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import sqlalchemy.exc
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.models import ApiKey
from service.db import session_scope, utcnow


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


def _parse(token: str) -> tuple[str, str] | None:
    prefix, _, rest = token.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != "bw" or not key_id or not secret:
        return None
    return key_id, secret


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


DB_DOWN = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, OSError)


class KeyVerifier:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], cache_seconds: float) -> None:
        self._sessions = sessions
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, str, Caller | None]] = {}
        self._touched: dict[str, float] = {}  # key id -> when last_used_at was last written

    async def verify(self, token: str) -> Caller | None:
        parsed = _parse(token)
        if parsed is None:
            return None
        key_id, secret = parsed
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached is None or cached[0] < now:
            try:
                cached = (now + self._cache_seconds, *await self._load(key_id))
            except DB_DOWN:
                if cached is None:
                    raise
                # Stale if error: a database outage must not stop gateways whose keys we know.
                cached = (now + self._cache_seconds, cached[1], cached[2])
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key_id] = cached
        _, secret_hash, caller = cached
        if caller is None or not hmac.compare_digest(secret_hash, _hash(secret)):
            return None
        with contextlib.suppress(*DB_DOWN):
            await self._touch(key_id, now)  # only a correct secret counts as a use
        return caller

    def forget(self, key_id: str) -> None:
        """Drop a cached key (after revoking it here): this replica refuses it at once."""
        self._cache.pop(key_id, None)
        self._touched.pop(key_id, None)

    async def _load(self, key_id: str) -> tuple[str, Caller | None]:
        async with session_scope(self._sessions) as session:
            key = await session.get(ApiKey, key_id)
            if key is None or key.revoked_at is not None:
                return "", None
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
