"""``Authorization: Bearer bw_...``, the roles each route accepts, and the per-key rate limit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from service.auth.keys import Caller, Role
from service.errors import Forbidden, RateLimited, Unauthorized
from service.ratelimit import retry_after

READERS = (Role.READ, Role.TRIAGE, Role.ADMIN)
ROLES_ATTRIBUTE = "bleedwatch_roles"  # set on every dependency require() makes: tests read the role matrix


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
        deps = request.app.state.deps
        caller: Caller | None = await deps.keys.verify(token.strip())
        if caller is None:
            raise Unauthorized("the API key is unknown or revoked", headers={"WWW-Authenticate": "Bearer"})
        wait = await deps.limiter.take(caller.key_id)
        if wait > 0:
            raise RateLimited(
                "this API key sent more requests than BLEEDWATCH_RATE_LIMIT_PER_SECOND / _BURST allow; "
                "retry after the Retry-After seconds",
                headers={"Retry-After": retry_after(wait)},
            )
        if caller.role not in allowed:
            names = ", ".join(sorted(r.value for r in allowed))
            raise Forbidden(f"this key has role '{caller.role.value}'; this endpoint needs one of: {names}")
        request.state.caller = caller
        return caller

    setattr(dependency, ROLES_ATTRIBUTE, allowed)
    return dependency
