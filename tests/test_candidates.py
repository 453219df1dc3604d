"""Which responses the matcher looks up in full: the cheap gate in front of the evaluation."""

from __future__ import annotations

import numpy as np

from service.index.base import Doc, Hit, Kind
from service.matching.matcher import Wanted, candidates

EMPTY = np.empty(0, dtype=np.uint64)


def doc(ref: int, tenant: int, kind: Kind) -> Doc:
    return Doc(ref, tenant, kind, EMPTY, np.empty(0, dtype=np.uint32))


def test_a_response_needs_enough_fingerprints_from_one_source_tenant() -> None:
    docs = [doc(10, 1, Kind.RESPONSE)]
    two_tenants = [Hit(0, 2, 20, Kind.PROMPT, 1), Hit(0, 3, 30, Kind.PROMPT, 1)]
    assert candidates(docs, two_tenants, 2, {}) == {}
    two_docs_of_one_tenant = [Hit(0, 2, 20, Kind.PROMPT, 1), Hit(0, 2, 21, Kind.PROMPT, 1)]
    assert candidates(docs, two_docs_of_one_tenant, 2, {}) == {10: Wanted(1)}


def test_a_prompt_arriving_after_the_response_makes_that_response_a_candidate() -> None:
    docs = [doc(11, 2, Kind.PROMPT)]
    assert candidates(docs, [Hit(0, 1, 10, Kind.RESPONSE, 3)], 2, {}) == {10: Wanted(1)}
    assert candidates(docs, [Hit(0, 1, 10, Kind.RESPONSE, 1)], 2, {}) == {}


def test_two_answers_sharing_text_are_both_candidates_the_older_only_if_it_may_be_the_later() -> None:
    docs = [doc(31, 3, Kind.RESPONSE)]  # served at 100.0, sharing text with answer 10 of tenant 1
    assert candidates(docs, [Hit(0, 1, 10, Kind.RESPONSE, 3)], 2, {31: 100.0}) == {
        31: Wanted(3),
        10: Wanted(1, after=100.0),  # evaluated only if answer 10 was served after 100.0 (a race)
    }
