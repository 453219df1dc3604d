from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from service import metrics
from service.auth.deps import require
from service.auth.keys import Caller, Role
from service.deps import Deps
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
from service.ingest.schemas import Batch, DropReport, DropResult, IngestResult

router = APIRouter(prefix="/v1", tags=["ingest"])
_batch = TypeAdapter(Batch)


@router.post(
    "/exchanges",
    status_code=202,
    response_model=IngestResult,
    summary="Ingest a batch of fingerprinted exchanges",
    responses=responses(Unauthorized, Forbidden, PayloadTooLarge, UnsupportedMediaType, Invalid, Unavailable),
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": _batch.json_schema()}}}
    },
)
async def ingest_exchanges(
    request: Request, deps: Deps, caller: Annotated[Caller, Depends(require(Role.INGEST))]
) -> IngestResult:
    """Answered 202 only once every exchange is indexed and its findings are stored.

    Idempotent on (tenant, request_id): a retried batch reports its exchanges as duplicates.
    """
    with metrics.INGEST_DURATION.time():
        try:
            content_type = request.headers.get("content-type", "")
            if content_type.split(";")[0].strip().lower() != "application/json":
                raise UnsupportedMediaType("send the batch as Content-Type: application/json")
            body = await request.body()  # at most BLEEDWATCH_MAX_BODY_BYTES: see service/body_limit.py
            metrics.INGEST_BYTES.inc(len(body))
            try:
                batch = _batch.validate_json(body)
            except ValidationError as exc:
                raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None
            return await deps.ingestor.ingest(batch, caller)
        except ApiError as exc:
            metrics.INGEST_REJECTED.labels(exc.error).inc()
            raise
        except RequestValidationError:
            metrics.INGEST_REJECTED.labels("invalid").inc()
            raise


@router.post(
    "/sdk/drops",
    status_code=202,
    response_model=DropResult,
    summary="Report exchanges a gateway dropped before delivery",
    responses=responses(Unauthorized, Forbidden, Invalid, Unavailable),
)
async def report_drops(
    report: DropReport, deps: Deps, caller: Annotated[Caller, Depends(require(Role.INGEST))]
) -> DropResult:
    """Feeds ``bleedwatch_sdk_dropped_exchanges_total``; idempotent on ``report_id``."""
    key = f"sdk-drops:{caller.key_id}:{report.report_id}"
    if (await deps.index.done([key], time.time()))[0]:
        return DropResult(counted=0)
    metrics.SDK_DROPPED.inc(report.count)
    await deps.index.mark_done([key], time.time())
    return DropResult(counted=report.count)
