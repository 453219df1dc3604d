"""``bleedwatch_open_incidents{severity}``, always recomputed from the database.

Every replica counts incidents not yet closed (open or acknowledged) by severity at start, after
each change it serves, and every ``BLEEDWATCH_INCIDENT_REFRESH_SECONDS``; so every replica says
the same within one refresh, whichever of them opened the incident.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import sqlalchemy.exc
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics
from service.db import session_scope
from service.incidents.grouping import ACTIVE
from service.incidents.models import Incident

log = logging.getLogger("bleedwatch.incidents")


class IncidentMonitor:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], refresh_seconds: float) -> None:
        self._sessions = sessions
        self._refresh_seconds = refresh_seconds
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> dict[str, int]:
        async with session_scope(self._sessions) as session:
            rows = await session.execute(
                select(Incident.severity, func.count()).where(Incident.status.in_(ACTIVE)).group_by(Incident.severity)
            )
            counts = dict.fromkeys(metrics.SEVERITIES, 0) | {str(s): int(n) for s, n in rows}
        for severity, count in counts.items():
            metrics.OPEN_INCIDENTS.labels(severity).set(count)
        return counts

    async def refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
            log.warning("open incident gauge not refreshed", extra={"exc_type": type(exc).__name__})

    async def start(self) -> None:
        await self.refresh_quietly()
        self._task = asyncio.create_task(self._periodically())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _periodically(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_seconds)
            await self.refresh_quietly()
