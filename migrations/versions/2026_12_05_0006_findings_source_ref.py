"""findings keep the doc ref of their top source

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05

A response evaluated twice with equally strong evidence (two replicas, or a Redis Cluster whose
nodes saw batches in different orders) keeps the finding whose source was accepted first, by its
index doc ref (service/findings/store.py). Existing findings have none and yield to one that has.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("findings") as batch_op:
        batch_op.add_column(sa.Column("source_ref", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("findings") as batch_op:
        batch_op.drop_column("source_ref")
