"""The tap's settings: ``BLEEDWATCH_TAP_*``, and the SDK's own three for bleedwatch and the key.

``BLEEDWATCH_URL``, ``BLEEDWATCH_API_KEY`` (an ingest key) and ``BLEEDWATCH_FINGERPRINT_KEY``
(hex) are the names the LiteLLM callback and ``bleedwatch replay`` read: one gateway
deployment configures them once, whichever way it reports.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bleedwatch.fingerprint.scheme import key_from_hex

# A header name as HTTP allows it (RFC 9110 token), kept lower case: ASGI gives them so.
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]{1,64}$")
MIB = 1024 * 1024


class TapSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BLEEDWATCH_TAP_", extra="ignore")

    # The engine (or the next hop towards it) requests are forwarded to: a base URL, the path is kept.
    upstream_url: str = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(8410, ge=0, le=65535)
    # Prometheus /metrics on a port of its own (same host), so the proxied API never serves it; "off" disables.
    metrics_port: int | None = Field(8411, ge=0, le=65535)
    # Set by the gateway after authentication; a covered request without it is refused (400).
    tenant_header: str = "x-tenant-id"
    # Request bodies: a 1M-token prompt is about 4-6 MB of JSON; bigger is refused (413) before forwarding.
    max_body_bytes: int = Field(32 * MIB, ge=1024)
    # Answers longer than this are relayed whole but not fingerprinted (counted as skipped "too_large").
    max_response_bytes: int = Field(32 * MIB, ge=1024)
    # Paths forwarded unchanged and unchecked besides the four covered APIs and GET/HEAD requests
    # (comma-separated exact paths, e.g. /v1/embeddings). Any other request is refused (404).
    pass_paths: Annotated[frozenset[str], NoDecode] = frozenset()
    # Where an answer was served: a fixed deployment name, or the upstream's response headers that say it.
    deployment: str | None = None
    deployment_header: str | None = None
    node_header: str | None = None
    upstream_connect_seconds: float = Field(5.0, gt=0)
    # Between two reads of an answer: a long prefill or a slow decode step must fit.
    upstream_read_seconds: float = Field(600.0, gt=0)
    # Connections kept to the upstream: above the streams in flight, or new ones are opened per request.
    upstream_connections: int = Field(1000, ge=1)

    # Where fingerprints go, as for the SDK and the LiteLLM callback.
    bleedwatch_url: str = Field(
        "http://127.0.0.1:8400", validation_alias=AliasChoices("BLEEDWATCH_URL", "bleedwatch_url")
    )
    bleedwatch_api_key: SecretStr = Field(validation_alias=AliasChoices("BLEEDWATCH_API_KEY", "bleedwatch_api_key"))
    fingerprint_key: SecretStr = Field(validation_alias=AliasChoices("BLEEDWATCH_FINGERPRINT_KEY", "fingerprint_key"))
    # Processes that read and fingerprint relayed answers; 0 = a thread of the tap's own process, where the
    # hashing shares the relaying's GIL. Throughput per process: docs/performance.md, "The tap".
    fingerprint_workers: int = Field(1, ge=0, le=64)
    # Relayed exchanges waiting to be fingerprinted; past it they are skipped and counted (backlog_full).
    max_backlog: int = Field(10_000, ge=1)
    # The SDK client's batching and its spool (a local file that keeps batches while bleedwatch is away).
    flush_seconds: float = Field(1.0, gt=0)
    spool: Path | None = None

    @field_validator("tenant_header", "deployment_header", "node_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().lower()
        if not _HEADER.fullmatch(value):
            raise ValueError("not an HTTP header name")
        return value

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("off", "none", ""):
            return None
        return value

    @field_validator("pass_paths", mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("fingerprint_key")
    @classmethod
    def _key(cls, value: SecretStr) -> SecretStr:
        try:
            key_from_hex(value.get_secret_value())
        except ValueError as exc:
            raise ValueError(f"BLEEDWATCH_FINGERPRINT_KEY: {exc}") from None
        return value

    @property
    def key(self) -> bytes:
        return key_from_hex(self.fingerprint_key.get_secret_value())
