"""Every Prometheus metric bleedwatch exports, defined once; docs/metrics.md lists them all.

Conventions: the ``bleedwatch_`` prefix, base units in the name (``_seconds``, ``_bytes``),
counters end in ``_total``, gauges never do. Labels take bounded sets of values only: never a
tenant, a request id or a fingerprint. Operator names (the model; deployment and node, opt-in)
pass through a ``LabelCap`` (held by a ``Labels`` built from settings and passed in): the first
N distinct values get their own label value, every later one is counted as ``other``. Label
values known in advance are pre-initialised, so every series exists (at 0) before its first event
and ``increase()`` sees that first event.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import redis.exceptions
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from sqlalchemy import event

from service.findings.severity import Severity
from service.webhooks.targets import LEGACY_TARGET

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from service.config import Settings
    from service.findings.draft import FindingDraft
    from service.index.base import DocMeta


def registry() -> CollectorRegistry:
    """What /metrics shows: with several uvicorn workers, the sum over all of them.

    ``bleedwatch serve`` sets PROMETHEUS_MULTIPROC_DIR when it starts more than one worker.
    """
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    return merged


SEVERITIES = tuple(Severity)
TEXT_KINDS = ("prompt", "response")
BACKENDS = ("redis", "database")
REJECT_REASONS = (
    "forbidden",
    "payload_too_large",
    "unsupported_media_type",
    "invalid",
    "unavailable",
    "purged",
    "too_many_new_tenants",
)
EXCHANGE_REJECT_REASONS = ("forbidden", "payload_too_large", "invalid", "purged", "too_many_new_tenants")
OTHER = "other"
# Rules of service/deployments/rules.toml known today; service/deployments/risk.py sets every rule it loads.
DEPLOYMENT_RISK_RULES = ("kv_pool_below_context_length",)
# service.signals.schemas.SignalKind (a fixed set; tests/test_metrics.py keeps the two equal).
ENGINE_SIGNAL_KINDS = (
    "kv_transfer_checksum_mismatch",
    "kv_transfer_short",
    "foreign_request_metadata",
    "kv_page_owner_mismatch",
    "kv_transfer_aborted",
)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# From a response being served to bleedwatch knowing of it: SDK batching, retries, ingest, matching.
QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
LAG_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0)
# Powers of two to 512 Ki tokens, then eighths of 1 Mi: fine where KV pools and context lengths sit.
PROMPT_TOKEN_BUCKETS = (
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    131072.0,
    262144.0,
    524288.0,
    655360.0,
    786432.0,
    917504.0,
    1048576.0,
    2097152.0,
)

# --- ingest -----------------------------------------------------------------------------------
# Exchanges indexed and matched (duplicates of earlier ones excluded).
EXCHANGES_INGESTED = Counter("bleedwatch_exchanges_ingested_total", "Exchanges indexed and matched.")
# Exchanges skipped because the same (tenant, request id) was already ingested.
EXCHANGES_DUPLICATE = Counter("bleedwatch_exchanges_duplicate_total", "Exchanges already ingested before.")
# Fingerprints indexed, by text kind (prompt, response).
FINGERPRINTS_INGESTED = Counter("bleedwatch_fingerprints_ingested_total", "Fingerprints indexed.", ["kind"])
# Request bodies received on the ingest endpoint.
INGEST_BYTES = Counter("bleedwatch_ingest_bytes_total", "Bytes of ingest request bodies.")
# Batches refused inside the ingest handler, by reason; 401s and BodyLimit's 413s: the HTTP counter.
INGEST_REJECTED = Counter("bleedwatch_ingest_rejected_total", "Ingest batches refused.", ["reason"])
# Exchanges rejected alone, by reason (invalid, forbidden, payload_too_large, purged: from before their tenant's purge).
EXCHANGES_REJECTED = Counter("bleedwatch_exchanges_rejected_total", "Exchanges refused alone.", ["reason"])
# Whole ingest call: validation and queueing, plus processing when the caller waits for it.
INGEST_DURATION = Histogram(
    "bleedwatch_ingest_duration_seconds", "Time to handle one ingest batch.", buckets=LATENCY_BUCKETS
)
# Accepted batches not yet processed (every replica reports the shared queue's length).
INGEST_QUEUE = Gauge("bleedwatch_ingest_queue_batches", "Batches queued for processing.", multiprocess_mode="max")
# From acceptance to the end of processing: how far detection runs behind the gateways.
INGEST_QUEUE_SECONDS = Histogram(
    "bleedwatch_ingest_queue_seconds", "Time from accepting a batch to processing it.", buckets=QUEUE_BUCKETS
)
# Bytes of the batches queued for processing (BLEEDWATCH_INGEST_QUEUE_MAX_BYTES bounds it).
INGEST_QUEUE_BYTES = Gauge("bleedwatch_ingest_queue_bytes", "Bytes of batches queued.", multiprocess_mode="max")
# Batches refused because the queue was full, in batches or in bytes (answered 503; the SDK retries them).
INGEST_QUEUE_FULL = Counter("bleedwatch_ingest_queue_full_total", "Batches refused with the queue full.")
# Processing attempts that failed with something other than an outage (a bug); the batch is retried.
INGEST_FAILURES = Counter("bleedwatch_ingest_failures_total", "Batch processing attempts that failed.")
# Batches that failed MAX_DELIVERIES times, moved to the dead letters for an operator.
INGEST_DEAD_LETTERS = Counter("bleedwatch_ingest_dead_letters_total", "Batches moved to the dead letters.")
# Matching alone: index insert with hit detection, then evaluation of candidates.
MATCH_DURATION = Histogram(
    "bleedwatch_match_duration_seconds", "Time to index and cross-match one batch.", buckets=LATENCY_BUCKETS
)
# Pieces whose search for a copy to continue stopped at the budget (service/matching/evidence.py):
# a response matching another tenant's text nearly everywhere, by accident or on purpose.
MATCH_BUDGET_CUT = Counter(
    "bleedwatch_match_budget_cut_total", "Copy searches cut short by the per-response matching budget."
)
MATCH_EARLIER_SKIPPED = Counter(
    "bleedwatch_match_earlier_skipped_total",
    "Earlier responses a batch shared text with but not judged again: past the batch's lookup budget.",
)
# Age of each new exchange when ingested (now minus its timestamp): how late detection can be at best.
INGEST_LAG = Histogram("bleedwatch_exchange_ingest_lag_seconds", "Age of exchanges when ingested.", buckets=LAG_BUCKETS)
# Prompt length of every new exchange (gateway's prompt_tokens, else the fingerprinted token count).
EXCHANGE_PROMPT_TOKENS = Histogram(
    "bleedwatch_exchange_prompt_tokens", "Prompt length of ingested exchanges.", buckets=PROMPT_TOKEN_BUCKETS
)
# Exchanges gateways report they dropped before delivery (spool full, gave up); fed by the SDK (issue 7).
SDK_DROPPED = Counter("bleedwatch_sdk_dropped_exchanges_total", "Exchanges gateways report as dropped.")
# Findings the database could not take (unreachable), held in the index's outbox to be written later.
FINDINGS_HELD = Counter("bleedwatch_findings_held_total", "Findings held for the database in the outbox.")
# Findings dropped before being written because a tenant they involve was purged after their response.
FINDINGS_PURGED = Counter("bleedwatch_findings_purged_total", "Findings dropped for a purged tenant.")
# Dead letters deleted unrequeued after BLEEDWATCH_DEAD_LETTER_RETENTION_SECONDS, by where they were (ingest, findings).
DEAD_LETTERS_EXPIRED = Counter("bleedwatch_dead_letters_expired_total", "Dead letters expired.", ["queue"])
DEAD_LETTER_QUEUES = ("ingest", "findings")
# Failed writes of held findings for another reason than an outage (each is retried alone).
FINDINGS_OUTBOX_FAILURES = Counter(
    "bleedwatch_findings_outbox_failures_total", "Held findings the database refused, not for an outage."
)
# Held findings moved to the outbox's dead letters after BLEEDWATCH_FINDINGS_OUTBOX_MAX_ATTEMPTS failed writes.
FINDINGS_DEAD_LETTERS = Counter("bleedwatch_findings_dead_letters_total", "Held findings moved to the dead letters.")
# Findings waiting in the outbox right now (every replica reports the shared outbox's length).
FINDINGS_OUTBOX = Gauge("bleedwatch_findings_outbox", "Findings waiting to be written.", multiprocess_mode="max")
# BLEEDWATCH_FINDINGS_HOLD_SECONDS (service/findings/writer.py): drafts put on hold (a response judged again
# while on hold, with more evidence, is put on hold again), those on hold now, and those withdrawn after it.
FINDINGS_DEFERRED = Counter("bleedwatch_findings_deferred_total", "Findings put on hold, to be judged again.")
FINDINGS_LATER = Gauge("bleedwatch_findings_on_hold", "Findings on hold now.", multiprocess_mode="max")
FINDINGS_WITHDRAWN = Counter(
    "bleedwatch_findings_withdrawn_total", "Findings withdrawn when judged again after the hold.", ["severity"]
)

# --- findings ---------------------------------------------------------------------------------
# Findings created, by severity (a finding extended with more evidence is not counted again).
FINDINGS = Counter("bleedwatch_findings_total", "Findings created.", ["severity"])
# The same findings by model: the first BLEEDWATCH_METRICS_MAX_MODELS models, then "other".
FINDINGS_BY_MODEL = Counter(
    "bleedwatch_findings_by_model_total", "Findings created, by model (capped).", ["model", "severity"]
)
# Findings by deployment and node: opt-in (BLEEDWATCH_METRICS_NODE_LABELS), capped pairs, then "other".
FINDINGS_BY_NODE = Counter(
    "bleedwatch_findings_by_node_total",
    "Findings created, by deployment and node (opt-in, capped).",
    ["deployment", "node"],
)
# Prompt length of the recipient's request of each new finding: where leaks sit against KV pool sizes.
FINDING_PROMPT_TOKENS = Histogram(
    "bleedwatch_finding_prompt_tokens", "Recipient prompt length of new findings.", buckets=PROMPT_TOKEN_BUCKETS
)
# From the leaked response's timestamp to the finding being stored.
DETECTION_LATENCY = Histogram(
    "bleedwatch_detection_latency_seconds", "Response timestamp to finding stored.", buckets=LAG_BUCKETS
)
# Open incidents by severity; set by the incidents feature (issue 5).
OPEN_INCIDENTS = Gauge(
    "bleedwatch_open_incidents", "Incidents not yet resolved.", ["severity"], multiprocess_mode="mostrecent"
)
# Incident events to paging targets (service/webhooks/), by target name (operator-configured, a handful):
# deliveries answered 2xx.
WEBHOOK_DELIVERIES = Counter("bleedwatch_webhook_deliveries_total", "Incident webhooks delivered.", ["target"])
# Delivery attempts that failed (non-2xx, timeout, connection refused); retried with backoff unless refused for good.
WEBHOOK_FAILED_ATTEMPTS = Counter(
    "bleedwatch_webhook_failed_attempts_total", "Incident webhook attempts failed.", ["target"]
)
# Deliveries given up after BLEEDWATCH_WEBHOOK_MAX_ATTEMPTS, on a 400/410/413/422, or whose incident was purged.
WEBHOOK_GIVEN_UP = Counter("bleedwatch_webhook_given_up_total", "Incident webhooks given up.", ["target"])
# Findings counted under "other" because a label's cap was reached (label: model, node).
LABEL_OVERFLOW = Counter("bleedwatch_metric_label_overflow_total", "Label values folded into other.", ["label"])

# --- canaries (issue 3) -----------------------------------------------------------------------
# Canary probes: canaries registered (``bleedwatch canary probe`` registers one, then sends it).
CANARY_PROBES = Counter("bleedwatch_canary_probes_total", "Canary probes registered.")
# When a canary probe's exchange last reached ingest (Unix time; 0 = never): the probe loop works.
CANARY_LAST_SEEN = Gauge(
    "bleedwatch_canary_last_seen_timestamp_seconds", "Last canary exchange ingested.", multiprocess_mode="max"
)
# New findings whose evidence includes a canary: canary text in another tenant's answer, always critical.
CANARY_LEAKS = Counter("bleedwatch_canary_leaks_total", "Canary content found in another tenant's answer.")

# --- deployments and engine signals (issue 4: service/deployments/, service/signals/) ---------
# Deployments currently violating a risk rule (e.g. KV pool smaller than the context length).
DEPLOYMENT_RISK_VIOLATIONS = Gauge(
    "bleedwatch_deployment_risk_violations",
    "Deployments violating a risk rule.",
    ["rule"],
    multiprocess_mode="mostrecent",
)
# Engine integrity signals received, by kind (kinds are defined by service/signals/).
ENGINE_SIGNALS = Counter("bleedwatch_engine_signals_total", "Engine integrity signals received.", ["kind"])
# Deployments with a registered serving config (recomputed from the database, as the risk gauge is).
DEPLOYMENTS = Gauge("bleedwatch_deployments", "Deployments with a registered config.", multiprocess_mode="mostrecent")
# Deployments violating at least one risk rule.
DEPLOYMENTS_AT_RISK = Gauge(
    "bleedwatch_deployments_at_risk", "Deployments violating at least one risk rule.", multiprocess_mode="mostrecent"
)

# --- backends and index -----------------------------------------------------------------------
# Failed calls to a backend, by backend (redis, database).
BACKEND_ERRORS = Counter("bleedwatch_backend_errors_total", "Failed backend calls.", ["backend"])
# Round trips to a backend: Redis commands or pipeline executions, database statements.
BACKEND_ROUND_TRIPS = Counter("bleedwatch_backend_round_trips_total", "Backend round trips.", ["backend"])
# Tenant names dropped from a process's bounded name -> ref cache (BLEEDWATCH_TENANT_CACHE_SIZE).
TENANT_CACHE_EVICTIONS = Counter("bleedwatch_tenant_cache_evictions_total", "Tenant refs evicted from the cache.")
# Items the index holds: Redis keys in its database (DBSIZE), or in-process table entries and documents.
INDEX_ITEMS = Gauge("bleedwatch_index_items", "Items in the index.", multiprocess_mode="mostrecent")
# Memory the index uses: Redis used_memory, or an estimate for the in-process index.
INDEX_MEMORY = Gauge("bleedwatch_index_memory_bytes", "Memory used by the index.", multiprocess_mode="mostrecent")
# What Redis may use before it refuses writes (noeviction): maxmemory summed over the primaries, read
# with INDEX_MEMORY; 0 when a primary has none (unbounded) and for the in-process index.
INDEX_MEMORY_MAX = Gauge(
    "bleedwatch_index_memory_max_bytes", "Memory limit of the index (Redis maxmemory).", multiprocess_mode="mostrecent"
)
# used_memory / maxmemory of the fullest primary: a Redis Cluster refuses writes on the first node that
# is full (a master with more slots, or hot keys), however much room the others have. 0 where none has
# a limit, and for the in-process index. BleedwatchIndexMemoryHigh alerts on it.
INDEX_MEMORY_FULLEST = Gauge(
    "bleedwatch_index_memory_fullest_ratio",
    "Used memory over maxmemory of the fullest Redis primary.",
    multiprocess_mode="mostrecent",
)
# 1 when the Redis in use keeps what was answered 202 (AOF on, maxmemory-policy noeviction, every node), else 0.
REDIS_PERSISTENCE_OK = Gauge(
    "bleedwatch_redis_persistence_ok",
    "Whether the Redis in use persists accepted batches (AOF, noeviction).",
    multiprocess_mode="livemin",  # a process gone (or a CLI command's, before it kept its own) is no vote
)
# BLEEDWATCH_RETENTION_SECONDS: fingerprints stay matchable at least this long.
RETENTION = Gauge("bleedwatch_retention_seconds", "Retention window of the index.", multiprocess_mode="max")
# BLEEDWATCH_ALERT_LINKS_URL as a label, value 1: the alert rules build absolute runbook and dashboard links from it.
ALERT_LINKS = Gauge(
    "bleedwatch_alert_links_info", "Base URL of the alerts' links.", ["base_url"], multiprocess_mode="max"
)

# --- HTTP -------------------------------------------------------------------------------------
# Every HTTP response, by method, route template ("unmatched": no route fits the path) and status code.
HTTP_REQUESTS = Counter("bleedwatch_http_requests_total", "HTTP responses.", ["method", "route", "code"])
# API requests refused before their body was read: key missing, key invalid, or the address out of tries.
AUTH_REFUSED = Counter("bleedwatch_auth_refused_total", "Requests refused for their API key.", ["reason"])
AUTH_REFUSED_REASONS = ("missing", "invalid", "rate_limited")

REDIS_ROUND_TRIPS = BACKEND_ROUND_TRIPS.labels("redis")
DATABASE_ROUND_TRIPS = BACKEND_ROUND_TRIPS.labels("database")

for _kind in TEXT_KINDS:
    FINGERPRINTS_INGESTED.labels(_kind)
for _reason in REJECT_REASONS:
    INGEST_REJECTED.labels(_reason)
for _reason in EXCHANGE_REJECT_REASONS:
    EXCHANGES_REJECTED.labels(_reason)
for _queue in DEAD_LETTER_QUEUES:
    DEAD_LETTERS_EXPIRED.labels(_queue)
# Gauges are set, not just created: in multiprocess mode an unset "mostrecent" gauge is not exported.
FINDINGS_OUTBOX.set(0)
FINDINGS_LATER.set(0)
REDIS_PERSISTENCE_OK.set(0)
for _severity in SEVERITIES:
    FINDINGS.labels(_severity)
    FINDINGS_WITHDRAWN.labels(_severity)
    OPEN_INCIDENTS.labels(_severity).set(0)
for _label in ("model", "node"):
    LABEL_OVERFLOW.labels(_label)
for _rule in DEPLOYMENT_RISK_RULES:
    DEPLOYMENT_RISK_VIOLATIONS.labels(_rule).set(0)
for _signal in ENGINE_SIGNAL_KINDS:
    ENGINE_SIGNALS.labels(_signal)
for _reason in AUTH_REFUSED_REASONS:
    AUTH_REFUSED.labels(_reason)
for _backend in BACKENDS:
    BACKEND_ERRORS.labels(_backend)
    BACKEND_ROUND_TRIPS.labels(_backend)


class LabelCap:
    """Bounds an operator-named label: the first ``limit`` distinct values keep their own series."""

    def __init__(self, limit: int, *, enabled: bool = True) -> None:
        self.limit = limit
        self.enabled = enabled
        self._seen: set[Hashable] = set()

    def admit(self, value: Hashable) -> bool:
        """Whether ``value`` has (or now gets) a label value of its own; False means count it as OTHER."""
        if value in self._seen:
            return True
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return True
        return False


class Labels:
    """The caps on the model and node labels, built from settings once per process and passed to
    whoever records exchanges and findings (the ingestor and the findings writer share one), so no
    module global decides a label and tests build their own."""

    def __init__(self, models: LabelCap | None = None, nodes: LabelCap | None = None) -> None:
        self.models = models or LabelCap(50)
        self.nodes = nodes or LabelCap(50, enabled=False)
        self.initialised: set[Hashable] = set()  # label values whose finding series exist (bounded by the caps)

    @classmethod
    def from_settings(cls, settings: Settings) -> Labels:
        return cls(
            LabelCap(settings.metrics_max_models, enabled=settings.metrics_model_label),
            LabelCap(settings.metrics_max_nodes, enabled=settings.metrics_node_labels),
        )

    def model(self, model: str, *, count_overflow: bool) -> str | None:
        if not self.models.enabled:
            return None
        if self.models.admit(model):
            return model
        if count_overflow:
            LABEL_OVERFLOW.labels("model").inc()
        return OTHER

    def node(self, deployment: object, node: object, *, count_overflow: bool) -> tuple[str, str] | None:
        if not self.nodes.enabled:
            return None
        pair = ("unknown" if deployment is None else str(deployment), "unknown" if node is None else str(node))
        if self.nodes.admit(pair):
            return pair
        if count_overflow:
            LABEL_OVERFLOW.labels("node").inc()
        return OTHER, OTHER


def configure(settings: Settings) -> None:
    """Set the gauges that mirror settings (once per app start); label caps are ``Labels.from_settings``."""
    RETENTION.set(settings.retention_seconds)
    if settings.alert_links_url is not None:
        ALERT_LINKS.labels(settings.alert_links_url).set(1)
    REDIS_PERSISTENCE_OK.set(0)  # until Redis says otherwise; the embedded in-process index keeps nothing
    # Every configured paging target's series from 0, so a rate or an alert sees its first failure.
    targets = [t.name for t in settings.paging_targets] + ([LEGACY_TARGET] if settings.webhook_url else [])
    for target in targets:
        for counter in (WEBHOOK_DELIVERIES, WEBHOOK_FAILED_ATTEMPTS, WEBHOOK_GIVEN_UP):
            counter.labels(target)


def record_exchange(prompt: DocMeta, now: float, labels: Labels) -> None:
    """One new exchange, from its prompt's metadata: prompt length, age, label slots for model and node.

    Taking the slots here, before any finding, pre-initialises the model's finding series at 0.
    """
    prompt_tokens = prompt.context.get("prompt_tokens")
    EXCHANGE_PROMPT_TOKENS.observe(prompt_tokens if isinstance(prompt_tokens, int) else prompt.token_count)
    INGEST_LAG.observe(max(0.0, now - prompt.ts))
    model_label = labels.model(prompt.model, count_overflow=False)
    if model_label is not None and ("model", model_label) not in labels.initialised:
        labels.initialised.add(("model", model_label))
        for severity in SEVERITIES:
            FINDINGS_BY_MODEL.labels(model_label, severity)
    nodes = labels.node(prompt.context.get("deployment"), prompt.context.get("node"), count_overflow=False)
    if nodes is not None and ("node", nodes) not in labels.initialised:
        labels.initialised.add(("node", nodes))
        FINDINGS_BY_NODE.labels(*nodes)


def record_finding(draft: FindingDraft, labels: Labels) -> None:
    """One finding created (not one extended)."""
    FINDINGS.labels(draft.severity).inc()
    model_label = labels.model(draft.model, count_overflow=True)
    if model_label is not None:
        FINDINGS_BY_MODEL.labels(model_label, draft.severity).inc()
    nodes = labels.node(draft.deployment, draft.node, count_overflow=True)
    if nodes is not None:
        FINDINGS_BY_NODE.labels(*nodes).inc()
    if draft.prompt_tokens is not None:
        FINDING_PROMPT_TOKENS.observe(draft.prompt_tokens)
    DETECTION_LATENCY.observe(max(0.0, time.time() - draft.response_at.timestamp()))
    if any(source.get("canary") for source in draft.evidence.get("sources", ())):
        CANARY_LEAKS.inc()


def http_response(method: str, route: str, status: int) -> None:
    """One HTTP response; ``method`` is one of HTTP_METHODS or OTHER, ``route`` a route template."""
    HTTP_REQUESTS.labels(method, route, str(status)).inc()


def instrument_engine(engine: AsyncEngine) -> None:
    """Count every statement the database engine sends."""

    def count(*_: object) -> None:
        DATABASE_ROUND_TRIPS.inc()

    if not event.contains(engine.sync_engine, "before_cursor_execute", count):
        event.listen(engine.sync_engine, "before_cursor_execute", count)


@dataclass(frozen=True, slots=True)
class IndexStats:
    items: int
    memory_bytes: int
    memory_max_bytes: int = 0  # Redis maxmemory (summed over primaries); 0: no limit, or in-process
    memory_fullest: float = 0.0  # used / maxmemory of the fullest primary with a limit; 0: none has one


@runtime_checkable
class ReportsStats(Protocol):
    async def stats(self) -> IndexStats: ...


class ReportsSize(Protocol):
    async def size(self) -> int: ...

    async def byte_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Durability:
    """Whether Redis keeps what bleedwatch answered 202 for: the queue, idempotency marks, outbox."""

    aof: bool  # every node appends writes to its AOF (a restart replays them)
    eviction_policy: str  # maxmemory-policy; a node's that is not noeviction, if any

    @property
    def ok(self) -> bool:
        return self.aof and self.eviction_policy == "noeviction"


@runtime_checkable
class ReportsDurability(Protocol):
    async def durability(self) -> Durability: ...


class IndexStatsCache:
    """Index size, memory and its limit for /metrics, asked of the backend at most every ``max_age_seconds``.

    Two cheap calls for Redis (DBSIZE, INFO memory) under a short timeout, never a SCAN.
    """

    def __init__(self, max_age_seconds: float = 15.0, timeout_seconds: float = 1.0) -> None:
        self.max_age_seconds = max_age_seconds
        self.timeout_seconds = timeout_seconds
        self._at = -float("inf")

    async def refresh(self, index: object, queue: ReportsSize | None = None) -> None:
        """Every process that serves /metrics calls this, API and worker alike: each is scraped, and
        an alert takes the min or max over them (a worker's 0 would say Redis does not persist).
        The queue's depth too when given: by an API replica without workers, so that a queue no
        worker drains shows there (a process with workers sets it in their recovery round)."""
        now = time.monotonic()
        if now - self._at < self.max_age_seconds or not isinstance(index, ReportsStats):
            return
        self._at = now
        try:
            stats = await asyncio.wait_for(index.stats(), self.timeout_seconds)
            if queue is not None:
                INGEST_QUEUE.set(await asyncio.wait_for(queue.size(), self.timeout_seconds))
                INGEST_QUEUE_BYTES.set(await asyncio.wait_for(queue.byte_size(), self.timeout_seconds))
        except (redis.exceptions.RedisError, OSError, TimeoutError):
            BACKEND_ERRORS.labels("redis").inc()
            return
        INDEX_ITEMS.set(stats.items)
        INDEX_MEMORY.set(stats.memory_bytes)
        INDEX_MEMORY_MAX.set(stats.memory_max_bytes)
        INDEX_MEMORY_FULLEST.set(stats.memory_fullest)
        if isinstance(index, ReportsDurability):
            try:
                durability = await asyncio.wait_for(index.durability(), self.timeout_seconds)
            except (redis.exceptions.RedisError, OSError, TimeoutError):
                BACKEND_ERRORS.labels("redis").inc()
                return
            REDIS_PERSISTENCE_OK.set(int(durability.ok))


INDEX_STATS = IndexStatsCache()
