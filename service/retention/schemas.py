from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bleedwatch.names import NAME_PATTERN

Tenant = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME_PATTERN)]


class PurgeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: Tenant = Field(description="The tenant as gateways report it.")


class PurgeResult(BaseModel):
    tenant: str
    findings_deleted: int = Field(description="Findings where the tenant was recipient or top source.")
    findings_scrubbed: int = Field(description="Other findings whose evidence listed the tenant as one source.")
    incidents_deleted: int = Field(description="Incidents left with no finding.")
    incidents_updated: int = Field(description="Incidents recomputed from the findings they still have.")
    documents_deleted: int = Field(0, description="Index metadata of the tenant's prompts and responses.")
    batches_rewritten: int = Field(0, description="Queued or dead-lettered batches that carried its exchanges.")
    held_findings_removed: int = Field(
        0, description="Findings held for the database (outbox) that involved it: dropped or scrubbed of it."
    )
    index: str = Field(description="What happens to the fingerprint index's entries for the tenant.")
    not_purged: str = Field(description="What bleedwatch keeps, and why.")
