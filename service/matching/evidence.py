"""From matched fingerprints to evidence a responder can act on: runs, coverage, severity.

Pure functions over offsets, so scoring is tested without any backend. docs/detection.md gives
the reasoning and the measured effect of each threshold.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from service.fingerprint.scheme import Params

# Consecutive matches of one run may be this many tokens apart: a changed word costs n shingles,
# and shingles shared with many tenants (common) are left out, which can leave longer gaps.
# Staying on one diagonal (below) is what keeps unrelated matches apart, not the gap.
GAP_TOKENS = 64
# ... and the source may drift by this many tokens against the response (inserted or dropped words).
SHIFT_TOLERANCE = 8
# A run of this many matched fingerprints needs only this purity (see _no_holes); with every
# shingle (w = 1) a run's holes are exact, and ``Thresholds.long_run_purity`` is higher.
LONG_RUN_FINGERPRINTS = 6
LONG_RUN_PURITY = 0.5


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_matched: int
    min_run_tokens: int
    min_purity: float
    high_run_tokens: int
    critical_run_tokens: int
    # A copy of several runs needs one with at least this many fingerprints (1 = any chain counts).
    chain_run_fingerprints: int = 1
    # What a run of ``LONG_RUN_FINGERPRINTS`` or more needs instead of ``min_purity``.
    long_run_purity: float = LONG_RUN_PURITY


def every_shingle(params: Params) -> bool:
    """Fingerprinted with w = 1: a run has its copy's true length, and ``Thresholds`` of their own judge it."""
    return params.w == 1


@dataclass(frozen=True, slots=True)
class Match:
    """One recipient fingerprint found in a source document."""

    response_offset: int
    source_doc: int
    source_offset: int


@dataclass(frozen=True, slots=True)
class Run:
    """Tokens ``[start, end)`` of the response matched ``[source_start, source_end)`` of one source doc."""

    start: int
    end: int
    source_doc: int
    source_start: int
    source_end: int
    fingerprints: int
    purity: float = 1.0
    # The response offsets of its matches, for splitting a run with holes (``pure_runs``).
    matched: tuple[int, ...] = field(default=(), compare=False, repr=False)

    @property
    def tokens(self) -> int:
        return self.end - self.start


def _stride(params: Params, offset: int) -> int:
    """How far apart consecutive fingerprints of a shared run may be at ``offset``."""
    sampled = params.sample_mod if params.sample_mod > 1 and offset >= params.sample_after else 1
    return max(GAP_TOKENS, 3 * params.w) * sampled


def by_doc(matches: list[Match]) -> dict[int, list[Match]]:
    """Matches per source document, in response order."""
    out: dict[int, list[Match]] = {}
    for m in sorted(matches, key=lambda m: m.response_offset):
        out.setdefault(m.source_doc, []).append(m)
    return out


def runs(matches: list[Match], response: Params, sources: dict[int, Params]) -> list[Run]:
    """Group matches into runs: same source doc, close together, on the same diagonal.

    A leak copies a contiguous span, so response and source offsets advance together. A match
    that does not continue any open run starts one of its own without ending the others: the
    index keeps one offset per document, so a shingle that occurs twice in the source points
    back to its first occurrence, and must not cut the copy it sits in into two halves.
    """
    out: list[Run] = []
    for doc, ms in by_doc(matches).items():
        source = sources[doc]
        groups: list[list[Match]] = []
        for m in ms:
            best, drift = None, SHIFT_TOLERANCE + 1
            for group in groups:
                prev = group[-1]
                gap = m.response_offset - prev.response_offset
                advance = m.source_offset - prev.source_offset
                allowed = max(_stride(response, prev.response_offset), _stride(source, prev.source_offset))
                # A copy moves forward in both texts together; a repeated phrase in the
                # response matching one spot of the source again does not.
                if gap <= allowed and advance > 0 and abs(gap - advance) < drift:
                    best, drift = group, abs(gap - advance)
            if best is None:
                groups.append([m])
            else:
                best.append(m)
        out += [_run(doc, group, response.n) for group in groups]
    return sorted(out, key=lambda r: (r.start, r.source_doc))


