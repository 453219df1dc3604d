"""Cross-matching: from the index's hits to scored findings.

Hits only say *where to look*. Each candidate response is then re-evaluated from the index as
it is now (``lookup``), so the result does not depend on which side of a leak arrived first or
on which replica saw which part: evaluating twice gives the same or a larger finding, never two.

Per response fingerprint, in this order: allowlisted -> blind; a canary's -> evidence for that
canary, whatever else holds it; common (many tenants) -> blind; in one of the recipient's own
prompts (self-echo) -> blind; else evidence for every other tenant that sent it, before it was
served it, in a prompt no later than the longest request after this one, or that was served it in
a response before this one (a decode GPU's pages hold generated tokens too). A response pair is
judged in one direction only, from the earlier to the later, so one copy is one finding; and text
the recipient was itself served before is no evidence that it came from another tenant's answer
(stock answers), though it still is from another tenant's prompt.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.encoding import to_signed
from bleedwatch.fingerprint.scheme import Params
from bleedwatch.limits import DEFAULT_MAX_FINGERPRINTS_PER_TEXT
from service import metrics, tracing
from service.findings.draft import FindingDraft
from service.index.base import PROMPT_BIT, Doc, DocMeta, Entry, Hit, Index, Kind, Lookup, kind_name, sends
from service.matching.evidence import (
    STRETCH_TOKENS,
    Budget,
    Copy,
    Match,
    Response,
    Spans,
    Thresholds,
    coverage,
    evaluate,
    every_piece,
    holes,
    is_finding,
    least_matches,
    longest,
    merged,
    outside,
    pieces,
    severity,
    stretches,
    widest_gap,
    within,
)
from service.matching.known import Known, KnownFingerprints

log = logging.getLogger(__name__)

CANARY_PARAMS = Params(sample_mod=1)
# Earlier responses a batch may have judged again: fingerprints looked up per fingerprint of the batch,
# beyond one text of the largest size a gateway may send (``Matcher._earlier``).
LOOKUPS_PER_FINGERPRINT = 16
# Earlier responses are read from the index this many at a time, most shared fingerprints first.
EARLIER_CHUNK = 64


@dataclass(frozen=True, slots=True)
class Source:
    """Where matched text came from: an indexed document, or a registered canary (negative ref)."""

    tenant: str
    request_id: str
    kind: str
    params: Params
    ts: float = 0.0
    response: bool = False  # a response: a source only of responses served after it
    canary: bool = False


@dataclass(frozen=True, slots=True)
class TenantSource:
    """Matches from a tenant's documents (its ref): evidence that may be shared with other tenants."""

    ref: int

    def __str__(self) -> str:
        return f"tenant:{self.ref}"


@dataclass(frozen=True, slots=True)
class CanarySource:
    """Matches from a registered canary (its id): a finding whatever else holds the text."""

    id: int

    def __str__(self) -> str:
        return f"canary:{self.id}"


# Whose text a response's matches are: the key evidence is gathered and judged by.
MatchSource = TenantSource | CanarySource


@dataclass(frozen=True, slots=True)
class Wanted:
    """A response worth evaluating: its recipient tenant, and when only as a later answer than another.

    ``after``: set when the only reason is an incoming answer sharing text with it: that answer
    may be its source only if it was served first, so it is evaluated only if its own time is
    later than ``after`` (the earliest such incoming answer), which spares re-reading old
    answers each time a new one shares a phrase with them.
    """

    recipient: int
    after: float | None = None
    weight: int = field(default=0, compare=False)  # the most fingerprints one source tenant shares with it


