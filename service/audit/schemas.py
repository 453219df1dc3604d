from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class AuditOut(BaseModel):
    """One audit entry. Tenants appear only as ``t:<hash>``, as ``GET /v1/audit?tenant=`` matches them."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    key_id: str
    action: str
    target: str
    request_id: str | None
    detail: dict[str, Any]


class AuditPage(BaseModel):
    items: list[AuditOut]
    next_cursor: str | None
