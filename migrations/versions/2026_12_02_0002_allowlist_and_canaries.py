"""allowlist and canaries

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "allowlist_entries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=256), nullable=False),
        sa.Column("origin", sa.String(length=64), nullable=False),
        sa.Column("fingerprint_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=24), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(length=24), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allowlist_entries")),
    )
    op.create_index("ix_allowlist_entries_key_id", "allowlist_entries", ["key_id"], unique=False)
    op.create_table(
        "canaries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("label", sa.String(length=256), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("fingerprint_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=24), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_canaries")),
    )
    op.create_index("ix_canaries_key_id", "canaries", ["key_id"], unique=False)
    op.create_table(
        "allowlist_fingerprints",
        sa.Column("entry_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["entry_id"],
            ["allowlist_entries.id"],
            name=op.f("fk_allowlist_fingerprints_entry_id_allowlist_entries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("entry_id", "value", name=op.f("pk_allowlist_fingerprints")),
    )
    op.create_table(
        "canary_fingerprints",
        sa.Column("canary_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("offset", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["canary_id"], ["canaries.id"], name=op.f("fk_canary_fingerprints_canary_id_canaries"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("canary_id", "value", name=op.f("pk_canary_fingerprints")),
    )


def downgrade() -> None:
    op.drop_table("canary_fingerprints")
    op.drop_table("allowlist_fingerprints")
    op.drop_index("ix_canaries_key_id", table_name="canaries")
    op.drop_table("canaries")
    op.drop_index("ix_allowlist_entries_key_id", table_name="allowlist_entries")
    op.drop_table("allowlist_entries")
