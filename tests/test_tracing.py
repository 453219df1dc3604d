"""Optional tracing: spans on the ingest path when an SDK provider is set, never tenant data."""

from __future__ import annotations

import time

import pytest

from service import tracing
from service.auth.keys import Role
from tests.conftest import Api
from tests.traffic import BOILERPLATE, exchange, words

pytestmark = pytest.mark.anyio

otel_trace = pytest.importorskip("opentelemetry.trace")  # the API module service.tracing takes tracers from
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
sdk_export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")


async def test_ingest_is_traced_without_tenant_data(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(sdk_export.SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel_trace, "get_tracer", lambda name, *a, **kw: provider.get_tracer(name))
    now = time.time()
    batch = [
        exchange("tenant-a", "r-a", BOILERPLATE + " " + words("argparse"), words("json", 0, 120), now),
        exchange("tenant-b", "r-b", BOILERPLATE + " " + words("sqlite3"), words("argparse", 60, 100), now + 1),
    ]
    resp = await api.client.post("/v1/exchanges", json={"exchanges": batch}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202
    spans = exporter.get_finished_spans()
    assert {"bleedwatch.ingest", "bleedwatch.match"} <= {s.name for s in spans}
    for span in spans:
        for value in (span.attributes or {}).values():
            assert str(value) not in ("tenant-a", "tenant-b", "r-a", "r-b")


def test_tracing_stays_off_unless_asked() -> None:
    assert tracing.configure(False) is False
    with tracing.span("noop") as span:
        tracing.set_attributes(span, exchanges=1)