def candidates(docs: list[Doc], hits: list[Hit], needed: dict[bool, int], times: dict[int, float]) -> dict[int, Wanted]:
    """Response doc refs worth evaluating (``times``: the incoming docs' timestamps, by ref).

    Hits count per response and source tenant, and a response is looked up in full only if one
    tenant's text shares as many fingerprints with it as the smallest finding from such a
    source has (``needed``, by whether the source is a prompt: ``evidence.least_matches``). A
    response sharing a few frequent phrases with other tenants, as most do, costs no lookup.
    """
    weight: dict[tuple[int, int, bool], int] = {}  # (response ref, source tenant ref, sent) -> shared
    recipient: dict[int, int] = {}
    after: dict[int, float | None] = {}
    for hit in hits:
        doc = docs[hit.batch_pos]
        pairs: list[tuple[int, int, int, bool, float | None]] = []
        sent = sends(hit.kinds)
        if doc.kind & Kind.RESPONSE:  # an incoming response, hit by another tenant's text
            pairs.append((doc.ref, doc.tenant, hit.tenant, sent, None))
        if not sent:  # another tenant's answer (the first of its documents with the text), hit by incoming text
            answer = bool(doc.kind & Kind.RESPONSE)
            pairs.append((hit.doc, hit.tenant, doc.tenant, not answer, times.get(doc.ref) if answer else None))
        for ref, tenant, source, sent, since in pairs:
            recipient[ref] = tenant
            weight[(ref, source, sent)] = weight.get((ref, source, sent), 0) + hit.count
            known = after.get(ref, since)
            after[ref] = None if known is None or since is None else min(known, since)
    out: dict[int, Wanted] = {}
    for (ref, _, sent), w in weight.items():
        if w >= needed[sent] and (ref not in out or w > out[ref].weight):
            out[ref] = Wanted(recipient[ref], after[ref], w)
    return out


@dataclass(slots=True)
class Candidate:
    """One response to judge: its evidence view and what each tenant (or canary) had of it.

    Matches by ``MatchSource``: ``sent`` in prompts (canaries included),
    ``served`` in answers; ``own``: the recipient's own prompts. ``dropped``: fingerprints
    several other tenants were served (the model's own), by response offset, with their entries.
    ``before``: where the recipient was served the text in an earlier answer, that answer's ref: a
    prompt accepted after it is no source of that text (``_evidence``).
    """

    ref: int
    recipient: int  # the recipient tenant's ref
    meta: DocMeta
    response: Response
    own: list[Match]
    sent: dict[MatchSource, list[Match]]
    served: dict[MatchSource, list[Match]]
    dropped: list[tuple[int, list[Entry]]]
    before: dict[int, int]

    def held(self) -> dict[MatchSource, list[int]]:
        """Per tenant with evidence here, the response offsets where it holds the text on a diagonal of
        its evidence: its matches, and what the model said to it and to others (``dropped``).

        Not evidence, but no hole in a copy of a document that holds it either (``evidence.holes``).
        One pass over ``dropped``, and only for the tenants with evidence.
        """
        out: dict[MatchSource, list[int]] = {}
        lines: dict[int, tuple[set[tuple[int, int]], list[int]]] = {}  # tenant ref -> its diagonals, its offsets
        for key in self.sent.keys() | self.served.keys():
            ms = self.sent.get(key, []) + self.served.get(key, [])
            out[key] = [m.response_offset for m in ms]
            if isinstance(key, TenantSource):
                lines[key.ref] = ({(m.source_doc, m.source_offset - m.response_offset) for m in ms}, out[key])
        for offset, entries in self.dropped:
            for e in entries:
                tenant = lines.get(e.tenant)
                if tenant is not None and (e.doc, e.offset - offset) in tenant[0]:
                    tenant[1].append(offset)
        return out

    def refs(self) -> set[int]:
        every = [self.own, *self.sent.values(), *self.served.values()]
        return {m.source_doc for ms in every for m in ms}


