"""incidents, audit log, webhook outbox; findings keep their matched fingerprints

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

On PostgreSQL the audit log is append-only in the database too: a trigger refuses UPDATE,
and DELETE unless the transaction set ``bleedwatch.retention = 'on'`` (the retention job does,
service/retention/jobs.py). It guards against mistakes in code and casual SQL, not against a
database superuser or the table owner, who can drop the trigger (docs/incidents.md#audit).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
TS = sa.DateTime(timezone=True)

APPEND_ONLY_FUNCTION = """
CREATE FUNCTION bleedwatch_audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('bleedwatch.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only: % refused (only the retention job deletes)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$
"""
APPEND_ONLY_TRIGGER = """
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
FOR EACH ROW EXECUTE FUNCTION bleedwatch_audit_log_append_only()
"""


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("action", sa.String(length=48), nullable=False),
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("detail", JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_action", "audit_log", ["action"], unique=False)
    op.create_index("ix_audit_log_at_id", "audit_log", ["at", "id"], unique=False)
    op.create_index("ix_audit_log_key_id", "audit_log", ["key_id"], unique=False)

    op.create_table(
        "incidents",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("deployment", sa.String(length=256), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("severity_rank", sa.Integer(), nullable=False),
        sa.Column("assignee", sa.String(length=128), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("opened_at", TS, nullable=False),
        sa.Column("first_seen_at", TS, nullable=False),
        sa.Column("last_seen_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("closed_at", TS, nullable=True),
        sa.Column("finding_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index("ix_incidents_last_seen_at_id", "incidents", ["last_seen_at", "id"], unique=False)
    op.create_index(
        "ix_incidents_model_deployment_status", "incidents", ["model", "deployment", "status"], unique=False
    )
    op.create_index("ix_incidents_opened_at_id", "incidents", ["opened_at", "id"], unique=False)
    op.create_index("ix_incidents_severity_rank_id", "incidents", ["severity_rank", "id"], unique=False)

    op.create_table(
        "webhook_outbox",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("incident_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", TS, nullable=False),
        sa.Column("delivered_at", TS, nullable=True),
        sa.Column("failed_at", TS, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_outbox")),
    )
    op.create_index("ix_webhook_outbox_next_attempt_at", "webhook_outbox", ["next_attempt_at"], unique=False)

    op.create_table(
        "incident_events",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("incident_id", ID, nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("actor", sa.String(length=32), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("detail", JSON, nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_incident_events_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incident_events")),
    )
    op.create_index("ix_incident_events_incident_id_id", "incident_events", ["incident_id", "id"], unique=False)

    op.create_table(
        "incident_findings",
        sa.Column("finding_id", ID, autoincrement=False, nullable=False),
        sa.Column("incident_id", ID, nullable=False),
        sa.Column("attached_at", TS, nullable=False),
        sa.Column("false_positive", sa.Boolean(), nullable=False),
        sa.Column("false_positive_via", sa.String(length=16), nullable=True),
        sa.Column("allowlist_entry_id", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["finding_id"], ["findings.id"], name=op.f("fk_incident_findings_finding_id_findings"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_incident_findings_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("finding_id", name=op.f("pk_incident_findings")),
    )
    op.create_index("ix_incident_findings_incident_id", "incident_findings", ["incident_id"], unique=False)

    op.create_table(
        "incident_tenants",
        sa.Column("incident_id", ID, autoincrement=False, nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("side", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_incident_tenants_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("incident_id", "tenant", "side", name=op.f("pk_incident_tenants")),
    )
    op.create_index("ix_incident_tenants_tenant", "incident_tenants", ["tenant"], unique=False)

    with op.batch_alter_table("findings") as batch_op:
        batch_op.add_column(sa.Column("matched_values", JSON, nullable=True))

    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_ONLY_FUNCTION)
        op.execute(APPEND_ONLY_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION bleedwatch_audit_log_append_only()")
    with op.batch_alter_table("findings") as batch_op:
        batch_op.drop_column("matched_values")
    op.drop_index("ix_incident_tenants_tenant", table_name="incident_tenants")
    op.drop_table("incident_tenants")
    op.drop_index("ix_incident_findings_incident_id", table_name="incident_findings")
    op.drop_table("incident_findings")
    op.drop_index("ix_incident_events_incident_id_id", table_name="incident_events")
    op.drop_table("incident_events")
    op.drop_index("ix_webhook_outbox_next_attempt_at", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
    op.drop_index("ix_incidents_severity_rank_id", table_name="incidents")
    op.drop_index("ix_incidents_opened_at_id", table_name="incidents")
    op.drop_index("ix_incidents_model_deployment_status", table_name="incidents")
    op.drop_index("ix_incidents_last_seen_at_id", table_name="incidents")
    op.drop_table("incidents")
    op.drop_index("ix_audit_log_key_id", table_name="audit_log")
    op.drop_index("ix_audit_log_at_id", table_name="audit_log")
    op.drop_index("ix_audit_log_action", table_name="audit_log")
    op.drop_table("audit_log")
