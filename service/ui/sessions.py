"""UI sign-in sessions: an opaque cookie, a row in the database, the API key checked on every page.

Why the database, not process memory or a signed cookie: API replicas are stateless and any of
them serves the next page, so memory is out; a signed (and encrypted) cookie would need one more
secret that every replica shares, and a copied cookie would stay valid until it expires, whatever
sign-out did. A row costs one indexed query per page, which a human's clicks can afford; it makes
sign-out final on every replica at once, and, joined with the API key on every request, a revoked
key ends its UI sessions at the next page too. The cookie holds 256 random bits and nothing else;
the table holds their SHA-256 only, so neither a cookie nor a copy of the table reveals the key.

The cookie is HttpOnly, SameSite=Strict and, unless ``BLEEDWATCH_UI_COOKIE_SECURE=false`` (plain
http on a host other than localhost, for development), Secure with the ``__Host-`` prefix (no
Domain, path /).
Each session's CSRF token is derived from the cookie value (a different hash of it), so a page
can carry it in its forms without the table holding it; every POST must send it back.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import Response

from service.auth.keys import Caller, Role
from service.auth.models import ApiKey
from service.config import Settings
from service.db import utcnow
from service.ui.models import UiSession

SIGNIN_COOKIE_SECONDS = 600  # the sign-in form's own CSRF token (before there is a session) lasts this long


def cookie_name(settings: Settings) -> str:
    """``__Host-`` makes the browser refuse the cookie unless it is Secure, host-only and path /."""
    return "__Host-bw_ui" if settings.ui_cookie_secure else "bw_ui"


def signin_cookie_name(settings: Settings) -> str:
    return "__Host-bw_ui_signin" if settings.ui_cookie_secure else "bw_ui_signin"


def _digest(purpose: bytes, raw: str) -> str:
    return hashlib.sha256(purpose + b"\0" + raw.encode()).hexdigest()


def csrf_token(raw: str) -> str:
    """The session's CSRF token: known to whoever holds the cookie's value (the page), not the table."""
    return _digest(b"csrf", raw)


def csrf_ok(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def set_cookie(response: Response, settings: Settings, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        secure=settings.ui_cookie_secure,
        httponly=True,
        samesite="strict",
    )


def clear_cookie(response: Response, settings: Settings, name: str) -> None:
    response.delete_cookie(name, path="/", secure=settings.ui_cookie_secure, httponly=True, samesite="strict")


async def create(session: AsyncSession, settings: Settings, caller: Caller) -> str:
    """A new session for this key; returns the cookie value. Expired sessions are dropped here, so
    the table holds at most the sessions of one period (sign-ins are rare; no background job)."""
    now = utcnow()
    await session.execute(delete(UiSession).where(UiSession.expires_at < now))
    raw = secrets.token_urlsafe(32)
    session.add(
        UiSession(
            id_hash=_digest(b"session", raw),
            key_id=caller.key_id,
            created_at=now,
            expires_at=now + timedelta(seconds=settings.ui_session_seconds),
        )
    )
    await session.flush()
    return raw


async def caller(session: AsyncSession, raw: str | None) -> Caller | None:
    """The signed-in caller of this cookie value: its session unexpired and its API key not revoked."""
    if not raw or len(raw) > 128:
        return None
    row = (
        await session.execute(
            select(ApiKey)
            .join(UiSession, UiSession.key_id == ApiKey.id)
            .where(
                UiSession.id_hash == _digest(b"session", raw),
                UiSession.expires_at > utcnow(),
                ApiKey.revoked_at.is_(None),
            )
        )
    ).scalar_one_or_none()
    if row is None:
        return None
    return Caller(row.id, Role(row.role), frozenset(row.tenants) if row.tenants is not None else None)


async def end(session: AsyncSession, raw: str) -> None:
    await session.execute(delete(UiSession).where(UiSession.id_hash == _digest(b"session", raw)))


def raw_cookie(request: Request, settings: Settings) -> str | None:
    return request.cookies.get(cookie_name(settings))
