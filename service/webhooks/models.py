from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, BigIntId, UTCDateTime


class WebhookDelivery(Base):
    """One event for one target: written in the transaction that changed the incident, so it survives
    a restart and never exists for a change that rolled back; the body is built when it is sent,
    from the incident as it is then.

    A row per target keeps each target's retries and failures its own: a Slack outage delays
    no page. Rows of one (target, incident) are sent in id order, each after the one before it is
    delivered or given up, so a page is never resolved before it was triggered.

    Pending while ``delivered_at`` and ``failed_at`` are both null; ``next_attempt_at`` is also
    the lease a sender takes before posting, so two replicas do not send the same row at once.
    """

    __tablename__ = "webhook_outbox"
    __table_args__ = (
        Index("ix_webhook_outbox_next_attempt_at", "next_attempt_at"),
        Index("ix_webhook_outbox_target_incident_id_id", "target", "incident_id", "id"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    event: Mapped[str] = mapped_column(String(32))
    # A target's name in BLEEDWATCH_PAGING_TARGETS, or "webhook" for BLEEDWATCH_WEBHOOK_URL.
    target: Mapped[str] = mapped_column(String(64), server_default="webhook")
    incident_id: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
