"""The tap's Prometheus metrics, served on a port of their own (``BLEEDWATCH_TAP_METRICS_PORT``).

A registry of its own, not the server's ``service.metrics``: the tap runs beside a gateway, far
from bleedwatch, and its series must not mix with the service's. Each ``Tap`` has one, so tests
can run several. Labels are bounded sets known in advance, all present at 0 from the start;
never a tenant, a request id, a model or any text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from bleedwatch.client import BleedwatchClient

# ``route``: the covered API, ``passed`` (GET, HEAD, BLEEDWATCH_TAP_PASS_PATHS) or ``other`` (refused, 404).
ROUTES = ("chat.completions", "completions", "responses", "messages", "passed", "other")
# ``outcome``: relayed to its end; ``client_gone`` mid-answer; ``upstream_error`` (unreachable or broke off); refused.
OUTCOMES = ("relayed", "client_gone", "upstream_error", "refused")
REFUSALS = ("not_covered", "missing_tenant", "invalid_tenant", "body_too_large")
STAGES = ("connect", "stream")  # the engine unreachable (502), or its answer broken off mid-way
ANSWERS = ("complete", "partial")
SKIPS = ("too_large", "backlog_full", "nothing_to_read", "error")
# Reading a relayed exchange and hashing it: a chat exchange of a few hundred words takes a few ms.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Sdk(Collector):
    """The SDK client's own counts, read at scrape time: it keeps them, the tap does not copy them."""

    def __init__(self, client: Callable[[], BleedwatchClient | None], backlog: Callable[[], int]) -> None:
        self._client = client
        self._backlog = backlog

    def collect(self) -> Iterator[Metric]:
        client = self._client()
        spool = client.spool if client is not None else None
        unsent = (client.pending if client is not None else 0) + (spool.pending_exchanges if spool else 0)
        yield GaugeMetricFamily(
            "bleedwatch_tap_backlog_exchanges", "relayed exchanges waiting to be fingerprinted", value=self._backlog()
        )
        yield GaugeMetricFamily(
            "bleedwatch_tap_sdk_unsent_exchanges",
            "exchanges fingerprinted or being fingerprinted, queued or spooled, not yet delivered",
            value=unsent,
        )
        counts = (
            (client.accepted + client.duplicates, client.spooled, client.dropped) if client is not None else (0, 0, 0)
        )
        for name, doc, value in zip(
            ("shipped", "spooled", "dropped"),
            (
                "exchanges bleedwatch took (accepted or duplicates)",
                "exchanges written to the spool while bleedwatch was away",
                "exchanges lost before delivery (the SDK's dropped_by_reason has why)",
            ),
            counts,
            strict=True,
        ):
            yield CounterMetricFamily(f"bleedwatch_tap_sdk_{name}_exchanges", doc, value=value)


class TapMetrics:
    def __init__(self, client: Callable[[], BleedwatchClient | None], backlog: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "bleedwatch_tap_requests", "requests by route and outcome", ["route", "outcome"], registry=r
        )
        self.refused = Counter("bleedwatch_tap_refused", "requests the tap refused itself", ["reason"], registry=r)
        self.upstream_errors = Counter(
            "bleedwatch_tap_upstream_errors", "engine unreachable or its answer broken off", ["stage"], registry=r
        )
        self.fingerprinted = Counter(
            "bleedwatch_tap_exchanges_fingerprinted",
            "exchanges fingerprinted and handed to the SDK",
            ["answer"],
            registry=r,
        )
        self.skipped = Counter(
            "bleedwatch_tap_exchanges_skipped", "relayed exchanges not fingerprinted", ["reason"], registry=r
        )
        self.fingerprint_seconds = Histogram(
            "bleedwatch_tap_fingerprint_seconds",
            "reading and fingerprinting one relayed exchange",
            buckets=_BUCKETS,
            registry=r,
        )
        r.register(_Sdk(client, backlog))
        for route in ROUTES:
            for outcome in OUTCOMES:
                self.requests.labels(route, outcome)
        for family, values in (
            (self.refused, REFUSALS),
            (self.upstream_errors, STAGES),
            (self.fingerprinted, ANSWERS),
            (self.skipped, SKIPS),
        ):
            for value in values:
                family.labels(value)
        self._server: WSGIServer | None = None

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` in a thread; the port bound (``port`` 0 picks a free one)."""
        self._server, _ = start_http_server(port, host, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# Every metric the tap exports, as docs/metrics.md and docs/tap.md name them.
NAMES = (
    "bleedwatch_tap_requests_total",
    "bleedwatch_tap_refused_total",
    "bleedwatch_tap_upstream_errors_total",
    "bleedwatch_tap_exchanges_fingerprinted_total",
    "bleedwatch_tap_exchanges_skipped_total",
    "bleedwatch_tap_fingerprint_seconds",
    "bleedwatch_tap_backlog_exchanges",
    "bleedwatch_tap_sdk_unsent_exchanges",
    "bleedwatch_tap_sdk_shipped_exchanges_total",
    "bleedwatch_tap_sdk_spooled_exchanges_total",
    "bleedwatch_tap_sdk_dropped_exchanges_total",
)
