"""Text for the evaluation, all of it shipped with Python or Debian, none written by us.

- private passages: stdlib docstrings, the Python reference topics (pydoc_data) and Debian
  package changelogs, cut into passages and de-duplicated: a passage that shares 8 tokens with
  an earlier one, in a row or around one small edit, is dropped, since text two tenants both
  own is not private and would make the ground truth ambiguous (``private_passages``);
- public texts: the licenses in /usr/share/common-licenses and the Zen of Python, which many
  tenants quote in prompts and answers, and which the operator allowlists up front (the
  allowlist is how bleedwatch knows public text before three tenants have sent it);
- templates: a few docstrings that groups of tenants use as their system prompt.

This is the corpus the detection rules were tuned on, kept as it was so that earlier numbers can
be reproduced (the same seed builds the same passages). An evaluation that can be reported
without having been tuned on takes its text from ``families.py``: several genres, split into
families to tune on and families held out.
"""

from __future__ import annotations

import glob
import gzip
import random
from pathlib import Path

from bench.corpus import docstrings
from bench.eval.families import COPY_TOKENS as COPY_TOKENS
from bench.eval.families import EDIT_TOKENS as EDIT_TOKENS
from bench.eval.families import PASSAGE_WORDS as PASSAGE_WORDS
from bench.eval.families import SIDE_TOKENS as SIDE_TOKENS
from bench.eval.families import changelog_entries, common_licenses, cut, dedup
from bench.eval.families import copy_keys as copy_keys
from bench.eval.families import near_copy_keys as near_copy_keys

_passages = cut


def _pydoc_topics() -> list[list[str]]:
    from pydoc_data.topics import topics

    return [t.split() for t in topics.values()]


def _changelogs(limit_words: int) -> list[list[str]]:
    return [entry for _, entries in _changelogs_by_package(limit_words) for entry in entries]


def _changelogs_by_package(limit_words: int) -> list[tuple[str, list[list[str]]]]:
    """Entries of the Debian changelogs with their source package, until ``limit_words`` words.

    Binary packages built from one source ship the same changelog (libc6, libc-bin, ... of glibc).
    """
    out, total = [], 0
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
        try:
            with gzip.open(path) as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        source = text.split(None, 1)[0] if text.strip() else Path(path).parent.name
        entries = changelog_entries(text)
        total += sum(map(len, entries))
        out.append((source, entries))
        if total >= limit_words:
            break
    return out


def private_passages(seed: int, changelog_words: int = 3_000_000, *, near_copies: bool = False) -> list[list[str]]:
    """De-duplicated passages, shuffled: a passage that is a near-copy of an earlier kept one is dropped.

    Near-copy: the two share 8 tokens in a row, or 8 tokens around one edit of up to 2 tokens
    (``near_copy_keys``). Text two tenants both own is not private, so it can be neither a leak
    source nor a clean exchange: the ground truth would score the service for finding it. An
    exact run is not enough to tell: changelogs of one upstream (the kernel's, shipped by several
    packages) carry the same line with one word changed, and no rule based on copied text can
    tell that from a leak with a word substituted, the very perturbation the detector must
    survive. The criterion follows what a finding needs at the least (two fingerprinted 4-token
    shingles on one diagonal, 10 tokens apart): each side of the edit holds a shingle. Unrelated
    passages rarely share two 4-token runs this close together: it keeps 3,259 passages instead
    of 3,344 (seed 7), and what it drops are changelog lines that differ by a version or a device
    name ("bump standards version to 4.x.y, no changes needed") and sibling docstrings ("prefix /
    suffix can also be a tuple of prefixes / suffixes to look for").

    With ``near_copies`` only copies are dropped (``COPY_TOKENS`` tokens in a row in common: one
    changelog shipped by several binary packages, a text and its derivative), and the passages keep
    the short phrases and near-copies unrelated real documents share (``run.py --near-copies``): the
    clean traffic then holds the coincidental overlap a looser threshold has to survive.

    Deterministic: the seed fixes the passages and their order, and the keys depend on the tokens
    only (no salted ``hash``).
    """
    rng = random.Random(seed)
    candidates = _passages(docstrings() + _pydoc_topics() + _changelogs(changelog_words), rng)
    rng.shuffle(candidates)
    return [candidates[i] for i in dedup(candidates, near_copies=near_copies)]


def public_texts() -> list[list[str]]:
    return common_licenses()


def templates(count: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    docs = [d for d in docstrings(min_words=60) if len(d) <= 200]
    return [" ".join(d) for d in rng.sample(docs, count)]
