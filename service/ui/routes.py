"""The responder UI: server-rendered pages over the same stores, audit entries and roles as the API.

Every read records the audit entry its API twin records, under the signed-in key id; every change
goes through ``service.incidents.routes.change``, the PATCH route's own code. Pages are Jinja2
with autoescaping on, no JavaScript at all, and one stylesheet served from here, so the strict
Content-Security-Policy (``UiHeaders``) can forbid scripts and every other origin outright.

Every POST carries the session's CSRF token in a hidden field and is refused (403) without it;
the sign-in form, which has no session yet, carries a token that must match a short-lived cookie
(double submit), so no other site can sign a browser in under a key of its choosing. The
cookies are SameSite=Strict besides. Sessions: ``service/ui/sessions.py``.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from importlib.resources import files
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Path, Request
from fastapi.responses import RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import audit, cursors, metrics
from service.audit.log import filters
from service.auth.deps import READERS
from service.auth.gate import client_address
from service.auth.keys import Caller, Role
from service.db import DB_DOWN
from service.deps import AppDeps, Deps, SessionDep
from service.errors import ApiError, NotFound
from service.findings.severity import Severity
from service.incidents import impact, store
from service.incidents.routes import change
from service.incidents.schemas import TRANSITIONS, IncidentPatch, Status
from service.ratelimit import retry_after
from service.ui import evidence, sessions

router = APIRouter(prefix="/ui", include_in_schema=False)
IncidentId = Annotated[int, Path(ge=1, lt=2**63)]
PAGE_SIZE = 50
MAX_DRAWN = 200  # findings whose evidence an incident page draws (and audits as read); the rest are listed
MAX_FORM_BYTES = 16 * 1024  # the largest form is the notes one (10,000 characters, percent-encoded)
SEVERITIES = tuple(Severity)
CURSOR = re.compile(cursors.KEY_ID_PATTERN)
TRIAGE = frozenset({Role.TRIAGE, Role.ADMIN})
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
ACTIONS = {  # the status buttons: (target status, label)
    Status.ACKNOWLEDGED: "Acknowledge",
    Status.RESOLVED: "Resolve",
    Status.FALSE_POSITIVE: "False positive",
    Status.OPEN: "Reopen",
}
TOO_MANY = "Too many wrong keys from this address (BLEEDWATCH_AUTH_FAILURES_*); wait and retry."
DONE = {"status": "Status changed.", "assignee": "Assignee saved.", "notes": "Notes saved."}

_env = Environment(
    loader=PackageLoader("service.ui", "templates"), autoescape=True, undefined=StrictUndefined, auto_reload=False
)
templates = Jinja2Templates(env=_env)
_CSS = (files("service.ui") / "static" / "ui.css").read_bytes()


class UiHeaders:
    """Security headers on every ``/ui`` response, error pages and redirects included, and no
    caching of pages that show tenant names (the stylesheet alone may be cached)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == "/ui" or path.startswith("/ui/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith("/ui/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), *HEADERS]
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


# --- helpers ----------------------------------------------------------------------------------


