from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, BigIntId, UTCDateTime


class AllowlistEntry(Base):
    """A set of fingerprints that never make a finding: public text, or a confirmed false positive.

    Entries are revoked, never deleted, so what was suppressed when stays auditable.
    """

    __tablename__ = "allowlist_entries"
    __table_args__ = (Index("ix_allowlist_entries_key_id", "key_id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32))
    label: Mapped[str] = mapped_column(String(256))
    origin: Mapped[str] = mapped_column(String(64))  # "import" or "false_positive:finding:<id>" and the like
    fingerprint_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(24))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by: Mapped[str | None] = mapped_column(String(24))


class AllowlistFingerprint(Base):
    __tablename__ = "allowlist_fingerprints"

    entry_id: Mapped[int] = mapped_column(ForeignKey("allowlist_entries.id", ondelete="CASCADE"), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the u64 fingerprint as signed BIGINT
