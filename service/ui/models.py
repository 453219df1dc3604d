from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, UTCDateTime


class UiSession(Base):
    """A signed-in browser: the SHA-256 of its cookie's random value, and the API key it signed in with.

    Neither the cookie value nor the API key is stored: a copy of this table signs no one in.
    """

    __tablename__ = "ui_sessions"
    __table_args__ = (Index("ix_ui_sessions_expires_at", "expires_at"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(24), ForeignKey("api_keys.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
