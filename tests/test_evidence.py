"""Scoring without backends: runs, purity, coverage, severity and the finding rule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from service.fingerprint.scheme import Params
from service.matching.evidence import (
    GAP_TOKENS,
    Match,
    Run,
    Thresholds,
    chains,
    copies,
    coverage,
    is_finding,
    longest,
    pure_runs,
    runs,
    scored_runs,
    severity,
    with_purity,
)

P = Params(n=4, w=6, sample_mod=1)
T = Thresholds(min_matched=2, min_run_tokens=10, min_purity=0.7, high_run_tokens=32, critical_run_tokens=128)


def copy(start: int, source_start: int, offsets: list[int], doc: int = 1) -> list[Match]:
    return [Match(start + o, doc, source_start + o) for o in offsets]


def test_a_copied_span_is_one_run_with_its_source_range() -> None:
    (run,) = runs(copy(100, 500, [0, 4, 9, 13, 20]), P, {1: P})
    assert (run.start, run.end, run.source_start, run.source_end, run.fingerprints) == (100, 124, 500, 524, 5)
    assert run.tokens == 24


def test_a_jump_in_the_source_or_a_drift_starts_a_new_run() -> None:
    matches = copy(0, 100, [0, 5, 10]) + copy(15, 300, [0, 5])  # same response stretch, other place in source
    assert [(r.start, r.source_start) for r in runs(matches, P, {1: P})] == [(0, 100), (15, 300)]
    drifting = [Match(0, 1, 0), Match(5, 1, 5), Match(10, 1, 30)]
    assert len(runs(drifting, P, {1: P})) == 2


def test_a_phrase_repeated_in_the_response_is_not_a_run() -> None:
    repeated = [Match(0, 1, 50), Match(7, 1, 50), Match(14, 1, 50)]  # one source spot, matched three times
    assert all(r.fingerprints == 1 for r in runs(repeated, P, {1: P}))


def test_gaps_up_to_the_limit_keep_a_run_and_sampling_widens_it() -> None:
    near = copy(0, 0, [0, GAP_TOKENS])
    far = copy(0, 0, [0, GAP_TOKENS + 1])
    assert len(runs(near, P, {1: P})) == 1
    assert len(runs(far, P, {1: P})) == 2
    sampled = Params(n=4, w=6, sample_after=0, sample_mod=8)
    assert len(runs(copy(0, 1000, [0, 8 * GAP_TOKENS]), P, {1: sampled})) == 1


def test_runs_are_per_source_doc() -> None:
    matches = copy(0, 0, [0, 5, 10], doc=1) + copy(0, 0, [2, 7], doc=2)
    assert sorted((r.source_doc, r.fingerprints) for r in runs(matches, P, {1: P, 2: P})) == [(1, 3), (2, 2)]


def test_purity_counts_only_fingerprints_that_could_have_matched() -> None:
    offsets = np.array([0, 3, 6, 9, 12, 15], dtype=np.uint32)
    values = np.arange(6, dtype=np.uint64) * 8
    counted = np.ones(6, dtype=bool)
    template = Run(start=0, end=19, source_doc=1, source_start=0, source_end=19, fingerprints=2)
    assert with_purity(template, values, offsets, counted, 4, P).purity == 2 / 6
    counted[1:5] = False  # the middle was common or allowlisted: nothing there could match
    assert with_purity(template, values, offsets, counted, 4, P).purity == 1.0
    sampled = Params(n=4, w=6, sample_after=0, sample_mod=16)  # only values 0, 16, 32 survive in the source
    assert with_purity(template, values, offsets, np.ones(6, bool), 4, sampled).purity == 2 / 3


def test_the_finding_rule_needs_fingerprints_length_and_purity() -> None:
    good = Run(0, 16, 1, 0, 16, 3, purity=0.9)
    assert is_finding(copies([good], T, 4, 6), T)
    assert not is_finding(copies([Run(0, 16, 1, 0, 16, 1, purity=1.0)], T, 4, 6), T)  # one shingle is a coincidence
    assert not is_finding(copies([Run(0, 9, 1, 0, 9, 2, purity=1.0)], T, 4, 6), T)  # too short
    assert not is_finding(copies([Run(0, 40, 1, 0, 40, 2, purity=0.3)], T, 4, 6), T)  # a shared template with holes
    assert is_finding(copies([Run(0, 9, 1, 0, 9, 2), good], T, 4, 6), T)


def test_a_phrase_the_source_repeats_does_not_cut_the_copy() -> None:
    # The index holds a fingerprint's first offset in a document: the shingle at response 8
    # occurs twice in the source, and points back to the first occurrence (source 20).
    matches = [Match(0, 1, 300), Match(4, 1, 304), Match(8, 1, 20), Match(12, 1, 312), Match(16, 1, 316)]
    main = max(runs(matches, P, {1: P}), key=lambda r: r.fingerprints)
    assert (main.start, main.end, main.source_start, main.fingerprints) == (0, 20, 300, 4)
    offsets = np.array([0, 4, 8, 12, 16], dtype=np.uint32)
    values, counted = np.arange(5, dtype=np.uint64), np.ones(5, dtype=bool)
    assert with_purity(main, values, offsets, counted, 4, P).purity == 4 / 5
    assert with_purity(main, values, offsets, counted, 4, P, matches).purity == 1.0
    # ... but a match *later* in the source than the diagonal is another place, not a repeat.
    elsewhere = [*matches[:2], Match(8, 1, 900), *matches[3:]]
    main = max(runs(elsewhere, P, {1: P}), key=lambda r: r.fingerprints)
    assert with_purity(main, values, offsets, counted, 4, P, elsewhere).purity == 4 / 5


def pure(start: int, end: int, source_start: int, doc: int = 1, fingerprints: int = 2) -> Run:
    return Run(start, end, doc, source_start, source_start + end - start, fingerprints, 1.0)


def test_fragments_of_one_source_span_interleaved_with_other_text_are_one_chain() -> None:
    fragments = [pure(0, 6, 100), pure(26, 32, 106), pure(50, 56, 112)]  # source 100-118, in three pieces
    assert [len(c) for c in chains(fragments, 4, 6)] == [3]
    assert is_finding(copies(fragments, T, 4, 6), T)
    assert longest(copies(fragments, T, 4, 6)) == 18
    assert not any(is_finding(copies([f], T, 4, 6), T) for f in fragments)  # each alone is too short


def test_a_template_filled_differently_is_not_a_chain() -> None:
    # "fix X for Y" / "fix Z for Y": the slot is in the source too, about as long.
    slot = [pure(0, 6, 100), pure(12, 18, 112)]
    assert [len(c) for c in chains(slot, 4, 6)] == [1, 1]
    # The source pieces far apart: two places of the source, not one span.
    apart = [pure(0, 6, 100), pure(26, 32, 300)]
    assert [len(c) for c in chains(apart, 4, 6)] == [1, 1]
    # The same spot of the source matched again further on: a repeated phrase.
    again = [pure(0, 6, 100), pure(26, 32, 100)]
    assert [len(c) for c in chains(again, 4, 6)] == [1, 1]
    assert not is_finding(copies(slot + apart + again, T, 4, 6), T)


def test_fragments_of_a_cut_neither_overlap_nor_leave_more_than_a_short_fragment_out() -> None:
    # "a 2-tuple (host, port)" and "(host, port) for the socket to bind": two phrases of one
    # docstring, far apart in the answer. A cut does not repeat text, so they are no fragments.
    overlapping = [pure(13, 18, 296), pure(67, 74, 299)]
    assert [len(c) for c in chains(overlapping, 4, 1)] == [1, 1]
    # With every shingle kept (w = 1) a fragment keeps all its text: only one shorter than n
    # (3 tokens) can go missing between two. "sftp-server(8): support the | home-directory
    # extension request defined | in draft-ietf-secsh-filexfer-extensions-00" leaves out 5.
    template = [pure(43, 48, 656), pure(62, 69, 666)]
    assert [len(c) for c in chains(template, 4, 1)] == [1, 1]
    assert [len(c) for c in chains([pure(43, 48, 656), pure(62, 69, 664)], 4, 1)] == [2]
    assert [len(c) for c in chains(template, 4, 5)] == [2]  # winnowing may lose 5 at the edges


def test_a_span_known_from_two_documents_of_the_tenant_is_one_chain() -> None:
    # The tenant sent the first half before with other neighbours: the index names that doc for it.
    halves = [pure(0, 7, 500, doc=1), pure(8, 14, 40, doc=2)]
    assert [len(c) for c in chains(halves, 4, 6)] == [2]
    assert is_finding(copies(halves, T, 4, 6), T)
    far = [pure(0, 7, 500, doc=1), pure(30, 36, 40, doc=2)]  # not adjacent in the response
    assert not is_finding(copies(far, T, 4, 6), T)


def test_two_phrases_of_the_tenant_with_the_answers_own_words_between_are_not_a_chain() -> None:
    # "... bump standards version to 3.7.3 | add vcs-git and vcs-browser control fields | drop
    # pre-dependency on x11-common from ...": the tenant's prompts hold the first phrase and the
    # last, not the words between, whose fingerprints match none of its documents.
    phrases = [pure(0, 4, 900, doc=1, fingerprints=1), pure(13, 19, 40, doc=2)]
    between = [6, 9]
    assert is_finding(copies(phrases, T, 4, 9), T)  # without looking between: 10 tokens, 3 fingerprints
    assert not is_finding(copies(phrases, T, 4, 9, between), T)
    # A copy known from two documents: its fingerprints across the seam are the source's too.
    assert is_finding(copies(phrases, T, 4, 9, [30]), T)


def test_a_phrase_the_response_repeats_against_two_documents_in_turn_is_not_a_chain() -> None:
    # "smb: client: fix potential UAF in X", "... in Y", "... in Z": each line matches the same
    # spot of one document ("smb client fix potential") and of another ("fix potential uaf in").
    lines = [
        r
        for at in (0, 10, 20, 30)
        for r in (pure(at, at + 4, 352, doc=1, fingerprints=1), pure(at + 2, at + 6, 7971, doc=2, fingerprints=1))
    ]
    assert not is_finding(copies(lines, T, 4, 5), T)
    # Going back to a stretch of a document the chain took, through another document, is no copy either.
    back = [pure(0, 6, 352, doc=1), pure(8, 13, 7971, doc=2), pure(14, 19, 350, doc=1)]
    assert not any(back[0] in c and back[2] in c for c in chains(back, 4, 5))
    # A copy read forward through both documents still is one chain.
    forward = [pure(0, 7, 500, doc=1), pure(8, 14, 40, doc=2), pure(15, 22, 510, doc=1)]
    assert [len(c) for c in chains(forward, 4, 6)] == [3]


def test_a_phrase_the_response_repeats_is_no_fragment_of_a_chain() -> None:
    # "use after free bug in" twice in the recipient's text, against one spot of the source,
    # then a short shared run ("don't send geo tx power limit") 8 source tokens further on.
    phrase = [pure(40, 44, 144, fingerprints=1), pure(85, 89, 144, fingerprints=1)]
    shared = pure(118, 124, 156)
    assert not is_finding(copies([*phrase, shared], T, 4, 5), T)
    assert is_finding(copies([phrase[1], shared], T, 4, 5), T)  # once only, it may be a fragment


def test_a_phrase_the_source_repeats_joins_the_chain_at_its_first_occurrence() -> None:
    # "... the explanations file referred to | dry run of double colon rules": the source said
    # "dry run of double colon rules" before, and the index knows it there.
    halves = [pure(0, 7, 380), pure(8, 14, 343)]
    assert [len(c) for c in chains(halves, 4, 5)] == [2]
    assert is_finding(copies(halves, T, 4, 5), T)
    far = [pure(0, 7, 380), pure(30, 36, 343)]  # not adjacent in the response: two phrases
    assert not is_finding(copies(far, T, 4, 5), T)


def exact_thresholds() -> Thresholds:
    from service.app import thresholds
    from service.config import Settings

    return thresholds(Settings(), exact=True)


def test_a_copy_may_begin_with_a_phrase_its_source_said_earlier() -> None:
    # With every shingle (w = 1): tokens 73-79 of the answer are known at their first occurrence
    # in the source (397), the copy goes on where the source said them again (412); a fragment
    # of it follows 23 tokens on. 15 tokens in all, 11 without the first run.
    t = exact_thresholds()
    found = [Run(73, 80, 1, 397, 404, 4), Run(77, 84, 1, 412, 419, 4), Run(107, 111, 1, 419, 423, 1)]
    assert [len(c) for c in chains(found, 4, 1)] == [3]
    assert is_finding(copies(found, t, 4, 1), t)
    assert not is_finding(copies(found[1:], t, 4, 1), t)


def test_a_stray_run_before_a_copy_does_not_keep_its_repeated_phrases_out() -> None:
    # A single shingle the source has earlier (628) touches the copy (639-649); taken into the
    # copy, it would stop the two phrases the source said before it (626, 604) from joining,
    # since they point back into what the copy took. The copy without it has 12 tokens.
    t = exact_thresholds()
    stray, copied = Run(2, 6, 9, 628, 632, 1), Run(3, 13, 9, 639, 649, 7)
    repeats = [Run(10, 14, 9, 626, 630, 1), Run(11, 15, 9, 604, 608, 1)]
    assert is_finding(copies([stray, copied, *repeats], t, 4, 1), t)
    assert longest(copies([stray, copied, *repeats], t, 4, 1)) == 12


def test_a_substituted_word_next_to_a_phrase_the_source_repeats_is_one_long_run() -> None:
    # 13 tokens at w = 1, the word at 26 substituted: shingles 23-26 lost, and 22 matches the
    # source where it said that phrase first (133). 6 of 10 match: a long run, not two halves.
    t, w1 = exact_thresholds(), Params(n=4, w=1, sample_mod=1)
    matches = [*copy(20, 168, [0, 1, 7, 8, 9]), Match(22, 1, 133)]
    offsets = np.arange(0, 40, dtype=np.uint32)
    found = scored_runs(matches, offsets.astype(np.uint64), offsets, np.ones(40, dtype=bool), w1, {1: w1}, t)
    assert is_finding(copies(found, t, 4, 1), t)
    assert longest(copies(found, t, 4, 1)) == 13


def test_common_text_between_the_pieces_of_a_copy_does_not_part_them() -> None:
    # w = 1. A phrase the source said before (first run, at 100), then the copy going on where it
    # said it again (300): the shingle at 15, across the seam, is common text, so the second run
    # starts 1 token later than touching. 14 tokens together, 10 without the first run.
    t = exact_thresholds()
    repeated = [Run(10, 18, 1, 100, 108, 5), Run(16, 24, 1, 306, 314, 5)]
    assert [len(c) for c in chains(repeated, 4, 1)] == [1, 1]
    assert [len(c) for c in chains(repeated, 4, 1, blind=[15])] == [2]
    assert longest(copies(repeated, t, 4, 1, blind=[15])) == 14
    # Only the unseen between the runs: a hole there, or common text elsewhere, does not join them.
    assert [len(c) for c in chains(repeated, 4, 1, blind=[5, 30])] == [1, 1]
    # Nor runs that leave some of the answer's words outside both.
    apart = [Run(10, 18, 1, 100, 108, 5), Run(20, 28, 1, 306, 314, 5)]
    assert [len(c) for c in chains(apart, 4, 1, blind=[15, 16, 17, 18, 19])] == [1, 1]
    # An interleaved fragment whose one shingle is common: its neighbours are 4 source tokens
    # apart, one more than a fragment without a shingle (n - 1) leaves out.
    fragments = [pure(0, 6, 100), pure(26, 32, 110)]
    assert [len(c) for c in chains(fragments, 4, 1)] == [1, 1]
    assert [len(c) for c in chains(fragments, 4, 1, blind=[14])] == [2]
    # A fragment of 5 has two shingles, one after the other; two common ones apart are no fragment.
    longer = [pure(0, 6, 100), pure(26, 32, 111)]
    assert [len(c) for c in chains(longer, 4, 1, blind=[14])] == [1, 1]
    assert [len(c) for c in chains(longer, 4, 1, blind=[14, 15])] == [2]
    assert [len(c) for c in chains(longer, 4, 1, blind=[10, 20])] == [1, 1]


def every_third(tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.arange(0, tokens, 3, dtype=np.uint32)
    return offsets.astype(np.uint64), offsets, np.ones(len(offsets), dtype=bool)


def test_a_stray_match_on_the_diagonal_does_not_hide_the_copy_after_it() -> None:
    # A shingle 35 tokens before the copy happens to sit on its diagonal: one run with holes.
    matches = [Match(0, 1, 100), *copy(36, 136, [0, 3, 6, 9])]
    values, offsets, counted = every_third(60)
    (run,) = runs(matches, P, {1: P})
    assert not is_finding(copies([with_purity(run, values, offsets, counted, 4, P, matches)], T, 4, 6), T)
    pieces = pure_runs(run, values, offsets, counted, 4, P, matches, T)
    assert [(p.start, p.end, p.fingerprints, p.purity) for p in pieces] == [(0, 4, 1, 1.0), (36, 49, 4, 1.0)]
    assert is_finding(copies(pieces, T, 4, 6), T)
    # A template's ends, split at the slot, are each too short and do not join again.
    template = copy(0, 100, [0, 3]) + copy(21, 121, [0, 3])
    (run,) = runs(template, P, {1: P})
    pieces = pure_runs(run, values, offsets, counted, 4, P, template, T)
    assert [p.fingerprints for p in pieces] == [2, 2]
    assert not is_finding(copies(pieces, T, 4, 6), T)


def test_a_run_with_holes_does_not_spoil_the_good_run_next_to_it() -> None:
    good = pure(0, 30, 100, fingerprints=8)
    holed = replace(pure(32, 40, 132), purity=0.3)  # a template's ends, right after the copy
    assert is_finding(copies([good, holed], T, 4, 6), T)
    assert longest(copies([good, holed], T, 4, 6)) == 30


def test_coverage_merges_overlapping_runs() -> None:
    found = [Run(0, 10, 1, 0, 10, 2), Run(5, 20, 2, 0, 15, 3), Run(50, 60, 1, 70, 80, 2)]
    assert coverage(found, 100) == 0.3
    assert coverage([], 0) == 0.0


def test_severity_levels() -> None:
    assert severity(12, T) == "low"
    assert severity(32, T) == "high"
    assert severity(128, T) == "critical"
    assert severity(12, T, canary=True) == "critical"


def test_a_long_run_may_have_the_holes_of_a_few_substituted_words() -> None:
    # 32 words with two words substituted: 8 of 14 possible fingerprints matched.
    long_copy = replace(pure(0, 40, 100, fingerprints=8), purity=8 / 14)
    assert is_finding(copies([long_copy], T, 4, 6), T)
    # A template's runs are short: the same share of holes with few matches is not a copy.
    template = replace(pure(0, 20, 100, fingerprints=4), purity=4 / 7)
    assert not is_finding(copies([template], T, 4, 6), T)
    assert not is_finding(copies([replace(long_copy, purity=0.4)], T, 4, 6), T)


def test_with_every_shingle_a_run_with_the_holes_of_a_template_is_no_copy() -> None:
    exact = exact_thresholds()  # w = 1: a run's holes are exactly the shingles it lost
    # An answer's "alsa intel dsp config add quirk for apl glk tgl devices based on es8336 codec"
    # against a prompt's "... for cml devices ...": 7 and 5 tokens around a 3-token slot, 6 of 12.
    template = replace(pure(0, 15, 100, fingerprints=6), purity=6 / 12)
    assert not is_finding(copies([template], exact, 4, 1), exact)
    assert is_finding(copies([template], T, 4, 5), T)  # winnowed (w = 5), six fingerprints make a long run
    # A 13-token copy with one word substituted: 6 of its 10 shingles.
    substituted = replace(pure(0, 13, 100, fingerprints=6), purity=6 / 10)
    assert is_finding(copies([substituted], exact, 4, 1), exact)


def test_a_chain_of_single_shingles_is_no_copy_when_a_run_of_several_is_required() -> None:
    # Three single shingles of the source tenant, one after another in the answer (w = 4 makes
    # them more likely): two documents abutting, then a "fragment" eight source tokens on.
    singles = [Run(250, 254, 1, 271, 275, 1), Run(257, 261, 2, 754, 758, 1), Run(295, 299, 2, 762, 766, 1)]
    assert is_finding(copies(singles, T, 4, 4), T)
    strict = replace(T, chain_run_fingerprints=2)
    assert not is_finding(copies(singles, strict, 4, 4), strict)
    # A fragment of two fingerprints makes the chain a copy again.
    fragments = [Run(250, 258, 1, 271, 279, 2), Run(270, 274, 1, 279, 283, 1)]
    assert is_finding(copies(fragments, strict, 4, 4), strict)


def test_the_chain_rule_is_a_service_setting() -> None:
    from service.app import thresholds
    from service.config import Settings

    assert thresholds(Settings(chain_run_fingerprints=2)).chain_run_fingerprints == 2
    assert thresholds(Settings()).chain_run_fingerprints == 1  # today's rule by default
    exact = thresholds(Settings(), exact=True)  # for responses fingerprinted with w = 1
    assert (exact.min_run_tokens, exact.chain_run_fingerprints, exact.long_run_purity) == (12, 3, 0.55)
