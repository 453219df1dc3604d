"""Optional tracing: spans on the ingest path when an SDK provider is set, never tenant data."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from service import tracing
from service.auth.keys import Role
from service.config import Settings
from service.local_server import free_port
from tests.conftest import REDIS_URL, Api, _create_keys, _drop_prefix
from tests.conftest import _truncate as truncate
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


class Collector:
    """An OTLP/HTTP receiver on a loopback port: what the exporters of the processes under test send."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        spans: list[Any] = []
        self.spans = spans

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[Any]:
        return [s for s in self.spans if s.trace_id.hex() == trace_id]


def _strings(span: Any) -> list[str]:
    values = [span.name]
    for attribute in span.attributes:
        values.append(attribute.value.string_value or str(attribute.value.int_value))
    return values


async def test_a_gateways_trace_runs_through_the_queue_into_the_worker(pg_url: str, tmp_path: Path) -> None:
    """serve (no workers) and work as separate processes, exporting to a local OTLP receiver: the
    gateway's traceparent is honoured, the worker's spans join its trace through the queue, redis
    and SQL are traced, log lines carry the trace id, and no span holds a tenant or request id."""
    pytest.importorskip("opentelemetry.instrumentation.fastapi")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from tests.test_end_to_end import traffic
    from tests.test_shutdown import serve
    from tests.test_work import work

    truncate(pg_url)
    prefix = f"bwtrace{uuid.uuid4().hex[:8]}"
    tokens = await _create_keys(Settings(redis_url=REDIS_URL, database_url=pg_url, key_prefix=prefix))
    collector = Collector()
    env = os.environ | {
        "BLEEDWATCH_REDIS_URL": REDIS_URL,
        "BLEEDWATCH_DATABASE_URL": pg_url,
        "BLEEDWATCH_KEY_PREFIX": prefix,
        "BLEEDWATCH_RATE_LIMIT_PER_SECOND": "0",
        "BLEEDWATCH_LOG_LEVEL": "info",
        "BLEEDWATCH_TRACING": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    traced = {"traceparent": f"00-{trace_id}-{parent}-01"}
    api_port, work_port = free_port(), free_port()
    procs = [serve(env | {"BLEEDWATCH_INGEST_WORKERS": "0"}, api_port, tmp_path), work(env, work_port, tmp_path)]
    batches = traffic(time.time())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=30) as client:
            ingest = {"Authorization": f"Bearer {tokens[Role.INGEST]}", "Prefer": "respond-async"}
            read = {"Authorization": f"Bearer {tokens[Role.READ]}"}
            for name, batch in batches.items():
                headers = ingest | (traced if name == "leak" else {})
                resp = await client.post("/v1/exchanges", json={"exchanges": batch}, headers=headers)
                assert resp.status_code == 202, resp.text
            deadline = time.monotonic() + 30
            while not (await client.get("/v1/findings", headers=read)).json()["items"]:
                assert time.monotonic() < deadline, "no finding"
                await asyncio.sleep(0.1)
            resp = await client.get("/v1/incidents", params={"tenant": "tenant-a"}, headers=read | traced)
            assert resp.status_code == 200
        deadline = time.monotonic() + 15
        while not any(s.name == "bleedwatch.ingest" for s in collector.of_trace(trace_id)):
            assert time.monotonic() < deadline, sorted({s.name for s in collector.spans})
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the last spans of the batch
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
        collector.server.shutdown()
        collector.server.server_close()
        _drop_prefix(prefix)

    spans = collector.of_trace(trace_id)
    names = {s.name for s in spans}
    assert "POST /v1/exchanges" in names  # the server span, a child of the gateway's
    assert "GET /v1/incidents" in names
    assert {"bleedwatch.accept", "bleedwatch.ingest", "bleedwatch.match"} <= names  # the worker's, via the queue
    assert any(s.parent_span_id.hex() == parent for s in spans)
    assert any(s.name.startswith("EVALSHA") or s.name == "XADD" for s in spans), names  # redis
    assert any(s.name.split()[0] in ("SELECT", "INSERT", "UPDATE") for s in spans), " ".join(sorted(names))  # SQL
    secret = {"tenant-a", "tenant-b", "tenant-c", "tenant-d", "r-a", "r-b", "r-c", "r-d"}
    for span in collector.spans:
        for value in _strings(span):
            assert value not in secret, (span.name, value)
            assert not any(s in value for s in secret if len(s) > 3), (span.name, value)
    logged = [
        json.loads(line) for line in (tmp_path / f"work-{work_port}.log").read_text().splitlines() if line[:1] == "{"
    ]
    assert any(line.get("trace_id") == trace_id for line in logged), logged[-5:]
