"""415 for any API request body that is not ``application/json``, the same on every endpoint.

Without this, FastAPI would read a form or plain-text body as bytes and answer 422 about the
body's shape, which sends a gateway operator looking in the wrong place. A POST, PUT or PATCH
under ``/v1/`` that carries a body (or says it does) must say ``Content-Type: application/json``.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
OWN_CHECK = frozenset({"/v1/exchanges"})  # the ingest route checks (and counts) this itself
DETAIL = "send the request body as Content-Type: application/json, in UTF-8"


def is_json(content_type: str) -> bool:
    """``application/json``, with no charset or UTF-8's: JSON between systems is UTF-8 (RFC 8259), and a
    body said to be in another charset would be read as UTF-8 all the same, into other names."""
    media, *params = (part.strip().lower() for part in content_type.split(";"))
    charsets = [p.partition("=")[2].strip().strip('"') for p in params if p.partition("=")[0].strip() == "charset"]
    return media == "application/json" and all(c in ("utf-8", "utf8") for c in charsets)


class JsonOnly:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in WITH_BODY and scope["path"].startswith("/v1/"):
            if scope["path"] in OWN_CHECK:
                await self.app(scope, receive, send)
                return
            headers = dict(scope["headers"])
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
            if not is_json(content_type) and (has_body or content_type):
                await self._refuse(send)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send) -> None:
        body = orjson.dumps({"error": "unsupported_media_type", "detail": DETAIL})
        await send(
            {
                "type": "http.response.start",
                "status": 415,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
