"""The wire format of ``POST /v1/exchanges``; docs/api.md shows an example."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.names import NAME_PATTERN, OPTIONAL_NAME_PATTERN
from service.wire import NOT_TEXT, Moment

Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME_PATTERN)]
RequestId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=NAME_PATTERN)]
Label = Annotated[str, StringConstraints(max_length=256, pattern=OPTIONAL_NAME_PATTERN)]
KeyId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
# Integer fields take JSON integers only (service/wire.py), so "12" and true are refused, not coerced.
U64_MAX = 2**64 - 1
Scalar = str | int | float | bool | None


class Text(BaseModel):
    """Fingerprints of one text: base64 of little-endian u64/u32 arrays, or JSON integer arrays."""

    model_config = ConfigDict(extra="forbid")

    fingerprints: str | list[Annotated[int, Field(ge=0, le=U64_MAX), NOT_TEXT]]
    offsets: str | list[Annotated[int, Field(ge=0, lt=2**32), NOT_TEXT]]
    token_count: Annotated[int, Field(ge=0, lt=2**32), NOT_TEXT]


class Scheme(BaseModel):
    """The fingerprint parameters the gateway used (docs/fingerprint-spec.md); n and w are in the key id."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    n: Annotated[int, Field(ge=1, le=64), NOT_TEXT]
    w: Annotated[int, Field(ge=1, le=256), NOT_TEXT]
    sample_after: Annotated[int, Field(ge=0, lt=2**32), NOT_TEXT]
    sample_mod: Annotated[int, Field(ge=1, lt=2**32), NOT_TEXT]
    response_w: Annotated[int, Field(ge=1, le=256), NOT_TEXT] | None = Field(
        None, description="The response's window; absent: w."
    )


class Meta(BaseModel):
    """Where the response was served: these fields only. Free-form fields could carry raw text
    (a prompt pasted into a "comment"), which bleedwatch must never hold, so any other is refused."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: Annotated[int, Field(ge=0, lt=2**32), NOT_TEXT] | None = None
    deployment: Label | None = None
    node: Label | None = None


class Exchange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: Name
    request_id: RequestId
    model: Label = Field(min_length=1)
    ts: Moment
    key_id: KeyId
    scheme: Scheme
    prompt: Text
    response: Text
    meta: Meta = Meta()


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exchanges: list[Exchange] = Field(min_length=1)


class IngestResult(BaseModel):
    accepted: int = Field(description="Exchanges of this batch not ingested before: queued, and indexed if processed.")
    duplicates: int = Field(description="Exchanges already ingested earlier (same tenant and request id).")
    findings: int | None = Field(
        description="Findings created or extended by this batch; null until it is processed (see processed)."
    )
    processed: bool = Field(
        False,
        description="True once the batch is indexed and matched; false when answered as soon as it was durably "
        "queued (Prefer: respond-async, or processing took longer than BLEEDWATCH_INGEST_WAIT_SECONDS).",
    )


class QueueStatus(BaseModel):
    queued: int = Field(description="Accepted batches not yet processed (indexed, matched, findings stored).")
    dead_letters: int = Field(
        description="Batches that failed processing 5 times: not matched until put back "
        "(bleedwatch queue requeue-dead, docs/runbooks/ingest-backlog.md)."
    )


class DropReport(BaseModel):
    """Exchanges a gateway's SDK could not deliver and had to drop (its spool was full, or absent)."""

    model_config = ConfigDict(extra="forbid")

    report_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")] = Field(
        description="Chosen by the SDK; a report sent again with the same id is counted once."
    )
    count: Annotated[int, Field(ge=1, le=10**9), NOT_TEXT]


class DropResult(BaseModel):
    counted: int = Field(description="Exchanges added to bleedwatch_sdk_dropped_exchanges_total (0 for a repeat).")