class Matcher:
    def __init__(
        self,
        index: Index,
        known: KnownFingerprints,
        thresholds: Thresholds,
        max_request_seconds: float,
        max_fingerprints_per_text: int = DEFAULT_MAX_FINGERPRINTS_PER_TEXT,
    ) -> None:
        self._largest = max_fingerprints_per_text
        self._index = index
        self._known = known
        self._t = thresholds
        self._lead = max_request_seconds  # how long after an answer a prompt may still be its source (_sent_first)

    @tracing.traced("match")
    async def evaluate(
        self, key_id: str, docs: list[Doc], metas: dict[int, DocMeta], hits: list[Hit], now: float
    ) -> list[FindingDraft]:
        known = await self._known.get(key_id)
        canary_tenants = set(known.canaries.tenants.values())
        if canary_tenants and any(m.tenant in canary_tenants for m in metas.values()):
            metrics.CANARY_LAST_SEEN.set(now)  # the prober's own traffic got through the gateway
        windows = {bool(m.kind & Kind.PROMPT): m.params.w for m in metas.values()}  # one key id: one prompt w
        needed = {sent: least_matches(self._t, windows.get(sent, 1)) for sent in (True, False)}
        wanted = candidates(docs, hits, needed, {ref: m.ts for ref, m in metas.items()})
        for doc in docs:  # canaries are looked for in every response, whatever the index says
            if doc.kind & Kind.RESPONSE and int((known.canaries.find(doc.values) >= 0).sum()) >= self._t.min_matched:
                wanted[doc.ref] = Wanted(doc.tenant)
        found = {ref: metas[ref] for ref in wanted if ref in metas}
        budget = self._largest + LOOKUPS_PER_FINGERPRINT * sum(len(d.values) for d in docs)
        found.update(await self._earlier(key_id, {r: w for r, w in wanted.items() if r not in metas}, budget, now))
        todo = [
            (ref, w.recipient, meta)
            for ref, w in sorted(wanted.items())
            if (meta := found.get(ref)) is not None
            and meta.values is not None
            and meta.offsets is not None  # the others aged out of the window
            and _may_be_later(meta, w)
        ]
        if not todo:
            return []
        # One lookup for all of them: a response's fingerprints spread over most shards, so
        # looking them up together reads each shard's filters once, not once per response.
        values = [meta.values for _, _, meta in todo if meta.values is not None]
        everything = await _lookup_distinct(self._index, key_id, np.concatenate(values), now)
        # Classifying and judging are CPU work: in a thread, so the event loop keeps answering.
        judged = await asyncio.to_thread(_classify_all, todo, everything, known)
        refs = sorted(set().union(*(c.refs() for c in judged)))
        sources = await self._sources(key_id, refs, known, now)
        drafts = await asyncio.to_thread(self._judge_all, key_id, judged, sources)
        return drafts

    async def _earlier(self, key_id: str, wanted: dict[int, Wanted], budget: int, now: float) -> dict[int, DocMeta]:
        """Earlier responses to judge again, most shared fingerprints first, while their fingerprints
        add up to at most ``budget``.

        A prompt sharing 9 fingerprints with an earlier answer makes it a candidate, so a small prompt
        can name thousands of long answers, each looked up in full: a hostile gateway made a prompt
        of 900 fingerprints cost as much as 2,000,000, and each new one cost it again. The batch's
        own responses cost its size; earlier ones are judged up to one text of the largest size plus
        ``LOOKUPS_PER_FINGERPRINT`` per fingerprint of the batch, and the rest are counted
        (``bleedwatch_match_earlier_skipped_total``): honest traffic, whose late prompts are the
        source of a few answers, never comes near it.
        """
        order = sorted(wanted, key=lambda ref: (-wanted[ref].weight, ref))
        out: dict[int, DocMeta] = {}
        for start in range(0, len(order), EARLIER_CHUNK):
            chunk = order[start : start + EARLIER_CHUNK]
            docs = await self._index.get_docs(key_id, chunk, now)
            for i, ref in enumerate(chunk):
                meta = docs.get(ref)
                if meta is None or meta.values is None or not _may_be_later(meta, wanted[ref]):
                    continue
                if len(meta.values) > budget:
                    skipped = len(order) - start - i
                    metrics.MATCH_EARLIER_SKIPPED.inc(skipped)
                    log.warning(
                        "match_earlier_skipped", extra={"key_id": key_id, "responses": skipped, "judged": len(out)}
                    )
                    return out
                budget -= len(meta.values)
                out[ref] = meta
        return out

    def _judge_all(self, key_id: str, judged: list[Candidate], sources: dict[int, Source]) -> list[FindingDraft]:
        drafts = []
        params = _params(sources)
        for candidate in judged:
            budget = Budget()
            draft = self._judge(key_id, candidate, sources, params, budget)
            if budget.cut:
                metrics.MATCH_BUDGET_CUT.inc(budget.cut)
            if draft is not None:
                drafts.append(draft)
        return drafts

    def _judge(
        self, key_id: str, c: Candidate, sources: dict[int, Source], params: dict[int, Params], budget: Budget
    ) -> FindingDraft | None:
        meta = c.meta
        summaries = []
        for key, (_, copied) in _evidence(c, sources, params, budget, self._lead).items():
            if is_finding(copied, self._t):
                good = [x for x in copied if x.score >= self._t.min_score]
                summaries.append(_summarise(key, good, sources, meta.token_count, meta.params.n))
        if not summaries:
            return None
        # Canaries first, then the source whose copies cover most of the response; of equal ones, the
        # source accepted first (lowest ref), never the order entries happened to arrive in.
        summaries.sort(key=lambda s: (not s.canary, -s.coverage, -s.best, s.first_ref, s.tenant))
        top = summaries[0]
        ctx = meta.context
        return FindingDraft(
            key_id=key_id,
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
            longest_run_tokens=top.longest,
            score=top.coverage,
            severity=severity(top.longest, self._t, canary=top.canary),
            evidence={
                "scheme": {"n": meta.params.n, "w": meta.params.w},
                "sources": [s.as_json() for s in summaries],
            },
            matched_values=_matched_values(meta, top.stretches),
            source_ref=top.first_ref,
            response_ref=c.ref,
            recipient_ref=c.recipient,
        )

    async def _again(
        self, key_id: str, ref: int, recipient: int, now: float, held: bool = False
    ) -> tuple[Candidate, list[Lookup], dict[int, Source]] | None:
        """One response classified against the index as it is now, with its sources: for ``confirm``
        (``held``: the second judgment's rules) and the evaluation's diagnoses (``why``, ``judge_again``),
        which ask about a response long after it was judged."""
        meta = (await self._index.get_docs(key_id, [ref], now)).get(ref)
        if meta is None or meta.values is None:
            return None
        known = await self._known.get(key_id)
        lookups = await _lookup_distinct(self._index, key_id, meta.values, now)
        (c,) = await asyncio.to_thread(_classify_all, [(ref, recipient, meta)], lookups, known, held)
        return c, lookups, await self._sources(key_id, sorted(c.refs()), known, now)

    async def judge_again(self, key_id: str, ref: int, recipient: int, now: float) -> FindingDraft | None:
        """What judging one response finds against the index as it is now: the evaluation asks it of every
        finding at the end of its traffic, or a while after it (bench/eval/run.py --judge-again,
        --judge-after), to count those the rest of the window explains (text that became common after the
        finding, say)."""
        again = await self._again(key_id, ref, recipient, now)
        if again is None:
            return None
        c, _, sources = again
        return self._judge(key_id, c, sources, _params(sources), Budget())

    async def confirm(self, key_id: str, ref: int, recipient: int, now: float, source_ref: int | None = None) -> bool:
        """Whether a response is still a finding, judged again after the hold (service/findings/writer.py),
        when the rest of the traffic may have shown its text to be public: several tenants sent it
        since, or an operator allowlisted it. Only that should take a finding back (``_classify``,
        ``again``). A finding whose response, or whose source's first document (``source_ref``), has
        left the window is kept: what it was judged on is no longer there to judge it again."""
        if source_ref is not None and source_ref > 0 and not await self._index.get_docs(key_id, [source_ref], now):
            return True
        again = await self._again(key_id, ref, recipient, now, held=True)
        if again is None:
            return True
        c, _, sources = again
        draft = await asyncio.to_thread(self._judge, key_id, c, sources, _params(sources), Budget())
        return draft is not None

    async def why(self, key_id: str, ref: int, recipient: int, now: float) -> dict[str, str]:
        """Per source tenant, what evaluating one response finds now, step by step: the matcher's own
        steps, for the evaluation's diagnosis of a missed leak (bench/eval/run.py --why-missed)."""
        again = await self._again(key_id, ref, recipient, now)
        if again is None:
            return {}
        c, lookups, sources = again
        raw = {k: len(v) for k, v in c.sent.items()} | {k: len(v) for k, v in c.served.items()}
        out = {}
        for key, (kept, copied) in _evidence(c, sources, _params(sources), Budget(), self._lead).items():
            best = max(copied, key=lambda x: x.score, default=None)
            pieces_ = [] if best is None else [(p.start, p.end, p.fingerprints) for p in best.pieces]
            tenant = next((sources[m.source_doc].tenant for m in kept), str(key))
            score = "-" if best is None else best.score
            around = (
                "" if best is None else _around(c, lookups, kept, recipient, best.pieces[0].start, best.pieces[-1].end)
            )
            out[tenant] = f"{raw.get(key, 0)} matched, {len(kept)} counted, best copy {score}: {pieces_}{around}"
        return out

    async def _sources(self, key_id: str, refs: list[int], known: Known, now: float) -> dict[int, Source]:
        docs = await self._index.get_docs(key_id, [r for r in refs if r > 0], now)
        out = {
            ref: Source(d.tenant, d.request_id, kind_name(d.kind), d.params, d.ts, bool(d.kind & Kind.RESPONSE))
            for ref, d in docs.items()
        }
        for ref in refs:
            if ref < 0:
                cid = -ref
                label = known.canaries.labels[cid]
                out[ref] = Source(known.canaries.tenants[cid], f"canary:{label}", "canary", CANARY_PARAMS, canary=True)
        return out


