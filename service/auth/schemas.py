from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.config import JsonDict

from bleedwatch.names import NAME_PATTERN
from service.auth.keys import Role
from service.wire import Name

KeyName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME_PATTERN)]


# Tenants for ingest keys only, in the schema too, so a client (or a fuzzer) reads it there.
INGEST_ONLY_TENANTS: JsonDict = {
    "if": {"properties": {"role": {"const": "ingest"}}, "required": ["role"]},
    "else": {"properties": {"tenants": {"type": "null"}}},
}


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=INGEST_ONLY_TENANTS)

    name: KeyName = Field(description="Who uses the key, e.g. 'gateway-eu' or 'oncall'.")
    role: Role
    tenants: list[Name] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="Ingest keys only: the tenants this gateway may report for; unset = any tenant.",
    )

    @model_validator(mode="after")
    def _tenants_for_ingest_only(self) -> KeyIn:
        if self.tenants is not None and self.role != Role.INGEST:
            raise ValueError("tenants: only ingest keys can be limited to tenants")
        return self


class KeyOut(BaseModel):
    """An API key without its secret: the secret is shown once, in the answer that created it."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    role: Role
    tenants: list[str] | None
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


class KeyCreated(KeyOut):
    token: str = Field(description="The whole key, 'bw_<id>_<secret>'. Shown this once; only a hash is kept.")


class KeyPage(BaseModel):
    items: list[KeyOut]
