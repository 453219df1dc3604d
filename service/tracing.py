"""Optional OpenTelemetry traces; a no-op unless tracing is set up.

Spans come from the OpenTelemetry API when it is importable; without an SDK tracer provider they
record nothing. ``BLEEDWATCH_TRACING=true`` with the ``tracing`` extra installed
(``pip install 'bleedwatch-server[tracing]'``) makes ``bleedwatch serve`` and ``bleedwatch work``
install an SDK provider that exports over OTLP/HTTP, configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables, and instrument FastAPI, httpx, redis and SQLAlchemy with the
OpenTelemetry project's own instrumentation packages. An incoming ``traceparent`` is honoured,
and the accepting request's trace context travels with its batch through the ingest queue
(service/ingest/envelope.py), so the worker's spans join the gateway's trace. Log lines carry
the ``trace_id`` and ``span_id`` of the span they were written in (service/logging.py).

What spans may hold is what logs may hold. Ours: counts and sizes, never a tenant, a request
id or a fingerprint. The instrumentations': the server span's URL loses its query string (it
carries tenant names), an outgoing request's URL keeps only scheme and host (a webhook URL's path
can be its secret), redis commands are recorded as ``EVALSHA ? ?`` (the instrumentation's own
sanitising) and SQL as the parameterised statement.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # the API is optional: spans are then plain no-ops
    _trace = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def span(name: str, **attributes: int | float | str | bool) -> Iterator[Any]:
    """A span named ``bleedwatch.<name>`` around the block; yields it (or None) to add attributes."""
    if _trace is None:
        yield None
        return
    with _trace.get_tracer("bleedwatch").start_as_current_span(f"bleedwatch.{name}", attributes=attributes) as s:
        yield s


def traced(name: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorates a coroutine function: each call runs in ``span(name)``."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with span(name):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


def set_attributes(s: Any, **attributes: int | float | str | bool) -> None:
    if s is not None:
        s.set_attributes(attributes)


def current_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id in hex, for log lines; None outside a trace."""
    if _trace is None:
        return None
    ctx = _trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def traceparent() -> str | None:
    """The current trace context as a W3C ``traceparent`` value, to carry it through the queue."""
    if _trace is None:
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def resumed(parent: str | None) -> Iterator[None]:
    """Spans opened in the block are children of ``parent`` (a ``traceparent`` value), if any."""
    if _trace is None or not parent:
        yield
        return
    token = _context.attach(_propagate.extract({"traceparent": parent}))
    try:
        yield
    finally:
        _context.detach(token)


QUIET_URLS = "/metrics,/healthz,/readyz"  # scrapes and probes: no spans


def _server_request_hook(span: Any, scope: dict[str, Any]) -> None:
    if not span.is_recording():
        return
    attributes = getattr(span, "attributes", None) or {}
    path = scope.get("path", "")
    for name in ("http.target", "url.query", "http.url", "url.full"):
        if name in attributes:
            value = attributes[name]
            span.set_attribute(name, "" if name == "url.query" else str(value).split("?", 1)[0] or path)


def _client_request_hook(span: Any, request: Any) -> None:
    if not span.is_recording():
        return
    parts = urlsplit(str(request.url))
    origin = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"
    attributes = getattr(span, "attributes", None) or {}
    for name in ("http.url", "url.full"):
        if name in attributes:
            span.set_attribute(name, origin)


def configure(enabled: bool, app: Any = None) -> bool:
    """Install an OTLP-exporting SDK tracer provider if asked to and installed; True if it did.

    With ``app``, also instrument it; httpx, redis and SQLAlchemy process-wide. Called where the app is
    created, not in its lifespan: the FastAPI instrumentation wraps the middleware stack, which
    Starlette builds on the first call it serves, the lifespan's own.
    """
    if not enabled:
        return False
    try:
        sdk_trace = importlib.import_module("opentelemetry.sdk.trace")
        export = importlib.import_module("opentelemetry.sdk.trace.export")
        resources = importlib.import_module("opentelemetry.sdk.resources")
        otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        fastapi = importlib.import_module("opentelemetry.instrumentation.fastapi")
        httpx = importlib.import_module("opentelemetry.instrumentation.httpx")
        redis = importlib.import_module("opentelemetry.instrumentation.redis")
        sqlalchemy = importlib.import_module("opentelemetry.instrumentation.sqlalchemy")
    except ImportError:
        log.warning("tracing_unavailable", extra={"hint": "pip install 'bleedwatch-server[tracing]'"})
        return False
    assert _trace is not None  # the SDK depends on the API
    if not isinstance(_trace.get_tracer_provider(), sdk_trace.TracerProvider):  # once per process
        provider = sdk_trace.TracerProvider(resource=resources.Resource.create({"service.name": "bleedwatch"}))
        provider.add_span_processor(export.BatchSpanProcessor(otlp.OTLPSpanExporter()))
        _trace.set_tracer_provider(provider)
    if app is not None:
        fastapi.FastAPIInstrumentor.instrument_app(
            app,
            excluded_urls=QUIET_URLS,
            exclude_spans=["receive", "send"],
            server_request_hook=_server_request_hook,
        )
    http_instrumentor = httpx.HTTPXClientInstrumentor()
    if not http_instrumentor.is_instrumented_by_opentelemetry:
        http_instrumentor.instrument(request_hook=_client_request_hook, async_request_hook=_async_client_hook)
    redis_instrumentor = redis.RedisInstrumentor()
    if not redis_instrumentor.is_instrumented_by_opentelemetry:
        redis_instrumentor.instrument()
    sql_instrumentor = sqlalchemy.SQLAlchemyInstrumentor()
    if not sql_instrumentor.is_instrumented_by_opentelemetry:
        # Engines made after this (service/db.py calls through the module). The package declares
        # SQLAlchemy < 2.1 while its event hooks work on 2.1 (tests/test_tracing.py checks the spans).
        sql_instrumentor.instrument(skip_dep_check=True)
    return True


async def _async_client_hook(span: Any, request: Any) -> None:
    _client_request_hook(span, request)
