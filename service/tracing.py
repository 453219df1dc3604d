"""Optional OpenTelemetry spans on the ingest path; a no-op unless tracing is set up.

Spans come from the OpenTelemetry API when it is importable; without an SDK tracer provider they
record nothing. ``BLEEDWATCH_TRACING=true`` with the ``tracing`` extra installed
(``pip install 'bleedwatch[tracing]'``) makes ``bleedwatch serve`` install an SDK provider that
exports over OTLP/HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables.

Span attributes are counts and sizes only: never a tenant, a request id or a fingerprint.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

try:
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


def configure(enabled: bool) -> bool:
    """Install an OTLP-exporting SDK tracer provider if asked to and installed; True if it did."""
    if not enabled:
        return False
    try:
        sdk_trace = importlib.import_module("opentelemetry.sdk.trace")
        export = importlib.import_module("opentelemetry.sdk.trace.export")
        resources = importlib.import_module("opentelemetry.sdk.resources")
        otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    except ImportError:
        log.warning("tracing_unavailable", extra={"hint": "pip install 'bleedwatch[tracing]'"})
        return False
    assert _trace is not None  # the SDK depends on the API
    provider = sdk_trace.TracerProvider(resource=resources.Resource.create({"service.name": "bleedwatch"}))
    provider.add_span_processor(export.BatchSpanProcessor(otlp.OTLPSpanExporter()))
    _trace.set_tracer_provider(provider)
    return True
