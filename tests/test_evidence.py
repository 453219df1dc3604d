"""Scoring without backends: holes, exact pieces, copies, the finding rule, and its cost on hostile input."""

from __future__ import annotations

import bisect
from itertools import groupby, pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bleedwatch.fingerprint.scheme import Params, winnow
from service.matching import evidence
from service.matching.evidence import (
    GAP_TOKENS,
    JOIN_TOKENS,
    MAX_PREDECESSORS,
    STRETCH_TOKENS,
    Budget,
    Copy,
    Match,
    Piece,
    Response,
    Thresholds,
    copies,
    coverage,
    evaluate,
    every_piece,
    holes,
    is_finding,
    least_matches,
    longest,
    outside,
    pieces,
    severity,
    spans,
)

N = 4
EVERY = Params(n=N, w=1, sample_mod=1)  # a response, or a source answer: every shingle
WINNOWED = Params(n=N, w=5, sample_mod=1)  # a source prompt
T = Thresholds(min_matched=2, min_score=9, high_run_tokens=32, critical_run_tokens=128)


def response(tokens: int, blind: list[int] | None = None, seed: int = 0) -> Response:
    """A response with every shingle: random fingerprints at offsets 0 .. tokens - n."""
    rng = np.random.default_rng(seed)
    count = tokens - N + 1
    mask = np.zeros(count, dtype=bool)
    mask[blind or []] = True
    return Response(rng.integers(0, 2**63, count, dtype=np.uint64), np.arange(count, dtype=np.uint32), mask, EVERY)


def copied(start: int, source_start: int, length: int, doc: int = 1) -> list[Match]:
    """Every shingle of ``length`` tokens copied from ``source_start`` of ``doc`` (a source with every shingle)."""
    return [Match(start + i, doc, source_start + i) for i in range(length - N + 1)]


def judge(r: Response, matches: list[Match], sources: dict[int, Params] | None = None) -> list[Copy]:
    return evaluate(r, matches, sources or {1: EVERY, 2: EVERY}, Budget())


def test_an_exact_copy_is_one_piece_with_its_source_range() -> None:
    r = response(60)
    (c,) = judge(r, copied(10, 300, 20))
    (p,) = c.pieces
    assert (p.start, p.end, p.source_start, p.source_end, p.fingerprints) == (10, 30, 300, 320, 17)
    assert c.score == 20 - (N - 1)


def test_the_finding_rule_is_one_score() -> None:
    r = response(60)
    assert is_finding(judge(r, copied(10, 300, 12)), T)  # 12 tokens: 12 - 3 = 9
    assert not is_finding(judge(r, copied(10, 300, 11)), T)
    one = [Copy.of(Piece(0, 40, 1, 0, 40, 1, 40), N)]
    assert not is_finding(one, T)  # a single fingerprint is a coincidence however it scores


def test_the_fewest_matches_a_finding_can_have_follow_the_sources_window() -> None:
    assert [least_matches(T, w) for w in (1, 3, 5, 50)] == [9, 4, 3, 2]
    assert not is_finding(judge(response(60), copied(10, 300, 11)), T)  # 8 matches of every shingle
    assert is_finding(judge(response(60), copied(10, 300, 12)), T)  # 9


def test_a_changed_word_is_a_hole_and_the_copy_goes_on_past_it() -> None:
    r = response(60)
    # Token 20 of the copy differs: the four shingles over it (positions 17-20) match nothing.
    matches = [m for m in copied(0, 100, 40) if not 17 <= m.response_offset <= 20]
    found = pieces(matches, holes(r, matches, {1: EVERY}), {1: EVERY}, N)
    assert [(p.start, p.end) for p in found] == [(0, 20), (21, 40)]
    (c,) = judge(r, matches)
    assert len(c.pieces) == 2
    assert c.tokens == 39
    assert c.score == 39 - 2 * (N - 1) - JOIN_TOKENS


def test_common_text_inside_a_copy_is_no_hole_and_no_evidence() -> None:
    r = response(60, blind=[17, 18, 19, 20])  # those shingles are shared by many tenants
    matches = [m for m in copied(0, 100, 40) if not 17 <= m.response_offset <= 20]
    (c,) = judge(r, matches)
    assert len(c.pieces) == 1
    assert c.pieces[0].tokens == 40
    assert c.tokens == 40 - 7  # tokens 17-23, inside the common shingles, count for nothing


