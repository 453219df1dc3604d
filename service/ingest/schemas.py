"""The wire format of ``POST /v1/exchanges``; docs/api.md shows an example."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.wire import NOT_TEXT, STRICT_INT, KeyId, Label, Moment, Name, RequestId, Text

Scalar = str | int | float | bool | None


class Scheme(BaseModel):
    """The fingerprint parameters the gateway used (docs/fingerprint-spec.md); n and w are in the key id."""

    model_config = ConfigDict(extra="forbid")

    version: Annotated[Literal[1], STRICT_INT]
    n: Annotated[int, Field(ge=1, le=64), STRICT_INT]
    w: Annotated[int, Field(ge=1, le=256), STRICT_INT]
    sample_after: Annotated[int, Field(ge=0, lt=2**32), STRICT_INT]
    sample_mod: Annotated[int, Field(ge=1, lt=2**32), STRICT_INT]
    response_w: Annotated[int, Field(ge=1, le=256), STRICT_INT] | None = Field(
        None, description="The response's window; absent: w."
    )


class Meta(BaseModel):
    """Where the response was served: these fields only. Free-form fields could carry raw text
    (a prompt pasted into a "comment"), which bleedwatch must never hold, so any other is refused."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: Annotated[int, Field(ge=0, lt=2**32), STRICT_INT] | None = None
    deployment: Label | None = None
    node: Label | None = None
    end_user: Label | None = Field(
        None,
        description="The caller's own end-user id (OpenAI's `user`), kept under the tenant; never the tenant, "
        "which comes from the gateway's authenticated identity.",
    )


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


class Envelope(BaseModel):
    """A batch as received: the body's shape only; each exchange is then validated on its own, so
    one that does not fit ``Exchange`` is rejected alone (its ``results`` entry says why)."""

    model_config = ConfigDict(extra="forbid")

    exchanges: list[dict[str, Any]] = Field(
        min_length=1, description="Each of the Exchange schema; one that does not fit is rejected alone (results)."
    )


class ExchangeResult(BaseModel):
    status: Literal["accepted", "duplicate", "rejected"] = Field(
        description="accepted: queued (and indexed once processed); duplicate: this tenant and request id were "
        "ingested before, or earlier in this batch; rejected: not kept, see error and detail."
    )
    error: str | None = Field(
        None, description="When rejected: invalid, forbidden, payload_too_large, purged or too_many_new_tenants."
    )
    detail: str | None = Field(
        None, description="When rejected: the field (exchanges[i]...) and the rule, never the value."
    )
    retry_after: int | None = Field(
        None,
        description="When rejected for a limit that lifts (too_many_new_tenants): seconds after which the same "
        "exchange can be taken. The SDK sends it again then; it is dropped only where this is null.",
    )


class IngestResult(BaseModel):
    accepted: int = Field(description="Exchanges of this batch not ingested before: queued, and indexed if processed.")
    duplicates: int = Field(description="Exchanges already ingested earlier (same tenant and request id).")
    rejected: int = Field(0, description="Exchanges refused alone (see results); the others were taken.")
    results: list[ExchangeResult] | None = Field(
        None, description="One per exchange of the batch, in its order: accepted, duplicate, or rejected and why."
    )
    findings: int | None = Field(
        description="Findings created or extended by this batch; null until it is processed (see processed). "
        "Findings put on hold (BLEEDWATCH_FINDINGS_HOLD_SECONDS) are not counted: they are written only after it."
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
    findings_held: int = Field(
        description="Findings made but not yet written to the database (held while it is unreachable)."
    )
    findings_on_hold: int = Field(
        0,
        description="Findings waiting out BLEEDWATCH_FINDINGS_HOLD_SECONDS, to be judged again before they are raised.",
    )
    findings_dead_letters: int = Field(
        description="Held findings the database kept refusing (BLEEDWATCH_FINDINGS_OUTBOX_MAX_ATTEMPTS): "
        "not written until put back with bleedwatch queue requeue-dead."
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
