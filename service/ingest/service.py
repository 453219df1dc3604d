"""The one path of an exchange: accept (validate, queue), then process (dedupe, index, cross-match, store findings).

``accept`` answers the gateway as soon as the batch is durably queued (service/index/queue.py);
a replica's worker (service/ingest/worker.py) then calls ``process``. A batch is processed at
least once: all of it is indexed and its findings committed (or, with the database unreachable,
held in the outbox: service/ingest/outbox.py) before the idempotency mark per (tenant, request
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
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics, tracing
from service.auth.keys import Caller
from service.errors import Forbidden, Unavailable
from service.fingerprint.scheme import Params
from service.index.base import Doc, DocMeta, Index, Kind, kind_name
from service.ingest.decode import Decoded, Limits, check_batch, decode_exchange
from service.ingest.outbox import FindingsWriter
from service.ingest.schemas import Batch, Exchange, IngestResult
from service.logging import current_request_id, request_id_bound
from service.matching.matcher import Matcher

log = logging.getLogger(__name__)

QUEUE_FULL_RETRY_SECONDS = 5


@dataclass(frozen=True, slots=True)
class Accepted:
    item_id: str | None  # None: nothing was queued (every exchange a duplicate)
    queued: IngestResult  # the answer before processing


def _envelope(request_id: str | None, first_ref: int, body: bytes) -> bytes:
    """The accepting request's id (never a newline: service/logging.py), a newline, ``@`` and the
    batch's first document ref, a newline, the batch.

    Refs are given at acceptance, not at processing: the index keeps, per tenant, the document
    with the lowest ref (service/index/lua/common.lua), and ties between sources go to the lowest
    ref too, so findings follow the order batches were accepted in, and not the order in which
    workers (or, on a Redis Cluster, each node) happened to process them. Exchange ``i`` of the
    batch has refs ``first + 2i`` (prompt) and ``first + 2i + 1`` (response).
    """
    return (request_id or "").encode() + b"\n@" + str(first_ref).encode() + b"\n" + body


def _open(item: bytes) -> tuple[bytes, int | None, bytes]:
    """Request id, first doc ref (None in items queued before refs were given at acceptance), body."""
    request_id, _, rest = item.partition(b"\n")
    if not rest.startswith(b"@"):  # a JSON body never starts with @
        return request_id, None, rest
    ref, _, body = rest.partition(b"\n")
    return request_id, int(ref[1:]), body


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
    ) -> None:
        self._index = index
        self._queue = index.queue()
        self.queue_max_batches = queue_max_batches
        self._matcher = matcher
        self._sessions = sessions
        self.limits = limits
        self._writer = writer or FindingsWriter(sessions, index.outbox())

    @tracing.traced("accept")
    async def accept(self, batch: Batch, body: bytes, caller: Caller) -> Accepted:
        """Everything that can refuse a batch happens here, before it is queued; nothing after."""
        now = time.time()
        check_batch(batch, self.limits, now)
        if caller.tenants is not None:
            for i, ex in enumerate(batch.exchanges):
                if ex.tenant not in caller.tenants:
                    raise Forbidden(f"exchanges[{i}].tenant: this API key may not report for that tenant")
        for i, ex in enumerate(batch.exchanges):
            decode_exchange(ex, i, self.limits)
        done, first_ref = await asyncio.gather(
            self._index.done([_idempotency_key(ex) for ex in batch.exchanges], now),
            self._index.new_doc_refs(2 * len(batch.exchanges)),
        )
        duplicates = sum(done)
        if duplicates == len(batch.exchanges):  # a retry of a batch already processed
            metrics.EXCHANGES_DUPLICATE.inc(duplicates)
            return Accepted(None, IngestResult(accepted=0, duplicates=duplicates, findings=0, processed=True))
        item_id = await self._queue.put(_envelope(current_request_id(), first_ref, body), self.queue_max_batches)
        if item_id is None:
            metrics.INGEST_QUEUE_FULL.inc()
            raise Unavailable(
                f"the ingest queue is full ({self.queue_max_batches} batches wait to be processed); "
                "retry later, nothing of this batch was kept",
                headers={"Retry-After": str(QUEUE_FULL_RETRY_SECONDS)},
            )
        queued = IngestResult(accepted=len(batch.exchanges) - duplicates, duplicates=duplicates, findings=None)
        return Accepted(item_id, queued)

    async def wait(self, accepted: Accepted, timeout_seconds: float) -> IngestResult:
        """The batch's result once a replica has processed it; the queued answer if that takes too long."""
        if accepted.item_id is None:
            return accepted.queued
        deadline = time.monotonic() + timeout_seconds
        pause = 0.002
        while True:
            raw = await self._queue.result(accepted.item_id)
            if raw is not None:
                return IngestResult.model_validate_json(raw)
            if time.monotonic() + pause > deadline:
                return accepted.queued
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    @staticmethod
    def split(item: bytes) -> list[bytes]:
        """The queue item of each exchange of a batch alone (the same accepting request), so that one
        exchange that cannot be processed does not hold back the others."""
        request_id, first, body = _open(item)
        batch = Batch.model_validate_json(body)
        out = []
        for i, ex in enumerate(batch.exchanges):
            alone = Batch(exchanges=[ex]).model_dump_json(exclude_unset=True).encode()
            refs = b"" if first is None else b"@%d\n" % (first + 2 * i)  # each keeps its refs
            out.append(request_id + b"\n" + refs + alone)
        return out

    async def process(self, item: bytes) -> IngestResult:
        """Index and match one accepted batch; validated by ``accept``, so nothing here refuses it."""
        request_id, first_ref, body = _open(item)
        with request_id_bound(request_id.decode() or None):  # logs and incident timelines name the request
            return await self._process(Batch.model_validate_json(body), first_ref)

    @tracing.traced("ingest")
    async def _process(self, batch: Batch, first_ref: int | None) -> IngestResult:
        now = time.time()
        if first_ref is None:
            first_ref = await self._index.new_doc_refs(2 * len(batch.exchanges))
        decoded = [decode_exchange(ex, i, self.limits) for i, ex in enumerate(batch.exchanges)]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, ex in enumerate(batch.exchanges):
            groups[ex.key_id].append(i)
        accepted = duplicates = findings = 0
        for ns, positions in groups.items():
            a, d, f = await self._ingest_group(ns, batch, decoded, positions, first_ref, now)
            accepted, duplicates, findings = accepted + a, duplicates + d, findings + f
        return IngestResult(accepted=accepted, duplicates=duplicates, findings=findings, processed=True)

    async def _ingest_group(
        self,
        ns: str,
        batch: Batch,
        decoded: list[tuple[Decoded, Decoded]],
        positions: list[int],
        first: int,
        now: float,
    ) -> tuple[int, int, int]:
        exchanges = [batch.exchanges[i] for i in positions]
        keys = [_idempotency_key(ex) for ex in exchanges]
        done = await self._index.done(keys, now)
        fresh = [(i, ex) for i, ex, d in zip(positions, exchanges, done, strict=True) if not d]
        duplicates = len(exchanges) - len(fresh)
        metrics.EXCHANGES_DUPLICATE.inc(duplicates)
        if not fresh:
            return 0, duplicates, 0
        tenants = await self._index.tenant_refs(sorted({ex.tenant for _, ex in fresh}))
        docs: list[Doc] = []
        metas: dict[int, DocMeta] = {}
        for i, ex in fresh:
            prompt, response = decoded[i]
            context = {k: v for k, v in ex.meta.model_dump().items() if v is not None}
            context.setdefault("prompt_tokens", prompt.token_count)
            for ref, kind, text in ((first + 2 * i, Kind.PROMPT, prompt), (first + 2 * i + 1, Kind.RESPONSE, response)):
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
        await self._index.put_docs(ns, metas, now)
        with metrics.MATCH_DURATION.time():
            hits = await self._index.insert(ns, docs, now)
            drafts = await self._matcher.evaluate(ns, docs, metas, hits, now)
        created = 0
        if drafts:
            # Database down: held in the outbox and written later (service/ingest/outbox.py).
            changed = await self._writer.write(drafts)
            created = len(drafts) if changed is None else len(changed)
        await self._index.mark_done([_idempotency_key(ex) for _, ex in fresh], now)
        metrics.EXCHANGES_INGESTED.inc(len(fresh))
        for i, _ in fresh:
            metrics.record_exchange(metas[first + 2 * i], now)
        for doc in docs:
            metrics.FINGERPRINTS_INGESTED.labels(kind_name(doc.kind)).inc(len(doc.values))
        return len(fresh), duplicates, created
