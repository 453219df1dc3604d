"""Settings from the environment (``BLEEDWATCH_*``); the README's configuration table lists them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    # Detection thresholds (docs/detection.md explains each).
    common_prompt_tenants: int = Field(3, ge=2, le=64)
    common_tenants: int = Field(8, ge=2, le=64)
    min_matched_fingerprints: int = Field(2, ge=1)
    min_run_tokens: int = Field(12, ge=1)
    high_run_tokens: int = Field(32, ge=1)
    critical_run_tokens: int = Field(128, ge=1)
    lists_refresh_seconds: float = Field(10.0, ge=0)

    # Input limits: every one answers 4xx with a message, never a silent drop.
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_batch_exchanges: int = Field(1000, ge=1)
    max_fingerprints_per_text: int = Field(500_000, ge=1)
    max_future_seconds: int = Field(300, ge=0)

    api_key_cache_seconds: float = Field(10.0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(8400, ge=0, le=65535)
    workers: int = Field(1, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"

    # Observability (docs/metrics.md): operator-named labels are capped; deployment and node are opt-in.
    metrics_model_label: bool = True
    metrics_max_models: int = Field(50, ge=1, le=1000)
    metrics_node_labels: bool = False
    metrics_max_nodes: int = Field(50, ge=1, le=1000)
    tracing: bool = False

    @property
    def embedded(self) -> bool:
        return self.redis_url is None

    @property
    def generation_seconds(self) -> int:
        """Generations are whole keys that expire together; see docs/capacity.md."""
        return -(-self.retention_seconds // (self.index_generations - 1))

    def sqlalchemy_url(self, *, asynchronous: bool) -> str:
        url = self.database_url or f"sqlite:///{(self.data_dir / 'bleedwatch.db').resolve()}"
        scheme, _, rest = url.partition("://")
        base = scheme.split("+", 1)[0]
        if base in ("postgres", "postgresql"):
            return f"postgresql+psycopg://{rest}"
        if base == "sqlite":
            return f"sqlite+aiosqlite://{rest}" if asynchronous else f"sqlite://{rest}"
        raise ValueError(f"BLEEDWATCH_DATABASE_URL must be postgresql:// or sqlite://, not {base}://")
