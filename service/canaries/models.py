from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, BigInt, BigIntId, UTCDateTime


class Canary(Base):
    """Content that belongs to one canary tenant and must never appear in anyone else's answer."""

    __tablename__ = "canaries"
    __table_args__ = (Index("ix_canaries_key_id", "key_id"), NEVER_REUSED)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str] = mapped_column(String(128))
    label: Mapped[str] = mapped_column(String(256))
    token_count: Mapped[int] = mapped_column(BigInt)  # u32 on the wire, wider than PostgreSQL's INTEGER
    fingerprint_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(24))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class CanaryFingerprint(Base):
    __tablename__ = "canary_fingerprints"

    canary_id: Mapped[int] = mapped_column(ForeignKey("canaries.id", ondelete="CASCADE"), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the u64 fingerprint as signed BIGINT
    offset: Mapped[int] = mapped_column(BigInt)