async def _lookup_distinct(index: Index, key_id: str, values: npt.NDArray[np.uint64], now: float) -> list[Lookup]:
    """``index.lookup`` of each distinct value once, one ``Lookup`` per value in order.

    A sender chooses its values: a response of one value 100,000 times (a model stuck repeating a
    word, or a hostile gateway) would otherwise read the same entries 100,000 times. A lookup is
    read-only, so a value's answer is the same wherever it occurs.
    """
    distinct, at = np.unique(values, return_inverse=True)
    if len(distinct) == len(values):
        return await index.lookup(key_id, values, now)
    found = await index.lookup(key_id, distinct, now)
    return [found[i] for i in at.tolist()]


def _params(sources: dict[int, Source]) -> dict[int, Params]:
    """Each source document's fingerprint parameters, as evidence reads them."""
    return {ref: s.params for ref, s in sources.items()}


def _may_be_later(meta: DocMeta, wanted: Wanted) -> bool:
    """Whether a response wanted only as a later answer than an incoming one (``Wanted.after``) is one."""
    return wanted.after is None or meta.ts > wanted.after


def _may_source(source: Source | None, meta: DocMeta, ref: int, source_ref: int) -> bool:
    """An answer may be the source only of one served after it: a later timestamp, or the same and a later
    arrival (refs grow with it). A source that aged out of the window is no longer known."""
    return source is not None and (source.ts, source_ref) < (meta.ts, ref)


