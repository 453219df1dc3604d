"""Every Prometheus metric bleedwatch exports, defined once (docs/metrics.md lists them).

Labels are bounded sets only: never a tenant, request id, model or fingerprint.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess


def registry() -> CollectorRegistry:
    """What /metrics shows: with several uvicorn workers, the sum over all of them.

    ``bleedwatch serve`` sets PROMETHEUS_MULTIPROC_DIR when it starts more than one worker.
    """
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    return merged


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Exchanges indexed and matched (duplicates of earlier ones excluded).
EXCHANGES_INGESTED = Counter("bleedwatch_exchanges_ingested_total", "Exchanges indexed and matched.")
# Exchanges skipped because the same (tenant, request id) was already ingested.
EXCHANGES_DUPLICATE = Counter("bleedwatch_exchanges_duplicate_total", "Exchanges already ingested before.")
# Fingerprints indexed, by text kind.
FINGERPRINTS_INGESTED = Counter("bleedwatch_fingerprints_ingested_total", "Fingerprints indexed.", ["kind"])
# Request bodies received on the ingest endpoint.
INGEST_BYTES = Counter("bleedwatch_ingest_bytes_total", "Bytes of ingest request bodies.")
# Batches refused, by reason (too_large, invalid, forbidden, unavailable).
INGEST_REJECTED = Counter("bleedwatch_ingest_rejected_total", "Ingest batches refused.", ["reason"])
# Findings created (a finding extended with more evidence is not counted again).
FINDINGS = Counter("bleedwatch_findings_total", "Findings created.", ["severity"])
# Whole ingest call: validation, index, matching, findings.
INGEST_DURATION = Histogram(
    "bleedwatch_ingest_duration_seconds", "Time to handle one ingest batch.", buckets=LATENCY_BUCKETS
)
# Matching alone: index insert with hit detection, then evaluation of candidates.
MATCH_DURATION = Histogram(
    "bleedwatch_match_duration_seconds", "Time to index and cross-match one batch.", buckets=LATENCY_BUCKETS
)
# Failed calls to a backend, by backend (redis, database).
BACKEND_ERRORS = Counter("bleedwatch_backend_errors_total", "Failed backend calls.", ["backend"])