def chains(found: list[Run], n: int, w: int, gaps: Sequence[int] = (), blind: Sequence[int] = ()) -> list[list[Run]]:
    """Runs of one source tenant that together copy one stretch of its text.

    Three cases make one copy look like several runs:

    - fragments of a source span interleaved with other text: consecutive runs of one document
      whose source ranges abut, in order and without overlapping (a cut does not repeat text),
      while the response has more than ``SHIFT_TOLERANCE`` tokens inserted between them (with
      fewer, they would be one run). "Abut" allows the tokens between a fragment's edge and
      its first or last fingerprint (up to w - 1 on each side) and a fragment too short to keep
      one (up to n + w - 2): at most 3w + n - 4 tokens, and no more than n + w, a trade measured
      in docs/detection.md. With w = 1 every shingle is a fingerprint, so that is n - 1;
    - a span the index knows from two of the tenant's documents (it holds each fingerprint's
      first prompt, and the tenant sent parts of the span before, with other neighbours): runs
      of different documents that abut in the response, with none of the ``gaps`` between them
      (sorted response offsets of fingerprints that could have matched the tenant and did not:
      ``holes``). Every fingerprint of a copy is in one of the tenant's documents, those across
      the seam too (in the prompt that held the whole span); two phrases the tenant happens to share, a few words
      apart in the answer ("... to 3.7.3", "drop pre-dependency on x11-common from"), have the
      answer's own words between them;
    - a phrase the source repeats: the index knows it at its first occurrence, so its run points
      back before anything the chain took of the document, and touches the chain's last run in
      the response (within a copy the next fingerprint is at most w tokens after the last). A
      copy may also begin with such a phrase: then the run after it goes on past all the chain took.

    Common text may have taken fingerprints between two pieces of a copy (``blind``: sorted
    response offsets of fingerprints that could not count, being common, allowlisted or
    self-echo). Each one of a row of them between the pieces may hide w tokens of the copy: a
    repeated phrase touches the run before it across them, as long as no token of the answer lies
    outside both, and a fragment left out between two others may be that much longer.

    A template filled differently on both sides ("fix X for Y" / "fix Z for Y") is none of them:
    its slot is in the source too, so the source ranges do not abut, or the response's slot is
    about as long as the source's.

    Otherwise a copy reads each source document forward: a run that goes back to a stretch of a
    document the chain already took is a phrase the response repeats ("smb: client: fix
    potential UAF in X", "... in Y", each against the same spot of two documents in turn), and
    does not join it. Nor does a run whose source stretch another run of the response matches
    too: a phrase the recipient's own text repeats ("use after free bug in") is no fragment of a
    copy, and joined to a short shared run next to it would make one.
    """
    edge = min(n + w, 3 * w + n - 4)
    spots = Counter((r.source_doc, r.source_start, r.source_end) for r in found)
    repeated = {id(r) for r in found if spots[(r.source_doc, r.source_start, r.source_end)] > 1}
    # Two copies end at each run: the best one (most tokens) and the one that starts there. A
    # stray run before a copy may make the best one longer and still be wrong for it: taking its
    # source stretch, it stops the copy's repeated phrases from joining (``_back``). A copy
    # ending more than GAP_TOKENS before a run's start is closed: nothing later joins it.
    open_: list[tuple[list[Run], int]] = []
    closed: list[tuple[list[Run], int]] = []
    within: set[int] = set()  # copies that a longer one holds
    for run in sorted(found, key=lambda r: (r.start, -r.end)):
        closed += [c for c in open_ if c[0][-1].end < run.start - GAP_TOKENS]
        open_ = [c for c in open_ if c[0][-1].end >= run.start - GAP_TOKENS]
        alone: tuple[list[Run], int] = ([run], run.tokens)
        best: tuple[list[Run], int] | None = None
        before: list[Run] = []
        if id(run) not in repeated:
            for chain, covered in open_:
                last = chain[-1]
                if id(last) in repeated or run.end <= last.end:
                    continue  # a repeated phrase, or inside a run already taken
                tokens = covered + run.end - max(run.start, last.end)
                if (best is None or tokens > best[1]) and _joins(chain, run, n, w, edge, gaps, blind):
                    best, before = ([*chain, run], tokens), chain
        if best is not None:
            within.update((id(before), id(alone[0])))
            open_.append(best)
        open_.append(alone)
    return [c for c, _ in closed + open_ if id(c) not in within]


def _joins(chain: list[Run], run: Run, n: int, w: int, edge: int, gaps: Sequence[int], blind: Sequence[int]) -> bool:
    """Does ``run`` continue the copy ``chain`` is, in one of the three ways ``chains`` lists?"""
    last = chain[-1]
    gap = run.start - last.end
    if run.source_doc != last.source_doc:
        return -n < gap <= edge and _forward(chain, run, n) and not _between(gaps, last, run, n)
    hidden = w * _streak(blind, last.end - n, run.start, w)  # tokens common text may hide
    source_gap = run.source_start - last.source_end
    if 0 <= source_gap <= edge + hidden and source_gap + SHIFT_TOLERANCE < gap <= GAP_TOKENS:
        return True
    # Touching in the response: a phrase the source repeats, known at its first occurrence, at
    # the start of the copy or inside it.
    touching = -n < gap <= w - n or -n < gap <= min(0, w - n + hidden)
    return touching and (_back(chain, run) or _ahead(chain, run))


