"""``bleedwatch_open_incidents{severity}``, always recomputed from the database.

Every replica counts incidents not yet closed (open or acknowledged) by severity at start, after
each change it serves, and every ``BLEEDWATCH_INCIDENT_REFRESH_SECONDS``; so every replica says
the same within one refresh, whichever of them opened the incident.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics
from service.db import session_scope
from service.incidents.grouping import ACTIVE
from service.incidents.models import Incident
from service.periodic import Periodic


class IncidentMonitor:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], refresh_seconds: float) -> None:
        self._sessions = sessions
        self._loop = Periodic("open incident gauge", self.refresh, refresh_seconds, first_delay=refresh_seconds)

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
        await self._loop.run_quietly()

    async def start(self) -> None:
        await self.refresh_quietly()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
