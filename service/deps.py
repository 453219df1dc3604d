"""What the lifespan builds once and every route reads: typed, no module-level clients.

Routes declare what they use (``SessionDep``, ``IndexDep``, ``Deps``) instead of opening their own
session, so every route commits, rolls back and answers 503 the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from service.auth.failures import AuthFailures
from service.auth.keys import KeyVerifier
from service.auth.revocations import Revocations
from service.config import Settings
from service.db import session_scope
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


async def _session(deps: Deps) -> AsyncIterator[AsyncSession]:
    """One session per request: committed when the handler returns, rolled back if it raises.

    Used with ``scope="function"`` so the commit happens before the response is sent: a commit that
    fails (the database went away) answers 503 like any query would, never a 200 for lost work.
    Handlers whose follow-up (cache invalidation, a refresh) must see the committed rows commit first
    themselves; the boundary's commit is then a no-op.
    """
    async with session_scope(deps.sessions) as session:
        yield session


def _index(deps: Deps) -> Index:
    return deps.index


SessionDep = Annotated[AsyncSession, Depends(_session, scope="function")]
IndexDep = Annotated[Index, Depends(_index)]