def _sent_first(source: Source, meta: DocMeta, lead: float) -> bool:
    """A prompt may be the source of an answer served before it by at most ``lead`` seconds, the longest
    a request lasts (a request's time is when the gateway saw it, often its end, and its prompt was in
    the pool from its start): a prompt sent later cannot be in the pages the answer was generated from."""
    return source.ts <= meta.ts + lead


def _evidence(
    c: Candidate, sources: dict[int, Source], params: dict[int, Params], budget: Budget, lead: float
) -> dict[MatchSource, tuple[list[Match], list[Copy]]]:
    """Each source's matches that count, and its copies."""
    n = c.meta.params.n
    own = [m for m in c.own if m.source_doc in params]
    # The recipient's own text is blind, and where its matches make a stretch so is all of it:
    # prompts are winnowed, so an echo is known at a few of its fingerprints. Who sent a phrase
    # shorter than a stretch is chance, as for text two tenants sent (below).
    at = np.sort(np.fromiter((m.response_offset for m in own), np.int64, len(own)))
    c.response.blind_within((at, at + 1))
    # Only stretches are asked for: a response of one value repeated makes each of its matches a piece.
    mine = stretches(pieces(own, holes(c.response, own, params), params, n, least=STRETCH_TOKENS))
    # An echo may go on before its first match and past its last as far as its prompt's winnowing hides:
    # those shingles are no one's evidence. But they also hold the tokens around the echo, where a leak
    # may end or begin, and only a match says whose those are: from its first match to its last only is
    # it the recipient's text for sure.
    unseen = widest_gap(own, params)
    echo = (mine[0] - (unseen - 1), mine[1] - n + unseen)
    c.response.blind_within(echo, explains=False)
    c.response.blind_within((mine[0], mine[1] - (n - 1)))
    sent = {k: outside([m for m in ms if m.source_doc in params], echo) for k, ms in c.sent.items()}
    held = c.held()
    found = {
        k: pieces(ms, holes(c.response, ms, params, held[k]), params, n, least=STRETCH_TOKENS)
        for k, ms in sent.items()
        if ms
    }
    stretched = {k: stretches(ps) for k, ps in found.items()}
    theirs = Stretched(stretched)
    # A prompt sent after the answer is no source of it, but still says whose text is no secret (below).
    matches = {}
    for key, ms in sent.items():
        first = [m for m in ms if _sent_first(sources[m.source_doc], c.meta, lead)]  # in params: a known source
        # The recipient was served the text in an answer accepted before that prompt: it had it first.
        first = [m for m in first if m.source_doc < c.before.get(m.response_offset, m.source_doc + 1)]
        if first:
            matches[key] = first
    for key, ms in c.served.items():
        kept = outside([m for m in ms if _may_source(sources.get(m.source_doc), c.meta, c.ref, m.source_doc)], echo)
        # Text another tenant sent came from its prompt, whoever else was served it since. What this
        # tenant sent and was also served (its answer echoing its prompt) stays its evidence: the
        # answer's every shingle is what the prompt's winnowing left out between its matches.
        matches[key] = matches.get(key, []) + theirs.outside_others(kept, key)
    # Text two tenants each sent is neither one's secret: a public notice both pasted, which no allowlist
    # knows yet. Each is then evidence only of what the other did not send.
    tenants: dict[MatchSource, Spans] = {
        k: s for k, s in stretched.items() if isinstance(k, TenantSource) and len(s[0])
    }
    shared = Stretched(tenants) if len(tenants) >= 2 else None
    out = {}
    for key, ms in matches.items():
        response = c.response
        if shared is not None and isinstance(key, TenantSource):
            response = c.response.explained(shared.others(c.response.offsets.astype(np.int64), key))
        out[key] = (ms, evaluate(response, ms, params, budget, held[key]))
    return out