def _streak(blind: Sequence[int], lo: int, hi: int, w: int) -> int:
    """The most ``blind`` fingerprints strictly between ``lo`` and ``hi`` in a row (at most w apart).

    A piece of the copy that common text hid is one stretch of the answer, its fingerprints one
    after another; blind ones scattered over the text between two pieces hide no piece.
    """
    best = count = 0
    prev = lo
    for at in blind[bisect.bisect_right(blind, lo) : bisect.bisect_left(blind, hi)]:
        count = count + 1 if at - prev <= w else 1
        best, prev = max(best, count), at
    return best


def _ahead(chain: list[Run], run: Run) -> bool:
    """``run`` starts after everything ``chain`` took of its source document."""
    return run.source_start >= max(r.source_end for r in chain if r.source_doc == run.source_doc)


def _forward(chain: list[Run], run: Run, n: int) -> bool:
    """``run`` starts past what ``chain`` took of its source document (n - 1 tokens of overlap allowed)."""
    taken = [r.source_end for r in chain if r.source_doc == run.source_doc]
    return not taken or run.source_start > max(taken) - n


def _back(chain: list[Run], run: Run) -> bool:
    """``run`` ends before anything ``chain`` took of its source document."""
    return run.source_end <= min(r.source_start for r in chain if r.source_doc == run.source_doc)


def _between(gaps: Sequence[int], left: Run, right: Run, n: int) -> bool:
    """Is one of the ``gaps`` between ``left``'s last matched fingerprint and ``right``'s first?"""
    i = bisect.bisect_right(gaps, left.end - n)
    return i < len(gaps) and gaps[i] < right.start


def holes(
    values: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint32],
    counted: npt.NDArray[np.bool_],
    matches: list[Match],
    sources: dict[int, Params],
) -> list[int]:
    """Response offsets of fingerprints that could have matched a source tenant and did not.

    ``matches`` are all of the tenant's. Where one of its documents was sampled only values
    divisible by its ``sample_mod`` could match, so only those count. Only a chain of two
    documents looks at them, so with one document there are none to find.
    """
    if len({m.source_doc for m in matches}) < 2:
        return []
    mods = [sources[m.source_doc].sample_mod for m in matches if m.source_offset >= sources[m.source_doc].sample_after]
    could = counted & ~np.isin(offsets, np.array([m.response_offset for m in matches], dtype=np.uint32))
    if mods:
        could &= values % np.uint64(max(mods)) == 0
    return [int(o) for o in offsets[could]]


def _tokens(found: list[Run]) -> int:
    """Response tokens the runs cover, their overlaps counted once."""
    covered, reach = 0, 0
    for r in sorted(found, key=lambda r: r.start):
        start = max(r.start, reach)
        if r.end > start:
            covered += r.end - start
            reach = r.end
    return covered


def _run(doc: int, group: list[Match], n: int) -> Run:
    return Run(
        start=group[0].response_offset,
        end=group[-1].response_offset + n,
        source_doc=doc,
        source_start=min(m.source_offset for m in group),
        source_end=max(m.source_offset for m in group) + n,
        fingerprints=len(group),
        matched=tuple(m.response_offset for m in group),
    )


def with_purity(
    run: Run,
    values: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint32],
    counted: npt.NDArray[np.bool_],
    n: int,
    source: Params,
    doc_matches: list[Match] | None = None,
) -> Run:
    """The run's share of the response fingerprints it spans that could have matched.

    A copied span matches nearly every fingerprint inside it; two texts that only share a
    template ("fix X for Y" / "fix Z for Y") match its ends and miss the middle. Fingerprints
    that could not count are left out of the share: common, allowlisted or self-echo ones, and
    those the source's sampling dropped (only values divisible by its ``sample_mod`` survive).

    ``doc_matches`` (the run's source document's matches, by response offset) adds those that
    matched the document *before* their place on the run's diagonal: the index keeps a
    fingerprint's first offset in a document, so a phrase the source repeats points back to its
    first occurrence, and is still part of the copy: the run's ``fingerprints`` count it too.
    """
    lo = int(np.searchsorted(offsets, run.start, "left"))
    hi = int(np.searchsorted(offsets, run.end - n, "right"))
    possible = counted[lo:hi]
    if source.sample_mod > 1 and run.source_start >= source.sample_after:
        possible = possible & (values[lo:hi] % np.uint64(source.sample_mod) == 0)
    matched = run.fingerprints
    if doc_matches:
        diagonal = run.source_start - run.start
        first = bisect.bisect_left(doc_matches, run.start, key=lambda m: m.response_offset)
        inside = set()
        for m in doc_matches[first:]:
            if m.response_offset > run.end - n:
                break
            if m.source_offset <= m.response_offset + diagonal + SHIFT_TOLERANCE:
                inside.add(m.response_offset)
        matched = max(matched, len(inside))
    return replace(run, fingerprints=matched, purity=matched / max(int(possible.sum()), matched))