def _page(
    request: Request, name: str, context: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    base = {"caller": None, "csrf": "", "message": None}
    return templates.TemplateResponse(request, name, base | context, status_code=status, headers=headers)


def _error(
    request: Request,
    status: int,
    detail: str,
    who: tuple[Caller, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    context: dict[str, Any] = {"status": status, "detail": detail}
    if who is not None:
        context |= {"caller": who[0], "csrf": who[1]}
    return _page(request, "error.html", context, status, headers)


def _see(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


async def _form(request: Request) -> dict[str, str] | None:
    """An ``application/x-www-form-urlencoded`` body as its first values; None if it is not one."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return None
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return None
    try:
        parsed = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        return None
    return {k: v[0] for k, v in parsed.items()}


async def _signed_in(request: Request, deps: AppDeps, session: AsyncSession) -> tuple[Caller, str] | Response:
    """The caller and its CSRF token, or the response to send instead: to sign-in, or 429."""
    raw = sessions.raw_cookie(request, deps.settings)
    caller = await sessions.caller(session, raw)
    if caller is None or raw is None or caller.role not in READERS:
        return _see("/ui/signin")
    wait = await deps.limiter.take(caller.key_id)
    if wait > 0:
        return _error(
            request,
            429,
            "this API key made more requests than BLEEDWATCH_RATE_LIMIT_PER_SECOND / _BURST allow; retry shortly",
            headers={"Retry-After": retry_after(wait)},
        )
    return caller, sessions.csrf_token(raw)


def _blank(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


# --- sign-in and sign-out ---------------------------------------------------------------------


def _signin_page(
    request: Request,
    deps: AppDeps,
    status: int = 200,
    message: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The form, with a fresh double-submit token in both the form and a short-lived cookie."""
    token = secrets.token_urlsafe(24)
    response = _page(request, "signin.html", {"signin_csrf": token, "message": message}, status, headers)
    sessions.set_cookie(
        response, deps.settings, sessions.signin_cookie_name(deps.settings), token, sessions.SIGNIN_COOKIE_SECONDS
    )
    return response


@router.get("/signin")
async def signin_form(request: Request, deps: Deps, session: SessionDep) -> Response:
    if await sessions.caller(session, sessions.raw_cookie(request, deps.settings)) is not None:
        return _see("/ui")
    return _signin_page(request, deps)


@router.post("/signin")
async def signin(request: Request, deps: Deps, session: SessionDep) -> Response:
    """The key is verified like the API's (same cache, same per-address budget of failures), and
    never stored: the session row holds its id only."""
    form = await _form(request)
    expected = request.cookies.get(sessions.signin_cookie_name(deps.settings))
    if form is None or expected is None or not sessions.csrf_ok(expected, form.get("csrf")):
        return _signin_page(request, deps, 403, "The sign-in form expired or came from elsewhere; try again.")
    token = form.get("api_key", "").strip()
    address = client_address(request.scope)
    if (wait := deps.auth_failures.blocked(address)) > 0 and deps.keys.cached(token) is None:
        metrics.AUTH_REFUSED.labels("rate_limited").inc()
        return _signin_page(request, deps, 429, TOO_MANY, {"Retry-After": retry_after(wait)})
    try:
        caller = await deps.keys.verify(token) if token else None
    except DB_DOWN:
        return _error(request, 503, "The database is unreachable; retry later.", headers={"Retry-After": "5"})
    if caller is None:
        metrics.AUTH_REFUSED.labels("missing" if not token else "invalid").inc()
        if (wait := await deps.auth_failures.failed(address)) > 0:
            return _signin_page(request, deps, 429, TOO_MANY, {"Retry-After": retry_after(wait)})
        return _signin_page(request, deps, 401, "That API key is unknown or revoked.")
    if caller.role not in READERS:
        return _signin_page(request, deps, 403, f"A key with role '{caller.role.value}' cannot read incidents.")
    if (previous := sessions.raw_cookie(request, deps.settings)) is not None:
        await sessions.end(session, previous)  # a new sign-in replaces the browser's session, never adds one
    raw = await sessions.create(session, deps.settings, caller)
    await audit.record(session, caller, "ui.signin", "ui")
    response = _see("/ui")
    settings = deps.settings
    sessions.set_cookie(response, settings, sessions.cookie_name(settings), raw, settings.ui_session_seconds)
    sessions.clear_cookie(response, deps.settings, sessions.signin_cookie_name(deps.settings))
    return response


@router.post("/signout")
async def signout(request: Request, deps: Deps, session: SessionDep) -> Response:
    raw = sessions.raw_cookie(request, deps.settings)
    form = await _form(request)
    caller = await sessions.caller(session, raw)
    if caller is None or raw is None:
        return _see("/ui/signin")
    if form is None or not sessions.csrf_ok(sessions.csrf_token(raw), form.get("csrf")):
        return _error(request, 403, "The form is missing its CSRF token; reload the page and retry.")
    await sessions.end(session, raw)
    await audit.record(session, caller, "ui.signout", "ui")
    response = _see("/ui/signin")
    sessions.clear_cookie(response, deps.settings, sessions.cookie_name(deps.settings))
    return response


# --- pages ------------------------------------------------------------------------------------


@router.get("")
async def incidents(request: Request, deps: Deps, session: SessionDep) -> Response:
    """Incidents, newest leak first; ``status`` is ``open`` unless the filter says otherwise."""
    q = request.query_params
    status = q.get("status", Status.OPEN.value)
    values = {k: _blank(q.get(k)) for k in ("severity", "model", "deployment", "tenant")}
    cursor = _blank(q.get("cursor"))
    problems = []
    if status not in {s.value for s in Status} | {"all"}:
        problems.append("status: one of open, acknowledged, resolved, false_positive, all")
    if values["severity"] is not None and values["severity"] not in SEVERITIES:
        problems.append("severity: one of low, high, critical")
    for name, limit in (("model", 256), ("deployment", 256), ("tenant", 128)):
        if len(values[name] or "") > limit:
            problems.append(f"{name}: at most {limit} characters")
    if cursor is not None and not cursors_ok(cursor):
        problems.append("cursor: not one this page gave")
    who = await _signed_in(request, deps, session)
    if isinstance(who, Response):
        return who
    if problems:
        return _error(request, 400, "; ".join(problems), who)
    f = store.IncidentFilter(
        None if status == "all" else (status,),
        values["severity"],
        values["model"],
        values["deployment"],
        values["tenant"],
    )
    rows, next_cursor = await store.page(session, f, "last_seen_at", "desc", cursor, PAGE_SIZE)
    tenants = await store.tenants_of(session, [r.id for r in rows])
    await audit.record(
        session,
        who[0],
        "incidents.list",
        "incidents",
        {
            "filters": filters(
                status=None if status == "all" else Status(status),
                severity=values["severity"],
                model=values["model"],
                deployment=values["deployment"],
                tenant=values["tenant"],
            ),
            "ids": [r.id for r in rows],
        },
    )
    items = [store.to_out(r, tenants[r.id]) for r in rows]
    kept = {"status": status} | {k: v for k, v in values.items() if v is not None}
    more = f"/ui?{urlencode(kept | {'cursor': next_cursor})}" if next_cursor else None
    return _page(
        request,
        "incidents.html",
        {
            "caller": who[0],
            "csrf": who[1],
            "items": items,
            "status": status,
            "statuses": [s.value for s in Status],
            "severities": SEVERITIES,
            "values": {k: v or "" for k, v in values.items()},
            "more": more,
        },
    )


def cursors_ok(cursor: str) -> bool:
    return CURSOR.match(cursor) is not None


@router.get("/incidents/{incident_id}")
async def incident_page(request: Request, deps: Deps, session: SessionDep, incident_id: IncidentId) -> Response:
    """Reads what GET /v1/incidents/{id}, GET /v1/findings/{id} (each finding drawn) and the impact
    report read, and records the same audit entries (the impact one with ``format: html``)."""
    who = await _signed_in(request, deps, session)
    if isinstance(who, Response):
        return who
    caller = who[0]
    incident = await store.get(session, incident_id)
    if incident is None:
        return _error(request, 404, f"no incident {incident_id}", who)
    detail = await store.detail(session, incident)
    tenants = audit.about(detail.source_tenants + detail.recipient_tenants)
    await audit.record(session, caller, "incidents.read", f"incident:{incident_id}", tenants)
    found = await store.findings_of(session, incident_id)
    drawn = []
    for finding, link in found[:MAX_DRAWN]:
        about = audit.about([finding.recipient_tenant, finding.source_tenant])
        await audit.record(session, caller, "findings.read", f"finding:{finding.id}", about)
        drawn.append((store.summary(finding, link), finding, evidence.drawing(finding)))
    report = await impact.report(session, incident)
    await audit.record(
        session,
        caller,
        "incidents.impact",
        f"incident:{incident_id}",
        {"format": "html", "responses": report.response_count} | tenants,
    )
    current = Status(detail.status)
    done = request.query_params.get("done")
    return _page(
        request,
        "incident.html",
        {
            "caller": caller,
            "csrf": who[1],
            "incident": detail,
            "drawn": drawn,
            "more_findings": max(0, len(found) - MAX_DRAWN),
            "report": report,
            "can_act": caller.role in TRIAGE,
            "actions": [(s.value, label) for s, label in ACTIONS.items() if s in TRANSITIONS[current]],
            "message": DONE.get(done or ""),
            "fmt": _when,
        },
    )


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


@router.get("/incidents/{incident_id}/impact.csv")
async def impact_csv(request: Request, deps: Deps, session: SessionDep, incident_id: IncidentId) -> Response:
    """The same CSV, and the same audit entry, as GET /v1/incidents/{id}/impact?format=csv."""
    who = await _signed_in(request, deps, session)
    if isinstance(who, Response):
        return who
    incident = await store.get(session, incident_id)
    if incident is None:
        return _error(request, 404, f"no incident {incident_id}", who)
    report = await impact.report(session, incident)
    await audit.record(
        session,
        who[0],
        "incidents.impact",
        f"incident:{incident_id}",
        {"format": "csv", "responses": report.response_count}
        | audit.about(report.source_tenants + report.recipient_tenants),
    )
    return Response(
        impact.to_csv(report),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="incident-{incident_id}-impact.csv"'},
    )


# --- actions ----------------------------------------------------------------------------------


async def _act(request: Request, deps: AppDeps, session: AsyncSession, incident_id: int, field: str) -> Response:
    """One form: CSRF first, then the role, then exactly what PATCH /v1/incidents/{id} does."""
    form = await _form(request)
    who = await _signed_in(request, deps, session)
    await session.commit()  # the sign-in check stands on its own, whatever becomes of the change
    if isinstance(who, Response):
        return who
    caller, csrf = who
    if form is None or not sessions.csrf_ok(csrf, form.get("csrf")):
        return _error(request, 403, "The form is missing its CSRF token; reload the page and retry.", who)
    if caller.role not in TRIAGE:
        return _error(request, 403, f"this key has role '{caller.role.value}'; changes need triage or admin", who)
    value: str | None = form.get(field, "")
    if field == "assignee":
        value = _blank(value)
    try:
        body = IncidentPatch.model_validate({field: value})
    except ValidationError as exc:
        first = exc.errors()[0]
        return _error(request, 400, f"{field}: {first['msg']}", who)
    try:
        await change(deps, session, caller, incident_id, body)
    except NotFound as exc:
        await session.rollback()  # answered with a page, not raised: undo the refused change here
        return _error(request, 404, exc.detail, who)
    except ApiError as exc:
        await session.rollback()
        return _error(request, exc.status, exc.detail, who)
    return _see(f"/ui/incidents/{incident_id}?done={field}")


@router.post("/incidents/{incident_id}/status")
async def set_status(request: Request, deps: Deps, session: SessionDep, incident_id: IncidentId) -> Response:
    """Acknowledge, resolve, false positive (which allowlists what the findings matched), or reopen."""
    return await _act(request, deps, session, incident_id, "status")


@router.post("/incidents/{incident_id}/assignee")
async def set_assignee(request: Request, deps: Deps, session: SessionDep, incident_id: IncidentId) -> Response:
    return await _act(request, deps, session, incident_id, "assignee")


@router.post("/incidents/{incident_id}/notes")
async def set_notes(request: Request, deps: Deps, session: SessionDep, incident_id: IncidentId) -> Response:
    return await _act(request, deps, session, incident_id, "notes")


@router.get("/static/ui.css")
async def stylesheet() -> Response:
    return Response(_CSS, media_type="text/css; charset=utf-8", headers={"Cache-Control": "public, max-age=3600"})
