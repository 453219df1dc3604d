"""What the lifespan builds once and every route reads: typed, no module-level clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from service.auth.failures import AuthFailures
from service.auth.keys import KeyVerifier
from service.auth.revocations import Revocations
from service.config import Settings
from service.deployments.risk import RiskMonitor
from service.incidents.grouping import Policy
from service.incidents.monitor import IncidentMonitor
from service.index.base import Index
from service.ingest.service import Ingestor
from service.matching.known import KnownFingerprints
from service.ratelimit import RateLimiter


@dataclass(slots=True)
class AppDeps:
    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    index: Index
    ingestor: Ingestor
    keys: KeyVerifier
    revocations: Revocations
    known: KnownFingerprints
    risk: RiskMonitor
    limiter: RateLimiter
    auth_failures: AuthFailures
    incidents: IncidentMonitor
    # How findings join incidents and who is paged: passed to the findings writer and incident changes.
    incident_policy: Policy


def get_deps(request: Request) -> AppDeps:
    deps: AppDeps = request.app.state.deps
    return deps


Deps = Annotated[AppDeps, Depends(get_deps)]