def test_a_phrase_the_source_repeats_does_not_cut_the_piece() -> None:
    # The index keeps a fingerprint's first offset in a document: two shingles of the copy occur
    # earlier in the source too, and point there. They are still the tenant's text.
    matches = copied(0, 300, 20)
    matches[8] = Match(8, 1, 20)
    matches[9] = Match(9, 1, 21)
    cs = judge(response(40), matches)
    best = max(cs, key=lambda c: c.score)
    assert (best.pieces[0].start, best.pieces[0].end, best.pieces[0].source_start) == (0, 20, 300)


def test_blind_text_between_matches_is_no_evidence() -> None:
    r = response(80, blind=list(range(2, 40)))  # common text: no hole, and nothing to vouch for
    (c,) = judge(r, [Match(0, 1, 100), Match(1, 1, 101), Match(40, 1, 140), Match(41, 1, 141)])
    assert c.pieces[0].tokens == 45
    assert c.tokens == 2 + 2  # the tokens of the matched shingles that no common one covers
    assert not is_finding([c], T)


def test_a_winnowed_source_is_checked_at_the_fingerprints_it_would_have_kept() -> None:
    r = response(80, seed=3)
    kept = winnow(r.values, WINNOWED.w)  # what a prompt with this text keeps
    exact = [Match(int(i), 1, 500 + int(i)) for i in kept if 10 <= i <= 40]
    (c,) = judge(r, exact, {1: WINNOWED})
    assert len(c.pieces) == 1
    # The text differs around one of them: the source does not have it, and the copy has a hole.
    rest = [m for m in exact if m != exact[len(exact) // 2]]
    assert len(pieces(rest, holes(r, rest, {1: WINNOWED}), {1: WINNOWED}, N)) == 2


def test_fragments_of_one_source_span_interleaved_with_other_text_are_one_copy() -> None:
    r = response(120)
    fragments = copied(0, 100, 8) + copied(30, 108, 8) + copied(60, 116, 8)  # source 100-124, in three
    (c,) = [c for c in judge(r, fragments) if len(c.pieces) > 1]
    assert len(c.pieces) == 3
    assert c.tokens == 24
    assert c.score == 24 - 3 * (N - 1) - 2 * JOIN_TOKENS
    assert is_finding([c], T)
    assert not any(is_finding(judge(r, copied(at, 100, 8)), T) for at in (0, 30, 60))  # each alone is short


def test_a_copy_needs_one_stretch_of_eight_tokens() -> None:
    r = response(120)
    # Three 7-token fragments in the source's order score 21 - 3 * 3 - 2 = 10, but no 8 tokens are
    # in a row anywhere: the shape of a template filled in twice as much as of a leak.
    short = copied(0, 100, 7) + copied(30, 108, 7) + copied(60, 116, 7)
    (c,) = [c for c in judge(r, short) if len(c.pieces) > 1]
    assert c.score == 10
    assert not is_finding([c], T)
    longer = copied(0, 100, 8) + copied(30, 109, 7) + copied(60, 117, 7)
    assert is_finding(judge(r, longer), T)


def test_a_piece_that_lowers_a_copy_does_not_hide_it() -> None:
    r = response(60)
    exact = copied(10, 300, 12)  # 12 tokens: a finding
    # One more match overlapping its end, off its diagonal, continuing the source: chained on, it
    # adds 2 tokens and costs n - 1 + 1. The copy without it is still there.
    more = [*exact, Match(20, 1, 313)]
    assert {c.score for c in judge(r, more)} == {9, 7}
    assert is_finding(judge(r, more), T)


def test_pieces_that_do_not_continue_the_source_are_not_one_copy() -> None:
    r = response(120)
    # "fix X for Y" / "fix Z for Y", a slot much longer in the source than a changed word.
    template = copied(0, 100, 8) + copied(20, 120, 8)
    assert all(len(c.pieces) == 1 for c in judge(r, template))
    # Two places of the source, far apart.
    apart = copied(0, 100, 8) + copied(30, 400, 8)
    assert all(len(c.pieces) == 1 for c in judge(r, apart))
    # The response saying the same phrase twice, against one spot of the source.
    again = copied(0, 100, 8) + copied(30, 100, 8)
    assert all(len(c.pieces) == 1 for c in judge(r, again))
    # Too far apart in the response.
    far = copied(0, 100, 8) + copied(8 + GAP_TOKENS + 1, 108, 8)
    assert all(len(c.pieces) == 1 for c in judge(r, far))


def test_a_span_known_from_two_documents_is_one_copy_unless_the_answer_has_its_own_words_between() -> None:
    # The tenant sent the first half before with other neighbours: the index names that doc for it.
    halves = copied(0, 500, 10, doc=1) + copied(7, 40, 10, doc=2)
    (c,) = [c for c in judge(response(60), halves) if len(c.pieces) > 1]
    assert c.tokens == 17
    # Two phrases of the tenant, a few of the answer's own words between: those are holes.
    phrases = copied(0, 500, 8, doc=1) + copied(12, 40, 8, doc=2)
    assert all(len(c.pieces) == 1 for c in judge(response(60), phrases))


def test_sampling_widens_what_a_piece_may_skip() -> None:
    sampled = Params(n=N, w=1, sample_after=0, sample_mod=8)
    r = response(400)
    r.blind[:] = True  # nothing in between could be seen: only the gap limits the piece
    matches = [Match(0, 1, 1000), Match(8 * GAP_TOKENS, 1, 1000 + 8 * GAP_TOKENS)]
    assert len(pieces(matches, holes(r, matches, {1: EVERY}), {1: sampled}, N)) == 1
    assert len(pieces(matches, holes(r, matches, {1: EVERY}), {1: EVERY}, N)) == 2


def test_spans_merge_and_outside_keeps_what_none_covers() -> None:
    found = [Piece(10, 20, 1, 0, 10, 3, 10), Piece(15, 30, 1, 5, 20, 3, 15), Piece(50, 60, 2, 0, 10, 3, 10)]
    starts, ends = spans(found)
    assert starts.tolist() == [10, 50]
    assert ends.tolist() == [30, 60]
    ms = [Match(o, 9, 0) for o in (5, 10, 29, 30, 55, 70)]
    assert [m.response_offset for m in outside(ms, (starts, ends))] == [5, 30, 70]
    r = response(80)
    r.blind_within((starts, ends))
    assert np.flatnonzero(r.blind).tolist() == [*range(10, 30), *range(50, 60)]


def test_coverage_longest_and_severity() -> None:
    found = [Piece(0, 10, 1, 0, 10, 3, 10), Piece(5, 20, 1, 5, 20, 3, 15)]
    assert coverage(found, 40) == 0.5
    assert longest([Copy.of(found[0], N), Copy.of(found[0], N).then(found[1], N)]) == 20
    assert severity(10, T) == "low"
    assert severity(32, T) == "high"
    assert severity(128, T) == "critical"
    assert severity(1, T, canary=True) == "critical"


# Hostile input: any ingest key holder chooses the fingerprints, so the order and shape of the
# matches are the sender's. The work is counted, not timed.

shapes = st.sampled_from(["reversed", "periodic", "equal gaps", "random", "one diagonal", "every diagonal"])


def hostile(shape: str, count: int, seed: int) -> list[Match]:
    rng = np.random.default_rng(seed)
    if shape == "reversed":
        return [Match(i, 1, count - i) for i in range(count)]
    if shape == "periodic":
        return [Match(i, 1 + i % 3, (i * 7) % 50) for i in range(count)]
    if shape == "equal gaps":
        return [Match(5 * i, 1, 5 * i) for i in range(count)]
    if shape == "one diagonal":
        return [Match(i, 1, i + 10) for i in range(count)]
    if shape == "every diagonal":
        return [Match(i // 8, 1 + i % 2, (i * 13) % 97) for i in range(count)]
    return [Match(int(a), 1 + int(d) % 3, int(b)) for a, d, b in rng.integers(0, count, (count, 3))]


@settings(max_examples=40, deadline=None)
@given(shape=shapes, count=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1))
def test_chaining_work_is_bounded_by_the_number_of_pieces(shape: str, count: int, seed: int) -> None:
    matches = hostile(shape, count, seed)
    top = max(m.response_offset for m in matches) + N
    r = response(top + N, seed=seed)
    sources = {1: EVERY, 2: WINNOWED, 3: EVERY}
    found = pieces(matches, holes(r, matches, sources), sources, N)
    assert len(found) <= len(matches)
    budget = Budget()
    out = copies(found, N, sources, holes(r, matches, sources), budget)
    assert budget.checks <= MAX_PREDECESSORS * len(found)
    assert sum(len(c.pieces) for c in out) >= 1


def test_a_hundred_thousand_matches_in_the_worst_order_stay_linear_in_checks() -> None:
    matches = hostile("reversed", 100_000, 1)  # every match a piece of its own, each next to the last
    r = response(100_000 + 2 * N)
    budget = Budget()
    evaluate(r, matches, {1: EVERY}, budget)
    assert budget.checks <= MAX_PREDECESSORS * len(matches)
    assert budget.cut > 0  # and the metric says so


def test_copies_sharing_long_chains_give_each_piece_once() -> None:
    """Each value twice in a row (a hostile sender's choice): every other match is a piece that continues
    the one before, and a third of them end a copy of their own over the same chain: the copies' chains
    hold 100 times more steps than there are pieces. Reading the evidence walks each piece once, not
    once per copy (it did: minutes for one response of 200,000 fingerprints)."""
    count = 4000
    matches = [Match(i, 1, i // 2) for i in range(count)]
    out = evaluate(response(count + 2 * N), matches, {1: EVERY}, Budget())
    walked = every_piece(out)
    assert sum(len(c.pieces) for c in out) > 100 * len(walked)
    assert len(walked) == len(set(walked)) == len({p for c in out for p in c.pieces})
    assert [c.stretch for c in out] == [any(p.copied >= STRETCH_TOKENS for p in c.pieces) for c in out]


@settings(max_examples=60, deadline=None)
@given(
    offsets=st.one_of(  # dense: blind shingles that touch and overlap; sparse: offsets anywhere up to 2**32
        st.lists(st.integers(0, 100), min_size=1, max_size=60, unique=True),
        st.lists(st.integers(0, 2**32 - 1 - N), min_size=1, max_size=40, unique=True),
    ),
    blind=st.data(),
    cut=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
    | st.tuples(st.integers(0, 120), st.integers(0, 120)),
)
def test_free_tokens_cost_the_blind_shingles_not_the_offsets(
    offsets: list[int], blind: st.DataObject, cut: tuple[int, int]
) -> None:
    """A response may claim offsets up to 2**32 - 1: what is free is counted on the blind shingles'
    spans (the dense array it replaced took 17 bytes per token of the largest offset)."""
    offsets.sort()
    mask = np.array(blind.draw(st.lists(st.booleans(), min_size=len(offsets), max_size=len(offsets))))
    r = Response(np.arange(len(offsets), dtype=np.uint64), np.array(offsets, dtype=np.uint32), mask, EVERY)
    blind_at = [o for o, b in zip(offsets, mask.tolist(), strict=True) if b]
    lo, hi = min(cut), max(cut)
    for a, b in ((lo, hi), (lo, min(hi, lo + 50)), (max(0, offsets[-1] - 3), offsets[-1] + N + 2)):
        explained = sum(1 for t in range(a, b) if any(s <= t < s + N for s in blind_at)) if b - a <= 200 else None
        if explained is None:  # too long to count token by token: count by spans
            explained = _span_union_within(blind_at, a, b)
        assert r.free(a, b) == (b - a) - explained


def _span_union_within(starts: list[int], lo: int, hi: int) -> int:
    covered, reach = 0, lo
    for s in sorted(starts):
        a, b = max(s, reach), min(s + N, hi)
        if b > a:
            covered += b - a
            reach = b
    return covered


SAMPLED = Params(n=N, w=3, sample_after=40, sample_mod=4)  # a long prompt, sampled past token 40


@st.composite
def tenant_matches(draw: st.DrawFn) -> tuple[list[Match], int]:
    """Matches of one tenant: copies (some with matches as far apart as a piece may skip, or one
    more), a value repeated, phrases out of order, over three documents of different windows and
    sampling, now and then at offsets another segment has too; and the response's length."""
    out: list[Match] = []
    at = 0
    for _ in range(draw(st.integers(1, 8))):
        shape = draw(st.sampled_from(["copy", "repeated", "cycle", "random"]))
        size = draw(st.integers(1, 60))
        doc = draw(st.integers(1, 3))
        source = draw(st.integers(0, 120))
        step = draw(st.sampled_from([1, 1, 2, 3, GAP_TOKENS, GAP_TOKENS + 1, 4 * GAP_TOKENS, 4 * GAP_TOKENS + 1]))
        if shape == "copy":
            out += [Match(at + step * i, doc, source + step * i) for i in range(size)]
        elif shape == "repeated":
            out += [Match(at + step * i, doc, source) for i in range(size)]
        elif shape == "cycle":
            period = draw(st.integers(2, 5))
            out += [Match(at + step * i, doc, source + i % period) for i in range(size)]
        else:
            out += [Match(at + i, draw(st.integers(1, 3)), draw(st.integers(0, 200))) for i in range(size)]
        at = max(0, max(m.response_offset for m in out) + draw(st.integers(-8, 80)))
    return out, max(m.response_offset for m in out) + N


@settings(max_examples=300, deadline=None)
@given(found=tenant_matches(), data=st.data())
def test_pieces_and_copies_are_the_per_match_rules_in_numpy(
    found: tuple[list[Match], int], data: st.DataObject
) -> None:
    """pieces() and copies() judge all matches at once in numpy (a response of one value repeated made
    100,000 pieces, each a step in Python): the same pieces, copies and budget as the rules match by
    match, which ``_reference_pieces`` and ``_reference_copies`` keep."""
    matches, tokens = found
    blind = data.draw(st.lists(st.integers(0, tokens - N), max_size=20))
    r = response(tokens + N, blind=blind, seed=len(matches))
    sources = {1: EVERY, 2: WINNOWED, 3: SAMPLED}
    gaps = holes(r, matches, sources)
    more = data.draw(st.lists(st.integers(0, tokens), max_size=10))  # holes anywhere, or only a few
    gaps = data.draw(st.sampled_from([gaps, sorted(set(gaps) | set(more)), sorted(set(more))]))
    for judged in (None, r):
        assert pieces(matches, gaps, sources, N, judged) == _reference_pieces(matches, gaps, sources, N, judged)
    least = data.draw(st.sampled_from([0, STRETCH_TOKENS]))
    every = _reference_pieces(matches, gaps, sources, N, r)
    assert pieces(matches, gaps, sources, N, r, least) == [p for p in every if p.copied >= least]
    predecessors = data.draw(st.integers(1, MAX_PREDECESSORS))
    budget, reference = Budget(predecessors), Budget(predecessors)
    got = copies(every, N, sources, gaps, budget)
    want = _reference_copies(every, N, sources, gaps, reference)
    assert [(c.pieces, c.score, c.tokens, c.fingerprints, c.stretch) for c in got] == [
        (c.pieces, c.score, c.tokens, c.fingerprints, c.stretch) for c in want
    ]
    assert (budget.checks, budget.cut) == (reference.checks, reference.cut)


def _reference_pieces(
    matches: list[Match], gaps: list[int], sources: dict[int, Params], n: int, response: Response | None
) -> list[Piece]:
    """pieces() as it was written match by match, before numpy, then the pieces of other documents over
    one text united (``_reference_one_text``)."""
    runs: list[list[Match]] = []
    ordered = sorted(matches, key=lambda m: (m.source_doc, m.source_offset - m.response_offset, m.response_offset))
    for (doc, _), group in groupby(ordered, key=lambda m: (m.source_doc, m.source_offset - m.response_offset)):
        source = sources[doc]
        run: list[Match] = []
        for m in group:
            if run:
                prev = run[-1]
                sampled = (
                    source.sample_mod if source.sample_mod > 1 and prev.source_offset >= source.sample_after else 1
                )
                if m.response_offset - prev.response_offset > GAP_TOKENS * sampled or _reference_between(
                    gaps, prev.response_offset, m.response_offset
                ):
                    runs.append(run)
                    run = []
            run.append(m)
        runs.append(run)
    return _reference_one_text(runs, n, sources, response)


def _reference_vouched(run: list[Match], n: int, source: Params) -> list[tuple[int, int]]:
    """The tokens each match of a piece vouches for: up to the next match, at most as far as the source keeps them."""
    last = run[-1]
    sampled = source.sample_mod if source.sample_mod > 1 and last.source_offset >= source.sample_after else 1
    dense = max(n, source.w * sampled)
    return [
        (a.response_offset, a.response_offset + min(b.response_offset - a.response_offset, dense))
        for a, b in pairwise(run)
    ] + [(last.response_offset, last.response_offset + n)]


def _free(spans: list[tuple[int, int]], response: Response | None) -> int:
    return sum(hi - lo if response is None else int(response.free(lo, hi)) for lo, hi in spans)


def _reference_piece(run: list[Match], n: int, source: Params, response: Response | None) -> Piece:
    first, last = run[0], run[-1]
    copied = _free(_reference_vouched(run, n, source), response)
    return Piece(
        first.response_offset,
        last.response_offset + n,
        first.source_doc,
        first.source_offset,
        last.source_offset + n,
        len(run),
        copied,
    )


def _reference_one_text(
    runs: list[list[Match]], n: int, sources: dict[int, Params], response: Response | None
) -> list[Piece]:
    """In response order, a piece joins the text before it when it overlaps it by a shingle and is of a
    document the text has no piece of; each piece of a text then spans it, keeps its own document with
    the source offsets carried along its diagonal and its own matches, counts the tokens any of the
    text's pieces vouches for, and keeps itself as ``own``."""
    pieces_ = [_reference_piece(run, n, sources[run[0].source_doc], response) for run in runs]
    texts: dict[int, list[int]] = {}
    head = -1
    for i in sorted(range(len(runs)), key=lambda i: pieces_[i].start):
        members = texts.get(head, [])
        end = max((pieces_[j].end for j in members), default=0)
        docs = {pieces_[j].source_doc for j in members}
        if members and pieces_[i].start <= end - n and pieces_[i].source_doc not in docs:
            members.append(i)
        else:
            head = i
            texts[head] = [i]
    text_of = {i: members for members in texts.values() for i in members}
    out = []
    for i, p in enumerate(pieces_):
        members = text_of[i]
        if len(members) == 1:
            out.append(p)
            continue
        spans = sorted(span for j in members for span in _reference_vouched(runs[j], n, sources[runs[j][0].source_doc]))
        union: list[tuple[int, int]] = []
        for lo, hi in spans:
            if union and lo <= union[-1][1]:
                union[-1] = (union[-1][0], max(union[-1][1], hi))
            else:
                union.append((lo, hi))
        start, end = min(pieces_[j].start for j in members), max(pieces_[j].end for j in members)
        source_start = max(p.source_start - (p.start - start), 0)
        out.append(
            Piece(
                start,
                end,
                p.source_doc,
                source_start,
                p.source_end + (end - p.end),
                p.fingerprints,
                _free(union, response),
                p,
            )
        )
    return out


def _reference_between(sorted_offsets: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_right(sorted_offsets, lo)
    return i < len(sorted_offsets) and sorted_offsets[i] < hi


def _reference_joins(before: Piece, after: Piece, n: int, source: Params, gaps: list[int]) -> bool:
    gap = after.start - before.end
    if not -n < gap <= GAP_TOKENS or after.end <= before.end:
        return False
    if after.source_doc == before.source_doc:
        return -n < after.source_start - before.source_end <= n - 1 + 2 * (source.w - 1)
    return gap <= source.w and not _reference_between(gaps, before.end - n, after.start)


def _reference_copies(
    found: list[Piece], n: int, sources: dict[int, Params], gaps: list[int], budget: Budget
) -> list[Copy]:
    """copies() as it was written pair by pair, before numpy."""
    order = sorted(found, key=lambda p: (p.start, p.end))
    best: list[Copy] = []
    for j, piece in enumerate(order):
        chosen = Copy.of(piece, n)
        first = max(0, j - budget.predecessors)
        if first > 0 and order[first - 1].end > piece.start - GAP_TOKENS - n:
            budget.cut += 1
        for i in range(j - 1, first - 1, -1):
            budget.checks += 1
            if _reference_joins(best[i].last, piece, n, sources[piece.source_doc], gaps):
                longer = best[i].then(piece, n)
                if longer.score > chosen.score:
                    chosen = longer
        best.append(chosen)
    continued = {id(c.before) for c in best if c.before is not None and c.score >= c.before.score}
    return [c for c in best if id(c) not in continued]


def test_one_value_repeated_makes_a_piece_per_match_and_asks_the_join_rule_once_per_distance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A response of one value 100,000 times, held once by a source: each match is a piece of one
    shingle on its own diagonal, none continues another, and none is a stretch. Whether pieces join
    is asked once per distance looked back, for all pieces at once (it was once per pair: 1,600,000
    calls, seconds of Python)."""
    count = 100_000
    matches = [Match(i, 1, 0) for i in range(count)]
    r = response(count + N)
    gaps = holes(r, matches, {1: EVERY})
    asked = []
    rule = evidence._joins

    def counted(*args: Any) -> Any:
        asked.append(args[1])
        return rule(*args)

    monkeypatch.setattr(evidence, "_joins", counted)
    found = pieces(matches, gaps, {1: EVERY}, N, r)
    assert len(found) == count
    assert pieces(matches, gaps, {1: EVERY}, N, r, least=STRETCH_TOKENS) == []
    budget = Budget()
    out = copies(found, N, {1: EVERY}, gaps, budget)
    assert asked == list(range(1, MAX_PREDECESSORS + 1))
    assert len(out) == count
    assert all(c.before is None and c.score == 1 and not c.stretch for c in out)
    assert not is_finding(out, T)
