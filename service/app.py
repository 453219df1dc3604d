"""The ASGI application: one lifespan builds every backend client; routes read them from state."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import redis.exceptions
import sqlalchemy.exc
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import api_docs, audit, errors, metrics, readiness, tracing
from service.allowlist.routes import router as allowlist_router
from service.audit.routes import router as audit_router
from service.auth.failures import AuthFailures
from service.auth.gate import AuthGate
from service.auth.keys import KeyVerifier
from service.auth.revocations import make_revocations
from service.auth.routes import router as keys_router
from service.body_limit import BodyLimit
from service.canaries.routes import router as canaries_router
from service.config import Settings
from service.db import make_engine, make_sessionmaker
from service.deployments.risk import RiskMonitor
from service.deployments.routes import router as deployments_router
from service.deployments.rules import load_rules
from service.deps import AppDeps, Deps
from service.findings.routes import router as findings_router
from service.incidents.monitor import IncidentMonitor
from service.incidents.routes import router as incidents_router
from service.index.base import Index
from service.index.factory import make_index
from service.index.keys import Keys
from service.ingest.routes import router as ingest_router
from service.json_only import JsonOnly
from service.logging import RequestContext
from service.migrate import upgrade
from service.pipeline import build_pipeline
from service.ratelimit import make_limiter
from service.retention.jobs import Retention, RetentionJob
from service.retention.routes import router as retention_router
from service.signals.routes import router as signals_router
from service.ui.routes import UiHeaders
from service.ui.routes import router as ui_router
from service.webhooks.sender import make_sender

RETRY_AFTER_SECONDS = 5
log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.database_url is None:
            upgrade(settings)  # the embedded file is ours to keep current
        engine = make_engine(settings)
        metrics.configure(settings)
        audit.configure(settings)
        metrics.instrument_engine(engine)
        sessions = make_sessionmaker(engine)
        index = make_index(settings)
        risk = RiskMonitor(sessions, load_rules(settings.risk_rules_file), settings.risk_refresh_seconds)
        webhooks = make_sender(sessions, settings)
        incidents = IncidentMonitor(sessions, settings.incident_refresh_seconds)
        retention = RetentionJob(
            sessions,
            Retention(
                settings.findings_retention_days, settings.incidents_retention_days, settings.audit_retention_days
            ),
            settings.prune_interval_seconds,
        )
        limiter = make_limiter(settings)
        keys = KeyVerifier(sessions, settings.api_key_cache_seconds, settings.api_key_stale_seconds)
        revocations = make_revocations(settings, keys)
        auth_failures = AuthFailures(
            make_limiter(
                settings,
                settings.auth_failures_per_second,
                settings.auth_failures_burst,
                Keys.auth_failures,
                "bleedwatch-authfail",
            )
        )
        pipeline = build_pipeline(settings, sessions, index)
        app.state.deps = AppDeps(
            settings=settings,
            engine=engine,
            sessions=sessions,
            index=index,
            ingestor=pipeline.ingestor,
            known=pipeline.known,
            keys=keys,
            revocations=revocations,
            risk=risk,
            limiter=limiter,
            auth_failures=auth_failures,
            incidents=incidents,
            incident_policy=pipeline.incident_policy,
        )
        # Stopped in the reverse order, each even if one before it raised: the workers first (after
        # uvicorn has answered every request: SIGTERM drains), the clients they use last.
        async with AsyncExitStack() as running:
            running.push_async_callback(engine.dispose)
            running.push_async_callback(index.close)
            running.push_async_callback(limiter.close)
            running.push_async_callback(auth_failures.close)
            await revocations.start()
            running.push_async_callback(revocations.stop)
            await risk.start()  # the risk gauges, from the database, before the first scrape
            running.push_async_callback(risk.stop)
            await incidents.start()
            running.push_async_callback(incidents.stop)
            await retention.start()
            running.push_async_callback(retention.stop)
            if webhooks is not None:
                await webhooks.start()
                running.push_async_callback(webhooks.stop)
            pipeline.start(running)
            yield

    app = FastAPI(
        title="bleedwatch",
        summary="Catches one tenant's data in another tenant's LLM answers, from fingerprints only.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc from local assets: service/api_docs.py
        redoc_url=None,
    )
    api_docs.install(app)
    errors.install(app)
    app.add_middleware(JsonOnly)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, max_other_bytes=settings.max_other_body_bytes)
    app.add_middleware(AuthGate)  # outside the body limit: the key is checked before the body is read
    app.add_middleware(UiHeaders)  # CSP and the other security headers on every /ui response
    app.add_middleware(RequestContext)  # outermost: request id, access log, HTTP metrics

    @app.exception_handler(redis.exceptions.RedisError)
    async def redis_down(_: Request, exc: redis.exceptions.RedisError) -> JSONResponse:
        metrics.BACKEND_ERRORS.labels("redis").inc()
        log.warning("backend_unavailable", extra={"backend": "redis", "exc_type": type(exc).__name__})
        return _unavailable("the fingerprint index (Redis) is unreachable; retry later, nothing was kept")

    @app.exception_handler(sqlalchemy.exc.OperationalError)
    @app.exception_handler(sqlalchemy.exc.InterfaceError)
    async def database_down(_: Request, exc: sqlalchemy.exc.DBAPIError) -> JSONResponse:
        metrics.BACKEND_ERRORS.labels("database").inc()
        log.warning("backend_unavailable", extra={"backend": "database", "exc_type": type(exc).__name__})
        return _unavailable("the database is unreachable; retry later")

    common = errors.common_responses()  # 401, 403, 415, 422, 429, 503: any authenticated route may answer them
    app.include_router(ingest_router, responses=common)
    app.include_router(findings_router, responses=common)
    app.include_router(allowlist_router, responses=common)
    app.include_router(canaries_router, responses=common)
    app.include_router(deployments_router, responses=common)
    app.include_router(signals_router, responses=common)
    app.include_router(incidents_router)
    app.include_router(audit_router)
    app.include_router(keys_router)
    app.include_router(retention_router)
    app.include_router(ui_router)  # the responder UI: HTML, not in the OpenAPI document

    @app.get("/healthz", tags=["health"], summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="Redis and the database answer, at this version's schema")
    async def readyz(deps: Deps) -> JSONResponse:
        """Ready when both answer and the schema is migrated (service/readiness.py). ``durability``
        says whether Redis keeps what was answered 202 (AOF and noeviction); a Redis that does not is
        still ready (the alert on bleedwatch_redis_persistence_ok says so), refusing traffic would
        lose more."""
        checks = await readiness.checks(deps.index, deps.engine)
        detail: dict[str, str] = {}
        if checks["index"] == "ok":
            detail["durability"] = await _durability(deps.index)
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ready, "checks": checks, **detail}, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics", include_in_schema=False)
    async def prometheus_metrics(deps: Deps) -> Response:
        # The queue's gauges only where no worker of this process sets them each recovery round.
        queue = deps.index.queue() if deps.settings.ingest_workers == 0 else None
        await metrics.INDEX_STATS.refresh(deps.index, queue)
        return Response(generate_latest(metrics.registry()), media_type=CONTENT_TYPE_LATEST)

    tracing.configure(settings.tracing, app)  # before the first call builds the middleware stack
    return app


async def _durability(index: Index) -> str:
    """``ok``, or what is missing: ``no_aof``, ``evicts:<policy>``; ``in_process`` for the embedded index."""
    if not isinstance(index, metrics.ReportsDurability):
        return "in_process"
    try:
        durability = await index.durability()
    except (redis.exceptions.RedisError, OSError):
        return "unknown"
    metrics.REDIS_PERSISTENCE_OK.set(int(durability.ok))
    missing = ([] if durability.aof else ["no_aof"]) + (
        [] if durability.eviction_policy == "noeviction" else [f"evicts:{durability.eviction_policy}"]
    )
    return ",".join(missing) or "ok"


def _unavailable(detail: str) -> JSONResponse:
    return JSONResponse(
        {"error": "unavailable", "detail": detail},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
