"""initial schema: findings and api keys

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "tenants", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=True
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("recipient_tenant", sa.String(length=128), nullable=False),
        sa.Column("recipient_request_id", sa.String(length=256), nullable=False),
        sa.Column("source_tenant", sa.String(length=128), nullable=False),
        sa.Column(
            "source_request_ids",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("response_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("deployment", sa.String(length=256), nullable=True),
        sa.Column("node", sa.String(length=256), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("response_tokens", sa.Integer(), nullable=False),
        sa.Column("matched_fingerprints", sa.Integer(), nullable=False),
        sa.Column("longest_run_words", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column(
            "evidence", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
        sa.UniqueConstraint("recipient_tenant", "recipient_request_id", name=op.f("uq_findings_recipient_tenant")),
    )
    op.create_index("ix_findings_detected_at_id", "findings", ["detected_at", "id"], unique=False)
    op.create_index("ix_findings_model", "findings", ["model"], unique=False)
    op.create_index("ix_findings_source_tenant", "findings", ["source_tenant"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_findings_source_tenant", table_name="findings")
    op.drop_index("ix_findings_model", table_name="findings")
    op.drop_index("ix_findings_detected_at_id", table_name="findings")
    op.drop_table("findings")
    op.drop_table("api_keys")
