"""SQLite: ids are never handed out twice (AUTOINCREMENT)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07

Without AUTOINCREMENT SQLite gives a new row max(id) + 1, so deleting the newest rows (a tenant's
purge, the retention job, an outbox emptied after a quiet week) gives their ids to the next ones:
incident 1 of a link, an audit entry's ``finding:1`` or a webhook id a receiver deduplicates by
would name another row. Each table with an integer id is rebuilt with AUTOINCREMENT (SQLite then
remembers the highest id ever used, starting from the rows copied). PostgreSQL's sequences never go
back: nothing to do there.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TABLES = (
    "allowlist_entries",
    "audit_log",
    "canaries",
    "engine_signals",
    "findings",
    "incident_events",
    "incidents",
    "webhook_outbox",
)


def upgrade() -> None:
    _rebuild(autoincrement=True)


def downgrade() -> None:
    _rebuild(autoincrement=False)


def _rebuild(*, autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass
