"""The roles each route accepts; the key itself was verified by ``service/auth/gate.py``.

``Reader``, ``Triage``, ``Admin`` and ``Ingest`` are the annotations
routes declare, defined once so two routes cannot spell the same role set differently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from service.auth.gate import CALLER, ROLES_ATTRIBUTE, authenticate, forbidden
from service.auth.keys import Caller, Role

READERS = (Role.READ, Role.TRIAGE, Role.ADMIN)
__all__ = ["READERS", "ROLES_ATTRIBUTE", "Admin", "Ingest", "Reader", "Triage", "require"]


def require(*roles: Role) -> Callable[[Request], Awaitable[Caller]]:
    allowed = frozenset(roles)

    async def dependency(request: Request) -> Caller:
        # Every /v1/ request was authenticated before its body was read (AuthGate); a route
        # mounted elsewhere authenticates here, after FastAPI has read its body.
        caller: Caller | None = request.scope.get("state", {}).get(CALLER)
        if caller is None:
            caller = await authenticate(request.scope)
            request.scope.setdefault("state", {})[CALLER] = caller
        if caller.role not in allowed:
            raise forbidden(caller, allowed)
        return caller

    setattr(dependency, ROLES_ATTRIBUTE, allowed)
    return dependency


Reader = Annotated[Caller, Depends(require(*READERS))]
Triage = Annotated[Caller, Depends(require(Role.TRIAGE, Role.ADMIN))]
Admin = Annotated[Caller, Depends(require(Role.ADMIN))]
Ingest = Annotated[Caller, Depends(require(Role.INGEST))]
