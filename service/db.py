"""Database engine, sessions and the declarative base; the only module that knows the driver.

Services flush, the request scope commits (``session_scope``, which routes get as
``service.deps.SessionDep``): a route's work lands whole or not at all. The same models run on
PostgreSQL and on the embedded SQLite file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import sqlalchemy.exc
import sqlalchemy.ext.asyncio
from sqlalchemy import JSON, BigInteger, DateTime, Integer, MetaData, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase

from service.config import Settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")
# 64 bits on both: PostgreSQL's BIGINT, SQLite's INTEGER (which already holds 64), as the schema has it.
BigInt = BigInteger().with_variant(Integer(), "sqlite")
# ... and without AUTOINCREMENT it hands out max(id) + 1, so deleting the newest rows (a purge, the
# retention job) gives their ids to the next ones: a link, an audit target or a webhook id would then
# name another incident. Tables with a BigIntId take this (PostgreSQL's sequences never go back).
NEVER_REUSED = {"sqlite_autoincrement": True}
# The errors that mean "the database is unreachable" (not "the query is wrong"): callers catch these
# to serve stale or answer 503. Here, beside the engine, so catching them needs no other package.
DB_DOWN = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, OSError)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both backends; SQLite would otherwise hand back naive datetimes."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> datetime:
    return datetime.now(UTC)


def make_engine(settings: Settings) -> AsyncEngine:
    url = settings.sqlalchemy_url(asynchronous=True)
    # Called through the module, where the tracing instrumentation wraps it (service/tracing.py).
    if url.startswith("sqlite"):
        settings.make_data_dir()
        return sqlalchemy.ext.asyncio.create_async_engine(url, connect_args={"timeout": 30})
    return sqlalchemy.ext.asyncio.create_async_engine(
        url, pool_size=10, max_overflow=10, pool_pre_ping=True, pool_timeout=10
    )


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def session_scope(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    async with sessions() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
