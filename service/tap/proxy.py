"""``bleedwatch tap``: a reverse proxy in front of an inference engine that fingerprints as it forwards.

A plain ASGI app (no framework routing, no body parsing on the way through): the request is
read whole (bounded), forwarded with its headers, and the answer is relayed chunk by chunk as
the engine writes it, the same bytes, streamed or not. Only after the last byte has been
handed to the client does the tap read the texts (``service/tap/apis.py``) and give them to
the SDK client (``submit_text``: hashing in a worker thread, batching, retries, the spool),
in a background task: bleedwatch being slow or away never delays an answer or fails it.

What is covered and what is not:

- ``POST`` to the four paths of ``apis.PATHS`` (chat completions, completions, the Responses
  API, Anthropic messages) is forwarded and fingerprinted. It needs the tenant header
  (``BLEEDWATCH_TAP_TENANT_HEADER``, default ``X-Tenant-Id``), which the gateway sets after
  authenticating the caller; without it the request is refused (400) and never reaches the
  engine, since an answer bleedwatch cannot attribute to a tenant cannot be checked.
- ``GET`` and ``HEAD`` (``/v1/models``, health checks) and the paths of
  ``BLEEDWATCH_TAP_PASS_PATHS`` are forwarded unchanged and unchecked.
- Anything else is refused (404): a generation endpoint the tap does not know (an engine's
  native ``/generate``) would otherwise pass unchecked without anyone noticing.

Errors the tap itself answers have a shape both OpenAI and Anthropic clients read:
``{"type": "error", "error": {"type", "code", "message", "param"}}``. No text of a prompt or an
answer is ever logged; the tenant header's value is not either.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import orjson
from starlette.types import Message, Receive, Scope, Send

from service.sdk import BleedwatchClient, Rejected, Scalar, Undelivered, name_problem
from service.tap.apis import PATHS, Api, Exchange, read_exchange
from service.tap.settings import TapSettings

log = logging.getLogger("bleedwatch.tap")

# Hop-by-hop headers (RFC 9110 7.6.1) are the connection's, not the message's; host and
# content-length are set anew by the client library for the upstream connection.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = _HOP | {b"host", b"content-length"}
_PASSED_METHODS = frozenset({"GET", "HEAD"})
# Answers up to this size are read on the event loop after they are relayed; larger ones in a thread.
_INLINE_READ_BYTES = 64 * 1024


@dataclass(slots=True)
class TapStats:
    """Counters for tests and logs; ``skipped`` by a short reason, never a value."""

    forwarded: int = 0
    submitted: int = 0
    refused: int = 0
    upstream_errors: int = 0
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)


def error_body(status: int, code: str, message: str) -> bytes:
    """The tap's own errors, in a shape OpenAI and Anthropic clients both read."""
    kind = "invalid_request_error" if status < 500 else "api_error"
    return orjson.dumps({"type": "error", "error": {"type": kind, "code": code, "message": message, "param": None}})


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    body = error_body(status, code, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _TooLarge(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _decoded(body: bytes, encoding: str) -> bytes | None:
    """The answer's bytes as its JSON or events were written: relayed encoded, read decoded."""
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)
    return None  # br, zstd, ...: relayed as they are, not read


class Tap:
    """The ASGI app. ``start()``/``aclose()`` run it (the ASGI lifespan calls them under uvicorn)."""

    def __init__(
        self,
        settings: TapSettings,
        *,
        upstream_transport: httpx.AsyncBaseTransport | None = None,
        bleedwatch_transport: httpx.AsyncBaseTransport | None = None,
        bleedwatch_max_attempts: int = 8,
    ) -> None:
        self.settings = settings
        self.stats = TapStats()
        self._key = settings.key
        self._tenant_header = settings.tenant_header.encode()
        self._upstream_transport = upstream_transport
        self._bleedwatch_transport = bleedwatch_transport
        self._max_attempts = bleedwatch_max_attempts
        self._http: httpx.AsyncClient | None = None
        self._bleedwatch: BleedwatchClient | None = None
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def bleedwatch(self) -> BleedwatchClient:
        if self._bleedwatch is None:
            raise RuntimeError("the tap is not started")
        return self._bleedwatch

    async def start(self) -> None:
        s = self.settings
        self._http = httpx.AsyncClient(
            base_url=s.upstream_url.rstrip("/"),
            timeout=httpx.Timeout(s.upstream_read_seconds, connect=s.upstream_connect_seconds),
            limits=httpx.Limits(
                max_connections=s.upstream_connections, max_keepalive_connections=s.upstream_connections
            ),
            transport=self._upstream_transport,
        )
        self._bleedwatch = BleedwatchClient(
            s.bleedwatch_url,
            s.bleedwatch_api_key.get_secret_value(),
            flush_seconds=s.flush_seconds,
            max_attempts=self._max_attempts,
            transport=self._bleedwatch_transport,
            spool=s.spool,
        )
        await self._bleedwatch.__aenter__()

    async def settle(self) -> None:
        """Until every relayed exchange has been read and handed to the SDK client."""
        while self._pending:
            await asyncio.wait(set(self._pending))
        await self.bleedwatch.flush_hashing()

    async def flush(self) -> None:
        """Fingerprint what has been relayed and deliver it now (tests and shutdown; otherwise it flushes itself)."""
        await self.settle()
        await self.bleedwatch.flush()

    async def aclose(self) -> None:
        try:
            while self._pending:
                await asyncio.wait(set(self._pending))
            if self._bleedwatch is not None:
                try:
                    await self._bleedwatch.aclose()  # the last flush; the spool keeps what it cannot deliver
                except (Rejected, Undelivered) as exc:
                    log.error("exchanges not delivered to bleedwatch at shutdown: %s", exc)
        finally:
            if self._http is not None:
                await self._http.aclose()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Tap]:
        await self.start()
        try:
            yield self
        finally:
            await self.aclose()

    # --- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http_request(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        api = PATHS.get(path) if method == "POST" else None
        if api is None and method not in _PASSED_METHODS and path not in self.settings.pass_paths:
            self.stats.refused += 1
            covered = ", ".join(f"POST {p}" for p in PATHS)
            await _answer(
                send,
                404,
                "not_covered",
                f"{method} {path[:200]} is not forwarded by the bleedwatch tap: it covers {covered}, GET and HEAD, "
                "and the paths of BLEEDWATCH_TAP_PASS_PATHS",
            )
            return
        tenant: str | None = None
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        for name, value in scope["headers"]:
            if name == self._tenant_header:
                tenant = value.decode("latin-1").strip()
            elif name == b"content-length" and value.isdigit():
                length = int(value)
            if name not in _NOT_FORWARDED:
                headers.append((name, value))
        if api is not None:
            if not tenant:
                self.stats.refused += 1
                await _answer(
                    send,
                    400,
                    "missing_tenant",
                    f"the {self.settings.tenant_header} header is missing: the gateway sets it to the caller's tenant "
                    "after authentication (BLEEDWATCH_TAP_TENANT_HEADER names it)",
                )
                return
            if name_problem({"tenant": tenant, "request_id": "-", "model": "-"}) is not None:
                self.stats.refused += 1
                await _answer(
                    send,
                    400,
                    "invalid_tenant",
                    f"the {self.settings.tenant_header} header is not a tenant name: 1 to 128 characters, "
                    "no control or format characters",
                )
                return
        limit = self.settings.max_body_bytes
        try:
            if length is not None and length > limit:
                raise _TooLarge
            body = await _read_body(receive, limit)
        except _TooLarge:
            self.stats.refused += 1
            await _answer(
                send, 413, "body_too_large", f"the request body is over {limit} bytes (BLEEDWATCH_TAP_MAX_BODY_BYTES)"
            )
            return
        except ConnectionResetError:
            return
        await self._forward(scope, receive, send, api, tenant, headers, body)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        api: Api | None,
        tenant: str | None,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        http = self._http
        assert http is not None, "the tap is not started"
        self.stats.forwarded += 1
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        request = http.build_request(scope["method"], target.decode("latin-1"), headers=headers, content=body)
        try:
            resp = await http.send(request, stream=True)
        except httpx.HTTPError as exc:
            self.stats.upstream_errors += 1
            log.warning("upstream request failed: %s", type(exc).__name__)
            await _answer(send, 502, "upstream_unreachable", "the inference engine behind the tap did not answer")
            return
        keep = api is not None and 200 <= resp.status_code < 300
        kept: list[bytes] = []
        kept_bytes = 0
        max_kept = self.settings.max_response_bytes
        # The client leaving shows only in receive(): watch it, so an abandoned stream stops the upstream too.
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status_code,
                    "headers": [(k.lower(), v) for k, v in resp.headers.raw if k.lower() not in _HOP],
                }
            )
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if keep:
                    kept_bytes += len(chunk)
                    if kept_bytes <= max_kept:
                        kept.append(chunk)
                if gone.done():
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as exc:  # the upstream broke off mid-answer: what was relayed is still read
            self.stats.upstream_errors += 1
            log.warning("upstream answer broke off: %s", type(exc).__name__)
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            await resp.aclose()
        if not keep or api is None or tenant is None:
            return
        if kept_bytes > max_kept:
            self.stats.skipped["too_large"] += 1
            return
        served: dict[str, Scalar] = {"deployment": self.settings.deployment}
        if self.settings.deployment_header:
            served["deployment"] = resp.headers.get(self.settings.deployment_header) or served["deployment"]
        if self.settings.node_header:
            served["node"] = resp.headers.get(self.settings.node_header)
        streamed = resp.headers.get("content-type", "").startswith("text/event-stream")
        task = asyncio.get_running_loop().create_task(
            self._record(
                api,
                tenant,
                body,
                kept,
                streamed,
                resp.headers.get("content-encoding", "").strip().lower(),
                resp.headers.get("x-request-id"),
                served,
            )
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _record(
        self,
        api: Api,
        tenant: str,
        request: bytes,
        chunks: list[bytes],
        streamed: bool,
        encoding: str,
        header_id: str | None,
        served: dict[str, Scalar],
    ) -> None:
        """Off the request path: read the texts of one relayed exchange and hand them to the SDK."""
        try:
            size = len(request) + sum(len(c) for c in chunks)
            if size <= _INLINE_READ_BYTES:
                exchange = _read(api, request, chunks, streamed, encoding)
            else:
                exchange = await asyncio.to_thread(_read, api, request, chunks, streamed, encoding)
            if exchange is None:
                self.stats.skipped["nothing_to_read"] += 1
                return
            meta = dict(served)
            meta["prompt_tokens"] = exchange.prompt_tokens
            await self.bleedwatch.submit_text(
                exchange.prompt,
                exchange.response,
                key=self._key,
                tenant=tenant,
                request_id=exchange.request_id or header_id or f"tap-{uuid.uuid4().hex}",
                model=exchange.model or "unknown",
                ts=time.time(),
                meta={k: v for k, v in meta.items() if v is not None},
            )
            self.stats.submitted += 1
        except Exception as exc:  # the answer is delivered; a failure here must not reach anyone but the log
            self.stats.skipped["error"] += 1
            log.error("could not fingerprint a relayed exchange: %s", type(exc).__name__)


def _read(api: Api, request: bytes, chunks: list[bytes], streamed: bool, encoding: str) -> Exchange | None:
    raw = _decoded(b"".join(chunks), encoding)
    return None if raw is None else read_exchange(api, request, raw, streamed)


async def _disconnected(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


def create_tap(settings: TapSettings | None = None) -> Tap:
    """The app for uvicorn (``factory=True``): settings from the environment."""
    return Tap(settings or TapSettings())
