"""The risk gauges, always recomputed from the database, never counted up in one process.

Every replica evaluates every stored deployment against the rules at start, after each PUT it
serves, and every ``refresh_seconds``; so after a restart, or on a replica that never saw the
PUT, ``bleedwatch_deployment_risk_violations{rule}`` says the same thing within one refresh.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics
from service.db import session_scope
from service.deployments.models import Deployment
from service.deployments.rules import RuleSet
from service.deployments.store import config_of
from service.periodic import Periodic


class RiskMonitor:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], rules: RuleSet, refresh_seconds: float) -> None:
        self.rules = rules
        self._sessions = sessions
        self._loop = Periodic("deployment risk gauges", self.refresh, refresh_seconds, first_delay=refresh_seconds)

    async def refresh(self) -> dict[str, int]:
        """Set the gauges from the database; returns deployments violating each rule."""
        async with session_scope(self._sessions) as session:
            rows = list((await session.scalars(select(Deployment))).all())
        counts = dict.fromkeys(self.rules.names, 0)
        at_risk = 0
        for row in rows:
            violated = {v.rule for v in self.rules.evaluate(config_of(row))}
            for name in violated:
                counts[name] += 1
            at_risk += bool(violated)
        for name, count in counts.items():
            metrics.DEPLOYMENT_RISK_VIOLATIONS.labels(name).set(count)
        metrics.DEPLOYMENTS.set(len(rows))
        metrics.DEPLOYMENTS_AT_RISK.set(at_risk)
        return counts

    async def refresh_quietly(self) -> None:
        await self._loop.run_quietly()

    async def start(self) -> None:
        await self.refresh_quietly()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
