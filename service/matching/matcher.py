"""Cross-matching: from the index's hits to scored findings.

Hits only say *where to look*. Each candidate response is then re-evaluated from the index as
it is now (``lookup``), so the result does not depend on which side of a leak arrived first or
on which replica saw which part: evaluating twice gives the same or a larger finding, never two.

Per response fingerprint, in this order: allowlisted -> ignored; a canary's -> evidence for
that canary, whatever else holds it; common (many tenants) -> ignored; in one of the
recipient's own prompts (self-echo) -> ignored; else evidence for every other tenant that had it
in a prompt. Other tenants' responses are never a source: identical stock answers are common,
and what a KV leak carries is derived from the victim's prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from service import metrics, tracing
from service.fingerprint.encoding import to_signed
from service.fingerprint.scheme import Params
from service.index.base import Doc, DocMeta, Hit, Index, Kind, Lookup, kind_name
from service.matching.evidence import (
    Match,
    Run,
    Thresholds,
    copies,
    coverage,
    every_shingle,
    holes,
    is_finding,
    longest,
    scored_runs,
    severity,
)
from service.matching.known import Known, KnownFingerprints

CANARY_PARAMS = Params(sample_mod=1)


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
    # The response's fingerprints that matched the top source, signed int64 (what a false positive allowlists).
    matched_values: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Source:
    """Where matched text came from: an indexed document, or a registered canary (negative ref)."""

    tenant: str
    request_id: str
    kind: str
    params: Params
    canary: bool = False


def candidates(docs: list[Doc], hits: list[Hit], min_matched: int) -> dict[int, int]:
    """Response doc refs worth evaluating, with the recipient tenant ref of each.

    A finding needs ``min_matched`` fingerprints from one source tenant, so hits count per
    response and source tenant: a response sharing one frequent phrase each with two tenants'
    prompts is not worth a lookup of all its fingerprints (in chat traffic, most would be).
    """
    weight: dict[tuple[int, int], int] = {}  # (response ref, source tenant ref) -> shared fingerprints
    recipient: dict[int, int] = {}
    for hit in hits:
        doc = docs[hit.batch_pos]
        if doc.kind & Kind.RESPONSE:  # an incoming response, hit by another tenant's prompt
            pair = (doc.ref, hit.tenant)
            recipient[doc.ref] = doc.tenant
        elif hit.kinds == Kind.RESPONSE:  # an incoming prompt, hitting another tenant's response
            pair = (hit.doc, doc.tenant)
            recipient[hit.doc] = hit.tenant
        else:
            continue
        weight[pair] = weight.get(pair, 0) + hit.count
    return {ref: recipient[ref] for (ref, _), w in weight.items() if w >= min_matched}


class Matcher:
    def __init__(self, index: Index, known: KnownFingerprints, thresholds: Thresholds, exact: Thresholds) -> None:
        """``exact`` judges responses fingerprinted with every shingle (w = 1): their runs have
        their true length, where winnowing's fall short of it, so they need other thresholds."""
        self._index = index
        self._known = known
        self._t = thresholds
        self._exact = exact

    @tracing.traced("match")
    async def evaluate(
        self, ns: str, docs: list[Doc], metas: dict[int, DocMeta], hits: list[Hit], now: float
    ) -> list[FindingDraft]:
        known = await self._known.get(ns)
        canary_tenants = set(known.canaries.tenants.values())
        if canary_tenants and any(m.tenant in canary_tenants for m in metas.values()):
            metrics.CANARY_LAST_SEEN.set(now)  # the prober's own traffic got through the gateway
        wanted = candidates(docs, hits, self._t.min_matched)
        for doc in docs:  # canaries are looked for in every response, whatever the index says
            if doc.kind & Kind.RESPONSE and int((known.canaries.find(doc.values) >= 0).sum()) >= self._t.min_matched:
                wanted[doc.ref] = doc.tenant
        found = {ref: metas[ref] for ref in wanted if ref in metas}
        found.update(await self._index.get_docs(ns, [ref for ref in wanted if ref not in metas], now))
        todo = [
            (tenant_ref, meta, meta.values)
            for ref, tenant_ref in sorted(wanted.items())
            if (meta := found.get(ref)) is not None and meta.values is not None and meta.offsets is not None
        ]  # the others aged out of the window
        if not todo:
            return []
        # One lookup for all of them: a response's fingerprints spread over most shards, so
        # looking them up together reads each shard's filters once, not once per response.
        everything = await self._index.lookup(ns, np.concatenate([values for _, _, values in todo]), now)
        drafts = []
        start = 0
        for tenant_ref, meta, values in todo:
            lookups = everything[start : start + len(values)]
            start += len(values)
            draft = await self._evaluate(ns, tenant_ref, meta, lookups, known, now)
            if draft is not None:
                drafts.append(draft)
        return drafts

    async def _evaluate(
        self, ns: str, recipient: int, meta: DocMeta, lookups: list[Lookup], known: Known, now: float
    ) -> FindingDraft | None:
        assert meta.values is not None
        assert meta.offsets is not None
        t = self._exact if every_shingle(meta.params) else self._t
        matches: dict[tuple[str, int], list[Match]] = {}  # by ("tenant", ref) or ("canary", id)
        allowed = known.allowed(meta.values)
        canary_pos = known.canaries.find(meta.values)
        counted = ~allowed  # fingerprints that could be evidence (for run purity)
        for i, (offset, found) in enumerate(zip(meta.offsets.tolist(), lookups, strict=True)):
            if allowed[i]:
                continue
            if canary_pos[i] >= 0:
                cid = int(known.canaries.canary_ids[canary_pos[i]])
                if known.canaries.tenants[cid] != meta.tenant:
                    source_offset = int(known.canaries.offsets[canary_pos[i]])
                    matches.setdefault(("canary", cid), []).append(Match(offset, -cid, source_offset))
                continue
            if found.entries is None:
                counted[i] = False
                continue  # common: shared by many tenants
            if any(e.tenant == recipient and e.kinds & Kind.PROMPT for e in found.entries):
                counted[i] = False
                continue  # self-echo: the recipient sent this text itself
            for e in found.entries:
                if e.tenant != recipient and e.kinds & Kind.PROMPT:  # leaks come from prompts
                    matches.setdefault(("tenant", e.tenant), []).append(Match(offset, e.doc, e.offset))
        if not matches:
            return None
        sources = await self._sources(ns, matches, known, now)
        blind = meta.offsets[~counted].tolist()  # common, allowlisted, self-echo: unseen by every source
        params = {doc: s.params for doc, s in sources.items()}
        summaries = []
        for ms in matches.values():
            kept = [m for m in ms if m.source_doc in sources]
            found_runs = scored_runs(kept, meta.values, meta.offsets, counted, meta.params, params, t)
            gaps = holes(meta.values, meta.offsets, counted, kept, params)
            copied = copies(found_runs, t, meta.params.n, meta.params.w, gaps, blind)
            if kept and is_finding(copied, t):
                summaries.append(_summarise(kept, found_runs, longest(copied), sources, meta.token_count))
        if not summaries:
            return None
        # Canaries first, then the source with the most evidence.
        summaries.sort(key=lambda s: (s.canary, s.matched, s.longest), reverse=True)
        top = summaries[0]
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
            severity=severity(top.longest, t, canary=top.canary),
            evidence={
                "scheme": {"n": meta.params.n, "w": meta.params.w},
                "sources": [s.as_json() for s in summaries],
            },
            matched_values=_matched_values(meta, top.offsets),
        )

    async def _sources(
        self, ns: str, matches: dict[tuple[str, int], list[Match]], known: Known, now: float
    ) -> dict[int, Source]:
        refs = sorted({m.source_doc for ms in matches.values() for m in ms})
        docs = await self._index.get_docs(ns, [r for r in refs if r > 0], now)
        out = {ref: Source(d.tenant, d.request_id, kind_name(d.kind), d.params) for ref, d in docs.items()}
        for ref in refs:
            if ref < 0:
                cid = -ref
                label = known.canaries.labels[cid]
                out[ref] = Source(known.canaries.tenants[cid], f"canary:{label}", "canary", CANARY_PARAMS, True)
        return out


