"""The one path of an exchange: accept (validate, queue), then process (dedupe, index, cross-match, store findings).

``accept`` answers the gateway as soon as the batch is durably queued (service/index/queue.py);
a replica's worker (service/ingest/worker.py) then calls ``process``. A batch is processed at
least once: all of it is indexed and its findings committed (or, with the database unreachable,
held in the outbox: service/findings/writer.py) before the idempotency mark per (tenant, request
id) is written, and the queue entry is finished last. A batch processed again after any failure
is harmless: its documents keep the refs given at acceptance (no second copy of any), the index
keeps one entry per tenant, findings are upserts, and exchanges already marked are counted as
duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bleedwatch.fingerprint.scheme import Params
from bleedwatch.plural import counted
from service import metrics, tracing
from service.auth.keys import Caller
from service.errors import ApiError, Forbidden, TooManyNewTenants, Unavailable
from service.findings.writer import FindingsWriter
from service.index.base import Doc, DocMeta, Index, Kind, kind_name
from service.ingest import envelope
from service.ingest.decode import Limits, check_exchange, check_size, decode_exchange, parse_exchange
from service.ingest.schemas import Batch, Exchange, ExchangeResult, IngestResult
from service.logging import current_request_id, request_id_bound
from service.matching.matcher import Matcher
from service.wire import QUEUED, Decoded

log = logging.getLogger(__name__)

QUEUE_FULL_RETRY_SECONDS = 5


class Purged(Forbidden):
    """The exchange's tenant was purged after it happened: taking it would bring the data back."""

    error = "purged"


def _late(exchanges: list[tuple[int, Exchange]], tombstones: dict[str, float]) -> set[int]:
    """Positions of exchanges from before their tenant's purge (queued, spooled or retried since)."""
    return {i for i, ex in exchanges if ex.tenant in tombstones and ex.ts.timestamp() <= tombstones[ex.tenant]}


@dataclass(frozen=True, slots=True)
class Accepted:
    item_id: str | None  # None: nothing was queued (every exchange a duplicate or rejected)
    queued: IngestResult  # the answer before processing, with every exchange's result
    positions: tuple[int, ...] = ()  # where each queued exchange is in the batch as received

    def merge(self, processed: IngestResult) -> IngestResult:
        """The processed batch's answer, told per exchange of the batch as received: processing
        may find more duplicates (the same exchange in flight from a retry); rejections stay."""
        results = list(self.queued.results or [])
        for position, result in zip(self.positions, processed.results or [], strict=False):
            results[position] = result
        duplicates = self.queued.duplicates + processed.duplicates
        return processed.model_copy(
            update={"duplicates": duplicates, "rejected": self.queued.rejected, "results": results}
        )


def _wire(item: Exchange | dict[str, Any]) -> dict[str, Any]:
    return item.model_dump(mode="json", exclude_unset=True) if isinstance(item, Exchange) else item


def _params(ex: Exchange, kind: Kind) -> Params:
    """The text's own parameters: a response is winnowed with ``response_w`` where the gateway sent one."""
    s = ex.scheme
    w = (s.response_w or s.w) if kind == Kind.RESPONSE else s.w
    return Params(s.n, w, s.sample_after, s.sample_mod)


def _idempotency_key(ex: Exchange) -> str:
    return f"{len(ex.tenant)}:{ex.tenant}:{ex.request_id}"


