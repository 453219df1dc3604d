"""Delivers the outbox: POSTs each pending row to its target, with retries, each target on its own.

Targets are ``BLEEDWATCH_PAGING_TARGETS``' (PagerDuty, Slack, Standard Webhooks: formats.py) and
``BLEEDWATCH_WEBHOOK_URL``'s, named ``webhook``, which keeps its own format: JSON with ids,
tenants, counts, severity and links, never text (bleedwatch has none); headers
``X-Bleedwatch-Event``, ``X-Bleedwatch-Delivery`` (the outbox id: the same on every retry, so a
receiver can drop duplicates), ``X-Bleedwatch-Timestamp`` (Unix seconds) and
``X-Bleedwatch-Signature: sha256=<hex>``, HMAC-SHA256 with ``BLEEDWATCH_WEBHOOK_SECRET`` over
``<timestamp>.<body>``; docs/incidents.md shows how to verify it.

Delivery is at least once, and in order per (target, incident): a row is claimed only once every
earlier row of its target and incident is delivered or given up, so PagerDuty never sees a
resolve overtake its trigger while the trigger waits out a backoff. A sender claims due rows by
pushing ``next_attempt_at`` past the request timeout (``FOR UPDATE SKIP LOCKED`` on PostgreSQL,
so replicas claim different rows), posts them, then records the result: a 2xx is delivered;
400, 410, 413 and 422 (the target refuses this body, or is gone for good) are given up at once;
anything else is retried after ``backoff * 2^(attempt-1)`` (capped at an hour, with jitter) up to
``max_attempts``, then given up. Rows of a target no longer configured wait, untouched, until it
is configured again or their incident is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
import orjson
import sqlalchemy.exc
from sqlalchemy import and_, exists, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import aliased

from service import metrics
from service.config import Settings
from service.db import session_scope, utcnow
from service.incidents import store as incidents
from service.webhooks import formats, targets
from service.webhooks.formats import Request, Snapshot
from service.webhooks.models import WebhookDelivery
from service.webhooks.targets import LEGACY_ROUTE, LEGACY_TARGET, PagerDutyTarget, Route, SlackTarget, TargetConfig

log = logging.getLogger("bleedwatch.webhooks")
MAX_BACKOFF_SECONDS = 3600.0
LEASE_MARGIN_SECONDS = 30.0
BATCH = 20
USER_AGENT = formats.USER_AGENT
GIVE_UP_STATUSES = frozenset({400, 410, 413, 422})  # resending the same body cannot succeed


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
class _Claimed:
    id: int
    incident_id: int
    event: str
    target: str
    attempts: int


# A target as the sender uses it: row and incident in, the request to make out.
Build = Callable[[_Claimed, Snapshot], Request]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    build: Build


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """How the sender behaves; ``url`` and ``secret`` are BLEEDWATCH_WEBHOOK_URL's, the ``webhook`` target."""

    url: str | None = None
    secret: str | None = None
    public_url: str | None = None
    max_attempts: int = 8
    backoff_seconds: float = 5.0
    timeout_seconds: float = 10.0
    poll_seconds: float = 2.0
    targets: tuple[Target, ...] = field(default=())


def _legacy(url: str, secret: str) -> Build:
    """BLEEDWATCH_WEBHOOK_URL's format, unchanged since before targets: receivers keep working."""

    def build(row: _Claimed, incident: Snapshot) -> Request:
        fields = incident.fields(tenants=True)
        del fields["source_tenant_count"], fields["recipient_tenant_count"]
        links = {k: incident.links[k] for k in ("incident", "impact", "impact_csv")}
        body = orjson.dumps({"event": row.event, "delivery_id": row.id, "incident": fields, "links": links})
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Bleedwatch-Event": row.event,
            "X-Bleedwatch-Delivery": str(row.id),
            "X-Bleedwatch-Timestamp": timestamp,
            "X-Bleedwatch-Signature": sign(secret, timestamp, body),
        }
        return Request(url, headers, body)

    return build


def build_target(config: TargetConfig, env: Mapping[str, str]) -> Target:
    """A configured target with its secret read from the environment (checked at start: targets.py)."""
    tenants = config.include_tenants
    if isinstance(config, PagerDutyTarget):
        url, key, prefix = config.url, targets.secret(env, config.routing_key_env).strip(), config.dedup_key_prefix

        def pagerduty(row: _Claimed, incident: Snapshot) -> Request:
            return formats.pagerduty(url, key, f"{prefix}{row.incident_id}", row.event, incident, tenants=tenants)

        return Target(config.name, pagerduty)
    if isinstance(config, SlackTarget):
        slack_url = targets.secret(env, config.url_env).strip()

        def slack(row: _Claimed, incident: Snapshot) -> Request:
            return formats.slack(slack_url, row.event, incident, tenants=tenants)

        return Target(config.name, slack)
    hook_url, secret = config.url, targets.standard_secret(targets.secret(env, config.secret_env), config.secret_env)

    def standard(row: _Claimed, incident: Snapshot) -> Request:
        return formats.standard(hook_url, secret, row.id, row.event, incident, tenants=tenants)

    return Target(config.name, standard)