@dataclass(frozen=True, slots=True)
class Summary:
    tenant: str
    canary: bool
    matched: int
    longest: int
    coverage: float
    request_ids: list[str]
    ranges: list[dict[str, Any]]
    offsets: tuple[int, ...] = ()  # response token offsets of the matched fingerprints (not in evidence)

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "canary": self.canary,
            "request_ids": self.request_ids,
            "matched_fingerprints": self.matched,
            "longest_run_words": self.longest,
            "coverage": self.coverage,
            "ranges": self.ranges,
        }


def _summarise(
    matches: list[Match], found: list[Run], longest_copy: int, sources: dict[int, Source], tokens: int
) -> Summary:
    first = sources[found[0].source_doc]
    return Summary(
        tenant=first.tenant,
        canary=first.canary,
        matched=len(matches),
        longest=longest_copy,
        coverage=round(coverage(found, tokens), 4),
        request_ids=sorted({sources[r.source_doc].request_id for r in found}),
        offsets=tuple(m.response_offset for m in matches),
        ranges=[
            {
                "response": [r.start, r.end],
                "source_request_id": sources[r.source_doc].request_id,
                "source_kind": sources[r.source_doc].kind,
                "source": [r.source_start, r.source_end],
                "fingerprints": r.fingerprints,
                "purity": round(r.purity, 3),
            }
            for r in found
        ],
    )


def _matched_values(meta: DocMeta, offsets: tuple[int, ...]) -> list[int]:
    assert meta.values is not None
    assert meta.offsets is not None
    matched = np.isin(meta.offsets, np.array(offsets, dtype=np.uint32))
    return to_signed(np.unique(meta.values[matched]))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
