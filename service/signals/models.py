from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db import NEVER_REUSED, Base, UTCDateTime

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
SignalId = BigInteger().with_variant(Integer(), "sqlite")


class EngineSignal(Base):
    """One integrity event (or ``count`` of the same kind) an engine reported about itself.

    Indexed by (deployment, node, ts) so incidents can show signals beside findings, which carry
    the same deployment and node, over the same time range. ``event_id``, when the engine sends
    one, makes a retried batch harmless.
    """

    __tablename__ = "engine_signals"
    __table_args__ = (
        UniqueConstraint("deployment", "node", "event_id"),
        Index("ix_engine_signals_deployment_node_ts", "deployment", "node", "ts"),
        Index("ix_engine_signals_ts_id", "ts", "id"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(SignalId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(48))
    deployment: Mapped[str] = mapped_column(String(256))
    node: Mapped[str] = mapped_column(String(256))
    ts: Mapped[datetime] = mapped_column(UTCDateTime())
    request_id: Mapped[str | None] = mapped_column(String(256))
    count: Mapped[int] = mapped_column(Integer)
    event_id: Mapped[str | None] = mapped_column(String(128))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    key_id: Mapped[str] = mapped_column(String(24))
