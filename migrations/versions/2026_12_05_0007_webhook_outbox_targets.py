"""webhook outbox rows per paging target

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

Incident events go to several targets (PagerDuty, Slack, Standard Webhooks), each with its own
retries and failures, so the outbox gets a row per target (service/webhooks/models.py). Rows
written before this were all for ``BLEEDWATCH_WEBHOOK_URL``, the target named ``webhook``.
The index serves the sender's rule that one (target, incident) is sent in order.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_outbox") as batch_op:
        batch_op.add_column(sa.Column("target", sa.String(length=64), server_default="webhook", nullable=False))
        batch_op.create_index("ix_webhook_outbox_target_incident_id_id", ["target", "incident_id", "id"])


def downgrade() -> None:
    with op.batch_alter_table("webhook_outbox") as batch_op:
        batch_op.drop_index("ix_webhook_outbox_target_incident_id_id")
        batch_op.drop_column("target")
