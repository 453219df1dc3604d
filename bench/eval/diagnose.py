"""Why each missed leak was missed: the matcher's steps replayed for the true source, stage by stage.

Run after the replay, against the live index (``run.py --why-missed``): the harness has both
texts, so it can fingerprint them again with the same key and ask the index what it holds for
every fingerprint of the recipient's response. The steps are those of ``Matcher._evaluate``,
restricted to the leak's source tenant; the first one that leaves too little is the cause:

- ``scheme``: fewer than ``min_matched`` fingerprints of the leaked text are fingerprints of the
  source prompt at all (a fingerprint is a winnowed shingle of n tokens: a perturbation that
  changes a token every few tokens, or a fragment shorter than n + w, leaves none);
- ``sampled``: there would be enough without the source's long-context sampling;
- ``allowlisted`` / ``common`` / ``self-echo``: the index or the allowlist removed enough of
  them (the reason that removed most is named);
- ``purity``: runs formed, but none is pure enough (``_no_holes``);
- ``chain``: runs without holes, enough of them together, but not joined into one chain;
- ``min run tokens`` / ``min matched``: the best chain is too short / has one fingerprint;
- ``found now``: the replayed steps find it on the index as it is at the end (the service
  evaluated at a different time, or named another source tenant).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.eval.traffic import PERTURBATIONS, Leak, Traffic, wire
from bench.service import Running
from service.app import make_index, thresholds
from service.config import Settings
from service.fingerprint.scheme import Params, fingerprint_text, key_id
from service.fingerprint.tokens import tokenize
from service.index.base import Index, Kind
from service.matching.evidence import Match, Thresholds, chains, copies, every_shingle, holes, is_finding, scored_runs

CAUSES = (
    "scheme",
    "sampled",
    "allowlisted",
    "common",
    "self-echo",
    "purity",
    "chain",
    "min run tokens",
    "min matched",
    "found now",
)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    leak: Leak
    cause: str
    in_source: int  # fingerprints of the leaked text that the source prompt has (as sent)
    kept: int  # ... of which the index still counts as evidence from the source tenant
    detail: str


def _region(words: list[str], at: int, length: int) -> tuple[int, int]:
    start = len(tokenize(" ".join(words[:at])))
    return start, start + len(tokenize(" ".join(words[at : at + length])))


async def _diagnose(
    index: Index,
    ns: str,
    leak: Leak,
    texts: dict[str, dict[str, Any]],
    key: bytes,
    params: Params,
    allowlist: np.ndarray[Any, np.dtype[np.uint64]],
    refs: dict[str, int],
    t: Thresholds,
) -> Diagnosis:
    recipient, source = texts[leak.recipient_request], texts[leak.source_request]
    response = fingerprint_text(recipient["response"], key, params)
    prompt = fingerprint_text(source["prompt"], key, params)
    unsampled = fingerprint_text(source["prompt"], key, replace(params, sample_mod=1))
    a, b = _region(recipient["response_words"], leak.at, leak.words)
    n = params.n
    region = (response.offsets >= a) & (response.offsets.astype(np.int64) + n <= b)
    values = response.values
    in_source = region & np.isin(values, prompt.values)
    in_unsampled = region & np.isin(values, unsampled.values)
    lookups = await index.lookup(ns, values, time.time())
    allowed = np.isin(values, allowlist)
    counted = ~allowed
    src, me = refs[leak.source_tenant], refs[leak.recipient_tenant]
    removed: Counter[str] = Counter()
    matches: list[Match] = []
    for i, (offset, found) in enumerate(zip(response.offsets.tolist(), lookups, strict=True)):
        reason = None
        if allowed[i]:
            reason = "allowlisted"
        elif found.entries is None:
            counted[i], reason = False, "common"
        elif any(e.tenant == me and e.kinds & Kind.PROMPT for e in found.entries):
            counted[i], reason = False, "self-echo"
        else:
            for e in found.entries:
                if e.tenant == src and e.kinds & Kind.PROMPT:
                    matches.append(Match(offset, e.doc, e.offset))
        if reason and in_source[i]:
            removed[reason] += 1
    kept = sum(1 for m in matches if a <= m.response_offset and m.response_offset + n <= b)
    shared = int(in_source.sum())

    def done(cause: str, detail: str = "") -> Diagnosis:
        return Diagnosis(leak, cause, shared, kept, detail)

    if int(in_unsampled.sum()) < t.min_matched:
        return done("scheme", f"region tokens {b - a}, response fps in region {int(region.sum())}")
    if shared < t.min_matched:
        return done("sampled", f"unsampled {int(in_unsampled.sum())}")
    if kept < t.min_matched:
        return done(removed.most_common(1)[0][0] if removed else "min matched", str(dict(removed)))
    metas = await index.get_docs(ns, sorted({m.source_doc for m in matches}), time.time())
    matches = [m for m in matches if m.source_doc in metas]
    sources = {d: m.params for d, m in metas.items()}
    found_runs = scored_runs(matches, values, response.offsets, counted, params, sources, t)
    detail = " ".join(
        f"[{r.start}-{r.end} fp={r.fingerprints} p={r.purity:.2f} src={r.source_doc}:{r.source_start}]"
        for r in found_runs
    )
    detail = f"region {a}-{b} removed {dict(removed)} runs {detail}"
    gaps = holes(values, response.offsets, counted, matches, sources)
    blind = response.offsets[~counted].tolist()
    if is_finding(copies(found_runs, t, n, params.w, gaps, blind), t):
        return done("found now", detail)
    if is_finding(chains(found_runs, n, params.w, gaps, blind), t):
        return done("purity", detail)
    inside = [r for r in found_runs if r.end > a and r.start < b]
    if is_finding([inside], t):
        return done("chain", detail)
    if sum(r.fingerprints for r in inside) >= t.min_matched:
        return done("min run tokens", detail)
    return done("min matched", detail)


async def why_missed(
    service: Running, traffic: Traffic, missed: list[Leak], key: bytes, params: Params, public: list[str]
) -> list[Diagnosis]:
    settings = Settings(redis_url=service.redis_url, key_prefix=service.env["BLEEDWATCH_KEY_PREFIX"])
    index = make_index(settings)
    t = thresholds(settings, exact=every_shingle(params))  # as the matcher chooses
    allowlist = np.unique(
        np.concatenate([fingerprint_text(text, key, replace(params, sample_mod=1)).values for text in public])
    )
    wanted = {leak.recipient_request for leak in missed} | {leak.source_request for leak in missed}
    texts = {
        ex.request_id: wire(ex) | {"response_words": ex.response} for ex in traffic.order if ex.request_id in wanted
    }
    try:
        refs = await index.tenant_refs(sorted({ex.tenant for ex in traffic.order}))
        ns = key_id(key, params)
        return [await _diagnose(index, ns, leak, texts, key, params, allowlist, refs, t) for leak in missed]
    finally:
        await index.close()


def table(diagnoses: list[Diagnosis], spans: tuple[int, ...]) -> str:
    """Cause -> count, per span and perturbation (a markdown table per span)."""
    lines = []
    for span in spans:
        cells: dict[str, Counter[str]] = defaultdict(Counter)
        for d in diagnoses:
            if d.leak.span == span:
                cells[d.cause][d.leak.perturbation] += 1
        if not cells:
            continue
        lines += [
            f"missed leaks of {span} words, by cause and perturbation:",
            "| cause | " + " | ".join(PERTURBATIONS) + " | all |",
            "|---|" + "---:|" * (len(PERTURBATIONS) + 1),
        ]
        for cause in CAUSES:
            if cause in cells:
                row = cells[cause]
                lines.append(
                    f"| {cause} | " + " | ".join(str(row[k]) for k in PERTURBATIONS) + f" | {sum(row.values())} |"
                )
        lines.append("")
    return "\n".join(lines)
