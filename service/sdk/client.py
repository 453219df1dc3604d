"""Async client for gateways: batches exchanges and posts them, retrying what may be retried.

429 and 503 are retried after the server's Retry-After; other 5xx and network errors after an
exponential backoff with jitter; any other 4xx is a bug in the caller and raised at once as
``Rejected`` with the server's message.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from types import TracebackType
from typing import Any

import httpx
import orjson

from service.fingerprint.scheme import DEFAULT_PARAMS, Params
from service.sdk.exchange import Scalar, fingerprint_exchange

log = logging.getLogger("bleedwatch.sdk")

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class Rejected(Exception):
    """The service refused the batch for a reason retrying will not fix."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {body.get('error', '')}: {body.get('detail', '')}")
        self.status = status
        self.body = body


class Undelivered(Exception):
    """The batch was not accepted within the retry budget; it is attached for the caller to keep."""

    def __init__(self, batch: list[dict[str, Any]], cause: str) -> None:
        super().__init__(f"{len(batch)} exchanges not delivered: {cause}")
        self.batch = batch


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError):
        return None


class BleedwatchClient:
    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        batch_size: int = 200,
        flush_seconds: float = 1.0,
        max_attempts: int = 8,
        max_backoff_seconds: float = 30.0,
        timeout_seconds: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
            timeout=timeout_seconds,
            transport=transport,
        )
        self._batch_size = batch_size
        self._flush_seconds = flush_seconds
        self._max_attempts = max_attempts
        self._max_backoff = max_backoff_seconds
        self._pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self.accepted = 0
        self.duplicates = 0
        self.findings = 0
        self.rejected = 0

    async def __aenter__(self) -> BleedwatchClient:
        self._flusher = asyncio.create_task(self._flush_periodically())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        try:
            await self.flush()
        finally:
            await self._http.aclose()

    async def submit(self, exchange: dict[str, Any]) -> None:
        """Queue one exchange (from ``fingerprint_exchange``); sends when a batch is full."""
        self._pending.append(exchange)
        if len(self._pending) >= self._batch_size:
            await self.flush()

    async def submit_text(
        self,
        prompt: str,
        response: str,
        *,
        key: bytes,
        tenant: str,
        request_id: str,
        model: str,
        ts: float | None = None,
        meta: dict[str, Scalar] | None = None,
        params: Params = DEFAULT_PARAMS,
    ) -> None:
        """Fingerprint in a worker thread, so the gateway's event loop never waits on hashing."""
        exchange = await asyncio.to_thread(
            fingerprint_exchange,
            prompt,
            response,
            key=key,
            tenant=tenant,
            request_id=request_id,
            model=model,
            ts=ts,
            meta=meta,
            params=params,
        )
        await self.submit(exchange)

    async def flush(self) -> None:
        async with self._lock:
            while self._pending:
                batch, self._pending = self._pending[: self._batch_size], self._pending[self._batch_size :]
                try:
                    result = await self.send(batch)
                except Rejected:
                    self.rejected += len(batch)  # resending the same bytes cannot succeed
                    raise
                except BaseException:
                    self._pending = batch + self._pending  # keep it for the next flush
                    raise
                self.accepted += result["accepted"]
                self.duplicates += result["duplicates"]
                self.findings += result["findings"]

    async def send(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        """Post one batch until it is accepted, refused for good, or the attempts run out."""
        body = orjson.dumps({"exchanges": batch})
        cause = "no attempt made"
        for attempt in range(self._max_attempts):
            try:
                resp = await self._http.post("/v1/exchanges", content=body)
            except httpx.TransportError as exc:
                cause = f"network error: {exc!r}"
                wait = None
            else:
                if resp.status_code == 202:
                    result: dict[str, Any] = resp.json()
                    return result
                if resp.status_code not in RETRY_STATUSES:
                    raise Rejected(resp.status_code, _json(resp))
                cause = f"HTTP {resp.status_code}"
                wait = retry_after(resp.headers.get("retry-after"), time.time())
            if attempt + 1 == self._max_attempts:
                break
            backoff = min(self._max_backoff, 0.2 * 2**attempt) * (0.5 + random.random() / 2)
            delay = wait if wait is not None else backoff
            log.warning("bleedwatch ingest failed (%s); retry %d in %.1fs", cause, attempt + 1, delay)
            await asyncio.sleep(delay)
        raise Undelivered(batch, cause)

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            try:
                await self.flush()
            except (Undelivered, Rejected) as exc:
                log.error("bleedwatch: %s", exc)


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {"error": "http_error", "detail": resp.text[:200]}
    return data if isinstance(data, dict) else {"error": "http_error", "detail": str(data)[:200]}
