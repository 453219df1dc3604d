from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from service.allowlist.schemas import Label
from service.wire import KeyId, Name, Text


class CanaryIn(BaseModel):
    """A canary prompt's fingerprints, as ``bleedwatch canary probe`` makes them with the gateway key."""

    model_config = ConfigDict(extra="forbid")

    key_id: KeyId
    tenant: Name
    label: Label
    text: Text


class CanaryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    key_id: str
    tenant: str
    label: str
    token_count: int
    fingerprint_count: int
    created_at: datetime
    created_by: str
    revoked_at: datetime | None


class CanaryPage(BaseModel):
    items: list[CanaryOut]