def pure_runs(
    run: Run,
    values: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint32],
    counted: npt.NDArray[np.bool_],
    n: int,
    source: Params,
    doc_matches: list[Match],
    t: Thresholds,
) -> list[Run]:
    """``run`` with its purity if it has no holes, else its pieces either side of its widest gap, each
    split again while it has holes.

    A match that falls on a copy's diagonal by chance (a phrase the copy shares with text next to
    it, pointing at its first occurrence in the source) makes one run of the copy and of the
    text around it, whose holes would hide the copy. A piece is kept only if it has no holes on
    its own, so this finds nothing the same matches without the stray one would not: the ends of
    a template are still short runs, and do not join into a chain again across the slot (the
    split gap is one a run could bridge, so the response has no more than ``SHIFT_TOLERANCE``
    tokens inserted there).
    """
    scored = with_purity(run, values, offsets, counted, n, source, doc_matches)
    if _no_holes(scored, t) or len(run.matched) < 2:
        return [scored]
    gaps = [b - a for a, b in zip(run.matched, run.matched[1:], strict=False)]
    cut = gaps.index(max(gaps)) + 1
    at = set(run.matched)
    mine = [m for m in doc_matches if m.response_offset in at]  # one match per offset and document
    left = [m for m in mine if m.response_offset < run.matched[cut]]
    right = [m for m in mine if m.response_offset >= run.matched[cut]]
    if not left or not right:
        return [scored]
    return [
        piece
        for part in (left, right)
        for piece in pure_runs(_run(run.source_doc, part, n), values, offsets, counted, n, source, doc_matches, t)
    ]


def scored_runs(
    matches: list[Match],
    values: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint32],
    counted: npt.NDArray[np.bool_],
    response: Params,
    sources: dict[int, Params],
    t: Thresholds,
) -> list[Run]:
    """The matches' runs, each scored and split into pure pieces: what ``copies`` chains."""
    per_doc = by_doc(matches)
    return [
        piece
        for r in runs(matches, response, sources)
        for piece in pure_runs(r, values, offsets, counted, response.n, sources[r.source_doc], per_doc[r.source_doc], t)
    ]


def coverage(found: list[Run], response_tokens: int) -> float:
    """Share of the response's tokens inside matched runs."""
    if response_tokens <= 0:
        return 0.0
    return min(1.0, _tokens(found) / response_tokens)


def severity(longest_run: int, t: Thresholds, *, canary: bool = False) -> str:
    if canary or longest_run >= t.critical_run_tokens:
        return "critical"
    if longest_run >= t.high_run_tokens:
        return "high"
    return "low"


def _no_holes(run: Run, t: Thresholds) -> bool:
    """Pure enough to be a copy: ``min_purity``, or less for a run with many matches.

    A substituted word costs up to n shingles, so a long copy with a few substitutions can fall
    below ``min_purity`` while no template does: a template's shared stretches between its slots
    are short, so its runs have few fingerprints. At w = 1 six fingerprints are only 9 tokens: a
    copy with one substituted word and six matches has 6 of 10 (0.6), and a template whose slot
    holds three words, 7 and 5 tokens around it, 6 of 12; ``long_run_purity`` (0.55) parts them.
    """
    if run.fingerprints >= LONG_RUN_FINGERPRINTS:
        return run.purity >= t.long_run_purity
    return run.purity >= t.min_purity


def copies(
    found: list[Run], t: Thresholds, n: int, w: int, gaps: Sequence[int] = (), blind: Sequence[int] = ()
) -> list[list[Run]]:
    """The chains of runs without holes: what may be a copy, for ``is_finding`` and ``longest``.

    ``gaps``: the source tenant's ``holes``, which documents of a chain must not have between them;
    ``blind``: the response offsets of fingerprints that could not count (``chains``).
    """
    return chains([r for r in found if _no_holes(r, t)], n, w, gaps, blind)


def longest(copied: list[list[Run]]) -> int:
    """Tokens of the longest copy: its length, for severity."""
    return max((_tokens(c) for c in copied), default=0)


def is_finding(copied: list[list[Run]], t: Thresholds) -> bool:
    """More than a coincidence: a copy with several fingerprints and a real length.

    With ``chain_run_fingerprints`` > 1, a copy of several runs needs one run with that many
    fingerprints: single shingles strung together (two frequent 4-grams next to each other in the
    answer, each somewhere in the source tenant's prompts) are coincidences, not a copy.
    """
    for c in copied:
        matched, tokens = sum(r.fingerprints for r in c), _tokens(c)
        if len(c) > 1 and max(r.fingerprints for r in c) < t.chain_run_fingerprints:
            continue  # single shingles strung together: each a frequent phrase the tenant had somewhere
        if matched >= t.min_matched and tokens >= t.min_run_tokens:
            return True
    return False
