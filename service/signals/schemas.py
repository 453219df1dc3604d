"""The wire format of ``/v1/signals``: integrity events engines notice about themselves."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bleedwatch.names import NAME_PATTERN
from service.wire import STRICT_INT, Moment

Label = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=NAME_PATTERN)]
EventId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME_PATTERN)]
MAX_EVENTS = 1000


class SignalKind(enum.StrEnum):
    """What an engine can detect itself. A fixed set: it is a metric label."""

    KV_TRANSFER_CHECKSUM_MISMATCH = "kv_transfer_checksum_mismatch"  # transferred KV data failed verification
    KV_TRANSFER_SHORT = "kv_transfer_short"  # fewer tokens arrived than were reserved (e.g. a placeholder)
    FOREIGN_REQUEST_METADATA = "foreign_request_metadata"  # a decode request received another request's metadata
    KV_PAGE_OWNER_MISMATCH = "kv_page_owner_mismatch"  # a page's owner tag is not the request reading it
    KV_TRANSFER_ABORTED = "kv_transfer_aborted"  # a transfer was cut off mid-way (e.g. client disconnect)


class SignalEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: SignalKind
    deployment: Label = Field(description="As gateways report it in meta.deployment, so findings join.")
    node: Label = Field(description="As gateways report it in meta.node.")
    ts: Moment = Field(description="When the engine saw it; give a timezone (or epoch seconds).")
    request_id: Label | None = Field(None, description="The engine's request id, when one request is concerned.")
    count: Annotated[int, Field(ge=1, le=1_000_000), STRICT_INT] = Field(
        1, description="Occurrences folded into this event."
    )
    event_id: EventId | None = Field(
        None, description="Unique per deployment and node; a retried event with the same id is kept once."
    )


class SignalBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[SignalEvent] = Field(min_length=1)


class SignalResult(BaseModel):
    accepted: int = Field(description="Events stored by this call.")
    duplicates: int = Field(description="Events whose event_id was already stored.")


class SignalOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: SignalKind
    deployment: str
    node: str
    ts: datetime
    request_id: str | None
    count: int
    event_id: str | None
    received_at: datetime


class SignalPage(BaseModel):
    items: list[SignalOut]
    next_cursor: str | None
