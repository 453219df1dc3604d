"""The wire format of ``/v1/deployments``: a serving config in, the config with its violations out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bleedwatch.names import DEPLOYMENT_ID_PATTERN, NAME_PATTERN
from service.wire import NOT_TEXT

# The same characters gateways may send as meta.deployment, less '/', which a path cannot hold.
DeploymentId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=DEPLOYMENT_ID_PATTERN)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=NAME_PATTERN)]
EngineName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")]
Version = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")]
Tokens = Annotated[int, Field(ge=0, lt=2**53), NOT_TEXT]
Severity = Literal["critical", "high", "warning"]


class Safeguards(BaseModel):
    """What the provider adopted after the incident. Leave one out (null) and it counts as missing."""

    model_config = ConfigDict(extra="forbid")

    deferred_page_release_prefill: bool | None = Field(
        None, strict=True, description="Prefill keeps a request's KV pages until the transfer is acknowledged."
    )
    deferred_page_release_decode: bool | None = Field(
        None,
        strict=True,
        description="Decode keeps a request's KV pages until the request is fully finished or aborted.",
    )
    kv_transfer_batch_cap: Annotated[int, Field(ge=1, lt=2**31), NOT_TEXT] | None = Field(
        None, description="Most requests in one KV-transfer batch; null means uncapped."
    )
    lb_aborts_on_client_disconnect: bool | None = Field(
        None, strict=True, description="The load balancer aborts a request mid-transfer when its client disconnects."
    )


class DeploymentConfig(BaseModel):
    """``PUT /v1/deployments/{id}``: how a deployment serves. Token counts are the engine's own."""

    model_config = ConfigDict(extra="forbid")

    model: Label
    engine: EngineName = Field(description="e.g. sglang, vllm; the name the rules file uses.")
    engine_version: Version
    disaggregated: bool = Field(strict=True, description="Prefill and decode on separate nodes, KV moved between them.")
    context_length: Annotated[int, Field(ge=1, lt=2**53), NOT_TEXT] = Field(
        description="The longest prompt the deployment advertises."
    )
    prefill_kv_pool_tokens: Tokens = Field(description="KV pool of a prefill node (the only pool if colocated).")
    decode_kv_pool_tokens: Tokens = Field(description="KV pool of a decode node (same as prefill if colocated).")
    safeguards: Safeguards = Safeguards()


class Violation(BaseModel):
    rule: str
    severity: Severity
    summary: str
    detail: str


class DeploymentOut(DeploymentConfig):
    id: str
    created_at: datetime
    updated_at: datetime
    updated_by: str = Field(description="Key id of the admin key that last reported the config.")
    at_risk: bool
    violations: list[Violation]


class DeploymentPage(BaseModel):
    items: list[DeploymentOut]
    next_cursor: str | None