class WebhookSender:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], config: WebhookConfig) -> None:
        self._sessions = sessions
        self.config = config
        self._targets = {t.name: t for t in config.targets}
        if config.url is not None and config.secret is not None:
            self._targets[LEGACY_TARGET] = Target(LEGACY_TARGET, _legacy(config.url, config.secret))
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
            # Something was sent: the next event of the same incident may be due now, so look again at once.
            if attempted == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.config.poll_seconds)

    async def _claim(self) -> list[_Claimed]:
        now = utcnow()
        earlier = aliased(WebhookDelivery)
        async with session_scope(self._sessions) as session:
            rows = (
                await session.scalars(
                    select(WebhookDelivery)
                    .where(
                        WebhookDelivery.delivered_at.is_(None),
                        WebhookDelivery.failed_at.is_(None),
                        WebhookDelivery.next_attempt_at <= now,
                        WebhookDelivery.target.in_(list(self._targets)),
                        ~exists().where(
                            and_(
                                earlier.target == WebhookDelivery.target,
                                earlier.incident_id == WebhookDelivery.incident_id,
                                earlier.id < WebhookDelivery.id,
                                earlier.delivered_at.is_(None),
                                earlier.failed_at.is_(None),
                            )
                        ),
                    )
                    .order_by(WebhookDelivery.id)
                    .limit(BATCH)
                    .with_for_update(skip_locked=True, of=WebhookDelivery)
                )
            ).all()
            lease = now + timedelta(seconds=self.config.timeout_seconds + LEASE_MARGIN_SECONDS)
            for row in rows:
                row.next_attempt_at = lease
            return [_Claimed(r.id, r.incident_id, r.event, r.target, r.attempts) for r in rows]

    def _link(self, path: str) -> str:
        return f"{self.config.public_url.rstrip('/')}{path}" if self.config.public_url else path

    async def snapshot(self, incident_id: int) -> Snapshot | None:
        async with session_scope(self._sessions) as session:
            incident = await incidents.get(session, incident_id)
            if incident is None:
                return None
            out = await incidents.out(session, incident)
        path = f"/v1/incidents/{out.id}"
        return Snapshot(
            id=out.id,
            status=out.status.value,
            severity=out.severity,
            model=out.model,
            deployment=out.deployment,
            opened_at=out.opened_at,
            first_seen_at=out.first_seen_at,
            last_seen_at=out.last_seen_at,
            finding_count=out.finding_count,
            source_tenants=out.source_tenants,
            recipient_tenants=out.recipient_tenants,
            links={  # the responder UI's page for people; the API's resources for programs
                "page": self._link(f"/ui/incidents/{out.id}"),
                "incident": self._link(path),
                "impact": self._link(f"{path}/impact"),
                "impact_csv": self._link(f"{path}/impact?format=csv"),
            },
        )

    async def _deliver(self, row: _Claimed) -> None:
        target = self._targets[row.target]
        incident = await self.snapshot(row.incident_id)
        if incident is None:
            await self._finish(row, ok=False, status=None, error="the incident no longer exists", give_up=True)
            return
        request = target.build(row, incident)
        assert self._client is not None, "start() the sender first"
        status: int | None = None
        error: str | None = None
        try:
            response = await self._client.post(request.url, content=request.body, headers=request.headers)
            status = response.status_code
            if not 200 <= status < 300:
                error = f"HTTP {status}"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        await self._finish(row, ok=error is None, status=status, error=error, give_up=status in GIVE_UP_STATUSES)

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
        where = {"delivery_id": row.id, "target": row.target, "event": row.event, "attempts": attempts}
        if ok:
            metrics.WEBHOOK_DELIVERIES.labels(row.target).inc()
            log.info("webhook_delivered", extra=where)
            return
        metrics.WEBHOOK_FAILED_ATTEMPTS.labels(row.target).inc()
        if give_up or attempts >= self.config.max_attempts:
            metrics.WEBHOOK_GIVEN_UP.labels(row.target).inc()
            log.warning("webhook_given_up", extra=where | {"error": error})
        else:
            log.info("webhook_retry", extra=where | {"error": error})


def paging_routes(settings: Settings) -> tuple[Route, ...]:
    """Who hears of which incident event, for the outbox (service/incidents/grouping.py Policy)."""
    legacy = (LEGACY_ROUTE,) if settings.webhook_url is not None else ()
    return legacy + tuple(targets.route_of(t) for t in settings.paging_targets)


def make_sender(
    sessions: async_sessionmaker[AsyncSession], settings: Settings, env: Mapping[str, str] | None = None
) -> WebhookSender | None:
    if settings.webhook_url is None and not settings.paging_targets:
        return None
    env = os.environ if env is None else env
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
            targets=tuple(build_target(t, env) for t in settings.paging_targets),
        ),
    )
