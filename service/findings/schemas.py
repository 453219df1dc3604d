from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.findings.severity import SeverityField
from service.incidents.schemas import Status


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
    incident_id: int | None = Field(
        description="The incident it is in; null only for a finding stored before incidents existed."
    )
    incident_status: Status | None = Field(
        description="That incident's status: open and acknowledged are live, resolved and false_positive closed."
    )
    false_positive: bool = Field(
        description="A responder marked this finding a false positive, on its own or with its whole incident."
    )


TRIAGE = frozenset({"incident_id", "incident_status", "false_positive"})  # from its incident, not the findings row


class FindingPage(BaseModel):
    items: list[FindingOut]
    next_cursor: str | None
