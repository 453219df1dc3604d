"""The evaluation's corpus families: deterministic, and de-duplicated across families.

Small caps on the text read keep it to a few seconds; families that read Debian files are empty
where those packages are missing, and the assertions hold then too.
"""

from __future__ import annotations

import random
from collections import Counter

from bench.eval.families import (
    FAMILIES,
    SPLITS,
    _candidates,
    _Keys,
    copy_keys,
    held_out_public_texts,
    near_copy_keys,
    private_passages,
    public_texts,
)
from bleedwatch.fingerprint.tokens import tokenize

CHEAP = ("reference", "changelogs", "legal", "docs")
LIMIT = 15_000


def test_same_seed_same_passages_in_any_family_order() -> None:
    first = private_passages(7, CHEAP, limit_words=LIMIT)
    assert first == private_passages(7, reversed(CHEAP), limit_words=LIMIT)
    assert first != private_passages(8, CHEAP, limit_words=LIMIT)
    assert {p.family for p in first} <= set(CHEAP)
    assert all(len(p.words) >= 60 for p in first)


def test_a_family_is_cut_the_same_alone_or_with_others() -> None:
    alone = [p.words for p in _candidates(7, ["legal"], LIMIT)]
    together = [p.words for p in _candidates(7, CHEAP, LIMIT) if p.family == "legal"]
    assert sorted(alone) == sorted(together)


def test_no_near_copy_between_kept_passages() -> None:
    passages = private_passages(7, CHEAP, limit_words=LIMIT)
    owners: Counter[tuple[str, ...]] = Counter()
    for p in passages:
        owners.update(near_copy_keys(tokenize(" ".join(p.words))))
    assert max(owners.values()) == 1


def test_integer_keys_meet_where_the_token_keys_do() -> None:
    rng = random.Random(1)
    words = [f"w{i}" for i in range(12)]
    keys = _Keys()
    texts = [[rng.choice(words) for _ in range(rng.randint(0, 40))] for _ in range(60)]
    for a in texts[:30]:
        for b in texts[30:]:
            assert near_copy_keys(a).isdisjoint(near_copy_keys(b)) == set(keys.near_copies(a).tolist()).isdisjoint(
                keys.near_copies(b).tolist()
            )
            assert copy_keys(a).isdisjoint(copy_keys(b)) == set(keys.copies(a).tolist()).isdisjoint(
                keys.copies(b).tolist()
            )
        assert len(near_copy_keys(a)) == len(set(keys.near_copies(a).tolist()))


def test_the_two_public_sets_share_no_16_token_run() -> None:
    tuned = set().union(*(copy_keys(tokenize(" ".join(t))) for t in public_texts()))
    assert all(copy_keys(tokenize(" ".join(t))).isdisjoint(tuned) for t in held_out_public_texts())


def test_splits_cover_every_family_once_a_side() -> None:
    for split in SPLITS.values():
        assert sorted(split["tune"] + split["held_out"]) == sorted(FAMILIES)
    assert SPLITS["a"]["tune"] == SPLITS["b"]["held_out"]
