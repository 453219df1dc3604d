from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bleedwatch.names import NAME_PATTERN
from service.wire import STRICT_INT, KeyId

Label = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=NAME_PATTERN)]


Fingerprints = str | list[Annotated[int, Field(ge=0, le=2**64 - 1), STRICT_INT]]
FINGERPRINTS_DOC = "Base64 of little-endian uint64 (or a JSON list); duplicates are stored once."


class AllowlistIn(BaseModel):
    """Fingerprints of public text, made by ``bleedwatch allowlist add`` with the gateway key."""

    model_config = ConfigDict(extra="forbid")

    key_id: KeyId
    label: Label = Field(description="What the text is, e.g. 'GPL-3.0 license text'.")
    fingerprints: Fingerprints = Field(description=FINGERPRINTS_DOC)


class AllowlistMoreIn(BaseModel):
    """More of an entry's fingerprints: a corpus larger than one request is sent in several."""

    model_config = ConfigDict(extra="forbid")

    fingerprints: Fingerprints = Field(description=FINGERPRINTS_DOC)


class AllowlistOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    key_id: str
    label: str
    origin: str
    fingerprint_count: int
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None


class AllowlistPage(BaseModel):
    items: list[AllowlistOut]
