from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, BigInt, BigIntId, JSONType, UTCDateTime


class Finding(Base):
    """One leaked response: whose content it carried, how much, and where it was served.

    Evidence is token offsets only. A response is one finding whatever the number of sources;
    ``evidence`` lists each source tenant and request with the ranges that matched.
    """

    __tablename__ = "findings"
    __table_args__ = (
        UniqueConstraint("recipient_tenant", "recipient_request_id"),
        Index("ix_findings_detected_at_id", "detected_at", "id"),
        Index("ix_findings_source_tenant", "source_tenant"),
        Index("ix_findings_model", "model"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32))
    recipient_tenant: Mapped[str] = mapped_column(String(128))
    recipient_request_id: Mapped[str] = mapped_column(String(256))
    source_tenant: Mapped[str] = mapped_column(String(128))
    source_request_ids: Mapped[list[str]] = mapped_column(JSONType)
    detected_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    response_at: Mapped[datetime] = mapped_column(UTCDateTime())
    model: Mapped[str] = mapped_column(String(256))
    deployment: Mapped[str | None] = mapped_column(String(256))
    node: Mapped[str | None] = mapped_column(String(256))
    # Token counts and offsets are u32 on the wire (a sender's to choose): wider than PostgreSQL's INTEGER.
    prompt_tokens: Mapped[int | None] = mapped_column(BigInt)
    response_tokens: Mapped[int] = mapped_column(BigInt)
    matched_fingerprints: Mapped[int] = mapped_column(Integer)
    longest_run_tokens: Mapped[int] = mapped_column(BigInt)
    score: Mapped[float] = mapped_column(Float)
    severity: Mapped[str] = mapped_column(String(16))
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # The recipient response's fingerprints that matched the top source (signed int64, like the allowlist
    # stores them): what marking the finding a false positive adds to the allowlist. Null before 0004.
    matched_values: Mapped[list[int] | None] = mapped_column(JSONType)
    # The lowest index doc ref of the top source (service/matching/matcher.py): between equally strong
    # evaluations of one response the earlier-accepted source wins, so the order of evaluation does not
    # decide the attribution. Null before 0006.
    source_ref: Mapped[int | None] = mapped_column(BigInteger)
