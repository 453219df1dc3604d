"""Delivers the outbox: POSTs each pending row to ``BLEEDWATCH_WEBHOOK_URL``, signed, with retries.

The body is JSON with ids, tenants, counts, severity and links, never text (bleedwatch has none).
Headers: ``X-Bleedwatch-Event``, ``X-Bleedwatch-Delivery`` (the outbox id: the same on every
retry, so a receiver can drop duplicates), ``X-Bleedwatch-Timestamp`` (Unix seconds) and
``X-Bleedwatch-Signature: sha256=<hex>``, HMAC-SHA256 with ``BLEEDWATCH_WEBHOOK_SECRET`` over
``<timestamp>.<body>``; docs/incidents.md shows how to verify it.

Delivery is at least once. A sender claims due rows by pushing ``next_attempt_at`` past the
request timeout (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas claim different rows),
posts them, then records the result: a 2xx is delivered; anything else is retried after
``backoff * 2^(attempt-1)`` (capped at an hour, with jitter) up to ``max_attempts``, then given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import orjson
import sqlalchemy.exc
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics
from service.config import Settings
from service.db import session_scope, utcnow
from service.incidents import store as incidents
from service.webhooks.models import WebhookDelivery

log = logging.getLogger("bleedwatch.webhooks")
MAX_BACKOFF_SECONDS = 3600.0
LEASE_MARGIN_SECONDS = 30.0
BATCH = 20
USER_AGENT = "bleedwatch-webhook/1"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Bleedwatch-Signature value for a body sent at ``timestamp`` (Unix seconds, as sent)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, tolerance_seconds: float = 300) -> bool:
    """What a receiver does (also documented): the signature matches and the timestamp is recent."""
    try:
        fresh = abs(time.time() - float(timestamp)) <= tolerance_seconds
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    url: str
    secret: str
    public_url: str | None = None
    max_attempts: int = 8
    backoff_seconds: float = 5.0
    timeout_seconds: float = 10.0
    poll_seconds: float = 2.0


@dataclass(frozen=True, slots=True)
class _Claimed:
    id: int
    incident_id: int
    event: str
    attempts: int


class WebhookSender:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], config: WebhookConfig) -> None:
        self._sessions = sessions
        self.config = config
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self.config.timeout_seconds, follow_redirects=False)
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._periodically())

    async def stop(self) -> None:
        """Let a delivery in flight finish and be recorded (up to the request timeout), then stop."""
        if self._task is not None:
            self._stopping.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.config.timeout_seconds + 5)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def run_once(self) -> int:
        """Attempt every due delivery once; returns how many were attempted."""
        claimed = await self._claim()
        for row in claimed:
            await self._deliver(row)
        return len(claimed)

    async def _periodically(self) -> None:
        while not self._stopping.is_set():
            try:
                attempted = await self.run_once()
            except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
                log.warning("webhook_outbox_unavailable", extra={"exc_type": type(exc).__name__})
                attempted = 0
            if attempted < BATCH:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.config.poll_seconds)

    async def _claim(self) -> list[_Claimed]:
        now = utcnow()
        async with session_scope(self._sessions) as session:
            rows = (
                await session.scalars(
                    select(WebhookDelivery)
                    .where(
                        WebhookDelivery.delivered_at.is_(None),
                        WebhookDelivery.failed_at.is_(None),
                        WebhookDelivery.next_attempt_at <= now,
                    )
                    .order_by(WebhookDelivery.id)
                    .limit(BATCH)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            lease = now + timedelta(seconds=self.config.timeout_seconds + LEASE_MARGIN_SECONDS)
            for row in rows:
                row.next_attempt_at = lease
            return [_Claimed(r.id, r.incident_id, r.event, r.attempts) for r in rows]

    def _link(self, path: str) -> str:
        return f"{self.config.public_url.rstrip('/')}{path}" if self.config.public_url else path

    async def payload(self, row: _Claimed) -> dict[str, Any] | None:
        async with session_scope(self._sessions) as session:
            incident = await incidents.get(session, row.incident_id)
            if incident is None:
                return None
            out = await incidents.out(session, incident)
        path = f"/v1/incidents/{out.id}"
        return {
            "event": row.event,
            "delivery_id": row.id,
            "incident": {
                "id": out.id,
                "status": out.status.value,
                "severity": out.severity,
                "model": out.model,
                "deployment": out.deployment,
                "opened_at": out.opened_at.isoformat(),
                "first_seen_at": out.first_seen_at.isoformat(),
                "last_seen_at": out.last_seen_at.isoformat(),
                "finding_count": out.finding_count,
                "source_tenants": out.source_tenants,
                "recipient_tenants": out.recipient_tenants,
            },
            "links": {
                "incident": self._link(path),
                "impact": self._link(f"{path}/impact"),
                "impact_csv": self._link(f"{path}/impact?format=csv"),
            },
        }

    async def _deliver(self, row: _Claimed) -> None:
        payload = await self.payload(row)
        if payload is None:
            await self._finish(row, ok=False, status=None, error="the incident no longer exists", give_up=True)
            return
        body = orjson.dumps(payload)
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Bleedwatch-Event": row.event,
            "X-Bleedwatch-Delivery": str(row.id),
            "X-Bleedwatch-Timestamp": timestamp,
            "X-Bleedwatch-Signature": sign(self.config.secret, timestamp, body),
        }
        assert self._client is not None, "start() the sender first"
        status: int | None = None
        error: str | None = None
        try:
            response = await self._client.post(self.config.url, content=body, headers=headers)
            status = response.status_code
            if not 200 <= status < 300:
                error = f"HTTP {status}"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        await self._finish(row, ok=error is None, status=status, error=error)

    async def _finish(
        self, row: _Claimed, *, ok: bool, status: int | None, error: str | None, give_up: bool = False
    ) -> None:
        now = utcnow()
        attempts = row.attempts + 1
        async with session_scope(self._sessions) as session:
            stored = await session.get(WebhookDelivery, row.id)
            if stored is None:  # pruned or purged meanwhile
                return
            stored.attempts, stored.last_status, stored.last_error = attempts, status, error
            if ok:
                stored.delivered_at = now
            elif give_up or attempts >= self.config.max_attempts:
                stored.failed_at = now
            else:
                delay = min(self.config.backoff_seconds * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)
                stored.next_attempt_at = now + timedelta(seconds=delay * random.uniform(0.8, 1.0))
        if ok:
            metrics.WEBHOOK_DELIVERIES.inc()
            log.info("webhook_delivered", extra={"delivery_id": row.id, "attempts": attempts})
            return
        metrics.WEBHOOK_FAILED_ATTEMPTS.inc()
        if give_up or attempts >= self.config.max_attempts:
            metrics.WEBHOOK_GIVEN_UP.inc()
            log.warning("webhook_given_up", extra={"delivery_id": row.id, "attempts": attempts, "error": error})
        else:
            log.info("webhook_retry", extra={"delivery_id": row.id, "attempts": attempts, "error": error})


def make_sender(sessions: async_sessionmaker[AsyncSession], settings: Settings) -> WebhookSender | None:
    if settings.webhook_url is None or settings.webhook_secret is None:
        return None
    return WebhookSender(
        sessions,
        WebhookConfig(
            url=settings.webhook_url,
            secret=settings.webhook_secret,
            public_url=settings.public_url,
            max_attempts=settings.webhook_max_attempts,
            backoff_seconds=settings.webhook_backoff_seconds,
            timeout_seconds=settings.webhook_timeout_seconds,
            poll_seconds=settings.webhook_poll_seconds,
        ),
    )
