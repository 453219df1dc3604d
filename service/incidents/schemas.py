from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from bleedwatch.names import NAME_PATTERN
from service.findings.severity import SeverityField
from service.signals.schemas import SignalOut

Assignee = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Notes = Annotated[str, StringConstraints(max_length=10_000)]


class Status(enum.StrEnum):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"
    FALSE_POSITIVE = "false_positive"


_ONE_STATUS = "|".join(s.value for s in Status)
STATUSES_PATTERN = f"^({_ONE_STATUS})(,({_ONE_STATUS}))*$"


def check_statuses(value: str) -> str:
    """The pattern, checked with a sentence that names the statuses (pydantic's would quote the regex);
    the CLI's ``--status`` and ``--incident-status`` check with it too."""
    if re.fullmatch(STATUSES_PATTERN, value) is None:
        raise ValueError(f"one or more of {', '.join(Status)}, separated by commas")
    return value


def statuses(value: str) -> tuple[str, ...]:
    """A ``Statuses`` value as the statuses it names, each once."""
    return tuple(dict.fromkeys(value.split(",")))


# A query filter on several statuses, ``open,acknowledged``: the schema gives its exact shape, so
# every value it admits is a filter, and anything else is a 422 that lists the statuses.
Statuses = Annotated[
    str,
    AfterValidator(check_statuses),
    WithJsonSchema({"type": "string", "pattern": STATUSES_PATTERN, "examples": ["open,acknowledged"]}),
]

# Every allowed step; anything else is 409. Reverting a false positive (to open) revokes what it allowlisted.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.OPEN: frozenset({Status.ACKNOWLEDGED, Status.RESOLVED, Status.FALSE_POSITIVE}),
    Status.ACKNOWLEDGED: frozenset({Status.OPEN, Status.RESOLVED, Status.FALSE_POSITIVE}),
    Status.RESOLVED: frozenset({Status.OPEN, Status.FALSE_POSITIVE}),
    Status.FALSE_POSITIVE: frozenset({Status.OPEN}),
}


class IncidentOut(BaseModel):
    id: int
    status: Status
    severity: SeverityField
    model: str
    deployment: str | None
    assignee: str | None
    notes: str | None
    opened_at: datetime = Field(description="When bleedwatch opened the incident.")
    first_seen_at: datetime = Field(description="The earliest leaked response's timestamp.")
    last_seen_at: datetime = Field(description="The latest leaked response's timestamp.")
    updated_at: datetime
    closed_at: datetime | None = Field(description="When it was last resolved or marked a false positive.")
    finding_count: int
    source_tenants: list[str] = Field(description="Tenants whose content leaked.")
    recipient_tenants: list[str] = Field(description="Tenants whose answers carried it.")


class IncidentPage(BaseModel):
    items: list[IncidentOut]
    next_cursor: str | None


class FindingSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    recipient_tenant: str
    recipient_request_id: str
    source_tenant: str
    response_at: datetime
    detected_at: datetime
    node: str | None
    prompt_tokens: int | None
    severity: SeverityField
    matched_fingerprints: int
    longest_run_tokens: int
    false_positive: bool
    allowlist_entry_id: int | None = Field(description="The allowlist entry its false-positive marking created.")


class EventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str = Field(description="The API key id of the responder, or 'bleedwatch'.")
    action: str
    detail: dict[str, Any]
    request_id: str | None


class IncidentDetail(IncidentOut):
    findings: list[FindingSummary]
    timeline: list[EventOut]


class IncidentPatch(BaseModel):
    """What a responder changes: any of status, assignee (null to clear), notes (replaced whole).

    ``status`` may be left out but not null (the schema says so: no null in it, at least one field).
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    status: Status | SkipJsonSchema[None] = None
    assignee: Assignee | None = None
    notes: Notes | None = None

    @model_validator(mode="after")
    def _something(self) -> IncidentPatch:
        if not self.model_fields_set:
            raise ValueError("give at least one of status, assignee, notes")
        if "status" in self.model_fields_set and self.status is None:
            raise ValueError("status: cannot be null")
        return self


class FindingPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    false_positive: StrictBool = Field(
        description="true: allowlist the fingerprints it matched; false: revoke that allowlist entry again."
    )


class FindingTriage(BaseModel):
    incident: IncidentOut
    finding: FindingSummary


# --- the impact report -----------------------------------------------------------------------


class ResponseRef(BaseModel):
    finding_id: int
    recipient_request_id: str
    source_request_ids: list[str]
    response_at: datetime
    detected_at: datetime
    model: str
    deployment: str | None
    node: str | None
    prompt_tokens: int | None
    severity: SeverityField


class Pair(BaseModel):
    """One (source, recipient) pair: whose content reached whom, in which responses, when."""

    source_tenant: str
    recipient_tenant: str
    canary: bool = Field(description="The source is a registered canary, not a customer.")
    response_count: int
    first_seen_at: datetime
    last_seen_at: datetime
    responses: list[ResponseRef]


class Bucket(BaseModel):
    label: str
    min_tokens: int
    max_tokens: int | None = Field(description="Exclusive; null = no upper bound.")
    count: int


class PromptLengths(BaseModel):
    """Recipient prompt lengths of the leaked responses (from the gateway's meta.prompt_tokens)."""

    known: int
    unknown: int
    min: int | None
    median: float | None
    max: int | None
    buckets: list[Bucket]


class SignalsSide(BaseModel):
    """Engine integrity signals of the incident's deployment over its time range (widened by a margin)."""

    deployment: str | None
    since: datetime
    until: datetime
    total: int = Field(description="Events (each with a count) in the window.")
    by_kind: dict[str, int] = Field(description="Summed counts by kind.")
    items: list[SignalOut]
    truncated: bool


class ImpactReport(BaseModel):
    incident: IncidentOut
    source_tenants: list[str]
    recipient_tenants: list[str]
    response_count: int
    first_seen_at: datetime | None
    last_seen_at: datetime | None
    models: list[str]
    deployments: list[str]
    nodes: list[str]
    prompt_tokens: PromptLengths
    pairs: list[Pair]
    false_positive_findings: int = Field(description="Findings a responder marked false positive, left out above.")
    signals: SignalsSide


Format = Literal["json", "csv"]
Sort = Literal["opened_at", "last_seen_at", "severity"]
Order = Literal["asc", "desc"]
