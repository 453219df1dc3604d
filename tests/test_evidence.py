"""Scoring without backends: runs, purity, coverage, severity and the finding rule."""

from __future__ import annotations

import numpy as np

from service.fingerprint.scheme import Params
from service.matching.evidence import (
    GAP_TOKENS,
    Match,
    Run,
    Thresholds,
    coverage,
    is_finding,
    runs,
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
    assert is_finding([good], T)
    assert not is_finding([Run(0, 16, 1, 0, 16, 1, purity=1.0)], T)  # one shingle is a coincidence
    assert not is_finding([Run(0, 9, 1, 0, 9, 2, purity=1.0)], T)  # too short
    assert not is_finding([Run(0, 40, 1, 0, 40, 2, purity=0.3)], T)  # a shared template with holes
    assert is_finding([Run(0, 9, 1, 0, 9, 2), good], T)


def test_coverage_merges_overlapping_runs() -> None:
    found = [Run(0, 10, 1, 0, 10, 2), Run(5, 20, 2, 0, 15, 3), Run(50, 60, 1, 70, 80, 2)]
    assert coverage(found, 100) == 0.3
    assert coverage([], 0) == 0.0


def test_severity_levels() -> None:
    assert severity(12, T) == "low"
    assert severity(32, T) == "high"
    assert severity(128, T) == "critical"
    assert severity(12, T, canary=True) == "critical"
