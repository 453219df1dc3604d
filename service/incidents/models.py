from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, BigIntId, JSONType, UTCDateTime


class Incident(Base):
    """Findings of one model and deployment close together in time: one thing for responders to handle.

    ``first_seen_at`` and ``last_seen_at`` span the leaked responses' own timestamps; the grouping
    gap is measured on them, so a late-arriving finding joins the incident of its time.
    Aggregates (severity, counts, tenants) are maintained with every finding attached, in the
    same transaction as the finding itself.
    """

    __tablename__ = "incidents"
    __table_args__ = (
        Index("ix_incidents_model_deployment_status", "model", "deployment", "status"),
        Index("ix_incidents_opened_at_id", "opened_at", "id"),
        Index("ix_incidents_last_seen_at_id", "last_seen_at", "id"),
        Index("ix_incidents_severity_rank_id", "severity_rank", "id"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(256))
    deployment: Mapped[str | None] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(16))  # open, acknowledged, resolved, false_positive
    severity: Mapped[str] = mapped_column(String(16))  # the highest of its findings
    severity_rank: Mapped[int] = mapped_column(Integer)  # 1 low, 2 high, 3 critical: for sorting
    assignee: Mapped[str | None] = mapped_column(String(128))
    notes: Mapped[str | None] = mapped_column(Text)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime())
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finding_count: Mapped[int] = mapped_column(Integer)


class IncidentFinding(Base):
    """A finding's place in an incident, and whether a responder called it a false positive.

    ``allowlist_entry_id`` is the allowlist entry the false positive created (origin
    ``false_positive:finding:<id>``); reverting revokes it. ``false_positive_via`` says whether
    the finding was marked on its own or with its whole incident, so reverting the incident
    reverts only what the incident did.
    """

    __tablename__ = "incident_findings"
    __table_args__ = (Index("ix_incident_findings_incident_id", "incident_id"),)

    finding_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"),
        ForeignKey("findings.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    incident_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), ForeignKey("incidents.id", ondelete="CASCADE")
    )
    attached_at: Mapped[datetime] = mapped_column(UTCDateTime())
    false_positive: Mapped[bool] = mapped_column(Boolean)
    false_positive_via: Mapped[str | None] = mapped_column(String(16))  # "finding" or "incident"
    allowlist_entry_id: Mapped[int | None] = mapped_column(BigInteger)


class IncidentTenant(Base):
    """Every tenant on either side of an incident's findings (all evidence sources, not just the top one)."""

    __tablename__ = "incident_tenants"
    __table_args__ = (Index("ix_incident_tenants_tenant", "tenant"),)

    incident_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"),
        ForeignKey("incidents.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    side: Mapped[str] = mapped_column(String(16), primary_key=True)  # "source" or "recipient"


class IncidentEvent(Base):
    """One entry of an incident's timeline: who (API key id, or ``bleedwatch``), when, what.

    ``detail`` holds ids, severities, statuses and the responder's own text (assignee, notes),
    never a tenant name, so purging a tenant never has to rewrite a timeline.
    """

    __tablename__ = "incident_events"
    __table_args__ = (Index("ix_incident_events_incident_id_id", "incident_id", "id"), NEVER_REUSED)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    incident_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), ForeignKey("incidents.id", ondelete="CASCADE")
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(32))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONType)
    request_id: Mapped[str | None] = mapped_column(String(64))