class Stretched:
    """Each source's stretches (``stretches``), to ask which points lie in a stretch of a source other than
    a given one: a served match there is that source's text, and a tenant's evidence there is text
    another tenant sent too (``_evidence``). Each source's spans are merged, so the sources covering a
    point are the starts at or before it less the ends at or before it: one sort, then two binary
    searches per point, whatever the number of sources."""

    def __init__(self, by_source: dict[MatchSource, Spans]) -> None:
        self._by_source = by_source
        self._starts = np.sort(np.concatenate([np.empty(0, np.int64), *(s for s, _ in by_source.values())]))
        self._ends = np.sort(np.concatenate([np.empty(0, np.int64), *(e for _, e in by_source.values())]))

    def others(self, at: npt.NDArray[np.int64], key: MatchSource) -> npt.NDArray[np.bool_]:
        """Which of the response offsets ``at`` lie in a stretch of a source other than ``key``."""
        depth = np.searchsorted(self._starts, at, "right") - np.searchsorted(self._ends, at, "right")
        own = self._by_source.get(key)
        if own is not None:
            depth -= within(at, own)
        out: npt.NDArray[np.bool_] = depth > 0
        return out

    def outside_others(self, matches: list[Match], key: MatchSource) -> list[Match]:
        """The matches in no stretch of a source other than ``key``."""
        if not len(self._starts) or not matches:
            return matches
        at = np.fromiter((m.response_offset for m in matches), np.int64, len(matches))
        return [m for m, x in zip(matches, self.others(at, key).tolist(), strict=True) if not x]


