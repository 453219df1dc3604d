"""Async client for gateways: never in the gateway's way, and nothing lost that can be kept.

- ``submit_text`` hands the texts to a worker thread (very long ones to a worker process, whose
  hashing cannot hold the event loop's GIL) and returns at once; ``submit`` queues an already
  fingerprinted exchange. Neither waits for the network.
- A background task sends batches of ``batch_size`` (or whatever is queued every
  ``flush_seconds``). 429 and 503 are retried after the server's Retry-After (at most
  ``max_backoff_seconds``), other 5xx and network errors after an exponential backoff with jitter;
  any other 4xx is a bug in the caller: the batch is refused for good (``Rejected``).
- The service answers per exchange: an exchange it rejects (``results``) is dropped alone, with
  its reason, and the rest of its batch is taken; one it defers (``retry_after``: too many new
  tenants this minute) is sent again, alone, after that wait. The client checks names and sizes before
  sending, against the service's own limits (sdk/bleedwatch/limits.py): an exchange the service
  would reject never travels, and batches are cut so that no body passes ``max_body_bytes``.
- A batch not delivered within ``max_attempts`` goes to the spool, if one is configured
  (``sdk/bleedwatch/spool.py``: a bounded local file), and is replayed when the service answers
  again. Once a round of attempts has run out with no answer (or a gateway's 502 or 504; not the
  service's own 429 or 503, which ask for time), ``flush()`` and ``aclose()`` try what
  they hold once, not a round of their own, until the service answers again: a dead service costs a
  replay or a closing gateway one round, not one per caller (the background sender keeps its rounds,
  whose backoff is what waits an outage out). Exchanges are dropped only when they cannot be kept:
  the spool is full, or there is no spool, or the queue passed ``max_pending`` with nowhere to put
  it, or the service refused them.
  Every drop is counted (``dropped``, and by reason in ``dropped_by_reason``: ``rejected:<error>``,
  ``invalid:<field>``, ``too_large:<what>``, ``queue_full``, ``spool_corrupt``: one per unreadable
  spooled record, ...), logged, and reported to the service (``POST /v1/sdk/drops``, idempotent),
  which exports ``bleedwatch_sdk_dropped_exchanges_total``.

The service answers once a batch is durably queued (``Prefer: respond-async``) and indexes and
matches it right after, so a gateway's batch never waits for matching; ``findings`` counts only
what answers of processed batches reported (``wait_for_processing=True`` waits for each, for
replays and tests that want the figure).

``flush()`` delivers everything queued now and, without a spool, raises ``Undelivered`` or
``Rejected`` like ``send`` does, so a caller that needs delivery (a replay) can know.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import email.utils
import functools
import logging
import os
import random
import re
import time
import uuid
from types import TracebackType
from typing import Any

import httpx
import orjson

from bleedwatch.exchange import Scalar, exchange_of, fingerprint_texts, name_problem, size_problem, wire_size
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params
from bleedwatch.hashing import FingerprintProcess
from bleedwatch.limits import DEFAULT_MAX_BATCH_EXCHANGES, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_FINGERPRINTS_PER_TEXT
from bleedwatch.plural import counted
from bleedwatch.spool import Spool

log = logging.getLogger("bleedwatch.sdk")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# A proxy's answer for a service behind it that does not answer: as good as no answer (``_post``).
GONE_STATUSES = frozenset({502, 504})
# Texts longer than this (characters) are fingerprinted in a worker process (sdk/bleedwatch/hashing.py):
# tokenising a megabyte-sized prompt is one long C call that would hold the GIL, and so the gateway's loop.
LONG_TEXT_CHARS = 200_000
_ERROR_CODE = re.compile(r"^[a-z_]{1,32}$")  # a service's error codes; anything else is counted as "other"
_BODY_FRAME = len('{"exchanges":[]}')


class Rejected(Exception):
    """The service refused the batch for a reason retrying will not fix."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {body.get('error', '')}: {body.get('detail', '')}")
        self.status = status
        self.body = body
        self.reason = _rejected(body.get("error"))


