"""Cross-matching: from the index's hits to scored findings.

Hits only say *where to look*. Each candidate response is then re-evaluated from the index as
it is now (``lookup``), so the result does not depend on which side of a leak arrived first or
on which replica saw which part: evaluating twice gives the same or a larger finding, never two.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.index.base import Doc, DocMeta, Hit, Index, Kind, kind_name
from service.matching.evidence import (
    Match,
    Run,
    Thresholds,
    coverage,
    is_finding,
    runs,
    severity,
)


@dataclass(frozen=True, slots=True)
class FindingDraft:
    key_id: str
    recipient_tenant: str
    recipient_request_id: str
    source_tenant: str
    source_request_ids: list[str]
    response_at: datetime
    model: str
    deployment: str | None
    node: str | None
    prompt_tokens: int | None
    response_tokens: int
    matched_fingerprints: int
    longest_run_words: int
    score: float
    severity: str
    evidence: dict[str, Any]


def candidates(docs: list[Doc], hits: list[Hit], min_matched: int) -> dict[int, int]:
    """Response doc refs worth evaluating, with the recipient tenant ref of each."""
    weight: dict[int, int] = {}
    recipient: dict[int, int] = {}
    for hit in hits:
        doc = docs[hit.batch_pos]
        if doc.kind & Kind.RESPONSE:
            weight[doc.ref] = weight.get(doc.ref, 0) + hit.count
            recipient[doc.ref] = doc.tenant
        if hit.kinds == Kind.RESPONSE:
            weight[hit.doc] = weight.get(hit.doc, 0) + hit.count
            recipient[hit.doc] = hit.tenant
    return {ref: recipient[ref] for ref, w in weight.items() if w >= min_matched}


class Matcher:
    def __init__(self, index: Index, thresholds: Thresholds) -> None:
        self._index = index
        self._t = thresholds

    async def evaluate(
        self, ns: str, docs: list[Doc], metas: dict[int, DocMeta], hits: list[Hit], now: float
    ) -> list[FindingDraft]:
        wanted = candidates(docs, hits, self._t.min_matched)
        known = {ref: metas[ref] for ref in wanted if ref in metas}
        known.update(await self._index.get_docs(ns, [ref for ref in wanted if ref not in metas], now))
        drafts = []
        for ref, tenant_ref in sorted(wanted.items()):
            meta = known.get(ref)
            if meta is None or meta.values is None or meta.offsets is None:
                continue  # the response aged out of the window
            draft = await self._evaluate(ns, tenant_ref, meta, now)
            if draft is not None:
                drafts.append(draft)
        return drafts

    async def _evaluate(self, ns: str, recipient: int, meta: DocMeta, now: float) -> FindingDraft | None:
        assert meta.values is not None
        assert meta.offsets is not None
        t = self._t
        by_source: dict[int, list[Match]] = {}
        lookups = await self._index.lookup(ns, meta.values, now)
        for offset, found in zip(meta.offsets.tolist(), lookups, strict=True):
            if found.entries is None:
                continue  # common: shared by many tenants
            if any(e.tenant == recipient and e.kinds & Kind.PROMPT for e in found.entries):
                continue  # self-echo: the recipient sent this text itself
            for e in found.entries:
                if e.tenant != recipient:
                    by_source.setdefault(e.tenant, []).append(Match(offset, e.doc, e.offset))
        scored = []
        for source, matches in by_source.items():
            found_runs = runs(matches, t)
            longest = max(r.tokens for r in found_runs)
            if is_finding(len(matches), longest, t):
                scored.append((len(matches), longest, source, found_runs))
        if not scored:
            return None
        scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
        source_docs = await self._index.get_docs(ns, sorted({r.source_doc for s in scored for r in s[3]}), now)
        sources = [
            summary
            for matched, longest, _, found_runs in scored
            if (summary := _summarise(matched, longest, found_runs, source_docs, meta.token_count)) is not None
        ]
        if not sources:
            return None  # every source doc aged out between lookup and now
        top = sources[0]
        ctx = meta.context
        return FindingDraft(
            key_id=ns,
            recipient_tenant=meta.tenant,
            recipient_request_id=meta.request_id,
            source_tenant=top.tenant,
            source_request_ids=top.request_ids,
            response_at=datetime.fromtimestamp(meta.ts, UTC),
            model=meta.model,
            deployment=_str(ctx.get("deployment")),
            node=_str(ctx.get("node")),
            prompt_tokens=_int(ctx.get("prompt_tokens")),
            response_tokens=meta.token_count,
            matched_fingerprints=top.matched,
            longest_run_words=top.longest,
            score=top.coverage,
            severity=severity(top.longest, t),
            evidence={"scheme": {"n": t.n, "w": t.w}, "sources": [src.as_json() for src in sources]},
        )


@dataclass(frozen=True, slots=True)
class SourceSummary:
    tenant: str
    matched: int
    longest: int
    coverage: float
    request_ids: list[str]
    ranges: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "request_ids": self.request_ids,
            "matched_fingerprints": self.matched,
            "longest_run_words": self.longest,
            "coverage": self.coverage,
            "ranges": self.ranges,
        }


def _summarise(
    matched: int, longest: int, found: list[Run], docs: dict[int, DocMeta], response_tokens: int
) -> SourceSummary | None:
    kept = [r for r in found if r.source_doc in docs]
    if not kept:
        return None
    ranges = [
        {
            "response": [r.start, r.end],
            "source_request_id": docs[r.source_doc].request_id,
            "source_kind": kind_name(docs[r.source_doc].kind),
            "source": [r.source_start, r.source_end],
            "fingerprints": r.fingerprints,
        }
        for r in kept
    ]
    return SourceSummary(
        tenant=docs[kept[0].source_doc].tenant,
        matched=matched,
        longest=longest,
        coverage=round(coverage(found, response_tokens), 4),
        request_ids=sorted({docs[r.source_doc].request_id for r in kept}),
        ranges=ranges,
    )


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