def _classify_all(
    todo: list[tuple[int, int, DocMeta]], everything: list[Lookup], known: Known, again: bool = False
) -> list[Candidate]:
    out = []
    start = 0
    for ref, tenant_ref, meta in todo:
        assert meta.values is not None
        lookups = everything[start : start + len(meta.values)]
        start += len(meta.values)
        out.append(_classify(ref, tenant_ref, meta, lookups, known, again))
    return out


def _classify(
    ref: int, recipient: int, meta: DocMeta, lookups: list[Lookup], known: Known, again: bool = False
) -> Candidate:
    """Each fingerprint of the response: blind, or who had it, in a prompt or in an answer.

    A tenant that was served the text before it sent it (the index's ``SERVED_FIRST_BIT``: a chat
    sends its history, the leaked answer included, in its next turn) is no sender of it: the
    recipient's resend of this very answer is not its own text, another recipient's does not make
    it public.

    ``again``, when judged a second time, after the hold (``Matcher.confirm``): only what has since
    shown the text to be public may take a finding back, never what the leak itself caused. So text
    common because many tenants *hold* it, fewer than ``common_prompt_tenants`` having sent it, is
    not blind: it is evidence of whoever sent it (one prompt leaked into many answers is the
    incident itself), and the rest of the leaked answers, which no one sent, is just not evidence,
    as it was at the first judgment.
    """
    assert meta.values is not None
    assert meta.offsets is not None
    own: list[Match] = []
    sent: dict[MatchSource, list[Match]] = {}
    served: dict[MatchSource, list[Match]] = {}
    dropped: list[tuple[int, list[Entry]]] = []
    before: dict[int, int] = {}
    blind = known.allowed(meta.values)
    canary_pos = known.canaries.find(meta.values)
    for i, (offset, found) in enumerate(zip(meta.offsets.tolist(), lookups, strict=True)):
        if blind[i]:
            continue
        if canary_pos[i] >= 0:
            cid = int(known.canaries.canary_ids[canary_pos[i]])
            if known.canaries.tenants[cid] != meta.tenant:
                source_offset = int(known.canaries.offsets[canary_pos[i]])
                sent.setdefault(CanarySource(cid), []).append(Match(offset, -cid, source_offset))
            continue
        entries = found.entries
        if entries is None:
            if not again or found.senders is None:
                blind[i] = True
                continue  # common: shared by many tenants
            entries = found.senders  # common only by holders: who sent it, if anyone did
        mine = next((e for e in entries if e.tenant == recipient), None)
        others = [e for e in entries if e.tenant != recipient]
        # Self-echo: the recipient sent this text, or sent it back after an earlier answer; not when this
        # answer is the first it had it in (its next turn sending the leak back), nor, judged again
        # after the hold, whatever it sent back since: a second leak of the text it was found with.
        if mine is not None and mine.kinds & PROMPT_BIT and (sends(mine.kinds) or (mine.doc != ref and not again)):
            own.append(Match(offset, mine.doc, mine.offset))
            continue
        senders = [e for e in others if sends(e.kinds)]
        if mine is not None and mine.doc != ref:
            before[offset] = mine.doc
        for e in senders:
            sent.setdefault(TenantSource(e.tenant), []).append(Match(offset, e.doc, e.offset))
        # Text served is another tenant's answer only if one other tenant was served it, and the
        # recipient had not been: what the model says to several tenants, or again, is its own.
        # It is not blind for that: what a prompt of the same stretch shows still counts. A
        # sender of the phrase does not take it here: whose text it is, a stretch decides (_evidence).
        served_to = [e for e in others if not sends(e.kinds)]
        if len(served_to) == 1 and (mine is None or mine.doc == ref):
            e = served_to[0]
            served.setdefault(TenantSource(e.tenant), []).append(Match(offset, e.doc, e.offset))
        elif served_to:
            dropped.append((offset, served_to))
    response = Response(meta.values, meta.offsets, blind, meta.params)
    return Candidate(ref, recipient, meta, response, own, sent, served, dropped, before)


