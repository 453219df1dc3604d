"""Structured logs: one JSON object a line on stdout, with the HTTP request id of the call.

What may appear in a log line: event names, route templates (never raw paths or query strings,
which carry tenant names), status codes, durations, counts, finding ids, severities and the
HTTP request id. Never a tenant, an exchange's request id, a fingerprint or any text; exception
messages are left out too (a database error's message can quote SQL parameters), only the
exception type and the stack frames are kept.

``bleedwatch serve`` applies ``log_config()`` to uvicorn and turns off uvicorn's own access log,
which would print raw paths; ``RequestContext`` writes the access lines instead.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import re
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import metrics, tracing

REQUEST_ID_HEADER = "x-request-id"
# An incoming X-Request-Id is kept only if it looks like an id; anything else gets a fresh one.
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{8,64}$")
# Scrapes and probes: logged at DEBUG only, so the access log is not a scrape log.
QUIET_ROUTES = frozenset({"/metrics", "/healthz", "/readyz"})

_request_id: ContextVar[str | None] = ContextVar("bleedwatch_http_request_id", default=None)
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# uvicorn's extra: the event again, with terminal colour codes, for its own coloured formatter.
_DROPPED_EXTRAS = frozenset({"color_message"})

access_log = logging.getLogger("bleedwatch.access")


def current_request_id() -> str | None:
    return _request_id.get()


@contextlib.contextmanager
def request_id_bound(request_id: str | None) -> Iterator[None]:
    """Work done later for a request (a queued ingest batch) logs and records that request's id."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, event, http_request_id, trace_id and span_id (in a
    traced span), then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        request_id = _request_id.get()
        if request_id is not None:
            out["http_request_id"] = request_id
        trace = tracing.current_ids()
        if trace is not None:
            out["trace_id"], out["span_id"] = trace
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in _DROPPED_EXTRAS and not key.startswith("_"):
                out[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, _, tb = record.exc_info
            out["exc_type"] = f"{exc_type.__module__}.{exc_type.__qualname__}"
            out["stack"] = "".join(traceback.format_tb(tb)).rstrip()
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """For a terminal: the same fields, space-separated; exception messages left out as in JSON."""

    def format(self, record: logging.LogRecord) -> str:
        line = JsonFormatter().format(record)
        fields: dict[str, Any] = orjson.loads(line)
        head = f"{fields.pop('ts')} {fields.pop('level'):<7} {fields.pop('logger')}: {fields.pop('event')}"
        stack = fields.pop("stack", None)
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{head} {tail}".rstrip() + (f"\n{stack}" if stack else "")


def log_config(level: str = "info", fmt: str = "json") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict for bleedwatch and uvicorn (uvicorn's ``log_config``)."""
    formatter = "service.logging.JsonFormatter" if fmt == "json" else "service.logging.TextFormatter"
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"bleedwatch": {"()": formatter}},
        "handlers": {
            "stdout": {"class": "logging.StreamHandler", "formatter": "bleedwatch", "stream": "ext://sys.stdout"}
        },
        # Third-party loggers stay at WARNING whatever the level: at DEBUG some print SQL parameters.
        "root": {"handlers": ["stdout"], "level": "WARNING"},
        "loggers": {
            "service": {"level": upper},
            "bleedwatch": {"level": upper},
            "uvicorn": {"level": upper},
            "uvicorn.error": {"level": upper},
            # Raw paths with query strings: replaced by bleedwatch.access.
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }


def configure(level: str = "info", fmt: str = "json") -> None:
    """Apply ``log_config`` to this process (for entry points that do not go through uvicorn)."""
    logging.config.dictConfig(log_config(level, fmt))


def _template_matcher(app: Any) -> Callable[[str], str | None]:
    """Route templates of the app's API (from its OpenAPI paths), for answers given before routing."""
    paths = list(app.openapi().get("paths", {})) if hasattr(app, "openapi") else []
    compiled = [(re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(p)) + "$"), p) for p in paths]

    def match(path: str) -> str | None:
        return next((template for regex, template in compiled if regex.match(path)), None)

    return match


class RequestContext:
    """ASGI middleware: an HTTP request id per call (X-Request-Id in and out), an access log line
    and ``bleedwatch_http_requests_total``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._templates: Callable[[str], str | None] | None = None

    def _route(self, scope: Scope) -> str:
        """The route template; for answers given before routing (BodyLimit's 413), the one that fits."""
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        if self._templates is None:
            self._templates = _template_matcher(scope.get("app"))
        return self._templates(scope["path"]) or "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = incoming if _VALID_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        token = _request_id.set(request_id)
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = self._route(scope)
            method = scope["method"] if scope["method"] in metrics.HTTP_METHODS else metrics.OTHER
            duration = time.perf_counter() - started
            metrics.http_response(method, route, status)
            level = logging.DEBUG if route in QUIET_ROUTES else logging.WARNING if status >= 500 else logging.INFO
            access_log.log(
                level,
                "http_request",
                extra={"method": method, "route": route, "status": status, "duration_seconds": duration},
            )
            _request_id.reset(token)
