"""``bleedwatch work``: a process that only processes the ingest queue (index, match, store findings).

Matching is CPU work (numpy, on the event loop and in threads) and Redis work that takes as long
as a batch is big; on the API's event loop, answers to gateways wait behind it. Run the API with
``BLEEDWATCH_INGEST_WORKERS=0`` (it validates and queues, answers 202, and processes nothing,
not even abandoned batches) and as many ``bleedwatch work`` processes as the load needs, on the
same Redis and database: they share the queue's consumer group, so each batch goes to one of
them, and a batch whose worker died is reclaimed by another (service/ingest/worker.py).

The process has no API. It listens on ``BLEEDWATCH_WORK_PORT`` for ``/metrics`` (the ingest,
matching and queue metrics come from here, not from the API replicas) and ``/healthz``,
``/readyz``. SIGTERM finishes the batches in hand; what it has not taken stays queued.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import audit, metrics, readiness, tracing
from service.config import Settings
from service.db import make_engine, make_sessionmaker
from service.index.factory import make_index
from service.pipeline import build_pipeline


class WorkerUnfit(ValueError):
    """Settings a worker process cannot run with; the message says which and what to set."""


def check(settings: Settings) -> None:
    if settings.embedded:
        raise WorkerUnfit("bleedwatch work needs BLEEDWATCH_REDIS_URL: the embedded queue lives in the serving process")
    if settings.ingest_workers == 0:
        raise WorkerUnfit("BLEEDWATCH_INGEST_WORKERS is 0: a worker process needs at least 1 (batches at once)")


def create_worker_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    check(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings)
        audit.configure(settings)  # incident events name tenants by their digest, as the API's do
        metrics.configure(settings)
        metrics.instrument_engine(engine)
        sessions = make_sessionmaker(engine)
        index = make_index(settings)
        # Findings join incidents in the session that stores them; the API replicas send the webhooks.
        pipeline = build_pipeline(settings, sessions, index)
        app.state.engine, app.state.index = engine, index
        async with AsyncExitStack() as running:  # stopped in reverse: the worker first, its clients last
            running.push_async_callback(engine.dispose)
            running.push_async_callback(index.close)
            pipeline.start(running)
            yield

    app = FastAPI(title="bleedwatch worker", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        checks = await readiness.checks(app.state.index, app.state.engine)
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # Not the queue's gauges: this process's workers set them each recovery round (service/ingest/worker.py).
        await metrics.INDEX_STATS.refresh(app.state.index)
        return Response(generate_latest(metrics.registry()), media_type=CONTENT_TYPE_LATEST)

    tracing.configure(settings.tracing, app)  # before the first call builds the middleware stack
    return app
