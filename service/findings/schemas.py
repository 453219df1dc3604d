from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from service.findings.severity import SeverityField


class FindingOut(BaseModel):
    """One leaked response. ``evidence.sources[].ranges`` maps response token ranges to source ones."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    key_id: str
    recipient_tenant: str
    recipient_request_id: str
    source_tenant: str
    source_request_ids: list[str]
    detected_at: datetime
    updated_at: datetime
    response_at: datetime
    model: str
    deployment: str | None
    node: str | None
    prompt_tokens: int | None
    response_tokens: int
    matched_fingerprints: int
    longest_run_tokens: int
    score: float
    severity: SeverityField
    evidence: dict[str, Any]


class FindingPage(BaseModel):
    items: list[FindingOut]
    next_cursor: str | None
