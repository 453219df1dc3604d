from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, BigIntId, JSONType, UTCDateTime


class AuditEntry(Base):
    """Who (API key id) did what (action) to what (target), when, in which HTTP request.

    Append-only: the code has no update path and deletes only in the retention job; on
    PostgreSQL a trigger (migration 0004) refuses UPDATE, and DELETE outside that job.
    Tenants appear only as ``tenant_hash`` (see ``service.audit.tenant_hash``), never by name,
    so purging a tenant leaves nothing readable about it here.
    """

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_at_id", "at", "id"),
        Index("ix_audit_log_key_id", "key_id"),
        Index("ix_audit_log_action", "action"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    key_id: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(48))
    target: Mapped[str] = mapped_column(String(128))
    request_id: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONType)
