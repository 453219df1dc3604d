"""Every replica's ingest workers: take accepted batches from the queue, process them, finish them.

The gateway is answered once its batch is durably queued, so its wait is one Redis write
whatever the batch holds, and a long-context batch does not hold up the small ones behind it.

A batch is finished (removed from the queue) only after it is processed. Until then it stays
in the queue's pending list: while Redis or the database is unreachable its worker retries it;
if its replica dies, another one reclaims it once it has been idle ``reclaim_seconds`` (a live
worker holds its batch, however long it takes). A batch whose processing raises anything else
is a bug's victim: it is retried on later deliveries and after ``MAX_DELIVERIES`` moved to the
dead letters (``bleedwatch_ingest_dead_letters_total``), never dropped silently; a dead letter
nobody requeues is deleted after ``dead_letter_seconds`` and counted
(``bleedwatch_dead_letters_expired_total``). No error ends
a worker: one that died would leave its replica taking batches with fewer hands and nobody told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid

import redis.exceptions

from service import metrics
from service.findings.writer import DATABASE_DOWN
from service.index.base import Queue
from service.ingest.schemas import IngestResult
from service.ingest.service import Ingestor
from service.periodic import Periodic

log = logging.getLogger(__name__)

OUTAGE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, *DATABASE_DOWN)
MAX_DELIVERIES = 5
TAKE_BLOCK_SECONDS = 1.0
RECOVER_SECONDS = 2.0
RECLAIM_COUNT = 10
DEFAULT_DEAD_LETTER_SECONDS = 7 * 86400.0  # BLEEDWATCH_DEAD_LETTER_RETENTION_SECONDS


def enqueued_at(item_id: str) -> float:
    """A stream id starts with the milliseconds of its XADD."""
    return int(item_id.split("-", 1)[0]) / 1000


class IngestWorker:
    def __init__(
        self,
        ingestor: Ingestor,
        queue: Queue,
        concurrency: int,
        reclaim_seconds: float,
        consumer: str | None = None,
        dead_letter_seconds: float = DEFAULT_DEAD_LETTER_SECONDS,
    ) -> None:
        self._dead_letter_seconds = dead_letter_seconds
        self._ingestor = ingestor
        self._queue = queue
        self._concurrency = concurrency
        self._reclaim_seconds = reclaim_seconds
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._waiting: set[asyncio.Future[tuple[str, bytes] | None]] = set()  # takes blocked on an empty queue
        self._recovery: Periodic | None = None

    def start(self) -> None:
        self._stopping = False
        if self._concurrency == 0:  # an API replica whose batches `bleedwatch work` processes: not even reclaims
            return
        # Each task's lane: its home shard of a sharded queue; a random start so processes cover different ones.
        first = random.randrange(1 << 16)
        self._tasks = [asyncio.create_task(self._run(first + i), name=f"ingest-{i}") for i in range(self._concurrency)]
        self._recovery = Periodic("ingest-recovery", self._recover, RECOVER_SECONDS)
        self._recovery.start()

    async def stop(self) -> None:
        """Finish the batches in hand; a durable queue keeps the rest for the other replicas."""
        self._stopping = True
        for take in self._waiting:  # nothing in hand: no reason to wait out the block
            take.cancel()
        await asyncio.gather(*self._tasks)
        self._tasks = []
        if self._recovery is not None:
            await self._recovery.stop()
            self._recovery = None

    async def _run(self, lane: int) -> None:
        # The embedded queue lives in this process and is not durable: it is emptied before exit.
        while not (self._stopping and self._queue.durable):
            try:
                taken = await self._take(lane)
            except OUTAGE as exc:
                metrics.BACKEND_ERRORS.labels("redis").inc()
                log.warning("ingest_queue_unreachable", extra={"exc_type": type(exc).__name__})
                await asyncio.sleep(TAKE_BLOCK_SECONDS)
                continue
            except Exception as exc:  # redis-py lets some connection resets out as AttributeError (#4287)
                metrics.BACKEND_ERRORS.labels("redis").inc()  # an OOM refusal of the group's bookkeeping, too
                log.exception("ingest_take_failed", extra={"exc_type": type(exc).__name__})
                await asyncio.sleep(TAKE_BLOCK_SECONDS)
                continue
            if taken is not None:
                await self._handle(*taken, deliveries=1)
            elif self._stopping:
                return

    async def _take(self, lane: int) -> tuple[str, bytes] | None:
        """The next batch, or None after a block with nothing new, or once ``stop`` is called.

        ``stop`` cancels a take that is blocked, so a replica stops at once when idle. Cancelled,
        a Redis client drops its connection; a batch Redis handed over just then stays pending
        under this consumer, and another replica reclaims it, as after a crash. The embedded queue
        is looked at once more without waiting: a batch that woke the take just before is this
        process's to finish.
        """
        take = asyncio.ensure_future(self._queue.take(self.consumer, 0 if self._stopping else TAKE_BLOCK_SECONDS, lane))
        self._waiting.add(take)
        try:
            await asyncio.wait({take})
        finally:
            self._waiting.discard(take)
            take.cancel()  # only if this task itself was cancelled while it waited
        if not take.cancelled() and not (self._stopping and take.exception() is not None):
            return take.result()
        # Cancelled, or failing as it was (a client may turn the cancel into a connection error).
        return None if self._queue.durable else await self._queue.take(self.consumer, 0, lane)

    async def _handle(self, item_id: str, item: bytes, deliveries: int) -> None:
        holder = asyncio.create_task(self._hold(item_id), name=f"hold-{item_id}")
        try:
            await self._process(item_id, item, deliveries)
        finally:
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder

    async def _hold(self, item_id: str) -> None:
        """Keep the batch from looking abandoned while this worker is at it.

        A batch can take longer than ``reclaim_seconds`` on a loaded Redis (long-context prompts,
        an outage being retried). Taken over, it would be processed twice at once, loading Redis
        more just when it is slow, and each takeover counts as a delivery towards the dead letters.
        """
        while True:
            await asyncio.sleep(self._reclaim_seconds / 3)
            try:
                if not await self._queue.hold(self.consumer, item_id):
                    return  # reclaimed meanwhile: the other worker processes it too, which is harmless
            except Exception as exc:  # an outage, or redis-py's AttributeError: try again at the next beat
                log.warning("ingest_hold_failed", extra={"item": item_id, "exc_type": type(exc).__name__})

    async def _process(self, item_id: str, item: bytes, deliveries: int) -> None:
        pause = 0.1
        while True:
            try:
                result = await self._ingestor.process(item)
                await self._queue.finish(item_id, result.model_dump_json().encode())
            except OUTAGE as exc:
                if self._stopping:
                    return  # still pending: reclaimed by another replica, or by this one after a restart
                log.warning("ingest_retry", extra={"item": item_id, "exc_type": type(exc).__name__, "pause": pause})
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            except Exception as exc:  # a bug, or an exchange it trips on: see _isolate
                metrics.INGEST_FAILURES.inc()
                log.exception(
                    "ingest_failed", extra={"item": item_id, "deliveries": deliveries, "exc_type": type(exc).__name__}
                )
                if await self._isolate(item_id, item):
                    return
                if deliveries >= MAX_DELIVERIES:
                    await self._bury(item_id, item, deliveries, _reason(exc))
                return
            metrics.INGEST_QUEUE_SECONDS.observe(max(0.0, time.time() - enqueued_at(item_id)))
            return

    async def _isolate(self, item_id: str, item: bytes) -> bool:
        """A batch of several exchanges that failed: queue each exchange alone and finish the batch.

        The others are then processed at once, and only an exchange that keeps failing goes to the
        dead letters, with its reason, after ``MAX_DELIVERIES``: one exchange (say, one a hostile
        key holder crafted) never holds back or sinks the other tenants' exchanges of its batch.
        False when there is nothing to split, or splitting failed (the batch is retried whole).
        """
        try:
            singles = self._ingestor.split(item)
            if len(singles) < 2:
                return False
            for single in singles:
                if await self._queue.put(single, max_items=2**31) is None:
                    return False
            # A caller waiting on the batch hears it was accepted, not yet processed (as with respond-async).
            queued = IngestResult(accepted=len(singles), duplicates=0, findings=None)
            await self._queue.finish(item_id, queued.model_dump_json().encode())
        except Exception as exc:  # an outage meanwhile: the batch stays pending, and is retried whole
            log.warning("ingest_isolate_failed", extra={"item": item_id, "exc_type": type(exc).__name__})
            return False
        log.warning("ingest_isolated", extra={"item": item_id, "exchanges": len(singles)})
        return True

    async def _bury(self, item_id: str, item: bytes, deliveries: int, reason: str) -> None:
        try:
            await self._queue.bury(item_id, item, reason)
        except Exception as exc:  # still pending: buried at its next delivery
            log.warning("ingest_bury_failed", extra={"item": item_id, "exc_type": type(exc).__name__})
            return
        metrics.INGEST_DEAD_LETTERS.inc()
        log.error("ingest_dead_letter", extra={"item": item_id, "deliveries": deliveries, "reason": reason})

    async def expire_dead(self, now: float) -> int:
        """Delete dead letters older than ``dead_letter_seconds``: kept for an operator to requeue after
        a fix, but not forever, or a steady stream of poison batches would fill Redis."""
        expired = await self._queue.expire_dead(now - self._dead_letter_seconds)
        if expired:
            metrics.DEAD_LETTERS_EXPIRED.labels("ingest").inc(expired)
            log.warning("ingest_dead_letters_expired", extra={"count": expired})
        return expired

    async def _recover(self) -> None:
        """One ``Periodic`` round: export the queue's depth; take over batches abandoned by a dead
        replica; then export its bytes and expire old dead letters."""
        metrics.INGEST_QUEUE.set(await self._queue.size())
        for item_id, item, deliveries in await self._queue.reclaim(self.consumer, self._reclaim_seconds, RECLAIM_COUNT):
            log.warning("ingest_reclaimed", extra={"item": item_id, "deliveries": deliveries})
            await self._handle(item_id, item, deliveries)
        metrics.INGEST_QUEUE_BYTES.set(await self._queue.byte_size())
        await self.expire_dead(time.time())


def _reason(exc: Exception) -> str:
    """What failed, for an operator: the exception's type and its first 200 characters. Messages of
    this service never carry text of an exchange (there is none to carry)."""
    return f"{type(exc).__name__}: {str(exc)[:200]}"
