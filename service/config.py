"""Settings from the environment (``BLEEDWATCH_*``); the README's configuration table lists them."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bleedwatch.limits import DEFAULT_MAX_BATCH_EXCHANGES, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_FINGERPRINTS_PER_TEXT
from service.webhooks import targets as paging

KEY_ID = re.compile(r"^[0-9a-f]{16}$")


class DataDirUnusable(Exception):
    """BLEEDWATCH_DATA_DIR cannot be created: the directory and the OS error, printed as one line."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BLEEDWATCH_", extra="ignore")

    # Backends: both unset means the embedded default (SQLite file + in-process index).
    redis_url: str | None = None
    redis_cluster: bool = False
    database_url: str | None = None
    data_dir: Path = Path(".bleedwatch")
    key_prefix: str = Field("bw", pattern=r"^[A-Za-z0-9_.-]{1,32}$")

    # Matching window: fingerprints stay matchable for at least this long.
    retention_seconds: int = Field(3600, ge=60, le=30 * 86400)
    index_generations: int = Field(4, ge=2, le=24)
    index_bucket_bits: int = Field(16, ge=8, le=24)
    # Tenant name -> ref entries each process caches (least recently used dropped first; Redis only).
    tenant_cache_size: int = Field(100_000, ge=1)

    # Detection thresholds (docs/detection.md explains each).
    common_prompt_tenants: int = Field(3, ge=2, le=64)
    common_tenants: int = Field(8, ge=2, le=64)
    min_matched_fingerprints: int = Field(2, ge=1)
    # A copy's copied tokens beyond n - 1 per piece (docs/detection.md, "The finding rule").
    min_copy_score: int = Field(9, ge=1)
    high_run_tokens: int = Field(32, ge=1)
    critical_run_tokens: int = Field(128, ge=1)
    # The longest a request lasts at the gateway, clock skew included: a prompt sent more than this after
    # an answer is not its source (docs/detection.md).
    max_request_seconds: int = Field(900, ge=0, le=86400)
    lists_refresh_seconds: float = Field(10.0, ge=0)

    # Input limits: every one answers 4xx with a message, never a silent drop.
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, ge=1024
    )  # routes that carry fingerprints (service/body_limit.py)
    max_other_body_bytes: int = Field(1024 * 1024, ge=1024)
    max_batch_exchanges: int = Field(DEFAULT_MAX_BATCH_EXCHANGES, ge=1)
    max_fingerprints_per_text: int = Field(DEFAULT_MAX_FINGERPRINTS_PER_TEXT, ge=1)
    max_future_seconds: int = Field(300, ge=0)
    # Exchanges older than this are refused; unset = the findings retention (a finding would be pruned at once).
    max_age_seconds: int | None = Field(None, ge=60)
    # Fingerprint key ids gateways may use (comma-separated); empty = any well-formed one.
    accepted_key_ids: Annotated[frozenset[str], NoDecode] = frozenset()
    # Tenants not seen before that one ingest key may introduce per clock minute; more are rejected
    # per exchange (each name is stored until purged, so invented names would grow state without end). 0 = off.
    new_tenants_per_key_per_minute: int = Field(1_000, ge=0)
    # Ingest queue (service/ingest/worker.py): batches accepted but not yet processed.
    ingest_queue_max_batches: int = Field(1_000, ge=1)
    # ... and bytes of them: a few 32 MB batches fill Redis as surely as many small ones. 512 MiB, a
    # quarter of the shipped Redis' 2 GB: the queue refuses before Redis does (docs/capacity.md).
    # 0 = batches only.
    ingest_queue_max_bytes: int = Field(512 * 1024**2, ge=0)
    # Streams the queue is spread over (service/index/queue.py ShardedQueue); 1 = one stream, as on one node.
    ingest_queue_shards: int = Field(1, ge=1, le=256)
    # Batches processed at once, per process; 0 = none: an API replica whose batches `bleedwatch work` processes.
    ingest_workers: int = Field(4, ge=0, le=64)
    ingest_wait_seconds: float = Field(30.0, ge=0)  # how long an answer without Prefer: respond-async waits
    # Dead letters (ingest batches, held findings) not requeued within this long are deleted.
    dead_letter_retention_seconds: int = Field(7 * 86400, ge=60)
    # A held finding the database refuses (not an outage) this many times goes to the outbox's dead letters.
    findings_outbox_max_attempts: int = Field(5, ge=1, le=1000)
    # A finding waits this long and is judged again before it is raised; 0: at once (service/findings/writer.py).
    findings_hold_seconds: float = Field(0.0, ge=0, le=86400)
    ingest_reclaim_seconds: float = Field(30.0, gt=0)  # a batch held this long by a silent replica is taken over
    # Per API key token bucket: every request takes one token (an ingest batch is one request); 0 = off.
    rate_limit_per_second: float = Field(50.0, ge=0)
    rate_limit_burst: int = Field(100, ge=1)
    # Per client address: every refused API key takes a token; with none left, 429 (service/auth/failures.py); 0 = off.
    auth_failures_per_second: float = Field(1.0, ge=0)
    auth_failures_burst: int = Field(20, ge=1)

    # Incidents (docs/incidents.md): findings of one model and deployment within this gap are one incident.
    incident_quiet_seconds: int = Field(3600, ge=1)
    incident_refresh_seconds: float = Field(15.0, gt=0)
    # Outgoing webhook on every new incident, signed with HMAC-SHA256; unset URL = no webhook.
    webhook_url: str | None = Field(None, pattern=r"^https?://")
    webhook_secret: str | None = Field(None, min_length=16)
    webhook_max_attempts: int = Field(8, ge=1, le=100)
    webhook_backoff_seconds: float = Field(5.0, gt=0)
    webhook_timeout_seconds: float = Field(10.0, gt=0)
    webhook_poll_seconds: float = Field(2.0, gt=0)
    # Paging targets (docs/paging.md): a JSON list of PagerDuty, Slack and Standard Webhooks targets,
    # each routed by severity; secrets are named by environment variable, never inline.
    paging_targets: Annotated[tuple[paging.TargetConfig, ...], NoDecode] = ()
    # Where responders reach this API, for links in webhooks (e.g. https://bleedwatch.example.net).
    public_url: str | None = Field(None, pattern=r"^https?://")
    # Base of the alerts' runbook_url (<base>/runbooks/<name>.md) and dashboard_url (<base>/d/<uid>):
    # exported as bleedwatch_alert_links_info, which the rules' templates read (rule files cannot
    # read settings). docs/metrics.md#links-in-alerts.
    alert_links_url: str | None = Field(None, pattern=r"^https?://\S*[^/\s]$")

    # Retention of what the database holds, pruned by one replica at a time every prune_interval_seconds.
    findings_retention_days: int = Field(90, ge=1, le=36500)
    incidents_retention_days: int = Field(365, ge=1, le=36500)
    audit_retention_days: int = Field(365, ge=1, le=36500)
    prune_interval_seconds: float = Field(3600.0, ge=0)  # 0 = no background pruning (use bleedwatch prune)
    # HMAC key of the tenant digests in audit entries (service/audit/log.py); unset = a file in data_dir.
    audit_secret: SecretStr | None = Field(None, min_length=16)

    api_key_cache_seconds: float = Field(10.0, ge=0)
    # The responder UI at /ui (service/ui/): how long a sign-in lasts, and whether its cookie is Secure
    # (https, or http on localhost; false for plain-http development on any other host name).
    ui_session_seconds: int = Field(8 * 3600, ge=60, le=7 * 86400)
    ui_cookie_secure: bool = True
    # While the database is down, a cached key keeps working this long past its cache period, no longer.
    api_key_stale_seconds: float = Field(300.0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(8400, ge=0, le=65535)
    # Proxies (addresses or CIDR networks, "*" for any) whose X-Forwarded-For names the client: its
    # address keys the auth-failure buckets. None: uvicorn's FORWARDED_ALLOW_IPS, else the loopback.
    forwarded_allow_ips: str | None = None
    work_port: int = Field(8401, ge=0, le=65535)  # `bleedwatch work`: /metrics, /healthz, /readyz
    workers: int = Field(1, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"

    # Observability (docs/metrics.md): operator-named labels are capped; deployment and node are opt-in.
    metrics_model_label: bool = True
    metrics_max_models: int = Field(50, ge=1, le=1000)
    metrics_node_labels: bool = False
    metrics_max_nodes: int = Field(50, ge=1, le=1000)
    tracing: bool = False

    # Deployment risk (docs/deployment-risk.md): a rules file replacing the shipped
    # service/deployments/rules.toml, and how often every replica recomputes the risk gauges
    # from the database (also at start and on PUT).
    risk_rules_file: Path | None = None
    risk_refresh_seconds: float = Field(15.0, gt=0)

    @field_validator("accepted_key_ids", mode="before")
    @classmethod
    def _split_key_ids(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | set | frozenset | tuple):
            for key_id in value:
                if not isinstance(key_id, str) or not KEY_ID.match(key_id):
                    raise ValueError("BLEEDWATCH_ACCEPTED_KEY_IDS: give 16-hex-digit key ids, comma-separated")
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: str | None) -> str | None:
        for part in (value or "").split(","):
            if part.strip() not in ("", "*"):
                try:
                    ipaddress.ip_network(part.strip(), strict=False)
                except ValueError:
                    raise ValueError(f"{part.strip()!r} is no IP address or network (CIDR), nor *") from None
        return value

    @field_validator("risk_rules_file")
    @classmethod
    def _rules_load(cls, value: Path | None) -> Path | None:
        """A rules file that does not load is a setting to fix, said before anything starts."""
        if value is not None:
            from service.deployments.rules import load_rules

            load_rules(value)
        return value

    @model_validator(mode="after")
    def _someone_processes(self) -> Settings:
        if self.ingest_workers == 0 and self.redis_url is None:
            raise ValueError(
                "BLEEDWATCH_INGEST_WORKERS=0 needs BLEEDWATCH_REDIS_URL: the embedded queue is processed "
                "only by the serving process's own workers"
            )
        return self

    @field_validator("paging_targets", mode="before")
    @classmethod
    def _parse_targets(cls, value: object) -> object:
        if isinstance(value, str):
            return paging.parse(value) if value.strip() else ()
        if isinstance(value, list):
            return paging.parse(value)
        return value

    @model_validator(mode="after")
    def _targets_usable(self) -> Settings:
        if self.webhook_url is not None and any(t.name == paging.LEGACY_TARGET for t in self.paging_targets):
            raise ValueError(
                f"BLEEDWATCH_PAGING_TARGETS: the name {paging.LEGACY_TARGET!r} is BLEEDWATCH_WEBHOOK_URL's; "
                "rename the target"
            )
        paging.check_secrets(self.paging_targets)
        return self

    @model_validator(mode="after")
    def _hold_within_window(self) -> Settings:
        if self.findings_hold_seconds >= self.retention_seconds:
            raise ValueError(
                "BLEEDWATCH_FINDINGS_HOLD_SECONDS must be shorter than BLEEDWATCH_RETENTION_SECONDS: a finding is "
                "judged again against the fingerprints still in the window"
            )
        return self

    @model_validator(mode="after")
    def _webhook_needs_secret(self) -> Settings:
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ValueError("BLEEDWATCH_WEBHOOK_URL needs BLEEDWATCH_WEBHOOK_SECRET (16+ characters) to sign bodies")
        return self

    @property
    def effective_max_age_seconds(self) -> int:
        return self.max_age_seconds if self.max_age_seconds is not None else self.findings_retention_days * 86400

    @property
    def embedded(self) -> bool:
        return self.redis_url is None

    @property
    def generation_seconds(self) -> int:
        """Generations are whole keys that expire together; see docs/capacity.md."""
        return -(-self.retention_seconds // (self.index_generations - 1))

    @property
    def needs_data_dir(self) -> bool:
        """The embedded SQLite file, or the audit digests' key file, lives there."""
        return self.database_url is None or self.audit_secret is None

    def make_data_dir(self) -> Path:
        """The data directory, created if missing; a path that cannot be (under a file, read-only,
        not allowed) raised as one line naming it, not a traceback from pathlib."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirUnusable(
                f"BLEEDWATCH_DATA_DIR {self.data_dir}: cannot create it: {exc.strerror or type(exc).__name__}"
            ) from None
        return self.data_dir

    def sqlalchemy_url(self, *, asynchronous: bool) -> str:
        url = self.database_url or f"sqlite:///{(self.data_dir / 'bleedwatch.db').resolve()}"
        scheme, _, rest = url.partition("://")
        base = scheme.split("+", 1)[0]
        if base in ("postgres", "postgresql"):
            return f"postgresql+psycopg://{rest}"
        if base == "sqlite":
            return f"sqlite+aiosqlite://{rest}" if asynchronous else f"sqlite://{rest}"
        raise ValueError(f"BLEEDWATCH_DATABASE_URL must be postgresql:// or sqlite://, not {base}://")
