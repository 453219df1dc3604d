"""deployments and engine signals

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(length=256), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("engine", sa.String(length=64), nullable=False),
        sa.Column("engine_version", sa.String(length=64), nullable=False),
        sa.Column("disaggregated", sa.Boolean(), nullable=False),
        sa.Column("context_length", sa.BigInteger(), nullable=False),
        sa.Column("prefill_kv_pool_tokens", sa.BigInteger(), nullable=False),
        sa.Column("decode_kv_pool_tokens", sa.BigInteger(), nullable=False),
        sa.Column("deferred_page_release_prefill", sa.Boolean(), nullable=True),
        sa.Column("deferred_page_release_decode", sa.Boolean(), nullable=True),
        sa.Column("kv_transfer_batch_cap", sa.Integer(), nullable=True),
        sa.Column("lb_aborts_on_client_disconnect", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=24), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
    )
    op.create_table(
        "engine_signals",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=48), nullable=False),
        sa.Column("deployment", sa.String(length=256), nullable=False),
        sa.Column("node", sa.String(length=256), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=256), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(length=128), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key_id", sa.String(length=24), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_signals")),
        sa.UniqueConstraint("deployment", "node", "event_id", name=op.f("uq_engine_signals_deployment")),
    )
    op.create_index(
        "ix_engine_signals_deployment_node_ts", "engine_signals", ["deployment", "node", "ts"], unique=False
    )
    op.create_index("ix_engine_signals_ts_id", "engine_signals", ["ts", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_engine_signals_ts_id", table_name="engine_signals")
    op.drop_index("ix_engine_signals_deployment_node_ts", table_name="engine_signals")
    op.drop_table("engine_signals")
    op.drop_table("deployments")
