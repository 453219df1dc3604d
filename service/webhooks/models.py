from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, BigIntId, UTCDateTime


class WebhookDelivery(Base):
    """One notification to send: written in the transaction that opened the incident, so it survives
    a restart; the body is built when it is sent, from the incident as it is then.

    Pending while ``delivered_at`` and ``failed_at`` are both null; ``next_attempt_at`` is also
    the lease a sender takes before posting, so two replicas do not send the same row at once.
    """

    __tablename__ = "webhook_outbox"
    __table_args__ = (Index("ix_webhook_outbox_next_attempt_at", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    event: Mapped[str] = mapped_column(String(32))
    incident_id: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
