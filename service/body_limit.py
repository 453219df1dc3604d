"""Refuse request bodies over their route's limit with 413, before any route reads them.

Routes that carry fingerprints or canary text (``LARGE``) take ``BLEEDWATCH_MAX_BODY_BYTES``;
every other route ``BLEEDWATCH_MAX_OTHER_BODY_BYTES`` (1 MB), which is far more than any of
their bodies needs, so a holder of a read or triage key cannot make a replica buffer 32 MB.
A declared Content-Length over the limit is refused at once; a chunked body is counted as it
arrives and refused as soon as it passes the limit, so no route ever buffers more than that.
"""

from __future__ import annotations

import re

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# (method, path) of the routes whose bodies are fingerprints or text: ingest, allowlist and canary imports.
LARGE = (
    ("POST", re.compile(r"^/v1/exchanges$")),
    ("POST", re.compile(r"^/v1/allowlist$")),
    ("POST", re.compile(r"^/v1/allowlist/[0-9]+/fingerprints$")),
    ("POST", re.compile(r"^/v1/canaries$")),
)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, max_other_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_other_bytes = min(max_other_bytes, max_bytes)

    def limit(self, method: str, path: str) -> tuple[int, str]:
        """This route's limit in bytes, and the setting that sets it."""
        if any(method == m and pattern.match(path) for m, pattern in LARGE):
            return self.max_bytes, "BLEEDWATCH_MAX_BODY_BYTES"
        return self.max_other_bytes, "BLEEDWATCH_MAX_OTHER_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self.limit(scope["method"], scope["path"])
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._refuse(send, max_bytes, setting)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                await self._refuse(send, max_bytes, setting)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, max_bytes: int, setting: str) -> None:
        body = orjson.dumps(
            {
                "error": "payload_too_large",
                "detail": f"request body over {max_bytes} bytes ({setting}); split the batch",
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
