"""``bleedwatch tap``: a reverse proxy in front of an inference engine that fingerprints as it forwards.

A plain ASGI app (no framework routing, no body parsing on the way through): the request is
read whole (bounded), forwarded with its headers, and the answer is relayed chunk by chunk as
the engine writes it, the same bytes, streamed or not. Only after the last byte has been
handed to the client does the tap read the texts (``service/tap/apis.py``) and give them to
worker processes (or one thread) to fingerprint, then to the SDK client (batching, retries,
the spool), in a background task: bleedwatch being slow or away never delays an answer or fails it.

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
import concurrent.futures
import contextlib
import logging
import multiprocessing
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.types import Message, Receive, Scope, Send

from bleedwatch.client import BleedwatchClient, Rejected, Undelivered
from bleedwatch.exchange import Scalar, fingerprint_exchange, name_problem
from service.tap.apis import PATHS, Api, Exchange, read_exchange
from service.tap.metrics import TapMetrics
from service.tap.settings import TapSettings
from service.tap.upstream import Http11Upstream, HttpxUpstream, Upstream, UpstreamError

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
        self._upstream: Upstream | None = None
        self._bleedwatch: BleedwatchClient | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._fingerprinters: concurrent.futures.Executor | None = None
        self.metrics = TapMetrics(lambda: self._bleedwatch, lambda: len(self._pending))
        self.metrics_port: int | None = None  # the port bound, once started with BLEEDWATCH_TAP_METRICS_PORT

    @property
    def bleedwatch(self) -> BleedwatchClient:
        if self._bleedwatch is None:
            raise RuntimeError("the tap is not started")
        return self._bleedwatch

    async def start(self) -> None:
        s = self.settings
        if self._upstream_transport is not None:
            self._upstream = HttpxUpstream(s.upstream_url, self._upstream_transport)
        else:
            self._upstream = Http11Upstream(
                s.upstream_url,
                connect_seconds=s.upstream_connect_seconds,
                read_seconds=s.upstream_read_seconds,
                max_idle=s.upstream_connections,
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
        if s.fingerprint_workers:  # spawned, not forked: the server's threads and sockets must not be copied
            self._fingerprinters = concurrent.futures.ProcessPoolExecutor(
                s.fingerprint_workers, mp_context=multiprocessing.get_context("spawn")
            )
        else:  # one thread: hashing shares the relaying's GIL, so no more than one at a time
            self._fingerprinters = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bleedwatch-tap-fp")
        if s.metrics_port is not None:
            self.metrics_port = self.metrics.serve(s.host, s.metrics_port)

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
            self.metrics.close()
            if self._fingerprinters is not None:  # waited for: a worker left behind would outlive the tap
                await asyncio.to_thread(self._fingerprinters.shutdown, wait=True, cancel_futures=True)
            if self._upstream is not None:
                await self._upstream.aclose()

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

    async def _refuse(self, send: Send, route: str, status: int, code: str, message: str) -> None:
        self.stats.refused += 1
        self.metrics.refused.labels(code).inc()
        self.metrics.requests.labels(route, "refused").inc()
        await _answer(send, status, code, message)

    def _skip(self, reason: str) -> None:
        self.stats.skipped[reason] += 1
        self.metrics.skipped.labels(reason).inc()

    async def _http_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        api = PATHS.get(path) if method == "POST" else None
        if api is None and method not in _PASSED_METHODS and path not in self.settings.pass_paths:
            covered = ", ".join(f"POST {p}" for p in PATHS)
            await self._refuse(
                send,
                "other",
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
        route = api.value if api is not None else "passed"
        if api is not None:
            if not tenant:
                await self._refuse(
                    send,
                    route,
                    400,
                    "missing_tenant",
                    f"the {self.settings.tenant_header} header is missing: the gateway sets it to the caller's tenant "
                    "after authentication (BLEEDWATCH_TAP_TENANT_HEADER names it)",
                )
                return
            if name_problem({"tenant": tenant, "request_id": "-", "model": "-"}) is not None:
                await self._refuse(
                    send,
                    route,
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
            await self._refuse(
                send,
                route,
                413,
                "body_too_large",
                f"the request body is over {limit} bytes (BLEEDWATCH_TAP_MAX_BODY_BYTES)",
            )
            return
        except ConnectionResetError:
            self.metrics.requests.labels(route, "client_gone").inc()
            return
        outcome = await self._forward(scope, receive, send, api, tenant, headers, body)
        self.metrics.requests.labels(route, outcome).inc()

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        api: Api | None,
        tenant: str | None,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> str:
        """Relay one request and its answer; the outcome, for the metrics."""
        upstream = self._upstream
        assert upstream is not None, "the tap is not started"
        self.stats.forwarded += 1
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        try:
            resp = await upstream.request(scope["method"], target, headers, body)
        except UpstreamError as exc:
            self.stats.upstream_errors += 1
            self.metrics.upstream_errors.labels("connect").inc()
            log.warning("upstream request failed: %s", exc)
            await _answer(send, 502, "upstream_unreachable", "the inference engine behind the tap did not answer")
            return "upstream_error"
        keep = api is not None and 200 <= resp.status < 300
        kept: list[bytes] = []
        kept_bytes = 0
        max_kept = self.settings.max_response_bytes
        outcome = "relayed"
        # The client leaving shows only in receive(): watch it, and cancel the relaying the moment it does, as it
        # may be waiting on a slow engine; closing the upstream connection unread is what aborts the engine's work.
        relaying = asyncio.current_task()
        assert relaying is not None
        gone = asyncio.ensure_future(_disconnected(receive))
        left = False

        def client_left(future: asyncio.Future[None]) -> None:
            nonlocal left
            if not left and relaying_now and not future.cancelled() and future.exception() is None:
                left = True
                relaying.cancel()

        relaying_now, all_relayed = True, False
        gone.add_done_callback(client_left)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": [(k, v) for k, v in resp.headers if k not in _HOP],
                }
            )
            async for chunk in resp.body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if keep:
                    kept_bytes += len(chunk)
                    if kept_bytes <= max_kept:
                        kept.append(chunk)
            all_relayed = True  # the server reports the end of a response as a disconnect too
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not left:  # the server shutting down, not the client leaving
                raise
            relaying.uncancel()
            outcome = "relayed" if all_relayed else "client_gone"
        except UpstreamError as exc:  # the upstream broke off mid-answer: what was relayed is still read
            self.stats.upstream_errors += 1
            self.metrics.upstream_errors.labels("stream").inc()
            log.warning("upstream answer broke off: %s", exc)
            outcome = "upstream_error"
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            relaying_now = False  # set before the first await here: a late disconnect must not cancel the closing
            gone.cancel()
            await resp.body.aclose()
            await resp.close()
        if not keep or api is None or tenant is None:
            return outcome
        if kept_bytes > max_kept:
            self._skip("too_large")
            return outcome
        served: dict[str, Scalar] = {"deployment": self.settings.deployment}
        if self.settings.deployment_header:
            served["deployment"] = resp.header(self.settings.deployment_header.encode()) or served["deployment"]
        if self.settings.node_header:
            served["node"] = resp.header(self.settings.node_header.encode())
        if len(self._pending) >= self.settings.max_backlog:  # fingerprinting is behind: bounded, and counted
            self._skip("backlog_full")
            log.error("tap: an exchange not fingerprinted (backlog_full: see BLEEDWATCH_TAP_FINGERPRINT_WORKERS)")
            return outcome
        relayed = _Relayed(
            api,
            tenant,
            body,
            b"".join(kept),
            (resp.header(b"content-type") or "").startswith("text/event-stream"),
            (resp.header(b"content-encoding") or "").strip().lower(),
            resp.header(b"x-request-id"),
            {k: v for k, v in served.items() if v is not None},
            # The answer as far as it went: its complete events are read and shipped, marked partial.
            outcome != "relayed",
        )
        task = asyncio.get_running_loop().create_task(self._record(relayed))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return outcome

    async def _record(self, relayed: _Relayed) -> None:
        """Off the request path: fingerprint one relayed exchange and queue it in the SDK client."""
        try:
            # Reading and hashing off the event loop: in worker processes (no GIL shared with the relaying)
            # or, with BLEEDWATCH_TAP_FINGERPRINT_WORKERS=0, in one thread of this process.
            assert self._fingerprinters is not None, "the tap is not started"
            loop = asyncio.get_running_loop()
            exchange, seconds = await loop.run_in_executor(self._fingerprinters, _fingerprint, relayed, self._key)
            self.metrics.fingerprint_seconds.observe(seconds)
            if exchange is None:
                self._skip("nothing_to_read")
                return
            await self.bleedwatch.submit(exchange)
            self.stats.submitted += 1
            self.metrics.fingerprinted.labels("partial" if relayed.partial else "complete").inc()
        except Exception as exc:  # the answer is delivered; a failure here must not reach anyone but the log
            self._skip("error")
            log.error("could not fingerprint a relayed exchange: %s", type(exc).__name__)


@dataclass(frozen=True, slots=True)
class _Relayed:
    """One relayed exchange as bytes, and where it was served: what the fingerprinting needs."""

    api: Api
    tenant: str
    request: bytes
    response: bytes
    streamed: bool
    encoding: str
    header_id: str | None
    served: dict[str, Scalar]
    partial: bool = False


def _read(relayed: _Relayed) -> Exchange | None:
    raw = _decoded(relayed.response, relayed.encoding)
    return None if raw is None else read_exchange(relayed.api, relayed.request, raw, relayed.streamed)


def _names(relayed: _Relayed, read: Exchange) -> dict[str, Any]:
    """Tenant, request id, model and meta, as ``submit_text`` and ``fingerprint_exchange`` take them."""
    meta = dict(relayed.served)
    if read.prompt_tokens is not None:
        meta["prompt_tokens"] = read.prompt_tokens
    return {
        "tenant": relayed.tenant,
        "request_id": read.request_id or relayed.header_id or f"tap-{uuid.uuid4().hex}",
        "model": read.model or "unknown",
        "meta": meta,
    }


def _fingerprint(relayed: _Relayed, key: bytes) -> tuple[dict[str, Any] | None, float]:
    """In a worker: the exchange's wire form (fingerprints only), or None when there is no text; and the
    seconds it took, timed here so that waiting for a free worker is not counted as fingerprinting."""
    started = time.perf_counter()
    read = _read(relayed)
    if read is None:
        return None, time.perf_counter() - started
    exchange = fingerprint_exchange(read.prompt, read.response, key=key, ts=time.time(), **_names(relayed, read))
    return exchange, time.perf_counter() - started


async def _disconnected(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


def create_tap(settings: TapSettings | None = None) -> Tap:
    """The app for uvicorn (``factory=True``): settings from the environment."""
    return Tap(settings or TapSettings())
