"""Authentication before work: every ``/v1/`` request shows a valid API key before its body is read.

FastAPI reads and parses a request body before it runs a route's dependencies, so a key checked
in a dependency is checked after up to ``BLEEDWATCH_MAX_BODY_BYTES`` were read and parsed for
anyone. This ASGI middleware sits outside the body limit: it verifies the key (a token that is
not a key's shape costs no query), takes the key's rate-limit token, and only then lets the
request through; the route's ``require()`` checks the role. Refused keys take a token from a
bucket per client address (``BLEEDWATCH_AUTH_FAILURES_*``), so guessing ids costs the guesser
429s, not the database queries. Behind a proxy the client address is the proxy's unless uvicorn
trusts its forwarded headers (``BLEEDWATCH_FORWARDED_ALLOW_IPS``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from service.deps import AppDeps

from service import metrics
from service.auth.keys import Caller, Role
from service.db import DB_DOWN
from service.errors import ApiError, Forbidden, RateLimited, Unauthorized, Unavailable
from service.ratelimit import retry_after

log = logging.getLogger(__name__)
CALLER = "caller"  # the key in the request state (``request.state.caller``)
ROLES_ATTRIBUTE = "bleedwatch_roles"  # set on every dependency require() makes: the gate and tests read it
BEARER = {"WWW-Authenticate": "Bearer"}


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def authenticate(scope: Scope) -> Caller:
    """The caller of this request, or the ApiError to answer (401, 429 or 503); reads no body."""
    deps: AppDeps = scope["app"].state.deps
    token = bearer_token(Headers(scope=scope))
    address = client_address(scope)
    if (wait := deps.auth_failures.blocked(address)) > 0 and (token is None or deps.keys.cached(token) is None):
        # Out of failed tries: only a key verified here recently gets through, and it costs no query.
        metrics.AUTH_REFUSED.labels("rate_limited").inc()
        raise _too_many_failures(wait)
    try:
        caller = await deps.keys.verify(token) if token else None
    except DB_DOWN as exc:
        metrics.BACKEND_ERRORS.labels("database").inc()
        log.warning("backend_unavailable", extra={"backend": "database", "exc_type": type(exc).__name__})
        raise Unavailable(
            "the database is unreachable and this API key was not verified recently; retry later",
            headers={"Retry-After": "5"},
        ) from None
    if caller is None:
        metrics.AUTH_REFUSED.labels("missing" if token is None else "invalid").inc()
        if (wait := await deps.auth_failures.failed(address)) > 0:
            raise _too_many_failures(wait)
        if token is None:
            raise Unauthorized(
                "send an API key as 'Authorization: Bearer bw_...'; create one with 'bleedwatch keys create'",
                headers=BEARER,
            )
        raise Unauthorized("the API key is unknown or revoked", headers=BEARER)
    wait = await deps.limiter.take(caller.key_id)
    if wait > 0:
        raise RateLimited(
            "this API key sent more requests than BLEEDWATCH_RATE_LIMIT_PER_SECOND / _BURST allow; "
            "retry after the Retry-After seconds",
            headers={"Retry-After": retry_after(wait)},
        )
    return caller


def _too_many_failures(wait: float) -> RateLimited:
    return RateLimited(
        "too many requests with a missing or wrong API key from this address "
        "(BLEEDWATCH_AUTH_FAILURES_PER_SECOND / _BURST); check the key, retry after the Retry-After seconds",
        headers={"Retry-After": retry_after(wait), **BEARER},
    )


@dataclass(frozen=True, slots=True)
class _Route:
    methods: frozenset[str]
    path: re.Pattern[str]
    roles: frozenset[Role] | None  # what its require() accepts; None: no require()


class AuthGate:
    """ASGI middleware: authenticate every request to a ``/v1/`` route before anything reads its body.

    A key without the route's role is refused (403) here too. A path no route serves, or a method
    the route does not take, passes through to its 404 or 405: the OpenAPI document names every
    route anyway, and nothing is read or parsed for it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes: list[_Route] | None = None  # built on the first request, once every route is in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope) if scope["type"] == "http" and scope["path"].startswith("/v1/") else None
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            caller = await authenticate(scope)
            if route.roles is not None and caller.role not in route.roles:
                raise forbidden(caller, route.roles)
        except ApiError as exc:
            response = JSONResponse({"error": exc.error, "detail": exc.detail}, exc.status, headers=exc.headers)
            await response(scope, receive, send)  # sends only: the body is never received
            return
        scope.setdefault("state", {})[CALLER] = caller
        await self.app(scope, receive, send)

    def _route(self, scope: Scope) -> _Route | None:
        """The API route that takes this method and path, if any (every ``/v1/`` route requires a key)."""
        if self._routes is None:
            self._routes = _api_routes(scope["app"].routes)
        method = "GET" if scope["method"] == "HEAD" else scope["method"]
        return next((r for r in self._routes if method in r.methods and r.path.match(scope["path"])), None)


def forbidden(caller: Caller, allowed: frozenset[Role]) -> Forbidden:
    names = ", ".join(sorted(r.value for r in allowed))
    return Forbidden(f"this key has role '{caller.role.value}'; this endpoint needs one of: {names}")


def _api_routes(routes: list[BaseRoute]) -> list[_Route]:
    out = []
    for context in iter_route_contexts(routes):
        route, path = context.original_route, context.path
        if isinstance(route, APIRoute) and path is not None and path.startswith("/v1/"):
            regex, _, _ = compile_path(path)
            out.append(_Route(frozenset(context.methods or ()), regex, _roles(route.dependant)))
    return out


def _roles(dependant: Dependant) -> frozenset[Role] | None:
    """The roles the route's ``require()`` dependency accepts (None: it has none)."""
    stack = [dependant]
    while stack:
        current = stack.pop()
        roles: frozenset[Role] | None = getattr(current.call, ROLES_ATTRIBUTE, None)
        if roles is not None:
            return roles
        stack.extend(current.dependencies)
    return None
