from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, UTCDateTime


class Deployment(Base):
    """A deployment's serving config as its engine or operator last reported it.

    Violations are not stored: they are evaluated against the rules in force whenever the
    record is read or the risk gauges are refreshed, so a changed rules file applies at once.
    ``id`` is the same string gateways send as ``meta.deployment``, so findings and engine
    signals join on it.
    """

    __tablename__ = "deployments"

    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    model: Mapped[str] = mapped_column(String(256))
    engine: Mapped[str] = mapped_column(String(64))
    engine_version: Mapped[str] = mapped_column(String(64))
    disaggregated: Mapped[bool] = mapped_column(Boolean)
    context_length: Mapped[int] = mapped_column(BigInteger)
    prefill_kv_pool_tokens: Mapped[int] = mapped_column(BigInteger)
    decode_kv_pool_tokens: Mapped[int] = mapped_column(BigInteger)
    deferred_page_release_prefill: Mapped[bool | None] = mapped_column(Boolean)
    deferred_page_release_decode: Mapped[bool | None] = mapped_column(Boolean)
    kv_transfer_batch_cap: Mapped[int | None] = mapped_column(Integer)
    lb_aborts_on_client_disconnect: Mapped[bool | None] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(24))
