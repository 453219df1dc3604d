"""responder UI sessions

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05

One row per signed-in browser of the UI at /ui (service/ui/sessions.py): the SHA-256 of the
cookie's random value and the key id it signed in with. In the database, not in process memory,
because API replicas are stateless: any replica serves the next page, and signing out (or
revoking the key) ends the session on all of them at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=24), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"], ["api_keys.id"], name=op.f("fk_ui_sessions_key_id_api_keys"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_ui_sessions")),
    )
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"], unique=False)
    op.create_index(op.f("ix_ui_sessions_key_id"), "ui_sessions", ["key_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_ui_sessions_key_id"), table_name="ui_sessions")
    op.drop_index("ix_ui_sessions_expires_at", table_name="ui_sessions")
    op.drop_table("ui_sessions")
