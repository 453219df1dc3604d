"""allowlist fingerprints packed into chunks

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04

``allowlist_fingerprints`` held one row per fingerprint (a signed BIGINT); every replica re-read
all of them every refresh, which does not scale to corpora of millions. ``allowlist_chunks``
holds each entry's fingerprints as sorted, distinct little-endian uint64 bytes, at most 2^20 a
row (service/allowlist/store.py). Existing entries are converted row for row, both ways.
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
CHUNK_FINGERPRINTS = 1 << 20  # as service/allowlist/store.py; a migration keeps its own copy
LE = np.dtype("<u8")

entries = sa.table("allowlist_entries", sa.column("id", ID))
rows = sa.table("allowlist_fingerprints", sa.column("entry_id", ID), sa.column("value", sa.BigInteger()))
chunks = sa.table(
    "allowlist_chunks",
    sa.column("entry_id", ID),
    sa.column("seq", sa.Integer()),
    sa.column("fingerprint_count", sa.Integer()),
    sa.column("fingerprints", sa.LargeBinary()),
)


def upgrade() -> None:
    op.create_table(
        "allowlist_chunks",
        sa.Column("entry_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("fingerprint_count", sa.Integer(), nullable=False),
        sa.Column("fingerprints", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["entry_id"],
            ["allowlist_entries.id"],
            name=op.f("fk_allowlist_chunks_entry_id_allowlist_entries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("entry_id", "seq", name=op.f("pk_allowlist_chunks")),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":  # random 64-bit values never compress: do not try on every write
        op.execute("ALTER TABLE allowlist_chunks ALTER COLUMN fingerprints SET STORAGE EXTERNAL")
    for entry_id in bind.execute(sa.select(entries.c.id).order_by(entries.c.id)).scalars().all():
        signed = bind.execute(sa.select(rows.c.value).where(rows.c.entry_id == entry_id)).scalars().all()
        values = np.unique(np.array(signed, dtype=np.int64).view(np.uint64))
        for seq, start in enumerate(range(0, len(values), CHUNK_FINGERPRINTS)):
            part = values[start : start + CHUNK_FINGERPRINTS]
            bind.execute(
                chunks.insert().values(
                    entry_id=entry_id, seq=seq, fingerprint_count=len(part), fingerprints=part.astype(LE).tobytes()
                )
            )
    op.drop_table("allowlist_fingerprints")


def downgrade() -> None:
    op.create_table(
        "allowlist_fingerprints",
        sa.Column("entry_id", ID, nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["entry_id"],
            ["allowlist_entries.id"],
            name=op.f("fk_allowlist_fingerprints_entry_id_allowlist_entries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("entry_id", "value", name=op.f("pk_allowlist_fingerprints")),
    )
    bind = op.get_bind()
    for entry_id, data in bind.execute(sa.select(chunks.c.entry_id, chunks.c.fingerprints)).all():
        values = np.frombuffer(data, dtype=LE).astype(np.uint64).view(np.int64)
        if len(values):
            bind.execute(rows.insert(), [{"entry_id": entry_id, "value": int(v)} for v in values])
    op.drop_table("allowlist_chunks")
