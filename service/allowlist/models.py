from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, BigIntId, UTCDateTime


class AllowlistEntry(Base):
    """A set of fingerprints that never make a finding: public text, or a confirmed false positive.

    Entries are revoked, never deleted, so what was suppressed when stays auditable. An imported
    entry may be built from several requests (``POST /v1/allowlist/{id}/fingerprints``), so a
    corpus larger than one request body is still one entry; ``fingerprint_count`` is its distinct
    fingerprints so far.
    """

    __tablename__ = "allowlist_entries"
    __table_args__ = (Index("ix_allowlist_entries_key_id", "key_id"), NEVER_REUSED)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32))
    label: Mapped[str] = mapped_column(String(256))
    origin: Mapped[str] = mapped_column(String(64))  # "import" or "false_positive:finding:<id>" and the like
    fingerprint_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(24))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by: Mapped[str | None] = mapped_column(String(24))


class AllowlistChunk(Base):
    """Part of an entry's fingerprints, packed: sorted distinct little-endian uint64, 8 bytes each.

    One row per fingerprint cost about 60 bytes of heap and index each in PostgreSQL and made
    every replica's reload a query of millions of rows; packed, a million fingerprints are 8 MB
    in a few rows that a reload reads as bytes. A chunk holds at most ``store.CHUNK_FINGERPRINTS``
    and none of the entry's earlier chunks' values, so an entry's count is the sum of its chunks'.
    """

    __tablename__ = "allowlist_chunks"

    entry_id: Mapped[int] = mapped_column(ForeignKey("allowlist_entries.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)  # 0, 1, ... in the order they were added
    fingerprint_count: Mapped[int] = mapped_column(Integer)
    fingerprints: Mapped[bytes] = mapped_column(LargeBinary)
