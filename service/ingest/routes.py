from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from service import metrics
from service.auth.deps import Ingest, Reader
from service.deps import Deps, IndexDep
from service.errors import (
    ApiError,
    Forbidden,
    Invalid,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    responses,
)
from service.ingest.schemas import Batch, DropReport, DropResult, Envelope, Exchange, IngestResult, QueueStatus
from service.json_only import is_json

router = APIRouter(prefix="/v1", tags=["ingest"])
_batch = TypeAdapter(Batch)
_envelope = TypeAdapter(Envelope)


def _request_schema() -> dict[str, object]:
    """The body's shape, each exchange of the Exchange schema: what a gateway must send, though one
    exchange that does not fit is rejected alone (its ``results`` entry) rather than the batch."""
    schema = _envelope.json_schema()
    exchange = TypeAdapter(Exchange).json_schema()
    schema["$defs"] = {**exchange.pop("$defs", {}), **schema.get("$defs", {})}
    schema["properties"]["exchanges"]["items"] = exchange
    return schema


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its ``#/$defs/...`` references replaced by what they name (the models are
    not recursive): inside the OpenAPI document those references would point at nothing."""
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


@router.post(
    "/exchanges",
    status_code=202,
    response_model=IngestResult,
    summary="Ingest a batch of fingerprinted exchanges",
    responses=responses(Unauthorized, Forbidden, PayloadTooLarge, UnsupportedMediaType, Invalid, Unavailable),
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": inline_refs(_request_schema())}}}
    },
)
async def ingest_exchanges(request: Request, response: Response, deps: Deps, caller: Ingest) -> IngestResult:
    """Answered 202 once the batch is durably queued, and by default once it is processed too.

    Each exchange has its result (``results``, in the batch's order): accepted, duplicate, or
    rejected with its reason; the others are taken. Only a body that is no batch at all (not
    JSON, not ``{"exchanges": [...]}``, too large or too many exchanges), or one whose every
    exchange is rejected, is refused as a whole (4xx, the first exchange's reason).

    With ``Prefer: respond-async`` (RFC 7240; what the SDK sends) the answer comes as soon as
    the batch is queued, ``processed: false``; without it, once a replica has indexed and matched
    it (``processed: true``, with its findings), or after BLEEDWATCH_INGEST_WAIT_SECONDS, queued.
    Either way nothing answered 202 is lost. Idempotent on (tenant, request_id): a retried batch
    reports its exchanges as duplicates.
    """
    with metrics.INGEST_DURATION.time():
        try:
            if not is_json(request.headers.get("content-type", "")):
                raise UnsupportedMediaType("send the batch as Content-Type: application/json, in UTF-8")
            body = await request.body()  # at most BLEEDWATCH_MAX_BODY_BYTES: see service/body_limit.py
            metrics.INGEST_BYTES.inc(len(body))
            items: list[Exchange] | list[dict[str, Any]]
            try:  # the common case, at the cost it always had: every exchange fits the schema
                items = _batch.validate_json(body).exchanges
            except ValidationError:
                try:  # each exchange is then judged alone, by the ingestor
                    items = _envelope.validate_json(body).exchanges
                except ValidationError as exc:
                    raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None
            accepted = await deps.ingestor.accept(items, body, caller)
            if _prefers_async(request.headers.getlist("prefer")):
                response.headers["Preference-Applied"] = "respond-async"
                return accepted.queued
            return await deps.ingestor.wait(accepted, deps.settings.ingest_wait_seconds)
        except ApiError as exc:
            metrics.INGEST_REJECTED.labels(exc.error).inc()
            raise
        except RequestValidationError:
            metrics.INGEST_REJECTED.labels("invalid").inc()
            raise


@router.get(
    "/queue",
    response_model=QueueStatus,
    summary="Accepted batches waiting to be processed, held findings, and their dead letters",
    responses=responses(Unauthorized, Forbidden, Unavailable),
)
async def queue_status(index: IndexDep, _: Reader) -> QueueStatus:
    """The queue every replica shares: ``queued`` 0 means everything accepted so far is processed;
    and the findings outbox, where findings wait while the database is away."""
    queue, outbox = index.queue(), index.outbox()
    return QueueStatus(
        queued=await queue.size(),
        dead_letters=await queue.dead_size(),
        findings_held=await outbox.size(),
        findings_on_hold=await outbox.later_size(),
        findings_dead_letters=await outbox.dead_size(),
    )


def _prefers_async(values: list[str]) -> bool:
    return any(p.split(";")[0].strip().lower() == "respond-async" for v in values for p in v.split(","))


@router.post(
    "/sdk/drops",
    status_code=202,
    response_model=DropResult,
    summary="Report exchanges a gateway dropped before delivery",
    responses=responses(Unauthorized, Forbidden, Invalid, Unavailable),
)
async def report_drops(report: DropReport, index: IndexDep, caller: Ingest) -> DropResult:
    """Feeds ``bleedwatch_sdk_dropped_exchanges_total``; idempotent on ``report_id``."""
    key = f"sdk-drops:{caller.key_id}:{report.report_id}"
    if (await index.done([key], time.time()))[0]:
        return DropResult(counted=0)
    metrics.SDK_DROPPED.inc(report.count)
    await index.mark_done([key], time.time())
    return DropResult(counted=report.count)
