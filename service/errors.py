"""One error shape for every 4xx and 5xx: ``{"error": "<code>", "detail": "<what to do>"}``.

Messages are written for the gateway operator reading a log line, and never echo fingerprint
values, text or other tenants' data: at most the caller's own field names and limits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from bleedwatch.limits import LABEL_PATTERN, NAME_PATTERN


class ErrorBody(BaseModel):
    error: str
    detail: str


class ApiError(Exception):
    status = 400
    error = "bad_request"

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers


class Unauthorized(ApiError):
    status, error = 401, "unauthorized"


class Forbidden(ApiError):
    status, error = 403, "forbidden"


class NotFound(ApiError):
    status, error = 404, "not_found"


class Conflict(ApiError):
    """The request is well-formed but not possible in the target's current state (e.g. a lifecycle step)."""

    status, error = 409, "conflict"


class PayloadTooLarge(ApiError):
    status, error = 413, "payload_too_large"


class UnsupportedMediaType(ApiError):
    status, error = 415, "unsupported_media_type"


class Invalid(ApiError):
    status, error = 422, "invalid"


class RateLimited(ApiError):
    """The API key sent more requests than its token bucket allows; ``Retry-After`` says when to retry."""

    status, error = 429, "rate_limited"


class TooManyNewTenants(RateLimited):
    """An ingest key introduced more tenants not seen before this minute than it may: a gateway
    inventing tenant names would grow every replica's state; known tenants still pass."""

    error = "too_many_new_tenants"


class Unavailable(ApiError):
    """A backend is down: the caller should retry the same request later; nothing was kept."""

    status, error = 503, "unavailable"


def responses(*errors: type[ApiError]) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: every error it may answer, in the one shape."""
    return {e.status: {"model": ErrorBody, "description": e.error} for e in errors}


def common_responses() -> dict[int | str, dict[str, Any]]:
    """Answers any authenticated JSON route may give, whatever the route: declared on every router."""
    return responses(Unauthorized, Forbidden, UnsupportedMediaType, Invalid, RateLimited, Unavailable)


def _body(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


# A part of an error's location repeated as is: the shape of the schema's own field names. Another
# name is the caller's (pasted text as a key, say) and is never sent back.
FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")


def problem(err: Mapping[str, Any], start: str = "") -> str:
    """``where: rule`` for one pydantic error, naming fields, never values; a name the caller chose
    is repeated only if it has a field name's shape (``meta.comment``), else it is ``[…]``."""
    loc = tuple(p for p in err.get("loc", ()) if p != "body")
    if err.get("type") == "json_invalid":  # where in the text it broke is no field: "[0]" would say one
        return "body: not JSON; send the request body as UTF-8 JSON"
    pattern = str((err.get("ctx") or {}).get("pattern", ""))
    if err.get("type") == "string_pattern_mismatch" and pattern in (NAME_PATTERN, LABEL_PATTERN):
        # Not the pattern itself: four hundred characters of Unicode ranges say nothing to an operator.
        return f"{field_path(loc, start)}: no control, format (zero-width, bidi) or line-separator characters"
    if err.get("type") == "extra_forbidden":
        return f"{field_path(loc, start)}: not a field of the schema"
    # A validator's own sentence, without pydantic's "Value error, " in front of it.
    return f"{field_path(loc, start)}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}"


def field_path(loc: Sequence[Any], start: str = "") -> str:
    """``exchanges[3].prompt.offsets``."""
    out = start
    for p in loc:
        if isinstance(p, int):  # a list position (a dict key, even of digits, is a string: the caller's)
            out += f"[{p}]"
        elif isinstance(p, str) and FIELD_NAME.match(p):
            out += f".{p}" if out else p
        else:
            out += "[…]"
    return out or "body"


def optional_unwrapped(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A field that may be left out but not null (``X | None`` in the model) fails as a union: one
    error for X under a tag of pydantic's (``str-enum[Status]``) and one "Input should be None".
    An operator asked for X: the X error, at the field's own place."""
    nulls = {tuple(e["loc"][:-1]) for e in errors if e.get("type") == "none_required" and e["loc"][-1:] == ("none",)}
    out: list[Mapping[str, Any]] = []
    for e in errors:
        parent = tuple(e["loc"][:-1])
        if parent in nulls:
            if e.get("type") == "none_required":
                continue
            e = {**e, "loc": parent}
        out.append(e)
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _body(exc.status, exc.error, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _body(422, "invalid", "; ".join(problem(err) for err in optional_unwrapped(exc.errors())[:10]))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot read as JSON (invalid UTF-8, say): the same
            # documented 422 as a body that is JSON of the wrong shape.
            return _body(422, "invalid", "body: not JSON; send the request body as UTF-8 JSON")
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request.app, request.url.path))}
        return _body(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail), headers)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route takes at this path, for the ``Allow`` of a 405 (RFC 9110).

    The router's own ``Allow`` names only the first route that matched the path, and one path
    often has a route per method (GET and POST /v1/allowlist).
    """
    methods: set[str] = set()
    for context in iter_route_contexts(app.routes):
        if context.path is not None and compile_path(context.path)[0].match(path):
            methods.update(context.methods or ())
    return sorted(methods)
