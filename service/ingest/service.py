"""The one path of an exchange: validate, dedupe, index, cross-match, store findings.

A batch is answered 202 only after all of it is indexed and its findings are committed (or,
with the database unreachable, held in the outbox: service/ingest/outbox.py); an idempotency
mark per (tenant, request id) is written last, so a batch retried after any failure is
re-processed, and re-processing is harmless (the index keeps one entry per tenant, findings
are upserts).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics, tracing
from service.auth.keys import Caller
from service.errors import Forbidden
from service.fingerprint.scheme import Params
from service.index.base import Doc, DocMeta, Index, Kind, kind_name
from service.ingest.decode import Decoded, Limits, check_batch, decode_exchange
from service.ingest.outbox import FindingsWriter
from service.ingest.schemas import Batch, Exchange, IngestResult
from service.matching.matcher import Matcher

log = logging.getLogger(__name__)


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
    ) -> None:
        self._index = index
        self._matcher = matcher
        self._sessions = sessions
        self.limits = limits
        self._writer = writer or FindingsWriter(sessions, index.outbox())

    @tracing.traced("ingest")
    async def ingest(self, batch: Batch, caller: Caller) -> IngestResult:
        now = time.time()
        check_batch(batch, self.limits, now)
        if caller.tenants is not None:
            for i, ex in enumerate(batch.exchanges):
                if ex.tenant not in caller.tenants:
                    raise Forbidden(f"exchanges[{i}].tenant: this API key may not report for that tenant")
        decoded = [decode_exchange(ex, i, self.limits) for i, ex in enumerate(batch.exchanges)]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, ex in enumerate(batch.exchanges):
            groups[ex.key_id].append(i)
        accepted = duplicates = findings = 0
        for ns, positions in groups.items():
            a, d, f = await self._ingest_group(ns, batch, decoded, positions, now)
            accepted, duplicates, findings = accepted + a, duplicates + d, findings + f
        return IngestResult(accepted=accepted, duplicates=duplicates, findings=findings)

    async def _ingest_group(
        self, ns: str, batch: Batch, decoded: list[tuple[Decoded, Decoded]], positions: list[int], now: float
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
        first = await self._index.new_doc_refs(2 * len(fresh))
        docs: list[Doc] = []
        metas: dict[int, DocMeta] = {}
        for j, (i, ex) in enumerate(fresh):
            prompt, response = decoded[i]
            context = {k: v for k, v in ex.meta.model_dump().items() if v is not None}
            context.setdefault("prompt_tokens", prompt.token_count)
            for ref, kind, text in ((first + 2 * j, Kind.PROMPT, prompt), (first + 2 * j + 1, Kind.RESPONSE, response)):
                docs.append(Doc(ref, tenants[ex.tenant], kind, text.values, text.offsets))
                metas[ref] = DocMeta(
                    tenant=ex.tenant,
                    request_id=ex.request_id,
                    kind=kind,
                    model=ex.model,
                    ts=ex.ts.timestamp(),
                    token_count=text.token_count,
                    context=context,
                    params=Params(ex.scheme.n, ex.scheme.w, ex.scheme.sample_after, ex.scheme.sample_mod),
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
        for j in range(len(fresh)):
            metrics.record_exchange(metas[first + 2 * j], now)
        for doc in docs:
            metrics.FINGERPRINTS_INGESTED.labels(kind_name(doc.kind)).inc(len(doc.values))
        return len(fresh), duplicates, created