class Ingestor:
    def __init__(
        self,
        index: Index,
        matcher: Matcher,
        sessions: async_sessionmaker[AsyncSession],
        limits: Limits,
        writer: FindingsWriter | None = None,
        queue_max_batches: int = 1_000,
        queue_max_bytes: int = 0,
        labels: metrics.Labels | None = None,
    ) -> None:
        # Shared with the findings writer, so an exchange's model series and its findings' agree.
        self._labels = labels or metrics.Labels()
        self.queue_max_bytes = queue_max_bytes
        self._index = index
        self._queue = index.queue()
        self.queue_max_batches = queue_max_batches
        self._matcher = matcher
        self._sessions = sessions
        self.limits = limits
        self._writer = writer or FindingsWriter(sessions, index.outbox(), index.purged, labels=self._labels)

    @tracing.traced("accept")
    async def accept(self, raw: Sequence[Exchange | dict[str, Any]], body: bytes, caller: Caller) -> Accepted:
        """Everything that can refuse an exchange happens here, before it is queued; nothing after.

        Each exchange is judged alone: one that is invalid, too large or for a tenant the key may
        not report for is rejected with its reason, and the others are taken (one bad exchange
        never sinks a batch of other tenants' exchanges). Only when none is taken is the batch
        refused as a whole, with the first one's error, as a one-exchange batch always was.
        """
        now = time.time()
        check_size(len(raw), self.limits)
        results: list[ExchangeResult] = []
        first_error: ApiError | None = None
        valid: list[tuple[int, Exchange]] = []
        seen: set[tuple[str, str]] = set()
        for i, item in enumerate(raw):
            try:
                ex = item if isinstance(item, Exchange) else parse_exchange(item, i)
                check_exchange(ex, i, self.limits, now)
                if caller.tenants is not None and ex.tenant not in caller.tenants:
                    raise Forbidden(f"exchanges[{i}].tenant: this API key may not report for that tenant")
                decode_exchange(ex, i, self.limits)
            except ApiError as exc:
                metrics.EXCHANGES_REJECTED.labels(exc.error).inc()
                first_error = first_error or exc
                results.append(ExchangeResult(status="rejected", error=exc.error, detail=exc.detail))
                continue
            if (ex.tenant, ex.request_id) in seen:  # the same exchange twice in one batch: taken once
                results.append(ExchangeResult(status="duplicate"))
                continue
            seen.add((ex.tenant, ex.request_id))
            results.append(ExchangeResult(status="accepted"))
            valid.append((i, ex))
        late = _late(valid, await self._index.purged(sorted({ex.tenant for _, ex in valid})))
        for i in sorted(late):
            gone = Purged(f"exchanges[{i}].tenant: the tenant was purged after this exchange; it is not kept")
            metrics.EXCHANGES_REJECTED.labels(gone.error).inc()
            first_error = first_error or gone
            results[i] = ExchangeResult(status="rejected", error=gone.error, detail=gone.detail)
        valid = [(i, ex) for i, ex in valid if i not in late]
        if self.limits.new_tenants_per_minute and valid:
            over = await self._index.admit_new_tenants(
                caller.key_id, [ex.tenant for _, ex in valid], self.limits.new_tenants_per_minute, now
            )
            for i, ex in valid:
                if ex.tenant in over:
                    wait = 60 - int(now) % 60  # the limit is per clock minute
                    limited = TooManyNewTenants(
                        f"exchanges[{i}].tenant: this API key sent more than "
                        f"{counted(self.limits.new_tenants_per_minute, 'tenant')} not seen before this minute; "
                        "retry next minute, or raise "
                        "BLEEDWATCH_NEW_TENANTS_PER_KEY_PER_MINUTE",
                        headers={"Retry-After": str(wait)},
                    )
                    metrics.EXCHANGES_REJECTED.labels(limited.error).inc()
                    first_error = first_error or limited
                    results[i] = ExchangeResult(
                        status="rejected", error=limited.error, detail=limited.detail, retry_after=wait
                    )
            valid = [(i, ex) for i, ex in valid if ex.tenant not in over]
        if not valid and first_error is not None:
            raise first_error
        done = await self._index.done([_idempotency_key(ex) for _, ex in valid], now)
        fresh = [(i, ex) for (i, ex), d in zip(valid, done, strict=True) if not d]
        for (i, _), d in zip(valid, done, strict=True):
            if d:
                results[i] = ExchangeResult(status="duplicate")
        rejected = sum(r.status == "rejected" for r in results)
        duplicates = len(raw) - rejected - len(fresh)
        metrics.EXCHANGES_DUPLICATE.inc(sum(done))
        if not fresh:  # a retry of a batch already processed
            answer = IngestResult(
                accepted=0, duplicates=duplicates, rejected=rejected, findings=0, processed=True, results=results
            )
            return Accepted(None, answer)
        if len(fresh) < len(raw):  # queue only what is to be processed
            body = orjson.dumps({"exchanges": [_wire(raw[i]) for i, _ in fresh]})
        first = await self._index.new_doc_refs(2 * len(fresh))  # refs at acceptance: service/ingest/envelope.py
        refs = [first + 2 * j for j in range(len(fresh))]
        wrapped = envelope.wrap(envelope.origin(current_request_id(), tracing.traceparent()), refs, body)
        item_id = await self._queue.put(wrapped, self.queue_max_batches, self.queue_max_bytes)
        if item_id is None:
            metrics.INGEST_QUEUE_FULL.inc()
            bound = f" or {counted(self.queue_max_bytes, 'byte')}" if self.queue_max_bytes else ""
            batches = counted(self.queue_max_batches, "batch", "batches")
            raise Unavailable(
                f"the ingest queue is full (at most {batches}{bound} wait to be processed: "
                "BLEEDWATCH_INGEST_QUEUE_MAX_BATCHES, BLEEDWATCH_INGEST_QUEUE_MAX_BYTES); "
                "retry later, nothing of this batch was kept",
                headers={"Retry-After": str(QUEUE_FULL_RETRY_SECONDS)},
            )
        queued = IngestResult(
            accepted=len(fresh), duplicates=duplicates, rejected=rejected, findings=None, results=results
        )
        return Accepted(item_id, queued, tuple(i for i, _ in fresh))

    async def wait(self, accepted: Accepted, timeout_seconds: float) -> IngestResult:
        """The batch's result once a replica has processed it; the queued answer if that takes too long."""
        if accepted.item_id is None:
            return accepted.queued
        deadline = time.monotonic() + timeout_seconds
        pause = 0.002
        while True:
            raw = await self._queue.result(accepted.item_id)
            if raw is not None:
                return accepted.merge(IngestResult.model_validate_json(raw))
            if time.monotonic() + pause > deadline:
                return accepted.queued
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    @staticmethod
    def split(item: bytes) -> list[bytes]:
        """The queue item of each exchange of a batch alone (the same accepting request), so that one
        exchange that cannot be processed does not hold back the others."""
        request_id, refs, body = envelope.unwrap(item)
        batch = Batch.model_validate_json(body, context=QUEUED)
        return [
            envelope.wrap(
                request_id,
                None if refs is None else [refs[i]],  # each keeps its refs
                Batch(exchanges=[ex]).model_dump_json(exclude_unset=True).encode(),
            )
            for i, ex in enumerate(batch.exchanges)
        ]

    async def process(self, item: bytes) -> IngestResult:
        """Index and match one accepted batch; validated by ``accept``, so nothing here refuses it."""
        first_line, refs, body = envelope.unwrap(item)
        request_id, traceparent = envelope.parse_origin(first_line)
        # Logs and incident timelines name the accepting request; spans join its trace.
        with request_id_bound(request_id), tracing.resumed(traceparent):
            return await self._process(Batch.model_validate_json(body, context=QUEUED), refs)

    @tracing.traced("ingest")
    async def _process(self, batch: Batch, refs: list[int] | None) -> IngestResult:
        now = time.time()
        if refs is None or len(refs) != len(batch.exchanges):  # an item from before refs at acceptance
            first = await self._index.new_doc_refs(2 * len(batch.exchanges))
            refs = [first + 2 * i for i in range(len(batch.exchanges))]
        decoded = [decode_exchange(ex, i, self.limits) for i, ex in enumerate(batch.exchanges)]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, ex in enumerate(batch.exchanges):
            groups[ex.key_id].append(i)
        accepted = duplicates = findings = 0
        repeated: set[int] = set()
        for key_id, positions in groups.items():
            a, d, f = await self._ingest_group(key_id, batch, decoded, positions, refs, now, repeated)
            accepted, duplicates, findings = accepted + a, duplicates + d, findings + f
        # Per exchange only when one turned out a duplicate (in flight from a retry): kept for minutes.
        results = None
        if repeated:
            results = [
                ExchangeResult(status="duplicate" if i in repeated else "accepted") for i in range(len(batch.exchanges))
            ]
        return IngestResult(
            accepted=accepted, duplicates=duplicates, findings=findings, processed=True, results=results
        )

    async def _put_docs(
        self,
        key_id: str,
        docs: list[Doc],
        metas: dict[int, DocMeta],
        refs: list[int],
        positions: list[int],
        now: float,
    ) -> tuple[list[Doc], dict[int, DocMeta]]:
        """Store the documents; an exchange whose refs hold another exchange's documents gets new ones
        (``refs`` is updated in place).

        Refs are handed out twice only after Redis lost the last writes to its counter (a power
        loss with ``appendfsync everysec``) while a worker held a batch accepted just before. Without
        this, whichever batch wrote last would replace the other's documents, and evidence from the
        first one's text would name the second one's request and tenant.
        """
        taken = await self._index.put_docs(key_id, metas, now)
        for _ in range(3):
            if not taken:
                return docs, metas
            moved = [i for i in positions if refs[i] in taken or refs[i] + 1 in taken]
            log.warning("ingest_refs_reused", extra={"exchanges": len(moved)})
            first = await self._index.new_doc_refs(2 * len(moved))
            new: dict[int, int] = {}
            for j, i in enumerate(moved):  # an exchange's prompt is its ref, its response the next one
                new[refs[i]], new[refs[i] + 1] = first + 2 * j, first + 2 * j + 1
                refs[i] = first + 2 * j
            docs = [replace(d, ref=new.get(d.ref, d.ref)) for d in docs]
            metas = {new.get(r, r): m for r, m in metas.items()}
            taken = await self._index.put_docs(key_id, {r: metas[r] for r in new.values()}, now)
        raise RuntimeError("document refs kept colliding after new ones were taken three times")

    async def _ingest_group(
        self,
        key_id: str,
        batch: Batch,
        decoded: list[tuple[Decoded, Decoded]],
        positions: list[int],
        refs: list[int],
        now: float,
        repeated: set[int],
    ) -> tuple[int, int, int]:
        exchanges = [batch.exchanges[i] for i in positions]
        keys = [_idempotency_key(ex) for ex in exchanges]
        done = await self._index.done(keys, now)
        repeated.update(i for i, d in zip(positions, done, strict=True) if d)
        fresh = [(i, ex) for i, ex, d in zip(positions, exchanges, done, strict=True) if not d]
        duplicates = len(exchanges) - len(fresh)
        metrics.EXCHANGES_DUPLICATE.inc(duplicates)
        late = _late(fresh, await self._index.purged(sorted({ex.tenant for _, ex in fresh})))
        if late:  # accepted before their tenant was purged: dropped here, and counted
            metrics.EXCHANGES_REJECTED.labels("purged").inc(len(late))
            fresh = [(i, ex) for i, ex in fresh if i not in late]
        if not fresh:
            return 0, duplicates, 0
        tenants = await self._index.tenant_refs(sorted({ex.tenant for _, ex in fresh}))
        docs: list[Doc] = []
        metas: dict[int, DocMeta] = {}
        for i, ex in fresh:
            prompt, response = decoded[i]
            context = {k: v for k, v in ex.meta.model_dump().items() if v is not None}
            context.setdefault("prompt_tokens", prompt.token_count)
            for ref, kind, text in ((refs[i], Kind.PROMPT, prompt), (refs[i] + 1, Kind.RESPONSE, response)):
                docs.append(Doc(ref, tenants[ex.tenant], kind, text.values, text.offsets))
                metas[ref] = DocMeta(
                    tenant=ex.tenant,
                    request_id=ex.request_id,
                    kind=kind,
                    model=ex.model,
                    ts=ex.ts.timestamp(),
                    token_count=text.token_count,
                    context=context,
                    params=_params(ex, kind),
                    values=text.values if kind == Kind.RESPONSE else None,
                    offsets=text.offsets if kind == Kind.RESPONSE else None,
                )
        docs, metas = await self._put_docs(key_id, docs, metas, refs, [i for i, _ in fresh], now)
        with metrics.MATCH_DURATION.time():
            hits = await self._index.insert(key_id, docs, now)
            drafts = await self._matcher.evaluate(key_id, docs, metas, hits, now)
        created = 0
        if drafts:
            # Database down: held in the outbox and written later (service/findings/writer.py).
            changed = await self._writer.write(drafts)
            created = len(drafts) if changed is None else len(changed)
        await self._index.mark_done([_idempotency_key(ex) for _, ex in fresh], now)
        metrics.EXCHANGES_INGESTED.inc(len(fresh))
        for i, _ in fresh:
            metrics.record_exchange(metas[refs[i]], now, self._labels)
        for doc in docs:
            metrics.FINGERPRINTS_INGESTED.labels(kind_name(doc.kind)).inc(len(doc.values))
        return len(fresh), duplicates, created