class Undelivered(Exception):
    """The batch was not accepted within the retry budget; it is attached for the caller to keep."""

    def __init__(self, batch: list[dict[str, Any]], cause: str) -> None:
        super().__init__(f"{counted(len(batch), 'exchange')} not delivered: {cause}")
        self.batch = batch


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    if value.strip().isascii() and value.strip().isdigit():  # "²" is a digit to str.isdigit, not to float
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
        spool: Spool | str | os.PathLike[str] | None = None,
        max_pending: int = 20_000,
        wait_for_processing: bool = False,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_fingerprints_per_text: int = DEFAULT_MAX_FINGERPRINTS_PER_TEXT,
        max_batch_exchanges: int = DEFAULT_MAX_BATCH_EXCHANGES,
        max_hashing_chars: int = 64_000_000,
    ) -> None:
        """``max_*`` are the service's BLEEDWATCH_MAX_* settings: pass them where it is configured otherwise;
        ``max_hashing_chars`` bounds the raw text waiting to be fingerprinted (a burst of long prompts),
        past which ``submit_text`` drops and counts (``fingerprinting_queue_full``)."""
        if not 0 < batch_size <= max_batch_exchanges:
            raise ValueError(f"batch_size must be between 1 and {max_batch_exchanges} (BLEEDWATCH_MAX_BATCH_EXCHANGES)")
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        if not wait_for_processing:
            headers["Prefer"] = "respond-async"
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers=headers,
            timeout=timeout_seconds,
            transport=transport,
        )
        self._batch_size = batch_size
        self._max_body_bytes = max_body_bytes
        self._max_fingerprints = max_fingerprints_per_text
        self._flush_seconds = flush_seconds
        self._max_attempts = max_attempts
        self._max_backoff = max_backoff_seconds
        self._max_pending = max_pending
        self._spool = spool if isinstance(spool, Spool) or spool is None else Spool(spool)
        self._pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._hashing: set[asyncio.Future[Any]] = set()
        self._hashing_chars = 0  # of the raw texts handed to the pools and not yet fingerprinted
        self._max_hashing_chars = max_hashing_chars
        self._spilling: set[asyncio.Task[None]] = set()
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._processes: FingerprintProcess | None = None
        self._report: tuple[str, int] | None = None  # a drop report sent but not yet acknowledged
        self._away = False  # a round of attempts ran out, and the service has not answered since
        self._unreported = 0
        self.accepted = 0
        self.duplicates = 0
        self.findings = 0
        self.rejected = 0
        self.dropped = 0
        self.dropped_by_reason: collections.Counter[str] = collections.Counter()
        self.spooled = 0
        self._spool_losses = 0  # the spool's skipped_records already counted as drops

    async def __aenter__(self) -> BleedwatchClient:
        self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _start(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_in_background(), name="bleedwatch-sdk-sender")

    async def aclose(self) -> None:
        """Deliver what is queued; what the service does not take goes to the spool, and what the spool
        cannot hold is counted as dropped (``closed_undelivered``) and raised as ``Undelivered``."""
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
        try:
            try:
                await self.flush()
            except (Undelivered, Rejected):  # the rest of the queue too, not only the batch that failed
                lost = await self._keep_the_rest()
                if lost:
                    raise
        finally:
            for task in list(self._spilling):
                task.cancel()
            await self._http.aclose()
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)
            if self._processes is not None:
                self._processes.close()
            if self._spool is not None:
                self._spool.close()

    # --- queueing ----------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Exchanges queued or being fingerprinted, not yet sent."""
        return len(self._pending) + len(self._hashing)

    @property
    def spool(self) -> Spool | None:
        return self._spool

    async def submit(self, exchange: dict[str, Any]) -> None:
        """Queue one exchange (from ``fingerprint_exchange``); returns without waiting for the network."""
        self._queue(exchange)

    def _queue(self, exchange: dict[str, Any]) -> None:
        problem = name_problem(exchange) or size_problem(exchange, self._max_fingerprints, self._max_body_bytes)
        if problem is not None:  # the service would reject it: it never travels, and is counted
            self.rejected += 1
            self._drop(1, problem)
            return
        self._pending.append(exchange)
        if len(self._pending) >= self._batch_size:
            self._wake.set()
            self._start()
        if len(self._pending) > self._max_pending:  # the service is slower than the gateway, or away
            overflow = self._cut()
            task = asyncio.get_running_loop().create_task(self._spill(overflow))
            self._spilling.add(task)
            task.add_done_callback(self._spilling.discard)

    async def _spill(self, batch: list[dict[str, Any]]) -> None:
        if not await self._keep(orjson.dumps({"exchanges": batch}), len(batch)):
            self._drop(len(batch), "queue_full")  # and there is no room in a spool

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
        """Fingerprint off the event loop and queue; returns as soon as the work is handed over."""
        if self.pending >= self._max_pending + self._batch_size:
            self._drop(1, "fingerprinting_queue_full")
            return
        problem = name_problem({"tenant": tenant, "request_id": request_id, "model": model, "meta": meta})
        if problem is not None:  # before hashing it, which would be wasted
            self.rejected += 1
            self._drop(1, problem)
            return
        chars = len(prompt) + len(response)
        if self._hashing_chars + chars > self._max_hashing_chars and self._hashing:
            self._drop(1, "fingerprinting_queue_full")  # raw text waiting is what a burst of long prompts costs
            return
        when = time.time() if ts is None else ts
        around = functools.partial(  # the exchange around its fingerprints
            exchange_of, key=key, tenant=tenant, request_id=request_id, model=model, ts=when, meta=meta, params=params
        )
        future: asyncio.Future[dict[str, Any]]
        if chars > LONG_TEXT_CHARS:
            if self._processes is None:
                self._processes = FingerprintProcess()
            future = asyncio.wrap_future(self._processes.submit(prompt, response, key, params, around))
        else:
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bleedwatch-fp")
            texts = functools.partial(fingerprint_texts, prompt, response, key, params)
            future = asyncio.get_running_loop().run_in_executor(self._threads, lambda: around(texts()))
        self._hashing.add(future)
        self._hashing_chars += chars
        future.add_done_callback(functools.partial(self._hashed, chars))
        self._start()

    def _hashed(self, chars: int, future: asyncio.Future[Any]) -> None:
        self._hashing.discard(future)
        self._hashing_chars -= chars
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            log.error("bleedwatch: could not fingerprint an exchange: %s", type(exc).__name__)
            self._drop(1, "fingerprinting_failed")
            return
        self._queue(future.result())

    async def flush_hashing(self) -> None:
        """Wait until every exchange handed to ``submit_text`` is fingerprinted and queued (or spilled)."""
        while self._hashing or self._spilling:
            await asyncio.wait([*self._hashing, *self._spilling])

    # --- sending -----------------------------------------------------------------------------
    async def flush(self) -> None:
        """Deliver what is queued now (after the fingerprinting under way), and what is spooled."""
        await self.flush_hashing()
        async with self._lock:
            await self._replay(waited_on=True)
            while self._pending:
                await self._deliver(self._cut(), raise_errors=True)
            await self._report_drops()

    async def _deliver(self, batch: list[dict[str, Any]], *, raise_errors: bool) -> bool:
        """Send one batch; keep it in the spool if it cannot be delivered. True when delivered.

        ``raise_errors``: a caller waits on it (``flush``, ``aclose``), who gets the errors, and one
        attempt rather than a round while the service is away (``_post``).

        Exchanges the service refused for a limit that lifts (``retry_after``: too many new tenants
        this minute) go again, alone, once it has: a gateway's first minutes, with thousands of
        tenants the service has not seen, must lose none of them.
        """
        for attempt in range(self._max_attempts):
            try:
                result = await self._post(orjson.dumps({"exchanges": batch}), batch, waited_on=raise_errors)
            except asyncio.CancelledError:  # closing: aclose delivers or keeps it with the rest
                self._pending = batch + self._pending
                raise
            except Rejected as exc:
                if exc.status == 413 and len(batch) > 1:
                    # A proxy in front with a smaller body limit: learn it, and cut this batch again.
                    self._max_body_bytes = max(_BODY_FRAME + 1, len(orjson.dumps({"exchanges": batch})) // 2)
                    self._pending = batch + self._pending
                    return True  # nothing lost; the caller's loop cuts the queue again, smaller
                self.rejected += len(batch)  # resending the same bytes cannot succeed
                self._drop(len(batch), exc.reason, str(exc))
                if raise_errors:
                    raise
                return False
            except Undelivered:
                await self._keep_for_later(batch)
                if raise_errors:
                    raise
                return False
            again, wait = self._count(result, batch)
            if not again:
                return True
            batch = again
            if attempt + 1 < self._max_attempts:
                log.warning(
                    "bleedwatch: %s deferred by the service; again in %.0fs", counted(len(batch), "exchange"), wait
                )
                await asyncio.sleep(min(wait, self._max_backoff))
        await self._keep_for_later(batch)
        if raise_errors:
            raise Undelivered(batch, f"deferred by the service {counted(self._max_attempts, 'time')}")
        return False

    async def _keep_the_rest(self) -> list[dict[str, Any]]:
        """At close, once the service failed: every exchange still queued into the spool, batch by batch
        (the first undelivered batch is there already); what it cannot take is dropped and returned."""
        lost: list[dict[str, Any]] = []
        async with self._lock:
            while self._pending:
                batch = self._cut()
                if not await self._keep(orjson.dumps({"exchanges": batch}), len(batch)):
                    lost += batch
        if lost:
            self._drop(len(lost), "closed_undelivered")
            with contextlib.suppress(Exception):  # the service is away: the count stays with the client
                await self._report_drops()
        return lost

    async def _keep_for_later(self, batch: list[dict[str, Any]]) -> None:
        """Into the spool, or, with none or a full one, back to the queue (up to max_pending) for the next round."""
        if not await self._keep(orjson.dumps({"exchanges": batch}), len(batch)):
            self._pending = batch + self._pending

    async def _keep(self, body: bytes, exchanges: int) -> bool:
        """Into the spool (a worker thread writes and fsyncs it); False when there is none or it is full."""
        if self._spool is None:
            return False
        try:
            kept = await asyncio.to_thread(self._spool.append, body, exchanges)
        except OSError as exc:  # a full or failing disk: kept in memory instead, up to max_pending
            log.error("bleedwatch: spool write failed (%s); holding the batch in memory", type(exc).__name__)
            return False
        if kept:
            self.spooled += exchanges
            return True
        return False

    def _cut(self) -> list[dict[str, Any]]:
        """The next batch off the queue: up to ``batch_size`` exchanges whose body stays within
        ``max_body_bytes`` (a body the service refuses would lose every exchange in it)."""
        room = self._max_body_bytes - _BODY_FRAME
        count = 0
        for exchange in self._pending[: self._batch_size]:
            room -= wire_size(exchange) + 1
            if room < 0 and count:
                break
            count += 1
        batch, self._pending = self._pending[:count], self._pending[count:]
        return batch

    def _count_spool_losses(self) -> None:
        """Spooled records that failed their check (a bad disk, a torn write), each counted as one
        drop (``spool_corrupt``): a record held at least one exchange, and how many is in the header
        that failed the check, so this undercounts a lost batch of several. Adjacent bad records
        count one each, as far as the spool can tell them apart (``bleedwatch.spool``)."""
        if self._spool is not None and self._spool.skipped_records > self._spool_losses:
            lost, self._spool_losses = self._spool.skipped_records - self._spool_losses, self._spool.skipped_records
            self._drop(lost, "spool_corrupt")

    def _drop(self, exchanges: int, reason: str, detail: str | None = None) -> None:
        """``reason`` is a short code (bounded: never a name or a value), the key of ``dropped_by_reason``;
        ``detail`` the service's message (the field and the rule, never a value), for the log."""
        self.dropped += exchanges
        self.dropped_by_reason[reason] += exchanges
        self._unreported += exchanges
        if detail:
            log.error("bleedwatch: %s dropped (%s: %s)", counted(exchanges, "exchange"), reason, detail[:300])
        else:
            log.error("bleedwatch: %s dropped (%s)", counted(exchanges, "exchange"), reason)

    def _count(self, result: dict[str, Any], batch: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
        """Count what the service took and refused; the exchanges of ``batch`` it asks for again
        (``retry_after``), and in how many seconds."""
        self.accepted += result["accepted"]
        self.duplicates += result["duplicates"]
        self.findings += result.get("findings") or 0
        rejected: dict[str, tuple[int, str | None]] = {}  # reason -> count, first detail: one log line each
        again: list[dict[str, Any]] = []
        wait = 0.0
        for i, entry in enumerate(result.get("results") or ()):
            if entry.get("status") != "rejected":  # the rest of its batch was taken
                continue
            later = entry.get("retry_after")
            if isinstance(later, int | float) and i < len(batch):
                again.append(batch[i])
                wait = max(wait, float(later))
                continue
            reason, detail = _rejected(entry.get("error")), entry.get("detail")
            count, first = rejected.get(reason, (0, detail if isinstance(detail, str) else None))
            rejected[reason] = (count + 1, first)
        for reason, (count, first) in rejected.items():
            self.rejected += count
            self._drop(count, reason, first)
        return again, wait

    async def send(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        """Post one batch until it is accepted, refused for good, or the attempts run out."""
        return await self._post(orjson.dumps({"exchanges": batch}), batch)

    async def _post(
        self, body: bytes, batch: list[dict[str, Any]] | None = None, *, waited_on: bool = False
    ) -> dict[str, Any]:
        """A round of ``max_attempts``; one attempt only when a caller waits on it (``waited_on``) and the
        last round found the service away: that batch, or one before it, already had its round."""
        attempts = 1 if waited_on and self._away else self._max_attempts
        cause = "no attempt made"
        gone = True  # no answer, or a gateway's for a service behind it that is down
        for attempt in range(attempts):
            try:
                resp = await self._http.post("/v1/exchanges", content=body)
            except httpx.TransportError as exc:
                cause = f"network error: {exc!r}"
                wait = None
                gone = True
            else:
                gone = resp.status_code in GONE_STATUSES
                result = _answer(resp) if resp.status_code == 202 else None
                if result is not None:
                    self._away = False
                    return result
                if resp.status_code not in RETRY_STATUSES and 300 <= resp.status_code < 500:
                    self._away = False
                    raise Rejected(resp.status_code, _json(resp))
                # A success that is no answer of bleedwatch's (a proxy's page) says nothing was taken: again.
                cause = f"HTTP {resp.status_code}" + (", not bleedwatch's answer" if resp.status_code < 300 else "")
                wait = retry_after(resp.headers.get("retry-after"), time.time())
            if attempt + 1 == attempts:
                break
            backoff = min(self._max_backoff, 0.2 * 2**attempt) * (0.5 + random.random() / 2)
            delay = min(wait, self._max_backoff) if wait is not None else backoff
            log.warning("bleedwatch ingest failed (%s); retry %d in %.1fs", cause, attempt + 1, delay)
            await asyncio.sleep(delay)
        # A 429 or 503 is the service, up, asking for time: a caller waiting on the next batch gets a whole round.
        self._away = gone
        log.warning(
            "bleedwatch ingest failed (%s); not accepted in %s, %s",
            cause,
            counted(attempts, "attempt"),
            "the service is still away" if attempts < self._max_attempts else "given up for this round",
        )
        raise Undelivered(batch if batch is not None else orjson.loads(body)["exchanges"], cause)

    async def _replay(self, *, waited_on: bool) -> None:
        """Send spooled batches, oldest first, until the spool is empty or the service fails again."""
        spool = self._spool
        while spool:
            record = await asyncio.to_thread(spool.peek)
            self._count_spool_losses()
            if record is None:
                return
            try:
                result = await self._post(record.payload, waited_on=waited_on)
            except Rejected as exc:
                self.rejected += record.exchanges
                self._drop(record.exchanges, exc.reason, str(exc))
            except Undelivered:
                return  # still away: keep it for the next round
            else:
                again, _ = self._count(result, orjson.loads(record.payload)["exchanges"])
                self._pending = again + self._pending  # sent by the next round, which waits if it must
            await asyncio.to_thread(spool.commit, record.end, record.generation)

    async def _report_drops(self) -> None:
        """Tell the service how many exchanges were dropped (once per report, whatever the retries)."""
        if self._report is None and self._unreported:
            self._report, self._unreported = (uuid.uuid4().hex, self._unreported), 0
        if self._report is None:
            return
        report_id, count = self._report
        try:
            resp = await self._http.post(
                "/v1/sdk/drops", content=orjson.dumps({"report_id": report_id, "count": count})
            )
        except httpx.TransportError:
            return
        if resp.status_code == 202:
            self._report = None
        elif resp.status_code < 500 and resp.status_code not in RETRY_STATUSES:
            log.error(
                "bleedwatch: the service refused a drop report (%s); %s stay local",
                resp.status_code,
                counted(count, "drop"),
            )
            self._report = None

    async def _send_in_background(self) -> None:
        """Full batches as soon as they are full; whatever is queued every ``flush_seconds``."""
        while True:
            timed_out = False
            try:
                await asyncio.wait_for(self._wake.wait(), self._flush_seconds)
            except TimeoutError:
                timed_out = True
            self._wake.clear()
            try:
                async with self._lock:
                    if self._spool:
                        await self._replay(waited_on=False)
                    while len(self._pending) >= (1 if timed_out else self._batch_size):
                        if not await self._deliver(self._cut(), raise_errors=False):
                            break  # the service is away: the rest waits for the next round
                    await self._report_drops()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the sender must outlive any single failure
                log.error("bleedwatch: background send failed: %s", type(exc).__name__)


def _rejected(error: object) -> str:
    """The drop reason of an exchange the service refused: its error code, bounded."""
    return f"rejected:{error if isinstance(error, str) and _ERROR_CODE.fullmatch(error) else 'other'}"


def _answer(resp: httpx.Response) -> dict[str, Any] | None:
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {"error": "http_error", "detail": resp.text[:200]}
    return data if isinstance(data, dict) else {"error": "http_error", "detail": str(data)[:200]}
