"""Engine signals in the database. Functions flush; the caller's session scope commits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from service import cursors
from service.db import utcnow
from service.signals.models import EngineSignal
from service.signals.schemas import SignalEvent


async def insert(session: AsyncSession, events: list[SignalEvent], key_id: str) -> list[tuple[str, int]]:
    """Store the events, skipping any whose (deployment, node, event_id) is already stored.

    Returns (kind, count) of each event stored.
    """
    now = utcnow()
    rows, seen = [], set()
    for e in events:
        if e.event_id is not None:
            if (e.deployment, e.node, e.event_id) in seen:
                continue
            seen.add((e.deployment, e.node, e.event_id))
        rows.append(
            {
                "kind": e.kind.value,
                "deployment": e.deployment,
                "node": e.node,
                "ts": e.ts,
                "request_id": e.request_id,
                "count": e.count,
                "event_id": e.event_id,
                "received_at": now,
                "key_id": key_id,
            }
        )
    if not rows:
        return []
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = (
        insert(EngineSignal)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["deployment", "node", "event_id"])
        .returning(EngineSignal.kind, EngineSignal.count)
    )
    return [(str(kind), int(count)) for kind, count in (await session.execute(stmt)).all()]


@dataclass(frozen=True, slots=True)
class SignalFilter:
    deployment: str | None = None
    node: str | None = None
    kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None


async def page(
    session: AsyncSession, f: SignalFilter, cursor: str | None, limit: int
) -> tuple[list[EngineSignal], str | None]:
    """Newest first by the engine's timestamp (then id); the cursor is the last (ts, id) seen."""
    q = select(EngineSignal)
    for column, value in (
        (EngineSignal.deployment, f.deployment),
        (EngineSignal.node, f.node),
        (EngineSignal.kind, f.kind),
    ):
        if value is not None:
            q = q.where(column == value)
    if f.since is not None:
        q = q.where(EngineSignal.ts >= f.since)
    if f.until is not None:
        q = q.where(EngineSignal.ts < f.until)
    if cursor is not None:
        micros, signal_id = cursors.decode_key_id(cursor)
        ts = cursors.to_time(micros)
        q = q.where(or_(EngineSignal.ts < ts, and_(EngineSignal.ts == ts, EngineSignal.id < signal_id)))
    q = q.order_by(EngineSignal.ts.desc(), EngineSignal.id.desc()).limit(limit + 1)
    rows = list((await session.scalars(q)).all())
    next_cursor = cursors.encode_key_id(rows[limit - 1].ts, rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor
