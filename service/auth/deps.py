"""``Authorization: Bearer bw_...`` and the roles each route accepts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from service.auth.keys import Caller, Role
from service.errors import Forbidden, Unauthorized

READERS = (Role.READ, Role.TRIAGE, Role.ADMIN)


def require(*roles: Role) -> Callable[[Request], Awaitable[Caller]]:
    allowed = frozenset(roles)

    async def dependency(request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                "send an API key as 'Authorization: Bearer bw_...'; create one with 'bleedwatch keys create'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        caller: Caller | None = await request.app.state.deps.keys.verify(token.strip())
        if caller is None:
            raise Unauthorized("the API key is unknown or revoked", headers={"WWW-Authenticate": "Bearer"})
        if caller.role not in allowed:
            names = ", ".join(sorted(r.value for r in allowed))
            raise Forbidden(f"this key has role '{caller.role.value}'; this endpoint needs one of: {names}")
        request.state.caller = caller
        return caller

    return dependency