@dataclass(frozen=True, slots=True)
class Summary:
    tenant: str
    canary: bool
    best: int  # the best copy's score
    matched: int
    longest: int
    coverage: float
    request_ids: list[str]
    ranges: list[dict[str, Any]]
    # Response shingle offsets [first, last] of each piece: the stretches a false positive allowlists.
    stretches: tuple[tuple[int, int], ...] = ()
    first_ref: int = 0  # the lowest doc ref among the pieces (negative: a canary)

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "canary": self.canary,
            "request_ids": self.request_ids,
            "matched_fingerprints": self.matched,
            "longest_run_tokens": self.longest,
            "coverage": self.coverage,
            "ranges": self.ranges,
        }


def _summarise(key: MatchSource, copied: list[Copy], sources: dict[int, Source], tokens: int, n: int) -> Summary:
    found = sorted(set(every_piece(copied)), key=lambda p: (p.start, p.source_doc))
    first = sources[found[0].source_doc]
    return Summary(
        tenant=first.tenant,
        canary=isinstance(key, CanarySource),
        best=max(c.score for c in copied),
        matched=sum(p.fingerprints for p in found),
        longest=longest(copied),
        coverage=round(coverage(found, tokens), 4),
        request_ids=sorted({sources[p.source_doc].request_id for p in found}),
        stretches=tuple((p.start, p.end - n) for p in found),
        first_ref=min(p.source_doc for p in found),
        ranges=[  # where each document holds it, not the text several of them make (Piece.own)
            {
                "response": [p.start, p.end],
                "source_request_id": sources[p.source_doc].request_id,
                "source_kind": sources[p.source_doc].kind,
                "source": [p.source_start, p.source_end],
                "fingerprints": p.fingerprints,
            }
            for p in (q.own or q for q in found)
        ],
    )


def _matched_values(meta: DocMeta, stretches: tuple[tuple[int, int], ...]) -> list[int]:
    """Every fingerprint of the response inside the copied stretches, signed: the text itself, whoever
    else holds parts of it (marked a false positive, all of it is allowlisted)."""
    assert meta.values is not None
    assert meta.offsets is not None
    inside = within(meta.offsets, merged((first, last + 1) for first, last in stretches))
    return to_signed(np.unique(meta.values[inside]))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _around(c: Candidate, lookups: list[Lookup], kept: list[Match], recipient: int, lo: int, hi: int) -> str:
    """One letter per response fingerprint near a copy, for ``why``: counted (#), blind (b), in the
    recipient's own prompt (o), another tenant's (x), no other tenant's (.): the response itself is in
    the index, so every fingerprint is the recipient's at least."""
    counted = {m.response_offset for m in kept}
    own = {m.response_offset for m in c.own}
    letters = []
    for i, offset in enumerate(c.meta.offsets.tolist() if c.meta.offsets is not None else []):
        if lo - 8 <= offset < hi + 8:
            entries = lookups[i].entries
            others = entries is not None and any(e.tenant != recipient for e in entries)
            letter = (
                "#"
                if offset in counted
                else "b"
                if c.response.blind[i]
                else "o"
                if offset in own
                else "."
                if not others
                else "x"
            )
            letters.append(letter)
    return f"; from {lo - 8}: {''.join(letters)}"
