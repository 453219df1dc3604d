"""Which responses the matcher looks up in full: the cheap gate in front of the evaluation."""

from __future__ import annotations

import numpy as np

from service.index.base import Doc, Hit, Kind
from service.matching.matcher import Wanted, candidates

EMPTY = np.empty(0, dtype=np.uint64)
NEEDED = {True: 2, False: 3}  # by whether the source is a prompt


def doc(ref: int, tenant: int, kind: Kind) -> Doc:
    return Doc(ref, tenant, kind, EMPTY, np.empty(0, dtype=np.uint32))


def test_a_response_needs_enough_fingerprints_from_one_source_tenant() -> None:
    docs = [doc(10, 1, Kind.RESPONSE)]
    two_tenants = [Hit(0, 2, 20, Kind.PROMPT, 1), Hit(0, 3, 30, Kind.PROMPT, 1)]
    assert candidates(docs, two_tenants, NEEDED, {}) == {}
    two_docs_of_one_tenant = [Hit(0, 2, 20, Kind.PROMPT, 1), Hit(0, 2, 21, Kind.PROMPT, 1)]
    assert candidates(docs, two_docs_of_one_tenant, NEEDED, {}) == {10: Wanted(1)}


def test_a_prompt_arriving_after_the_response_makes_that_response_a_candidate() -> None:
    docs = [doc(11, 2, Kind.PROMPT)]
    assert candidates(docs, [Hit(0, 1, 10, Kind.RESPONSE, 3)], NEEDED, {}) == {10: Wanted(1)}
    assert candidates(docs, [Hit(0, 1, 10, Kind.RESPONSE, 1)], NEEDED, {}) == {}


def test_two_answers_sharing_text_are_both_candidates_the_older_only_if_it_may_be_the_later() -> None:
    docs = [doc(31, 3, Kind.RESPONSE)]  # served at 100.0, sharing text with answer 10 of tenant 1
    assert candidates(docs, [Hit(0, 1, 10, Kind.RESPONSE, 3)], NEEDED, {31: 100.0}) == {
        31: Wanted(3),
        10: Wanted(1, after=100.0),  # evaluated only if answer 10 was served after 100.0 (a race)
    }


def test_a_response_is_looked_up_only_with_as_many_shared_fingerprints_as_a_finding_needs() -> None:
    docs = [doc(10, 1, Kind.RESPONSE)]
    from_prompt, from_answer = Hit(0, 2, 20, Kind.PROMPT, 2), Hit(0, 3, 30, Kind.RESPONSE, 2)
    assert candidates(docs, [from_prompt, from_answer], NEEDED, {}) == {10: Wanted(1)}  # the prompt's 2 are enough
    assert candidates(docs, [from_answer], NEEDED, {}) == {}  # an answer's 2 are not: it keeps every shingle
